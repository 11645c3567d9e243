package synthesizer

import (
	"fmt"
	"testing"
	"time"
)

func TestQueueOneCapabilityAtATimeHighestDeltaFirst(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	var q queue[string]
	q.add("airline", 2, 0.57, t0, "airline/precondition")
	q.add("airline", 1, 0.60, t0, "airline/multi_step")
	q.add("retail", 1, 0.82, t0.Add(time.Second), "retail/grounding")
	q.add("airline", 3, 0.41, t0, "airline/confirm")
	q.add("airline", 0, 0.41, t0.Add(-time.Hour), "airline/older-unranked")
	q.add("retail", 2, 0.82, t0, "retail/tie-on-delta-rank-2")

	busy := map[string]bool{}
	isBusy := func(env string) bool { return busy[env] }
	var order []string
	take := func() (string, bool) {
		v, env, ok := q.next(isBusy)
		if ok {
			busy[env] = true
			order = append(order, v)
		}
		return env, ok
	}
	// Two workers' worth: one job per environment at once.
	a, _ := take()
	b, _ := take()
	if _, ok := take(); ok {
		t.Fatalf("a third job while both environments are busy: %v", order)
	}
	if fmt.Sprint(order) != "[retail/grounding airline/multi_step]" || a != "retail" || b != "airline" {
		t.Fatalf("first jobs %v", order)
	}
	for q.len() > 0 {
		busy = map[string]bool{}
		if _, ok := take(); !ok {
			t.Fatal("nothing taken from a non-empty queue with nothing busy")
		}
	}
	want := "[retail/grounding airline/multi_step retail/tie-on-delta-rank-2 airline/precondition airline/confirm airline/older-unranked]" // equal Δ: ranked before unranked
	if fmt.Sprint(order) != want {
		t.Fatalf("order\n %v\nwant\n %v", order, want)
	}
	q.add("x", 1, 0.5, t0, "x")
	if got := q.drain(); len(got) != 1 || q.len() != 0 {
		t.Fatal(got)
	}
}
