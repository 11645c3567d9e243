package analyzer

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/schemas"
)

func TestComputeRun(t *testing.T) {
	th := DefaultThresholds
	tests := []struct {
		name string
		c    Counts
		want RunStats
	}{
		{"all zero denominators", Counts{}, RunStats{}},
		{"no failures at all", Counts{LackingPassed: 1, PresentPassed: 3}, RunStats{ERPassed: 0.25, Delta: -0.25}},
		{"only NA on failures: ER- and Cov denominators differ", Counts{NAFailed: 10, PresentPassed: 5}, RunStats{}},
		{"plain pass", Counts{LackingFailed: 3, PresentFailed: 1, NAFailed: 6, PresentPassed: 10},
			RunStats{ERFailed: 0.75, Delta: 0.75, Cov: 0.3, Passed: true}},
		{"LACKING on successes lowers the gap", Counts{LackingFailed: 3, PresentFailed: 1, NAFailed: 6, LackingPassed: 3, PresentPassed: 1},
			RunStats{ERFailed: 0.75, ERPassed: 0.75, Delta: 0, Cov: 0.3}},
		{"coverage exactly rho passes", Counts{LackingFailed: 1, NAFailed: 9, PresentPassed: 1},
			RunStats{ERFailed: 1, Delta: 1, Cov: 0.1, Passed: true}},
		{"coverage just below rho", Counts{LackingFailed: 1, NAFailed: 10, PresentPassed: 1},
			RunStats{ERFailed: 1, Delta: 1, Cov: 1.0 / 11}},
		{"gap exactly delta passes", Counts{LackingFailed: 2, PresentFailed: 3, PresentPassed: 1},
			RunStats{ERFailed: 0.4, Delta: 0.4, Cov: 0.4, Passed: true}},
		{"gap below delta", Counts{LackingFailed: 1, PresentFailed: 4, LackingPassed: 1, PresentPassed: 9},
			RunStats{ERFailed: 0.2, ERPassed: 0.1, Delta: 0.1, Cov: 0.2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ComputeRun(tt.c, th)
			if !approx(got.ERFailed, tt.want.ERFailed) || !approx(got.ERPassed, tt.want.ERPassed) ||
				!approx(got.Delta, tt.want.Delta) || !approx(got.Cov, tt.want.Cov) || got.Passed != tt.want.Passed {
				t.Fatalf("ComputeRun(%+v) = %+v, want %+v", tt.c, got, tt.want)
			}
		})
	}
}

func approx(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func TestMeanStdPopulation(t *testing.T) {
	tests := []struct {
		xs        []float64
		mean, std float64
	}{
		{nil, 0, 0},
		{[]float64{5}, 5, 0},
		{[]float64{1, 3}, 2, 1},
		{[]float64{2, 4, 4, 4, 5, 5, 7, 9}, 5, 2}, // textbook population std
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 5.5, 2.8722813232690143}, // ddof 0, not 3.0277
	}
	for _, tt := range tests {
		m, s := MeanStd(tt.xs)
		if !approx(m, tt.mean) || !approx(s, tt.std) {
			t.Errorf("MeanStd(%v) = %v, %v; want %v, %v", tt.xs, m, s, tt.mean, tt.std)
		}
	}
}

func TestPairwiseSumMatchesNumpyOrder(t *testing.T) {
	// 0.1 added ten times left to right is 0.9999999999999999; numpy's pairwise
	// order for n = 10 gives exactly 1.0.
	xs := make([]float64, 10)
	for i := range xs {
		xs[i] = 0.1
	}
	if got := pairwiseSum(xs); got != 1.0 {
		t.Fatalf("pairwiseSum = %.17g, want 1 (numpy order)", got)
	}
	// Large inputs recurse; the result must still be the sum.
	big := make([]float64, 1000)
	for i := range big {
		big[i] = float64(i)
	}
	if got := pairwiseSum(big); got != 499500 {
		t.Fatalf("pairwiseSum(0..999) = %v", got)
	}
}

func TestSelectKofNAndTies(t *testing.T) {
	pass := RunInput{Counts: Counts{LackingFailed: 5, PresentFailed: 5, PresentPassed: 10}} // Cov .5, Δ .5
	fail := RunInput{Counts: Counts{LackingFailed: 0, PresentFailed: 10, PresentPassed: 10}}
	mk := func(name string, passes, total int) CapabilityRuns {
		c := CapabilityRuns{Name: name}
		for i := 0; i < total; i++ {
			r := fail
			if i < passes {
				r = pass
			}
			c.Runs = append(c.Runs, r)
		}
		return c
	}
	th := Thresholds{Rho: 0.1, Delta: 0.2, K: 8}
	res := Select([]CapabilityRuns{mk("b_cap", 8, 10), mk("a_cap", 8, 10), mk("c_cap", 7, 10), mk("d_cap", 10, 10)}, th)
	var names []string
	for _, r := range res {
		names = append(names, r.Name)
	}
	// d first (highest mean Δ); a and b tie on Δ and Cov, broken by name; c last.
	if want := []string{"d_cap", "a_cap", "b_cap", "c_cap"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("ranking %v, want %v", names, want)
	}
	byName := map[string]Result{}
	for _, r := range res {
		byName[r.Name] = r
	}
	if !byName["a_cap"].Selected || byName["a_cap"].RunsPassed != 8 {
		t.Errorf("8 of 10 passes must select: %+v", byName["a_cap"])
	}
	if c := byName["c_cap"]; c.Selected || !strings.Contains(c.RejectionText(), "passed 7 of 10 runs, needs 8") {
		t.Errorf("7 of 10 must be rejected with a reason: %+v", c)
	}
}

func TestExamplesSortedAsStringsFromUnion(t *testing.T) {
	c := CapabilityRuns{Name: "x", Runs: []RunInput{
		{LackingFailedIDs: []string{"airline:2", "airline:10", "retail:1"}},
		{LackingFailedIDs: []string{"airline:19", "airline:2", "a:1", "a:2", "a:3", "a:4", "a:5"}},
	}}
	r := Select([]CapabilityRuns{c}, DefaultThresholds)[0]
	want := []string{"a:1", "a:2", "a:3", "a:4", "a:5", "airline:10", "airline:19", "airline:2"}
	if !reflect.DeepEqual(r.Examples, want) {
		t.Fatalf("examples %v, want %v", r.Examples, want)
	}
}

func TestRunFileValidation(t *testing.T) {
	ok := `{"attempt":1,"totals":{"total_failed":2,"total_passed":1},"labels":{
	  "cap_a":{"lacking_failed":["t1"],"present_failed":["t2"],"na_failed":[],"lacking_passed":[],"present_passed":["t3"],"na_passed":[]}}}`
	if _, err := ParseRunFile("ok.json", []byte(ok)); err != nil {
		t.Fatalf("valid run rejected: %v", err)
	}
	// Saved by a Windows tool: a UTF-8 byte order mark, CRLF line endings.
	if _, err := ParseRunFile("bom.json", []byte("\ufeff"+strings.ReplaceAll(ok, "\n", "\r\n"))); err != nil {
		t.Fatalf("valid run after a byte order mark rejected: %v", err)
	}
	if _, err := ParseCandidates("bom.json", []byte("\ufeff"+`{"candidates": [{"name": "cap_a", "description": "d"}]}`)); err != nil {
		t.Fatalf("candidates after a byte order mark rejected: %v", err)
	}
	tests := []struct {
		name, body, want string
	}{
		{"duplicate within a list", `{"totals":{"total_failed":2,"total_passed":1},"labels":{"cap_a":{"lacking_failed":["t1","t1"],"present_failed":["t2"],"present_passed":["t3"]}}}`, `capability "cap_a": id "t1" is in lacking_failed twice`},
		{"duplicate across lists", `{"totals":{"total_failed":2,"total_passed":1},"labels":{"cap_a":{"lacking_failed":["t1"],"present_failed":["t1","t2"],"present_passed":["t3"]}}}`, `capability "cap_a": id "t1" is in both lacking_failed and present_failed`},
		{"failed total mismatch", `{"totals":{"total_failed":3,"total_passed":1},"labels":{"cap_a":{"lacking_failed":["t1"],"present_failed":["t2"],"present_passed":["t3"]}}}`, `capability "cap_a": failed lists hold 2 ids, totals.total_failed is 3`},
		{"passed total mismatch", `{"totals":{"total_failed":2,"total_passed":2},"labels":{"cap_a":{"lacking_failed":["t1"],"present_failed":["t2"],"present_passed":["t3"]}}}`, `capability "cap_a": passed lists hold 1 ids`},
		{"outcome differs between capabilities", `{"totals":{"total_failed":1,"total_passed":1},"labels":{"cap_a":{"lacking_failed":["t1"],"present_passed":["t2"]},"cap_b":{"lacking_failed":["t2"],"present_passed":["t1"]}}}`, `capability "cap_b": id "t2" is failed here but passed`},
		{"not json", `{"labels": [`, `bad.json: not a TRACE run file`},
		{"no labels", `{"totals":{"total_failed":0,"total_passed":0}}`, `bad.json: no labels`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRunFile("bad.json", []byte(tt.body))
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "bad.json") {
				t.Fatalf("err = %v, want it to name the file and contain %q", err, tt.want)
			}
		})
	}
}

// TestGoldenTraceRelease re-derives the TRACE authors' published selection
// from their 10 labeling runs.
func TestGoldenTraceRelease(t *testing.T) {
	dir := shareddata.Dir(t, "trace-release/pipeline")
	data, err := os.ReadFile(filepath.Join(dir, "candidate_capabilities.json"))
	if err != nil {
		t.Fatal(err)
	}
	cands, err := ParseCandidates("candidate_capabilities.json", data)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := LoadRuns(filepath.Join(dir, "run_*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 10 {
		t.Fatalf("found %d run files, want 10", len(runs))
	}
	inputs, err := RunsToInputs(cands, runs)
	if err != nil {
		t.Fatal(err)
	}
	var got []schemas.SelectedCapability
	for _, r := range Select(inputs, DefaultThresholds) {
		if r.Selected {
			got = append(got, r.Record())
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "selected_capabilities.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want []schemas.SelectedCapability
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if len(got) != 6 || len(got) != len(want) {
		t.Fatalf("selected %d capabilities, release has %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Skill != w.Skill || g.NRunsPassed != w.NRunsPassed || g.NRunsTotal != w.NRunsTotal ||
			!reflect.DeepEqual(g.ExampleFailedCases, w.ExampleFailedCases) || g.Description != w.Description || !g.PassesConsistency {
			t.Errorf("rank %d: got %+v\nwant %+v", i+1, g, w)
		}
		for _, p := range [][3]any{{"mean_cov", g.MeanCov, w.MeanCov}, {"std_cov", g.StdCov, w.StdCov}, {"mean_delta", g.MeanDelta, w.MeanDelta}, {"std_delta", g.StdDelta, w.StdDelta}} {
			if math.Abs(p[1].(float64)-p[2].(float64)) > 1e-9 {
				t.Errorf("%s %s = %.17g, release %.17g", g.Skill, p[0], p[1], p[2])
			}
		}
	}
}
