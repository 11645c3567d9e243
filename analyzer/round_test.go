package analyzer

import (
	"fmt"
	"testing"

	"github.com/traceops/trace/sink"
)

func TestRoundSize(t *testing.T) {
	co := func(i int) sink.Cohort {
		return sink.Cohort{Environment: "e", AgentVersion: fmt.Sprint(i), DictionaryVersion: 1}
	}
	queue := func(n int) []sink.Cohort {
		q := make([]sink.Cohort, n)
		for i := range q {
			q[i] = co(i)
		}
		return q
	}
	costs := func(cs ...uint64) map[sink.Cohort]uint64 {
		m := map[sink.Cohort]uint64{}
		for i, c := range cs {
			m[co(i)] = c
		}
		return m
	}
	for _, tc := range []struct {
		name  string
		queue []sink.Cohort
		cost  map[sink.Cohort]uint64
		want  int
	}{
		{"empty queue", nil, nil, 0},
		{"no estimates: the batch", queue(40), nil, backgroundBatch},
		{"fewer than a batch", queue(3), nil, 3},
		{"small cohorts: the batch", queue(40), costs(100, 100, 100), backgroundBatch},
		{"a large first cohort alone", queue(5), costs(90_000, 10), 1},
		{"stops before a large one", queue(5), costs(10, 10, 90_000), 2},
		{"up to the budget exactly", queue(5), costs(20_000, 30_000, 1), 2},
		{"past the budget by one label", queue(5), costs(20_000, 30_001), 1},
	} {
		if got := roundSize(tc.queue, tc.cost); got != tc.want {
			t.Errorf("%s: %d cohorts, want %d", tc.name, got, tc.want)
		}
	}
}
