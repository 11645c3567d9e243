package app_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/dispatch"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

func readyEnv(trigger, capability string) *schemas.EnvironmentReady {
	id := schemas.EnvironmentID(trigger)
	hash := strings.Repeat("cd", 32)
	return &schemas.EnvironmentReady{Schema: schemas.EnvironmentReadySchema, EnvironmentID: id, TriggerID: trigger, Environment: "sim-airline",
		AgentVersion: "1.4.0", DictionaryVersion: 1,
		Capability:  schemas.ReadyCapability{Name: capability, Definition: "d"},
		Program:     schemas.ReadyProgram{Hash: hash, Origin: schemas.OriginTemplate, Tools: []string{"get_reservation_details"}, Attempts: 1},
		Calibration: schemas.ReadyCalib{Policy: "simulated", Simulated: true, Seeds: 100, RolloutsPerSeed: 16, Temperature: 0.7, MeanReward: 0.45, StdReward: 0.4, SuccessRate: 0.38, PassAtK: map[string]float64{"1": 0.38}},
		Fetch:       schemas.ReadyFetch{Path: schemas.EnvironmentProgramPath(id), ClickHouse: schemas.ClickHouseRef{Table: "environments", EnvironmentID: id, ProgramHash: hash}},
		ReadyAt:     time.Now().UTC().Truncate(time.Second)}
}

func waitJob(t *testing.T, a *app.App, id, status string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		j, err := a.Store.TrainingJob(context.Background(), id)
		if err == nil && j != nil && j.Status == status {
			return j.Reason
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %+v %v, want %s", id, j, err, status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAdaptRoleCommandBackend: `trace run` with adapter.backend: command
// runs the configured command per ready environment (the job succeeds from
// the events on its stdout); stopping trace stops a command still running
// (its process group) and records its job FAILED, and a command template
// with an unknown placeholder fails at start naming the field.
func TestAdaptRoleCommandBackend(t *testing.T) {
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	script, _ := filepath.Abs("../../adapter/testdata/commands/trainer.sh")
	cfg := withRoles(w.cfg, "adapt")
	cfg.Adapter.Backend = "command"
	cfg.Adapter.Command.Argv = []string{"sh", script, "{spec}", "{job_id}", "{adapter_name}", "{output_uri}"}
	cfg.Adapter.Command.MaxRunning = 2
	cfg.Adapter.Command.KillGrace = time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a, stop := w.start(t, cfg)
	<-a.Ready()
	ctx := context.Background()
	ok, hang := readyEnv("t-app-cmd-ok", "must_succeed"), readyEnv("t-app-cmd-hang", "may_hang")
	for _, r := range []*schemas.EnvironmentReady{ok, hang} {
		if err := a.Bus.PublishEnvironmentReady(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	idOK, idHang := schemas.TrainingJobID(ok.EnvironmentID, 1), schemas.TrainingJobID(hang.EnvironmentID, 1)
	waitJob(t, a, idOK, adapter.StatusSucceeded, 30*time.Second)
	waitJob(t, a, idHang, adapter.StatusRunning, 30*time.Second)
	pidFile := filepath.Join(cfg.Path("training", "specs"), idHang+".json.pid")
	var pid int
	for range 50 {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, _ = strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if pid <= 0 {
		t.Fatalf("no pid in %s", pidFile)
	}
	if err := stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	// The failure is relayed to the job's events subject as trace stops;
	// the events consumer applies it when the adapt role runs again (here,
	// or on another replica).
	a2, stop2 := w.start(t, cfg)
	defer stop2()
	<-a2.Ready()
	if reason := waitJob(t, a2, idHang, adapter.StatusFailed, 30*time.Second); !strings.HasPrefix(reason, "trace stopped while the command ran") {
		t.Errorf("a command running at shutdown: %q", reason)
	}
	if out, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); len(out) > 0 && !strings.Contains(string(out), ") Z ") {
		t.Errorf("the running command's child %d survived trace's shutdown: %s", pid, out)
	}

	bad := cfg
	bad.Adapter.Command.Argv = []string{"sh", script, "{specfile}"}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "adapter.command.argv[2]: unknown placeholder {specfile}") {
		t.Errorf("bad template: %v", err)
	}
	missing := cfg
	missing.Adapter.Command.Argv = []string{"no-such-trainer-on-path", "{spec}"}
	ma, err := app.Start(ctx, missing, slog.New(slog.DiscardHandler))
	if err == nil {
		err = ma.Run(ctx)
		ma.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "adapter.command.argv[0]") {
		t.Errorf("a program not on PATH fails at start naming the field: %v", err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestAdaptRoleWebhookWithCallback: `trace run` (serve and adapt roles)
// with adapter.backend: webhook and events: callback POSTs each spec,
// signed, to the receiver; the spec's report.callback_url points at the
// serve role's HTTP server, where the trainer's signed events are accepted
// and drive the job to SUCCEEDED with its adapter registered.
func TestAdaptRoleWebhookWithCallback(t *testing.T) {
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	const secret = "app-test-webhook-secret-0123"
	cfg := withRoles(w.cfg, "serve", "adapt")
	cfg.HTTP.Addr = freeAddr(t)
	cfg.HTTP.BearerToken = "dashboard-token" // does not protect the callback
	got := make(chan *schemas.TrainingJob, 1)
	receiver := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		_, _ = body.ReadFrom(r.Body)
		if err := dispatch.Verify([]byte(secret), r.Header.Get(dispatch.SignatureHeader), body.Bytes(), time.Now(), time.Minute); err != nil {
			http.Error(rw, err.Error(), http.StatusUnauthorized)
			return
		}
		job, err := schemas.DecodeTrainingJob(body.Bytes())
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		rw.WriteHeader(http.StatusAccepted)
		got <- job
	}))
	defer receiver.Close()
	cfg.Adapter.Backend = "webhook"
	cfg.Adapter.Webhook.URL = receiver.URL
	cfg.Adapter.Webhook.Secret = secret
	cfg.Adapter.Webhook.Events = dispatch.EventsCallback
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a, _ := w.start(t, cfg)
	<-a.Ready()
	ctx := context.Background()
	r := readyEnv("t-app-hook", "multi_step_completion")
	if err := a.Bus.PublishEnvironmentReady(ctx, r); err != nil {
		t.Fatal(err)
	}
	var job *schemas.TrainingJob
	select {
	case job = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("the receiver got no job")
	}
	if want := "http://" + cfg.HTTP.Addr + "/v1/training/jobs/" + job.JobID + "/events"; job.Report.CallbackURL != want {
		t.Fatalf("callback_url %q, want %q", job.Report.CallbackURL, want)
	}
	it, mr, sd := 1, 0.5, 0.1
	for i, e := range []*schemas.TrainingEvent{
		{JobID: job.JobID, Type: schemas.EventStarted, At: time.Now().UTC()},
		{JobID: job.JobID, Type: schemas.EventProgress, At: time.Now().UTC(), Iteration: &it, MeanReward: &mr, RewardStd: &sd},
		{JobID: job.JobID, Type: schemas.EventSucceeded, At: time.Now().UTC(), Adapter: &schemas.EventAdapter{Name: job.Output.AdapterName, URI: job.Output.URI},
			Eval: &schemas.EvalMetrics{MeanReward: 0.7, SuccessRate: 0.6, Episodes: 50}},
	} {
		seq := int64(i)
		e.Seq = &seq
		data, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, job.Report.CallbackURL, bytes.NewReader(data))
		req.Header.Set(dispatch.SignatureHeader, dispatch.Sign([]byte(secret), time.Now(), data))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusAccepted {
			t.Fatalf("callback %s: %d", e.Type, res.StatusCode)
		}
	}
	waitJob(t, a, job.JobID, adapter.StatusSucceeded, 30*time.Second)
	if ad, err := a.Store.Adapter(ctx, job.Output.AdapterName); err != nil || ad == nil || ad.EvalMeanReward != 0.7 {
		t.Errorf("adapter: %+v %v", ad, err)
	}
	// An unsigned event is refused by the same server.
	res, err := http.Post(job.Report.CallbackURL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("unsigned callback: %d, want 401", res.StatusCode)
	}
}

// TestAdaptRoleReconcilesServing: with adapter.serving on, the adapt role
// loads again an active adapter the engine does not serve — registered
// active while the engine did not serve it, then forgotten by the
// engine's restart — every adapter.serving.reconcile_every, counted in
// trace_adapter_reloads_total; stopping trace stops the loop cleanly.
func TestAdaptRoleReconcilesServing(t *testing.T) {
	ctx := context.Background()
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	srv := llmtest.New(t)
	srv.ServeLoRA(llmtest.LoRAOptions{})
	cfg := withRoles(w.cfg, "adapt")
	cfg.Adapter.Serving.Enabled = true
	cfg.Adapter.Serving.BaseURL = srv.URL
	cfg.Adapter.Serving.ReconcileEvery = time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a, stop := w.start(t, cfg)
	<-a.Ready()
	dir := t.TempDir()
	now := time.Now().UTC()
	if err := a.Store.SaveAdapter(ctx, sink.AdapterRow{Name: "pv-1", JobID: "job-pv-1", Capability: "precondition_verification", Environment: "sim-airline",
		URI: "file://" + dir, Status: adapter.AdapterActive, CreatedAt: now, UpdatedAt: now, Version: uint64(now.UnixNano())}); err != nil {
		t.Fatal(err)
	}
	// Loaded, and the reload counted (after the load, when the registry
	// recorded it).
	waitReloaded := func(what string, n float64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for srv.LoadedAdapters()["pv-1"] != dir || counterValue(t, a, "trace_adapter_reloads_total", "ok") < n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: pv-1 not loaded (%v) or not counted (trace_adapter_reloads_total{result=ok} = %v, want %v)",
					what, srv.LoadedAdapters(), counterValue(t, a, "trace_adapter_reloads_total", "ok"), n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitReloaded("active in the registry, not served", 1)
	srv.RestartLoRA()
	waitReloaded("after the engine's restart", 2)
	if ad, err := a.Store.Adapter(ctx, "pv-1"); err != nil || ad.Status != adapter.AdapterActive {
		t.Errorf("pv-1 after the reloads: %+v %v", ad, err)
	}
	if err := stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
}

// counterValue is the value of the metric name{result} the app exposes (0 if
// absent).
func counterValue(t *testing.T, a *app.App, name, result string) float64 {
	t.Helper()
	mfs, err := a.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == name && l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
