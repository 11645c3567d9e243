package synthesizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/calibrate"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/templates"
)

// The stage's adapters to the runtime (envprog), the calibration
// (calibrate) and the built-in templates (templates).

// EnvValidator runs envprog's validation checks: programs written by a
// model sandboxed (a worker process with an address-space limit), trusted
// template programs in-process.
type EnvValidator struct {
	Limits  envprog.Limits
	Options envprog.ValidateOptions
}

// Validate implements Validator.
func (v EnvValidator) Validate(ctx context.Context, d Draft, target []schemas.Tool) (*Validation, error) {
	name := programName(d)
	opts := v.Options
	opts.InProcess = d.Trusted
	rep, env, err := envprog.ValidateSource(ctx, name, []byte(d.Program), target, v.Limits, opts)
	if env != nil {
		defer env.Close()
	}
	if err != nil {
		return nil, err
	}
	out := &Validation{OK: rep.OK()}
	for _, c := range rep.Checks {
		out.Checks = append(out.Checks, Check{Name: c.Name, Verdict: c.Verdict, Message: c.Msg})
	}
	if env != nil {
		info := env.Info()
		out.Rationale, out.HasHint, out.HasReference = info.Doc, info.HasHint, info.HasReference
		for _, t := range info.Tools {
			out.Tools = append(out.Tools, t.Function.Name)
		}
	}
	return out, nil
}

// PolicyCalibrator calibrates a valid program with a policy (calibrate.Run).
// A program error during play is the program's failure (a rejected
// calibration with the error as diagnosis). So is a request the policy
// model refuses with a 4xx other than 401, 403, 404 and 429 (verdict
// VerdictPolicyRefused): retrying the same program replays the same
// episodes into the same refusal (a conversation longer than the model's
// context, a tool schema it does not take), so it is the attempt's
// failure, with the refusal in the repair prompt, as a refused generation
// request is. Any other policy error is transient; a policy that refuses
// trace itself (401, 403, 404) is returned as is (RefusesTrace).
type PolicyCalibrator struct {
	Policy calibrate.Policy
	Config calibrate.Config // start from calibrate.DefaultConfig
	Limits envprog.Limits
}

// DefaultProgressEvery is Config.ProgressEvery's default: how often a
// running calibration's progress is saved and logged.
const DefaultProgressEvery = 30 * time.Second

// VerdictProgramError is the Calibration.Verdict of a program that failed
// while it was played.
const VerdictProgramError = "program_error"

// VerdictPolicyRefused is the Calibration.Verdict of a program whose play
// the policy model refused (a 4xx answer that is not retried and does not
// refuse trace itself).
const VerdictPolicyRefused = "policy_refused"

// Calibrate implements Calibrator.
func (c PolicyCalibrator) Calibrate(ctx context.Context, d Draft, progress func(done, total int)) (*Calibration, error) {
	name := programName(d)
	var (
		env envprog.Env
		err error
	)
	if d.Trusted {
		env, err = envprog.Load(ctx, name, []byte(d.Program), c.Limits)
	} else {
		env, err = envprog.LoadSandboxed(ctx, name, []byte(d.Program), c.Limits)
	}
	cfg := c.Config
	if len(d.HintShare) == 2 {
		cfg.HintShareMin, cfg.HintShareMax = d.HintShare[0], d.HintShare[1]
	}
	programFailed := func(err error) *Calibration {
		cal := &Calibration{Verdict: VerdictProgramError, Diagnosis: "the program failed while it was played: " + err.Error(),
			Seeds: cfg.Seeds, RolloutsPerSeed: cfg.Rollouts, Temperature: cfg.Temperature, Policy: fmt.Sprint(c.Policy)}
		if sp, ok := c.Policy.(interface{ Simulated() bool }); ok {
			cal.Simulated = sp.Simulated()
		}
		return cal
	}
	var pe *envprog.ProgramError
	if errors.As(err, &pe) {
		return programFailed(err), nil
	}
	if err != nil {
		return nil, err
	}
	defer env.Close()
	if progress != nil {
		cfg.Progress = func(p calibrate.Progress) { progress(p.Done, p.Total) }
	}
	res, err := calibrate.Run(ctx, env, c.Policy, cfg)
	if errors.As(err, &pe) {
		return programFailed(err), nil
	}
	var le *llm.Error
	if errors.As(err, &le) && !le.Retryable && !RefusesTrace(err) && ctx.Err() == nil {
		cal := programFailed(err)
		cal.Verdict = VerdictPolicyRefused
		cal.Diagnosis = "the calibration policy refused a request while playing the program (an episode longer than its context? " +
			"keep the prompts and tool results short): " + err.Error()
		return cal, nil
	}
	if err != nil {
		return nil, err
	}
	return FromSummary(res.Summary, cfg), nil
}

// FromSummary is a calibrate.Summary as the stage records it.
func FromSummary(s calibrate.Summary, cfg calibrate.Config) *Calibration {
	c := &Calibration{
		Accepted: s.Accepted, Verdict: s.Verdict, Diagnosis: s.Diagnosis, Policy: s.Policy, Simulated: s.Simulated,
		Seeds: s.Seeds, RolloutsPerSeed: s.Rollouts / max(s.Seeds, 1), Temperature: cfg.Temperature,
		MeanReward: s.Mean, StdReward: s.Std, SuccessRate: s.SuccessRate,
		AllSuccessGroups: s.AllSuccess, AllZeroGroups: s.AllZero, ConstantGroups: s.Constant, InformativeGroups: s.Informative,
		PassAtK: map[string]float64{}, Histogram: append([]int(nil), s.Histogram[:]...),
	}
	for _, p := range s.PassAt {
		c.PassAtK[strconv.Itoa(p.K)] = p.Rate
	}
	return c
}

func programName(d Draft) string {
	if d.Name != "" {
		return d.Name
	}
	return "program.star"
}

// TemplateAuthor writes the template path's programs: attempt 1 is the
// family's template at its default knobs, instantiated for the target's
// tools; after a calibration miss the next attempt moves the knobs the way
// templates.Tune does (too easy: one rung up the family's ladder, at the
// top fewer hints; too hard: one rung down, at the bottom more hints). A
// target that lacks a tool the family needs is a final failure (the
// environment then waits for a generation model).
type TemplateAuthor struct {
	// Bands are the calibration bands (to tell "rather easy" from "rather
	// hard" when the verdict is neither).
	Bands calibrate.Bands
}

// Write implements Author.
func (a TemplateAuthor) Write(_ context.Context, job *Job, n, _ int, prior []Attempt) (Draft, error) {
	d := Draft{Origin: schemas.OriginTemplate, Family: job.Family, Trusted: true}
	f, ok := templates.Lookup(job.Family)
	if !ok {
		return d, &WriteError{Reason: fmt.Sprintf("no built-in template of family %q", job.Family), Final: true}
	}
	knobs := f.DefaultKnobs()
	tried := map[templates.Knobs]bool{}
	var last *Attempt
	for i := range prior {
		var k templates.Knobs
		if json.Unmarshal(prior[i].Knobs, &k) == nil && k != (templates.Knobs{}) {
			tried[k] = true
			if prior[i].Calibration != nil {
				last = &prior[i]
				knobs = nextKnobs(f, k, prior[i].Calibration, a.Bands)
			}
		}
	}
	if tried[knobs] && last != nil {
		// As templates.Tune: going back to a tried setting means the bands
		// lie between two rungs of the ladder; no further attempt helps.
		return d, &WriteError{Reason: fmt.Sprintf("no knob setting of %s fits the bands: after %s the next setting (%s) was tried already", job.Family, last.Diagnosis, knobs)}
	}
	tpl, err := templates.Instantiate(job.Family, job.Request.Tools, knobs)
	var re *templates.RoleError
	if errors.As(err, &re) {
		return d, &WriteError{Reason: err.Error(), Final: true}
	}
	if err != nil {
		return d, &WriteError{Reason: err.Error(), Final: true}
	}
	kj, _ := json.Marshal(tpl.Knobs)
	d.Program, d.Name, d.Knobs = string(tpl.Program), tpl.Name, kj
	d.HintShare = []float64{tpl.Knobs.HintShareMin, tpl.Knobs.HintShareMax}
	return d, nil
}

// nextKnobs is templates.Tune's step from knobs k after calibration c.
func nextKnobs(f templates.Family, k templates.Knobs, c *Calibration, bands calibrate.Bands) templates.Knobs {
	level := 0
	for i, l := range f.Ladder {
		if l.Records == k.Records && l.Steps == k.Steps && l.Distractors == k.Distractors {
			level = i
		}
	}
	hints := [2]float64{k.HintShareMin, k.HintShareMax}
	harder := c != nil && (c.Verdict == calibrate.TooEasy ||
		(c.Verdict != calibrate.TooHard && c.MeanReward > (bands.MeanMin+bands.MeanMax)/2))
	switch {
	case harder && level < len(f.Ladder)-1:
		level++
	case harder:
		hints = [2]float64{max(hints[0]-0.1, 0), max(hints[1]-0.15, 0.1)}
	case level > 0:
		level--
	default:
		hints = [2]float64{min(hints[0]+0.15, 0.5), min(hints[1]+0.15, 0.65)}
	}
	out := f.Ladder[level]
	out.HintShareMin, out.HintShareMax = hints[0], hints[1]
	return out
}

// TemplateFamilies is the FamilyMatcher of the built-in templates.
type TemplateFamilies struct{}

// Match implements FamilyMatcher with templates.Match.
func (TemplateFamilies) Match(name, definition string) (string, string, bool) {
	f, _, why := templates.Match(name, definition)
	return f, why, f != ""
}

// Known implements FamilyMatcher.
func (TemplateFamilies) Known(family string) bool {
	_, ok := templates.Lookup(family)
	return ok
}
