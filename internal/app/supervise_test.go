package app_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/chserver"
	"github.com/traceops/trace/internal/dev/testenv"
)

// readyz GETs /readyz (a hang fails the test after 10 s) and decodes it.
func readyz(t *testing.T, a *app.App) (int, app.ReadyReport) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	res, err := c.Get("http://" + a.HTTPAddr() + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var rep app.ReadyReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("GET /readyz: %d %q: %v", res.StatusCode, b, err)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET /readyz: content type %q", ct)
	}
	return res.StatusCode, rep
}

func check(rep app.ReadyReport, name string) (app.ReadyCheck, bool) {
	for _, c := range rep.Checks {
		if c.Name == name {
			return c, true
		}
	}
	return app.ReadyCheck{}, false
}

// TestEmbeddedClickHouseKilledMidStream kills the embedded ClickHouse
// server with SIGKILL (from outside, as the OOM killer would) while rollouts
// stream in: the exit is logged with its status, the supervisor restarts the
// server, /readyz says not ready (naming the server) until it is back, and
// then every rollout is present once and the statistics equal the ground
// truth.
func TestEmbeddedClickHouseKilledMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	if _, err := chserver.Find(); err != nil {
		testenv.Unavailable(t, "embedded ClickHouse: %v", err)
	}
	w := newWorld(t, "unused:9000", 3000)
	cfg := w.cfg
	cfg.ClickHouse.Addr = nil // the embedded server, supervised by Run
	cfg.Embedded.ClickHousePort, cfg.Embedded.ClickHouseHTTPPort = 0, 0
	var logs testenv.SyncBuffer
	a, stop := w.startLogged(t, cfg, &logs)
	<-a.Ready()
	ch := a.EmbeddedClickHouse()
	if ch == nil {
		t.Fatal("no embedded ClickHouse server")
	}
	if code, rep := readyz(t, a); code != 200 || rep.Status != "ready" {
		t.Fatalf("/readyz before the crash: %d %+v", code, rep)
	}
	w.publish(t, 0, 1000)
	time.Sleep(500 * time.Millisecond)
	pid := ch.Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Not ready, naming the server, until it is back.
	var down app.ReadyReport
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, rep := readyz(t, a)
		if c, ok := check(rep, "clickhouse_server"); code == 503 && ok && !c.OK && down.Status == "" {
			down = rep
		}
		if code == 200 && down.Status != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: last %d %+v; seen down: %+v\n%s", code, rep, down, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c, ok := check(down, "clickhouse_server"); !ok || c.OK || !strings.Contains(c.Error, "exited unexpectedly") {
		t.Errorf("/readyz while down: clickhouse_server check %+v; report %+v", c, down)
	}
	if c, ok := check(down, "nats"); !ok || !c.OK {
		t.Errorf("/readyz while down: nats check %+v (only ClickHouse is down)", c)
	}
	w.publish(t, 1000, 3000)
	w.waitComplete(t, a.Store, 2*time.Minute)
	w.exactlyOnce(t, a.Store)
	out := logs.String()
	if !strings.Contains(out, "exited unexpectedly") || !strings.Contains(out, `status="signal: killed"`) {
		t.Errorf("no log line says the server died and how:\n%s", out)
	}
	if ch.Pid() == 0 || ch.Pid() == pid {
		t.Errorf("server pid %d after the restart (was %d)", ch.Pid(), pid)
	}
	mfs, err := a.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "trace_embedded_clickhouse_") {
			got[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if got["trace_embedded_clickhouse_exits_total"] != 1 || got["trace_embedded_clickhouse_restarts_total"] != 1 {
		t.Errorf("metrics %v, want one exit and one restart", got)
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestReadyzWithClickHouseStopped: with the ClickHouse server frozen
// (SIGSTOP: connections are accepted by the kernel and never answered) and
// then shut down, /readyz answers within its check timeout, 503, naming
// ClickHouse and its error while the other checks pass; once ClickHouse is
// back it is 200. (A frozen server used to hold the probe for 5-10 s here,
// and longer while every pooled connection was busy.)
func TestReadyzWithClickHouseStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	ch := testenv.OwnClickHouse(t)
	w := newWorld(t, ch.Addr(), 200)
	cfg := w.cfg
	cfg.HTTP.ReadyTimeout = 500 * time.Millisecond
	a, stop := w.start(t, cfg)
	defer stop()
	<-a.Ready()
	w.publish(t, 0, 200)
	code, rep := readyz(t, a)
	if code != 200 || rep.Status != "ready" {
		t.Fatalf("/readyz: %d %+v", code, rep)
	}
	for _, name := range []string{"roles", "clickhouse", "nats", "kafka"} {
		if c, ok := check(rep, name); !ok || !c.OK {
			t.Errorf("check %s: %+v (present %v)", name, c, ok)
		}
	}
	notReady := func(how, wantErr string) {
		t.Helper()
		for i := 0; i < 3; i++ {
			start := time.Now()
			code, rep := readyz(t, a)
			took := time.Since(start)
			c, _ := check(rep, "clickhouse")
			t.Logf("/readyz with ClickHouse %s: %d in %s, clickhouse: %+v", how, code, took.Round(time.Millisecond), c)
			// The bound is the feature (a probe must answer): the checks'
			// timeout plus generous slack for a shared machine. Before, a
			// frozen server held the probe for the driver's dial timeout
			// (5 s) plus the wait for a pooled connection: 5-10 s here.
			if took > cfg.HTTP.ReadyTimeout+3*time.Second {
				t.Errorf("/readyz took %s, its checks' timeout is %s", took, cfg.HTTP.ReadyTimeout)
			}
			if code != 503 || rep.Status != "not ready" || c.OK || !strings.Contains(c.Error, wantErr) {
				t.Fatalf("/readyz with ClickHouse %s: %d %+v, want 503 with a clickhouse error containing %q", how, code, rep, wantErr)
			}
			for _, name := range []string{"roles", "nats", "kafka"} {
				if c, ok := check(rep, name); !ok || !c.OK {
					t.Errorf("check %s: %+v; only ClickHouse is down", name, c)
				}
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	pid := ch.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { syscall.Kill(pid, syscall.SIGCONT) }
	defer cont()
	w.publish(t, 0, 200) // consumers wait on the frozen server
	notReady("frozen (SIGSTOP)", "no answer within 500ms")
	cont()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ch.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	notReady("shut down", "connection refused")
	if err := ch.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		code, rep = readyz(t, a)
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz after the restart: %d %+v", code, rep)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestReadyzNamesAConsumerWithoutProgress: an ingest replica whose topic
// does not exist (kfake, like a cluster that does not create topics on
// use) answers pings on every dependency, yet ingests nothing: /readyz
// fails naming the consumer and the topic (it said ready), and passes once
// the topic exists. A sink failing on every insert (a full disk) is
// reported the same way (stream's TestConsumerProblemWhileTheSinkFails).
func TestReadyzNamesAConsumerWithoutProgress(t *testing.T) {
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	cfg := withRoles(w.cfg, "ingest")
	brokers := testenv.KFake(t).ListenAddrs()
	cfg.Kafka.Brokers = brokers
	a, stop := w.start(t, cfg)
	defer stop()
	<-a.Ready()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, rep := readyz(t, a)
		c, ok := check(rep, "consumer_ingest")
		if code == 503 && ok && !c.OK && strings.Contains(c.Error, "topic "+cfg.Kafka.RolloutsTopic+" does not exist") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz with the ingest topic missing: %d %+v", code, rep)
		}
		time.Sleep(200 * time.Millisecond)
	}
	testenv.CreateTopic(t, brokers, cfg.Kafka.RolloutsTopic, 1)
	testenv.CreateTopic(t, brokers, cfg.Kafka.DLQTopic, 1)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		code, rep := readyz(t, a)
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz once the topic exists: %d %+v", code, rep)
		}
	}
}
