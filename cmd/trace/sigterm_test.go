package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer/envprog"
)

// TestMain lets the test binary act as the trace binary (TRACE_TEST_MAIN=1),
// so process-level behaviour (signals, exit codes) is tested on the real
// main function.
func TestMain(m *testing.M) {
	envprog.RunWorkerIfRequested() // `trace env` tests run programs in sandbox workers
	if os.Getenv("TRACE_TEST_MAIN") == "1" {
		os.Args = append([]string{"trace"}, strings.Fields(os.Getenv("TRACE_TEST_ARGS"))...)
		main()
		os.Exit(0)
	}
	testenv.Main(m)
}

// TestSIGTERMDrainsAndExitsZero runs `trace run --roles ingest` as a
// process, sends SIGTERM mid-stream, and expects exit 0 within 10 s with
// every committed rollout durable in ClickHouse and nothing written that was
// not committed.
func TestSIGTERMDrainsAndExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	brokers := testenv.Kafka(t)
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	topic := testenv.UniqueTopic(t, "rollouts")
	testenv.CreateTopic(t, brokers, topic, 4)
	testenv.CreateTopic(t, brokers, topic+".dlq", 1)
	group := "ingest-" + topic
	args := []string{"run", "--roles", "ingest", "--set", "kafka.brokers=" + brokers[0], "--set", "kafka.rollouts_topic=" + topic,
		"--set", "kafka.dlq_topic=" + topic + ".dlq", "--set", "kafka.ingest_group=" + group, "--set", "kafka.batch_rows=400",
		"--set", "kafka.batch_timeout=2s", "--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database,
		"--set", "nats.url=" + ns.URL(), "--set", "data_dir=" + t.TempDir(), "--set", "http.addr=127.0.0.1:0"}

	const n = 6000
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{}, Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 500}
	gen := simulate.New(simulate.Config{Seed: 3, Rollouts: n})
	var msgs []kafka.Message
	for r := gen.Next(); r != nil; r = gen.Next() {
		b, _ := json.Marshal(r)
		msgs = append(msgs, kafka.Message{Key: []byte(r.Key()), Value: b})
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	w.Close()

	cmd := traceProcess(args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	st, err := sink.Open(context.Background(), sink.Config{Addr: []string{ch.Addr}, Database: ch.Database}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Wait until some but not all rollouts are stored: mid-stream.
	deadline := time.Now().Add(60 * time.Second)
	for {
		d, _, err := st.CountDistinctRollouts(context.Background())
		if err == nil && d > 0 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("nothing stored after 60s:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	sent := time.Now()
	if err := terminate(t, cmd, 15*time.Second, &logs); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
	}
	took := time.Since(sent)
	if took > 10*time.Second {
		t.Fatalf("exit took %s after SIGTERM, want < 10s", took)
	}
	stored, _, err := st.CountDistinctRollouts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := &kafka.Client{Addr: kafka.TCP(brokers...)}
	res, err := c.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: {0, 1, 2, 3}}})
	if err != nil {
		t.Fatal(err)
	}
	var committed int64
	for _, p := range res.Topics[topic] {
		if p.CommittedOffset > 0 {
			committed += p.CommittedOffset
		}
	}
	t.Logf("exit 0 %s after SIGTERM; %d rollouts stored, %d offsets committed of %d", took.Round(time.Millisecond), stored, committed, n)
	if committed == 0 || int64(stored) != committed {
		t.Fatalf("stored %d rollouts but committed %d offsets: the drain must commit exactly what it wrote\n%s", stored, committed, logs.String())
	}
}

// TestSIGTERMDuringStartUp: SIGTERM while trace run still waits for an
// unreachable ClickHouse exits 0 at once, saying what it was waiting for
// (it printed "trace: context canceled" and exited 1).
func TestSIGTERMDuringStartUp(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused, retried
	args := []string{"run", "--roles", "ingest", "--set", "clickhouse.addr=" + addr, "--set", "kafka.brokers=127.0.0.1:1",
		"--set", "nats.url=nats://127.0.0.1:1", "--set", "data_dir=" + t.TempDir(), "--set", "http.addr=127.0.0.1:0"}
	cmd := traceProcess(args...)
	var logs testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "clickhouse not reachable yet") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("trace run is not waiting for ClickHouse:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := terminate(t, cmd, 15*time.Second, &logs); err != nil || !strings.Contains(logs.String(), "stopped while waiting for ClickHouse at "+addr) {
		t.Fatalf("exit after SIGTERM during start-up: %v\n%s", err, logs.String())
	}
}

// traceProcess is this test binary run as the trace binary with args (see
// TestMain).
func traceProcess(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TRACE_TEST_MAIN=1", "TRACE_TEST_ARGS="+strings.Join(args, " "))
	return cmd
}

// terminate sends cmd SIGTERM and returns how it exited; a process still
// running after within is killed and fails the test, with logs.
func terminate(t *testing.T, cmd *exec.Cmd, within time.Duration, logs fmt.Stringer) error {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		cmd.Process.Kill()
		t.Fatalf("no exit %s after SIGTERM:\n%s", within, logs)
		return nil
	}
}
