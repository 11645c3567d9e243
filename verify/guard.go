package verify

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/traceops/trace/sink"
)

// The guard's sequential rule.
//
// The verdict (Compare) is a fixed-sample statement at 95 % about the
// most recent routed rollouts. The guard cannot act on it at every tick:
// each tick would be another 5 % chance of a false alarm, and over an
// adapter's life an adapter that changed nothing would be rolled back
// sooner or later. So the guard decides at planned looks instead, and
// spends its error rate over them:
//
//   - look k (k = 1 … GuardLooks) is the routed rollouts from activation
//     on, in order of end time, up to the one that brings the rollouts
//     that need the capability to 2·MinFailures·2^(k−1). The looks are
//     counted in rollouts that need the capability, whatever their
//     outcome: a look that ended at a given number of failures would
//     end at a failure, and its pass rate would be biased low (a
//     negative binomial sample), which is a false alarm waiting to
//     happen. A look with fewer than MinFailures failures among them
//     cannot decide (not_enough_data), as the verdict cannot;
//   - each look is tested with intervals at 1 − GuardAlpha/GuardLooks
//     (compareLook);
//   - a tick between two looks tests the last look reached, on the same
//     rollouts, so it repeats that look's decision; after the last look
//     the decision stays.
//
// The looks make at most GuardLooks tests over an adapter's life, so the
// chance that they ever roll back an adapter that changed nothing is at
// most GuardAlpha (Bonferroni; the looks' overlap only lowers it); the
// price is that a harm has to show at the stricter level.
//
// Once the looks are over (the last one reached, or the first
// sample_limit routed rollouts read without reaching it), the guard
// watches for a harm that begins later: watch block j (1, 2, …) is the
// routed rollouts that ended in [T + (j−1)·W, T + j·W), where T follows the
// looks' last rollout and W is the time from activation to it (at least an
// hour). At every tick the guard tests the last complete block (so each
// block is tested while it is the last complete one, on the same
// rollouts) at level 1 − α_j, α_j = GuardWatchAlpha · 6/(π² j²): the α_j
// of all blocks sum to GuardWatchAlpha, so over the adapter's whole life
// the guard rolls back one that changed nothing with a chance of at most
// GuardAlpha + GuardWatchAlpha. Later blocks are tested more strictly
// (block 10 at 99.994 % with the default 0.01), so the watch catches
// large late harms, not small ones.

// maxGuardLooks bounds Config.GuardLooks (a last look at
// 2·MinFailures·2^19 rollouts is beyond any sample).
const maxGuardLooks = 20

// GuardDecision is the guard's sequential test of one adapter.
type GuardDecision struct {
	// Look is the look tested (1 … Looks); 0 before the first.
	Look  int `json:"look"`
	Looks int `json:"looks"`
	// Needed is the look's size: its routed rollouts that need the
	// capability.
	Needed int `json:"needed"`
	// Level is the confidence level of the look's intervals.
	Level float64 `json:"level"`
	// Worse: the look's pass rate is significantly lower, or its Δ
	// significantly higher, at Level; the guard rolls the adapter back.
	Worse  bool   `json:"worse"`
	Reason string `json:"reason"`
	// Comparison is the look's (absent before the first look).
	Comparison *Comparison `json:"comparison,omitempty"`
	// LooksEnd is the end time of the looks' last rollout, once the looks
	// are over; the watch starts after it.
	LooksEnd time.Time `json:"looks_end,omitzero"`
	// Watch is the test of the last complete watch block, once there is
	// one.
	Watch *WatchDecision `json:"watch,omitempty"`
}

// WatchDecision is the guard's test of one watch block.
type WatchDecision struct {
	Block int `json:"block"`
	// From and To bound the block's end times: From ≤ end < To.
	From  time.Time `json:"from"`
	To    time.Time `json:"to"`
	Level float64   `json:"level"`
	// Worse: the block is significantly worse at Level; the guard rolls
	// the adapter back.
	Worse      bool        `json:"worse"`
	Reason     string      `json:"reason"`
	Comparison *Comparison `json:"comparison,omitempty"`
}

// RollBack says whether the guard rolls the adapter back: its look or its
// watch block is worse.
func (g GuardDecision) RollBack() bool { return g.Worse || g.watchDecides() }

// watchDecides says whether the watch block, not the look, is the worse
// test that decides.
func (g GuardDecision) watchDecides() bool { return !g.Worse && g.Watch != nil && g.Watch.Worse }

// RollBackReason is the reason of the test that is worse: the look's, or
// the watch block's.
func (g GuardDecision) RollBackReason() string {
	if g.watchDecides() {
		return g.Watch.Reason
	}
	return g.Reason
}

// Summary is the guard's state in one line: the look's reason, and the
// watch block's.
func (g GuardDecision) Summary() string {
	if g.Watch == nil {
		return g.Reason
	}
	return g.Reason + "; " + g.Watch.Reason
}

// minWatchBlock is the shortest watch block.
const minWatchBlock = time.Hour

// watchBlock is the last complete watch block at now of an adapter
// activated at activated whose looks ended at looksEnd: its number j ≥ 1
// and its span [from, to), whole seconds (as end times are stored); j = 0
// when there is none yet (or the looks are not over).
func watchBlock(activated, looksEnd, now time.Time) (j int, from, to time.Time) {
	if looksEnd.IsZero() {
		return 0, time.Time{}, time.Time{}
	}
	t := looksEnd.Truncate(time.Second).Add(time.Second)
	w := max(t.Sub(activated), minWatchBlock)
	w = (w + time.Second - 1).Truncate(time.Second)
	j = int(now.Sub(t) / w)
	if j < 1 {
		return 0, time.Time{}, time.Time{}
	}
	return j, t.Add(time.Duration(j-1) * w), t.Add(time.Duration(j) * w)
}

// watchAlpha is α_j of watch block j.
func (c Config) watchAlpha(j int) float64 {
	return c.GuardWatchAlpha * 6 / (math.Pi * math.Pi * float64(j) * float64(j))
}

// watchDecide tests watch block j (its rollouts block) against before.
func watchDecide(before, block Sample, cfg Config, j int, from, to time.Time) WatchDecision {
	alpha := cfg.watchAlpha(j)
	w := WatchDecision{Block: j, From: from.UTC(), To: to.UTC(), Level: 1 - alpha}
	c := compareLook(before, block, cfg, alpha)
	w.Comparison = &c
	at := fmt.Sprintf("watch block %d (%d routed rollouts that ended %s – %s; %s %% intervals)",
		j, block.Len(), w.From.Format(time.RFC3339), w.To.Format(time.RFC3339), strconv.FormatFloat(100*w.Level, 'g', 5, 64))
	switch c.Verdict {
	case Worse:
		w.Worse = true
		w.Reason = c.Reason + " in the " + at
	case NotEnoughData:
		w.Reason = at + ": " + c.Reason
	default:
		w.Reason = "not significantly worse in the " + at
	}
	return w
}

// guardLook returns the last look reached by after (its rollouts in order
// of end time), whose first look is at first rollouts that need the
// capability: k in 1 … looks, or 0 before the first, and the number of
// after's rollouts it covers.
func guardLook(after Sample, first, looks int) (k, n int) {
	next := first
	need := 0
	for i := range after.success {
		if !after.needs(i) {
			continue
		}
		if need++; need == next {
			k, n = k+1, i+1
			if k == looks {
				break
			}
			next *= 2
		}
	}
	return k, n
}

// compareLook is a look's comparison at level 1 − alpha. Its intervals
// are all score intervals, no bootstrap: Wilson for the proportions,
// Newcombe's hybrid for a difference of two (the pass-rate change, and
// each side's Δ = ER− − ER+), and MOVER (Newcombe's method for sums of
// such differences; Zou & Donner 2008) for the change of Δ. At the looks'
// levels (99 % and beyond) the percentile bootstrap the verdict uses is
// too narrow on samples of tens of failures: in 1,000 simulated looks of
// 20 rollouts that need the capability (alpha 0.0125) it gave 17 false
// alarms on Δ where about 6 were due; these intervals gave 0.
func compareLook(before, after Sample, cfg Config, alpha float64) Comparison {
	z := zOf(alpha)
	c := Comparison{Before: before.pointZ(z), After: after.pointZ(z)}
	for _, st := range []*Stats{&c.Before, &c.After} {
		d := Newcombe(st.ERPassed, st.ERFailed)
		st.Delta.Lo, st.Delta.Hi = max(-1, st.Delta.Value-(d.Value-d.Lo)), min(1, st.Delta.Value+(d.Hi-d.Value))
	}
	b, a := c.Before, c.After
	d := a.Delta.Value - b.Delta.Value
	lo := math.Sqrt(sq(a.ERFailed.Value-a.ERFailed.Lo) + sq(a.ERPassed.Hi-a.ERPassed.Value) +
		sq(b.ERFailed.Hi-b.ERFailed.Value) + sq(b.ERPassed.Value-b.ERPassed.Lo))
	hi := math.Sqrt(sq(a.ERFailed.Hi-a.ERFailed.Value) + sq(a.ERPassed.Value-a.ERPassed.Lo) +
		sq(b.ERFailed.Value-b.ERFailed.Lo) + sq(b.ERPassed.Hi-b.ERPassed.Value))
	c.DeltaChange = Interval{Value: d, Lo: d - lo, Hi: d + hi}
	c.PassRateChange = Newcombe(c.Before.PassRate, c.After.PassRate)
	c.Verdict, c.Reason = decide(c, cfg)
	return c
}

// guardDecide is the guard's test of an adapter at its looks: before is
// the verdict's before side, after the routed rollouts from activation on
// in order of end time (byEndTime), full when they are the first
// sample_limit (more were routed). cfg must have its defaults.
func guardDecide(before, after Sample, cfg Config, full bool) GuardDecision {
	g := GuardDecision{Looks: cfg.GuardLooks, Level: cfg.GuardLevel()}
	alpha := 1 - g.Level
	first := 2 * cfg.MinFailures
	k, n := guardLook(after, first, cfg.GuardLooks)
	switch {
	case k == cfg.GuardLooks:
		g.LooksEnd = after.ends[n-1]
	case full && after.Len() > 0:
		g.LooksEnd = after.ends[after.Len()-1]
	}
	if k == 0 {
		g.Reason = fmt.Sprintf("the guard's first look needs %d routed rollouts that need the capability", first)
		return g
	}
	g.Look, g.Needed = k, first<<(k-1)
	c := compareLook(before, after.prefix(n), cfg, alpha)
	g.Comparison = &c
	at := fmt.Sprintf("at the guard's look %d of %d (the first %d routed rollouts, %d that need the capability; %s %% intervals)",
		k, g.Looks, n, g.Needed, Pct(g.Level))
	g.Worse = c.Verdict == Worse
	if g.Worse || c.Verdict == NotEnoughData {
		g.Reason = c.Reason + " " + at
	} else {
		g.Reason = "not significantly worse " + at
	}
	return g
}

// GuardLevel is the confidence level of each of the guard's looks.
func (c Config) GuardLevel() float64 { return 1 - c.GuardAlpha/float64(c.GuardLooks) }

// Pct formats a level as a percentage to one decimal (95, 99.2).
func Pct(level float64) string {
	return strconv.FormatFloat(math.Round(1000*level)/10, 'f', -1, 64)
}

// byEndTime orders a side's rollouts by end time (then id), the order the
// guard's looks take them in.
func byEndTime(rs []sink.RolloutLabels) []sink.RolloutLabels {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b sink.RolloutLabels) int {
		return cmp.Or(a.EndTime.Compare(b.EndTime), cmp.Compare(a.RolloutID, b.RolloutID))
	})
	return rs
}
