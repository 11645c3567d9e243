package bus_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/testenv"
)

// TestConnectionLossIsLogged: losing NATS and getting it back are log lines
// of trace's logger (an idle analyzer logged nothing: only /readyz showed
// the outage), and closing the bus is not a loss.
func TestConnectionLossIsLogged(t *testing.T) {
	ns := testenv.NATS(t)
	var logs testenv.SyncBuffer
	b, err := bus.ConnectLogged(context.Background(), bus.Config{URL: ns.URL()}, "test", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	wait := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(logs.String(), what); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log:\n%s", what, logs.String())
			}
		}
	}
	ns.Shutdown()
	wait("nats: disconnected")
	if !strings.Contains(logs.String(), "url="+ns.URL()) {
		t.Errorf("the disconnection does not name the server:\n%s", logs.String())
	}
	ns.Restart()
	wait("nats: reconnected")
	b.Close()
	time.Sleep(200 * time.Millisecond)
	if n := strings.Count(logs.String(), "nats: disconnected"); n != 1 {
		t.Errorf("%d disconnections logged, want 1 (closing the bus is not one):\n%s", n, logs.String())
	}
}
