package adapter_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/serving"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// succeeded is a job's success naming its planned adapter, written to dir.
func succeeded(t *testing.T, st *sink.Store, jobID, dir string, seq int64) *schemas.TrainingEvent {
	t.Helper()
	job, err := st.TrainingJob(context.Background(), jobID)
	if err != nil || job == nil {
		t.Fatalf("job %s: %v", jobID, err)
	}
	return &schemas.TrainingEvent{Schema: schemas.TrainingEventSchema, JobID: jobID, Type: schemas.EventSucceeded, At: time.Now().UTC(), Seq: &seq,
		Adapter: &schemas.EventAdapter{Name: job.AdapterName, URI: "file://" + dir}, Eval: &schemas.EvalMetrics{MeanReward: 0.7, SuccessRate: 0.6, Episodes: 200}}
}

// loads counts the engine's load requests for name.
func loads(srv *llmtest.Server, name string) int {
	n := 0
	for _, c := range srv.LoRACalls() {
		if c.Op == "load" && c.Name == name {
			n++
		}
	}
	return n
}

// historyCount counts a job's history entries of type typ.
func historyCount(t *testing.T, st *sink.Store, jobID, typ string) int {
	t.Helper()
	types, _ := historyTypes(t, st, jobID)
	return count(types, typ)
}

// TestSlowActivationDoesNotHoldUpEvents: two replicas of the adapt role
// auto-activate adapters into a vLLM whose load of a job's adapter does
// not answer yet. Another job's event is applied meanwhile (the events
// consumer hands out one event at a time, so an activation inside the
// event's handling held every job's events on every replica); once the
// load answers, the adapter is active, loaded once, and activated once in
// its job's history.
func TestSlowActivationDoesNotHoldUpEvents(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	srv := llmtest.New(t)
	loading, release := make(chan string, 4), make(chan struct{})
	srv.ServeLoRA(llmtest.LoRAOptions{BeforeLoad: func(name string) { loading <- name; <-release }})
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text("hello") })
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }

	var stages []*adapter.Stage
	for range 2 {
		reg := &adapter.Registry{Store: st, Engine: &serving.VLLM{BaseURL: srv.URL, Timeout: time.Minute, InitialBackoff: time.Millisecond, MaxElapsed: time.Minute}}
		s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, AutoActivate: true, Registry: reg, Queue: b,
			Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
		if err != nil {
			t.Fatal(err)
		}
		stages = append(stages, s)
	}
	stop := runReplicas(t, b, stages)
	defer stop()
	defer free() // before the replicas stop: a handler may be waiting on the load

	slow, err := stages[0].HandleReady(ctx, readyFor("t-slow-activation", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := stages[0].HandleReady(ctx, readyFor("t-other-job", "tool_fails_often"))
	if err != nil {
		t.Fatal(err)
	}
	done := succeeded(t, st, slow.JobID, t.TempDir(), 1)
	if err := b.PublishTrainingEvent(ctx, done); err != nil {
		t.Fatal(err)
	}
	select {
	case name := <-loading:
		if name != done.Adapter.Name {
			t.Fatalf("load of %s, want %s", name, done.Adapter.Name)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the adapter's load was never requested")
	}
	seq := int64(1)
	if err := b.PublishTrainingEvent(ctx, &schemas.TrainingEvent{Schema: schemas.TrainingEventSchema, JobID: other.JobID, Type: schemas.EventStarted,
		At: time.Now().UTC(), Seq: &seq}); err != nil {
		t.Fatal(err)
	}
	jobStatus := func(id string) string {
		j, err := st.TrainingJob(ctx, id)
		if err != nil || j == nil {
			t.Fatalf("job %s: %v", id, err)
		}
		return j.Status
	}
	waitFor(t, "the other job's event while the load is held", 20*time.Second, func() bool { return jobStatus(other.JobID) == adapter.StatusRunning })
	if s := jobStatus(slow.JobID); s != adapter.StatusSucceeded {
		t.Fatalf("the succeeded job is %s while its adapter loads", s)
	}
	free()
	waitFor(t, "the adapter to be active", 20*time.Second, func() bool {
		a, err := st.Adapter(ctx, done.Adapter.Name)
		return err == nil && a != nil && a.Status == adapter.AdapterActive
	})
	waitFor(t, "the activation to be recorded", 20*time.Second, func() bool { return historyCount(t, st, slow.JobID, "activated") == 1 })
	if n := loads(srv, done.Adapter.Name); n != 1 {
		t.Errorf("%d loads of the adapter, want 1", n)
	}
	if chatStatus(t, srv, done.Adapter.Name) != 200 {
		t.Error("the active adapter is not served")
	}
}

// runReplicas runs the stages as replicas of the adapt role: each consumes
// the shared training events and activations consumers. The returned
// function stops them.
func runReplicas(t *testing.T, b *bus.Bus, stages []*adapter.Stage) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, s := range stages {
		ec, err := b.TrainingEventsConsumer(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		ac, err := b.ActivationsConsumer(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, run := range []func() error{func() error { return s.RunEvents(ctx, ec) }, func() error { return s.RunActivations(ctx, ac) }} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := run(); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	return func() { cancel(); wg.Wait() }
}

// runActivations runs the stage's activations consumer; the returned
// function stops it.
func runActivations(t *testing.T, b *bus.Bus, s *adapter.Stage) func() {
	t.Helper()
	return runActivationsWait(t, b, s, 0)
}

// runActivationsWait is runActivations on the consumer with AckWait
// ackWait (0: the default).
func runActivationsWait(t *testing.T, b *bus.Bus, s *adapter.Stage, ackWait time.Duration) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ac, err := b.ActivationsConsumer(ctx, ackWait)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.RunActivations(ctx, ac); err != nil {
			t.Error(err)
		}
	}()
	return func() { cancel(); <-done }
}

// activationRequests is how many activation requests were published (and
// kept: one per Msg-Id within the duplicate window).
func activationRequests(t *testing.T, b *bus.Bus) uint64 {
	t.Helper()
	s, err := b.JS.Stream(context.Background(), bus.StreamAdapterActivations)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// failingQueue fails its first publish of an activation, as a replica that
// died after saving a job's success and before requesting the activation.
type failingQueue struct {
	adapter.Queue
	failed bool
}

func (q *failingQueue) PublishActivation(ctx context.Context, payload []byte, msgID string) error {
	if !q.failed {
		q.failed = true
		return errors.New("nats: connection closed (test)")
	}
	return q.Queue.PublishActivation(ctx, payload, msgID)
}

// TestActivationSurvivesACrash: a replica that saved a job's success but
// did not get to request the activation returns the event's error (it is
// redelivered), and the redelivered success, which changes nothing else,
// requests it; a replica that took the request and died before the load
// (no ack) leaves it to another replica, after the consumer's AckWait.
// The adapter ends active, loaded once.
func TestActivationSurvivesACrash(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	srv := llmtest.New(t)
	srv.ServeLoRA(llmtest.LoRAOptions{})
	reg := &adapter.Registry{Store: st, Engine: &serving.VLLM{BaseURL: srv.URL, InitialBackoff: time.Millisecond, MaxElapsed: time.Second}}
	q := &failingQueue{Queue: b}
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, AutoActivate: true, Registry: reg, Queue: q,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.HandleReady(ctx, readyFor("t-activation-crash", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	e := succeeded(t, st, res.JobID, t.TempDir(), 4)
	data, _ := e.Encode()
	if err := s.HandleEvent(ctx, e, "seq:4", data); err == nil {
		t.Fatal("an activation that was not requested is not the event's error")
	}
	if j, _ := st.TrainingJob(ctx, res.JobID); j.Status != adapter.StatusSucceeded || activationRequests(t, b) != 0 {
		t.Fatalf("job %s, %d activation requests", j.Status, activationRequests(t, b))
	}
	if err := s.HandleEvent(ctx, e, "seq:4", data); err != nil { // the redelivery
		t.Fatal(err)
	}
	if n := activationRequests(t, b); n != 1 {
		t.Fatalf("%d activation requests after the redelivery, want 1", n)
	}

	// A replica takes the request and dies.
	ac, err := b.ActivationsConsumer(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := ac.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range batch.Messages() {
		n++
	}
	if n != 1 {
		t.Fatalf("fetched %d activation requests", n)
	}
	defer runActivationsWait(t, b, s, time.Second)()
	waitFor(t, "the activation by another replica", 20*time.Second, func() bool { return historyCount(t, st, res.JobID, "activated") == 1 })
	if a := statusOf(t, st, e.Adapter.Name); a.Status != adapter.AdapterActive || loads(srv, e.Adapter.Name) != 1 {
		t.Errorf("adapter %s, loaded %d times", a.Status, loads(srv, e.Adapter.Name))
	}
}

// saveFailsOnce is the registry's store (trace's RegistryStore over the
// real ClickHouse) whose first save of an adapter fails, as a write to a
// ClickHouse that is briefly away does.
type saveFailsOnce struct {
	adapter.RegistryStore
	mu     sync.Mutex
	failed bool
}

func (s *saveFailsOnce) SaveAdapter(ctx context.Context, r sink.AdapterRow) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.failed {
		s.failed = true
		return errors.New("clickhouse: write: connection reset by peer (test)")
	}
	return s.RegistryStore.SaveAdapter(ctx, r)
}

// TestActivationStoreErrorIsRetried: a write of the registry that fails
// (ClickHouse briefly away) after the engine loaded the adapter is not
// the activation's failure: the request is retried, and the adapter ends
// active and served, activated once in its job's history and never
// activation_failed. The engine's refusal is still the job's
// activation_failed, at once.
func TestActivationStoreErrorIsRetried(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	srv := llmtest.New(t)
	srv.ServeLoRA(llmtest.LoRAOptions{})
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text("hello") })
	reg := &adapter.Registry{Store: &saveFailsOnce{RegistryStore: st},
		Engine: &serving.VLLM{BaseURL: srv.URL, InitialBackoff: time.Millisecond, MaxElapsed: time.Second}}
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, AutoActivate: true, Registry: reg, Queue: b,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.HandleReady(ctx, readyFor("t-activation-store-error", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	e := succeeded(t, st, res.JobID, t.TempDir(), 1)
	data, _ := e.Encode()
	if err := s.HandleEvent(ctx, e, "seq:1", data); err != nil {
		t.Fatal(err)
	}
	defer runActivations(t, b, s)()
	waitFor(t, "the activation", 30*time.Second, func() bool {
		return historyCount(t, st, res.JobID, "activated")+historyCount(t, st, res.JobID, "activation_failed") > 0
	})
	if n, f := historyCount(t, st, res.JobID, "activated"), historyCount(t, st, res.JobID, "activation_failed"); n != 1 || f != 0 {
		t.Fatalf("history: %d activated, %d activation_failed; want 1 and 0", n, f)
	}
	if a := statusOf(t, st, e.Adapter.Name); a.Status != adapter.AdapterActive {
		t.Errorf("adapter %s, want active", a.Status)
	}
	if chatStatus(t, srv, e.Adapter.Name) != 200 {
		t.Error("the active adapter is not served")
	}

	// The engine's refusal (no adapter at that path) is the activation's
	// failure: recorded at once, not retried.
	res2, err := s.HandleReady(ctx, readyFor("t-activation-refused", "tool_fails_often"))
	if err != nil {
		t.Fatal(err)
	}
	e2 := succeeded(t, st, res2.JobID, t.TempDir()+"/missing", 1)
	data2, _ := e2.Encode()
	if err := s.HandleEvent(ctx, e2, "seq:1", data2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the refused activation", 30*time.Second, func() bool { return historyCount(t, st, res2.JobID, "activation_failed") == 1 })
	if n := loads(srv, e2.Adapter.Name); n != 1 {
		t.Errorf("the refused adapter's load was asked %d times, want 1", n)
	}
	if a := statusOf(t, st, e2.Adapter.Name); a.Status != adapter.AdapterCandidate {
		t.Errorf("refused adapter %s, want candidate", a.Status)
	}
}

// saveLostOnce is the registry's store over the real ClickHouse whose
// first save of an adapter is written but answered with an error, as an
// insert whose answer is lost (the connection reset after ClickHouse
// stored the row).
type saveLostOnce struct {
	adapter.RegistryStore
	mu   sync.Mutex
	lost bool
}

func (s *saveLostOnce) SaveAdapter(ctx context.Context, r sink.AdapterRow) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.RegistryStore.SaveAdapter(ctx, r); err != nil {
		return err
	}
	if !s.lost {
		s.lost = true
		return errors.New("clickhouse: read: connection reset by peer (test)")
	}
	return nil
}

// TestAmbiguousActivationWriteIsLoaded: the save of an adapter's active
// status is written but answered with an error, so the registry undoes the
// engine's load and the request is retried. The retry finds the adapter
// active already: it was left as it was ("no longer a candidate"), active
// in the registry while the engine did not serve it, and the router sent
// conversations to a model the upstream answered 404. The retry loads it
// again: it ends active and served, activated once in its job's history.
func TestAmbiguousActivationWriteIsLoaded(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	srv := llmtest.New(t)
	srv.ServeLoRA(llmtest.LoRAOptions{})
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text("hello") })
	reg := &adapter.Registry{Store: &saveLostOnce{RegistryStore: st},
		Engine: &serving.VLLM{BaseURL: srv.URL, InitialBackoff: time.Millisecond, MaxElapsed: time.Second}}
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, AutoActivate: true, Registry: reg, Queue: b,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	adapter.SetRetryDelay(s, 10*time.Millisecond)
	res, err := s.HandleReady(ctx, readyFor("t-activation-ambiguous-write", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	e := succeeded(t, st, res.JobID, t.TempDir(), 1)
	data, _ := e.Encode()
	if err := s.HandleEvent(ctx, e, "seq:1", data); err != nil {
		t.Fatal(err)
	}
	ac, err := b.ActivationsConsumer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	stop := runActivations(t, b, s)
	waitFor(t, "the activation request to be settled", 30*time.Second, func() bool {
		info, err := ac.Info(ctx)
		return err == nil && info.Delivered.Consumer >= 2 && info.NumAckPending == 0 && info.NumPending == 0
	})
	stop()
	if a := statusOf(t, st, e.Adapter.Name); a.Status != adapter.AdapterActive {
		t.Fatalf("adapter %s, want active", a.Status)
	}
	if _, ok := srv.LoadedAdapters()[e.Adapter.Name]; !ok || chatStatus(t, srv, e.Adapter.Name) != 200 {
		t.Errorf("the adapter is active in the registry but the engine does not serve it (loads: %d)", loads(srv, e.Adapter.Name))
	}
	if n, f := historyCount(t, st, res.JobID, "activated"), historyCount(t, st, res.JobID, "activation_failed"); n != 1 || f != 0 {
		t.Errorf("history: %d activated, %d activation_failed; want 1 and 0", n, f)
	}
}
