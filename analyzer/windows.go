package analyzer

import (
	"context"
	"maps"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/traceops/trace/sink"
)

// WindowReader is what ReadWindows reads: the sources of the cohorts'
// labels, their event-time windows, their statistics, and the rollup's
// estimate of their size. *sink.Store implements it.
type WindowReader interface {
	LabelSources(ctx context.Context, cohorts []sink.Cohort) (map[sink.Cohort][]string, error)
	EventSpec(ctx context.Context, cohorts []sink.Cohort, window time.Duration, lastRollouts, runs int) (sink.MultiSpec, map[sink.Cohort]time.Time, error)
	WindowInfoMulti(ctx context.Context, spec sink.MultiSpec) (map[sink.Cohort]sink.WindowInfo, error)
	WindowCountsMulti(ctx context.Context, spec sink.MultiSpec) (map[sink.Cohort][]sink.RunCounts, error)
	// RecentLabels estimates each cohort's labels in the rolled-up hours
	// since a time.
	RecentLabels(ctx context.Context, since time.Time) (map[sink.Cohort]uint64, error)
}

// Windows are the decision windows of cohorts, as the evaluator decides on
// them: each cohort's K of N, range (Spec.Ranges) and watermark, the
// rollouts in it and the per-run label counts. Spec.Runs is 0: each
// cohort is read with its own N.
type Windows struct {
	KOfN   map[sink.Cohort]KOfN
	Spec   sink.MultiSpec
	Marks  map[sink.Cohort]time.Time
	Infos  map[sink.Cohort]sink.WindowInfo
	Counts map[sink.Cohort][]sink.RunCounts
}

// RollupMinLabels is the size from which a cohort's window is read through
// the hourly rollup: a cohort with fewer labels in the rolled-up hours
// since its window's start is read raw. Both ways give the same numbers;
// the rollup's statement names each cohort four times and reads its
// window's partial hours raw anyway, which costs more than reading a small
// window whole (200 cohorts of a few dozen labels: 1.6–2.1 s through the
// rollup, 0.9–1.6 s raw, at 10M stored).
const RollupMinLabels = 10_000

// ReadWindows reads the decision windows of cohorts (the evaluator's tick,
// the dashboard's and the report's fresh decisions) as cfg sets them: the
// window back from each cohort's watermark (cfg.Window), and, when
// cfg.WindowRollouts > 0, only its newest WindowRollouts rollouts; each
// cohort with its K of N (cfg.KOfN of its labels' sources, read unless
// cfg sets N), its window counting the rollouts labeled in all
// N runs. Cohorts of RollupMinLabels or more are read through the rollup,
// the others raw; the reads run at once.
func ReadWindows(ctx context.Context, st WindowReader, cohorts []sink.Cohort, cfg EvalConfig) (Windows, error) {
	w := Windows{KOfN: map[sink.Cohort]KOfN{}, Infos: map[sink.Cohort]sink.WindowInfo{}, Counts: map[sink.Cohort][]sink.RunCounts{}}
	var sources map[sink.Cohort][]string
	if cfg.N == 0 { // else every cohort's N is cfg's, whatever labeled it
		var err error
		if sources, err = st.LabelSources(ctx, cohorts); err != nil {
			return w, err
		}
	}
	byN := map[int][]sink.Cohort{} // the cohorts of each N, in the given order
	var ns []int
	for _, c := range cohorts {
		kn := cfg.KOfN(sources[c])
		w.KOfN[c] = kn
		if byN[kn.N] == nil {
			ns = append(ns, kn.N)
		}
		byN[kn.N] = append(byN[kn.N], c)
	}
	lastRollouts := cfg.WindowRollouts
	var err error
	w.Spec, w.Marks, err = st.EventSpec(ctx, cohorts, cfg.Window, lastRollouts, 0)
	if err != nil || len(w.Spec.Ranges) == 0 {
		return w, err
	}
	var est map[sink.Cohort]uint64
	if lastRollouts == 0 {
		var since time.Time
		for _, r := range w.Spec.Ranges {
			if since.IsZero() || r.From.Before(since) {
				since = r.From
			}
		}
		if est, err = st.RecentLabels(ctx, since); err != nil {
			return w, err
		}
	}
	// One read of the rollup and one raw per N: a window of N counts the
	// rollouts labeled in all N runs (sink.MultiSpec.Runs).
	var parts []sink.MultiSpec
	for _, n := range ns {
		big, small := w.Spec, w.Spec
		big.Cohorts, small.Cohorts, small.Raw = nil, nil, true
		big.Runs, small.Runs = n, n
		for _, c := range byN[n] {
			if lastRollouts == 0 && est[c] >= RollupMinLabels { // the rollup cannot select the last rollouts
				big.Cohorts = append(big.Cohorts, c)
			} else {
				small.Cohorts = append(small.Cohorts, c)
			}
		}
		parts = append(parts, big, small)
	}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for _, spec := range parts {
		if len(spec.Cohorts) == 0 {
			continue
		}
		g.Go(func() error {
			infos, err := st.WindowInfoMulti(gctx, spec)
			merge(&mu, w.Infos, infos)
			return err
		})
		g.Go(func() error {
			counts, err := st.WindowCountsMulti(gctx, spec)
			merge(&mu, w.Counts, counts)
			return err
		})
	}
	return w, g.Wait()
}

// merge copies src into dst under mu (the reads of ReadWindows run at once).
func merge[V any](mu *sync.Mutex, dst, src map[sink.Cohort]V) {
	mu.Lock()
	defer mu.Unlock()
	maps.Copy(dst, src)
}
