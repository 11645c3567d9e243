package verify

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/sink"
)

// mix is a sample's composition: rollouts per (outcome, label), the same
// label in every run.
type mix struct{ LF, PF, NF, LP, PP, NP int }

func (m mix) rollouts(prefix string, runs int) []sink.RolloutLabels {
	var out []sink.RolloutLabels
	add := func(n int, ok bool, label string) {
		for range n {
			ls := make([]string, runs)
			for r := range ls {
				ls[r] = label
			}
			out = append(out, sink.RolloutLabels{RolloutID: fmt.Sprintf("%s-%d", prefix, len(out)), Success: ok, Labels: ls})
		}
	}
	add(m.LF, false, "LACKING")
	add(m.PF, false, "PRESENT")
	add(m.NF, false, "NA")
	add(m.LP, true, "LACKING")
	add(m.PP, true, "PRESENT")
	add(m.NP, true, "NA")
	return out
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestWilson(t *testing.T) {
	for _, tc := range []struct {
		p, n, lo, hi float64
	}{
		{0.5, 100, 0.4038, 0.5962},
		{0, 10, 0, 0.2775},
		{1, 10, 0.7225, 1},
		{0.2, 50, 0.1124, 0.3304},
		{0.3, 0, 0, 1}, // no trials: nothing known
	} {
		got := Wilson(tc.p, tc.n)
		if !near(got.Lo, tc.lo, 5e-4) || !near(got.Hi, tc.hi, 5e-4) || got.Value != tc.p {
			t.Errorf("Wilson(%v, %v) = %v, want [%.4f, %.4f]", tc.p, tc.n, got, tc.lo, tc.hi)
		}
	}
}

// Newcombe (1998), table II, example (a): 56/70 − 48/80, method 10 gives
// 0.0524 to 0.3339.
func TestNewcombe(t *testing.T) {
	got := Newcombe(Wilson(48.0/80, 80), Wilson(56.0/70, 70))
	if !near(got.Value, 0.2, 1e-9) || !near(got.Lo, 0.0524, 5e-4) || !near(got.Hi, 0.3339, 5e-4) {
		t.Fatalf("Newcombe = %v, want 0.2000 [0.0524, 0.3339]", got)
	}
}

func TestNewSampleDropsIncompleteRollouts(t *testing.T) {
	rs := []sink.RolloutLabels{
		{RolloutID: "a", Labels: []string{"LACKING", "PRESENT", "LACKING"}},
		{RolloutID: "b", Labels: []string{"LACKING", "PRESENT"}},            // run 2 still missing
		{RolloutID: "c", Labels: []string{"LACKING", "", "NA"}},             // run 1 missing
		{RolloutID: "d", Success: true, Labels: []string{"NA", "NA", "NA"}}, // complete
	}
	s := NewSample(rs)
	if s.Runs != 3 || s.Len() != 2 || s.Incomplete != 2 {
		t.Fatalf("runs %d, kept %d, incomplete %d; want 3, 2, 2", s.Runs, s.Len(), s.Incomplete)
	}
}

// NewSampleOfRuns counts a rollout by its runs 0..N−1, as the selection
// does: more runs (labeled before N was lowered) count with their first N,
// fewer are incomplete; N unset is the most runs a rollout has.
func TestNewSampleOfRuns(t *testing.T) {
	ten := []string{"LACKING", "LACKING", "LACKING", "PRESENT", "PRESENT", "PRESENT", "PRESENT", "PRESENT", "PRESENT", "PRESENT"}
	three := []string{"PRESENT", "LACKING", "PRESENT"}
	for _, tc := range []struct {
		name                   string
		labels                 [][]string
		n                      int
		runs, kept, incomplete int
	}{
		{"runs lowered 10 → 3: both count", [][]string{ten, three, three}, 3, 3, 3, 0},
		{"N unset: the most runs, the 3-run ones left out", [][]string{ten, three, three}, 0, 10, 1, 2},
		{"N 10, only 3 runs labeled", [][]string{three, three}, 10, 10, 0, 2},
		{"a run missing below N", [][]string{{"LACKING", "", "NA"}, three}, 3, 3, 1, 1},
		{"a run missing at or past N does not matter", [][]string{{"LACKING", "NA", "NA", ""}, three}, 3, 3, 2, 0},
		{"one run", [][]string{{"NA"}, ten}, 1, 1, 2, 0},
		{"no rollouts", nil, 3, 3, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rs []sink.RolloutLabels
			for i, ls := range tc.labels {
				rs = append(rs, sink.RolloutLabels{RolloutID: fmt.Sprint(i), Labels: ls})
			}
			s := NewSampleOfRuns(rs, tc.n)
			if s.Runs != tc.runs || s.Len() != tc.kept || s.Incomplete != tc.incomplete {
				t.Fatalf("runs %d, kept %d, incomplete %d; want %d, %d, %d", s.Runs, s.Len(), s.Incomplete, tc.runs, tc.kept, tc.incomplete)
			}
		})
	}
	// The first three runs of the ten-run rollout are what count.
	st := NewSampleOfRuns([]sink.RolloutLabels{{RolloutID: "a", Labels: ten}}, 3).point()
	if st.ERFailed.Value != 1 || st.Runs != 3 {
		t.Fatalf("ER− %v over %d runs, want 1 over 3 (runs 0..2 are LACKING)", st.ERFailed.Value, st.Runs)
	}
}

// The point statistics are the analyzer's: the mean over runs of
// ComputeRun, when the runs disagree.
func TestStatsAreTheAnalyzersMeanOverRuns(t *testing.T) {
	rs := []sink.RolloutLabels{
		{RolloutID: "1", Labels: []string{"LACKING", "PRESENT"}},
		{RolloutID: "2", Labels: []string{"LACKING", "LACKING"}},
		{RolloutID: "3", Labels: []string{"PRESENT", "NA"}},
		{RolloutID: "4", Success: true, Labels: []string{"PRESENT", "LACKING"}},
		{RolloutID: "5", Success: true, Labels: []string{"NA", "PRESENT"}},
	}
	st := NewSample(rs).point()
	r0 := analyzer.ComputeRun(analyzer.Counts{LackingFailed: 2, PresentFailed: 1, PresentPassed: 1, NAPassed: 1}, analyzer.DefaultThresholds)
	r1 := analyzer.ComputeRun(analyzer.Counts{LackingFailed: 1, PresentFailed: 1, NAFailed: 1, LackingPassed: 1, PresentPassed: 1}, analyzer.DefaultThresholds)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"ER−", st.ERFailed.Value, (r0.ERFailed + r1.ERFailed) / 2},
		{"ER+", st.ERPassed.Value, (r0.ERPassed + r1.ERPassed) / 2},
		{"Δ", st.Delta.Value, (r0.Delta + r1.Delta) / 2},
		{"Cov", st.Cov.Value, (r0.Cov + r1.Cov) / 2},
	} {
		if !near(c.got, c.want, 1e-12) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	// Needed: non-NA in at least half the runs: 1, 2, 3 (1 of 2), 4, 5 (1 of 2).
	if st.Rollouts != 5 || st.Failures != 3 || st.Needed != 5 || !near(st.PassRate.Value, 0.4, 1e-12) {
		t.Fatalf("rollouts %d failures %d needed %d pass rate %v", st.Rollouts, st.Failures, st.Needed, st.PassRate)
	}
}

func TestVerdicts(t *testing.T) {
	cfg := Config{MinFailures: 20}.Defaults()
	// Before: ER− 0.8, ER+ 0.1, Δ 0.7; pass rate among rollouts that need
	// the capability 50/100.
	gap := mix{LF: 40, PF: 10, NF: 10, LP: 5, PP: 45, NP: 10}
	for _, tc := range []struct {
		name          string
		before, after mix
		runs          int
		want          Verdict
		reason        string
	}{
		{"the deficit is gone on routed rollouts", gap, mix{LF: 2, PF: 28, NF: 5, LP: 2, PP: 60, NP: 3}, 3, GapClosed, "below δ"},
		{"Δ lower but not below δ", gap, mix{LF: 25, PF: 25, NF: 5, LP: 5, PP: 45, NP: 5}, 3, Improved, "Δ fell"},
		{"pass rate higher, Δ unchanged", mix{LF: 30, PF: 30, NF: 10, LP: 2, PP: 38, NP: 10}, mix{LF: 16, PF: 14, NF: 25, LP: 2, PP: 68, NP: 10}, 1, Improved, "pass rate rose"},
		{"the same as before", gap, gap, 3, NoChange, "no significant change"},
		{"pass rate collapses", gap, mix{LF: 40, PF: 40, NF: 5, LP: 2, PP: 18, NP: 5}, 3, Worse, "pass rate fell"},
		{"Δ grows", mix{LF: 20, PF: 30, NF: 10, LP: 5, PP: 45, NP: 10}, mix{LF: 45, PF: 5, NF: 10, LP: 5, PP: 45, NP: 10}, 3, Worse, "Δ rose"},
		{"too few routed failures", gap, mix{LF: 5, PF: 5, NF: 5, LP: 1, PP: 30}, 3, NotEnoughData,
			"10 labeled failures that need the capability among the routed rollouts (of 15 failures), 20 needed"},
		{"too few failures before", mix{LF: 5, PF: 5, LP: 5, PP: 45}, gap, 3, NotEnoughData, "10 labeled failures that need the capability before activation"},
		{"nothing routed yet", gap, mix{}, 3, NotEnoughData, "0 labeled failures that need the capability among the routed rollouts"},
		// Routed traffic that never needs the capability (zero coverage,
		// every label NA): Δ is 0 by the zero-denominator rule, which is no
		// evidence that the gap closed.
		{"routed rollouts all NA", gap, mix{NF: 30, NP: 30}, 3, NotEnoughData, "0 labeled failures that need the capability among the routed rollouts (of 30 failures)"},
		{"before all NA", mix{NF: 30, NP: 30}, gap, 3, NotEnoughData, "0 labeled failures that need the capability before activation (of 30 failures)"},
		{"one routed failure needs it, the rest NA", gap, mix{LF: 1, NF: 30, NP: 30}, 3, NotEnoughData, "1 labeled failures that need the capability"},
		// Exactly at the minimum is enough; one below is not.
		{"exactly min_failures that need it", gap, mix{PF: 20, NF: 10, PP: 40}, 3, GapClosed, "below δ"},
		{"one below min_failures", gap, mix{PF: 19, NF: 10, PP: 40}, 3, NotEnoughData, "19 labeled failures that need the capability"},
		// One labeling run.
		{"one run", gap, mix{LF: 2, PF: 28, NF: 5, LP: 2, PP: 60, NP: 3}, 1, GapClosed, "below δ"},
		// Δ after exactly δ (ER− 0.25 − ER+ 0.05 = 0.20): the capability
		// would still be selected, so the gap is not closed.
		{"Δ after exactly δ", gap, mix{LF: 5, PF: 15, LP: 1, PP: 19}, 3, Improved, "Δ still ≥ δ"},
		// The same in each of TRACE's N = 10 runs: the mean over the runs
		// is summed as the selection's report sums it (pairwise), so ten
		// runs of 0.20 average 0.20, not 0.19999999999999998 "below δ".
		{"Δ after exactly δ in 10 runs", gap, mix{LF: 5, PF: 15, LP: 1, PP: 19}, 10, Improved, "Δ still ≥ δ"},
		// Δ after below δ (0.15 on 20 failures) but its interval reaching
		// it: better, not yet closed.
		{"Δ after below δ, its interval not", gap, mix{LF: 3, PF: 17, PP: 20}, 3, Improved, "is below δ = 0.20 but its interval is not: not closed yet"},
		{"Δ below δ, its interval not, no significant change", mix{LF: 6, PF: 14, PP: 20}, mix{LF: 3, PF: 17, PP: 20}, 3, NoChange, "but its interval is not: not closed yet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Compare(NewSample(tc.before.rollouts("b", tc.runs)), NewSample(tc.after.rollouts("a", tc.runs)), cfg, "ad-1")
			if c.Verdict != tc.want || !strings.Contains(c.Reason, tc.reason) {
				t.Fatalf("verdict %s (%s), want %s (…%s…)\nbefore %+v\nafter %+v\nΔ change %v, pass change %v",
					c.Verdict, c.Reason, tc.want, tc.reason, c.Before, c.After, c.DeltaChange, c.PassRateChange)
			}
			// Every interval contains its estimate.
			for _, iv := range []Interval{c.Before.Delta, c.After.Delta, c.Before.PassRate, c.After.PassRate, c.Before.ERFailed,
				c.After.ERPassed, c.After.Cov, c.DeltaChange, c.PassRateChange} {
				if iv.Lo > iv.Value+1e-12 || iv.Hi < iv.Value-1e-12 {
					t.Errorf("interval %v does not contain its estimate", iv)
				}
			}
		})
	}
}

// The bootstrap is seeded: the same data and key give the same interval;
// its width shrinks as the sample grows.
func TestBootstrapIsSeededAndNarrowsWithData(t *testing.T) {
	cfg := Config{}.Defaults()
	small := mix{LF: 12, PF: 8, NF: 4, LP: 3, PP: 17, NP: 4}
	big := mix{LF: 120, PF: 80, NF: 40, LP: 30, PP: 170, NP: 40}
	b := NewSample(small.rollouts("b", 2))
	c1 := Compare(b, NewSample(small.rollouts("a", 2)), cfg, "x")
	c2 := Compare(b, NewSample(small.rollouts("a", 2)), cfg, "x")
	if c1.DeltaChange != c2.DeltaChange || c1.After.Delta != c2.After.Delta {
		t.Fatalf("same seed, different intervals: %v vs %v", c1.DeltaChange, c2.DeltaChange)
	}
	if c3 := Compare(b, NewSample(small.rollouts("a", 2)), cfg, "y"); c3.DeltaChange == c1.DeltaChange {
		t.Fatalf("another adapter's resamples should differ: %v", c3.DeltaChange)
	}
	cb := Compare(NewSample(big.rollouts("b", 2)), NewSample(big.rollouts("a", 2)), cfg, "x")
	ws, wb := c1.After.Delta.Hi-c1.After.Delta.Lo, cb.After.Delta.Hi-cb.After.Delta.Lo
	if !(wb < ws/2) || ws <= 0 {
		t.Fatalf("Δ interval width %v with 10× the data, %v with the small sample", wb, ws)
	}
	// Δ = 0.6 − 0.15 = 0.45 in both; the small sample's interval covers it.
	if !near(c1.After.Delta.Value, 0.45, 1e-12) || c1.After.Delta.Lo > 0.45 || c1.After.Delta.Hi < 0.45 {
		t.Fatalf("Δ %v", c1.After.Delta)
	}
}

func TestConfigValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Delta: 1.5}, "verify.delta"},
		{Config{Delta: math.NaN()}, "verify.delta"},
		{Config{Delta: math.Inf(1)}, "verify.delta"},
		{Config{Delta: math.Inf(-1)}, "verify.delta"},
		{Config{Delta: -0.1}, "verify.delta"},
		{Config{MinFailures: -1}, "verify.min_failures"},
		{Config{Bootstrap: 10}, "verify.bootstrap"},
		{Config{Interval: -1}, "verify.interval"},
		{Config{GuardLooks: -1}, "verify.guard_looks"},
		{Config{GuardLooks: 21}, "verify.guard_looks"},
		{Config{GuardAlpha: 0.6}, "verify.guard_alpha"},
		{Config{GuardAlpha: -0.01}, "verify.guard_alpha"},
		{Config{GuardAlpha: math.NaN()}, "verify.guard_alpha"},
		{Config{GuardWatchAlpha: 0.9}, "verify.guard_watch_alpha"},
		{Config{GuardWatchAlpha: -1}, "verify.guard_watch_alpha"},
	} {
		err := tc.cfg.Defaults().Validate("verify.")
		if err == nil || !strings.HasPrefix(err.Error(), tc.want+":") {
			t.Errorf("%+v: %v, want %s", tc.cfg, err, tc.want)
		}
	}
	if err := (Config{}).Defaults().Validate("verify."); err != nil {
		t.Fatal(err)
	}
}

// A side with rollouts has a bootstrap interval of its Δ even when the
// other side has none (freshly activated: nothing routed yet; or no base
// rollouts before activation); only the empty side's Δ and the change are
// unknown.
func TestBootstrapIntervalWithOneSideEmpty(t *testing.T) {
	cfg := Config{}.Defaults()
	data := NewSample(mix{LF: 12, PF: 8, NF: 4, LP: 3, PP: 17, NP: 4}.rollouts("s", 2))
	for _, tc := range []struct {
		name          string
		before, after Sample
	}{
		{"nothing routed yet", data, NewSample(nil)},
		{"no rollouts before activation", NewSample(nil), data},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Compare(tc.before, tc.after, cfg, "x")
			for _, side := range []struct {
				name string
				s    Sample
				iv   Interval
			}{{"before", tc.before, c.Before.Delta}, {"after", tc.after, c.After.Delta}} {
				if side.s.Len() == 0 {
					if side.iv.Lo != -1 || side.iv.Hi != 1 {
						t.Errorf("%s (empty): Δ %v, want [-1, 1]", side.name, side.iv)
					}
					continue
				}
				// Δ = 0.6 − 0.15 = 0.45 on 48 rollouts: an interval of some width around it.
				if !near(side.iv.Value, 0.45, 1e-12) || side.iv.Hi-side.iv.Lo < 0.1 || side.iv.Lo > 0.45 || side.iv.Hi < 0.45 {
					t.Errorf("%s: Δ %v, want a bootstrap interval around 0.45", side.name, side.iv)
				}
			}
			if c.DeltaChange.Lo != -2 || c.DeltaChange.Hi != 2 {
				t.Errorf("Δ change %v, want [-2, 2]", c.DeltaChange)
			}
		})
	}
}

func TestActivation(t *testing.T) {
	upd := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	act := upd.Add(-time.Hour)
	cases := []struct {
		name, status, meta string
		want               time.Time
		ever               bool
	}{
		{"activated_at set", "active", `{"activated_at":"2026-12-01T11:00:00Z"}`, act, true},
		{"last transition to active", "rolled_back",
			`{"transitions":[{"from":"candidate","to":"active","at":"2026-12-01T11:00:00Z"},{"from":"active","to":"rolled_back","at":"2026-12-01T12:00:00Z"}]}`, act, true},
		{"retired after service", "retired",
			`{"transitions":[{"from":"candidate","to":"active","at":"2026-12-01T11:00:00Z"},{"from":"active","to":"retired","at":"2026-12-01T12:00:00Z"}]}`, act, true},
		{"retired as a candidate", "retired", `{"transitions":[{"from":"candidate","to":"retired","at":"2026-12-01T12:00:00Z"}]}`, upd, false},
		{"retired, no history", "retired", `{"trainer":"x"}`, upd, true},
		{"active, no history", "active", `{}`, upd, true},
		{"malformed metadata", "retired", `{`, upd, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, _, ever := activation(sink.AdapterRow{Status: c.status, Metadata: c.meta, UpdatedAt: upd})
			if !got.Equal(c.want) || ever != c.ever {
				t.Fatalf("activation = %v, %v; want %v, %v", got, ever, c.want, c.ever)
			}
		})
	}
}

// TestConfigJSON: the loop report's config is snake_case JSON with the
// interval as a duration text, and reads back the same.
func TestConfigJSON(t *testing.T) {
	c := Config{Guard: true}.Defaults()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"delta":0.2,"min_failures":20,"bootstrap":1000,"seed":1,"sample_limit":5000,"guard":true,"guard_looks":6,"guard_alpha":0.05,"guard_watch_alpha":0.01,"interval":"1m0s"}`
	if string(b) != want {
		t.Fatalf("config JSON %s, want %s", b, want)
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil || back != c {
		t.Fatalf("read back %+v, %v; want %+v", back, err, c)
	}
	if err := json.Unmarshal([]byte(`{"interval":"soon"}`), &back); err == nil {
		t.Fatal("an interval that is not a duration was read")
	}
}

// A side short of failures because its rollouts lack runs says so.
func TestNotEnoughDataNamesIncompleteRollouts(t *testing.T) {
	cfg := Config{}.Defaults()
	before := NewSampleOfRuns(mix{LF: 40, PF: 10, NF: 10, LP: 5, PP: 45, NP: 10}.rollouts("b", 10), 10)
	after := NewSampleOfRuns(mix{LF: 30, PP: 30}.rollouts("a", 3), 10)
	c := Compare(before, after, cfg, "x")
	if c.Verdict != NotEnoughData || !strings.Contains(c.Reason, "; 60 more rollouts are not labeled in all 10 runs (yet)") {
		t.Fatalf("%s: %s", c.Verdict, c.Reason)
	}
}

// baselines: per capability and cohort, the first activation of any
// adapter that was in service, from the registry's history when it has
// one; a candidate retired before activation does not count.
func TestBaselines(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	at := func(h int) string { return t0.Add(time.Duration(h) * time.Hour).Format(time.RFC3339) }
	ad := func(name, capability, status, meta string, updated int) sink.AdapterRow {
		return sink.AdapterRow{Name: name, Capability: capability, Environment: "air", AgentVersion: "1", Status: status, Metadata: meta,
			UpdatedAt: t0.Add(time.Duration(updated) * time.Hour)}
	}
	for _, tc := range []struct {
		name    string
		ads     []sink.AdapterRow
		want    map[string]int // capability → hour
		adapter map[string]string
	}{
		{"one adapter, no history: its update", []sink.AdapterRow{ad("a", "x", "active", `{}`, 5)}, map[string]int{"x": 5}, map[string]string{"x": "a"}},
		{"re-activated: its first activation", []sink.AdapterRow{ad("a", "x", "active",
			`{"transitions":[{"to":"active","at":"`+at(2)+`"},{"to":"rolled_back","at":"`+at(3)+`"},{"to":"active","at":"`+at(7)+`"}]}`, 7)},
			map[string]int{"x": 2}, map[string]string{"x": "a"}},
		{"an earlier retired adapter of the capability", []sink.AdapterRow{
			ad("new", "x", "active", `{"activated_at":"`+at(9)+`"}`, 9),
			ad("old", "x", "retired", `{"transitions":[{"to":"active","at":"`+at(4)+`"},{"to":"retired","at":"`+at(9)+`"}]}`, 9),
			ad("other", "y", "active", `{"activated_at":"`+at(1)+`"}`, 1),
		}, map[string]int{"x": 4, "y": 1}, map[string]string{"x": "old", "y": "other"}},
		{"a candidate retired before activation does not count", []sink.AdapterRow{
			ad("new", "x", "active", `{"activated_at":"`+at(9)+`"}`, 9),
			ad("cand", "x", "retired", `{"transitions":[{"to":"candidate","at":"`+at(1)+`"},{"to":"retired","at":"`+at(2)+`"}]}`, 2),
		}, map[string]int{"x": 9}, map[string]string{"x": "new"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := baselines(tc.ads)
			if len(got) != len(tc.want) {
				t.Fatalf("%v, want %v", got, tc.want)
			}
			for c, h := range tc.want {
				b := got[baselineKey{"air", "1", c}]
				if !b.at.Equal(t0.Add(time.Duration(h)*time.Hour)) || b.adapter != tc.adapter[c] {
					t.Fatalf("%s: %s by %q, want hour %d by %q", c, b.at, b.adapter, h, tc.adapter[c])
				}
			}
		})
	}
}
