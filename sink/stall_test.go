package sink_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// TestStalledInsertIsLogged: a ClickHouse that accepts connections but
// stops answering (a proxy in front of the real server that stops
// forwarding) held inserts with nothing in the log. Now an INSERT waiting
// longer than clickhouse.stall_warning is logged as stalled, naming its
// table and the rows it holds (a Batcher's batch, before any row reached
// the server), again at most every three times that while it stays stuck,
// and the gauge trace_clickhouse_inserts_stalled says so until the server
// answers again; then the rows are stored. The ingest stage's streamed
// INSERT stuck at its end names the rows appended to it.
func TestStalledInsertIsLogged(t *testing.T) {
	ch := testenv.ClickHouse(t)
	ch.Store() // migrated
	proxy := testenv.NewProxy(t, "127.0.0.1:0", ch.Addr)
	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ctx := context.Background()
	const after = 300 * time.Millisecond
	st, err := sink.Open(ctx, sink.Config{Addr: []string{proxy.Addr}, Database: ch.Database, StallWarning: after}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	reg := prometheus.NewRegistry()
	if err := st.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	stalled := func() float64 { return labelsMetric(t, reg, "trace_clickhouse_inserts_stalled") }
	label := func(id string) sink.LabelRow {
		return sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: id, Environment: "env", AgentVersion: "v1",
			DictionaryVersion: 1, Capability: "cap", Label: schemas.LabelLacking, Source: "rules",
			TS: time.Date(2025, 6, 2, 9, 0, 0, 0, time.UTC)}}
	}
	// A first insert: the pool holds a connection to the server.
	if err := st.InsertLabels(ctx, []sink.LabelRow{label("r0")}); err != nil {
		t.Fatal(err)
	}

	proxy.Hang()
	b := &sink.Batcher[sink.LabelRow]{Insert: st.InsertLabels, Name: "labels", Log: log, Every: 50 * time.Millisecond}
	for i := range 7 {
		b.Add(label(fmt.Sprint("r", i+1)))
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(rctx) }()
	defer func() { cancel(); <-done }()

	warned := func() int { return strings.Count(logs.String(), "clickhouse: insert stalled") }
	start := time.Now()
	for warned() < 2 {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("no stall warnings 20s into a hung insert (want one after %s, again after %s):\n%s", after, 3*after, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	waited := time.Since(start)
	out := logs.String()
	if !strings.Contains(out, "table=capability_labels rows=7") {
		t.Errorf("the warning does not name the table and the 7 rows waiting:\n%s", out)
	}
	if n := warned(); n > 1+int(waited/(3*after))+1 {
		t.Errorf("%d warnings in %s: want at most one every %s", n, waited, 3*after)
	}
	if g := stalled(); g != 1 {
		t.Errorf("trace_clickhouse_inserts_stalled{table=capability_labels} = %v while stalled, want 1", g)
	}

	proxy.Resume()
	for b.Pending() > 0 || !strings.Contains(logs.String(), "clickhouse: stalled insert went on") {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("the insert did not go on after the server answered again:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if g := stalled(); g != 0 {
		t.Errorf("trace_clickhouse_inserts_stalled = %v after the insert went on, want 0", g)
	}
	if n := labelsMetric(t, reg, "trace_clickhouse_insert_stalls_total"); n != 1 {
		t.Errorf("trace_clickhouse_insert_stalls_total = %v, want 1", n)
	}
	// Pending counts the rows waiting, not the batch in flight: its
	// write ends after the warning's "went on".
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		labeled, _, err := st.CountLabels(ctx)
		if err == nil && labeled == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rollouts labeled (%v), want 8", labeled, err)
		}
	}

	// The ingest stage's streamed INSERT, stuck at its end: the rows
	// appended are named.
	ins, err := st.BeginRollouts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ins.Abort()
	for i := range 3 {
		row := sink.RolloutRowFrom(rollout(fmt.Sprint("s", i), true), sink.Coord{Topic: "t", Offset: int64(i)})
		if err := ins.Append(&row); err != nil {
			t.Fatal(err)
		}
	}
	proxy.Hang()
	committed := make(chan error, 1)
	go func() { committed <- ins.Commit() }()
	for !strings.Contains(logs.String(), "table=rollouts rows=3") {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("no stall warning for the streamed insert:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	proxy.Resume()
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if n, err := st.CountRollouts(ctx); err != nil || n != 3 {
		t.Errorf("%d rollouts stored (%v), want 3", n, err)
	}
}

// labelsMetric is the value of the gauge or counter name{table="capability_labels"}
// gathered from reg (0 when it has none).
func labelsMetric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == "capability_labels" {
				return m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
