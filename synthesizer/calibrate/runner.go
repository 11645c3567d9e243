package calibrate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/envprog"
)

// Policy chooses the assistant turns of rollouts. One Policy plays every
// rollout of a run, from several goroutines at once: it must be safe for
// concurrent use. Act returns the next turn of the rollout t describes
// (tool calls, or a final answer without them); when ctx ends it returns
// promptly with an error. An error aborts the calibration: a calibration
// whose policy could not answer is no calibration.
type Policy interface {
	Act(ctx context.Context, t Turn) (envprog.Action, error)
}

// Turn is what a policy sees before one assistant turn.
type Turn struct {
	Seed    int64
	Rollout int // the rollout's index in its seed's group
	Index   int // 0-based assistant turn of the rollout
	// Hinted is true when the system prompt carries the hint block.
	Hinted bool
	// Messages is the transcript so far: the system prompt (with the hint
	// block appended on hinted rollouts), the user's opening message, then
	// each assistant turn and its tool results.
	Messages []envprog.Message
	// Tools are the environment's tools (OpenAI function schemas).
	Tools []schemas.Tool
	// Temperature is the sampling temperature of the run (model policies).
	Temperature float64
	// Reference returns the environment's scripted solution of this
	// instance, computed once per rollout (nil without reference()). Only
	// scripted and simulated policies use it; a model policy must not.
	Reference func(ctx context.Context) ([]envprog.Action, error)
}

// PolicyFunc adapts a function to Policy.
type PolicyFunc func(ctx context.Context, t Turn) (envprog.Action, error)

// Act calls f.
func (f PolicyFunc) Act(ctx context.Context, t Turn) (envprog.Action, error) { return f(ctx, t) }

// simulatedPolicy is implemented by policies that are not a model.
type simulatedPolicy interface{ Simulated() bool }

// Progress is reported after each finished rollout.
type Progress struct {
	Done, Total int
}

// Config sets a calibration run. Start from DefaultConfig: every field is
// explicit (a zero temperature is greedy decoding, a zero hint share means
// no hints) and Validate rejects what cannot run.
type Config struct {
	// Seeds is the number of seeds, FirstSeed..FirstSeed+Seeds-1.
	Seeds     int   `json:"seeds" yaml:"seeds"`
	FirstSeed int64 `json:"first_seed" yaml:"first_seed"`
	// Rollouts is the group size: rollouts per seed.
	Rollouts int `json:"rollouts" yaml:"rollouts"`
	// Temperature is passed to the policy.
	Temperature float64 `json:"temperature" yaml:"temperature"`
	// Concurrency bounds the rollouts played at once.
	Concurrency int `json:"concurrency" yaml:"concurrency"`
	// HintShareMin and HintShareMax bound the share of each group's
	// rollouts that get the hint: per seed a share is drawn uniformly in
	// [min, max] (deterministically from the seed), and ceil(share ×
	// Rollouts) rollouts, chosen deterministically, are hinted. An
	// environment without hint() gets no hinted rollouts.
	HintShareMin float64 `json:"hint_share_min" yaml:"hint_share_min"`
	HintShareMax float64 `json:"hint_share_max" yaml:"hint_share_max"`
	// MaxTurns stops a rollout whose episode is still not done after that
	// many turns with an error (the runtime's own MaxTurns normally ends
	// episodes long before; this guards against a broken Env).
	MaxTurns int `json:"max_turns" yaml:"max_turns"`
	// Bands are the acceptance bands of the summary.
	Bands Bands `json:"bands" yaml:"bands"`
	// Progress, when set, is called after each finished rollout, never
	// concurrently.
	Progress func(Progress) `json:"-" yaml:"-"`
}

// DefaultConfig is the release's calibration: 100 seeds × 16 rollouts at
// temperature 0.7, hints on 25–50 % of each group, the default bands; 4
// rollouts at a time.
func DefaultConfig() Config {
	return Config{
		Seeds: 100, Rollouts: 16, Temperature: 0.7, Concurrency: 4,
		HintShareMin: 0.25, HintShareMax: 0.5,
		MaxTurns: 256,
		Bands:    DefaultBands(),
	}
}

// Validate reports the first bad field by its key ("calibration: seeds =
// 0, …"; a band's: "calibration: bands.mean_min = …").
func (c Config) Validate() error {
	if err := c.Check(func(key string) string { return key }); err != nil {
		return fmt.Errorf("calibration: %w", err)
	}
	return nil
}

// Check is Validate with each field named by name(key), key being its
// JSON name ("seeds", "hint_share_min", a band's "bands.mean_min"): trace
// env calibrate names its flags.
func (c Config) Check(name func(key string) string) error {
	switch {
	case c.Seeds < 1:
		return fmt.Errorf("%s = %d, want at least 1", name("seeds"), c.Seeds)
	case c.Rollouts < 1:
		return fmt.Errorf("%s = %d, want at least 1", name("rollouts"), c.Rollouts)
	case !(c.Temperature >= 0 && c.Temperature <= 2):
		return fmt.Errorf("%s = %v, want a value in [0, 2]", name("temperature"), c.Temperature)
	case c.Concurrency < 1:
		return fmt.Errorf("%s = %d, want at least 1", name("concurrency"), c.Concurrency)
	case !(c.HintShareMin >= 0 && c.HintShareMin <= 1):
		return fmt.Errorf("%s = %v, want a share in [0, 1]", name("hint_share_min"), c.HintShareMin)
	case !(c.HintShareMax >= 0 && c.HintShareMax <= 1):
		return fmt.Errorf("%s = %v, want a share in [0, 1]", name("hint_share_max"), c.HintShareMax)
	case c.HintShareMin > c.HintShareMax:
		return fmt.Errorf("%s = %v is above %s = %v", name("hint_share_min"), c.HintShareMin, name("hint_share_max"), c.HintShareMax)
	case c.MaxTurns < 1:
		return fmt.Errorf("%s = %d, want at least 1", name("max_turns"), c.MaxTurns)
	}
	return c.Bands.check(func(key string) string { return name("bands." + key) })
}

// RolloutResult is one played rollout.
type RolloutResult struct {
	Seed       int64              `json:"seed"`
	Rollout    int                `json:"rollout"`
	Hinted     bool               `json:"hinted"`
	Reward     float64            `json:"reward"`
	Components map[string]float64 `json:"components,omitempty"`
	Turns      int                `json:"turns"`
}

// Result is a calibration: every rollout, per seed, and the summary.
type Result struct {
	Summary Summary `json:"summary"`
	Groups  []Group `json:"groups"`
	// Rollouts[i] are the rollouts of Groups[i], in rollout order.
	Rollouts [][]RolloutResult `json:"rollouts"`
}

// RolloutError is the error of one rollout that aborted a run.
type RolloutError struct {
	Seed    int64
	Rollout int
	Err     error
}

func (e *RolloutError) Error() string {
	return fmt.Sprintf("calibration: seed %d rollout %d: %v", e.Seed, e.Rollout, e.Err)
}

func (e *RolloutError) Unwrap() error { return e.Err }

// HintedRollouts returns which of a seed's n rollouts are hinted: a share
// drawn uniformly in [lo, hi] from the seed, ceil(share × n) of them, at
// positions drawn from the seed too. The same arguments always give the
// same answer.
func HintedRollouts(seed int64, n int, lo, hi float64) []bool {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x68696e7473)) // "hints"
	share := lo + (hi-lo)*rng.Float64()
	k := min(int(math.Ceil(share*float64(n)-1e-9)), n)
	out := make([]bool, n)
	for _, i := range rng.Perm(n)[:k] {
		out[i] = true
	}
	return out
}

// Run plays cfg.Seeds × cfg.Rollouts rollouts of env with policy and
// summarizes them. The first error (of the environment program, of the
// policy, or ctx's) stops every rollout and is returned, as a
// *RolloutError naming the seed and rollout when one rollout caused it;
// an *envprog.ProgramError inside it is the program's fault.
func Run(ctx context.Context, env envprog.Env, policy Policy, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	info := env.Info()
	total := cfg.Seeds * cfg.Rollouts
	res := &Result{Groups: make([]Group, cfg.Seeds), Rollouts: make([][]RolloutResult, cfg.Seeds)}
	for i := range res.Groups {
		seed := cfg.FirstSeed + int64(i)
		hinted := make([]bool, cfg.Rollouts)
		if info.HasHint {
			hinted = HintedRollouts(seed, cfg.Rollouts, cfg.HintShareMin, cfg.HintShareMax)
		}
		res.Groups[i] = Group{Seed: seed, Rewards: make([]float64, cfg.Rollouts), Hinted: hinted}
		res.Rollouts[i] = make([]RolloutResult, cfg.Rollouts)
	}

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(cfg.Concurrency)
	var mu sync.Mutex
	done := 0
	for i := 0; i < total && gctx.Err() == nil; i++ {
		si, ri := i/cfg.Rollouts, i%cfg.Rollouts
		seed := res.Groups[si].Seed
		g.Go(func() error {
			r, err := playRollout(gctx, env, info.Tools, policy, cfg, seed, ri, res.Groups[si].Hinted[ri])
			if err != nil {
				return &RolloutError{Seed: seed, Rollout: ri, Err: err}
			}
			res.Rollouts[si][ri] = r
			res.Groups[si].Rewards[ri] = r.Reward
			res.Groups[si].Hinted[ri] = r.Hinted
			if cfg.Progress != nil {
				mu.Lock()
				done++
				cfg.Progress(Progress{Done: done, Total: total})
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("calibration: %w", context.Cause(ctx))
	}
	s, err := Summarize(res.Groups, cfg.Bands)
	if err != nil {
		return nil, err
	}
	s.Policy = policyName(policy)
	if sp, ok := policy.(simulatedPolicy); ok && sp.Simulated() {
		s.Simulated = true
	}
	res.Summary = s
	return res, nil
}

func policyName(p Policy) string {
	if s, ok := p.(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprintf("%T", p)
}

// playRollout plays one rollout to its end and scores it.
func playRollout(ctx context.Context, env envprog.Env, tools []schemas.Tool, policy Policy, cfg Config,
	seed int64, rollout int, hinted bool) (RolloutResult, error) {
	ep, err := env.Reset(ctx, seed)
	if err != nil {
		return RolloutResult{}, err
	}
	defer ep.Close()
	system := ep.Start().System
	if hinted {
		hint, err := ep.Hint(ctx)
		if err != nil {
			return RolloutResult{}, err
		}
		if hint == "" {
			hinted = false // this instance has no hint: the rollout is unhinted
		} else {
			system = WithHint(system, hint)
		}
	}
	var (
		refOnce sync.Once
		ref     []envprog.Action
		refErr  error
	)
	reference := func(ctx context.Context) ([]envprog.Action, error) {
		refOnce.Do(func() { ref, refErr = ep.Reference(ctx) })
		return ref, refErr
	}
	out := RolloutResult{Seed: seed, Rollout: rollout, Hinted: hinted}
	for {
		if out.Turns >= cfg.MaxTurns {
			return RolloutResult{}, fmt.Errorf("episode still not done after %d turns", out.Turns)
		}
		msgs := ep.Messages()
		if hinted && len(msgs) > 0 && msgs[0].Role == "system" {
			msgs = append([]envprog.Message(nil), msgs...)
			msgs[0].Content = system
		}
		a, err := policy.Act(ctx, Turn{
			Seed: seed, Rollout: rollout, Index: out.Turns, Hinted: hinted,
			Messages: msgs, Tools: tools, Temperature: cfg.Temperature, Reference: reference,
		})
		if err != nil {
			return RolloutResult{}, fmt.Errorf("policy, turn %d: %w", out.Turns, err)
		}
		st, err := ep.Step(ctx, a)
		out.Turns++
		if errors.Is(err, envprog.ErrDone) {
			break
		}
		if err != nil {
			return RolloutResult{}, err
		}
		if st.Done {
			break
		}
	}
	rw, err := ep.Reward(ctx)
	if err != nil {
		return RolloutResult{}, err
	}
	out.Reward, out.Components = rw.Value, rw.Components
	return out, nil
}
