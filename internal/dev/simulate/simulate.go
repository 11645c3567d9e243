// Package simulate generates realistic, deterministic rollouts of a fleet of
// customer-service agents on two τ²-style tool environments, "sim-airline"
// and "sim-retail", with capability deficits planted at configurable rates.
//
// Each rollout is a multi-turn conversation shaped like a τ²-bench
// simulation: a system policy, the user's request, read tools (user,
// reservation / order, flight search, product catalog), a confirmation
// with the user, write tools (cancel, update, book, return, exchange…), a
// final answer and the user's "###STOP###". Tool calls carry ids and their
// results answer them by tool_call_id; results are JSON text with realistic
// ids ("EHGLP3", "emma_kim_9957", "#W2378156", "credit_card_4421216").
//
// A deficit changes the structure of the conversation observably:
//
//   - precondition_verification: the agent writes without first reading the
//     reservation / order it modifies;
//   - argument_grounding: one identifier argument of a write (flight number,
//     payment id, item id) appears nowhere earlier in the conversation;
//   - multi_step_completion: the task needs two or more writes
//     (metadata "required_actions") and the agent stops after some of them;
//   - tool_error_recovery: a tool returns an error and the agent gives up
//     (transfers to a human) instead of correcting the call and retrying;
//   - user_confirmation: the agent writes without asking the user to confirm.
//
// Tasks decide which capabilities an episode exercises (a read-only task
// exercises none of the write capabilities; about half the tasks need two
// or more writes; about 30 % hit a tool error). When an exercised
// capability is planted as lacking, the episode fails with probability
// OutcomeModel.FailIfLacking; otherwise it fails with probability
// OutcomeModel.BaseFailure (a wrong final answer or a wrong database state
// with no planted cause).
//
// Every rollout records its ground truth in metadata["sim"] (see Truth):
// which capabilities the task exercises, which deficits were planted, and
// the label a perfect labeler gives every capability.
//
// Generation is a pure function of (Config, index): the same seed gives
// byte-identical JSON.
package simulate

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"iter"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/traceops/trace/schemas"
)

// The capabilities whose deficits the generator can plant.
const (
	PreconditionVerification = "precondition_verification"
	ArgumentGrounding        = "argument_grounding"
	MultiStepCompletion      = "multi_step_completion"
	ToolErrorRecovery        = "tool_error_recovery"
	UserConfirmation         = "user_confirmation"
)

// Capabilities lists the plantable capabilities in a fixed order.
var Capabilities = []string{
	PreconditionVerification, ArgumentGrounding, MultiStepCompletion, ToolErrorRecovery, UserConfirmation,
}

// The simulated environments.
const (
	Airline = "sim-airline"
	Retail  = "sim-retail"
)

// Environments lists the simulated environments.
var Environments = []string{Airline, Retail}

// Labels a labeler gives.
const (
	LabelNA      = "NA"
	LabelPresent = "PRESENT"
	LabelLacking = "LACKING"
)

// AgentSpec is one agent version of the fleet.
type AgentSpec struct {
	Name    string `yaml:"name" json:"name"`
	Version string `yaml:"version" json:"version"`
	// Environments the agent serves; each of its rollouts picks one
	// uniformly.
	Environments []string `yaml:"environments" json:"environments"`
	// Deficits maps a capability to the probability that it is lacking in
	// an episode whose task exercises it.
	Deficits map[string]float64 `yaml:"deficits,omitempty" json:"deficits,omitempty"`
	// Weight is the agent's share of the traffic (0 means 1).
	Weight float64 `yaml:"weight,omitempty" json:"weight,omitempty"`
}

// Fleet is the YAML form of a fleet (trace simulate --fleet FILE.yaml).
type Fleet struct {
	Agents []AgentSpec `yaml:"agents" json:"agents"`
}

// DefaultFleet is the demo fleet: support-bot v1.4.0 on the airline lacks
// precondition verification and multi-step completion; v1.5.0 fixed both on
// the airline but lacks argument grounding on the retail store.
func DefaultFleet() []AgentSpec {
	return []AgentSpec{
		{Name: "support-bot", Version: "1.4.0", Environments: []string{Airline},
			Deficits: map[string]float64{PreconditionVerification: 0.45, MultiStepCompletion: 0.5}},
		{Name: "support-bot", Version: "1.5.0", Environments: []string{Retail},
			Deficits: map[string]float64{ArgumentGrounding: 0.5}},
		{Name: "support-bot", Version: "1.5.0", Environments: []string{Airline}},
	}
}

// ParseFleet reads a fleet YAML document ({agents: [...]}) and validates it.
func ParseFleet(data []byte) ([]AgentSpec, error) {
	var f Fleet
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if err := validateFleet(f.Agents); err != nil {
		return nil, err
	}
	return f.Agents, nil
}

// MarshalFleet renders a fleet as YAML (the format ParseFleet reads).
func MarshalFleet(agents []AgentSpec) ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(Fleet{Agents: agents}); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func validateFleet(agents []AgentSpec) error {
	if len(agents) == 0 {
		return fmt.Errorf("fleet: no agents")
	}
	seen := map[[2]string]bool{}
	for i, a := range agents {
		where := fmt.Sprintf("fleet: agents[%d] (%s %s)", i, a.Name, a.Version)
		if a.Name == "" || a.Version == "" {
			return fmt.Errorf("%s: name and version are required", where)
		}
		if len(a.Environments) == 0 {
			return fmt.Errorf("%s: at least one environment is required (%s)", where, strings.Join(Environments, ", "))
		}
		for _, e := range a.Environments {
			if !slices.Contains(Environments, e) {
				return fmt.Errorf("%s: unknown environment %q (want %s)", where, e, strings.Join(Environments, ", "))
			}
			k := [2]string{e, a.Version}
			if seen[k] {
				return fmt.Errorf("%s: cohort %s/%s is served by two agents", where, e, a.Version)
			}
			seen[k] = true
		}
		for c, p := range a.Deficits {
			if !slices.Contains(Capabilities, c) {
				return fmt.Errorf("%s: unknown capability %q (want %s)", where, c, strings.Join(Capabilities, ", "))
			}
			if !(p >= 0 && p <= 1) {
				return fmt.Errorf("%s: deficit %s = %v, want a probability in [0, 1]", where, c, p)
			}
		}
		if a.Weight < 0 {
			return fmt.Errorf("%s: weight %v is negative", where, a.Weight)
		}
	}
	return nil
}

// OutcomeModel sets how episodes are graded.
type OutcomeModel struct {
	// FailIfLacking is P(failure) when a capability the episode exercises is
	// planted as lacking.
	FailIfLacking float64
	// BaseFailure is P(failure) when nothing is planted.
	BaseFailure float64
}

// DefaultOutcomes are used when Config.Outcomes is nil.
var DefaultOutcomes = OutcomeModel{FailIfLacking: 0.9, BaseFailure: 0.1}

// DefaultStart is the start time of the first episode when Config.Start is
// zero.
var DefaultStart = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// Config configures a Generator.
type Config struct {
	Seed uint64
	// Fleet is the agents; nil means DefaultFleet().
	Fleet []AgentSpec
	// Rollouts bounds Next and All; 0 means unbounded.
	Rollouts int
	// Start is the start time of rollout 0 (zero: DefaultStart) and
	// Interval the time between the starts of consecutive rollouts (zero:
	// 30s).
	Start    time.Time
	Interval time.Duration
	// Outcomes is the grading model; nil means DefaultOutcomes.
	Outcomes *OutcomeModel
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Rollouts < 0 {
		return fmt.Errorf("rollouts must be >= 0, got %d", c.Rollouts)
	}
	if c.Interval < 0 {
		return fmt.Errorf("interval must be >= 0, got %s", c.Interval)
	}
	if o := c.Outcomes; o != nil {
		if !(o.FailIfLacking >= 0 && o.FailIfLacking <= 1) || !(o.BaseFailure >= 0 && o.BaseFailure <= 1) {
			return fmt.Errorf("outcomes: probabilities must be in [0, 1], got %+v", *o)
		}
	}
	if c.Fleet == nil {
		return nil
	}
	return validateFleet(c.Fleet)
}

// Generator produces rollouts. Rollout(i) is a pure function of the
// configuration and i; Next walks i = 0, 1, 2, … It is not safe for
// concurrent use of Next, but Rollout may be called concurrently.
type Generator struct {
	cfg    Config
	out    OutcomeModel
	cum    []float64 // cumulative agent weights
	worlds map[string]*worldState
	next   int
}

type worldState struct {
	w     world
	tasks []*task
	tools []schemas.Tool
}

// New returns a generator. It panics when cfg does not Validate; check
// user-supplied configurations with Validate first.
func New(cfg Config) *Generator {
	if err := cfg.Validate(); err != nil {
		panic("simulate: " + err.Error())
	}
	if cfg.Fleet == nil {
		cfg.Fleet = DefaultFleet()
	}
	if cfg.Start.IsZero() {
		cfg.Start = DefaultStart
	}
	cfg.Interval = cmp.Or(cfg.Interval, 30*time.Second)
	g := &Generator{cfg: cfg, out: DefaultOutcomes, worlds: map[string]*worldState{}}
	if cfg.Outcomes != nil {
		g.out = *cfg.Outcomes
	}
	total := 0.0
	for _, a := range cfg.Fleet {
		w := a.Weight
		w = cmp.Or(w, 1)
		total += w
		g.cum = append(g.cum, total)
	}
	for _, w := range []world{newAirline(cfg.Seed), newRetail(cfg.Seed)} {
		ws := &worldState{w: w, tools: w.tools()}
		ws.tasks = buildTasks(cfg.Seed, w)
		g.worlds[w.env()] = ws
	}
	return g
}

// Next returns the next rollout, or nil once Config.Rollouts have been
// produced.
func (g *Generator) Next() *schemas.Rollout {
	if g.cfg.Rollouts > 0 && g.next >= g.cfg.Rollouts {
		return nil
	}
	r := g.Rollout(g.next)
	g.next++
	return r
}

// All iterates over the remaining rollouts (unbounded when Config.Rollouts
// is 0).
func (g *Generator) All() iter.Seq[*schemas.Rollout] {
	return func(yield func(*schemas.Rollout) bool) {
		for r := g.Next(); r != nil; r = g.Next() {
			if !yield(r) {
				return
			}
		}
	}
}

// Tasks returns the number of tasks of an environment's task pool.
func (g *Generator) Tasks(env string) int {
	if ws := g.worlds[env]; ws != nil {
		return len(ws.tasks)
	}
	return 0
}

func mix64(x uint64) uint64 { // splitmix64 finalizer
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// RolloutID returns the uuid-shaped id of rollout i of a seed.
func RolloutID(seed uint64, i int) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], seed)
	binary.BigEndian.PutUint64(b[8:], uint64(i))
	h := sha256.Sum256(append([]byte("trace/simulate/rollout\x00"), b[:]...))
	u := h[:16]
	u[6] = u[6]&0x0f | 0x80 // version 8: custom
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	s := hex.EncodeToString(u)
	return s[0:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:32]
}

// Rollout returns rollout i.
func (g *Generator) Rollout(i int) *schemas.Rollout { return g.rollout(i, nil) }

// Effect is what serving a conversation with an adapter does to it in the
// simulation — the stand-in for a trained adapter, since no model is
// trained: a capability in Fixes is never lacking (its planted deficit is
// gone), one in Breaks is lacking with the given probability whenever the
// task exercises it (a harmful adapter). Adapter and DecisionID end up in
// the rollout's routing field and its metadata["sim"]["served_by"].
type Effect struct {
	Adapter, DecisionID, ConversationID string
	Fixes                               []string
	Breaks                              map[string]float64
}

// RolloutWith is rollout i served under the effect: the same task, the
// same conversation up to the deficits the effect changes, the same draws
// otherwise (Rollout(i) and RolloutWith(i, Effect{}) differ only in the
// routing fields).
func (g *Generator) RolloutWith(i int, eff Effect) *schemas.Rollout { return g.rollout(i, &eff) }

// Plan is what a router sees of rollout i before it is played: its cohort,
// its conversation's system prompt and first user turn, and the
// capabilities its task exercises (the simulation's ground truth, which a
// simulated classifier may use; a real one reads only the messages).
type Plan struct {
	Environment, AgentVersion, TaskID string
	System, FirstUser                 string
	Needed                            []string
	Deficits                          map[string]float64 // the agent version's planted deficit rates
}

// Plan returns rollout i's plan.
func (g *Generator) Plan(i int) Plan {
	r := g.rollout(i, nil)
	p := Plan{Environment: r.Environment, AgentVersion: r.Agent.Version, TaskID: r.TaskID}
	for _, m := range r.Messages {
		if m.Role == "system" && p.System == "" {
			p.System = m.Content
		}
		if m.Role == "user" {
			p.FirstUser = m.Content
			break
		}
	}
	sim, _ := r.Metadata["sim"].(map[string]any)
	p.Needed, _ = sim["needed"].([]string)
	for _, a := range g.cfg.Fleet {
		if a.Version == p.AgentVersion && slices.Contains(a.Environments, p.Environment) {
			p.Deficits = a.Deficits
		}
	}
	return p
}

func (g *Generator) rollout(i int, eff *Effect) *schemas.Rollout {
	rng := rand.New(rand.NewPCG(mix64(g.cfg.Seed), mix64(uint64(i)^0x5851f42d4c957f2d)))
	u := rng.Float64() * g.cum[len(g.cum)-1]
	ai := 0
	for ai < len(g.cum)-1 && u >= g.cum[ai] {
		ai++
	}
	agent := g.cfg.Fleet[ai]
	env := agent.Environments[rng.IntN(len(agent.Environments))]
	ws := g.worlds[env]
	t := ws.tasks[rng.IntN(len(ws.tasks))]

	ep := &episode{rng: rng, c: newConv(rng, ws.w.policy()), drawn: map[string]bool{}}
	needed := t.needed()
	for _, c := range Capabilities { // always draw, so rng use does not depend on the task
		p := rng.Float64()
		rate := agent.Deficits[c]
		if eff != nil {
			if slices.Contains(eff.Fixes, c) {
				rate = 0
			}
			if b, ok := eff.Breaks[c]; ok {
				rate = max(rate, b)
			}
		}
		if needed[c] && p < rate {
			ep.drawn[c] = true
		}
	}
	ws.w.play(ep, t)

	labels := ep.labels(t)
	var planted, lacking, neededList, drawn []string
	for _, c := range Capabilities {
		if needed[c] {
			neededList = append(neededList, c)
		}
		if ep.drawn[c] {
			drawn = append(drawn, c)
		}
		if labels[c] == LabelLacking {
			lacking = append(lacking, c)
			if ep.drawn[c] {
				planted = append(planted, c)
			}
		}
	}
	grader, reward, cause := ep.grade(t, planted, g.out)

	start := g.cfg.Start.Add(time.Duration(i) * g.cfg.Interval).Add(time.Duration(rng.IntN(20000)) * time.Millisecond)
	r := &schemas.Rollout{
		Schema:      "rollout/v1",
		RolloutID:   RolloutID(g.cfg.Seed, i),
		Environment: env,
		Agent:       schemas.Agent{Name: agent.Name, Version: agent.Version},
		TaskID:      t.id,
		StartTime:   start,
		EndTime:     start.Add(ep.c.dur).Truncate(time.Millisecond),
		Outcome:     schemas.Outcome{Reward: reward},
		Messages:    ep.c.msgs,
		Tools:       ws.tools,
		Grader:      grader,
		Metadata: map[string]any{
			"source":             "simulate",
			"task_ref":           env + ":" + t.id,
			"required_actions":   t.required,
			"termination_reason": ep.termination(),
			"sim": map[string]any{
				"seed":          fmt.Sprint(g.cfg.Seed),
				"index":         i,
				"task_kind":     t.kind,
				"tool_error":    t.errSite,
				"needed":        nonNil(neededList),
				"drawn":         nonNil(drawn),
				"planted":       nonNil(planted),
				"lacking":       nonNil(lacking),
				"labels":        labels,
				"failure_cause": cause,
			},
		},
	}
	if eff != nil && (eff.Adapter != "" || eff.DecisionID != "" || eff.ConversationID != "") {
		r.ConversationID = eff.ConversationID
		if eff.DecisionID != "" || eff.Adapter != "" {
			r.Routing = &schemas.Routing{DecisionID: eff.DecisionID, Adapter: eff.Adapter}
		}
		r.Metadata["sim"].(map[string]any)["served_by"] = map[string]any{"adapter": eff.Adapter, "decision_id": eff.DecisionID,
			"fixes": nonNil(eff.Fixes), "simulated_effect": "the simulation's stand-in for a trained adapter: no model was trained"}
	}
	return r
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Truth is the ground truth a simulated rollout records in metadata["sim"].
type Truth struct {
	Seed     string `json:"seed"`
	Index    int    `json:"index"`
	TaskKind string `json:"task_kind"`
	// ToolError is where the task's tool error happens: "" (none),
	// "lookup" (finding the user) or "write" (the first write).
	ToolError string `json:"tool_error"`
	// Needed are the capabilities the task exercises (those a deficit can
	// be planted on).
	Needed []string `json:"needed"`
	// Drawn are the deficits drawn for this episode (each needed
	// capability is drawn lacking with the agent's rate).
	Drawn []string `json:"drawn"`
	// Planted are the drawn deficits that showed in the conversation. A
	// drawn deficit can stay hidden when another one cuts the episode
	// short: an agent that gives up after a tool error never writes, so it
	// cannot skip a precondition check.
	Planted []string `json:"planted"`
	// Lacking are the capabilities a perfect labeler labels LACKING: the
	// planted ones and their consequences (an agent that gives up after a
	// tool error also leaves a multi-step task incomplete).
	Lacking []string `json:"lacking"`
	// Labels is the expected label of every capability.
	Labels map[string]string `json:"labels"`
	// FailureCause is "planted", "base" (a failure with no planted cause)
	// or "" for a success.
	FailureCause string `json:"failure_cause"`
}

// TruthOf reads the ground truth of a simulated rollout (freshly generated
// or decoded from JSON).
func TruthOf(r *schemas.Rollout) (Truth, bool) {
	v, ok := r.Metadata["sim"]
	if !ok {
		return Truth{}, false
	}
	b, err := json.Marshal(v)
	if err != nil {
		return Truth{}, false
	}
	var t Truth
	if err := json.Unmarshal(b, &t); err != nil {
		return Truth{}, false
	}
	return t, true
}

// --- tasks and episodes ---

// task is one entry of an environment's task pool. Its data (user,
// reservations / orders, the flight options) is fixed, like a τ² task's
// initial state; the agent's behaviour varies per episode.
type task struct {
	id       string
	kind     string
	writes   int      // write actions the task requires
	required []string // gold tool names, in order (τ² evaluation_criteria.actions)
	errSite  string   // "", "lookup" or "write"
	data     any
}

func (t *task) needed() map[string]bool {
	n := map[string]bool{}
	if t.writes >= 1 {
		n[PreconditionVerification] = true
		n[ArgumentGrounding] = true
		n[UserConfirmation] = true
	}
	if t.writes >= 2 {
		n[MultiStepCompletion] = true
	}
	if t.errSite != "" {
		n[ToolErrorRecovery] = true
	}
	return n
}

// world is one simulated environment.
type world interface {
	env() string
	policy() string
	tools() []schemas.Tool
	poolSize() int
	// kinds returns the task kinds: read-only, one write, several writes.
	kinds() (readOnly, single, multi []string)
	// writeError reports whether a kind's first write can hit a tool error.
	writeError(kind string) bool
	newTask(rng *rand.Rand, id int, kind, errSite string) *task
	// play writes the conversation of one episode up to, not including,
	// the final answer (or to the end, when the agent transferred).
	play(ep *episode, t *task)
}

// Task mix of a pool.
const (
	shareReadOnly  = 0.15
	shareMulti     = 0.50
	shareToolError = 0.30
)

func buildTasks(seed uint64, w world) []*task {
	h := sha256.Sum256([]byte("trace/simulate/tasks/" + w.env()))
	rng := rand.New(rand.NewPCG(mix64(seed), binary.BigEndian.Uint64(h[:8])))
	n := w.poolSize()
	ro, single, multi := w.kinds()
	nRO := int(float64(n)*shareReadOnly + 0.5)
	nMulti := int(float64(n)*shareMulti + 0.5)
	kinds := make([]string, 0, n)
	for i := 0; i < n; i++ {
		switch {
		case i < nRO:
			kinds = append(kinds, ro[i%len(ro)])
		case i < nRO+nMulti:
			kinds = append(kinds, multi[(i-nRO)%len(multi)])
		default:
			kinds = append(kinds, single[(i-nRO-nMulti)%len(single)])
		}
	}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	errs := make([]bool, n)
	for i := 0; i < int(float64(n)*shareToolError+0.5); i++ {
		errs[i] = true
	}
	rng.Shuffle(len(errs), func(i, j int) { errs[i], errs[j] = errs[j], errs[i] })
	tasks := make([]*task, n)
	for i := range tasks {
		site := ""
		if errs[i] {
			site = "lookup"
			if w.writeError(kinds[i]) && rng.IntN(2) == 0 {
				site = "write"
			}
		}
		trng := rand.New(rand.NewPCG(mix64(seed)^uint64(i), binary.BigEndian.Uint64(h[8:16])))
		tasks[i] = w.newTask(trng, i, kinds[i], site)
	}
	return tasks
}

// writeRec records one write attempt of the agent, from the generator's
// own decisions (not by parsing the conversation).
type writeRec struct {
	name       string
	entityRead bool // the entity it modifies was read before
	grounded   bool // every identifier argument appeared before
	confirmed  bool // the user confirmed after the agent asked
	ok         bool // the tool succeeded
}

type finalMsg struct {
	right string // the final answer
	wrong string // the same with a wrong detail (a failure with no planted cause)
	fact  string // what the user must be told, for the grader's reasons
}

type episode struct {
	rng   *rand.Rand
	c     *conv
	drawn map[string]bool // capabilities planted as lacking (exercised ones only)

	writes      []writeRec
	errHit      bool
	gaveUp      bool
	transferred bool
	missing     []string // required write calls not made, "name(args)"
	final       finalMsg
}

func (ep *episode) lacking(c string) bool { return ep.drawn[c] }

// confirms reports whether the agent asks for confirmation in this episode.
func (ep *episode) confirms() bool { return !ep.drawn[UserConfirmation] }

func (ep *episode) termination() string {
	if ep.transferred {
		return "transfer"
	}
	return "user_stop"
}

// giveUp ends the episode after a tool error: the agent apologises and
// transfers to a human agent.
func (ep *episode) giveUp(explain, summary string) {
	ep.gaveUp = true
	ep.transferred = true
	ep.final.fact = "resolution of the user's request"
	ep.c.assistant(explain)
	ep.c.call("", callSpec{name: "transfer_to_human_agents", args: map[string]any{"summary": summary},
		result: "Transfer successful"})
	ep.c.assistant("YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON.")
	ep.c.user("###TRANSFER###")
}

// write performs one write call and records it.
// miss records a required write the agent did not make, as "name(args)".
func (ep *episode) miss(tool string, args map[string]any) {
	ep.missing = append(ep.missing, tool+"("+argString(args)+")")
}

// conclude sets the final message of an episode whose writes were made:
// opening, then sentence(i)'s right text for each of the n writes done, and
// the closing question. The wrong variant (the factual slip a grader
// catches) differs in the first write's sentence only.
func (ep *episode) conclude(opening string, n int, sentence func(i int) (right, wrong string)) {
	var right, wrong []string
	for i := range n {
		s, w := sentence(i)
		right = append(right, s)
		if i == 0 {
			wrong = append(wrong, w)
		} else {
			wrong = append(wrong, s)
		}
	}
	tail := " Is there anything else I can help you with?"
	ep.final.right = opening + " " + strings.Join(right, " ") + tail
	ep.final.wrong = opening + " " + strings.Join(wrong, " ") + tail
}

func (ep *episode) write(text string, cs callSpec, rec writeRec) {
	rec.name = cs.name
	rec.ok = !cs.err
	ep.c.call(text, cs)
	ep.writes = append(ep.writes, rec)
}

// fabricate returns a value made by gen that appears nowhere in the
// conversation so far.
func (ep *episode) fabricate(gen func() string) string {
	for {
		v := gen()
		if !ep.c.grounded(v) {
			return v
		}
	}
}

// stopAfter returns how many of n writes the agent performs: all, or (when
// multi-step completion is lacking) at least one but fewer than n.
func (ep *episode) stopAfter(n int) int {
	if n >= 2 && ep.drawn[MultiStepCompletion] {
		return 1 + ep.rng.IntN(n-1)
	}
	return n
}

// labels derives the expected label of every capability from the records.
func (ep *episode) labels(t *task) map[string]string {
	l := map[string]string{}
	if len(ep.writes) == 0 {
		l[PreconditionVerification], l[ArgumentGrounding], l[UserConfirmation] = LabelNA, LabelNA, LabelNA
	} else {
		l[PreconditionVerification], l[ArgumentGrounding], l[UserConfirmation] = LabelPresent, LabelPresent, LabelPresent
		for _, w := range ep.writes {
			if !w.entityRead {
				l[PreconditionVerification] = LabelLacking
			}
			if !w.grounded {
				l[ArgumentGrounding] = LabelLacking
			}
			if !w.confirmed {
				l[UserConfirmation] = LabelLacking
			}
		}
	}
	ok := 0
	for _, w := range ep.writes {
		if w.ok {
			ok++
		}
	}
	switch {
	case t.writes < 2:
		l[MultiStepCompletion] = LabelNA
	case ok < t.writes:
		l[MultiStepCompletion] = LabelLacking
	default:
		l[MultiStepCompletion] = LabelPresent
	}
	switch {
	case !ep.errHit:
		l[ToolErrorRecovery] = LabelNA
	case ep.gaveUp:
		l[ToolErrorRecovery] = LabelLacking
	default:
		l[ToolErrorRecovery] = LabelPresent
	}
	return l
}

var stopLines = []string{
	"Great, thank you for your help! ###STOP###",
	"Thanks, that's all I needed. ###STOP###",
	"Perfect, thanks a lot. ###STOP###",
	"Thank you! Have a nice day. ###STOP###",
}

// grade decides the outcome, writes the final answer and the user's stop,
// and returns the grader record, the reward and the failure cause.
func (ep *episode) grade(t *task, planted []string, om OutcomeModel) (*schemas.Grader, float64, string) {
	u := ep.rng.Float64()
	mode := ep.rng.IntN(2)
	fail, cause := false, ""
	if len(planted) > 0 {
		fail, cause = u < om.FailIfLacking, "planted"
	} else {
		fail, cause = u < om.BaseFailure, "base"
	}
	if !fail {
		cause = ""
	}
	db, comm := 1.0, 1.0
	var reasons []string
	if fail {
		switch {
		case cause == "planted" && t.writes > 0:
			db = 0
			if mode == 1 || ep.transferred {
				comm = 0
			}
		case cause == "planted":
			comm = 0
		case t.writes > 0 && mode == 0:
			db = 0 // a wrong write with no planted cause (e.g. the wrong cabin)
		default:
			comm = 0 // a wrong final answer
		}
		if db == 0 {
			reasons = append(reasons, "db: final database state differs from the expected one")
			for _, m := range ep.missing {
				reasons = append(reasons, "action: expected call "+m+" not made")
			}
		}
		if comm == 0 {
			reasons = append(reasons, fmt.Sprintf("communicate: %q not communicated", ep.final.fact))
		}
	}
	if !ep.transferred {
		text := ep.final.right
		if comm == 0 {
			text = ep.final.wrong
		}
		ep.c.assistant(text)
		ep.c.user(pick(ep.rng, stopLines))
	}
	g := &schemas.Grader{Reasons: reasons, Breakdown: map[string]float64{"DB": db, "COMMUNICATE": comm}}
	return g, (db + comm) / 2, cause
}

// argString renders call arguments for a grader reason.
func argString(args map[string]any) string {
	b, _ := json.Marshal(args)
	s := string(b)
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}
