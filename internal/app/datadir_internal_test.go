package app

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/datadir"
)

// TestStartOnAHeldDataDir: Start on a data directory another owner holds
// (here a lock this process took, which flock(2) treats as another
// process's) fails before it starts anything, naming the directory, the
// holder's pid and data_dir; once released, the directory can be taken.
func TestStartOnAHeldDataDir(t *testing.T) {
	dir := t.TempDir()
	held, err := datadir.Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load("", []string{"data_dir=" + dir, "kafka.embedded_addr=127.0.0.1:0", "embedded.clickhouse_port=0",
		"embedded.clickhouse_http_port=0", "embedded.nats_port=0", "http.addr=127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := Start(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		a.Close()
		t.Fatal("Start on a held data directory succeeded")
	}
	var busy *datadir.BusyError
	msg := err.Error()
	if !errors.As(err, &busy) || !strings.Contains(msg, "data directory "+dir+" is in use") ||
		!strings.Contains(msg, "(pid "+strconv.Itoa(os.Getpid())+")") || !strings.Contains(msg, "--set data_dir=") {
		t.Fatalf("Start on a held data directory: %v; want it to name the directory, the pid and data_dir", err)
	}
	if es, _ := os.ReadDir(dir); len(es) != 1 || es[0].Name() != datadir.FileName {
		t.Errorf("Start touched the held directory: %v", es)
	}
	held.Release()
	l, err := LockDataDir(cfg)
	if err != nil {
		t.Fatalf("after the holder released it: %v", err)
	}
	l.Release()
}

// TestEmbedsServers: the data directory is taken by a process that starts
// an embedded server (each of them keeps its data there), not by one whose
// servers are all configured (replicas on one host may share a working
// directory; the training specs under it are per job).
func TestEmbedsServers(t *testing.T) {
	for _, c := range []struct {
		sets []string
		want bool
	}{
		{nil, true},
		{[]string{"kafka.brokers=k:9092", "clickhouse.addr=c:9000", "nats.url=nats://n:4222"}, false},
		{[]string{"clickhouse.addr=c:9000", "nats.url=nats://n:4222"}, true},
		{[]string{"kafka.brokers=k:9092", "nats.url=nats://n:4222"}, true},
		{[]string{"kafka.brokers=k:9092", "clickhouse.addr=c:9000"}, true},
		{[]string{"kafka.brokers=k:9092", "clickhouse.addr=c:9000", "roles=ingest"}, false}, // no NATS
	} {
		cfg, err := config.Load("", c.sets)
		if err != nil {
			t.Fatal(err)
		}
		if got := embedsServers(cfg); got != c.want {
			t.Errorf("%v: embedsServers %v, want %v", c.sets, got, c.want)
		}
	}
}
