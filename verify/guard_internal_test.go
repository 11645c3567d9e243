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
					if guardDecide(before, seen, cfg, false).Worse {
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
		g := guardDecide(before, after.prefix(n), cfg, false)
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
	// The looks are over at the rollout that completed the last one; short
	// of it, once the sample is the first sample_limit (full), at its end.
	if _, n := guardLook(after, 2*cfg.MinFailures, cfg.GuardLooks); !last.LooksEnd.Equal(after.ends[n-1]) {
		t.Fatalf("looks end %v, want %v", last.LooksEnd, after.ends[n-1])
	}
	if g := guardDecide(before, after.prefix(30), cfg, false); !g.LooksEnd.IsZero() {
		t.Fatalf("looks not over, yet they end at %v", g.LooksEnd)
	}
	if g := guardDecide(before, after.prefix(30), cfg, true); !g.LooksEnd.Equal(after.ends[29]) {
		t.Fatalf("a full sample short of the last look: looks end %v, want %v", g.LooksEnd, after.ends[29])
	}
}

// TestWatchBlock: the watch's blocks follow the looks' last rollout (from
// the next whole second), each as long as activation to it, at least an
// hour; the last complete one at now is tested.
func TestWatchBlock(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	T := t0.Add(10*time.Minute + time.Second)
	for _, tc := range []struct {
		name             string
		looksEnd, now    time.Time
		wantJ            int
		wantFrom, wantTo time.Time
	}{
		{"looks not over", time.Time{}, t0.Add(48 * time.Hour), 0, time.Time{}, time.Time{}},
		{"first block not complete", t0.Add(10 * time.Minute), T.Add(59 * time.Minute), 0, time.Time{}, time.Time{}},
		{"first block", t0.Add(10 * time.Minute), T.Add(time.Hour), 1, T, T.Add(time.Hour)},
		{"second block", t0.Add(10 * time.Minute), T.Add(2*time.Hour + 5*time.Minute), 2, T.Add(time.Hour), T.Add(2 * time.Hour)},
		{"sub-second end", t0.Add(10*time.Minute + 500*time.Millisecond), T.Add(time.Hour), 1, T, T.Add(time.Hour)},
		{"looks longer than an hour", t0.Add(3 * time.Hour), t0.Add(3*time.Hour + time.Second + 7*time.Hour), 2,
			t0.Add(3*time.Hour + time.Second).Add(3*time.Hour + time.Second), t0.Add(3*time.Hour + time.Second).Add(2 * (3*time.Hour + time.Second))},
	} {
		j, from, to := watchBlock(t0, tc.looksEnd, tc.now)
		if j != tc.wantJ || !from.Equal(tc.wantFrom) || !to.Equal(tc.wantTo) {
			t.Errorf("%s: block %d [%v, %v), want %d [%v, %v)", tc.name, j, from, to, tc.wantJ, tc.wantFrom, tc.wantTo)
		}
	}
}

// TestWatchAlphaSums: the watch blocks' α_j sum to GuardWatchAlpha.
func TestWatchAlphaSums(t *testing.T) {
	cfg := Config{}.Defaults()
	sum := 0.0
	for j := 1; j <= 100000; j++ {
		sum += cfg.watchAlpha(j)
	}
	if sum > cfg.GuardWatchAlpha || sum < 0.9999*cfg.GuardWatchAlpha {
		t.Fatalf("α_j sum to %v over 100,000 blocks, want just under %v", sum, cfg.GuardWatchAlpha)
	}
}

// TestGuardWatch simulates the watch's blocks: for adapters that change
// nothing, at most GuardWatchAlpha of them are rolled back over 30 blocks
// (within the simulation's error); one whose pass rate falls from 0.5 to
// 0.2 after the third block is rolled back in most of them.
func TestGuardWatch(t *testing.T) {
	cfg := Config{}.Defaults()
	const (
		adapters = 400
		blocks   = 30
		size     = 100
	)
	rng := rand.New(rand.NewPCG(12, 6))
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	sim := func(harmFrom int) float64 {
		rolled := 0
		for range adapters {
			before := NewSampleOfRuns(rolloutsOf(t0, simRollouts(rng, t0, 300, 0.5)...), 1)
			for j := 1; j <= blocks; j++ {
				pass := 0.5
				if harmFrom > 0 && j >= harmFrom {
					pass = 0.2
				}
				block := NewSampleOfRuns(rolloutsOf(t0, simRollouts(rng, t0, size, pass)...), 1)
				if watchDecide(before, block, cfg, j, t0, t0.Add(time.Hour)).Worse {
					rolled++
					break
				}
			}
		}
		return float64(rolled) / adapters
	}
	neutral := sim(0)
	harmful := sim(4)
	t.Logf("rolled back by the watch over %d blocks of %d rollouts: %.4f of the adapters that change nothing (alpha %.2f), %.3f of those harmful from block 4",
		blocks, size, neutral, cfg.GuardWatchAlpha, harmful)
	if bound := cfg.GuardWatchAlpha + 3*math.Sqrt(cfg.GuardWatchAlpha*(1-cfg.GuardWatchAlpha)/adapters); neutral > bound {
		t.Errorf("the watch rolled back %.4f of the adapters that change nothing, more than %.4f", neutral, bound)
	}
	if harmful < 0.8 {
		t.Errorf("the watch rolled back only %.3f of the harmful adapters", harmful)
	}
}
