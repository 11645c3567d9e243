package app_test

import (
	"context"
	"log/slog"
	"runtime/debug"
	"testing"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/testenv"
)

// TestServeAloneSetsGOGC: a process that runs the serve role alone sets
// the collector target to env.gogc at start (the rule itself is
// config.TestGCPercent's table).
func TestServeAloneSetsGOGC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ClickHouse and NATS")
	}
	t.Setenv("GOGC", "") // as unset: GOGC in the environment would win
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	cfg, err := config.Load("", []string{"data_dir=" + t.TempDir(), "roles=serve", "http.addr=127.0.0.1:0",
		"kafka.embedded_addr=127.0.0.1:0", "clickhouse.addr=" + ch.Addr, "clickhouse.database=" + ch.Database,
		"nats.url=" + ns.URL(), "env.gogc=321"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.Start(context.Background(), cfg, slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := debug.SetGCPercent(100); got != 321 {
		t.Fatalf("a serve-only process runs at GOGC %d, want env.gogc 321", got)
	}
}
