package simpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"

	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/synthesizer/calibrate"
	"github.com/traceops/trace/synthesizer/envprog"
)

// SimulatedPolicy is the simulated policy: it plays environments the way an
// agent version of the simulated fleet (internal/simulate) would, planted
// deficits included, so that `trace demo` and tests calibrate.calibrate without a
// model. It is not a model and says so: its String starts with
// "simulated", and a calibration it plays has Summary.Simulated set.
//
// It plays the environment's reference solution, except that for the
// capability the environment targets it drops or botches the step that
// capability is about, with the agent's planted probability
// (Agent.Deficits[Capability]), independently for each such step:
//
//   - precondition_verification: the reads (get_*/find_*/search_*) of a
//     record are dropped, and when the reference did not change that record
//     (its check failed) the agent changes it anyway, with the reference's
//     write of a sibling record;
//   - user_confirmation: a record the reference read but left alone (its
//     change was not confirmed) is changed anyway, the same way;
//   - multi_step_completion: the agent stops before a required write after
//     the first one and gives its final answer;
//   - argument_grounding: one identifier argument of a write is invented
//     (a character of the grounded id changed);
//   - tool_error_recovery: after a tool error the agent gives up;
//   - any other capability (structured_data_reasoning, …): each record read
//     is skipped, and the final answer is then botched (its ids and figures
//     changed); without record reads, the final answer is botched.
//
// On a hinted rollout the deficit is reduced by HintEffect (the hint helps,
// as it is meant to), and with probability BaseFailure the rollout fails
// for no planted cause, as the fleet's OutcomeModel.BaseFailure. Every
// decision is drawn from (seed, rollout): the same rollout is always played
// the same way. It is safe for concurrent use.
type SimulatedPolicy struct {
	// Agent is the simulated agent version (simulate.DefaultFleet()).
	Agent simulate.AgentSpec
	// Environment is the simulated environment the agent version serves
	// there (e.g. simulate.Airline); it only names the policy.
	Environment string
	// Capability is the capability the environment targets; its deficit
	// is Agent.Deficits[Capability].
	Capability string
	// Family picks the behaviour above when Capability is not one of the
	// names listed; "" means Capability.
	Family string
	// HintEffect is the share of the deficit a hint removes (0.5: a hinted
	// rollout lacks the capability half as often).
	HintEffect float64
	// BaseFailure is the probability of a failure with no planted cause.
	BaseFailure float64
}

// NewSimulatedPolicy is the simulated policy of agent on environment for an
// environment targeting capability, with HintEffect 0.5 and the fleet's
// default base failure rate.
func NewSimulatedPolicy(agent simulate.AgentSpec, environment, capability string) SimulatedPolicy {
	return SimulatedPolicy{
		Agent: agent, Environment: environment, Capability: capability,
		HintEffect: 0.5, BaseFailure: simulate.DefaultOutcomes.BaseFailure,
	}
}

// SimulatedFleetPolicy finds the agent version of fleet serving environment
// as version and returns its simulated policy for capability.
func SimulatedFleetPolicy(fleet []simulate.AgentSpec, environment, version, capability string) (SimulatedPolicy, error) {
	for _, a := range fleet {
		if a.Version == version && slices.Contains(a.Environments, environment) {
			return NewSimulatedPolicy(a, environment, capability), nil
		}
	}
	return SimulatedPolicy{}, fmt.Errorf("simulated policy: no agent version %s serves %s in the fleet", version, environment)
}

// Deficit is the planted probability that the agent lacks the targeted
// capability at one step.
func (p SimulatedPolicy) Deficit() float64 { return p.Agent.Deficits[p.Capability] }

func (p SimulatedPolicy) String() string {
	s := "simulated " + p.Agent.Name + "/" + p.Agent.Version
	if p.Environment != "" {
		s = "simulated " + p.Environment + "/" + p.Agent.Version
	}
	if d := p.Deficit(); d > 0 {
		return fmt.Sprintf("%s (%s lacking at %.2f)", s, p.Capability, d)
	}
	return fmt.Sprintf("%s (%s not lacking)", s, p.Capability)
}

// Simulated is true: this policy is not a model.
func (SimulatedPolicy) Simulated() bool { return true }

// Decision salts, one per kind of draw.
const (
	saltSimStep  = 0x73696d31
	saltSimBase  = 0x73696d32
	saltSimError = 0x73696d33
	saltSimMut   = 0x73696d34
)

// Act plays the rollout's next turn.
func (p SimulatedPolicy) Act(ctx context.Context, t calibrate.Turn) (envprog.Action, error) {
	ref, err := t.Reference(ctx)
	if err != nil {
		return envprog.Action{}, err
	}
	if ref == nil {
		return envprog.Action{}, fmt.Errorf("%s: the environment has no reference()", p)
	}
	deficit := p.Deficit()
	if t.Hinted {
		deficit *= 1 - p.HintEffect
	}
	family := p.Family
	if family == "" {
		family = p.Capability
	}
	if family == simulate.ToolErrorRecovery && deficit > 0 {
		if n, last := toolErrors(t.Messages); last {
			if calibrate.RolloutRNG(t.Seed, t.Rollout, saltSimError+uint64(n)).Float64() < deficit {
				return envprog.Action{Content: "I'm sorry, the system returned an error and I cannot complete your request."}, nil
			}
		}
	}
	return calibrate.Planned(p.plan(ref, t.Seed, t.Rollout, family, deficit), t), nil
}

// plan is the rollout's whole script: the reference, transformed.
func (p SimulatedPolicy) plan(ref []envprog.Action, seed int64, rollout int, family string, deficit float64) []envprog.Action {
	steps := flatten(ref)
	rng := calibrate.RolloutRNG(seed, rollout, saltSimStep)
	mut := calibrate.RolloutRNG(seed, rollout, saltSimMut)
	lacking := func() bool { return deficit > 0 && rng.Float64() < deficit }
	switch family {
	case simulate.PreconditionVerification:
		steps = skipVerification(steps, lacking, true)
	case simulate.UserConfirmation:
		steps = skipVerification(steps, lacking, false)
	case simulate.MultiStepCompletion:
		steps = stopEarly(steps, lacking)
	case simulate.ArgumentGrounding:
		for i, s := range steps {
			if c := call(s); c != nil && calibrate.IsWriteTool(c.Name) && lacking() {
				steps[i] = withCall(*c, inventID(mut, c.Arguments))
			}
		}
	case simulate.ToolErrorRecovery:
		// Decided turn by turn in Act, from the tool results.
	default:
		steps = skipReads(steps, lacking, mut)
	}
	if base := calibrate.RolloutRNG(seed, rollout, saltSimBase); base.Float64() < p.BaseFailure {
		if w := lastWrite(steps); w >= 0 && base.IntN(2) == 0 {
			steps = slices.Delete(slices.Clone(steps), w, w+1)
		} else {
			steps = botchFinal(steps, mut)
		}
	}
	return steps
}

// flatten gives each tool call its own turn (a copy of ref).
func flatten(ref []envprog.Action) []envprog.Action {
	var out []envprog.Action
	for _, a := range ref {
		if len(a.ToolCalls) == 0 {
			out = append(out, envprog.Action{Content: a.Content})
			continue
		}
		for _, c := range a.ToolCalls {
			out = append(out, envprog.Action{ToolCalls: []envprog.ToolCall{c}})
		}
	}
	return out
}

func call(a envprog.Action) *envprog.ToolCall {
	if len(a.ToolCalls) == 1 {
		return &a.ToolCalls[0]
	}
	return nil
}

func withCall(c envprog.ToolCall, args json.RawMessage) envprog.Action {
	c.Arguments = args
	return envprog.Action{ToolCalls: []envprog.ToolCall{c}}
}

func lastWrite(steps []envprog.Action) int {
	for i := len(steps) - 1; i >= 0; i-- {
		if c := call(steps[i]); c != nil && calibrate.IsWriteTool(c.Name) {
			return i
		}
	}
	return -1
}

type record struct{ key, value string }

// recordOf is the record a call is about: its first calibrate.RecordKeys argument,
// else its first other string argument named *_id.
func recordOf(c *envprog.ToolCall) (record, bool) {
	var args map[string]any
	if c == nil || json.Unmarshal(c.Arguments, &args) != nil {
		return record{}, false
	}
	for _, k := range calibrate.RecordKeys {
		if v, ok := args[k].(string); ok {
			return record{k, v}, true
		}
	}
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if v, ok := args[k].(string); ok && strings.HasSuffix(k, "_id") {
			return record{k, v}, true
		}
	}
	return record{}, false
}

// skipVerification handles each record the reference reads that the agent
// lacks the capability for: its reads are dropped (when dropReads) and, if
// the reference left it alone, it is changed anyway with the reference's
// write of a sibling record (or, when there is none, the final answer is
// botched).
func skipVerification(steps []envprog.Action, lacking func() bool, dropReads bool) []envprog.Action {
	var order []record
	reads := map[record][]int{}
	written := map[record]bool{}
	template := map[string]envprog.ToolCall{} // a write per record key
	for i, s := range steps {
		c := call(s)
		r, ok := recordOf(c)
		if !ok {
			continue
		}
		switch {
		case calibrate.IsReadTool(c.Name):
			if len(reads[r]) == 0 {
				order = append(order, r)
			}
			reads[r] = append(reads[r], i)
		case calibrate.IsWriteTool(c.Name):
			written[r] = true
			if _, ok := template[r.key]; !ok {
				template[r.key] = *c
			}
		}
	}
	drop := map[int]bool{}
	insert := map[int]envprog.ToolCall{}
	botch := false
	for _, r := range order {
		if !dropReads && written[r] {
			continue // nothing to get wrong on this record
		}
		if !lacking() {
			continue
		}
		if dropReads {
			for _, i := range reads[r] {
				drop[i] = true
			}
		}
		if _, ok := template[r.key]; !ok && !written[r] {
			botch = true
		}
		if tc, ok := template[r.key]; ok && !written[r] {
			var args map[string]any
			if json.Unmarshal(tc.Arguments, &args) == nil {
				args[r.key] = r.value
				b, _ := json.Marshal(args)
				tc.ID += "-unchecked"
				tc.Arguments = b
				pos := reads[r][0]
				if !dropReads {
					pos = reads[r][len(reads[r])-1] + 1 // after the read
				}
				insert[pos] = tc
			}
		}
	}
	out := make([]envprog.Action, 0, len(steps)+len(insert))
	for i, s := range steps {
		if tc, ok := insert[i]; ok {
			out = append(out, envprog.Action{ToolCalls: []envprog.ToolCall{tc}})
		}
		if !drop[i] {
			out = append(out, s)
		}
	}
	if botch {
		out = botchFinal(out, rand.New(rand.NewPCG(uint64(len(out)), 0x626f7463)))
	}
	return out
}

// skipReads drops each record read (not a user lookup) the agent lacks,
// and botches the final answer when it dropped any: an answer computed
// without all the records is wrong. Without record reads, the final answer
// is botched when the agent lacks the capability.
func skipReads(steps []envprog.Action, lacking func() bool, rng *rand.Rand) []envprog.Action {
	out := make([]envprog.Action, 0, len(steps))
	reads, dropped := 0, false
	for _, s := range steps {
		if c := call(s); c != nil && calibrate.IsReadTool(c.Name) {
			if r, ok := recordOf(c); ok && r.key != "user_id" {
				reads++
				if lacking() {
					dropped = true
					continue
				}
			}
		}
		out = append(out, s)
	}
	if reads == 0 {
		dropped = lacking()
	}
	if dropped {
		out = botchFinal(out, rng)
	}
	return out
}

// stopEarly ends the rollout before a required write after the first, at
// the first one the agent lacks, keeping the final answer.
func stopEarly(steps []envprog.Action, lacking func() bool) []envprog.Action {
	writes := 0
	for i, s := range steps {
		c := call(s)
		if c == nil || !calibrate.IsWriteTool(c.Name) {
			continue
		}
		writes++
		if writes > 1 && lacking() {
			out := slices.Clone(steps[:i])
			if last := steps[len(steps)-1]; len(last.ToolCalls) == 0 {
				out = append(out, last)
			}
			return out
		}
	}
	return steps
}

// idLike matches identifiers and figures: a token with a digit in it.
var idLike = regexp.MustCompile(`#?[A-Za-z0-9_.\-]*[0-9][A-Za-z0-9_.\-]*`)

// inventID changes one identifier argument of a write (a string named
// *_id or listed in calibrate.RecordKeys, or an element of a *_ids list) into an id of
// the same shape that nothing earlier mentioned.
func inventID(rng *rand.Rand, arguments json.RawMessage) json.RawMessage {
	var args map[string]any
	if json.Unmarshal(arguments, &args) != nil {
		return arguments
	}
	var keys []string
	for k, v := range args {
		switch v := v.(type) {
		case string:
			if strings.HasSuffix(k, "_id") || idLike.MatchString(v) && len(v) >= 6 {
				keys = append(keys, k)
			}
		case []any:
			if strings.HasSuffix(k, "_ids") && len(v) > 0 {
				keys = append(keys, k)
			}
		}
	}
	if len(keys) == 0 {
		return arguments
	}
	slices.Sort(keys)
	k := keys[rng.IntN(len(keys))]
	switch v := args[k].(type) {
	case string:
		args[k] = mutate(rng, v)
	case []any:
		l := slices.Clone(v)
		i := rng.IntN(len(l))
		if s, ok := l[i].(string); ok {
			l[i] = mutate(rng, s)
		}
		args[k] = l
	}
	b, err := json.Marshal(args)
	if err != nil {
		return arguments
	}
	return b
}

// mutate changes one of the last four letters or digits of s to another of
// the same kind, so the result has the same shape and differs from s.
func mutate(rng *rand.Rand, s string) string {
	b := []byte(s)
	var pos []int
	for i := len(b) - 1; i >= 0 && len(pos) < 4; i-- {
		if isAlnum(b[i]) {
			pos = append(pos, i)
		}
	}
	if len(pos) == 0 {
		return s + "X"
	}
	i := pos[rng.IntN(len(pos))]
	switch c := b[i]; {
	case c >= '0' && c <= '9':
		b[i] = '0' + (c-'0'+1+byte(rng.IntN(9)))%10
	case c >= 'a' && c <= 'z':
		b[i] = 'a' + (c-'a'+1+byte(rng.IntN(25)))%26
	default:
		b[i] = 'A' + (c-'A'+1+byte(rng.IntN(25)))%26
	}
	return string(b)
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// botchFinal changes the ids and figures of the final answer (or replaces
// an answer without any by a bare "Done.").
func botchFinal(steps []envprog.Action, rng *rand.Rand) []envprog.Action {
	if len(steps) == 0 || len(steps[len(steps)-1].ToolCalls) > 0 {
		return steps
	}
	out := slices.Clone(steps)
	last := out[len(out)-1].Content
	botched := idLike.ReplaceAllStringFunc(last, func(s string) string { return mutate(rng, s) })
	if botched == last {
		botched = "Done."
	}
	out[len(out)-1] = envprog.Action{Content: botched}
	return out
}

// toolErrors counts the error results in msgs and says whether one of the
// results of the last assistant turn is an error.
func toolErrors(msgs []envprog.Message) (n int, last bool) {
	lastTurn := true
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		if m.Role != "tool" {
			lastTurn = false
			continue
		}
		if calibrate.IsErrorResult(m.Content) {
			n++
			if lastTurn {
				last = true
			}
		}
	}
	return n, last
}
