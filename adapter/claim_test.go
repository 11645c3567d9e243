package adapter_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/dispatch"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
)

// deadBackend stands for a replica killed (kill -9, OOM, SIGKILL after the
// grace period) while it dispatched: Dispatch never returns to the stage.
type deadBackend struct {
	entered chan struct{}
	once    sync.Once
}

func (*deadBackend) Name() string { return "nats" }
func (d *deadBackend) Dispatch(context.Context, *schemas.TrainingJob, []byte) error {
	d.once.Do(func() { close(d.entered) })
	select {} // the process is gone: neither the dispatch nor the release happens
}

// TestDispatchOfAKilledReplicaIsTakenOver: a replica killed between its
// claim and the end of its dispatch left the job claimed and DISPATCHED,
// never handed to a trainer. The ready message redelivered to another
// replica is neither taken as dispatched (it was acked as a duplicate and
// the job was lost: it failed at its deadline, "no trainer ever reported
// on it") nor dispatched at once beside a replica that may still be
// dispatching: it is retried until the claim's holder is past its bound,
// then that replica takes the claim over and dispatches the job once.
func TestDispatchOfAKilledReplicaIsTakenOver(t *testing.T) {
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))

	ba, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "replica-a")
	if err != nil {
		t.Fatal(err)
	}
	dead := &deadBackend{entered: make(chan struct{})}
	a, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: ba, Backend: dead, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	r := readyFor("t-killed-mid-dispatch", "precondition_verification")
	// Replica A handles the ready message within its bound (the adapt
	// role's is a minute) and dies inside the backend.
	actx, acancel := context.WithTimeout(ctx, 2*time.Second)
	defer acancel()
	go func() { _, _ = a.HandleReady(actx, r) }()
	select {
	case <-dead.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("replica A never reached its backend")
	}
	ba.NC.Close() // its connection goes with it

	bb, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "replica-b")
	if err != nil {
		t.Fatal(err)
	}
	defer bb.Close()
	b, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: bb, Backend: dispatch.NATS{Pub: bb}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	// While A's claim is within its bound, A may still be dispatching: B
	// must not dispatch beside it, nor take the job as dispatched.
	res, err := b.HandleReady(ctx, r)
	if err == nil {
		t.Fatalf("the redelivery found the job claimed by a replica within its bound and settled it (%+v): acked, the job is never dispatched", res)
	}
	t.Logf("within the claim's bound: %v", err)
	if n := jobsPublished(t, bb); n != 0 {
		t.Fatalf("%d jobs on trace.training.jobs while A held the claim", n)
	}
	// Past it, a redelivery takes the claim over and dispatches once.
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err = b.HandleReady(ctx, r)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job of a replica killed mid-dispatch was never dispatched: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !res.Dispatched {
		t.Fatalf("the redelivery after the claim's bound did not dispatch the job: %+v", res)
	}
	if n := jobsPublished(t, bb); n != 1 {
		t.Fatalf("%d jobs on trace.training.jobs, want 1", n)
	}
	// Dispatched: another redelivery is a duplicate, at once.
	if res, err := b.HandleReady(ctx, r); err != nil || !res.Duplicate {
		t.Fatalf("a redelivery after the dispatch: %+v, %v; want a duplicate", res, err)
	}
	if n := jobsPublished(t, bb); n != 1 {
		t.Fatalf("%d jobs on trace.training.jobs, want 1", n)
	}
}
