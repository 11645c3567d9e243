package adapter_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/schemas"
)

// TestLateProgressDoesNotMoveTheJobBack: a progress event handled after a
// later one (a redelivery after a failed attempt is Nak'd and comes back
// behind the events that followed it) is recorded, but the job keeps the
// newest iteration and its mean reward.
func TestLateProgressDoesNotMoveTheJobBack(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.HandleReady(ctx, readyFor("t-late-progress", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	progress := func(seq int64, it int, mean float64) {
		t.Helper()
		e := &schemas.TrainingEvent{JobID: res.JobID, Type: schemas.EventProgress, At: time.Now().UTC(), Seq: &seq,
			Iteration: &it, MeanReward: &mean, RewardStd: new(float64)}
		data, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.HandleEvent(ctx, e, "seq:"+strconv.FormatInt(seq, 10), data); err != nil {
			t.Fatal(err)
		}
	}
	progress(1, 1, 0.3)
	progress(3, 3, 0.6)
	progress(2, 2, 0.45) // late
	j, err := st.TrainingJob(ctx, res.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != adapter.StatusRunning || j.Iteration != 3 || j.MeanReward != 0.6 {
		t.Errorf("job after a late progress event: %s, iteration %d, mean reward %g; want RUNNING, 3, 0.6", j.Status, j.Iteration, j.MeanReward)
	}
	evs, err := st.TrainingEvents(ctx, res.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(evs); n != 3 {
		t.Errorf("history has %d entries, want the 3 progress events (the late one recorded)", n)
	}
}
