package verify

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/sink"
)

// rolloutsOf builds labeled rollouts, one run each, ending a second apart
// from t0: outcomes "F" (failed) or "P" (passed) and labels "L", "P", "N".
func rolloutsOf(t0 time.Time, spec ...string) []sink.RolloutLabels {
	var out []sink.RolloutLabels
	long := map[byte]string{'L': "LACKING", 'P': "PRESENT", 'N': "NA"}
	for i, s := range spec {
		out = append(out, sink.RolloutLabels{RolloutID: fmt.Sprintf("r%04d", i), Success: s[0] == 'P',
			EndTime: t0.Add(time.Duration(i) * time.Second), Labels: []string{long[s[1]]}})
	}
	return out
}

// TestGuardLook: the look reached is the last whose number of rollouts
// that need the capability (first·2^(k−1)), of either outcome, the sample
// has; it covers the rollouts up to the one that completes it. NA
// rollouts do not count.
func TestGuardLook(t *testing.T) {
	for _, tc := range []struct {
		name         string
		spec         []string
		first, looks int
		wantK, wantN int
	}{
		{"none", nil, 2, 3, 0, 0},
		{"one short", []string{"FL", "PN", "FN"}, 2, 3, 0, 0},
		{"first look", []string{"FL", "PN", "PP", "FP"}, 2, 3, 1, 3},
		{"second look", []string{"FL", "PP", "FN", "FP", "PL", "FP"}, 2, 3, 2, 5},
		{"NA of either outcome not counted", []string{"PN", "FN", "PL", "FN", "FP"}, 2, 3, 1, 5},
		{"last look stays", []string{"PP", "PP", "PP", "PP", "PP", "PP", "PP", "PP", "PP", "PP"}, 2, 3, 3, 8},
		{"one look", []string{"FL", "FL", "FL"}, 2, 1, 1, 2},
	} {
		s := NewSampleOfRuns(rolloutsOf(time.Unix(0, 0), tc.spec...), 1)
		if k, n := guardLook(s, tc.first, tc.looks); k != tc.wantK || n != tc.wantN {
			t.Errorf("%s: look %d covering %d, want %d covering %d", tc.name, k, n, tc.wantK, tc.wantN)
		}
	}
}

// TestByEndTime: the guard's order is end time, then id.
func TestByEndTime(t *testing.T) {
	t0 := time.Unix(100, 0)
	rs := []sink.RolloutLabels{{RolloutID: "c", EndTime: t0}, {RolloutID: "a", EndTime: t0.Add(time.Second)}, {RolloutID: "b", EndTime: t0}}
	var got []string
	for _, r := range byEndTime(rs) {
		got = append(got, r.RolloutID)
	}
	if strings.Join(got, ",") != "b,c,a" || rs[0].RolloutID != "c" {
		t.Fatalf("order %v (input %v)", got, rs)
	}
}

// TestGuardLevel: the normal quantile and the level's text.
func TestGuardLevel(t *testing.T) {
	if z := zOf(0.05); math.Abs(z-z95) > 1e-12 {
		t.Errorf("zOf(0.05) = %v", z)
	}
	if z := zOf(0.01); math.Abs(z-2.5758293035489) > 1e-9 {
		t.Errorf("zOf(0.01) = %v", z)
	}
	if p := Pct(1 - 0.05/6); p != "99.2" {
		t.Errorf("pct %s", p)
	}
	if p := Pct(0.95); p != "95" {
		t.Errorf("pct %s", p)
	}
}

// simRollouts draws n rollouts of a cohort with pass rate pass: a failure
// is labeled LACKING with probability 0.6, a pass with 0.2, and one in ten
// of either NA (Δ = 0.4).
func simRollouts(rng *rand.Rand, t0 time.Time, n int, pass float64) []string {
	spec := make([]string, n)
	for i := range spec {
		o, lack := "F", 0.6
		if rng.Float64() < pass {
			o, lack = "P", 0.2
		}
		l := "P"
		switch u := rng.Float64(); {
		case u < 0.1:
			l = "N"
		case u < 0.1+0.9*lack:
			l = "L"
		}
		spec[i] = o + l
	}
	return spec
}

// TestGuardFalseRollbacksAreBounded simulates adapters checked at every
// tick while their routed rollouts arrive. For adapters that change
// nothing, acting on the 95 % verdict at every tick rolls many of them
// back; the guard's looks roll back at most GuardAlpha of them (within
// the simulation's error). For a harmful adapter (pass rate 0.5 → 0.3)
// the guard still acts in most of them by its last look.
func TestGuardFalseRollbacksAreBounded(t *testing.T) {
	cfg := Config{Bootstrap: 100, MinFailures: 10, GuardLooks: 4}.Defaults()
	const (
		adapters = 200
		ticks    = 15
		arrivals = 40
	)
	rng := rand.New(rand.NewPCG(2026, 12))
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	sim := func(passAfter float64) (perTickRate, guardRate float64) {
		perTickAlarms, guardAlarms := 0, 0
		for a := range adapters {
			key := fmt.Sprint("adapter-", a)
			before := NewSampleOfRuns(rolloutsOf(t0, simRollouts(rng, t0, 300, 0.5)...), 1)
			after := NewSampleOfRuns(rolloutsOf(t0.Add(time.Hour), simRollouts(rng, t0, ticks*arrivals, passAfter)...), 1)
			perTickRolled, look := false, 0
			for tick := 1; tick <= ticks; tick++ {
				seen := after.prefix(tick * arrivals)
				if !perTickRolled && Compare(before, seen, cfg, key).Verdict == Worse {
					perTickRolled = true
				}
				// Between looks the guard repeats the last one on the
				// same rollouts (TestGuardRepeatsItsLook): only a new
				// look can change its decision.
				if k, _ := guardLook(seen, 2*cfg.MinFailures, cfg.GuardLooks); k != look {
					look = k
					if guardDecide(before, seen, cfg).Worse {
						guardAlarms++
						break
					}
				}
			}
			if perTickRolled {
				perTickAlarms++
			}
		}
		return float64(perTickAlarms) / adapters, float64(guardAlarms) / adapters
	}

	perTick, guard := sim(0.5)
	t.Logf("adapters that change nothing, rolled back over %d ticks: at every tick's 95 %% verdict %.3f, by the guard's %d looks %.3f (alpha %.2f)",
		ticks, perTick, cfg.GuardLooks, guard, cfg.GuardAlpha)
	// alpha plus three binomial standard errors of the simulation.
	if bound := cfg.GuardAlpha + 3*math.Sqrt(cfg.GuardAlpha*(1-cfg.GuardAlpha)/adapters); guard > bound {
		t.Errorf("the guard rolled back %.3f of the adapters that change nothing, more than %.3f", guard, bound)
	}
	if perTick < 2*cfg.GuardAlpha || perTick < 2*guard {
		t.Errorf("acting on the verdict at every tick rolled back %.3f (the guard %.3f): the simulation does not show the repeated looks' problem", perTick, guard)
	}

	_, harmful := sim(0.3)
	t.Logf("harmful adapters (pass rate 0.5 → 0.3) rolled back by the guard: %.3f", harmful)
	if harmful < 0.8 {
		t.Errorf("the guard rolled back only %.3f of the harmful adapters", harmful)
	}
}

// TestGuardRepeatsItsLook: between two looks, and after the last, the
// guard's decision is the same at every tick: same rollouts, seeded
// bootstrap.
func TestGuardRepeatsItsLook(t *testing.T) {
	cfg := Config{Bootstrap: 100, MinFailures: 10, GuardLooks: 2}.Defaults()
	rng := rand.New(rand.NewPCG(7, 7))
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	before := NewSampleOfRuns(rolloutsOf(t0, simRollouts(rng, t0, 200, 0.5)...), 1)
	after := NewSampleOfRuns(rolloutsOf(t0.Add(time.Hour), simRollouts(rng, t0, 400, 0.4)...), 1)
	var last GuardDecision
	var looks []int
	for n := 1; n <= after.Len(); n += 7 {
		g := guardDecide(before, after.prefix(n), cfg)
		if g.Look == last.Look && g.Look > 0 && (g.Reason != last.Reason || g.Comparison.PassRateChange != last.Comparison.PassRateChange || g.Comparison.DeltaChange != last.Comparison.DeltaChange) {
			t.Fatalf("at %d rollouts the guard's look %d decided %q, before %q", n, g.Look, g.Reason, last.Reason)
		}
		if g.Look != last.Look {
			looks = append(looks, g.Look)
		}
		last = g
	}
	if fmt.Sprint(looks) != "[1 2]" {
		t.Fatalf("looks reached %v, want [1 2]", looks)
	}
	if last.Level != 1-0.05/2 || last.Needed != 40 {
		t.Fatalf("last look %+v", last)
	}
}
