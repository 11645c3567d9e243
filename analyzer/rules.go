package analyzer

// rules.go is the rules labeler: every capability's Detector is a CEL
// expression (cel.dev/cel-go) evaluated over variables that describe one
// rollout, and returns "NA", "PRESENT" or "LACKING". The variable model is
// documented in docs/dictionary.md; keep the two in sync.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/ext"

	"github.com/traceops/trace/schemas"
)

func isRuleLabel(s string) bool {
	return s == schemas.LabelNA || s == schemas.LabelPresent || s == schemas.LabelLacking
}

// DefaultWritePrefixes are the tool-name prefixes of write tools (tools
// that change the environment's state): a call is a write when its name
// starts with one of them. They cover the τ² airline, retail and telecom
// domains; transfer_to_human_agents, calculate, get_*, find_*, list_* and
// search_* are reads.
var DefaultWritePrefixes = []string{
	"add_", "apply_", "book_", "cancel_", "change_", "create_", "delete_", "disable_", "enable_",
	"exchange_", "modify_", "refuel_", "remove_", "reset_", "resume_", "return_", "send_", "set_",
	"suspend_", "toggle_", "update_",
}

// ConfirmationPattern decides calls[].confirmed: the last user message before
// the call contains an affirmative answer.
var ConfirmationPattern = regexp.MustCompile(`(?i)\b(yes|yeah|yep|yup|confirm|confirmed|proceed|go ahead|oui)\b`)

// DefaultRulesCostLimit bounds the CEL cost of one detector evaluation.
const DefaultRulesCostLimit = 50_000_000

// RulesOptions tune a RulesLabeler.
type RulesOptions struct {
	// WritePrefixes decide calls[].write and the write_prefixes variable;
	// nil means DefaultWritePrefixes.
	WritePrefixes []string
	// CostLimit bounds one detector evaluation (CEL cost units); 0 means
	// DefaultRulesCostLimit. An evaluation over the limit fails the run.
	CostLimit uint64
}

// RulesLabeler labels rollouts with the CEL detectors of a dictionary. It
// makes one run (run 0) with exactly one label per capability. A detector
// that is missing, does not compile or does not return a string is a
// dictionary error (CheckDetector; Dictionary.Validate refuses such a
// dictionary before it is stored, but one stored earlier may still have
// it): Compile returns it, naming the capability, and Label
// fails the run with it (RunLabels.Failed), as it does for a detector that
// fails at evaluation or returns a value other than NA, PRESENT or LACKING
// — no label is ever invented, and the analyze stage records the failed run
// and goes on instead of retrying the batch: the dictionary does not change
// until a new version is applied.
//
// Compiled detectors are cached per dictionary fingerprint (which covers
// the detectors). A RulesLabeler is safe for concurrent use.
type RulesLabeler struct {
	prefixes []string
	cost     uint64

	mu    sync.Mutex
	cache map[string]*compiledRules
}

type compiledRules struct {
	progs []cel.Program // in dictionary order
	err   error
}

// maxCompiledDictionaries bounds the cache; it is cleared when full.
const maxCompiledDictionaries = 256

// NewRulesLabeler returns a rules labeler.
func NewRulesLabeler(opt RulesOptions) *RulesLabeler {
	l := &RulesLabeler{prefixes: opt.WritePrefixes, cost: opt.CostLimit, cache: map[string]*compiledRules{}}
	if l.prefixes == nil {
		l.prefixes = DefaultWritePrefixes
	}
	l.cost = cmp.Or(l.cost, DefaultRulesCostLimit)
	return l
}

// Name implements Labeler.
func (*RulesLabeler) Name() string { return "rules" }

// Runs implements Labeler: the rules are deterministic, one run suffices.
func (*RulesLabeler) Runs() int { return 1 }

// RulesEnv returns the CEL environment detectors are compiled in: the
// variables rollout, messages, calls and write_prefixes, and the cel-go
// extensions strings, bindings (cel.bind), lists, sets and math. rollout,
// the elements of messages and those of calls are object types
// (trace.Rollout, trace.Message, trace.Call) whose fields are the keys
// RuleVariables writes, so the checker rejects a field that does not exist.
func RulesEnv() (*cel.Env, error) {
	opts := []cel.EnvOption{
		cel.Variable("rollout", ruleRolloutType.celType()),
		cel.Variable("messages", cel.ListType(ruleMessageType.celType())),
		cel.Variable("calls", cel.ListType(ruleCallType.celType())),
		cel.Variable("write_prefixes", cel.ListType(cel.StringType)),
		cel.CrossTypeNumericComparisons(true),
		ext.Strings(),
		ext.Bindings(),
		ext.Lists(),
		ext.Sets(),
		ext.Math(),
	}
	for _, t := range ruleTypes {
		opts = append(opts, cel.Types(t))
	}
	return cel.NewEnv(opts...)
}

// rulesEnv is the one environment of the process: the rules labeler and
// CheckDetector compile in it (a cel.Env is safe for concurrent use).
var rulesEnv = sync.OnceValues(RulesEnv)

// CheckDetector compiles and type-checks a capability's detector exactly as
// the rules labeler does: it must parse, name only declared variables and
// fields, and return a string. The error wraps ErrNoDetector when there is
// no detector; it does not name the capability.
func CheckDetector(c Capability) error {
	env, err := rulesEnv()
	if err != nil {
		return fmt.Errorf("rules: CEL environment: %w", err)
	}
	_, err = compileDetector(env, c.Detector)
	return err
}

// compileDetector is the one compile path of detectors: the labeler's
// Compile and CheckDetector (dictionary validation) cannot disagree.
func compileDetector(env *cel.Env, detector string) (*cel.Ast, error) {
	if strings.TrimSpace(detector) == "" {
		return nil, ErrNoDetector
	}
	ast, iss := env.Compile(detector)
	if iss != nil && iss.Err() != nil {
		return nil, fmt.Errorf("detector does not compile:\n%w", iss.Err())
	}
	if t := ast.OutputType(); !t.IsExactType(cel.StringType) {
		return nil, fmt.Errorf("detector returns %s, want string (\"NA\", \"PRESENT\" or \"LACKING\")", cel.FormatCELType(t))
	}
	return ast, nil
}

// Compile compiles (and caches) the detectors of a dictionary, reporting the
// first capability whose detector is missing, does not compile or does not
// return a string.
func (l *RulesLabeler) Compile(d *Dictionary) error {
	_, err := l.compiled(d)
	return err
}

func (l *RulesLabeler) compiled(d *Dictionary) (*compiledRules, error) {
	key := d.Fingerprint()
	l.mu.Lock()
	cr, ok := l.cache[key]
	l.mu.Unlock()
	if ok {
		return cr, cr.err
	}
	cr = l.compile(d)
	l.mu.Lock()
	if len(l.cache) >= maxCompiledDictionaries {
		clear(l.cache)
	}
	l.cache[key] = cr
	l.mu.Unlock()
	return cr, cr.err
}

func (l *RulesLabeler) compile(d *Dictionary) *compiledRules {
	env, err := rulesEnv()
	if err != nil {
		return &compiledRules{err: fmt.Errorf("rules: CEL environment: %w", err)}
	}
	where := fmt.Sprintf("rules: dictionary %s/%s v%d", d.Environment, d.AgentVersion, d.Version)
	cr := &compiledRules{}
	for _, c := range d.Capabilities {
		ast, err := compileDetector(env, c.Detector)
		if err != nil {
			return &compiledRules{err: fmt.Errorf("%s: capability %q: %w", where, c.Name, err)}
		}
		prg, err := env.Program(ast,
			cel.EvalOptions(cel.OptOptimize),
			cel.CostLimit(l.cost),
			cel.InterruptCheckFrequency(256),
		)
		if err != nil {
			return &compiledRules{err: fmt.Errorf("%s: capability %q: %w", where, c.Name, err)}
		}
		cr.progs = append(cr.progs, prg)
	}
	return cr
}

// Label implements Labeler.
func (l *RulesLabeler) Label(ctx context.Context, d *Dictionary, r *schemas.Rollout) ([]RunLabels, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cr, err := l.compiled(d)
	if err != nil {
		return []RunLabels{{Run: 0, Failed: err.Error()}}, nil
	}
	vars := RuleVariables(r, l.prefixes)
	labels := make(map[string]string, len(d.Capabilities))
	for i, c := range d.Capabilities {
		out, _, err := cr.progs[i].ContextEval(ctx, vars)
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return nil, cerr
			}
			return []RunLabels{{Run: 0, Failed: fmt.Sprintf("capability %s: detector failed: %v", c.Name, err)}}, nil
		}
		s, ok := out.Value().(string)
		if !ok || !isRuleLabel(s) {
			return []RunLabels{{Run: 0, Failed: fmt.Sprintf("capability %s: detector returned %v, want NA, PRESENT or LACKING", c.Name, out)}}, nil
		}
		labels[c.Name] = s
	}
	return []RunLabels{{Run: 0, Labels: labels}}, nil
}

// RuleVariables builds the CEL variables of a rollout (docs/dictionary.md,
// "The variable model"). writePrefixes decide calls[].write; nil means
// DefaultWritePrefixes.
func RuleVariables(r *schemas.Rollout, writePrefixes []string) map[string]any {
	if writePrefixes == nil {
		writePrefixes = DefaultWritePrefixes
	}
	isWrite := func(name string) bool {
		for _, p := range writePrefixes {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
		return false
	}

	// Tool results by the id of the call they answer.
	results := map[string][]int{}
	for i, m := range r.Messages {
		if m.Role == "tool" && m.ToolCallID != "" {
			results[m.ToolCallID] = append(results[m.ToolCallID], i)
		}
	}

	messages := make([]any, len(r.Messages))
	var calls []any
	var prior strings.Builder
	lastUser := ""
	for i, m := range r.Messages {
		names := make([]any, len(m.ToolCalls))
		for j, tc := range m.ToolCalls {
			names[j] = tc.Name
		}
		turn := int64(-1)
		if m.TurnIdx != nil {
			turn = int64(*m.TurnIdx)
		}
		messages[i] = map[string]any{
			"index": int64(i), "role": m.Role, "content": m.Content, "error": m.Error,
			"requestor": m.Requestor, "tool_call_id": m.ToolCallID, "tool_calls": names, "turn_idx": turn,
		}
		for _, tc := range m.ToolCalls {
			args := normalizeMap(tc.Arguments)
			req := tc.Requestor
			req = cmp.Or(req, "assistant")
			call := map[string]any{
				"index": int64(i), "seq": int64(len(calls)), "id": tc.ID, "name": tc.Name,
				"args": args, "arg_values": argValues(args), "requestor": req,
				"result": "", "error": false, "has_result": false, "result_index": int64(-1),
				"prior": prior.String(), "confirmed": lastUser != "" && ConfirmationPattern.MatchString(lastUser),
				"write": isWrite(tc.Name),
			}
			for _, j := range results[tc.ID] {
				if j > i {
					call["result"], call["error"], call["has_result"], call["result_index"] = r.Messages[j].Content, r.Messages[j].Error, true, int64(j)
					break
				}
			}
			calls = append(calls, call)
		}
		if m.Role == "user" || m.Role == "tool" {
			if prior.Len() > 0 {
				prior.WriteByte('\n')
			}
			prior.WriteString(m.Content)
		}
		if m.Role == "user" {
			lastUser = m.Content
		}
	}
	if calls == nil {
		calls = []any{}
	}

	tools := make([]any, len(r.Tools))
	for i, t := range r.Tools {
		tools[i] = t.Function.Name
	}
	reasons := []any{}
	breakdown := map[string]any{}
	if r.Grader != nil {
		for _, s := range r.Grader.Reasons {
			reasons = append(reasons, s)
		}
		for k, v := range r.Grader.Breakdown {
			breakdown[k] = v
		}
	}
	md := normalizeMap(r.Metadata)
	prefixes := make([]any, len(writePrefixes))
	for i, p := range writePrefixes {
		prefixes[i] = p
	}
	return map[string]any{
		"rollout": map[string]any{
			"id": r.RolloutID, "environment": r.Environment, "task_id": r.TaskID,
			"agent_name": r.Agent.Name, "agent_version": r.Agent.Version,
			"success": r.Succeeded(), "reward": r.Outcome.Reward,
			"metadata": md, "message_count": int64(len(r.Messages)), "call_count": int64(len(calls)),
			"tools": tools, "grader_reasons": reasons, "grader_breakdown": breakdown,
		},
		"messages":       messages,
		"calls":          calls,
		"write_prefixes": prefixes,
	}
}

// normalizeMap turns a JSON-like map into CEL-friendly values: every number
// becomes a double (as JSON decoding gives), nested objects map[string]any
// and arrays []any. nil gives an empty map.
func normalizeMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = normalizeValue(v)
	}
	return out
}

func normalizeValue(v any) any {
	switch x := v.(type) {
	case nil, string, bool, float64:
		return x
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return x.String()
		}
		return f
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case int32:
		return float64(x)
	case uint64:
		return float64(x)
	case float32:
		return float64(x)
	case map[string]any:
		return normalizeMap(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalizeValue(e)
		}
		return out
	case []string:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = e
		}
		return out
	}
	// Anything else (typed slices and maps from Go producers): through JSON.
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	var w any
	if err := json.Unmarshal(b, &w); err != nil {
		return string(b)
	}
	return normalizeValue(w)
}

// argValues lists the string forms of every scalar in a (normalized)
// argument value, nested arrays and objects flattened; object members are
// visited in key order, nulls skipped.
func argValues(args map[string]any) []any {
	out := []any{}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case nil:
		case string:
			out = append(out, x)
		case bool:
			out = append(out, strconv.FormatBool(x))
		case float64:
			out = append(out, formatNumber(x))
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(x[k])
			}
		default:
			out = append(out, fmt.Sprint(x))
		}
	}
	walk(args)
	return out
}

func formatNumber(f float64) string {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// ErrNoDetector is wrapped by errors about capabilities without detectors.
var ErrNoDetector = errors.New("capability has no detector")
