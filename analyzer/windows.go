package analyzer

import (
	"context"
	"maps"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/traceops/trace/sink"
)

// WindowReader is what ReadWindows reads: the cohorts' event-time windows,
// their statistics, and the rollup's estimate of their size. *sink.Store
// implements it.
type WindowReader interface {
	EventSpec(ctx context.Context, cohorts []sink.Cohort, window time.Duration, lastRollouts, runs int) (sink.MultiSpec, map[sink.Cohort]time.Time, error)
	WindowInfoMulti(ctx context.Context, spec sink.MultiSpec) (map[sink.Cohort]sink.WindowInfo, error)
	WindowCountsMulti(ctx context.Context, spec sink.MultiSpec) (map[sink.Cohort][]sink.RunCounts, error)
	// RecentLabels estimates each cohort's labels in the rolled-up hours
	// since a time.
	RecentLabels(ctx context.Context, since time.Time) (map[sink.Cohort]uint64, error)
}

// Windows are the decision windows of cohorts, as the evaluator decides on
// them: each cohort's range (Spec.Ranges) and watermark, the rollouts in it
// and the per-run label counts.
type Windows struct {
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
// the dashboard's and the report's fresh decisions): the window back from
// each cohort's watermark, and, when lastRollouts > 0, only its newest
// lastRollouts rollouts; runs is N. Cohorts of RollupMinLabels or more are
// read through the rollup, the others raw; the reads run at once.
func ReadWindows(ctx context.Context, st WindowReader, cohorts []sink.Cohort, window time.Duration, lastRollouts, runs int) (Windows, error) {
	w := Windows{Infos: map[sink.Cohort]sink.WindowInfo{}, Counts: map[sink.Cohort][]sink.RunCounts{}}
	var err error
	w.Spec, w.Marks, err = st.EventSpec(ctx, cohorts, window, lastRollouts, runs)
	if err != nil || len(w.Spec.Ranges) == 0 {
		return w, err
	}
	big, small := w.Spec, w.Spec
	big.Cohorts, small.Cohorts, small.Raw = nil, nil, true
	if lastRollouts > 0 {
		small.Cohorts = w.Spec.Cohorts // the rollup cannot select the last rollouts
	} else {
		var since time.Time
		for _, r := range w.Spec.Ranges {
			if since.IsZero() || r.From.Before(since) {
				since = r.From
			}
		}
		est, err := st.RecentLabels(ctx, since)
		if err != nil {
			return w, err
		}
		for _, c := range w.Spec.Cohorts {
			if est[c] >= RollupMinLabels {
				big.Cohorts = append(big.Cohorts, c)
			} else {
				small.Cohorts = append(small.Cohorts, c)
			}
		}
	}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for _, spec := range []sink.MultiSpec{big, small} {
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
