package adapter_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
)

// downBackend is a trainer backend that cannot be reached.
type downBackend struct{}

func (downBackend) Name() string { return "down" }
func (downBackend) Dispatch(context.Context, *schemas.TrainingJob, []byte) error {
	return errors.New("trainer cluster unreachable")
}

// TestReadyRetryNamesTheEnvironment: a ready environment whose job cannot
// be dispatched is retried, and the retry's warning names the environment
// and its capability (the message's subject, trace.environments.ready, is
// the same for all of them).
func TestReadyRetryNamesTheEnvironment(t *testing.T) {
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var logs testenv.SyncBuffer
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, Backend: downBackend{}, Queue: b,
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := b.ReadyConsumer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.RunReady(ctx, rc) }()
	r := readyFor("t-down", "precondition_verification")
	if err := b.PublishEnvironmentReady(ctx, r); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the retry's warning", 30*time.Second, func() bool { return strings.Contains(logs.String(), "will retry") })
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "will retry") {
			line = l
			break
		}
	}
	for _, want := range []string{r.EnvironmentID, "precondition_verification", "trainer cluster unreachable"} {
		if !strings.Contains(line, want) {
			t.Errorf("the retry's warning does not name %q: %s", want, line)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
