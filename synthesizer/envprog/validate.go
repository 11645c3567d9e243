package envprog

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/traceops/trace/schemas"
)

// Validation: pure checks over a loaded Env, run before any calibration
// (docs/environments.md lists them). Each check has a verdict and a
// message that names the check, the seed and the value, so a repair
// prompt can quote it as is.

// Verdicts of a check.
const (
	Pass = "pass"
	Fail = "fail"
	Skip = "skip" // not applicable (no target tools, no reference) or not reached
)

// Check is one validation check's outcome.
type Check struct {
	Name    string `json:"name"`
	Verdict string `json:"verdict"`
	Msg     string `json:"message"`
}

// Report is the outcome of every check, in order.
type Report struct {
	Checks []Check `json:"checks"`
}

// OK reports whether no check failed.
func (r Report) OK() bool { return len(r.Failed()) == 0 }

// Failed returns the failed checks.
func (r Report) Failed() []Check {
	var out []Check
	for _, c := range r.Checks {
		if c.Verdict == Fail {
			out = append(out, c)
		}
	}
	return out
}

// Diagnosis is the failed checks as text, one per line, for a repair prompt.
func (r Report) Diagnosis() string {
	var b strings.Builder
	for _, c := range r.Failed() {
		fmt.Fprintf(&b, "%s: %s\n", c.Name, c.Msg)
	}
	return b.String()
}

func (r *Report) add(name, verdict, format string, args ...any) {
	r.Checks = append(r.Checks, Check{Name: name, Verdict: verdict, Msg: fmt.Sprintf(format, args...)})
}

// The names of the checks, in the order they run.
const (
	CheckLoad               = "load"
	CheckContract           = "contract"
	CheckDocstring          = "docstring"
	CheckTools              = "tools_match_target"
	CheckToolCount          = "tool_count"
	CheckResetDeterministic = "reset_deterministic"
	CheckDistinct           = "distinct_instances"
	CheckStepDeterministic  = "step_deterministic"
	CheckRandomPlay         = "random_play_runs"
	CheckRewardRange        = "reward_range"
	CheckDoNothing          = "do_nothing_scores_low"
	CheckReference          = "reference_scores_one"
	CheckHint               = "hint_is_guidance"
)

// NumChecks is the number of checks of a report of ValidateSource.
const NumChecks = 13

// ValidateOptions tune Validate; zero fields take the defaults in brackets.
type ValidateOptions struct {
	Seeds          int     // seeds 0..Seeds-1 every check plays [100]
	MinDistinct    float64 // share of seeds giving distinct instances [0.9]
	MaxTools       int     // [5]
	MaxDoNothing   float64 // the do-nothing policy's mean reward must be below it [0.2]
	RandomTurns    int     // turns of one random-play episode [8]
	MinSentences   int     // of the module docstring [3]
	MaxSentences   int     // [5]
	RandomPlaySeed uint64  // the random policy's own seed [1]
	// InProcess makes ValidateSource load the program with Load (trusted
	// programs: shipped examples, templates) instead of LoadSandboxed.
	InProcess bool
	// OnCheck, when set, is called with each check as soon as it has its
	// verdict, in the report's order: the progress of a validation, which
	// takes minutes on a slow program.
	OnCheck func(Check)
}

func (o ValidateOptions) withDefaults() ValidateOptions {
	if o.Seeds == 0 {
		o.Seeds = 100
	}
	if o.MinDistinct == 0 {
		o.MinDistinct = 0.9
	}
	if o.MaxTools == 0 {
		o.MaxTools = 5
	}
	if o.MaxDoNothing == 0 {
		o.MaxDoNothing = 0.2
	}
	if o.RandomTurns == 0 {
		o.RandomTurns = 8
	}
	if o.MinSentences == 0 {
		o.MinSentences = 3
	}
	if o.MaxSentences == 0 {
		o.MaxSentences = 5
	}
	if o.RandomPlaySeed == 0 {
		o.RandomPlaySeed = 1
	}
	return o
}

// ValidateSource loads src sandboxed (LoadSandboxed; Load with
// opts.InProcess), without a reset cache (see Validate), and validates it;
// a program that does not load fails the load check and skips the others.
// The Env is returned for further use when it loaded; the caller closes it.
func ValidateSource(ctx context.Context, name string, src []byte, target []schemas.Tool, lim Limits, opts ValidateOptions) (Report, Env, error) {
	lim.ResetCache = -1
	load := LoadSandboxed
	if opts.InProcess {
		load = Load
	}
	env, err := load(ctx, name, src, lim)
	var pe *ProgramError
	switch {
	case errors.As(err, &pe):
		r := Report{}
		r.add(CheckLoad, Fail, "%s does not load: %v", name, pe)
		if opts.OnCheck != nil {
			opts.OnCheck(r.Checks[0])
		}
		return r, nil, nil
	case err != nil:
		return Report{}, nil, err
	}
	loaded := Check{Name: CheckLoad, Verdict: Pass, Msg: name + " loads; its contract functions have the right parameters"}
	if opts.OnCheck != nil {
		opts.OnCheck(loaded)
	}
	r, err := Validate(ctx, env, target, opts)
	r.Checks = append([]Check{loaded}, r.Checks...)
	return r, env, err
}

// Validate runs every check on env. The error is non-nil only when ctx
// ended or the runtime failed; a program's failures are failed checks.
// Load env without a reset cache (Limits.ResetCache -1): the determinism
// checks reset seeds several times, and from a seed's third reset on a
// cache would answer with a copy of its second instead of running reset.
func Validate(ctx context.Context, env Env, target []schemas.Tool, opts ValidateOptions) (Report, error) {
	o := opts.withDefaults()
	v := &validator{env: env, info: env.Info(), o: o}
	var r Report
	told := 0 // checks given to o.OnCheck
	tell := func() {
		for ; o.OnCheck != nil && told < len(r.Checks); told++ {
			o.OnCheck(r.Checks[told])
		}
	}
	defer tell()

	if err := v.contract(ctx, &r); err != nil {
		return r, err
	}
	tell()
	contractOK := r.Checks[len(r.Checks)-1].Verdict == Pass
	v.docstring(&r)
	v.tools(&r, target)
	if len(v.info.Tools) > o.MaxTools {
		r.add(CheckToolCount, Fail, "%d tools (%s); at most %d", len(v.info.Tools), strings.Join(toolNames(v.info.Tools), ", "), o.MaxTools)
	} else {
		r.add(CheckToolCount, Pass, "%d tools, at most %d", len(v.info.Tools), o.MaxTools)
	}
	if !contractOK {
		for _, name := range []string{CheckResetDeterministic, CheckDistinct, CheckStepDeterministic, CheckRandomPlay, CheckRewardRange, CheckDoNothing, CheckReference, CheckHint} {
			r.add(name, Skip, "skipped: the contract check failed")
		}
		return r, nil
	}
	tell()
	for _, f := range []func(context.Context, *Report) error{v.resets, v.randomPlay, v.doNothing, v.reference, v.hints} {
		if err := f(ctx, &r); err != nil {
			return r, err
		}
		tell()
	}
	return r, nil
}

type validator struct {
	env  Env
	info Info
	o    ValidateOptions
}

// callerError separates the caller's errors (ctx) from the program's.
func callerError(err error) error {
	var pe *ProgramError
	if err == nil || errors.As(err, &pe) {
		return nil
	}
	return err
}

// failures collects per-seed failures of one check and words them.
type failures struct {
	n     int
	first []string
}

func (f *failures) add(format string, args ...any) {
	f.n++
	if len(f.first) < 5 {
		f.first = append(f.first, fmt.Sprintf(format, args...))
	}
}

func (f *failures) String() string {
	s := strings.Join(f.first, "; ")
	if f.n > len(f.first) {
		s += fmt.Sprintf("; and %d more", f.n-len(f.first))
	}
	return s
}

func (v *validator) contract(ctx context.Context, r *Report) error {
	const seed = 0
	fail := func(err error) error {
		if cerr := callerError(err); cerr != nil {
			return cerr
		}
		r.add(CheckContract, Fail, "seed %d: %v", seed, err)
		return nil
	}
	ep, err := v.env.Reset(ctx, seed)
	if err != nil {
		return fail(err)
	}
	defer ep.Close()
	if s := ep.Start(); strings.TrimSpace(s.System) == "" || strings.TrimSpace(s.User) == "" {
		r.add(CheckContract, Fail, "seed %d: reset returned an empty system prompt or user message (system %d bytes, user %d bytes)", seed, len(s.System), len(s.User))
		return nil
	}
	if v.info.HasHint {
		if _, err := ep.Hint(ctx); err != nil {
			return fail(err)
		}
	}
	if v.info.HasReference {
		if _, err := ep.Reference(ctx); err != nil {
			return fail(err)
		}
	}
	if _, err := ep.Step(ctx, Action{Content: "Done."}); err != nil {
		return fail(err)
	}
	r1, err := ep.Reward(ctx)
	if err != nil {
		return fail(err)
	}
	// reward (like hint and reference) gets the episode's state itself: it
	// must only read it, so a second call must agree with the first.
	r2, err := ep.Reward(ctx)
	if err != nil {
		return fail(err)
	}
	if r1.Value != r2.Value || components(r1) != components(r2) {
		r.add(CheckContract, Fail, "seed %d: reward changed the state: two calls on the same episode gave %v %s then %v %s (reward, hint and reference must only read the state)", seed, r1.Value, components(r1), r2.Value, components(r2))
		return nil
	}
	fns := "tools, reset, step, reward"
	if v.info.HasHint {
		fns += ", hint"
	}
	if v.info.HasReference {
		fns += ", reference"
	}
	r.add(CheckContract, Pass, "seed %d: %s return the contract's shapes", seed, fns)
	return nil
}

var sentenceEnd = regexp.MustCompile(`[.!?](\s|$)`)

func (v *validator) docstring(r *Report) {
	doc := strings.TrimSpace(v.info.Doc)
	if doc == "" {
		r.add(CheckDocstring, Fail, "no module docstring: the program must open with a 3–5 sentence string on why practising it transfers to the target")
		return
	}
	n := len(sentenceEnd.FindAllStringIndex(doc, -1))
	if !strings.ContainsAny(doc[len(doc)-1:], ".!?") {
		n++ // a last sentence without its full stop
	}
	if n < v.o.MinSentences || n > v.o.MaxSentences {
		r.add(CheckDocstring, Fail, "the module docstring has %d sentences, want %d–%d", n, v.o.MinSentences, v.o.MaxSentences)
		return
	}
	r.add(CheckDocstring, Pass, "the module docstring has %d sentences", n)
}

func toolNames(tools []schemas.Tool) []string {
	out := make([]string, len(tools))
	for i, t := range tools {
		out[i] = t.Function.Name
	}
	return out
}

// paramTypes maps each parameter of a tool to its JSON-schema type (and,
// for arrays, the type of their items: "array<object>").
func paramTypes(t schemas.Tool) (map[string]string, error) {
	out := map[string]string{}
	if len(t.Function.Parameters) == 0 {
		return out, nil
	}
	var params struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(t.Function.Parameters, &params); err != nil {
		return nil, err
	}
	for name, raw := range params.Properties {
		var p struct {
			Type  json.RawMessage `json:"type"`
			Items *struct {
				Type json.RawMessage `json:"type"`
			} `json:"items"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("parameter %s: %v", name, err)
		}
		typ := typeText(p.Type)
		if p.Items != nil && len(p.Items.Type) > 0 {
			typ += "<" + typeText(p.Items.Type) + ">"
		}
		out[name] = typ
	}
	return out, nil
}

// typeText is a schema's "type" as text: "string", or "integer|null" for a list.
func typeText(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "any"
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		sort.Strings(many)
		return strings.Join(many, "|")
	}
	return string(raw)
}

func (v *validator) tools(r *Report, target []schemas.Tool) {
	if len(target) == 0 {
		r.add(CheckTools, Skip, "no target tools given to compare with")
		return
	}
	byName := map[string]schemas.Tool{}
	for _, t := range target {
		byName[t.Function.Name] = t
	}
	var problems []string
	for _, t := range v.info.Tools {
		name := t.Function.Name
		tt, ok := byName[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("tool %s is not a tool of the target (its tools: %s)", name, strings.Join(toolNames(target), ", ")))
			continue
		}
		got, err := paramTypes(t)
		if err != nil {
			problems = append(problems, fmt.Sprintf("tool %s: its parameters: %v", name, err))
			continue
		}
		want, err := paramTypes(tt)
		if err != nil {
			problems = append(problems, fmt.Sprintf("tool %s: the target's parameters: %v", name, err))
			continue
		}
		for _, p := range sortedKeys(got) {
			if w, ok := want[p]; !ok {
				problems = append(problems, fmt.Sprintf("tool %s: parameter %s is not a parameter of the target's %s (its parameters: %s)", name, p, name, strings.Join(sortedKeys(want), ", ")))
			} else if w != got[p] {
				problems = append(problems, fmt.Sprintf("tool %s: parameter %s has type %s, the target's has %s", name, p, got[p], w))
			}
		}
		for _, p := range sortedKeys(want) {
			if _, ok := got[p]; !ok {
				problems = append(problems, fmt.Sprintf("tool %s: the target's parameter %s (%s) is missing", name, p, want[p]))
			}
		}
	}
	if len(problems) > 0 {
		r.add(CheckTools, Fail, "%s", strings.Join(problems, "; "))
		return
	}
	r.add(CheckTools, Pass, "tools %s are target tools with identical parameter names and types", strings.Join(toolNames(v.info.Tools), ", "))
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// instance is what a seed shows: its start and, when there is one, its
// reference solution (which reflects the hidden state).
func (v *validator) instance(ctx context.Context, seed int64) (string, error) {
	ep, err := v.env.Reset(ctx, seed)
	if err != nil {
		return "", err
	}
	defer ep.Close()
	b, _ := json.Marshal(ep.Start())
	if v.info.HasReference {
		ref, err := ep.Reference(ctx)
		if err != nil {
			return "", err
		}
		rb, _ := json.Marshal(ref)
		b = append(b, rb...)
	}
	return string(b), nil
}

func (v *validator) resets(ctx context.Context, r *Report) error {
	var nondet, errs failures
	// A hash of each instance, not its text: a start and a reference can
	// be large (one reference up to the 64 MiB of a call's answer), and
	// the program's worker makes each one and lets it go, where this map
	// would keep every seed's.
	seen := map[[sha256.Size]byte]int64{}
	for seed := int64(0); seed < int64(v.o.Seeds); seed++ {
		a, err := v.instance(ctx, seed)
		if err == nil {
			var b string
			if b, err = v.instance(ctx, seed); err == nil && a != b {
				nondet.add("seed %d gave %s then %s", seed, clip(a, 120), clip(b, 120))
			}
		}
		if err != nil {
			if cerr := callerError(err); cerr != nil {
				return cerr
			}
			errs.add("seed %d: %v", seed, summary(err))
			continue
		}
		h := sha256.Sum256([]byte(a))
		if _, dup := seen[h]; !dup {
			seen[h] = seed
		}
	}
	what := "start"
	if v.info.HasReference {
		what = "start and reference solution"
	}
	switch {
	case errs.n > 0:
		r.add(CheckResetDeterministic, Fail, "reset failed on %d of %d seeds: %s", errs.n, v.o.Seeds, &errs)
	case nondet.n > 0:
		r.add(CheckResetDeterministic, Fail, "%d of %d seeds gave a different %s on a second reset: %s", nondet.n, v.o.Seeds, what, &nondet)
	default:
		r.add(CheckResetDeterministic, Pass, "each of %d seeds gave the same %s twice", v.o.Seeds, what)
	}
	share := float64(len(seen)) / float64(v.o.Seeds)
	if share < v.o.MinDistinct {
		r.add(CheckDistinct, Fail, "%d of %d seeds (%.0f%%) gave distinct instances (%s), want at least %.0f%%", len(seen), v.o.Seeds, 100*share, what, 100*v.o.MinDistinct)
	} else {
		r.add(CheckDistinct, Pass, "%d of %d seeds (%.0f%%) gave distinct instances", len(seen), v.o.Seeds, 100*share)
	}
	return nil
}

// played is one episode of random play.
type played struct {
	transcript string
	reward     Reward
	err        error
}

func (v *validator) randomPlay(ctx context.Context, r *Report) error {
	var nondet, errs, outside failures
	var lo, hi = math.Inf(1), math.Inf(-1)
	n := 0
	for seed := int64(0); seed < int64(v.o.Seeds); seed++ {
		a, err := v.playRandom(ctx, seed)
		if err != nil {
			return err
		}
		b, err := v.playRandom(ctx, seed)
		if err != nil {
			return err
		}
		if a.transcript != b.transcript || a.reward.Value != b.reward.Value || (a.err == nil) != (b.err == nil) {
			nondet.add("seed %d: the same calls gave reward %v then %v", seed, a.reward.Value, b.reward.Value)
		}
		var pe *ProgramError
		switch {
		case errors.As(a.err, &pe) && pe.Func == "reward" && strings.Contains(pe.Msg, "outside [0, 1]"):
			outside.add("seed %d: reward %v", seed, a.reward.Value)
		case a.err != nil:
			errs.add("seed %d: %v", seed, summary(a.err))
		default:
			n++
			lo, hi = math.Min(lo, a.reward.Value), math.Max(hi, a.reward.Value)
		}
	}
	if nondet.n > 0 {
		r.add(CheckStepDeterministic, Fail, "%d of %d seeds played twice with the same calls differed: %s", nondet.n, v.o.Seeds, &nondet)
	} else {
		r.add(CheckStepDeterministic, Pass, "%d seeds played twice with the same random calls gave the same transcripts and rewards", v.o.Seeds)
	}
	if errs.n > 0 {
		r.add(CheckRandomPlay, Fail, "the program failed on %d of %d random-play episodes: %s", errs.n, v.o.Seeds, &errs)
	} else {
		r.add(CheckRandomPlay, Pass, "%d random-play episodes (type-correct random calls, up to %d turns) ran without a program error", v.o.Seeds, v.o.RandomTurns)
	}
	switch {
	case outside.n > 0:
		r.add(CheckRewardRange, Fail, "%d of %d random-play rewards are outside [0, 1]: %s", outside.n, v.o.Seeds, &outside)
	case n == 0:
		r.add(CheckRewardRange, Fail, "no random-play episode produced a reward")
	default:
		r.add(CheckRewardRange, Pass, "%d random-play rewards are within [0, 1] (min %.3g, max %.3g)", n, lo, hi)
	}
	return nil
}

// playRandom plays seed with type-correct random tool calls; its
// randomness depends only on the seed, so replaying it repeats the calls.
func (v *validator) playRandom(ctx context.Context, seed int64) (played, error) {
	rng := rand.New(rand.NewPCG(uint64(seed), v.o.RandomPlaySeed))
	ep, err := v.env.Reset(ctx, seed)
	if err != nil {
		return played{err: err}, callerError(err)
	}
	defer ep.Close()
	words := harvest(nil, ep.Start().User)
	var out played
	for turn := 0; turn < v.o.RandomTurns; turn++ {
		var a Action
		if rng.IntN(8) == 0 || turn == v.o.RandomTurns-1 {
			a.Content = randomAnswers[rng.IntN(len(randomAnswers))]
		} else {
			for i := 0; i < 1+rng.IntN(2); i++ {
				t := v.info.Tools[rng.IntN(len(v.info.Tools))]
				args := randomArgs(rng, t, words)
				b, _ := json.Marshal(args)
				a.ToolCalls = append(a.ToolCalls, ToolCall{Name: t.Function.Name, Arguments: b})
			}
		}
		res, err := ep.Step(ctx, a)
		if err != nil {
			out.err = err
			return out, callerError(err)
		}
		for _, m := range res.ToolResults {
			words = harvest(words, m.Content)
		}
		if res.Done {
			break
		}
	}
	b, _ := json.Marshal(ep.Messages())
	out.transcript = string(b)
	out.reward, out.err = ep.Reward(ctx)
	return out, callerError(out.err)
}

var randomAnswers = []string{"", "Done.", "I have completed your request.", "Sorry, I cannot help with that."}

var wordRE = regexp.MustCompile(`[A-Za-z0-9_\-]{3,40}`)

// harvest adds the identifier-like words of s (ids, codes, names) to
// words, so random calls sometimes name things that exist.
func harvest(words []string, s string) []string {
	for _, w := range wordRE.FindAllString(s, 200) {
		if !slices.Contains(words, w) {
			words = append(words, w)
		}
	}
	return words
}

func randomArgs(rng *rand.Rand, t schemas.Tool, words []string) map[string]any {
	var params struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	_ = json.Unmarshal(t.Function.Parameters, &params)
	out := map[string]any{}
	for _, name := range sortedKeys(params.Properties) {
		if !slices.Contains(params.Required, name) && rng.IntN(2) == 0 {
			continue
		}
		out[name] = randomValue(rng, params.Properties[name], words, 0)
	}
	return out
}

func randomValue(rng *rand.Rand, schema json.RawMessage, words []string, depth int) any {
	var s struct {
		Type       json.RawMessage            `json:"type"`
		Enum       []any                      `json:"enum"`
		Items      json.RawMessage            `json:"items"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	_ = json.Unmarshal(schema, &s)
	if len(s.Enum) > 0 {
		return s.Enum[rng.IntN(len(s.Enum))]
	}
	typ := strings.Split(typeText(s.Type), "|")[0]
	switch typ {
	case "integer":
		return rng.IntN(6)
	case "number":
		return float64(rng.IntN(50000)) / 100
	case "boolean":
		return rng.IntN(2) == 0
	case "array":
		if depth > 3 {
			return []any{}
		}
		n := rng.IntN(3)
		items := make([]any, n)
		for i := range items {
			items[i] = randomValue(rng, s.Items, words, depth+1)
		}
		return items
	case "object":
		if depth > 3 {
			return map[string]any{}
		}
		obj := map[string]any{}
		for _, k := range sortedKeys(s.Properties) {
			obj[k] = randomValue(rng, s.Properties[k], words, depth+1)
		}
		return obj
	default: // string, or untyped
		if len(words) > 0 && rng.IntN(3) > 0 {
			return words[rng.IntN(len(words))]
		}
		const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
		b := make([]byte, 6)
		for i := range b {
			b[i] = letters[rng.IntN(len(letters))]
		}
		return string(b)
	}
}

func (v *validator) doNothing(ctx context.Context, r *Report) error {
	var sum float64
	var errs failures
	n := 0
	for seed := int64(0); seed < int64(v.o.Seeds); seed++ {
		rw, err := v.playActions(ctx, seed, func(Episode) ([]Action, error) { return []Action{{Content: ""}}, nil })
		if err != nil {
			if cerr := callerError(err); cerr != nil {
				return cerr
			}
			errs.add("seed %d: %v", seed, summary(err))
			continue
		}
		sum += rw.Value
		n++
	}
	if errs.n > 0 {
		r.add(CheckDoNothing, Fail, "the do-nothing policy (an empty final answer at once) failed on %d seeds: %s", errs.n, &errs)
		return nil
	}
	mean := sum / float64(n)
	if mean >= v.o.MaxDoNothing {
		r.add(CheckDoNothing, Fail, "the do-nothing policy (an empty final answer at once) scores a mean %.3f over %d seeds, want below %.2f", mean, n, v.o.MaxDoNothing)
	} else {
		r.add(CheckDoNothing, Pass, "the do-nothing policy scores a mean %.3f over %d seeds (below %.2f)", mean, n, v.o.MaxDoNothing)
	}
	return nil
}

// playActions plays the actions acts gives for a fresh episode of seed
// until done, and returns the reward.
func (v *validator) playActions(ctx context.Context, seed int64, acts func(Episode) ([]Action, error)) (Reward, error) {
	ep, err := v.env.Reset(ctx, seed)
	if err != nil {
		return Reward{}, err
	}
	defer ep.Close()
	list, err := acts(ep)
	if err != nil {
		return Reward{}, err
	}
	for _, a := range list {
		res, err := ep.Step(ctx, a)
		if err != nil {
			return Reward{}, err
		}
		if res.Done {
			break
		}
	}
	return ep.Reward(ctx)
}

func (v *validator) reference(ctx context.Context, r *Report) error {
	if !v.info.HasReference {
		r.add(CheckReference, Skip, "the program has no reference()")
		return nil
	}
	var bad failures
	for seed := int64(0); seed < int64(v.o.Seeds); seed++ {
		rw, err := v.playActions(ctx, seed, func(ep Episode) ([]Action, error) { return ep.Reference(ctx) })
		if err != nil {
			if cerr := callerError(err); cerr != nil {
				return cerr
			}
			bad.add("seed %d: %v", seed, summary(err))
			continue
		}
		if rw.Value != 1 {
			bad.add("seed %d: reward %v %s", seed, rw.Value, components(rw))
		}
	}
	if bad.n > 0 {
		r.add(CheckReference, Fail, "the reference solution scored below 1.0 on %d of %d seeds: %s", bad.n, v.o.Seeds, &bad)
	} else {
		r.add(CheckReference, Pass, "the reference solution scored 1.0 on all %d seeds", v.o.Seeds)
	}
	return nil
}

func components(rw Reward) string {
	if len(rw.Components) == 0 {
		return ""
	}
	parts := make([]string, 0, len(rw.Components))
	for _, k := range sortedKeys(rw.Components) {
		parts = append(parts, fmt.Sprintf("%s=%v", k, rw.Components[k]))
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

func (v *validator) hints(ctx context.Context, r *Report) error {
	if !v.info.HasHint {
		r.add(CheckHint, Skip, "the program has no hint()")
		return nil
	}
	var bad failures
	for seed := int64(0); seed < int64(v.o.Seeds); seed++ {
		ep, err := v.env.Reset(ctx, seed)
		if err != nil {
			if cerr := callerError(err); cerr != nil {
				return cerr
			}
			bad.add("seed %d: %v", seed, summary(err))
			continue
		}
		h, err := ep.Hint(ctx)
		ep.Close()
		if err != nil {
			if cerr := callerError(err); cerr != nil {
				return cerr
			}
			bad.add("seed %d: %v", seed, summary(err))
			continue
		}
		if strings.TrimSpace(h) == "" {
			bad.add("seed %d: the hint is empty", seed)
			continue
		}
		if strings.Contains(h, HintOpen) || strings.Contains(h, HintClose) {
			bad.add("seed %d: the hint contains the %s tags itself", seed, HintOpen)
		}
		for _, t := range v.info.Tools {
			name := t.Function.Name
			if strings.Contains(h, name+"(") || strings.Contains(h, `"name": "`+name+`"`) || strings.Contains(h, `"name":"`+name+`"`) {
				bad.add("seed %d: the hint spells out a call of %s (%q); hints are soft guidance, never literal tool calls", seed, name, clip(h, 120))
				break
			}
		}
	}
	if bad.n > 0 {
		r.add(CheckHint, Fail, "%d of %d hints are not usable guidance: %s", bad.n, v.o.Seeds, &bad)
	} else {
		r.add(CheckHint, Pass, "hints of all %d seeds are non-empty guidance without literal tool calls", v.o.Seeds)
	}
	return nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// summary is an error in one line: for a program's error its function,
// limit, innermost frame and message ("step(): p.star:20:24: in step:
// floored division by zero").
func summary(err error) string {
	var pe *ProgramError
	if !errors.As(err, &pe) {
		return err.Error()
	}
	s := pe.Func + "(): "
	if pe.Func == "" {
		s = "top level: "
	}
	if pe.Limit != "" {
		s += pe.Limit + " limit: "
	}
	lines := strings.Split(strings.TrimSpace(pe.Msg), "\n")
	last := lines[len(lines)-1]
	frame := ""
	for _, l := range lines {
		if strings.HasPrefix(l, "  ") {
			frame = strings.TrimSpace(l) + ": "
		}
	}
	if pe.Limit != "" {
		return s + frame + lines[0]
	}
	return s + frame + strings.TrimPrefix(last, "Error: ")
}

// String renders the report one check per line: "PASS name: message".
func (r Report) String() string {
	var b strings.Builder
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "%-4s %s: %s\n", strings.ToUpper(c.Verdict), c.Name, c.Msg)
	}
	return b.String()
}
