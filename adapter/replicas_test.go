package adapter_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/dispatch"
	"github.com/traceops/trace/internal/bus"
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

// TestDeadlineGoesThroughTheOrderedEvents: two replicas check deadlines at
// once while three jobs are past theirs: one whose success is already on
// its events subject, one whose trainer's heartbeat is, and one silent.
// The deadline is an event on the job's subject (one per job and deadline,
// whichever replicas publish it), applied in order after what the trainer
// sent: the job that succeeded stays SUCCEEDED, the one that reported
// stays RUNNING, and only the silent one is FAILED, with one deadline
// event in its history and on its subject.
func TestDeadlineGoesThroughTheOrderedEvents(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	var skew atomic.Int64 // the replicas' clock, ahead of the wall's
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	var stages []*adapter.Stage
	for range 2 {
		s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, Backend: dispatch.NATS{Pub: b}, Queue: b, Now: now,
			Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
		if err != nil {
			t.Fatal(err)
		}
		stages = append(stages, s)
	}
	var ids []string
	for _, trig := range []string{"t-dl-succeeded", "t-dl-reported", "t-dl-silent"} {
		res, err := stages[0].HandleReady(ctx, readyFor(trig, "precondition_verification"))
		if err != nil || !res.Dispatched {
			t.Fatalf("%+v %v", res, err)
		}
		ids = append(ids, res.JobID)
	}
	succeededID, reportedID, silentID := ids[0], ids[1], ids[2]
	if err := b.PublishTrainingEvent(ctx, succeeded(t, st, succeededID, t.TempDir(), 1)); err != nil {
		t.Fatal(err)
	}
	seq := int64(1)
	if err := b.PublishTrainingEvent(ctx, &schemas.TrainingEvent{Schema: schemas.TrainingEventSchema, JobID: reportedID, Type: schemas.EventHeartbeat,
		At: time.Now().UTC(), Seq: &seq}); err != nil {
		t.Fatal(err)
	}
	skew.Store(int64(time.Hour)) // every job's deadline (2 s) has passed
	var wg sync.WaitGroup
	for _, s := range stages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.CheckDeadlines(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()

	stop := runReplicas(t, b, stages)
	defer stop()
	ec, err := b.TrainingEventsConsumer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every event applied", 20*time.Second, func() bool {
		info, err := ec.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	job := func(id string) *sink.TrainingJobRow {
		j, err := st.TrainingJob(ctx, id)
		if err != nil || j == nil {
			t.Fatalf("job %s: %v", id, err)
		}
		return j
	}
	if j := job(succeededID); j.Status != adapter.StatusSucceeded {
		t.Errorf("the job that succeeded before its deadline was checked is %s (%s)", j.Status, j.Reason)
	}
	if j := job(reportedID); j.Status != adapter.StatusRunning {
		t.Errorf("the job whose trainer reported before its deadline was checked is %s (%s)", j.Status, j.Reason)
	}
	if j := job(silentID); j.Status != adapter.StatusFailed || !strings.HasPrefix(j.Reason, "deadline: no event from the trainer since") {
		t.Errorf("the silent job is %s (%s)", j.Status, j.Reason)
	}
	for _, id := range []string{succeededID, reportedID} {
		if n := historyCount(t, st, id, "failed"); n != 0 {
			t.Errorf("job %s: %d failed events in its history", id, n)
		}
	}
	if n := historyCount(t, st, silentID, "failed"); n != 1 {
		t.Errorf("the silent job has %d failed events in its history, want 1", n)
	}
	stream, err := b.JS.Stream(ctx, bus.StreamTrainingEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(schemas.TrainingEventsSubject(silentID)))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[schemas.TrainingEventsSubject(silentID)]; n != 1 {
		t.Errorf("%d messages on the silent job's subject, want its one deadline event", n)
	}
}
