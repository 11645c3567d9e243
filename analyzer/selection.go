// Package analyzer turns capability labels into decisions.
//
// selection.go is the exact statistics core of TRACE (TRACE-METHOD.md, step 1):
// per capability and labeling run ER−, ER+, Δ and Cov; the run pass rule; the
// K-of-N selection; population standard deviations; the example failure ids;
// and the ranking. It does no I/O. The offline path (`trace select` over run
// files) and the streaming path (window counts read from ClickHouse) both feed
// it, so there is one implementation of the math.
package analyzer

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/traceops/trace/schemas"
)

// Thresholds of the selection rule.
type Thresholds struct {
	Rho   float64 // minimum coverage Cov in a run (default 0.10)
	Delta float64 // minimum contrastive gap Δ in a run (default 0.20)
	K     int     // runs that must pass (default 8 of N = 10)
}

// DefaultThresholds are the paper's defaults.
var DefaultThresholds = Thresholds{Rho: 0.10, Delta: 0.20, K: 8}

// Validate reports a threshold outside its domain.
func (t Thresholds) Validate() error {
	switch {
	case t.Rho < 0 || t.Rho > 1 || math.IsNaN(t.Rho):
		return fmt.Errorf("rho must be in [0, 1], got %v", t.Rho)
	case t.Delta < -1 || t.Delta > 1 || math.IsNaN(t.Delta):
		return fmt.Errorf("delta must be in [-1, 1], got %v", t.Delta)
	case t.K < 1:
		return fmt.Errorf("k must be at least 1, got %d", t.K)
	}
	return nil
}

// Counts are the label counts of one capability in one labeling run.
// Failed means reward < 1 (or success=false); NA counts are part of |failed|.
type Counts struct {
	LackingFailed, PresentFailed, NAFailed int
	LackingPassed, PresentPassed, NAPassed int
}

// Failed is |failed|: every failed trajectory labeled in this run, NA included.
func (c Counts) Failed() int { return c.LackingFailed + c.PresentFailed + c.NAFailed }

// Passed is the number of passed trajectories labeled in this run.
func (c Counts) Passed() int { return c.LackingPassed + c.PresentPassed + c.NAPassed }

// Add returns the element-wise sum.
func (c Counts) Add(o Counts) Counts {
	return Counts{
		c.LackingFailed + o.LackingFailed, c.PresentFailed + o.PresentFailed, c.NAFailed + o.NAFailed,
		c.LackingPassed + o.LackingPassed, c.PresentPassed + o.PresentPassed, c.NAPassed + o.NAPassed,
	}
}

// RunStats are the statistics of one capability in one run.
type RunStats struct {
	ERFailed float64 // ER− = L− / (L− + P−)
	ERPassed float64 // ER+ = L+ / (L+ + P+)
	Delta    float64 // Δ = ER− − ER+
	Cov      float64 // Cov = L− / |failed|
	Passed   bool    // Cov ≥ ρ and Δ ≥ δ
}

func ratio(num, den int) float64 {
	if den == 0 {
		return 0
	}
	return float64(num) / float64(den)
}

// ComputeRun applies the formulas of TRACE-METHOD.md to one run. Any ratio
// whose denominator is 0 is 0.
func ComputeRun(c Counts, t Thresholds) RunStats {
	s := RunStats{
		ERFailed: ratio(c.LackingFailed, c.LackingFailed+c.PresentFailed),
		ERPassed: ratio(c.LackingPassed, c.LackingPassed+c.PresentPassed),
		Cov:      ratio(c.LackingFailed, c.Failed()),
	}
	s.Delta = s.ERFailed - s.ERPassed
	s.Passed = s.Cov >= t.Rho && s.Delta >= t.Delta
	return s
}

// RunInput is one labeling run of one capability.
type RunInput struct {
	Counts
	// LackingFailedIDs are the trajectories labeled LACKING on failures; they
	// feed the example ids. May be nil when only counts are known.
	LackingFailedIDs []string
}

// CapabilityRuns is the input for one capability: its runs, in run order.
type CapabilityRuns struct {
	Name        string
	Description string
	Runs        []RunInput
}

// MaxExamples is the number of example failed trajectory ids reported.
const MaxExamples = 8

// Result is the selection outcome of one capability.
type Result struct {
	Name        string
	Description string
	PerRun      []RunStats
	MeanCov     float64
	StdCov      float64 // population std (ddof 0)
	MeanDelta   float64
	StdDelta    float64 // population std (ddof 0)
	MeanERFail  float64
	MeanERPass  float64
	RunsPassed  int
	RunsTotal   int
	Selected    bool // RunsPassed ≥ K
	Examples    []string
	// Rejection explains, for a capability that is not selected, why.
	Rejection []string
}

// Select computes every capability's statistics and decision and returns them
// ranked by mean Δ, highest first (the order in which environments are
// synthesized). Ties on mean Δ are broken by higher mean Cov, then by name, so
// the ranking is deterministic.
func Select(caps []CapabilityRuns, t Thresholds) []Result {
	out := make([]Result, 0, len(caps))
	for _, c := range caps {
		out = append(out, evaluate(c, t))
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.MeanDelta != b.MeanDelta {
			return a.MeanDelta > b.MeanDelta
		}
		if a.MeanCov != b.MeanCov {
			return a.MeanCov > b.MeanCov
		}
		return a.Name < b.Name
	})
	return out
}

func evaluate(c CapabilityRuns, t Thresholds) Result {
	r := Result{Name: c.Name, Description: c.Description, RunsTotal: len(c.Runs)}
	covs := make([]float64, len(c.Runs))
	deltas := make([]float64, len(c.Runs))
	erf := make([]float64, len(c.Runs))
	erp := make([]float64, len(c.Runs))
	union := map[string]struct{}{}
	lowCov, lowDelta := 0, 0
	for i, run := range c.Runs {
		s := ComputeRun(run.Counts, t)
		r.PerRun = append(r.PerRun, s)
		covs[i], deltas[i], erf[i], erp[i] = s.Cov, s.Delta, s.ERFailed, s.ERPassed
		if s.Passed {
			r.RunsPassed++
		}
		if s.Cov < t.Rho {
			lowCov++
		}
		if s.Delta < t.Delta {
			lowDelta++
		}
		for _, id := range run.LackingFailedIDs {
			union[id] = struct{}{}
		}
	}
	r.MeanCov, r.StdCov = MeanStd(covs)
	r.MeanDelta, r.StdDelta = MeanStd(deltas)
	r.MeanERFail, _ = MeanStd(erf)
	r.MeanERPass, _ = MeanStd(erp)
	r.Selected = r.RunsPassed >= t.K
	ids := make([]string, 0, len(union))
	for id := range union {
		ids = append(ids, id)
	}
	sort.Strings(ids) // as strings: "airline:19" < "airline:2"
	if len(ids) > MaxExamples {
		ids = ids[:MaxExamples]
	}
	r.Examples = ids
	if !r.Selected {
		r.Rejection = append(r.Rejection, fmt.Sprintf("passed %d of %d runs, needs %d", r.RunsPassed, r.RunsTotal, t.K))
		if lowCov > 0 {
			r.Rejection = append(r.Rejection, fmt.Sprintf("Cov < %.2f in %d runs", t.Rho, lowCov))
		}
		if lowDelta > 0 {
			r.Rejection = append(r.Rejection, fmt.Sprintf("Δ < %.2f in %d runs", t.Delta, lowDelta))
		}
	}
	return r
}

// RejectionText joins the rejection reasons for display.
func (r Result) RejectionText() string { return strings.Join(r.Rejection, "; ") }

// MeanStd returns the mean and the population standard deviation (ddof 0) of
// xs, summed the way numpy sums float64 arrays (pairwise summation), so that
// results agree with the TRACE release to the last bit. Empty input gives 0, 0.
func MeanStd(xs []float64) (mean, std float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	n := float64(len(xs))
	mean = pairwiseSum(xs) / n
	sq := make([]float64, len(xs))
	for i, x := range xs {
		d := x - mean
		sq[i] = d * d
	}
	return mean, math.Sqrt(pairwiseSum(sq) / n)
}

// pairwiseSum is numpy's pairwise_sum for contiguous float64 data
// (numpy/_core/src/umath/loops_utils.h.src): plain loop below 8 elements,
// eight accumulators up to 128, recursive halves above.
func pairwiseSum(a []float64) float64 {
	n := len(a)
	switch {
	case n < 8:
		res := 0.0
		for _, x := range a {
			res += x
		}
		return res
	case n <= 128:
		var r [8]float64
		copy(r[:], a[:8])
		i := 8
		for ; i < n-(n%8); i += 8 {
			for j := 0; j < 8; j++ {
				r[j] += a[i+j]
			}
		}
		res := ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
		for ; i < n; i++ {
			res += a[i]
		}
		return res
	default:
		n2 := n / 2
		n2 -= n2 % 8
		return pairwiseSum(a[:n2]) + pairwiseSum(a[n2:])
	}
}

// Record converts a result to the TRACE release's selected-capability record.
func (r Result) Record() schemas.SelectedCapability {
	ex := r.Examples
	if ex == nil {
		ex = []string{}
	}
	return schemas.SelectedCapability{
		Skill: r.Name, Description: r.Description,
		MeanCov: r.MeanCov, StdCov: r.StdCov, MeanDelta: r.MeanDelta, StdDelta: r.StdDelta,
		NRunsPassed: r.RunsPassed, NRunsTotal: r.RunsTotal, PassesConsistency: r.Selected,
		ExampleFailedCases: ex, Status: "PENDING",
	}
}
