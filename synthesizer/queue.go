package synthesizer

import (
	"sort"
	"time"
)

// queue orders the requests a worker holds: one capability at a time per
// environment, and within an environment the highest mean Δ first
// (TRACE-METHOD.md step 1.4; then the request's rank, 1 = highest), then
// the oldest.
// Mean Δ decides first, since ranks of different cohorts do not compare.
// It is pure: the worker adds what it fetched and asks for the next job
// whose environment is not busy.
type queue[T any] struct {
	items []queued[T]
	seq   uint64
}

type queued[T any] struct {
	env   string
	rank  int // 0 (unranked) sorts after every rank
	delta float64
	fired time.Time
	seq   uint64
	v     T
}

func (q *queue[T]) add(env string, rank int, delta float64, fired time.Time, v T) {
	q.seq++
	q.items = append(q.items, queued[T]{env: env, rank: rank, delta: delta, fired: fired, seq: q.seq, v: v})
}

func (q *queue[T]) len() int { return len(q.items) }

// next removes and returns the first job, in priority order, whose
// environment is not busy.
func (q *queue[T]) next(busy func(env string) bool) (T, string, bool) {
	sort.SliceStable(q.items, func(i, j int) bool { return before(q.items[i], q.items[j]) })
	for i, it := range q.items {
		if busy(it.env) {
			continue
		}
		q.items = append(q.items[:i], q.items[i+1:]...)
		return it.v, it.env, true
	}
	var zero T
	return zero, "", false
}

// each calls fn on every held job (for heartbeats and shutdown).
func (q *queue[T]) each(fn func(T)) {
	for _, it := range q.items {
		fn(it.v)
	}
}

// drain removes every job.
func (q *queue[T]) drain() []T {
	out := make([]T, len(q.items))
	for i, it := range q.items {
		out[i] = it.v
	}
	q.items = nil
	return out
}

func before[T any](a, b queued[T]) bool {
	ra, rb := a.rank, b.rank
	if ra <= 0 {
		ra = int(^uint(0) >> 1)
	}
	if rb <= 0 {
		rb = int(^uint(0) >> 1)
	}
	switch {
	case a.delta != b.delta: // within a cohort the rank is this order; across cohorts Δ compares
		return a.delta > b.delta
	case ra != rb:
		return ra < rb
	case !a.fired.Equal(b.fired):
		return a.fired.Before(b.fired)
	}
	return a.seq < b.seq
}
