package adapter_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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

// newStage is an adapt stage on real NATS (claims) and ClickHouse with a
// backend; the backend's Reporter is the stage.
func newStage(t *testing.T, b *bus.Bus, st *sink.Store, backend adapter.Backend, tweak func(*plan.Config)) *adapter.Stage {
	t.Helper()
	p := fastPlan()
	p.Deadline = time.Hour // these tests run no deadline check; keep jobs open
	if tweak != nil {
		tweak(&p)
	}
	s, err := adapter.NewStage(adapter.Config{Plan: p, Store: st, Claims: b, Backend: backend,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func historyTypes(t *testing.T, st *sink.Store, id string) ([]string, []sink.TrainingEventRow) {
	t.Helper()
	evs, err := st.TrainingEvents(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range evs {
		types = append(types, e.Type)
	}
	return types, evs
}

// dead: the process is gone, or a zombie its new parent has not reaped
// yet (a killed orphan is reparented).
func dead(pid int) bool {
	for range 20 {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] == "Z" {
				return true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func count(ss []string, s string) int {
	n := 0
	for _, x := range ss {
		if x == s {
			n++
		}
	}
	return n
}

// TestCommandBackend runs testdata/commands/trainer.sh per job, in run
// mode: a script that succeeds (events from its stdout, relayed to the
// job's events subject and applied by the events consumer — of another
// replica here, as any trainer's: status, history, registry), one that fails (FAILED with the exit code and stderr's tail),
// one that hangs (the timeout kills its whole process group: its child is
// gone), one that prints malformed event lines (recorded as malformed, not
// fatal: the job still succeeds), one that exits 0 without a terminal
// event (FAILED, documented). A dispatch while every slot is busy is
// refused, and the same job is dispatched again once a slot is free.
func TestCommandBackend(t *testing.T) {
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	script, _ := filepath.Abs("testdata/commands/trainer.sh")
	specDir := t.TempDir()
	// The scripts wait at a gate (a file) after their started event, so
	// that all five hold their slots until the sixth dispatch was refused.
	gate := filepath.Join(t.TempDir(), "open")
	cmd, err := dispatch.NewCommand(dispatch.CommandConfig{Argv: []string{"sh", script, "{spec}", "{job_id}", "{adapter_name}", "{output_uri}"},
		SpecDir: specDir, Timeout: 3 * time.Second, KillGrace: time.Second, MaxRunning: 5, Env: []string{"GATE=" + gate}},
		slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s := newStage(t, b, st, cmd, nil)
	cmd.Reporter, cmd.Relay = s, b
	// The events are applied by another replica's events consumer: the
	// replica that runs the command applies none itself.
	r := startRoleWith(t, b, newStage(t, b, st, nil, nil))
	defer r.stop()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = cmd.Run(runCtx) }()

	caps := []string{"must_succeed", "will_fail", "may_hang", "prints_malformed", "stays_quiet"}
	ids := map[string]string{}
	for _, c := range caps {
		r := readyFor("t-cmd-"+c, c)
		res, err := s.HandleReady(ctx, r)
		if err != nil || !res.Dispatched {
			t.Fatalf("dispatch %s: %+v %v", c, res, err)
		}
		ids[c] = res.JobID
		if _, err := os.Stat(filepath.Join(specDir, res.JobID+".json")); err != nil {
			t.Errorf("spec file of %s: %v", c, err)
		}
	}
	// Every slot is busy: refused, recorded DISPATCHED, retried below.
	late := readyFor("t-cmd-late", "late_succeed")
	if _, err := s.HandleReady(ctx, late); !errors.Is(err, dispatch.ErrBusy) {
		t.Fatalf("a sixth command with 5 slots: %v, want ErrBusy", err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	eventsApplied(t, b)

	job := func(id string) *sink.TrainingJobRow {
		j, err := st.TrainingJob(ctx, id)
		if err != nil || j == nil {
			t.Fatalf("job %s: %v", id, err)
		}
		return j
	}
	// Succeeded: events from stdout, adapter registered.
	j := job(ids["must_succeed"])
	if j.Status != adapter.StatusSucceeded || j.Backend != "command" || j.Iteration != 2 || j.MeanReward != 0.55 {
		t.Errorf("succeeding command: %+v", j)
	}
	types, evs := historyTypes(t, st, j.JobID)
	if strings.Join(types, ",") != "dispatched,started,progress,progress,succeeded,command_exited" {
		t.Errorf("history of the succeeding command: %v", types)
	}
	if n := subjectMessages(t, b, j.JobID); n != 4 {
		t.Errorf("%d messages on the succeeding command's events subject, want its 4 events", n)
	}
	if evs[3].KL != 0.002 || !evs[3].HasKL || evs[3].RewardStd != 0.15 {
		t.Errorf("progress event from stdout: %+v", evs[3])
	}
	if a, err := st.Adapter(ctx, j.AdapterName); err != nil || a == nil || a.EvalMeanReward != 0.7 || a.Status != adapter.AdapterCandidate ||
		!strings.Contains(a.Metadata, `"backend":"command"`) {
		t.Errorf("adapter of the succeeding command: %+v %v", a, err)
	}
	// Failed: the exit code and stderr's tail.
	j = job(ids["will_fail"])
	if j.Status != adapter.StatusFailed || !strings.Contains(j.Reason, "command exited with code 3") ||
		!strings.Contains(j.Reason, "RuntimeError: CUDA out of memory (test trainer)") {
		t.Errorf("failing command: %s %q", j.Status, j.Reason)
	}
	types, evs = historyTypes(t, st, j.JobID)
	if strings.Join(types, ",") != "dispatched,started,progress,command_exited,failed" || !strings.Contains(evs[3].Payload, `"exit_code":3`) {
		t.Errorf("history of the failing command: %v %s", types, evs[3].Payload)
	}
	// Hung: killed at the timeout, with its child.
	j = job(ids["may_hang"])
	if j.Status != adapter.StatusFailed || !strings.HasPrefix(j.Reason, "command timed out after 3s; its process group was killed") {
		t.Errorf("hanging command: %s %q", j.Status, j.Reason)
	}
	pidText, err := os.ReadFile(filepath.Join(specDir, ids["may_hang"]+".json.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(pidText)))
	if pid <= 0 {
		t.Fatalf("child pid %q", pidText)
	}
	if !dead(pid) {
		t.Errorf("the hanging command's child %d is still running: the process group was not killed", pid)
	}
	// Malformed lines: recorded, not fatal.
	j = job(ids["prints_malformed"])
	if j.Status != adapter.StatusSucceeded {
		t.Errorf("malformed lines are not fatal: %s %q", j.Status, j.Reason)
	}
	types, evs = historyTypes(t, st, j.JobID)
	if count(types, "malformed") != 3 || count(types, "succeeded") != 1 || count(types, "progress") != 1 {
		t.Errorf("history with malformed lines: %v", types)
	}
	var malformed []string
	for _, e := range evs {
		if e.Type == "malformed" {
			malformed = append(malformed, e.Payload)
		}
		if strings.Contains(e.Payload, "a log line, not an event") {
			t.Errorf("a log line is output, not history: %+v", e)
		}
	}
	if len(malformed) == 3 && (!strings.Contains(malformed[0], `"type":"progress"`) || !strings.Contains(malformed[0], "stdout line 3") ||
		!strings.Contains(malformed[1], "finished") || !strings.Contains(malformed[2], "mean_reward")) {
		t.Errorf("malformed entries keep the line and the reason: %q", malformed)
	}
	// Exit 0 without a terminal event.
	j = job(ids["stays_quiet"])
	if j.Status != adapter.StatusFailed || j.Reason != "command exited 0 without reporting succeeded or failed" {
		t.Errorf("quiet command: %s %q", j.Status, j.Reason)
	}

	// The refused job is dispatched again now that slots are free.
	res, err := s.HandleReady(ctx, late)
	if err != nil || !res.Dispatched || res.Duplicate {
		t.Fatalf("retry of the refused dispatch: %+v %v", res, err)
	}
	cmd.Wait()
	eventsApplied(t, b)
	if j := job(res.JobID); j.Status != adapter.StatusSucceeded {
		t.Errorf("the retried job: %s %q", j.Status, j.Reason)
	}
	// And a redelivery of a finished job dispatches nothing.
	if res, err := s.HandleReady(ctx, readyFor("t-cmd-must_succeed", "must_succeed")); err != nil || !res.Duplicate {
		t.Errorf("redelivered ready event: %+v %v", res, err)
	}
	_ = schemas.TrainingEventSchema
}

// TestCommandBackendSubmitMode: the command returns at once (a scheduler's
// submit); exit 0 is recorded as submitted (the job stays DISPATCHED) and
// the trainer's events then come over NATS; a submit command that fails
// fails its job with the code and stderr.
func TestCommandBackendSubmitMode(t *testing.T) {
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cmd, err := dispatch.NewCommand(dispatch.CommandConfig{Mode: dispatch.ModeSubmit,
		Argv: []string{"sh", "-c", `case "$1" in *refuse*) echo "sbatch: error: invalid partition specified: gpu" >&2; exit 1;; esac; echo "Submitted batch job 4242 for $0"`,
			"{job_id}", "{adapter_name}"},
		SpecDir: t.TempDir()}, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if c := cmd.Config(); c.Timeout != dispatch.DefaultSubmitTimeout || c.MaxRunning != dispatch.DefaultSubmitRunning {
		t.Errorf("submit defaults: %+v", c)
	}
	s := newStage(t, b, st, cmd, nil)
	cmd.Reporter, cmd.Relay = s, b
	r := startRoleWith(t, b, s)
	defer r.stop()

	okRes, err := s.HandleReady(ctx, readyFor("t-submit-ok", "accepted_job"))
	if err != nil || !okRes.Dispatched {
		t.Fatal(okRes, err)
	}
	badRes, err := s.HandleReady(ctx, readyFor("t-submit-bad", "refuse_partition"))
	if err != nil || !badRes.Dispatched {
		t.Fatal(badRes, err)
	}
	cmd.Wait()
	eventsApplied(t, b)
	j, _ := st.TrainingJob(ctx, okRes.JobID)
	if j.Status != adapter.StatusDispatched {
		t.Errorf("an accepted submission waits for the trainer: %s %q", j.Status, j.Reason)
	}
	types, evs := historyTypes(t, st, okRes.JobID)
	if strings.Join(types, ",") != "dispatched,submitted" || !strings.Contains(evs[1].Payload, "Submitted batch job 4242 for "+okRes.JobID) {
		t.Errorf("history of the accepted submission: %v %+v", types, evs)
	}
	j, _ = st.TrainingJob(ctx, badRes.JobID)
	if j.Status != adapter.StatusFailed || !strings.Contains(j.Reason, "submit command exited with code 1; stderr: sbatch: error: invalid partition") {
		t.Errorf("a refused submission: %s %q", j.Status, j.Reason)
	}
	// The scheduler's trainer reports over NATS.
	it, mr := 1, 0.5
	for _, e := range []*schemas.TrainingEvent{
		{JobID: okRes.JobID, Type: schemas.EventStarted, At: time.Now().UTC(), Worker: "slurm-4242"},
		{JobID: okRes.JobID, Type: schemas.EventProgress, At: time.Now().UTC(), Iteration: &it, MeanReward: &mr, RewardStd: new(float64)},
		{JobID: okRes.JobID, Type: schemas.EventSucceeded, At: time.Now().UTC(), Adapter: &schemas.EventAdapter{Name: j.AdapterName, URI: "s3://x/y"},
			Eval: &schemas.EvalMetrics{MeanReward: 0.6, SuccessRate: 0.5, Episodes: 10}},
	} {
		if err := b.PublishTrainingEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the submitted job's success over NATS", 20*time.Second, func() bool {
		j, _ := st.TrainingJob(ctx, okRes.JobID)
		return j != nil && j.Status == adapter.StatusSucceeded
	})
}

// startRoleWith runs the events consumer of an existing stage.
func startRoleWith(t *testing.T, b *bus.Bus, s *adapter.Stage) *role {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ec, err := b.TrainingEventsConsumer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := &role{stage: s, cancel: cancel}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if err := s.RunEvents(ctx, ec); err != nil {
			t.Errorf("events: %v", err)
		}
	}()
	return r
}

// eventsApplied waits until the events consumer has applied every event
// published so far.
func eventsApplied(t *testing.T, b *bus.Bus) {
	t.Helper()
	ec, err := b.TrainingEventsConsumer(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the events consumer to apply every event", 30*time.Second, func() bool {
		info, err := ec.Info(context.Background())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

// subjectMessages is how many messages a job's events subject holds.
func subjectMessages(t *testing.T, b *bus.Bus, jobID string) uint64 {
	t.Helper()
	stream, err := b.JS.Stream(context.Background(), bus.StreamTrainingEvents)
	if err != nil {
		t.Fatal(err)
	}
	subj := schemas.TrainingEventsSubject(jobID)
	info, err := stream.Info(context.Background(), jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subj]
}

// TestCommandBackendRelayFails: the command's events cannot be relayed
// (NATS away: the backend's connection is closed); after RelayFor the job
// fails with the reason, through the stage, and no adapter is registered
// from events nobody applied.
func TestCommandBackendRelayFails(t *testing.T) {
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	gone, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test-gone")
	if err != nil {
		t.Fatal(err)
	}
	gone.Close()
	script, _ := filepath.Abs("testdata/commands/trainer.sh")
	cmd, err := dispatch.NewCommand(dispatch.CommandConfig{Argv: []string{"sh", script, "{spec}", "{job_id}", "{adapter_name}", "{output_uri}"},
		SpecDir: t.TempDir(), RelayFor: time.Second}, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s := newStage(t, b, st, cmd, nil)
	cmd.Reporter, cmd.Relay = s, gone
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = cmd.Run(runCtx) }()
	res, err := s.HandleReady(ctx, readyFor("t-cmd-relay-fails", "must_succeed"))
	if err != nil || !res.Dispatched {
		t.Fatalf("%+v %v", res, err)
	}
	cmd.Wait()
	j, err := st.TrainingJob(ctx, res.JobID)
	if err != nil || j == nil {
		t.Fatal(j, err)
	}
	if j.Status != adapter.StatusFailed || !strings.Contains(j.Reason, "could not be relayed to NATS (trace.training.events."+res.JobID+") within 1s") {
		t.Errorf("job %s %q", j.Status, j.Reason)
	}
	if a, err := st.Adapter(ctx, j.AdapterName); err != nil || a != nil {
		t.Errorf("adapter registered from events nobody applied: %+v %v", a, err)
	}
}

// TestReferenceTrainerWithoutItsDependencies: the reference trainer run by
// a Python that lacks its dependencies (here python3 -S: no site-packages,
// so none of torch, trl, openenv) fails its job with a reason that says
// which Python, what is missing and how to install it, through a failed
// event on the command protocol; it used to die in a traceback, and the
// job's reason was the traceback's last lines.
func TestReferenceTrainerWithoutItsDependencies(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cmd, err := dispatch.NewCommand(dispatch.CommandConfig{Argv: []string{py, "-S", "-m", "trace_trainer", "--spec", "{spec}"},
		Dir: filepath.Join("..", "trainer"), SpecDir: t.TempDir()}, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s := newStage(t, b, st, cmd, nil)
	cmd.Reporter, cmd.Relay = s, b
	r := startRoleWith(t, b, s)
	defer r.stop()
	res, err := s.HandleReady(ctx, readyFor("t-trainer-no-deps", "precondition_verification"))
	if err != nil || !res.Dispatched {
		t.Fatal(res, err)
	}
	cmd.Wait()
	eventsApplied(t, b)
	j, _ := st.TrainingJob(ctx, res.JobID)
	if j == nil || j.Status != adapter.StatusFailed {
		t.Fatalf("job %+v", j)
	}
	for _, want := range []string{"cannot import the trainer's dependencies", "No module named", "pip install -r ", "requirements.txt", "adapter.command.argv[0]"} {
		if !strings.Contains(j.Reason, want) {
			t.Errorf("the reason lacks %q: %s", want, j.Reason)
		}
	}
	// The trainer's failed event, then the exit (code 1, as after any
	// failed job; its own failure comes after the job ended).
	if types, _ := historyTypes(t, st, res.JobID); len(types) < 3 || types[1] != "failed" || types[2] != "command_exited" || count(types, "malformed") != 0 {
		t.Errorf("history %v", types)
	}
}

// TestReferenceTrainerRejectsBadOptions: options out of range stop the
// trainer at start (exit 2) naming the option, before any job: a
// --max-completion-length below 64 made TRL drop tool results silently.
func TestReferenceTrainerRejectsBadOptions(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	for _, tc := range []struct{ args, want string }{
		{"--max-completion-length 32", "argument --max-completion-length: must be at least 64 (below it TRL drops tool results silently), got 32"},
		{"--max-tool-calls 0", "argument --max-tool-calls: must be at least 1, got 0"},
		{"--max-tool-calls many", "argument --max-tool-calls: 'many' is not an integer"},
	} {
		cmd := exec.Command(py, append([]string{"-S", "-m", "trace_trainer", "--spec", "job.json"}, strings.Fields(tc.args)...)...)
		cmd.Dir = filepath.Join("..", "trainer")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: %v\n%s", tc.args, err, out)
		}
	}
}

// TestReferenceTrainerInAPartlyBuiltVenv: a venv with some of the
// trainer's dependencies (openenv-core's venv: openenv, but none of
// torch, transformers, trl, peft or nats) is one "built partly": the
// trainer says which Python, what is missing and the install command, as
// without any of them. With --spec it reported the job started, then
// failed with "ModuleNotFoundError: No module named 'torch'" alone; with
// --nats it died in a traceback (exit 1) instead of exiting 2 before
// taking a job.
func TestReferenceTrainerInAPartlyBuiltVenv(t *testing.T) {
	py := testenv.OpenEnvVenv.Require(t)
	pc := plan.DefaultConfig()
	pc.OutputURI = "file://" + t.TempDir()
	j, err := pc.Build(plan.Input{Ready: readyFor("t-partly-built", "precondition_verification"), Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	data, err := j.Encode()
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(t.TempDir(), "job.json")
	if err := os.WriteFile(spec, data, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (stdout, stderr string, code int) {
		cmd := exec.Command(py, append([]string{"-m", "trace_trainer"}, args...)...)
		cmd.Dir = filepath.Join("..", "trainer")
		var o, e strings.Builder
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return o.String(), e.String(), cmd.ProcessState.ExitCode()
	}
	out, errOut, code := run("--spec", spec)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	e, derr := schemas.DecodeTrainingEvent([]byte(lines[len(lines)-1]))
	if code != 1 || len(lines) != 1 || derr != nil || e.Type != schemas.EventFailed {
		t.Fatalf("--spec: exit %d, events %q (%v), want exit 1 and one failed event\n%s", code, lines, derr, errOut)
	}
	for _, want := range []string{py, "cannot import the trainer's dependencies", "torch", "pip install -r ", "requirements.txt"} {
		if !strings.Contains(e.Reason, want) {
			t.Errorf("--spec: the reason lacks %q: %s", want, e.Reason)
		}
	}
	_, errOut, code = run("--nats", "nats://127.0.0.1:1")
	if code != 2 || !strings.Contains(errOut, "cannot import the trainer's dependencies") || !strings.Contains(errOut, "nats") || strings.Contains(errOut, "Traceback") {
		t.Errorf("--nats: exit %d, want 2 saying what is missing\n%s", code, errOut)
	}
}

// TestCommandOfAFailedJobIsStopped: a trainer that started and then hangs
// (no heartbeat) is failed by its deadline; its command, which would hold
// its slot (by default the only one) until its 12 h timeout while nothing
// it reports can count, is stopped within the status check's interval,
// and its exit is recorded as caused by the job's failure.
func TestCommandOfAFailedJobIsStopped(t *testing.T) {
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	script, _ := filepath.Abs("testdata/commands/trainer.sh")
	specDir := t.TempDir()
	cmd, err := dispatch.NewCommand(dispatch.CommandConfig{Argv: []string{"sh", script, "{spec}", "{job_id}", "{adapter_name}", "{output_uri}"},
		SpecDir: specDir, Timeout: time.Hour, KillGrace: time.Second, StatusEvery: 200 * time.Millisecond},
		slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	p := fastPlan() // deadline 2 s
	s, err := adapter.NewStage(adapter.Config{Plan: p, Store: st, Claims: b, Backend: cmd, Queue: b,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	cmd.Reporter, cmd.Relay = s, b
	r := startRoleWith(t, b, s)
	defer r.stop()
	dctx, stopDeadlines := context.WithCancel(ctx)
	defer stopDeadlines()
	go func() { _ = s.RunDeadlines(dctx, 200*time.Millisecond) }()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = cmd.Run(runCtx) }()

	res, err := s.HandleReady(ctx, readyFor("t-cmd-deadline", "may_hang"))
	if err != nil || !res.Dispatched {
		t.Fatal(res, err)
	}
	waitFor(t, "the deadline's failure", 20*time.Second, func() bool {
		j, _ := st.TrainingJob(ctx, res.JobID)
		return j != nil && j.Status == adapter.StatusFailed
	})
	ended := make(chan struct{})
	go func() { cmd.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(15 * time.Second):
		t.Fatal("the command of a failed job still runs")
	}
	b2, _ := os.ReadFile(filepath.Join(specDir, res.JobID+".json.pid"))
	if pid, _ := strconv.Atoi(strings.TrimSpace(string(b2))); pid == 0 || !dead(pid) {
		t.Errorf("the command's child %q outlived it", b2)
	}
	j, _ := st.TrainingJob(ctx, res.JobID)
	if !strings.HasPrefix(j.Reason, "deadline: no event from the trainer since") {
		t.Errorf("reason %q", j.Reason)
	}
	waitFor(t, "the exit recorded", 10*time.Second, func() bool {
		_, evs := historyTypes(t, st, res.JobID)
		for _, e := range evs {
			if e.Type == "command_exited" && strings.Contains(e.Payload, `"job_failed_in_trace":true`) {
				return true
			}
		}
		return false
	})
}
