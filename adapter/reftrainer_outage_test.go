package adapter_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
)

// outageHarness runs the reference trainer's NATS worker (trace_trainer
// worker.serve, unchanged) with the training itself replaced: the job
// reports started, then a progress event every 0.1 s until the file argv[3]
// exists, then returns its adapter (argv[4] is the spool directory). The
// worker's publish deadline is
// lowered from 30 s to 0.5 s so that an outage of a few seconds is longer
// than it.
const outageHarness = `
import os, sys, time
sys.path.insert(0, sys.argv[1])
from trace_trainer import train, worker

worker.PUBLISH_TIMEOUT = 0.5
release = sys.argv[3]

def run(job, emit, opts):
    emit("started", iterations=3)
    i = 0
    while not os.path.exists(release):
        i += 1
        emit("progress", iteration=min(i, 3), iterations=3, mean_reward=0.5, reward_std=0.1)
        time.sleep(0.1)
    return {"adapter": {"name": job["output"]["adapter_name"], "uri": job["output"]["uri"]},
            "eval": {"mean_reward": 0.7, "success_rate": 0.5, "episodes": 4, "base_mean_reward": 0.4}}

train.run = run
sys.exit(worker.serve(sys.argv[2], train.Options(), "outage-test", sys.argv[4]))
`

// outageJob is a training_job/v1 with every field the reference trainer
// reads.
func outageJob(t *testing.T, id string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"schema": schemas.TrainingJobSchema, "job_id": id, "base_model": "tiny",
		"env_server": map[string]any{"base_url": "http://127.0.0.1:1/v1/environments/x"},
		"lora":       map[string]any{"rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": []string{"q_proj"}},
		"grpo": map[string]any{"group_size": 2, "groups_per_iteration": 1, "iterations": 3, "learning_rate": 1e-5, "temperature": 1.0,
			"kl_coef": 0.0, "clip_epsilon": 0.2, "max_grad_norm": 1.0, "hint_ratio": 0.0, "advantage": "group_std"},
		"eval":   map[string]any{"seeds": []int{1}, "rollouts_per_seed": 2, "success_threshold": 1.0},
		"output": map[string]any{"adapter_name": "outage-" + id, "uri": "file:///tmp/trace-test-adapters/outage-" + id},
		"report": map[string]any{"events_subject": schemas.SubjectTrainingEvents + "." + id, "heartbeat_seconds": 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// jobEvents returns the types of the events stored for job so far, in
// stream order.
func jobEvents(t *testing.T, js jetstream.JetStream, job string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, bus.StreamTrainingEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{schemas.SubjectTrainingEvents + "." + job}})
	if err != nil {
		return nil // NATS is not back yet
	}
	var types []string
	for {
		batch, err := c.FetchNoWait(100)
		if err != nil {
			return types
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var e struct {
				Type string `json:"type"`
			}
			if err := json.Unmarshal(m.Data(), &e); err != nil {
				t.Fatalf("event %s: %v", m.Data(), err)
			}
			types = append(types, e.Type)
		}
		if n == 0 {
			return types
		}
	}
}

// waitEvent waits (at most 60 s) until job has an event of type typ.
func waitEvent(t *testing.T, srv *testenv.NATSServer, job, typ string) []string {
	t.Helper()
	var types []string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, js := srv.Connect(t)
		types = jobEvents(t, js, job)
		for _, ty := range types {
			if ty == typ {
				return types
			}
		}
	}
	t.Fatalf("job %s: no %s event; events %v", job, typ, types)
	return nil
}

// TestReferenceTrainerSurvivesNATSOutage: NATS goes down in the middle of
// a job of the reference trainer's NATS worker and stays down for longer
// than the worker's publish deadline, while the job reports progress and
// then finishes. The job is not aborted: when NATS is back its succeeded
// event is in the events stream, last (no failed event, no heartbeat after
// it), the spool is empty, the worker is still there to take the next
// job, and it stops at SIGTERM without waiting out the drain timeout. (It
// used to give each event 30 s: the job was aborted, its failed event
// could not be sent either, and the worker exited.)
func TestReferenceTrainerSurvivesNATSOutage(t *testing.T) {
	const job = "job-outage00000000001"
	py, srv, b, dir, release, spool := outageSetup(t)
	w := startOutageWorker(t, py, dir, srv.URL(), release, spool)
	startOutageJob(t, srv, b, job)

	// Down for 4 × the deadline while the job reports progress, then the
	// job ends while NATS is still down.
	srv.Shutdown()
	time.Sleep(2 * time.Second)
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	select {
	case err := <-w.exited:
		t.Fatalf("the worker exited during the outage: %v", err)
	default:
	}
	srv.Restart()

	types := waitEvent(t, srv, job, "succeeded")
	for _, ty := range types {
		if ty == "failed" {
			t.Errorf("job %s reported failed: events %v", job, types)
		}
	}
	if types[len(types)-1] != "succeeded" {
		t.Errorf("the terminal event is not last: %v", types)
	}

	// The worker takes the next job.
	const next = "job-outage00000000002"
	if err := b.PublishTrainingJob(context.Background(), next, outageJob(t, next)); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, srv, next, "succeeded")
	if left := spooled(t, spool); len(left) != 0 {
		t.Errorf("delivered terminal events left in the spool: %v", left)
	}
	// SIGTERM: exit 0, without waiting out nats-py's drain timeout (30 s;
	// the pull subscription's queue is never done, so draining it did).
	if err := w.stop(); err != nil {
		t.Errorf("SIGTERM: %v, want exit 0", err)
	}
	if strings.Contains(w.out.String(), "DrainTimeoutError") {
		t.Error("the worker's stop waited out the connection's drain timeout")
	}
}

// TestReferenceTrainerKeepsAnUndeliveredTerminalEvent: a worker stopped
// (SIGTERM) while NATS is down and its job's terminal event not delivered
// exits 0 and leaves the event in its spool directory; the next worker
// started on that directory, once NATS is back, sends it before taking
// jobs, and empties the spool.
func TestReferenceTrainerKeepsAnUndeliveredTerminalEvent(t *testing.T) {
	const job = "job-outage00000000003"
	py, srv, b, dir, release, spool := outageSetup(t)
	first := startOutageWorker(t, py, dir, srv.URL(), release, spool)
	startOutageJob(t, srv, b, job)
	srv.Shutdown()
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); len(spooled(t, spool)) == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the undelivered terminal event was not written to the spool")
		}
	}
	if err := first.stop(); err != nil {
		t.Fatalf("the worker stopped with its terminal event undelivered: %v, want exit 0", err)
	}
	if left := spooled(t, spool); len(left) != 1 || left[0] != job+".json" {
		t.Fatalf("spool after the stop: %v, want %s.json", left, job)
	}

	srv.Restart()
	startOutageWorker(t, py, dir, srv.URL(), release, spool)
	types := waitEvent(t, srv, job, "succeeded")
	if types[len(types)-1] != "succeeded" || slices.Contains(types, "failed") {
		t.Errorf("events %v, want the succeeded event last and no failed", types)
	}
	for deadline := time.Now().Add(60 * time.Second); len(spooled(t, spool)) != 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the spool still holds %v after the event was sent", spooled(t, spool))
		}
	}
}

// outageSetup starts the embedded NATS and a bus on it (closed when t
// ends), and names the harness's release file and the spool directory in
// dir.
func outageSetup(t *testing.T) (py string, srv *testenv.NATSServer, b *bus.Bus, dir, release, spool string) {
	t.Helper()
	py = trainerPython(t)
	srv = testenv.NATS(t)
	b, err := bus.Connect(context.Background(), bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.NC.Close)
	dir = t.TempDir()
	return py, srv, b, dir, filepath.Join(dir, "release"), filepath.Join(dir, "spool")
}

// startOutageJob publishes job and waits for its first progress event.
func startOutageJob(t *testing.T, srv *testenv.NATSServer, b *bus.Bus, job string) {
	t.Helper()
	if err := b.PublishTrainingJob(context.Background(), job, outageJob(t, job)); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, srv, job, "progress")
}

// spooled lists the worker's spool directory.
func spooled(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

type outageWorker struct {
	cmd    *exec.Cmd
	exited chan error
	out    *testenv.SyncBuffer // stdout and stderr
}

// stop sends SIGTERM and returns how the worker exited (at most 60 s).
func (w *outageWorker) stop() error {
	w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-w.exited:
		return err
	case <-time.After(60 * time.Second):
		w.cmd.Process.Kill()
		return errors.New("still running 60 s after SIGTERM: killed")
	}
}

// startOutageWorker runs outageHarness (stopped when t ends).
func startOutageWorker(t *testing.T, py, dir, natsURL, release, spool string) *outageWorker {
	t.Helper()
	trainerDir, err := filepath.Abs("../trainer")
	if err != nil {
		t.Fatal(err)
	}
	harness := filepath.Join(dir, "harness.py")
	if err := os.WriteFile(harness, []byte(outageHarness), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, harness, trainerDir, natsURL, release, spool)
	out := &testenv.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &outageWorker{cmd: cmd, exited: make(chan error, 1), out: out}
	go func() { w.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			w.stop()
		}
		t.Logf("the worker's output:\n%s", out.String())
	})
	return w
}
