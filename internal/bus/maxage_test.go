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

// TestStreamMaxAgeAppliedAndReconciled: nats.stream_max_age is the max age
// of TRACE_SYNTHESIS and TRACE_ENVIRONMENTS when trace creates them, and is
// applied to the existing streams at the next start, with an INFO line
// saying old → new; 0 leaves an existing stream's limit alone, and the
// other streams keep theirs. Before, the two streams were created without
// a limit and never changed: they grew forever unless an operator edited
// them by hand.
func TestStreamMaxAgeAppliedAndReconciled(t *testing.T) {
	ns := testenv.NATS(t)
	ctx := context.Background()
	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	connect := func(maxAge time.Duration) {
		t.Helper()
		b, err := bus.ConnectLogged(ctx, bus.Config{URL: ns.URL(), StreamMaxAge: maxAge}, "test", log)
		if err != nil {
			t.Fatalf("connect with stream_max_age %s: %v", maxAge, err)
		}
		testenv.CloseConn(t, b.NC)
	}
	_, js := ns.Connect(t)
	maxAges := func() map[string]time.Duration {
		t.Helper()
		out := map[string]time.Duration{}
		for _, name := range []string{bus.StreamSynthesis, bus.StreamEnvReady, bus.StreamTrainingEvents} {
			s, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = info.Config.MaxAge
		}
		return out
	}
	check := func(when string, want time.Duration) {
		t.Helper()
		got := maxAges()
		if got[bus.StreamSynthesis] != want || got[bus.StreamEnvReady] != want {
			t.Fatalf("%s: max ages %v, want %s for %s and %s", when, got, want, bus.StreamSynthesis, bus.StreamEnvReady)
		}
		if got[bus.StreamTrainingEvents] != 30*24*time.Hour {
			t.Fatalf("%s: %s's own max age changed: %s", when, bus.StreamTrainingEvents, got[bus.StreamTrainingEvents])
		}
	}

	connect(0)
	check("created with 0", 0)
	if logs.String() != "" {
		t.Fatalf("creating the streams logged:\n%s", logs.String())
	}

	connect(24 * time.Hour)
	check("restarted with 24h", 24*time.Hour)
	for _, name := range []string{bus.StreamSynthesis, bus.StreamEnvReady} {
		line := "stream=" + name + ` old="none (keep every message)" new=24h0m0s`
		if !strings.Contains(logs.String(), line) || !strings.Contains(logs.String(), "level=INFO") {
			t.Fatalf("no INFO line with %q:\n%s", line, logs.String())
		}
	}
	if !strings.Contains(logs.String(), "shortened the stream's max age") {
		t.Fatalf("a limit where there was none is not logged as shortening:\n%s", logs.String())
	}

	mark := len(logs.String())
	connect(24 * time.Hour)
	connect(0) // unset: an existing limit stays (it may be an operator's)
	check("restarted with 24h, then 0", 24*time.Hour)
	if l := logs.String()[mark:]; l != "" {
		t.Fatalf("nothing to change, yet:\n%s", l)
	}

	connect(48 * time.Hour)
	check("restarted with 48h", 48*time.Hour)
	if l := logs.String()[mark:]; !strings.Contains(l, "raised the stream's max age") || !strings.Contains(l, "old=24h0m0s new=48h0m0s") {
		t.Fatalf("raising not logged old → new:\n%s", l)
	}

	// A fresh server: created with the limit.
	ns2 := testenv.NATS(t)
	b, err := bus.Connect(ctx, bus.Config{URL: ns2.URL(), StreamMaxAge: 7 * 24 * time.Hour}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer testenv.CloseConn(t, b.NC)
	for _, name := range []string{bus.StreamSynthesis, bus.StreamEnvReady} {
		s, err := b.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().Config.MaxAge; got != 7*24*time.Hour {
			t.Fatalf("%s created with max age %s, want 168h", name, got)
		}
	}

	// A negative value is refused before anything changes.
	if _, err := bus.Connect(ctx, bus.Config{URL: ns.URL(), StreamMaxAge: -time.Hour}, "test"); err == nil || !strings.Contains(err.Error(), "nats.stream_max_age") {
		t.Fatalf("negative max age: %v, want an error naming nats.stream_max_age", err)
	}
	check("after a refused negative value", 48*time.Hour)
}
