package verify

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/sink"
)

// z95 is the standard normal quantile of a two-sided 95 % interval.
const z95 = 1.959963984540054

// Interval is an estimate with its 95 % confidence interval [Lo, Hi].
type Interval struct {
	Value float64 `json:"value"`
	Lo    float64 `json:"lo"`
	Hi    float64 `json:"hi"`
}

func (i Interval) String() string { return fmt.Sprintf("%.3f [%.3f, %.3f]", i.Value, i.Lo, i.Hi) }

// zOf is the standard normal quantile of a two-sided interval at level
// 1 − alpha (zOf(0.05) = z95).
func zOf(alpha float64) float64 { return math.Sqrt2 * math.Erfinv(1-alpha) }

// Wilson is the Wilson score interval of a proportion p observed on n
// trials (n may be fractional: a mean over labeling runs). n = 0 gives
// [0, 1].
func Wilson(p, n float64) Interval { return wilsonZ(p, n, z95) }

// wilsonZ is Wilson's interval with the normal quantile z.
func wilsonZ(p, n, z float64) Interval {
	if n <= 0 {
		return Interval{Value: p, Lo: 0, Hi: 1}
	}
	z2 := z * z
	den := 1 + z2/n
	center := (p + z2/(2*n)) / den
	half := z * math.Sqrt(p*(1-p)/n+z2/(4*n*n)) / den
	return Interval{Value: p, Lo: max(0, center-half), Hi: min(1, center+half)}
}

// Newcombe is the interval of the difference after − before of two
// independent proportions from their Wilson intervals (Newcombe 1998,
// method 10, the hybrid score interval).
func Newcombe(before, after Interval) Interval {
	d := after.Value - before.Value
	lo := d - math.Sqrt(sq(after.Value-after.Lo)+sq(before.Hi-before.Value))
	hi := d + math.Sqrt(sq(after.Hi-after.Value)+sq(before.Value-before.Lo))
	return Interval{Value: d, Lo: lo, Hi: hi}
}

func sq(x float64) float64 { return x * x }

// Label codes of a sample.
const (
	labelNA      int8 = 0
	labelPresent int8 = 1
	labelLacking int8 = 2
)

// Sample is one side of a comparison: complete labeled rollouts of one
// capability, every rollout labeled in each of Runs runs.
type Sample struct {
	Runs    int
	success []bool
	labels  [][]int8 // [rollout][run]
	ends    []time.Time
	// Incomplete counts the rollouts left out because some run had not
	// labeled them (yet), or labeled them with an unknown label.
	Incomplete int
	// From and To are the end times of the sample's earliest and latest
	// rollout (zero without rollouts): the data the statistics rest on.
	From, To time.Time
}

// Len is the number of rollouts in the sample.
func (s Sample) Len() int { return len(s.success) }

// NewSample keeps the rollouts labeled in every run: the number of runs is
// the most any rollout of the sample has. A rollout whose runs are still
// arriving is left out (and counted) instead of skewing one run's ratios,
// as the analyzer's windows do.
func NewSample(rs []sink.RolloutLabels) Sample { return NewSampleOfRuns(rs, 0) }

// NewSampleOfRuns keeps the rollouts labeled in runs 0 to runs−1, as the
// selection does with its N (sink.WindowSpec.Runs): a rollout labeled in
// more runs (before the number of runs was lowered) counts with its first
// runs, one labeled in fewer is left out and counted. runs ≤ 0: the most
// any rollout of the sample has (NewSample).
func NewSampleOfRuns(rs []sink.RolloutLabels, runs int) Sample {
	if runs <= 0 {
		for _, r := range rs {
			runs = max(runs, len(r.Labels))
		}
	}
	s := Sample{Runs: runs}
next:
	for _, r := range rs {
		if len(r.Labels) < runs {
			s.Incomplete++
			continue
		}
		ls := make([]int8, runs)
		for i, l := range r.Labels[:runs] {
			switch l {
			case "NA":
				ls[i] = labelNA
			case "PRESENT":
				ls[i] = labelPresent
			case "LACKING":
				ls[i] = labelLacking
			default:
				s.Incomplete++
				continue next
			}
		}
		s.success = append(s.success, r.Success)
		s.labels = append(s.labels, ls)
		s.ends = append(s.ends, r.EndTime)
		s.span(r.EndTime)
	}
	return s
}

// span widens From and To to an end time (a zero one is not known).
func (s *Sample) span(end time.Time) {
	if end.IsZero() {
		return
	}
	if s.From.IsZero() || end.Before(s.From) {
		s.From = end
	}
	if end.After(s.To) {
		s.To = end
	}
}

// prefix is the sample's first n rollouts (Incomplete is the whole
// sample's).
func (s Sample) prefix(n int) Sample {
	p := Sample{Runs: s.Runs, success: s.success[:n], labels: s.labels[:n], ends: s.ends[:n], Incomplete: s.Incomplete}
	for _, e := range p.ends {
		p.span(e)
	}
	return p
}

// needs says whether rollout i needs the capability: labeled PRESENT or
// LACKING in at least half of the runs.
func (s Sample) needs(i int) bool {
	need := 0
	for _, l := range s.labels[i] {
		if l != labelNA {
			need++
		}
	}
	return s.Runs > 0 && 2*need >= s.Runs
}

// counts are the per-run label counts of the rollouts idx (all when nil).
func (s Sample) counts(idx []int) []analyzer.Counts {
	cs := make([]analyzer.Counts, s.Runs)
	add := func(i int) {
		for r, l := range s.labels[i] {
			c := &cs[r]
			switch {
			case !s.success[i] && l == labelLacking:
				c.LackingFailed++
			case !s.success[i] && l == labelPresent:
				c.PresentFailed++
			case !s.success[i]:
				c.NAFailed++
			case l == labelLacking:
				c.LackingPassed++
			case l == labelPresent:
				c.PresentPassed++
			default:
				c.NAPassed++
			}
		}
	}
	if idx == nil {
		for i := range s.success {
			add(i)
		}
	} else {
		for _, i := range idx {
			add(i)
		}
	}
	return cs
}

// meanDelta is the mean over runs of Δ = ER− − ER+ (analyzer.ComputeRun),
// summed as the selection's report sums it (analyzer.MeanStd): a plain
// sum of ten runs of Δ = 0.20 is 0.19999999999999998, below δ.
func meanDelta(cs []analyzer.Counts) float64 {
	ds := make([]float64, len(cs))
	for i, c := range cs {
		ds[i] = analyzer.ComputeRun(c, analyzer.DefaultThresholds).Delta
	}
	m, _ := analyzer.MeanStd(ds)
	return m
}

// Stats are a capability's statistics on one side of the comparison.
//
// ER−, ER+, Δ and Cov are TRACE's (analyzer.ComputeRun per labeling run,
// then the mean over runs, as the selection reports them). Their
// intervals: Wilson for the proportions ER−, ER+ and Cov, with n the mean
// number of rollouts in the ratio's denominator per run (labels of one
// rollout in different runs are not independent trials, so n counts
// rollouts, not labels); a percentile bootstrap over rollouts for Δ.
//
// PassRate is the share of passed rollouts among those that need the
// capability (labeled PRESENT or LACKING in at least half of the runs), so
// that routed rollouts — chosen because they need it — are compared with
// the same kind of rollouts before activation; Wilson interval.
//
// NeededFailures are the failures among the Needed rollouts: the ones ER−
// is about (a failure labeled NA says nothing about the gap), and what the
// verdict's minimum counts (Config.MinFailures).
type Stats struct {
	Rollouts       int      `json:"rollouts"`
	Failures       int      `json:"failures"`
	Needed         int      `json:"needed"`
	NeededFailures int      `json:"needed_failures"`
	Runs           int      `json:"runs"`
	Incomplete     int      `json:"incomplete,omitempty"`
	ERFailed       Interval `json:"er_failed"`
	ERPassed       Interval `json:"er_passed"`
	Delta          Interval `json:"delta"`
	Cov            Interval `json:"cov"`
	PassRate       Interval `json:"pass_rate"`
	// From and To: the end times of the earliest and the latest rollout
	// counted (absent without rollouts).
	From time.Time `json:"from,omitzero"`
	To   time.Time `json:"to,omitzero"`
}

// Span dates the side's rollouts, the end times of its first and last,
// with ts formatting them: "ended <from> – <to>", or "no labeled rollouts".
func (s Stats) Span(ts func(time.Time) string) string {
	if s.Rollouts == 0 {
		return "no labeled rollouts"
	}
	return "ended " + ts(s.From) + " – " + ts(s.To)
}

// point computes everything but Δ's interval, with 95 % intervals.
func (s Sample) point() Stats { return s.pointZ(z95) }

// pointZ is point with the normal quantile z.
func (s Sample) pointZ(z float64) Stats {
	st := Stats{Rollouts: s.Len(), Runs: s.Runs, Incomplete: s.Incomplete, From: s.From, To: s.To}
	passedNeeded := 0
	for i, ok := range s.success {
		if !ok {
			st.Failures++
		}
		if s.needs(i) {
			st.Needed++
			if ok {
				passedNeeded++
			} else {
				st.NeededFailures++
			}
		}
	}
	cs := s.counts(nil)
	var erf, erp, cov, delta, nf, np []float64
	for _, c := range cs {
		r := analyzer.ComputeRun(c, analyzer.DefaultThresholds)
		erf, erp, cov, delta = append(erf, r.ERFailed), append(erp, r.ERPassed), append(cov, r.Cov), append(delta, r.Delta)
		nf, np = append(nf, float64(c.LackingFailed+c.PresentFailed)), append(np, float64(c.LackingPassed+c.PresentPassed))
	}
	mean := func(xs []float64) float64 { m, _ := analyzer.MeanStd(xs); return m }
	st.ERFailed = wilsonZ(mean(erf), mean(nf), z)
	st.ERPassed = wilsonZ(mean(erp), mean(np), z)
	st.Cov = wilsonZ(mean(cov), float64(st.Failures), z)
	st.Delta = Interval{Value: mean(delta), Lo: -1, Hi: 1}
	st.PassRate = wilsonZ(ratio(passedNeeded, st.Needed), float64(st.Needed), z)
	return st
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// resample draws n indices with replacement into idx.
func resample(rng *rand.Rand, idx []int, n int) []int {
	idx = idx[:0]
	for range n {
		idx = append(idx, rng.IntN(n))
	}
	return idx
}

// percentile is the q-quantile of sorted xs (linear interpolation).
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	pos := q * float64(len(xs)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(xs)-1)
	return xs[lo] + (pos-float64(lo))*(xs[hi]-xs[lo])
}

// bootstrapDelta returns the percentile intervals of Δ before, Δ after
// and their difference after − before, from b resamples of each side's
// rollouts (independently), drawn from rng. A side without rollouts has
// Δ's whole range [-1, 1] and the difference [-2, 2]; the other side is
// still bootstrapped.
func bootstrapDelta(before, after Sample, b int, rng *rand.Rand) (db, da, diff Interval) {
	pb, pa := meanDelta(before.counts(nil)), meanDelta(after.counts(nil))
	db, da, diff = Interval{Value: pb, Lo: pb, Hi: pb}, Interval{Value: pa, Lo: pa, Hi: pa}, Interval{Value: pa - pb, Lo: pa - pb, Hi: pa - pb}
	if b > 0 {
		xb, xa, xd := make([]float64, b), make([]float64, b), make([]float64, b)
		var ib, ia []int
		for k := range b {
			if before.Len() > 0 {
				ib = resample(rng, ib, before.Len())
				xb[k] = meanDelta(before.counts(ib))
			}
			if after.Len() > 0 {
				ia = resample(rng, ia, after.Len())
				xa[k] = meanDelta(after.counts(ia))
			}
			xd[k] = xa[k] - xb[k]
		}
		for _, p := range []struct {
			xs []float64
			iv *Interval
		}{{xb, &db}, {xa, &da}, {xd, &diff}} {
			slices.Sort(p.xs)
			p.iv.Lo, p.iv.Hi = percentile(p.xs, 0.025), percentile(p.xs, 0.975)
		}
	}
	if before.Len() == 0 {
		db.Lo, db.Hi = -1, 1
	}
	if after.Len() == 0 {
		da.Lo, da.Hi = -1, 1
	}
	if before.Len() == 0 || after.Len() == 0 {
		diff.Lo, diff.Hi = -2, 2
	}
	return db, da, diff
}
