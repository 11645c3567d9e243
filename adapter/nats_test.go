package adapter_test

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/dispatch"
	"github.com/traceops/trace/adapter/plan"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

func readyFor(trigger, capability string) *schemas.EnvironmentReady {
	id := schemas.EnvironmentID(trigger)
	hash := strings.Repeat("ab", 32)
	return &schemas.EnvironmentReady{Schema: schemas.EnvironmentReadySchema, EnvironmentID: id, TriggerID: trigger, Environment: "sim-airline",
		AgentVersion: "1.4.0", DictionaryVersion: 1,
		Capability:  schemas.ReadyCapability{Name: capability, Definition: "d"},
		Program:     schemas.ReadyProgram{Hash: hash, Origin: schemas.OriginTemplate, Tools: []string{"get_reservation_details"}, Attempts: 1},
		Calibration: schemas.ReadyCalib{Policy: "simulated", Simulated: true, Seeds: 100, RolloutsPerSeed: 16, Temperature: 0.7, MeanReward: 0.45, StdReward: 0.4, SuccessRate: 0.38, PassAtK: map[string]float64{"1": 0.38}},
		Fetch:       schemas.ReadyFetch{Path: schemas.EnvironmentProgramPath(id), ClickHouse: schemas.ClickHouseRef{Table: "environments", EnvironmentID: id, ProgramHash: hash}},
		ReadyAt:     time.Now().UTC().Truncate(time.Second)}
}

// fastPlan reports every second and fails a job silent for 2 s.
func fastPlan() plan.Config {
	c := plan.DefaultConfig()
	c.Heartbeat, c.Deadline = time.Second, 2*time.Second
	c.OutputURI = "file:///tmp/trace-test-adapters"
	return c
}

// role is a running adapt role: the ready and events consumers and the
// deadline check, as internal/app runs them.
type role struct {
	stage  *adapter.Stage
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startRole(t *testing.T, b *bus.Bus, st *sink.Store) *role {
	t.Helper()
	return startRolePlan(t, b, st, fastPlan(), 200*time.Millisecond)
}

// startRolePlan starts the adapt role with the plan pc, checking deadlines
// every deadlineEvery.
func startRolePlan(t *testing.T, b *bus.Bus, st *sink.Store, pc plan.Config, deadlineEvery time.Duration) *role {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, rc, ec := adaptStage(ctx, t, b, st, pc)
	r := &role{stage: s, cancel: cancel}
	for _, fn := range []func() error{
		func() error { return s.RunReady(ctx, rc) },
		func() error { return s.RunEvents(ctx, ec) },
		func() error { return s.RunDeadlines(ctx, deadlineEvery) },
	} {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if err := fn(); err != nil {
				t.Errorf("adapt role: %v", err)
			}
		}()
	}
	return r
}

func (r *role) stop() { r.cancel(); r.wg.Wait() }

// adaptStage is the adapt role's stage with the plan pc, dispatching to
// trainers over NATS, and its ready and training-events consumers.
func adaptStage(ctx context.Context, t *testing.T, b *bus.Bus, st *sink.Store, pc plan.Config) (*adapter.Stage, jetstream.Consumer, jetstream.Consumer) {
	t.Helper()
	s, err := adapter.NewStage(adapter.Config{Plan: pc, Store: st, Claims: b, Backend: dispatch.NATS{Pub: b}, Queue: b,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := b.ReadyConsumer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	ec, err := b.TrainingEventsConsumer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s, rc, ec
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startTrainer builds and runs testdata/trainer against the NATS server;
// the returned function returns the jobs it took (its "job" lines).
func startTrainer(t *testing.T, natsURL string) func() []string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "trainer")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/trainer").CombinedOutput(); err != nil {
		t.Fatalf("build trainer: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "NATS_URL="+natsURL)
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		jobs []string
	)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			t.Log("trainer: " + sc.Text())
			if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "job" {
				mu.Lock()
				jobs = append(jobs, f[1]+" "+f[2])
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), jobs...)
	}
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func jobsPublished(t *testing.T, b *bus.Bus) uint64 {
	t.Helper()
	s, err := b.JS.Stream(context.Background(), bus.StreamTrainingJobs)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// TestNATSBackendEndToEnd: three ready environments go to a trainer
// process that speaks the nats protocol; one succeeds (status, history,
// registry), one fails (its reason), one goes silent (the deadline fails
// it). Ready events redelivered — published again past the duplicate
// window, and all of them again to a restarted role whose consumer starts
// over — dispatch nothing more.
func TestNATSBackendEndToEnd(t *testing.T) {
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	trainerJobs := startTrainer(t, srv.URL())
	r := startRole(t, b, st)

	ok, fails, silent := readyFor("t-ok", "multi_step_completion"), readyFor("t-fail", "tool_fails_often"), readyFor("t-silent", "goes_silent")
	for _, e := range []*schemas.EnvironmentReady{ok, fails, silent} {
		if err := b.PublishEnvironmentReady(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// A redelivery past JetStream's duplicate window: no Msg-Id.
	data, _ := json.Marshal(ok)
	if _, err := b.JS.Publish(ctx, bus.SubjectEnvReady, data); err != nil {
		t.Fatal(err)
	}
	idOK, idFail, idSilent := schemas.TrainingJobID(ok.EnvironmentID, 1), schemas.TrainingJobID(fails.EnvironmentID, 1), schemas.TrainingJobID(silent.EnvironmentID, 1)
	status := func(id string) *sink.TrainingJobRow {
		j, err := st.TrainingJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	final := func(id string) func() bool {
		return func() bool { j := status(id); return j != nil && adapter.Terminal(j.Status) }
	}
	waitFor(t, "the succeeding job", 30*time.Second, final(idOK))
	waitFor(t, "the failing job", 30*time.Second, final(idFail))
	waitFor(t, "the silent job's deadline", 30*time.Second, final(idSilent))

	j := status(idOK)
	if j.Status != adapter.StatusSucceeded || j.Backend != "nats" || j.Iteration != 3 || j.MeanReward < 0.59 || j.MeanReward > 0.61 {
		t.Errorf("succeeded job: %+v", j)
	}
	evs, err := st.TrainingEvents(ctx, idOK)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range evs {
		types = append(types, e.Type)
	}
	if strings.Join(types, ",") != "dispatched,started,progress,progress,progress,succeeded" {
		t.Errorf("history of %s: %v", idOK, types)
	}
	if evs[4].Iteration != 3 || evs[4].RewardStd != 0.2 || !evs[4].HasKL {
		t.Errorf("progress event: %+v", evs[4])
	}
	a, err := st.Adapter(ctx, j.AdapterName)
	if err != nil || a == nil {
		t.Fatalf("adapter of %s not registered: %v", idOK, err)
	}
	if a.Status != adapter.AdapterCandidate || a.JobID != idOK || a.Capability != "multi_step_completion" || a.URI != "file:///tmp/trace-test-adapters/"+j.AdapterName ||
		a.EvalMeanReward != 0.71 || a.EvalSuccessRate != 0.55 || a.BaseModel != plan.DefaultBaseModel || a.Simulated {
		t.Errorf("adapter row: %+v", a)
	}
	if j := status(idFail); j.Status != adapter.StatusFailed || j.Reason != "CUDA out of memory (test trainer)" {
		t.Errorf("failed job: %+v", j)
	}
	if j := status(idSilent); j.Status != adapter.StatusFailed || !strings.HasPrefix(j.Reason, "deadline: no event from the trainer since") {
		t.Errorf("silent job: %+v", j)
	}
	if as, _ := st.Adapters(ctx, sink.AdapterFilter{}); len(as) != 1 {
		t.Errorf("only the succeeded job registers an adapter: %+v", as)
	}
	if n := jobsPublished(t, b); n != 3 {
		t.Errorf("%d jobs on %s, want 3 (one per environment)", n, bus.StreamTrainingJobs)
	}

	// Restart the role; its consumer starts over, so every ready event is
	// delivered again.
	r.stop()
	if err := b.JS.DeleteConsumer(ctx, bus.StreamEnvReady, bus.DurableAdapter); err != nil {
		t.Fatal(err)
	}
	r = startRole(t, b, st)
	defer r.stop()
	waitFor(t, "the redelivered ready events to be acked", 20*time.Second, func() bool {
		c, err := b.JS.Consumer(ctx, bus.StreamEnvReady, bus.DurableAdapter)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.AckFloor.Stream >= 4 && info.NumAckPending == 0
	})
	if n := jobsPublished(t, b); n != 3 {
		t.Errorf("after a restart: %d jobs on %s, want still 3", n, bus.StreamTrainingJobs)
	}
	if got := trainerJobs(); len(got) != 3 {
		t.Errorf("the trainer took %v, want 3 jobs", got)
	}
	if j := status(idOK); j.Status != adapter.StatusSucceeded {
		t.Errorf("after a restart the succeeded job is %s", j.Status)
	}
	_ = jetstream.ErrConsumerNotFound
}

// TestNATSJobNoTrainerTookIsWithdrawn: with no trainer running, a job's
// deadline fails it with a reason that says no trainer ever reported (and
// where trainers take jobs), and the job leaves the trainers' queue: a
// trainer started later used to take it and train it for hours, its
// success then ignored because the job was FAILED.
func TestNATSJobNoTrainerTookIsWithdrawn(t *testing.T) {
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r := startRole(t, b, st)
	defer r.stop()
	var ids []string
	for _, e := range []*schemas.EnvironmentReady{readyFor("t-nobody-1", "nobody_trains"), readyFor("t-nobody-2", "nobody_trains_either")} {
		if err := b.PublishEnvironmentReady(ctx, e); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, schemas.TrainingJobID(e.EnvironmentID, 1))
	}
	queued := func() uint64 {
		s, err := b.JS.Stream(ctx, bus.StreamTrainingJobs)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	waitFor(t, "both jobs queued", 20*time.Second, func() bool { return jobsPublished(t, b) == 2 })
	for _, id := range ids {
		waitFor(t, "the deadline of "+id, 30*time.Second, func() bool {
			j, _ := st.TrainingJob(ctx, id)
			return j != nil && j.Status == adapter.StatusFailed
		})
		j, _ := st.TrainingJob(ctx, id)
		if !strings.HasPrefix(j.Reason, "deadline: no event from the trainer since") || !strings.Contains(j.Reason, "no trainer ever reported on it") ||
			!strings.Contains(j.Reason, "trace.training.jobs") {
			t.Errorf("reason of %s: %s", id, j.Reason)
		}
	}
	waitFor(t, "the failed jobs to leave the queue", 10*time.Second, func() bool { return queued() == 0 })

	// Withdrawing takes out the one job named, once.
	for _, id := range []string{"job-w1", "job-w2", "job-w3"} {
		if err := b.PublishTrainingJob(ctx, id, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := b.WithdrawTrainingJob(ctx, "job-w2"); !ok || err != nil {
		t.Fatalf("withdraw job-w2: %v %v", ok, err)
	}
	if ok, err := b.WithdrawTrainingJob(ctx, "job-w2"); ok || err != nil {
		t.Fatalf("withdraw job-w2 again: %v %v", ok, err)
	}
	if n := queued(); n != 2 {
		t.Fatalf("%d jobs queued, want job-w1 and job-w3", n)
	}
}
