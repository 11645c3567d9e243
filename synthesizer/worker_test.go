package synthesizer

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// natsKit is a JetStream stream and durable consumer on an embedded server,
// shaped like internal/bus's TRACE_SYNTHESIS (the worker's production
// consumer is created there).
type natsKit struct {
	srv *testenv.NATSServer
	nc  *nats.Conn
	js  jetstream.JetStream
}

const testStream, testSubject, testDurable = "TEST_SYNTHESIS", "test.synthesis", "test-synthesizer"

func newNATSKit(t *testing.T, ackWait time.Duration) *natsKit {
	t.Helper()
	k := &natsKit{srv: testenv.NATS(t)}
	k.connect(t, ackWait)
	return k
}

func (k *natsKit) connect(t *testing.T, ackWait time.Duration) {
	t.Helper()
	nc, js := k.srv.Connect(t)
	ctx := context.Background()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: testStream, Subjects: []string{testSubject + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, testStream, jetstream.ConsumerConfig{Durable: testDurable, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: ackWait, MaxDeliver: -1}); err != nil {
		t.Fatal(err)
	}
	k.nc, k.js = nc, js
}

func (k *natsKit) consumer(t *testing.T) jetstream.Consumer {
	c, err := k.js.Consumer(context.Background(), testStream, testDurable)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (k *natsKit) publish(t *testing.T, req *schemas.SynthesisRequest, msgID string) {
	t.Helper()
	data, _ := json.Marshal(req)
	if _, err := k.js.Publish(context.Background(), testSubject+"."+req.Environment+"."+req.Capability.Skill, data, jetstream.WithMsgID(msgID)); err != nil {
		t.Fatal(err)
	}
}

// RequeueSynthesis implements Requeuer as internal/bus does, on the test
// stream.
func (k *natsKit) RequeueSynthesis(ctx context.Context, req *schemas.SynthesisRequest, msgID string) error {
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	_, err = k.js.Publish(ctx, testSubject+"."+req.Environment+"."+req.Capability.Skill, data, jetstream.WithMsgID(msgID))
	return err
}

// pending is the consumer's unacknowledged + undelivered count.
func (k *natsKit) pending(t *testing.T) (ackPending int, undelivered uint64, redelivered int) {
	info, err := k.consumer(t).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumAckPending, info.NumPending, info.NumRedelivered
}

func startWorker(t *testing.T, w *Worker) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("worker: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("worker did not stop")
		}
	}
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// slowCalibrator accepts after taking longer than the consumer's AckWait.
type slowCalibrator struct {
	d     time.Duration
	calls atomic.Int32
	fail  atomic.Bool
}

func (c *slowCalibrator) Calibrate(ctx context.Context, _ Draft, _ func(done, total int)) (*Calibration, error) {
	c.calls.Add(1)
	if c.fail.Load() {
		return nil, errors.New("policy server unreachable")
	}
	select {
	case <-time.After(c.d):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &Calibration{Accepted: true, Verdict: "accepted", Policy: "scripted", Simulated: true, Seeds: 2, RolloutsPerSeed: 2,
		MeanReward: 0.4, SuccessRate: 0.4, PassAtK: map[string]float64{"1": 0.4}}, nil
}

func workerStage(t *testing.T, store Store, cal Calibrator, pub ReadyPublisher) (*Stage, *llmtest.Server) {
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(fenced(goodProgram)) })
	gen, _ := newTestGenerator(t, srv)
	s, err := NewStage(Config{LLM: gen, Validator: &markerValidator{}, Calibrators: func(*Job) (Calibrator, error) { return cal, nil },
		Store: store, Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	return s, srv
}

// TestWorkerLongWorkIsNotRedelivered: calibration takes 3 × AckWait; the
// in-progress acks keep the request from being redelivered.
func TestWorkerLongWorkIsNotRedelivered(t *testing.T) {
	k := newNATSKit(t, 600*time.Millisecond)
	store, pub := newMemStore(), &memPublisher{}
	cal := &slowCalibrator{d: 1800 * time.Millisecond}
	stage, gen := workerStage(t, store, cal, pub)
	k.publish(t, testRequest("trig-long"), "trig-long")
	stop := startWorker(t, NewWorker(stage, k.consumer(t), WorkerConfig{AckWait: 600 * time.Millisecond}))
	defer stop()
	id := schemas.EnvironmentID("trig-long")
	waitFor(t, "DONE", 20*time.Second, func() bool {
		e, _ := store.LoadEnvironment(context.Background(), id)
		return e != nil && e.Status == StatusDone
	})
	waitFor(t, "the ack", 5*time.Second, func() bool { ap, _, _ := k.pending(t); return ap == 0 })
	if _, _, redelivered := k.pending(t); redelivered != 0 || cal.calls.Load() != 1 || len(gen.Requests()) != 1 {
		t.Fatalf("redelivered %d, calibrations %d, generations %d", redelivered, cal.calls.Load(), len(gen.Requests()))
	}
}

// TestWorkerDuplicateAndRestartMakeOneEnvironment: the same request twice
// (two messages, as after the duplicate window), a worker stopped in the
// middle of the work and a new one on the same durable consumer, and the
// request again after DONE: one environment, announced, one accepted
// program — with the records in ClickHouse, and in memory.
func TestWorkerDuplicateAndRestartMakeOneEnvironment(t *testing.T) {
	t.Run("clickhouse", func(t *testing.T) {
		st := chStore(t)
		dupRestart(t, st, func() []string {
			es, err := st.List(context.Background(), sink.EnvironmentFilter{})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, e := range es {
				ids = append(ids, e.ID)
			}
			return ids
		})
	})
	t.Run("memory", func(t *testing.T) {
		st := newMemStore()
		dupRestart(t, st, st.ids)
	})
}

func dupRestart(t *testing.T, store Store, ids func() []string) {
	k := newNATSKit(t, 5*time.Second)
	pub := &memPublisher{}
	cal := &slowCalibrator{d: 2 * time.Second}
	stage, gen := workerStage(t, store, cal, pub)
	req := testRequest("trig-dup-nats")
	k.publish(t, req, "m1")
	k.publish(t, req, "m2")
	stop := startWorker(t, NewWorker(stage, k.consumer(t), WorkerConfig{AckWait: 5 * time.Second}))
	id := schemas.EnvironmentID(req.TriggerID)
	waitFor(t, "calibration to start", 15*time.Second, func() bool { return cal.calls.Load() == 1 })
	stop() // mid-calibration: the request is Nak'd and the record says CALIBRATING
	if e, _ := store.LoadEnvironment(context.Background(), id); e == nil || e.Status != StatusCalibrating {
		t.Fatalf("after the stop: %+v", e)
	}
	cal.d = 10 * time.Millisecond
	stop = startWorker(t, NewWorker(stage, k.consumer(t), WorkerConfig{AckWait: 5 * time.Second}))
	defer stop()
	waitFor(t, "both messages acked", 20*time.Second, func() bool {
		ap, np, _ := k.pending(t)
		e, _ := store.LoadEnvironment(context.Background(), id)
		return ap == 0 && np == 0 && e != nil && e.Status == StatusDone
	})
	k.publish(t, req, "m3") // again after DONE
	waitFor(t, "the third acked", 10*time.Second, func() bool { ap, np, _ := k.pending(t); return ap == 0 && np == 0 })
	if got := ids(); len(got) != 1 || got[0] != id {
		t.Fatalf("environments %v", got)
	}
	e, _ := store.LoadEnvironment(context.Background(), id)
	accepted := 0
	for _, a := range e.Attempts {
		if a.Accepted {
			accepted++
		}
	}
	if accepted != 1 || len(e.Attempts) != 1 {
		t.Fatalf("%d attempts, %d accepted", len(e.Attempts), accepted)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	for _, m := range pub.msgs {
		if m.EnvironmentID != id {
			t.Fatal(m.EnvironmentID)
		}
	}
	if len(pub.msgs) == 0 || len(gen.Requests()) > 2 {
		t.Fatalf("%d announcements, %d generations", len(pub.msgs), len(gen.Requests()))
	}
}

func TestWorkerRecordsFailedAfterMaxDeliver(t *testing.T) {
	k := newNATSKit(t, 5*time.Second)
	store, pub := newMemStore(), &memPublisher{}
	cal := &slowCalibrator{}
	cal.fail.Store(true)
	stage, _ := workerStage(t, store, cal, pub)
	k.publish(t, testRequest("trig-maxdeliver"), "trig-maxdeliver")
	stop := startWorker(t, NewWorker(stage, k.consumer(t), WorkerConfig{MaxDeliver: 3, NakDelay: 20 * time.Millisecond}))
	defer stop()
	id := schemas.EnvironmentID("trig-maxdeliver")
	waitFor(t, "FAILED", 20*time.Second, func() bool {
		e, _ := store.LoadEnvironment(context.Background(), id)
		return e != nil && e.Status == StatusFailed
	})
	waitFor(t, "the ack", 5*time.Second, func() bool { ap, np, _ := k.pending(t); return ap == 0 && np == 0 })
	e, _ := store.LoadEnvironment(context.Background(), id)
	if cal.calls.Load() != 3 || e.Reason != "failed transiently 3 times, the last: transient: calibrate: policy server unreachable" || e.TransientFailures != 3 {
		t.Fatalf("%d calibrations; reason %q", cal.calls.Load(), e.Reason)
	}
	if len(pub.msgs) != 0 {
		t.Fatal("a FAILED environment was announced")
	}
}

// TestWorkerShutdownsDoNotSpendTheDeliveries: a request handed back at
// shutdown twice, then failing transiently once, with MaxDeliver 2, is
// retried, not FAILED: its third delivery is its first transient failure.
// (The budget was JetStream's delivery count, so restarts during a long
// synthesis spent it.)
func TestWorkerShutdownsDoNotSpendTheDeliveries(t *testing.T) {
	k := newNATSKit(t, 5*time.Second)
	store, pub := newMemStore(), &memPublisher{}
	cal := &slowCalibrator{d: time.Minute}
	stage, _ := workerStage(t, store, cal, pub)
	k.publish(t, testRequest("trig-restarts"), "trig-restarts")
	cfg := WorkerConfig{MaxDeliver: 2, NakDelay: time.Minute}
	for i := int32(1); i <= 2; i++ {
		stop := startWorker(t, NewWorker(stage, k.consumer(t), cfg))
		waitFor(t, "calibration to start", 15*time.Second, func() bool { return cal.calls.Load() == i })
		stop() // a restart mid-calibration: handed back
	}
	cal.fail.Store(true)
	stop := startWorker(t, NewWorker(stage, k.consumer(t), cfg))
	defer stop()
	id := schemas.EnvironmentID("trig-restarts")
	waitFor(t, "the transient failure recorded", 15*time.Second, func() bool {
		e, _ := store.LoadEnvironment(context.Background(), id)
		return e != nil && (e.TransientFailures == 1 || e.Status == StatusFailed)
	})
	if e, _ := store.LoadEnvironment(context.Background(), id); e.Status == StatusFailed || e.TransientFailures != 1 {
		t.Fatalf("after two restarts and one transient failure: %s, %d transient failures, reason %q", e.Status, e.TransientFailures, e.Reason)
	}
}

func TestWorkerTerminatesInvalidRequests(t *testing.T) {
	k := newNATSKit(t, 5*time.Second)
	store := newMemStore()
	stage, _ := workerStage(t, store, &slowCalibrator{}, &memPublisher{})
	if _, err := k.js.Publish(context.Background(), testSubject+".x.y", []byte(`{"trigger_id": 7}`)); err != nil {
		t.Fatal(err)
	}
	stop := startWorker(t, NewWorker(stage, k.consumer(t), WorkerConfig{}))
	defer stop()
	waitFor(t, "the termination", 10*time.Second, func() bool { ap, np, _ := k.pending(t); return ap == 0 && np == 0 })
	if len(store.ids()) != 0 {
		t.Fatal("an environment from an invalid request")
	}
}

// TestWorkerOneCapabilityAtATimePerEnvironment: three requests of one
// environment and one of another; the worker may run two at once, but never
// two of the same environment, and takes the highest mean Δ first.
func TestWorkerOneCapabilityAtATimePerEnvironment(t *testing.T) {
	k := newNATSKit(t, 5*time.Second)
	store := newMemStore()
	oc := &orderCalibrator{running: map[string]int{}}
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(fenced(goodProgram)) })
	gen, _ := newTestGenerator(t, srv)
	stage, err := NewStage(Config{LLM: gen, Validator: &markerValidator{}, Store: store,
		Calibrators: func(j *Job) (Calibrator, error) { return &capCalibrator{oc, j.Request.Capability.Skill}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	mk := func(trig, env, capability string, delta float64, rank int) *schemas.SynthesisRequest {
		r := testRequest(trig)
		r.Environment, r.Capability.Skill, r.Capability.MeanDelta, r.Rank = env, capability, delta, rank
		return r
	}
	oc.envOf = map[string]string{}
	for _, r := range []*schemas.SynthesisRequest{
		mk("a3", "air", "user_confirmation", 0.30, 3), mk("a1", "air", "multi_step_completion", 0.60, 1),
		mk("a2", "air", "precondition_verification", 0.57, 2), mk("r1", "ret", "argument_grounding", 0.82, 1),
	} {
		oc.envOf[r.Capability.Skill] = r.Environment
		k.publish(t, r, r.TriggerID)
	}
	time.Sleep(200 * time.Millisecond) // all four in the stream before the worker fetches
	stop := startWorker(t, NewWorker(stage, k.consumer(t), WorkerConfig{Concurrency: 4}))
	defer stop()
	waitFor(t, "four environments", 20*time.Second, func() bool {
		n := 0
		for _, id := range store.ids() {
			if e, _ := store.LoadEnvironment(context.Background(), id); e.Status == StatusDone {
				n++
			}
		}
		return n == 4
	})
	oc.mu.Lock()
	defer oc.mu.Unlock()
	if oc.maxPerEnv != 1 {
		t.Fatalf("%d calibrations of one environment at once", oc.maxPerEnv)
	}
	var air []string
	for _, c := range oc.order {
		if oc.envOf[c] == "air" {
			air = append(air, c)
		}
	}
	if len(air) != 3 || air[0] != "multi_step_completion" || air[1] != "precondition_verification" || air[2] != "user_confirmation" {
		t.Fatalf("air order %v", air)
	}
}

// orderCalibrator records the order of calibrations and how many of one
// environment overlapped.
type orderCalibrator struct {
	mu        sync.Mutex
	running   map[string]int
	maxPerEnv int
	order     []string
	envOf     map[string]string
}

type capCalibrator struct {
	c          *orderCalibrator
	capability string
}

func (cc *capCalibrator) Calibrate(ctx context.Context, _ Draft, _ func(done, total int)) (*Calibration, error) {
	c, env := cc.c, cc.c.envOf[cc.capability]
	c.mu.Lock()
	c.order = append(c.order, cc.capability)
	c.running[env]++
	c.maxPerEnv = max(c.maxPerEnv, c.running[env])
	c.mu.Unlock()
	time.Sleep(150 * time.Millisecond)
	c.mu.Lock()
	c.running[env]--
	c.mu.Unlock()
	return &Calibration{Accepted: true, Verdict: "accepted", Policy: "scripted", Seeds: 1, RolloutsPerSeed: 1, PassAtK: map[string]float64{"1": 0.5}}, nil
}

// TestWorkerShutdownHandsEverythingBack: a worker stopped with one request
// running and one queued behind it (same environment) hands both back, and
// once its connection is closed, as `trace run` closes it, neither waits
// for the consumer's AckWait: both are deliverable to another replica at
// once. A request Nak'd into the worker's own open pull request would be
// redelivered to it and left unacknowledged for the whole AckWait.
func TestWorkerShutdownHandsEverythingBack(t *testing.T) {
	k := newNATSKit(t, time.Minute)
	cal := &slowCalibrator{d: time.Minute}
	stage, _ := workerStage(t, newMemStore(), cal, nil)
	first, second := testRequest("t-running"), testRequest("t-queued")
	second.Capability.Skill = "user_confirmation"
	k.publish(t, first, "running")
	k.publish(t, second, "queued")
	nc, js := k.srv.Connect(t)
	cons, err := js.Consumer(context.Background(), testStream, testDurable)
	if err != nil {
		t.Fatal(err)
	}
	stop := startWorker(t, NewWorker(stage, cons, WorkerConfig{Concurrency: 4}))
	waitFor(t, "one calibration running", 20*time.Second, func() bool { return cal.calls.Load() == 1 })
	time.Sleep(100 * time.Millisecond) // the worker asks for more while both are held
	stop()
	testenv.CloseConn(t, nc)
	if calls := cal.calls.Load(); calls != 1 {
		t.Fatalf("%d calibrations; the queued request ran", calls)
	}
	// Another replica fetches both at once.
	batch, err := k.consumer(t).Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for m := range batch.Messages() {
		req, err := schemas.DecodeSynthesisRequest(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, req.TriggerID)
		_ = m.Ack()
	}
	if len(got) != 2 {
		t.Fatalf("another replica got %v within 5 s; the rest wait for the AckWait (1 m)", got)
	}
}

// startedTogether lists the waiting environments like the store, and
// returns only once every replica has listed them: replicas started at the
// same moment, each seeing the records before any of them moved on.
type startedTogether struct {
	store WaitingLister
	all   *sync.WaitGroup
}

func (s startedTogether) WaitingEnvironments(ctx context.Context) ([]*Environment, error) {
	es, err := s.store.WaitingEnvironments(ctx)
	s.all.Done()
	s.all.Wait()
	return es, err
}

// TestTwoReplicasResumeAWaitingEnvironmentOnce: an environment waits for
// a model (recorded in ClickHouse); two replicas of the synthesize role,
// now with a model, start together on the same durable consumer. One of
// them writes, validates and calibrates it: one generation call, one
// calibration, one accepted attempt, announced once.
func TestTwoReplicasResumeAWaitingEnvironmentOnce(t *testing.T) {
	k := newNATSKit(t, 5*time.Second)
	store := chStore(t)
	req := testRequest("trig-two-replicas")
	ctx := context.Background()
	noModel, err := NewStage(Config{Validator: &markerValidator{}, Calibrators: func(*Job) (Calibrator, error) { return &slowCalibrator{}, nil }, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := noModel.Synthesize(ctx, req); err != nil || e.Status != StatusWaitingForLLM {
		t.Fatalf("%v %+v", err, e)
	}
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(fenced(goodProgram)) })
	cal, pub := &slowCalibrator{d: 300 * time.Millisecond}, &memPublisher{}
	var (
		all   sync.WaitGroup
		stops []func()
	)
	all.Add(2)
	for range 2 {
		gen, _ := newTestGenerator(t, srv)
		stage, err := NewStage(Config{LLM: gen, Validator: &markerValidator{}, Calibrators: func(*Job) (Calibrator, error) { return cal, nil },
			Store: store, Publisher: pub})
		if err != nil {
			t.Fatal(err)
		}
		w := NewWorker(stage, k.consumer(t), WorkerConfig{AckWait: 5 * time.Second, Waiting: startedTogether{store: store, all: &all}, Requeue: k})
		stops = append(stops, startWorker(t, w))
	}
	id := schemas.EnvironmentID(req.TriggerID)
	waitFor(t, "DONE", 20*time.Second, func() bool {
		e, _ := store.LoadEnvironment(ctx, id)
		return e != nil && e.Status == StatusDone
	})
	waitFor(t, "every delivery acked", 10*time.Second, func() bool { ap, np, _ := k.pending(t); return ap == 0 && np == 0 })
	for _, stop := range stops { // each replica finishes what it runs
		stop()
	}
	e, _ := store.LoadEnvironment(ctx, id)
	pub.mu.Lock()
	announced := len(pub.msgs)
	pub.mu.Unlock()
	if n := len(srv.Requests()); n != 1 || cal.calls.Load() != 1 || len(e.Attempts) != 1 || announced != 1 {
		t.Fatalf("generation calls %d, calibrations %d, attempts %d, announcements %d: want one each", n, cal.calls.Load(), len(e.Attempts), announced)
	}
}

// TestWaitingEnvironmentRequeuedByAReplicaThatCanResumeIt: a replica that
// still has no model requeues nothing (the environment stays waiting, so a
// replica configured with a model later is not deduplicated away); one with
// a model requeues and resumes it; a resume message for a version the
// record has moved on from is acknowledged without a generation call.
func TestWaitingEnvironmentRequeuedByAReplicaThatCanResumeIt(t *testing.T) {
	k := newNATSKit(t, 5*time.Second)
	store := chStore(t)
	req := testRequest("trig-requeue")
	ctx := context.Background()
	noModel, err := NewStage(Config{Validator: &markerValidator{}, Calibrators: func(*Job) (Calibrator, error) { return &slowCalibrator{}, nil }, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	waiting, err := noModel.Synthesize(ctx, req)
	if err != nil || waiting.Status != StatusWaitingForLLM {
		t.Fatalf("%v %+v", err, waiting)
	}
	stream := func() uint64 {
		s, err := k.js.Stream(ctx, testStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	stop := startWorker(t, NewWorker(noModel, k.consumer(t), WorkerConfig{Waiting: store, Requeue: k}))
	stop() // Run lists and requeues before it fetches
	if n := stream(); n != 0 {
		t.Fatalf("a replica without a model requeued %d messages", n)
	}
	stage, srv := workerStage(t, store, &slowCalibrator{}, &memPublisher{})
	stop = startWorker(t, NewWorker(stage, k.consumer(t), WorkerConfig{Waiting: store, Requeue: k}))
	defer stop()
	id := schemas.EnvironmentID(req.TriggerID)
	waitFor(t, "DONE", 20*time.Second, func() bool {
		e, _ := store.LoadEnvironment(ctx, id)
		return e != nil && e.Status == StatusDone
	})
	waitFor(t, "the ack", 10*time.Second, func() bool { ap, np, _ := k.pending(t); return ap == 0 && np == 0 })
	if n, calls := stream(), len(srv.Requests()); n != 1 || calls != 1 {
		t.Fatalf("%d messages, %d generation calls", n, calls)
	}

	// Another environment waited, was requeued, and a replica is writing
	// it (GENERATING) when a second resume message of its waiting version
	// arrives (requeued again after the duplicate window).
	req2 := testRequest("trig-requeue-2")
	w2, err := noModel.Synthesize(ctx, req2)
	if err != nil || w2.Status != StatusWaitingForLLM {
		t.Fatalf("%v %+v", err, w2)
	}
	writing := *w2
	writing.Status, writing.Reason, writing.Path, writing.Attempt, writing.Version = StatusGenerating, "", PathLLM, 1, w2.Version+1
	if err := store.SaveEnvironment(ctx, &writing); err != nil {
		t.Fatal(err)
	}
	if err := k.RequeueSynthesis(ctx, req2, ResumeMsgID(w2)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the superseded resume acked", 10*time.Second, func() bool { ap, np, _ := k.pending(t); return ap == 0 && np == 0 })
	e2, _ := store.LoadEnvironment(ctx, w2.ID)
	if calls := len(srv.Requests()); calls != 1 || e2.Status != StatusGenerating || e2.Version != writing.Version {
		t.Fatalf("%d generation calls; record %s version %d", calls, e2.Status, e2.Version)
	}
}
