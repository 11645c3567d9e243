package adapter_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/testenv"
)

// TestConsumerGoneEndsTheAdaptRole: NATS comes back without its JetStream
// storage while the adapt role runs: its durable consumers are gone, and
// nothing recreates them but a start of the role (another process's start
// recreates the streams only, and ready environments pile up there). The
// role's consumers end with an error naming the consumer, so that the
// process exits and its restart creates them again; they went on without
// a consumer, logging "no heartbeat received" every 30 s, and no ready
// environment got a job until someone restarted the process.
func TestConsumerGoneEndsTheAdaptRole(t *testing.T) {
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "adapt")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, rc, ec := adaptStage(ctx, t, b, st, fastPlan())
	ready, events := make(chan error, 1), make(chan error, 1)
	go func() { ready <- s.RunReady(ctx, rc) }()
	go func() { events <- s.RunEvents(ctx, ec) }()
	time.Sleep(500 * time.Millisecond)

	srv.Restart() // same storage: the consumers go on
	time.Sleep(2 * time.Second)
	select {
	case err := <-ready:
		t.Fatalf("the ready consumer ended across a NATS restart on the same storage: %v", err)
	case err := <-events:
		t.Fatalf("the events consumer ended across a NATS restart on the same storage: %v", err)
	default:
	}

	srv.Shutdown()
	if err := os.RemoveAll(srv.StoreDir()); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	for _, c := range []struct {
		name string
		done chan error
	}{{bus.DurableAdapter, ready}, {bus.DurableAdapterEvents, events}} {
		select {
		case err := <-c.done:
			if err == nil || !strings.Contains(err.Error(), c.name) {
				t.Fatalf("the consumer %s, gone, ended with %v; want an error naming it", c.name, err)
			}
			t.Log(err)
		case <-time.After(90 * time.Second):
			t.Fatalf("the consumer %s is gone (NATS lost its storage) and the adapt role neither ended nor said so", c.name)
		}
	}
}
