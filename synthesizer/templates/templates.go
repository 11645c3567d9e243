package templates

import (
	"embed"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/calibrate"
)

//go:embed star/*.star
var starFiles embed.FS

// The families of the built-in templates: the five of the shipped rules
// dictionary (analyzer/dictionaries/tau-tools.yaml) and TRACE's
// structured-data reasoning.
const (
	PreconditionVerification = "precondition_verification"
	ArgumentGrounding        = "argument_grounding"
	MultiStepCompletion      = "multi_step_completion"
	ToolErrorRecovery        = "tool_error_recovery"
	UserConfirmation         = "user_confirmation"
	StructuredDataReasoning  = "structured_data_reasoning"
)

// Knobs are a template's difficulty knobs. Records is the number of the
// user's records in an instance, Steps the number of required actions (or,
// for structured_data_reasoning, the complexity of the question: 1–3),
// Distractors the records that look like a target or that the user names
// as to be left alone. HintShareMin/Max are the share of each calibration
// group that gets the hint.
type Knobs struct {
	Records      int     `json:"records"`
	Steps        int     `json:"steps"`
	Distractors  int     `json:"distractors"`
	HintShareMin float64 `json:"hint_share_min"`
	HintShareMax float64 `json:"hint_share_max"`
}

func (k Knobs) String() string {
	return fmt.Sprintf("records %d, steps %d, distractors %d, hints %.2f–%.2f", k.Records, k.Steps, k.Distractors, k.HintShareMin, k.HintShareMax)
}

// Family is one built-in template family.
type Family struct {
	Name string
	// Summary is a one-line description of what the environment practises.
	Summary string
	// Keywords match a capability's name and definition to the family.
	Keywords []string
	// Ladder lists knob settings from easiest to hardest; Start is the
	// index of the default. Tune walks it.
	Ladder []Knobs
	Start  int

	needRead, needUser bool
	optRead            bool // use a record read when the target has one
	maxWrites          int
	rationale          func(r resolved) string
}

// DefaultKnobs are the family's default knobs.
func (f Family) DefaultKnobs() Knobs { return f.Ladder[f.Start] }

func ladder(hmin, hmax float64, steps ...[3]int) []Knobs {
	out := make([]Knobs, len(steps))
	for i, s := range steps {
		out[i] = Knobs{Records: s[0], Steps: s[1], Distractors: s[2], HintShareMin: hmin, HintShareMax: hmax}
	}
	return out
}

var families = []Family{
	{
		Name:     PreconditionVerification,
		Summary:  "change only the records whose current state, read first, allows it",
		Keywords: []string{"precondition", "verif", "check", "look up", "lookup", "state", "eligib", "status", "allowed", "polic", "enforc", "constraint"},
		Ladder:   ladder(0.25, 0.5, [3]int{1, 1, 0}, [3]int{2, 1, 1}, [3]int{3, 2, 1}, [3]int{4, 3, 1}, [3]int{5, 3, 2}, [3]int{6, 4, 2}),
		Start:    2, needRead: true, maxWrites: 1,
		rationale: func(r resolved) string {
			return fmt.Sprintf("Agents on the target environment fail when they act on what the user claims instead of what the records say: they %s %s whose state does not allow it. "+
				"Every instance here asks for the same change on several %s of which only some are in status allowing it, and only %s shows the status, so the full reward needs a look-up before every write. "+
				"The tools %s and %s are the target's own, with their exact names, parameters and types, so the habit of verifying before writing transfers call for call. "+
				"The reward is computed from the final store and the call log: every allowed change made after reading the record, every disallowed one refused and explained.",
				verbOf(r.writes[0].name), nounsOf(r.key), nounsOf(r.key), r.read.name, r.read.name, r.writes[0].name)
		},
	},
	{
		Name:     ArgumentGrounding,
		Summary:  "copy every identifier of a write from an earlier tool result",
		Keywords: []string{"grounding", "ground", "identifier", "argument", "invent", "hallucinat", "guess", "copied", "id "},
		Ladder:   ladder(0.25, 0.5, [3]int{2, 1, 1}, [3]int{3, 2, 1}, [3]int{4, 2, 2}, [3]int{5, 3, 2}, [3]int{6, 4, 2}),
		Start:    1, needRead: true, needUser: true, maxWrites: 1,
		rationale: func(r resolved) string {
			return fmt.Sprintf("Agents on the target environment fail when they pass identifiers they never saw: a guessed %s, a payment id made up from the user's words. "+
				"Here the user describes %s by their attributes and names payment methods by kind, and look-alike records sit beside the targets, so the only way to the reward is to find each id with %s and %s and copy it exactly into %s. "+
				"The tools are the target's own, with their exact names, parameters and types, so grounding the arguments of a write transfers directly. "+
				"The reward compares every write's arguments with the ground truth, with partial credit per correct write.",
				r.key, nounsOf(r.key), r.user.name, r.read.name, r.writes[0].name)
		},
	},
	{
		Name:     MultiStepCompletion,
		Summary:  "carry out every one of several requested changes before finishing",
		Keywords: []string{"multi", "step", "complet", "several", "every", "all of", "two or more", "transaction", "finish", "ending", "intent", "concurrent"},
		Ladder:   ladder(0.25, 0.5, [3]int{2, 2, 0}, [3]int{3, 3, 0}, [3]int{4, 3, 1}, [3]int{4, 4, 0}, [3]int{5, 4, 1}, [3]int{6, 5, 1}),
		Start:    1, optRead: true, maxWrites: 2,
		rationale: func(r resolved) string {
			names := make([]string, len(r.writes))
			for i, w := range r.writes {
				names[i] = w.name
			}
			return fmt.Sprintf("Agents on the target environment fail when a task needs several writes and they stop after some of them. "+
				"Every instance here is one message asking for several separate changes to different %s with %s, and the episode only earns its full reward when each one was made with the requested arguments. "+
				"The tools are the target's own, with their exact names, parameters and types, so keeping track of a multi-part request transfers to it. "+
				"The reward is the share of required changes made, matched on their key arguments, plus a bonus for completing all of them without stray changes.",
				nounsOf(r.key), strings.Join(names, " and "))
		},
	},
	{
		Name:     ToolErrorRecovery,
		Summary:  "diagnose a failing call and retry it corrected instead of giving up",
		Keywords: []string{"error", "recover", "retry", "fail", "correct", "exception", "not found"},
		Ladder:   ladder(0.25, 0.5, [3]int{1, 1, 0}, [3]int{2, 2, 0}, [3]int{3, 2, 1}, [3]int{3, 3, 0}, [3]int{4, 4, 1}),
		Start:    1, needRead: true, maxWrites: 1,
		rationale: func(r resolved) string {
			return fmt.Sprintf("Agents on the target environment fail when a tool returns an error and they abandon the request instead of correcting the call. "+
				"Here the user's ids are sometimes mistyped (the wrong case, a missing '#') and the service sometimes fails once, so %s returns errors that a careful agent diagnoses and works around before calling %s. "+
				"The tools and their error messages follow the target's, with its exact names, parameters and types, so reading an error and retrying transfers to it. "+
				"The reward counts the changes that were made in the end, so a recovered error costs nothing and an abandoned one costs its share.",
				r.read.name, r.writes[0].name)
		},
	},
	{
		Name:     UserConfirmation,
		Summary:  "make only the changes the user explicitly confirmed; ask about the others",
		Keywords: []string{"confirm", "consent", "approval", "explicit", "yes", "permission", "ask the user"},
		Ladder:   ladder(0.25, 0.5, [3]int{1, 1, 0}, [3]int{2, 2, 0}, [3]int{3, 3, 0}, [3]int{4, 4, 1}, [3]int{5, 5, 1}, [3]int{6, 6, 1}),
		Start:    2, needRead: true, maxWrites: 1,
		rationale: func(r resolved) string {
			return fmt.Sprintf("Agents on the target environment fail when they change the database without the user's explicit confirmation. "+
				"Every instance here asks for changes to several %s of which the user confirmed only some, so the agent must make exactly the confirmed ones with %s and describe the others and ask. "+
				"The tools are the target's own, with their exact names, parameters and types, so checking for consent before every write transfers to it. "+
				"The reward checks the store for unconfirmed changes and the final message for a precise summary and a question.",
				nounsOf(r.key), r.writes[0].name)
		},
	},
	{
		Name:     StructuredDataReasoning,
		Summary:  "answer a question that needs figures from several records and a computation",
		Keywords: []string{"structured", "data", "reason", "compute", "calculat", "aggregat", "table", "sum", "compare", "count", "arithmetic"},
		Ladder:   ladder(0.25, 0.5, [3]int{2, 1, 0}, [3]int{3, 1, 0}, [3]int{3, 2, 0}, [3]int{4, 2, 0}, [3]int{5, 2, 1}, [3]int{5, 3, 1}, [3]int{6, 3, 2}),
		Start:    3, needRead: true, needUser: true,
		rationale: func(r resolved) string {
			return fmt.Sprintf("TRACE finds agents failing when an answer needs figures spread over several tool results and a computation over them. "+
				"Here the user asks about their %s (the highest %s, a total over one status, the lowest among those meeting two conditions), and the figures are only in the %s results, so the agent must list them with %s, read each one and compute. "+
				"The tools are the target's own, with their exact names, parameters and types, so reasoning over their result shapes transfers to it. "+
				"The reward checks the final 'Answer:' against the ground truth computed by code, with partial credit for reading every record.",
				nounsOf(r.key), figureOf(r.key), r.read.name, r.user.name)
		},
	},
}

// Families returns the built-in families (copies).
func Families() []Family { return slices.Clone(families) }

// Names are the family names in a fixed order.
func Names() []string {
	n := make([]string, len(families))
	for i, f := range families {
		n[i] = f.Name
	}
	return n
}

// Lookup returns the family named name.
func Lookup(name string) (Family, bool) {
	for _, f := range families {
		if f.Name == name {
			return f, true
		}
	}
	return Family{}, false
}

// Template is one instantiated template: an environment program for the
// target's tools.
type Template struct {
	Family string `json:"family"`
	// Name is the program's file name, "<family>.star".
	Name    string `json:"name"`
	Program []byte `json:"-"`
	// Rationale is the program's docstring: why practising it transfers.
	Rationale string `json:"rationale"`
	// Tools are the target's tools the program uses, by role.
	Tools map[string]string `json:"tools"`
	Knobs Knobs             `json:"knobs"`
}

// CalibrationConfig is base with the template's hint share.
func (t *Template) CalibrationConfig(base calibrate.Config) calibrate.Config {
	base.HintShareMin, base.HintShareMax = t.Knobs.HintShareMin, t.Knobs.HintShareMax
	return base
}

// Instantiate builds family's program for the target's tools with knobs
// (the zero Knobs means the family's defaults). It fails with a
// *RoleError naming the missing role when the tools lack what the family
// needs.
func Instantiate(family string, tools []schemas.Tool, knobs Knobs) (*Template, error) {
	f, ok := Lookup(family)
	if !ok {
		return nil, fmt.Errorf("templates: unknown family %q (known: %s)", family, strings.Join(Names(), ", "))
	}
	if knobs == (Knobs{}) {
		knobs = f.DefaultKnobs()
	}
	if err := knobs.validate(); err != nil {
		return nil, fmt.Errorf("templates: %s: %w", family, err)
	}
	ts := toolset{family: family, all: parseTools(tools)}
	r, err := ts.resolve(f.needRead, f.needUser, f.maxWrites)
	if err != nil {
		return nil, err
	}
	if r.read == nil && f.optRead {
		if t, ok := ts.recordRead(r.key); ok {
			r.read = &t
		}
	}
	cfg, roles := config(f, r, knobs)
	lib, err := starFiles.ReadFile("star/lib.star")
	if err != nil {
		return nil, err
	}
	body, err := starFiles.ReadFile("star/" + family + ".star")
	if err != nil {
		return nil, err
	}
	rationale := f.rationale(r)
	var b strings.Builder
	// The rationale and the roles hold the target's tool and parameter
	// names, which come from rollouts: quoted, so that no name can end the
	// docstring and add statements to a program that runs in-process as
	// trusted.
	b.WriteString(starDocString(rationale+"\n\nGenerated by trace's built-in "+family+" template (synthesizer/templates) for the target's tools "+strings.Join(sortedValues(roles), ", ")+".") + "\n\n")
	cj, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	b.WriteString("CONFIG = json.decode(" + starString(string(cj)) + ")\n\n")
	b.Write(lib)
	b.WriteString("\n")
	b.Write(body)
	return &Template{Family: family, Name: family + ".star", Program: []byte(b.String()), Rationale: rationale, Tools: roles, Knobs: knobs}, nil
}

func (k Knobs) validate() error {
	switch {
	case k.Steps < 1:
		return fmt.Errorf("knobs: steps = %d, want at least 1", k.Steps)
	case k.Records < 1:
		return fmt.Errorf("knobs: records = %d, want at least 1", k.Records)
	case k.Distractors < 0:
		return fmt.Errorf("knobs: distractors = %d, want at least 0", k.Distractors)
	case !(k.HintShareMin >= 0 && k.HintShareMin <= k.HintShareMax && k.HintShareMax <= 1):
		return fmt.Errorf("knobs: hint share %v–%v, want 0 ≤ min ≤ max ≤ 1", k.HintShareMin, k.HintShareMax)
	}
	return nil
}

func sortedValues(m map[string]string) []string {
	var v []string
	for _, x := range m {
		if !slices.Contains(v, x) {
			v = append(v, x)
		}
	}
	slices.Sort(v)
	return v
}

// starString is s as a Starlark string literal.
func starString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

// starDocString is s as a triple-quoted Starlark string literal (its
// newlines kept as they are).
func starDocString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"""` + r.Replace(s) + `"""`
}

// config is the CONFIG of the program and the role → tool map.
func config(f Family, r resolved, knobs Knobs) (map[string]any, map[string]string) {
	roles := map[string]string{}
	params := map[string]any{}
	var used []schemas.Tool
	use := func(role string, t tool) {
		roles[role] = t.name
		if _, ok := params[t.name]; ok {
			return
		}
		used = append(used, t.schema)
		ps := map[string]any{}
		for name, p := range t.params {
			e := map[string]any{"type": p.Type, "required": p.Required}
			if len(p.Enum) > 0 {
				e["enum"] = p.Enum
			}
			ps[name] = e
		}
		params[t.name] = ps
	}
	cfg := map[string]any{
		"family": f.Name, "key": r.key, "noun": nounOf(r.key), "nouns": nounsOf(r.key),
		"kind": kindOf(r.key), "list_field": nounsOf(r.key), "id_prefix": idPrefix(r.key),
		"read": "", "user_read": "",
		"payment_sources": []string{"credit_card", "gift_card"},
		"knobs":           map[string]int{"records": knobs.Records, "steps": knobs.Steps, "distractors": knobs.Distractors},
	}
	if r.user != nil {
		use("user_read", *r.user)
		cfg["user_read"] = r.user.name
	}
	if r.read != nil {
		use("read", *r.read)
		cfg["read"] = r.read.name
	}
	var writes []map[string]any
	allowed, blocked := "active", []string{"completed", "suspended"}
	if kindOf(r.key) == "order" {
		allowed, blocked = "pending", []string{"processed", "delivered"}
	}
	for i, w := range r.writes {
		role := "write"
		if i > 0 {
			role = fmt.Sprintf("write_%d", i+1)
		}
		use(role, w)
		ps := []param{}
		for _, name := range w.required {
			if name != r.key {
				ps = append(ps, w.params[name])
			}
		}
		writes = append(writes, map[string]any{
			"name": w.name, "verb": verbOf(w.name), "past": pastOf(verbOf(w.name)),
			"cancels": strings.HasPrefix(w.name, "cancel_"), "params": ps,
		})
		if i == 0 {
			switch {
			case strings.Contains(w.name, "pending"):
				allowed, blocked = "pending", []string{"processed", "delivered"}
			case strings.Contains(w.name, "delivered"):
				allowed, blocked = "delivered", []string{"pending", "processed"}
			}
		}
	}
	if writes == nil {
		writes = []map[string]any{}
	}
	cfg["writes"] = writes
	cfg["allowed"], cfg["blocked"] = allowed, blocked
	cfg["params"] = params
	cfg["tools"] = used
	return cfg, roles
}

// nounOf is the record noun of a key: reservation_id → reservation.
func nounOf(key string) string { return strings.ReplaceAll(strings.TrimSuffix(key, "_id"), "_", " ") }

func nounsOf(key string) string {
	n := nounOf(key)
	switch {
	case strings.HasSuffix(n, "s"), strings.HasSuffix(n, "x"), strings.HasSuffix(n, "ch"):
		return n + "es"
	case strings.HasSuffix(n, "y") && !strings.HasSuffix(n, "ay") && !strings.HasSuffix(n, "ey"):
		return n[:len(n)-1] + "ies"
	}
	return n + "s"
}

func kindOf(key string) string {
	switch key {
	case "reservation_id":
		return "reservation"
	case "order_id":
		return "order"
	}
	return "generic"
}

// idPrefix is the prefix of generic record ids: BOOKING_ID → "BK".
func idPrefix(key string) string {
	n := strings.ToUpper(strings.ReplaceAll(nounOf(key), " ", ""))
	if len(n) >= 2 {
		return n[:2]
	}
	return "ID"
}

func figureOf(key string) string {
	switch kindOf(key) {
	case "reservation":
		return "price"
	case "order":
		return "total"
	}
	return "amount"
}

// verbOf is the action verb of a write tool: cancel_pending_order → cancel.
func verbOf(name string) string {
	v, _, _ := strings.Cut(name, "_")
	return v
}

func pastOf(verb string) string {
	switch {
	case strings.HasSuffix(verb, "e"):
		return verb + "d"
	case verb == "set":
		return "set"
	case verb == "cancel":
		return "cancelled"
	case strings.HasSuffix(verb, "y"):
		return verb[:len(verb)-1] + "ied"
	}
	return verb + "ed"
}
