package app_test

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/testenv"
)

// startAlone starts an App that runs role alone, with GOGC unset in the
// environment (it would win) and Go's 100 restored when the test ends.
func startAlone(t *testing.T, role string, set ...string) *app.App {
	t.Helper()
	if testing.Short() {
		t.Skip("starts ClickHouse and NATS")
	}
	t.Setenv("GOGC", "")
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	cfg, err := config.Load("", append([]string{"data_dir=" + t.TempDir(), "roles=" + role, "http.addr=127.0.0.1:0",
		"kafka.embedded_addr=127.0.0.1:0", "clickhouse.addr=" + ch.Addr, "clickhouse.database=" + ch.Database,
		"nats.url=" + ns.URL()}, set...))
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.Start(context.Background(), cfg, slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestServeAloneSetsGOGC: a process that runs the serve role alone sets
// the collector target to env.gogc at start (the rule itself is
// config.TestGCPolicy's table).
func TestServeAloneSetsGOGC(t *testing.T) {
	a := startAlone(t, "serve", "env.gogc=321")
	defer a.Close()
	if got := debug.SetGCPercent(100); got != 321 {
		t.Fatalf("a serve-only process runs at GOGC %d, want env.gogc 321", got)
	}
}

// TestRouteAlonePacesGC: a process that runs the route role alone paces
// its collector by router.gogc and router.gc_headroom_mb from start until
// Close (the pacing itself is internal/gcpace's tests).
func TestRouteAlonePacesGC(t *testing.T) {
	a := startAlone(t, "route", "router.upstream_url=http://127.0.0.1:1/v1", "router.base_model=m",
		"router.gogc=150", "router.gc_headroom_mb=4096")
	// 4 GiB of headroom over a live heap of tens of MB: a target in the
	// thousands, set at start and again after each collection.
	for range 3 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
		if got := gcPercent(); got < 1000 {
			t.Fatalf("a route-only process runs at GOGC %d, want the headroom's (thousands)", got)
		}
	}
	a.Close()
	debug.SetGCPercent(100)
	for range 3 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	if got := gcPercent(); got != 100 {
		t.Fatalf("after Close the pacing went on: GOGC %d", got)
	}
}

func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}
