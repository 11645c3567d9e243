package adapter_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// redeliveryHarness runs the reference trainer's NATS worker (trace_trainer
// worker.serve, unchanged) named argv[3], with the training itself
// replaced: a job reports started, then, with argv[5] "progress", a
// progress event (iteration 3, mean reward 0.9) every 0.1 s until the
// worker is asked to stop (SIGTERM), when it raises train.Stopped as
// train.run does (or for ever: a worker to kill); otherwise it waits for
// the file argv[2]/release-<job>,
// reports one progress event (iteration 1, mean reward 0.25) and returns
// its adapter. argv[4] is the worker's --max-deliveries.
const redeliveryHarness = `
import os, sys, time
sys.path.insert(0, sys.argv[1])
from trace_trainer import train, worker

dir, name, max_deliveries, mode = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]

def run(job, emit, opts):
    emit("started", iterations=3)
    if mode == "progress":
        while not train.stop_requested.is_set():
            emit("progress", iteration=3, iterations=3, mean_reward=0.9, reward_std=0.1)
            time.sleep(0.1)
        raise train.Stopped("stopped by a signal before the last iteration")
    while not os.path.exists(os.path.join(dir, "release-" + job["job_id"])):
        time.sleep(0.05)
    emit("progress", iteration=1, iterations=3, mean_reward=0.25, reward_std=0.1)
    return {"adapter": {"name": job["output"]["adapter_name"], "uri": job["output"]["uri"]},
            "eval": {"mean_reward": 0.7, "success_rate": 0.5, "episodes": 4, "base_mean_reward": 0.4}}

train.run = run
sys.exit(worker.serve(os.environ["NATS_URL"], train.Options(), name, os.path.join(dir, "spool-" + name), max_deliveries))
`

// startRedeliveryWorker runs redeliveryHarness as worker name (killed when
// t ends).
func startRedeliveryWorker(t *testing.T, py, dir, natsURL, name string, maxDeliveries int, mode string) *outageWorker {
	t.Helper()
	trainerDir, err := filepath.Abs("../trainer")
	if err != nil {
		t.Fatal(err)
	}
	harness := filepath.Join(dir, "redelivery.py")
	if err := os.WriteFile(harness, []byte(redeliveryHarness), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, harness, trainerDir, dir, name, itoa(maxDeliveries), mode)
	cmd.Env = append(os.Environ(), "NATS_URL="+natsURL)
	out := &testenv.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &outageWorker{cmd: cmd, exited: make(chan error, 1), out: out}
	go func() { w.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-w.exited
		}
		t.Logf("worker %s's output:\n%s", name, out.String())
	})
	return w
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// kill ends the worker as a crash would (SIGKILL: no terminal event, no
// ack).
func (w *outageWorker) kill(t *testing.T) {
	t.Helper()
	w.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-w.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("a killed worker did not exit")
	}
}

// jobHistory is a job's history in ClickHouse, as "type worker seq" lines
// (trace's own entries without worker and seq).
func jobHistory(t *testing.T, st *sink.Store, job string) []string {
	t.Helper()
	evs, err := st.TrainingEvents(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		var p struct {
			Worker string `json:"worker"`
			Seq    *int64 `json:"seq"`
		}
		_ = json.Unmarshal([]byte(e.Payload), &p)
		line := e.Type
		if p.Worker != "" {
			line += " " + p.Worker
		}
		if p.Seq != nil {
			line += " " + itoa(int(*p.Seq))
		}
		out = append(out, line)
	}
	return out
}

// redeliveryFixture is what the redelivery tests share: the trainer's
// Python, NATS, ClickHouse, the adapt role (a 2-minute deadline: the
// redelivery, not the deadline, must save a job; the workers' Python
// start-up takes seconds) and a directory for the workers.
type redeliveryFixture struct {
	py, nats, dir string
	st            *sink.Store
	b             *bus.Bus
}

// newRedeliveryFixture starts it; consumer makes the trainers' consumer
// before the adapt role starts.
func newRedeliveryFixture(t *testing.T, consumer func(*bus.Bus) error) *redeliveryFixture {
	t.Helper()
	py := trainerPython(t)
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	b, err := bus.Connect(context.Background(), bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if err := consumer(b); err != nil {
		t.Fatal(err)
	}
	pc := fastPlan()
	pc.Deadline = 2 * time.Minute
	r := startRolePlan(t, b, st, pc, 200*time.Millisecond)
	t.Cleanup(r.stop)
	return &redeliveryFixture{py: py, nats: srv.URL(), dir: t.TempDir(), st: st, b: b}
}

// worker starts a harness worker (startRedeliveryWorker).
func (f *redeliveryFixture) worker(t *testing.T, name string, maxDeliveries int, mode string) *outageWorker {
	t.Helper()
	return startRedeliveryWorker(t, f.py, f.dir, f.nats, name, maxDeliveries, mode)
}

// publish announces a ready environment for trigger and returns its
// job's id.
func (f *redeliveryFixture) publish(t *testing.T, trigger string) string {
	t.Helper()
	ready := readyFor(trigger, "precondition_verification")
	if err := f.b.PublishEnvironmentReady(context.Background(), ready); err != nil {
		t.Fatal(err)
	}
	return schemas.TrainingJobID(ready.EnvironmentID, 1)
}

// status is the job's row (an empty one while there is none).
func (f *redeliveryFixture) status(t *testing.T, id string) *sink.TrainingJobRow {
	t.Helper()
	j, err := f.st.TrainingJob(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if j == nil {
		return &sink.TrainingJobRow{}
	}
	return j
}

// has reports whether the job's history has a line starting with line.
// restarted waits for job id's row to show a second worker's started:
// RUNNING at iteration 0, mean reward 0 (the first worker's run is over).
// The event is stored before the row is written, so a read right after
// the event may see the row before it; the second worker reports nothing
// more until it is released.
func (f *redeliveryFixture) restarted(t *testing.T, id string) {
	t.Helper()
	waitFor(t, "the job RUNNING at iteration 0, mean reward 0 after the second worker's started", 10*time.Second, func() bool {
		j := f.status(t, id)
		return j.Status == adapter.StatusRunning && j.Iteration == 0 && j.MeanReward == 0
	})
}

func (f *redeliveryFixture) has(t *testing.T, id, line string) func() bool {
	return func() bool {
		for _, l := range jobHistory(t, f.st, id) {
			if strings.HasPrefix(l, line) {
				return true
			}
		}
		return false
	}
}

// TestReferenceTrainerCrashRedeliversTheJob: the reference trainer's NATS
// worker keeps its job un-acked while it trains, with in-progress acks
// below the consumer's ack wait, and acks it when its terminal event is
// published. So a second worker waiting beside it does not get the job
// while the first one lives (three ack waits), and gets it one ack wait
// after the first is killed (SIGKILL: no event, no ack), long before the
// job's deadline: it trains it from the start, numbering its events past
// the first worker's (both runs are in the history, neither overwrites
// the other), the adapt role restarts the job's iteration and mean reward
// with the second started, and the job SUCCEEDED with the second run's
// adapter leaves the work queue empty. A job delivered more times than a
// worker's --max-deliveries (every worker that took it died) is reported
// FAILED at once, with the deliveries in the reason, and terminated.
func TestReferenceTrainerCrashRedeliversTheJob(t *testing.T) {
	const ackWait = 2 * time.Second
	f := newRedeliveryFixture(t, func(b *bus.Bus) error { // as trace's bus makes it, with a short ack wait
		_, err := b.TrainerConsumer(context.Background(), ackWait)
		return err
	})
	ctx, st, b := context.Background(), f.st, f.b
	status := func(id string) *sink.TrainingJobRow { return f.status(t, id) }
	has := func(id, line string) func() bool { return f.has(t, id, line) }

	a := f.worker(t, "worker-a", 3, "progress")
	id := f.publish(t, "t-redeliver")
	waitFor(t, "worker-a's progress applied", 60*time.Second, func() bool { j := status(id); return j.Iteration == 3 && j.MeanReward == 0.9 })
	bw := f.worker(t, "worker-b", 3, "wait")
	time.Sleep(3 * ackWait)
	if has(id, "started worker-b")() {
		t.Fatalf("worker-b got the job while worker-a trained it: %v", jobHistory(t, st, id))
	}

	a.kill(t)
	killed := time.Now()
	waitFor(t, "worker-b's started applied", 30*time.Second, has(id, "started worker-b"))
	t.Logf("redelivered %.1fs after the kill (ack wait %v)", time.Since(killed).Seconds(), ackWait)
	f.restarted(t, id)
	if err := os.WriteFile(filepath.Join(f.dir, "release-"+id), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job to end", 30*time.Second, func() bool { return adapter.Terminal(status(id).Status) })
	j := status(id)
	if j.Status != adapter.StatusSucceeded || j.Iteration != 1 || j.MeanReward != 0.25 {
		t.Errorf("job %s: %s iteration %d mean reward %.2f (%s), want SUCCEEDED with worker-b's iteration 1, 0.25", id, j.Status, j.Iteration, j.MeanReward, j.Reason)
	}
	hist := jobHistory(t, st, id)
	want := []string{"started worker-a 0", "progress worker-a 1", "started worker-b 1000000000", "progress worker-b 1000000001", "succeeded worker-b 1000000002"}
	for _, w := range want {
		if !strings.Contains(strings.Join(hist, "\n")+"\n", w+"\n") {
			t.Errorf("history lacks %q: %v", w, hist)
		}
	}
	waitFor(t, "the job acked off the work queue", 30*time.Second, func() bool { return queued(t, b) == 0 })
	if a, err := st.Adapter(ctx, j.AdapterName); err != nil || a == nil || a.JobID != id {
		t.Errorf("adapter %s: %+v %v", j.AdapterName, a, err)
	}

	// A second job: worker-b dies training it, and the only worker left
	// takes at most one delivery.
	bw.cmd.Process.Kill()
	<-bw.exited
	c := f.worker(t, "worker-c", 3, "progress")
	id2 := f.publish(t, "t-redeliver-2")
	waitFor(t, "worker-c's progress on the second job", 60*time.Second, has(id2, "progress worker-c"))
	c.kill(t)
	f.worker(t, "worker-d", 1, "wait")
	waitFor(t, "the second job to end", 60*time.Second, func() bool { return adapter.Terminal(status(id2).Status) })
	if j := status(id2); j.Status != adapter.StatusFailed || !strings.Contains(j.Reason, "delivered 2 times (more than 1)") {
		t.Errorf("second job: %s %q, want FAILED for its deliveries", j.Status, j.Reason)
	}
	if has(id2, "started worker-d")() {
		t.Errorf("worker-d trained a job past its deliveries: %v", jobHistory(t, st, id2))
	}
	waitFor(t, "the second job terminated off the work queue", 30*time.Second, func() bool { return queued(t, b) == 0 })
}

// TestReferenceTrainerSIGTERMHandsTheJobBack: a reference worker stopped by
// SIGTERM (eviction, spot reclaim, a rolling deploy) while it trains stops
// after its current step and hands the job back (a nak, no terminal event)
// rather than reporting it failed: a worker waiting beside it takes it at
// once, not one ack wait later (60 s here), trains it from the start (its
// started is a new run), and the job ends SUCCEEDED with that worker's
// adapter; the stopped worker exits 0.
func TestReferenceTrainerSIGTERMHandsTheJobBack(t *testing.T) {
	const ackWait = 60 * time.Second // a redelivery by the ack wait comes too late for the test
	f := newRedeliveryFixture(t, func(b *bus.Bus) error {
		_, err := b.TrainerConsumer(context.Background(), ackWait)
		return err
	})
	st, b := f.st, f.b
	status := func(id string) *sink.TrainingJobRow { return f.status(t, id) }
	has := func(id, line string) func() bool { return f.has(t, id, line) }

	a := f.worker(t, "worker-a", 3, "progress")
	id := f.publish(t, "t-sigterm")
	waitFor(t, "worker-a's progress applied", 60*time.Second, func() bool { j := status(id); return j.Iteration == 3 && j.MeanReward == 0.9 })
	bw := f.worker(t, "worker-b", 3, "wait")
	waitFor(t, "worker-b waiting for jobs", 60*time.Second, func() bool { return strings.Contains(bw.out.String(), "waiting for jobs") })

	a.cmd.Process.Signal(syscall.SIGTERM)
	stopped := time.Now()
	waitFor(t, "worker-b's started applied", 20*time.Second, has(id, "started worker-b"))
	t.Logf("worker-b took the job %.1fs after worker-a's SIGTERM (ack wait %v)", time.Since(stopped).Seconds(), ackWait)
	select {
	case err := <-a.exited:
		if err != nil {
			t.Errorf("worker-a after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("worker-a still running 30 s after SIGTERM")
	}
	if has(id, "failed worker-a")() {
		t.Errorf("worker-a reported the job it handed back failed: %v", jobHistory(t, st, id))
	}
	f.restarted(t, id)
	if err := os.WriteFile(filepath.Join(f.dir, "release-"+id), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job to end", 30*time.Second, func() bool { return adapter.Terminal(status(id).Status) })
	j := status(id)
	if j.Status != adapter.StatusSucceeded || j.Iteration != 1 || j.MeanReward != 0.25 {
		t.Errorf("job %s: %s iteration %d mean reward %.2f (%s), want SUCCEEDED with worker-b's iteration 1, 0.25", id, j.Status, j.Iteration, j.MeanReward, j.Reason)
	}
	hist := jobHistory(t, st, id)
	for _, w := range []string{"started worker-a 0", "started worker-b 1000000000"} {
		if !strings.Contains(strings.Join(hist, "\n")+"\n", w+"\n") {
			t.Errorf("history lacks %q: %v", w, hist)
		}
	}
	// worker-b's success is numbered in its delivery's range; its seq
	// depends on how many heartbeats (one a second here) it sent while the
	// test released it, more on a loaded machine.
	if !f.has(t, id, "succeeded worker-b 1000000")() {
		t.Errorf("history lacks worker-b's succeeded, numbered from 1000000000: %v", hist)
	}
	for _, l := range hist {
		if strings.HasPrefix(l, "failed") {
			t.Errorf("history has %q: %v", l, hist)
		}
	}
	waitFor(t, "the job acked off the work queue", 30*time.Second, func() bool { return queued(t, b) == 0 })
	if !strings.Contains(a.out.String(), "handed back (nak)") {
		t.Errorf("worker-a did not log the hand-back")
	}
}

// queued is the number of jobs on the trainers' work queue (taken or not).
func queued(t *testing.T, b *bus.Bus) uint64 {
	t.Helper()
	s, err := b.JS.Stream(context.Background(), bus.StreamTrainingJobs)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// TestReferenceTrainersTrainInParallel: a job is acked when it ends, so the
// consumer's MaxAckPending is how many jobs train at once fleet-wide. Two
// reference workers on a consumer an older worker made (MaxAckPending 1,
// when a job was acked as it was taken) raise it, and each trains one of
// two jobs at the same time, rather than the second job waiting for the
// first to end.
func TestReferenceTrainersTrainInParallel(t *testing.T) {
	f := newRedeliveryFixture(t, func(b *bus.Bus) error { // as an older worker made it
		_, err := b.JS.CreateOrUpdateConsumer(context.Background(), bus.StreamTrainingJobs, jetstream.ConsumerConfig{
			Durable: bus.DurableTrainers, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Minute, MaxAckPending: 1,
		})
		return err
	})
	ctx, st, b := context.Background(), f.st, f.b
	f.worker(t, "worker-a", 3, "progress")
	f.worker(t, "worker-b", 3, "progress")
	ids := []string{f.publish(t, "t-parallel-1"), f.publish(t, "t-parallel-2")}
	// Both train for ever ("progress"): both jobs RUNNING with progress
	// means two trained at once.
	waitFor(t, "both jobs training at once", 60*time.Second, func() bool {
		for _, id := range ids {
			j, err := st.TrainingJob(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if j == nil || j.Status != adapter.StatusRunning || j.Iteration != 3 {
				return false
			}
		}
		return true
	})
	c, err := b.JS.Consumer(ctx, bus.StreamTrainingJobs, bus.DurableTrainers)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxAckPending != bus.TrainerMaxAckPending || info.NumAckPending != 2 {
		t.Fatalf("consumer MaxAckPending %d with %d pending, want %d with both jobs pending", info.Config.MaxAckPending, info.NumAckPending, bus.TrainerMaxAckPending)
	}
}
