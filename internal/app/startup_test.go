package app_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
)

// TestStartWaitsForClickHouseWithBackoff: a ClickHouse that comes up 4 s
// after trace is waited for with growing pauses, with one warning (the
// attempts so far and the last error) rather than one a second, and the
// store opens once it answers. A server that never comes fails after the
// overall deadline with an error naming its address.
func TestStartWaitsForClickHouseWithBackoff(t *testing.T) {
	ch := testenv.ClickHouse(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there yet: connection refused, retried

	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	type result struct {
		st  *sink.Store
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		st, err := app.OpenStore(context.Background(), sink.Config{Addr: []string{addr}, Database: ch.Database}, log)
		done <- result{st, err}
	}()
	time.Sleep(4 * time.Second)
	testenv.NewProxy(t, addr, ch.Addr) // the server comes up
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("no store 30s after ClickHouse came up:\n%s", logs.String())
	}
	if r.err != nil {
		t.Fatalf("%v\n%s", r.err, logs.String())
	}
	r.st.Close()
	out := logs.String()
	warnings := strings.Count(out, "clickhouse not reachable yet")
	t.Logf("store opened after %s:\n%s", time.Since(start).Round(time.Millisecond), out)
	if warnings != 1 || !strings.Contains(out, "attempts=1 ") || !strings.Contains(out, "connection refused") || !strings.Contains(out, "addr="+addr) {
		t.Errorf("%d warnings in the first 4s: want exactly one, naming the address, the attempts and the last error", warnings)
	}
	if !strings.Contains(out, "clickhouse reachable") {
		t.Errorf("no line saying ClickHouse became reachable")
	}

	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	t0 := time.Now()
	_, err = app.OpenStoreWithin(context.Background(), sink.Config{Addr: []string{gone}, Database: ch.Database}, slog.New(slog.DiscardHandler), 2*time.Second)
	if took := time.Since(t0); err == nil || !strings.Contains(err.Error(), "clickhouse at "+gone+" not reachable within 2s") || took > 4*time.Second {
		t.Errorf("after the deadline (%s): %v; want an error naming %s and the deadline", took, err, gone)
	}
}

// TestStartWaitsForNATS: a NATS server that comes up 6 s after trace is
// waited for, with a warning naming its URL, and Start succeeds once it
// answers. (Start failed after 5 s with "nats: stream TRACE_SYNTHESIS:
// context deadline exceeded", naming neither the server nor the cause,
// while it waits a minute for ClickHouse.)
func TestStartWaitsForNATS(t *testing.T) {
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there yet
	cfg, err := config.Load("", []string{"data_dir=" + t.TempDir(), "roles=analyze", "http.addr=127.0.0.1:0",
		"kafka.brokers=127.0.0.1:1", "clickhouse.addr=" + ch.Addr, "clickhouse.database=" + ch.Database, "nats.url=nats://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	type result struct {
		a   *app.App
		err error
	}
	done := make(chan result, 1)
	go func() {
		a, err := app.Start(context.Background(), cfg, log)
		done <- result{a, err}
	}()
	select {
	case r := <-done:
		if r.err == nil {
			r.a.Close()
		}
		t.Fatalf("Start returned before NATS came up: %v\n%s", r.err, logs.String())
	case <-time.After(6 * time.Second):
	}
	testenv.NewProxy(t, addr, strings.TrimPrefix(ns.URL(), "nats://")) // the server comes up
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("Start did not return 30s after NATS came up:\n%s", logs.String())
	}
	if r.err != nil {
		t.Fatalf("%v\n%s", r.err, logs.String())
	}
	r.a.Close()
	out := logs.String()
	if !strings.Contains(out, "nats not reachable yet") || !strings.Contains(out, "url=nats://"+addr) || !strings.Contains(out, "connection refused") {
		t.Errorf("no warning naming the URL and the error while waiting:\n%s", out)
	}
	if !strings.Contains(out, "nats reachable") {
		t.Errorf("no line saying NATS became reachable:\n%s", out)
	}
}

// TestOpenBusGivesUpNamingTheURL: a NATS server that never comes fails
// after the overall deadline with an error naming its URL and the cause.
func TestOpenBusGivesUpNamingTheURL(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	_, err = app.OpenBusWithin(context.Background(), bus.Config{URL: "nats://" + gone}, slog.New(slog.DiscardHandler), 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), "nats at nats://"+gone+" not reachable within 2s") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("after the deadline: %v; want an error naming nats://%s, the deadline and the cause", err, gone)
	}
}
