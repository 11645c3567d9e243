package adapter_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// poisonName is an adapter name ClickHouse refuses to look up: the query
// that reads the registry by name is longer than the server's
// max_query_size (256 KiB), an error that no retry can mend. A training
// event cannot name it (training_event/v1 bounds adapter.name: such an
// event is malformed), an activation request can.
func poisonName() string { return "huge-" + strings.Repeat("x", 300<<10) }

// refusingStore is the stage's store (trace's Store over the real
// ClickHouse) whose lookup of the adapter name refused is the lookup of
// poisonName: ClickHouse's own refusal, for good, of a valid event's
// handling.
type refusingStore struct {
	adapter.Store
	refused string
}

func (s refusingStore) Adapter(ctx context.Context, name string) (*sink.AdapterRow, error) {
	if name == s.refused {
		name = poisonName()
	}
	return s.Store.Adapter(ctx, name)
}

// historyEntry is a job's newest history entry of type typ (nil: none).
func historyEntry(t *testing.T, st *sink.Store, jobID, typ string) *sink.TrainingEventRow {
	t.Helper()
	evs, err := st.TrainingEvents(context.Background(), jobID)
	if err != nil {
		t.Fatal(err)
	}
	var found *sink.TrainingEventRow
	for i := range evs {
		if evs[i].Type == typ {
			found = &evs[i]
		}
	}
	return found
}

// TestPoisonEventDoesNotHoldUpEveryJob: the events consumer hands out one
// event at a time, so an event that can never be applied (a success whose
// adapter ClickHouse refuses to look up) was redelivered without end and
// every job's events waited behind it. It is recorded in its job's
// history as rejected, with the error, and terminated; the next job's
// event is applied. The rejected event was the job's terminal event: the
// job is FAILED now with the rejection's reason (it stayed open until its
// deadline, shown running for hours), through a failed event of trace's
// on the job's subject.
func TestPoisonEventDoesNotHoldUpEveryJob(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	const refused = "refused-adapter"
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: refusingStore{Store: st, refused: refused}, Claims: b, Queue: b,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := s.HandleReady(ctx, readyFor("t-poison-event", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	good, err := s.HandleReady(ctx, readyFor("t-good-event", "tool_fails_often"))
	if err != nil {
		t.Fatal(err)
	}
	r := startRoleWith(t, b, s)
	defer r.stop()

	poison := succeeded(t, st, bad.JobID, t.TempDir(), 1)
	poison.Adapter.Name = refused
	if err := b.PublishTrainingEvent(ctx, poison); err != nil {
		t.Fatal(err)
	}
	seq := int64(1)
	if err := b.PublishTrainingEvent(ctx, &schemas.TrainingEvent{Schema: schemas.TrainingEventSchema, JobID: good.JobID, Type: schemas.EventStarted,
		At: time.Now().UTC(), Seq: &seq}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next job's event, behind the poison one", 30*time.Second, func() bool {
		j, err := st.TrainingJob(ctx, good.JobID)
		return err == nil && j != nil && j.Status == adapter.StatusRunning
	})
	waitFor(t, "the poison event recorded as rejected", 30*time.Second, func() bool {
		return historyEntry(t, st, bad.JobID, "rejected") != nil
	})
	e := historyEntry(t, st, bad.JobID, "rejected")
	var p struct {
		Error      string          `json:"error"`
		Deliveries uint64          `json:"deliveries"`
		Event      json.RawMessage `json:"event"`
	}
	if err := json.Unmarshal([]byte(e.Payload), &p); err != nil {
		t.Fatalf("rejected entry's payload: %v", err)
	}
	if !strings.Contains(p.Error, "adapters: ") || p.Deliveries != 1 {
		t.Errorf("the rejection says why, at the first delivery: %q after %d deliveries", p.Error, p.Deliveries)
	}
	waitFor(t, "the job of the rejected success to fail", 20*time.Second, func() bool {
		j, err := st.TrainingJob(ctx, bad.JobID)
		return err == nil && j != nil && j.Status != adapter.StatusPlanned
	})
	if j, _ := st.TrainingJob(ctx, bad.JobID); j.Status != adapter.StatusFailed || !strings.Contains(j.Reason, "rejected") ||
		!strings.Contains(j.Reason, "adapters: ") {
		t.Errorf("the job of the rejected success is %s (%q), want FAILED with the rejection's reason", j.Status, j.Reason)
	}
	if n := historyCount(t, st, bad.JobID, schemas.EventSucceeded); n != 0 {
		t.Errorf("the rejected success is in the history as applied (%d)", n)
	}
	waitFor(t, "the events consumer to be idle", 20*time.Second, func() bool {
		ec, err := b.TrainingEventsConsumer(ctx, 0)
		if err != nil {
			return false
		}
		info, err := ec.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
}

// TestPoisonActivationDoesNotHoldUpOthers: the activations consumer hands
// out one request at a time, and a request whose handling failed before
// the load (the adapter's row cannot be read: ClickHouse refuses the
// query) was redelivered without end, every later activation waiting
// behind it. It is recorded as activation_failed in its job's history,
// with the error, and terminated; the next job's adapter is activated.
func TestPoisonActivationDoesNotHoldUpOthers(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, AutoActivate: true, Registry: &adapter.Registry{Store: st},
		Queue: b, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := s.HandleReady(ctx, readyFor("t-poison-activation", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	good, err := s.HandleReady(ctx, readyFor("t-good-activation", "tool_fails_often"))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := json.Marshal(map[string]string{"job_id": bad.JobID, "adapter": poisonName()})
	if err := b.PublishActivation(ctx, req, adapter.ActivationMsgID(bad.JobID)); err != nil {
		t.Fatal(err)
	}
	done := succeeded(t, st, good.JobID, t.TempDir(), 1)
	data, _ := done.Encode()
	if err := s.HandleEvent(ctx, done, "seq:1", data); err != nil {
		t.Fatal(err)
	}
	defer runActivations(t, b, s)()

	waitFor(t, "the next adapter's activation, behind the poison request", 30*time.Second, func() bool {
		a, err := st.Adapter(ctx, done.Adapter.Name)
		return err == nil && a != nil && a.Status == adapter.AdapterActive
	})
	waitFor(t, "the poison request recorded as activation_failed", 30*time.Second, func() bool {
		return historyEntry(t, st, bad.JobID, "activation_failed") != nil
	})
	var p struct {
		Adapter    string `json:"adapter"`
		Error      string `json:"error"`
		Deliveries uint64 `json:"deliveries"`
	}
	if err := json.Unmarshal([]byte(historyEntry(t, st, bad.JobID, "activation_failed").Payload), &p); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.Error, "adapters: ") || p.Deliveries != 1 || !strings.HasPrefix(p.Adapter, "huge-x") {
		t.Errorf("the failure says why, at the first delivery: %q after %d deliveries (adapter %.20s)", p.Error, p.Deliveries, p.Adapter)
	}
	// The history event is written after the registry's row: wait for it,
	// then check there is exactly one.
	waitFor(t, "the good job's activated event", 30*time.Second, func() bool {
		return historyCount(t, st, good.JobID, "activated") > 0
	})
	if n := historyCount(t, st, good.JobID, "activated"); n != 1 {
		t.Errorf("the good job's history has %d activated events", n)
	}
	waitFor(t, "the work queue to be empty", 20*time.Second, func() bool {
		stream, err := b.JS.Stream(ctx, bus.StreamAdapterActivations)
		if err != nil {
			return false
		}
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
}

// unpublishableQueue cannot request an activation (the activations stream
// unreachable).
type unpublishableQueue struct{ adapter.Queue }

func (unpublishableQueue) PublishActivation(context.Context, []byte, string) error {
	return errors.New("nats: no responders available for request (test)")
}

// TestSuccessWhoseActivationCannotBeRequested: a success is applied (the
// job SUCCEEDED, its adapter registered) but the activation's request
// keeps failing; at its MaxDeliveries-th delivery the event is given up
// on as the job's activation_failed, with the error — not rejected: the
// success stays in the history — and the next event goes on.
func TestSuccessWhoseActivationCannotBeRequested(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, AutoActivate: true, Registry: &adapter.Registry{Store: st},
		Queue: unpublishableQueue{b}, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	adapter.SetRetryDelay(s, 10*time.Millisecond)
	res, err := s.HandleReady(ctx, readyFor("t-unrequested-activation", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.HandleReady(ctx, readyFor("t-after-unrequested", "tool_fails_often"))
	if err != nil {
		t.Fatal(err)
	}
	r := startRoleWith(t, b, s)
	defer r.stop()
	if err := b.PublishTrainingEvent(ctx, succeeded(t, st, res.JobID, t.TempDir(), 1)); err != nil {
		t.Fatal(err)
	}
	seq := int64(1)
	if err := b.PublishTrainingEvent(ctx, &schemas.TrainingEvent{Schema: schemas.TrainingEventSchema, JobID: other.JobID, Type: schemas.EventStarted,
		At: time.Now().UTC(), Seq: &seq}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next event", 30*time.Second, func() bool {
		j, err := st.TrainingJob(ctx, other.JobID)
		return err == nil && j != nil && j.Status == adapter.StatusRunning
	})
	e := historyEntry(t, st, res.JobID, "activation_failed")
	if e == nil {
		t.Fatal("no activation_failed in the job's history")
	}
	var p struct {
		Error      string `json:"error"`
		Deliveries uint64 `json:"deliveries"`
	}
	_ = json.Unmarshal([]byte(e.Payload), &p)
	if !strings.Contains(p.Error, "no responders available") || p.Deliveries != adapter.MaxDeliveries {
		t.Errorf("activation_failed: %q after %d deliveries", p.Error, p.Deliveries)
	}
	if j, _ := st.TrainingJob(ctx, res.JobID); j.Status != adapter.StatusSucceeded ||
		historyCount(t, st, res.JobID, schemas.EventSucceeded) != 1 || historyCount(t, st, res.JobID, "rejected") != 0 {
		t.Errorf("the applied success: job %s, history %v", j.Status, func() []string { ts, _ := historyTypes(t, st, res.JobID); return ts }())
	}
}

// TestHugeAdapterNameIsMalformed: a success naming an adapter of 300 KiB
// (which ClickHouse would refuse to look up) is malformed at decode
// (training_event/v1 bounds adapter.name): recorded in its job's history
// as malformed, the job unchanged, and the next job's event applied.
func TestHugeAdapterNameIsMalformed(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, Queue: b,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := s.HandleReady(ctx, readyFor("t-huge-name", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	good, err := s.HandleReady(ctx, readyFor("t-after-huge-name", "tool_fails_often"))
	if err != nil {
		t.Fatal(err)
	}
	r := startRoleWith(t, b, s)
	defer r.stop()

	huge := succeeded(t, st, bad.JobID, t.TempDir(), 1)
	huge.Schema, huge.Adapter.Name = schemas.TrainingEventSchema, poisonName()
	data, err := json.Marshal(huge) // as a trainer sends it: Encode would refuse it
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.JS.Publish(ctx, schemas.TrainingEventsSubject(bad.JobID), data); err != nil {
		t.Fatal(err)
	}
	seq := int64(1)
	if err := b.PublishTrainingEvent(ctx, &schemas.TrainingEvent{Schema: schemas.TrainingEventSchema, JobID: good.JobID, Type: schemas.EventStarted,
		At: time.Now().UTC(), Seq: &seq}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next job's event", 30*time.Second, func() bool {
		j, err := st.TrainingJob(ctx, good.JobID)
		return err == nil && j != nil && j.Status == adapter.StatusRunning
	})
	waitFor(t, "the event recorded", 30*time.Second, func() bool {
		return historyEntry(t, st, bad.JobID, "malformed") != nil || historyEntry(t, st, bad.JobID, "rejected") != nil
	})
	e := historyEntry(t, st, bad.JobID, "malformed")
	if e == nil || !strings.Contains(e.Payload, "/adapter/name") {
		t.Fatalf("the event with a huge adapter name is not malformed (naming /adapter/name): %v", historyTypesOf(t, st, bad.JobID))
	}
	if j, _ := st.TrainingJob(ctx, bad.JobID); j.Status != adapter.StatusPlanned {
		t.Errorf("the job of the malformed event is %s, want it unchanged (PLANNED)", j.Status)
	}
}

func historyTypesOf(t *testing.T, st *sink.Store, jobID string) []string {
	t.Helper()
	ts, _ := historyTypes(t, st, jobID)
	return ts
}

// TestRejectedFailureLeavesAnEndedJob: the failure trace publishes for a
// job whose terminal event was rejected is applied only while the job is
// open: a job that ended since (its success applied) keeps its status,
// and the failure is not in its history.
func TestRejectedFailureLeavesAnEndedJob(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, Queue: b,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.HandleReady(ctx, readyFor("t-rejected-after-end", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	done := succeeded(t, st, res.JobID, t.TempDir(), 2)
	data, _ := done.Encode()
	if err := s.HandleEvent(ctx, done, "seq:2", data); err != nil {
		t.Fatal(err)
	}
	f := &schemas.TrainingEvent{JobID: res.JobID, Type: schemas.EventFailed, At: time.Now().UTC(), Worker: adapter.RejectedWorker,
		Reason: "rejected: the trainer's succeeded event (seq:1) could not be applied: test"}
	if err := b.PublishTrainingEventID(ctx, f, adapter.RejectedMsgID(res.JobID, "seq:1")); err != nil {
		t.Fatal(err)
	}
	r := startRoleWith(t, b, s)
	defer r.stop()
	eventsApplied(t, b)
	if j, _ := st.TrainingJob(ctx, res.JobID); j.Status != adapter.StatusSucceeded {
		t.Errorf("the ended job is %s (%q), want SUCCEEDED", j.Status, j.Reason)
	}
	if n := historyCount(t, st, res.JobID, schemas.EventFailed); n != 0 {
		t.Errorf("the failure that no longer applies is in the history (%d)", n)
	}
}
