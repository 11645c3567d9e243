package adapter_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// slowRegistry is a replica's ClickHouse store whose registration of an
// adapter is slow: it is written once the job reads RUNNING, or after a
// bound, as a write delayed on a busy server would be.
type slowRegistry struct {
	*sink.Store
	holding chan struct{} // closed when a registration starts waiting
	once    sync.Once
}

func (s *slowRegistry) SaveAdapter(ctx context.Context, r sink.AdapterRow) error {
	s.once.Do(func() { close(s.holding) })
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if j, err := s.Store.TrainingJob(ctx, r.JobID); err == nil && j != nil && j.Status == adapter.StatusRunning {
			break
		}
	}
	return s.Store.SaveAdapter(ctx, r)
}

// TestTwoReplicasApplyAJobsEventsOneAtATime: two replicas of the adapt role
// share the training events consumer; a job's success, then a heartbeat its
// trainer sent late, reach them while the success is still being handled
// (its adapter being registered). The job ends SUCCEEDED: the heartbeat,
// which read the job before the success was saved, must not be written
// over it.
func TestTwoReplicasApplyAJobsEventsOneAtATime(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	holding := make(chan struct{})
	store := &slowRegistry{Store: st, holding: holding}
	var stages []*adapter.Stage
	for range 2 {
		s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: store, Claims: b})
		if err != nil {
			t.Fatal(err)
		}
		stages = append(stages, s)
	}
	res, err := stages[0].HandleReady(ctx, readyFor("t-two-replicas", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	job, _ := st.TrainingJob(ctx, res.JobID)
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, s := range stages {
		ec, err := b.TrainingEventsConsumer(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.RunEvents(rctx, ec); err != nil {
				t.Error(err)
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	seq, seq2 := int64(1), int64(2)
	done := &schemas.TrainingEvent{Schema: schemas.TrainingEventSchema, JobID: res.JobID, Type: schemas.EventSucceeded, At: time.Now().UTC(), Seq: &seq,
		Adapter: &schemas.EventAdapter{Name: job.AdapterName, URI: "file://" + t.TempDir()}, Eval: &schemas.EvalMetrics{MeanReward: 0.7, SuccessRate: 0.6, Episodes: 200}}
	if err := b.PublishTrainingEvent(ctx, done); err != nil {
		t.Fatal(err)
	}
	<-holding
	heartbeat := &schemas.TrainingEvent{Schema: schemas.TrainingEventSchema, JobID: res.JobID, Type: schemas.EventHeartbeat, At: time.Now().UTC(), Seq: &seq2}
	if err := b.PublishTrainingEvent(ctx, heartbeat); err != nil {
		t.Fatal(err)
	}
	ec, _ := b.TrainingEventsConsumer(ctx, 0)
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := ec.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events not acked: %+v", info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	j, _ := st.TrainingJob(ctx, res.JobID)
	if j.Status != adapter.StatusSucceeded {
		t.Fatalf("job %s after its success and a late heartbeat, want SUCCEEDED", j.Status)
	}
}
