package verify

import (
	"cmp"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/traceops/trace/analyzer"
)

// Verdict is what the closed loop concludes about an adapter.
type Verdict string

// The verdicts, in the order they are decided.
const (
	// NotEnoughData: fewer routed failures that need the capability (or
	// such failures before activation) than Config.MinFailures; nothing
	// else is concluded.
	NotEnoughData Verdict = "not_enough_data"
	// Worse: the pass rate is significantly lower after activation, or Δ
	// significantly higher (the 95 % interval of the change excludes 0).
	// The guard rolls the adapter back when its sequential test
	// (GuardDecision) agrees.
	Worse Verdict = "worse"
	// GapClosed: Δ on the routed rollouts is below δ, the selection's
	// threshold, with its whole 95 % interval: the capability would no
	// longer be selected on them, and not by the luck of a small sample.
	GapClosed Verdict = "gap_closed"
	// Improved: Δ significantly lower or the pass rate significantly
	// higher, but Δ (or its interval's upper end) is still at least δ.
	Improved Verdict = "improved"
	// NoChange: none of the above.
	NoChange Verdict = "no_change"
)

// Config configures the closed loop (koanf prefix verify.).
type Config struct {
	// Delta is δ: "gap closed" means Δ after activation below it. Default
	// the selection's δ: analyzer.delta in trace's configuration (0.20
	// unless set), DefaultThresholds' 0.20 here.
	Delta float64 `koanf:"delta" json:"delta"`
	// MinFailures is the fewest labeled failures that need the capability
	// (Stats.NeededFailures) each side needs before a verdict other than
	// not_enough_data (default 20).
	MinFailures int `koanf:"min_failures" json:"min_failures"`
	// Bootstrap is the number of resamples of Δ's interval (default 1000).
	Bootstrap int `koanf:"bootstrap" json:"bootstrap"`
	// Seed seeds the bootstrap (with a hash of the adapter's name), so the
	// same data always give the same intervals (default 1).
	Seed uint64 `koanf:"seed" json:"seed"`
	// SampleLimit is the most rollouts read per side, the most recent
	// (default 5000).
	SampleLimit int `koanf:"sample_limit" json:"sample_limit"`
	// Guard rolls back an adapter the guard's test finds worse. On in trace's
	// default configuration (verify.guard: true); off, the verdict is still
	// reported and logged. Defaults leaves it as it is.
	Guard bool `koanf:"guard" json:"guard"`
	// Selection is the analyzer's selection rule (analyzer.k, analyzer.n,
	// llm.runs; config.Load sets it): a rollout counts when it is labeled
	// in runs 0 to N−1 of its cohort's N (EvalConfig.KOfN of the cohort's
	// label sources), as the selection counts it, whatever runs an earlier
	// configuration labeled it in. nil: N is the most runs any rollout of
	// a side was labeled in.
	Selection *analyzer.EvalConfig `koanf:"-" json:"-"`
	// Interval is how often the guard checks the active adapters (default
	// 1m).
	Interval time.Duration `koanf:"interval" json:"-"` // in JSON: "interval", a duration text ("1m0s")
	// GuardLooks is the number of looks of the guard's sequential rule
	// (see GuardDecision; default 6: at 40, 80, … 1280 routed rollouts
	// that need the capability with the default MinFailures).
	GuardLooks int `koanf:"guard_looks" json:"guard_looks"`
	// GuardAlpha bounds the chance that the guard ever rolls back an
	// adapter that changed nothing, over all its looks (default 0.05).
	GuardAlpha float64 `koanf:"guard_alpha" json:"guard_alpha"`
	// GuardWatchAlpha bounds the chance that the guard's watch, after the
	// looks, ever rolls back an adapter that changed nothing (default
	// 0.01; see GuardDecision).
	GuardWatchAlpha float64 `koanf:"guard_watch_alpha" json:"guard_watch_alpha"`
}

// configJSON is Config in JSON: the interval as a duration text.
type configJSON struct {
	configFields
	Interval string `json:"interval"`
}

type configFields Config // Config without its methods

// MarshalJSON writes the interval as a duration text ("1m0s").
func (c Config) MarshalJSON() ([]byte, error) {
	return json.Marshal(configJSON{configFields(c), c.Interval.String()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (c *Config) UnmarshalJSON(b []byte) error {
	var j configJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*c = Config(j.configFields)
	if j.Interval != "" {
		d, err := time.ParseDuration(j.Interval)
		if err != nil {
			return fmt.Errorf("verify config: interval: %w", err)
		}
		c.Interval = d
	}
	return nil
}

// Defaults fills the zero fields.
func (c Config) Defaults() Config {
	c.Delta = cmp.Or(c.Delta, analyzer.DefaultThresholds.Delta)
	c.MinFailures = cmp.Or(c.MinFailures, 20)
	c.Bootstrap = cmp.Or(c.Bootstrap, 1000)
	c.Seed = cmp.Or(c.Seed, 1)
	c.SampleLimit = cmp.Or(c.SampleLimit, 5000)
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.GuardLooks = cmp.Or(c.GuardLooks, 6)
	c.GuardAlpha = cmp.Or(c.GuardAlpha, 0.05)
	c.GuardWatchAlpha = cmp.Or(c.GuardWatchAlpha, 0.01)
	return c
}

// Validate names the first field out of its domain (after Defaults). A
// NaN fails every comparison, so each float is checked for it explicitly.
func (c Config) Validate(prefix string) error {
	switch {
	case math.IsNaN(c.Delta) || c.Delta <= 0 || c.Delta > 1:
		return fmt.Errorf("%sdelta: must be in (0, 1], got %v", prefix, c.Delta)
	case c.MinFailures < 1:
		return fmt.Errorf("%smin_failures: must be at least 1, got %d", prefix, c.MinFailures)
	case c.Bootstrap < 100:
		return fmt.Errorf("%sbootstrap: must be at least 100 resamples, got %d", prefix, c.Bootstrap)
	case c.SampleLimit < 1:
		return fmt.Errorf("%ssample_limit: must be positive, got %d", prefix, c.SampleLimit)
	case c.Interval <= 0:
		return fmt.Errorf("%sinterval: must be positive, got %s", prefix, c.Interval)
	case c.GuardLooks < 1 || c.GuardLooks > maxGuardLooks:
		return fmt.Errorf("%sguard_looks: must be in [1, %d], got %d", prefix, maxGuardLooks, c.GuardLooks)
	case math.IsNaN(c.GuardAlpha) || c.GuardAlpha <= 0 || c.GuardAlpha > 0.5:
		return fmt.Errorf("%sguard_alpha: must be in (0, 0.5], got %v", prefix, c.GuardAlpha)
	case math.IsNaN(c.GuardWatchAlpha) || c.GuardWatchAlpha <= 0 || c.GuardWatchAlpha > 0.5:
		return fmt.Errorf("%sguard_watch_alpha: must be in (0, 0.5], got %v", prefix, c.GuardWatchAlpha)
	}
	return nil
}

// Comparison is a capability's statistics before activation and on the
// routed rollouts after it, the changes, and the verdict.
type Comparison struct {
	Before Stats `json:"before"`
	After  Stats `json:"after"`
	// DeltaChange is Δ after − Δ before, bootstrap interval.
	DeltaChange Interval `json:"delta_change"`
	// PassRateChange is pass rate after − before, Newcombe's interval.
	PassRateChange Interval `json:"pass_rate_change"`
	Verdict        Verdict  `json:"verdict"`
	Reason         string   `json:"reason"`
}

// Compare computes both sides' statistics and the verdict. key (the
// adapter's name) seeds the bootstrap with cfg.Seed, so a comparison is
// reproducible. cfg must have its defaults.
func Compare(before, after Sample, cfg Config, key string) Comparison {
	h := fnv.New64a()
	h.Write([]byte(key))
	rng := rand.New(rand.NewPCG(cfg.Seed, h.Sum64()))
	c := Comparison{Before: before.point(), After: after.point()}
	c.Before.Delta, c.After.Delta, c.DeltaChange = bootstrapDelta(before, after, cfg.Bootstrap, rng)
	c.PassRateChange = Newcombe(c.Before.PassRate, c.After.PassRate)
	c.Verdict, c.Reason = decide(c, cfg)
	return c
}

// decide applies the verdict rule, in order: not enough data, worse, gap
// closed, improved, no change.
func decide(c Comparison, cfg Config) (Verdict, string) {
	// Only the failures that need the capability count: one labeled NA is
	// in no ratio but Cov's, and a side of NA failures alone has Δ = 0 by
	// the zero-denominator rule, which says nothing about the gap.
	if c.After.NeededFailures < cfg.MinFailures {
		return NotEnoughData, fmt.Sprintf("%d labeled failures that need the capability among the routed rollouts (of %d failures), %d needed",
			c.After.NeededFailures, c.After.Failures, cfg.MinFailures) + incomplete(c.After)
	}
	if c.Before.NeededFailures < cfg.MinFailures {
		return NotEnoughData, fmt.Sprintf("%d labeled failures that need the capability before activation (of %d failures), %d needed",
			c.Before.NeededFailures, c.Before.Failures, cfg.MinFailures) + incomplete(c.Before)
	}
	var worse []string
	if c.PassRateChange.Hi < 0 {
		worse = append(worse, fmt.Sprintf("pass rate fell %.3f → %.3f (change %s)", c.Before.PassRate.Value, c.After.PassRate.Value, c.PassRateChange))
	}
	if c.DeltaChange.Lo > 0 {
		worse = append(worse, fmt.Sprintf("Δ rose %.3f → %.3f (change %s)", c.Before.Delta.Value, c.After.Delta.Value, c.DeltaChange))
	}
	if len(worse) > 0 {
		return Worse, "significantly worse: " + strings.Join(worse, "; ")
	}
	// Closed needs the evidence the other verdicts need: Δ after below δ
	// with its whole 95 % interval, not only its estimate (an estimate of
	// 0.15 on 20 failures is as compatible with 0.35 as with 0).
	var open string
	if c.After.Delta.Value < cfg.Delta {
		if c.After.Delta.Hi < cfg.Delta {
			return GapClosed, fmt.Sprintf("Δ %.3f → %.3f, below δ = %.2f with its 95 %% interval %s", c.Before.Delta.Value, c.After.Delta.Value, cfg.Delta, c.After.Delta)
		}
		open = fmt.Sprintf("; Δ after %s is below δ = %.2f but its interval is not: not closed yet", c.After.Delta, cfg.Delta)
	}
	var better []string
	if c.DeltaChange.Hi < 0 {
		better = append(better, fmt.Sprintf("Δ fell %.3f → %.3f (change %s)", c.Before.Delta.Value, c.After.Delta.Value, c.DeltaChange))
	}
	if c.PassRateChange.Lo > 0 {
		better = append(better, fmt.Sprintf("pass rate rose %.3f → %.3f (change %s)", c.Before.PassRate.Value, c.After.PassRate.Value, c.PassRateChange))
	}
	if len(better) > 0 {
		if open != "" {
			return Improved, "significantly better: " + strings.Join(better, "; ") + open
		}
		return Improved, "significantly better, Δ still ≥ δ: " + strings.Join(better, "; ")
	}
	return NoChange, fmt.Sprintf("no significant change: Δ %s → %s, pass rate %s → %s", c.Before.Delta, c.After.Delta, c.Before.PassRate, c.After.PassRate) + open
}

// incomplete names a side's rollouts left out for want of runs.
func incomplete(s Stats) string {
	if s.Incomplete == 0 {
		return ""
	}
	return fmt.Sprintf("; %d more rollouts are not labeled in all %d runs (yet)", s.Incomplete, s.Runs)
}
