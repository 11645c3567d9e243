package envserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/traceops/trace/sink"
)

// stallWriter stands in for a ClickHouse that stops answering (simulated:
// the recorder's queue logic is what is tested; the real insert is tested
// against ClickHouse in record_test.go).
type stallWriter struct {
	release chan struct{}
	rows    atomic.Int64
	fail    bool
}

func (w *stallWriter) InsertEnvEpisodes(ctx context.Context, rows []sink.EnvEpisodeRow) error {
	if w.fail {
		return errors.New("simulated: clickhouse refuses the insert")
	}
	select {
	case <-w.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	w.rows.Add(int64(len(rows)))
	return nil
}

// TestRecorderNeverBlocks: with the writer stalled, offering episodes
// returns at once; past the queue's bound they are dropped and counted;
// once the writer answers, what was queued is written.
func TestRecorderNeverBlocks(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RecordQueue, cfg.RecordBatch, cfg.RecordFlush = 4, 1, 10*time.Millisecond
	m := newMetrics(prometheus.NewRegistry(), func() float64 { return 0 })
	w := &stallWriter{release: make(chan struct{})}
	r := newRecorder(w, cfg, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	go r.run()
	accepted := 0
	t0 := time.Now()
	for i := range 100 {
		if r.offer(sink.EnvEpisodeRow{EpisodeID: string(rune('a' + i%26))}) {
			accepted++
		}
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("offering 100 episodes to a stalled writer took %s", d)
	}
	// One batch is in the stalled writer, at most the queue's 4 wait.
	if accepted > 4+1+1 || accepted < 4 {
		t.Fatalf("accepted %d of 100 with a queue of 4", accepted)
	}
	if got := testutil.ToFloat64(m.dropped.WithLabelValues("queue_full")); got != float64(100-accepted) {
		t.Fatalf("queue_full drops %v, want %d", got, 100-accepted)
	}
	close(w.release)
	if n := r.stop(time.Minute); n != 0 {
		t.Fatalf("%d episodes abandoned at stop", n)
	}
	if got := w.rows.Load(); got != int64(accepted) {
		t.Fatalf("written %d, want the %d accepted", got, accepted)
	}
}

// TestRecorderWriteFailed: a batch ClickHouse keeps refusing is dropped
// after the retry bound and counted.
func TestRecorderWriteFailed(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RecordFlush = 10 * time.Millisecond
	m := newMetrics(prometheus.NewRegistry(), func() float64 { return 0 })
	r := newRecorder(&stallWriter{fail: true}, cfg, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	r.maxWait = 300 * time.Millisecond
	go r.run()
	r.offer(sink.EnvEpisodeRow{EpisodeID: "x"})
	r.offer(sink.EnvEpisodeRow{EpisodeID: "y"})
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(m.dropped.WithLabelValues("write_failed")) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("write_failed drops %v, want 2", testutil.ToFloat64(m.dropped.WithLabelValues("write_failed")))
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.stop(time.Minute)
}

// TestRecorderShutdown: with ClickHouse not answering, stop returns once
// its drain budget is spent (the writer's call is cut off, not awaited);
// the episodes it could not write, and one offered after it, are counted
// as dropped for reason "shutdown".
func TestRecorderShutdown(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RecordFlush = time.Hour // nothing is written before the shutdown
	m := newMetrics(prometheus.NewRegistry(), func() float64 { return 0 })
	w := &stallWriter{release: make(chan struct{})} // never released
	r := newRecorder(w, cfg, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	go r.run()
	for _, id := range []string{"a", "b", "c"} {
		if !r.offer(sink.EnvEpisodeRow{EpisodeID: id}) {
			t.Fatal("offer refused before the shutdown")
		}
	}
	if n := r.stop(100 * time.Millisecond); n != 3 {
		t.Fatalf("stop abandoned %d episodes, want 3", n)
	}
	if r.offer(sink.EnvEpisodeRow{EpisodeID: "late"}) {
		t.Fatal("an episode was queued after the recorder stopped")
	}
	if got := testutil.ToFloat64(m.dropped.WithLabelValues("shutdown")); got != 4 {
		t.Fatalf("shutdown drops %v, want 4", got)
	}
	if w.rows.Load() != 0 {
		t.Fatal("the stalled writer wrote")
	}
}

func TestSampled(t *testing.T) {
	n := 0
	for i := range 10000 {
		id := newID()
		if i%2 == 0 {
			id = string(rune(i))
		}
		if Sampled(id, 0.25) {
			n++
		}
		if !Sampled(id, 1) || Sampled(id, 0) {
			t.Fatal("rate 1 must take every episode, rate 0 none")
		}
	}
	if n < 2200 || n > 2800 {
		t.Fatalf("%d of 10000 sampled at 0.25", n)
	}
	if Sampled("abc", 0.5) != Sampled("abc", 0.5) {
		t.Fatal("not deterministic")
	}
}
