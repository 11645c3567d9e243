package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/dispatch"
	"github.com/traceops/trace/adapter/plan"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
)

// TestTrainAndAdaptersCommands drives trace train plan/dispatch/list/show
// and trace adapters list/activate/retire/rollback against ClickHouse, NATS and
// the scriptable OpenAI-protocol server (the planning agent, and vLLM's
// runtime LoRA routes for serving).
func TestTrainAndAdaptersCommands(t *testing.T) {
	ctx := context.Background()
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	st := ch.Store()
	done := doneEnvironment(t, st, "t-train", "get_reservation_details", "cancel_reservation")
	at := done.CreatedAt
	failed := &synthesizer.Environment{ID: schemas.EnvironmentID("t-train-failed"), TriggerID: "t-train-failed", Environment: "sim-retail", AgentVersion: "1.5.0",
		DictionaryVersion: 1, Capability: "argument_grounding", Status: synthesizer.StatusFailed, Reason: "5 attempts, none accepted", Attempt: 5,
		CreatedAt: at, UpdatedAt: at, Version: 9}
	if err := (synthesizer.SinkStore{Rows: st}).SaveEnvironment(ctx, failed); err != nil {
		t.Fatal(err)
	}
	srv := llmtest.New(t)
	srv.ServeLoRA(llmtest.LoRAOptions{APIKey: "vllm-key"})
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text("hello") })
	sets := []string{"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database, "--set", "nats.url=" + ns.URL(),
		"--set", "adapter.plan.env_server_url=http://trace-env:8090"}
	run := func(args ...string) (string, error) { return runCLI(t, ctx, append(args, sets...)...) }
	var ee *exitError

	// plan: the configured plan, nothing stored.
	out, err := run("train", "plan", done.ID)
	jobID := schemas.TrainingJobID(done.ID, 1)
	for _, want := range []string{"training job " + jobID + " (plan revision 1)", "capability    precondition_verification",
		"lora          rank 16, alpha 16, dropout 0, targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
		"20 iterations × 32 groups × 16 rollouts, lr 1e-05", "http://trace-env:8090/v1/environments/" + done.ID, "plan          defaults (preset paper)"} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("plan lacks %q (%v):\n%s", want, err, out)
		}
	}
	if j, _ := st.TrainingJob(ctx, jobID); j != nil {
		t.Fatal("plan stored a job")
	}
	// plan with the planning agent: its adjustment and reason.
	srv.Enqueue(llmtest.JSON(map[string]any{"reason": "Half the groups are constant: more hints.", "adjust": map[string]any{"hint_ratio": 0.45, "iterations": 30}}))
	out, err = run("train", "plan", done.ID, "--json", "--set", "adapter.planner.enabled=true", "--set", "llm.base_url="+srv.URL, "--set", "llm.model="+srv.Model)
	var job schemas.TrainingJob
	if err != nil || json.Unmarshal([]byte(out), &job) != nil {
		t.Fatalf("plan --json (%v):\n%s", err, out)
	}
	if job.Planner.Agent != schemas.AgentAccepted || job.GRPO.Iterations != 30 || job.GRPO.HintRatio != 0.45 || job.Planner.Reason != "Half the groups are constant: more hints." {
		t.Errorf("planned with the agent: %+v %+v", job.Planner, job.GRPO)
	}
	if p := srv.Requests()[0].Chat.Prompt(); !strings.Contains(p, "reward histogram (10 equal bins over [0, 1], rollouts per bin): [800, 0, 0, 0, 0, 300, 0, 0, 0, 500]") {
		t.Errorf("the prompt lacks the stored histogram:\n%s", p)
	}
	// Unknown and unfinished environments exit 1 naming them.
	if _, err := run("train", "plan", "env-0000000000000000"); !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), `no environment "env-0000000000000000"`) {
		t.Errorf("unknown environment: %v", err)
	}
	if _, err := run("train", "dispatch", failed.ID); !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), failed.ID+" is FAILED, not DONE") {
		t.Errorf("failed environment: %v", err)
	}

	// dispatch: once, then nothing.
	out, err = run("train", "dispatch", done.ID)
	if err != nil || !strings.Contains(out, "dispatched job "+jobID+" to nats") {
		t.Fatalf("dispatch (%v):\n%s", err, out)
	}
	out, err = run("train", "dispatch", done.ID)
	if err != nil || !strings.Contains(out, "job "+jobID+" exists already (DISPATCHED): nothing dispatched") {
		t.Fatalf("second dispatch (%v):\n%s", err, out)
	}
	b, err := bus.Connect(ctx, bus.Config{URL: ns.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, _ := b.JS.Stream(ctx, bus.StreamTrainingJobs)
	if info, _ := s.Info(ctx); info.State.Msgs != 1 {
		t.Fatalf("%d jobs on the stream, want 1", info.State.Msgs)
	}

	// The trainer reports (through the stage, as the adapt role would).
	stage, err := adapter.NewStage(adapter.Config{Plan: plan.DefaultConfig(), Store: st, Claims: b, Log: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	name := plan.AdapterName(done.Capability, done.ID, 1)
	for i, e := range []schemas.TrainingEvent{
		{Type: schemas.EventStarted},
		{Type: schemas.EventProgress, Iteration: ptr(1), MeanReward: ptr(0.3), RewardStd: ptr(0.1)},
		{Type: schemas.EventProgress, Iteration: ptr(2), MeanReward: ptr(0.55), RewardStd: ptr(0.12)},
		{Type: schemas.EventSucceeded, Adapter: &schemas.EventAdapter{Name: name, URI: "file://" + dir}, Eval: &schemas.EvalMetrics{MeanReward: 0.62, SuccessRate: 0.5, Episodes: 200}},
	} {
		e.JobID, e.At = jobID, time.Now().UTC()
		data, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if err := stage.HandleEvent(ctx, &e, "seq:"+strconv.Itoa(i), data); err != nil {
			t.Fatal(err)
		}
	}

	out, err = run("train", "list")
	if err != nil || !strings.Contains(out, jobID) || !strings.Contains(out, "SUCCEEDED") || !strings.Contains(out, "2/20") {
		t.Errorf("list (%v):\n%s", err, out)
	}
	// A finished job is never dispatched again: the answer says how to
	// train the environment again.
	out, err = run("train", "dispatch", done.ID)
	if want := "to train " + done.ID + " again, dispatch a new plan revision: trace train dispatch " + done.ID + " --revision 2"; err != nil ||
		!strings.Contains(out, "job "+jobID+" exists already (SUCCEEDED): nothing dispatched") || !strings.Contains(out, want) {
		t.Errorf("dispatch of a finished job (%v) lacks %q:\n%s", err, want, out)
	}
	out, err = run("train", "list", "--status", "succeeded", "--json")
	var jobs []jobSummary
	if err != nil || json.Unmarshal([]byte(out), &jobs) != nil || len(jobs) != 1 || jobs[0].JobID != jobID || jobs[0].Planner == nil {
		t.Errorf("list --json (%v):\n%s", err, out)
	}
	// --env takes the target environment, as elsewhere, or the id.
	for _, c := range []struct {
		env  string
		want int
	}{{done.Environment, 1}, {done.ID, 1}, {"no-such-environment", 0}, {"env-0000000000000000", 0}} {
		out, err = run("train", "list", "--env", c.env, "--json")
		var got []jobSummary
		if err != nil || json.Unmarshal([]byte(out), &got) != nil || len(got) != c.want {
			t.Errorf("list --env %s (%v): %d jobs, want %d:\n%s", c.env, err, len(got), c.want, out)
		}
	}
	if _, err := run("train", "list", "--status", "SOMETIMES"); err == nil || !strings.Contains(err.Error(), "--status must be one of") {
		t.Errorf("bad status: %v", err)
	}
	out, err = run("train", "show", jobID)
	for _, want := range []string{"training job " + jobID + ": SUCCEEDED", "events (5)", "dispatched        backend nats", "progress          iteration 2  mean 0.550  std 0.120",
		"succeeded         adapter " + name + ", eval mean 0.620 success 0.500", "reward curve (mean reward per iteration over [0, 1]; ± std)",
		"     1 │████████████····························│ 0.300 ± 0.100", "     2 │██████████████████████··················│ 0.550 ± 0.120",
		"adapter " + name + ": candidate"} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("show lacks %q (%v):\n%s", want, err, out)
		}
	}
	if _, err := run("train", "show", "job-0000000000000000"); !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), `no training job "job-0000000000000000"`) {
		t.Errorf("unknown job: %v", err)
	}

	// adapters: list, activate (loaded into the engine), retire (unloaded).
	serve := []string{"--set", "adapter.serving.enabled=true", "--set", "adapter.serving.base_url=" + srv.URL, "--set", "adapter.serving.token=vllm-key"}
	out, err = run("adapters", "list")
	if err != nil || !strings.Contains(out, name) || !strings.Contains(out, "candidate") || !strings.Contains(out, "0.620") {
		t.Errorf("adapters list (%v):\n%s", err, out)
	}
	chat := func() int {
		resp, err := http.Post(srv.URL+"/chat/completions", "application/json", strings.NewReader(`{"model":"`+name+`","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	out, err = run(append([]string{"adapters", "activate", name}, serve...)...)
	if err != nil || !strings.Contains(out, name+": candidate → active, loaded into "+srv.URL+" (model: "+name+")") || chat() != 200 {
		t.Fatalf("activate (%v):\n%s", err, out)
	}
	out, err = run("adapters", "list", "--status", "active", "--json")
	var as []adapterEntry
	if err != nil || json.Unmarshal([]byte(out), &as) != nil || len(as) != 1 || as[0].Serving == nil || !as[0].Serving.Loaded || as[0].Serving.LoRAPath != dir {
		t.Errorf("adapters list --json (%v):\n%s", err, out)
	}
	out, err = run(append([]string{"adapters", "retire", name, "--reason", "test over"}, serve...)...)
	if err != nil || !strings.Contains(out, name+": active → retired, unloaded from "+srv.URL) || chat() != 404 {
		t.Fatalf("retire (%v):\n%s", err, out)
	}
	if _, err := run("adapters", "activate", "nope"); !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), "unknown adapter: nope") {
		t.Errorf("unknown adapter: %v", err)
	}
	// Without serving the registry only records, and says so.
	out, err = run("adapters", "activate", name)
	if err != nil || !strings.Contains(out, "retired → active") || !strings.Contains(out, "adapter.serving is off") {
		t.Errorf("activate without serving (%v):\n%s", err, out)
	}
	out, err = run("adapters", "retire", name, "--json")
	var v struct {
		Changes []adapter.Change `json:"changes"`
		Serving bool             `json:"serving"`
	}
	if err != nil || json.Unmarshal([]byte(out), &v) != nil || len(v.Changes) != 1 || v.Changes[0].From != adapter.AdapterActive ||
		v.Changes[0].To != adapter.AdapterRetired || v.Serving {
		t.Errorf("retire --json (%v):\n%s", err, out)
	}
	// rollback (README: as the guard does): active → rolled_back,
	// unloaded, and never activated again.
	if out, err = run(append([]string{"adapters", "activate", name}, serve...)...); err != nil || chat() != 200 {
		t.Fatalf("activate again (%v):\n%s", err, out)
	}
	out, err = run(append([]string{"adapters", "rollback", name, "--reason", "hurts production"}, serve...)...)
	if err != nil || !strings.Contains(out, name+": active → rolled_back, unloaded from "+srv.URL) || chat() != 404 {
		t.Fatalf("rollback (%v):\n%s", err, out)
	}
	if a, _ := st.Adapter(ctx, name); a == nil || a.Status != adapter.AdapterRolledBack || !strings.Contains(a.Metadata, "hurts production") {
		t.Errorf("after rollback: %+v", a)
	}
	if _, err := run("adapters", "activate", name); !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), "transition not allowed") {
		t.Errorf("activating a rolled-back adapter: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// doneEnvironment stores a DONE environment of trigger (template path,
// accepted simulated calibration) with these tools, and returns it.
func doneEnvironment(t *testing.T, st *sink.Store, trigger string, tools ...string) *synthesizer.Environment {
	t.Helper()
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	env := &synthesizer.Environment{ID: schemas.EnvironmentID(trigger), TriggerID: trigger, Environment: "sim-airline", AgentVersion: "1.4.0",
		DictionaryVersion: 1, Capability: "precondition_verification", Definition: "Look before you write.", Family: "precondition_verification",
		Status: synthesizer.StatusDone, Path: synthesizer.PathTemplate, Attempt: 1, Program: "def reset(seed):\n    pass\n", ProgramHash: strings.Repeat("ab", 32),
		Tools:    tools,
		Attempts: []synthesizer.Attempt{{N: 1, Origin: "template", Family: "precondition_verification", Stage: synthesizer.StageCalibrate, Accepted: true, StartedAt: at, EndedAt: at}},
		Calibration: &synthesizer.Calibration{Accepted: true, Verdict: "accepted", Policy: "simulated", Simulated: true, Seeds: 100, RolloutsPerSeed: 16,
			MeanReward: 0.44, StdReward: 0.3, SuccessRate: 0.31, PassAtK: map[string]float64{"1": 0.31, "16": 0.97}, Histogram: []int{800, 0, 0, 0, 0, 300, 0, 0, 0, 500}},
		CreatedAt: at, UpdatedAt: at, Version: 2}
	if err := (synthesizer.SinkStore{Rows: st}).SaveEnvironment(context.Background(), env); err != nil {
		t.Fatal(err)
	}
	return env
}

// dispatchWebhook runs trace train dispatch ID with the webhook backend at
// url, and the extra arguments.
func dispatchWebhook(t *testing.T, ch *testenv.CH, ns *testenv.NATSServer, id, url string, extra ...string) (string, error) {
	t.Helper()
	return runCLI(t, context.Background(), append([]string{"train", "dispatch", id, "--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database,
		"--set", "nats.url=" + ns.URL(), "--set", "adapter.plan.env_server_url=http://trace-env:8090", "--set", "adapter.backend=webhook",
		"--set", "adapter.webhook.url=" + url, "--set", "adapter.webhook.secret=0123456789abcdef-webhook"}, extra...)...)
}

// TestTrainDispatchWebhook: `trace train dispatch` with the webhook
// backend (which its help says it works with) POSTs the signed spec, with
// the callback URL in it when trainers report by callback, and records the
// receiver's acceptance in the job's history.
func TestTrainDispatchWebhook(t *testing.T) {
	ctx := context.Background()
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	st := ch.Store()
	env := doneEnvironment(t, st, "t-train-webhook", "get_reservation_details")
	const secret = "0123456789abcdef-webhook"
	specs := make(chan []byte, 4)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := dispatch.Verify([]byte(secret), r.Header.Get(dispatch.SignatureHeader), body, time.Now(), time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		specs <- body
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"queued": true}`))
	}))
	defer hook.Close()
	out, err := dispatchWebhook(t, ch, ns, env.ID, hook.URL, "--set", "adapter.webhook.events=callback",
		"--set", "adapter.webhook.callback_url=https://trace.example.internal")
	jobID := schemas.TrainingJobID(env.ID, 1)
	if err != nil || !strings.Contains(out, "dispatched job "+jobID+" to webhook") {
		t.Fatalf("dispatch (%v):\n%s", err, out)
	}
	var job schemas.TrainingJob
	select {
	case body := <-specs:
		if err := json.Unmarshal(body, &job); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal("the webhook received no spec")
	}
	if want := "https://trace.example.internal/v1/training/jobs/" + jobID + "/events"; job.Report.CallbackURL != want {
		t.Errorf("the spec's report.callback_url is %q, want %q (trainers report by callback)", job.Report.CallbackURL, want)
	}
	evs, err := st.TrainingEvents(ctx, jobID)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range evs {
		types = append(types, e.Type)
	}
	if strings.Join(types, ",") != "dispatched,webhook_accepted" {
		t.Errorf("history of %s: %v", jobID, types)
	}
}

// TestTrainShowAdapterUnderTheTrainersName: a trainer may register the
// adapter under another name than the planned one (the demo's simulated
// trainer reports sim-<planned name>); trace train show and trace train
// list show the adapter the job registered, the name trace adapters list
// and activate know, and list --json keeps the planned one apart.
func TestTrainShowAdapterUnderTheTrainersName(t *testing.T) {
	ctx := context.Background()
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	st := ch.Store()
	b, err := bus.Connect(ctx, bus.Config{URL: ns.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	stage, err := adapter.NewStage(adapter.Config{Plan: plan.DefaultConfig(), Store: st, Claims: b, Log: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	id := schemas.EnvironmentID("t-show-name")
	hash := strings.Repeat("ab", 32)
	r := &schemas.EnvironmentReady{Schema: schemas.EnvironmentReadySchema, EnvironmentID: id, TriggerID: "t-show-name", Environment: "sim-airline",
		AgentVersion: "1.4.0", DictionaryVersion: 1, Capability: schemas.ReadyCapability{Name: "precondition_verification", Definition: "d"},
		Program:     schemas.ReadyProgram{Hash: hash, Origin: schemas.OriginTemplate, Tools: []string{"get_reservation_details"}, Attempts: 1},
		Calibration: schemas.ReadyCalib{Policy: "simulated", Simulated: true, Seeds: 100, RolloutsPerSeed: 16, Temperature: 0.7, MeanReward: 0.45, StdReward: 0.4, SuccessRate: 0.38},
		Fetch:       schemas.ReadyFetch{Path: schemas.EnvironmentProgramPath(id), ClickHouse: schemas.ClickHouseRef{Table: "environments", EnvironmentID: id, ProgramHash: hash}},
		ReadyAt:     time.Now().UTC().Truncate(time.Second)}
	res, err := stage.HandleReady(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	name := "sim-" + plan.AdapterName("precondition_verification", id, 1)
	e := schemas.TrainingEvent{JobID: res.JobID, Type: schemas.EventSucceeded, At: time.Now().UTC(), Simulated: true,
		Adapter: &schemas.EventAdapter{Name: name, URI: "sim://simtrainer/" + name}, Eval: &schemas.EvalMetrics{MeanReward: 0.62, SuccessRate: 0.5, Episodes: 200}}
	data, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if err := stage.HandleEvent(ctx, &e, "seq:0", data); err != nil {
		t.Fatal(err)
	}
	sets := []string{"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database, "--set", "nats.url=" + ns.URL()}
	out, err := runCLI(t, ctx, append([]string{"train", "show", res.JobID}, sets...)...)
	if err != nil || !strings.Contains(out, "adapter "+name+": candidate") {
		t.Errorf("show lacks the adapter %s (%v):\n%s", name, err, out)
	}
	out, err = runCLI(t, ctx, append([]string{"train", "show", res.JobID, "--json"}, sets...)...)
	var v struct {
		Adapter *adapterEntry `json:"adapter"`
	}
	if err != nil || json.Unmarshal([]byte(out), &v) != nil || v.Adapter == nil || v.Adapter.Name != name {
		t.Errorf("show --json lacks the adapter %s (%v):\n%s", name, err, out)
	}
	planned := plan.AdapterName("precondition_verification", id, 1)
	out, err = runCLI(t, ctx, append([]string{"train", "list"}, sets...)...)
	if err != nil || !strings.Contains(out, " "+name+" ") || strings.Contains(out, " "+planned+" ") {
		t.Errorf("train list does not show the registered adapter %s (%v):\n%s", name, err, out)
	}
	out, err = runCLI(t, ctx, append([]string{"train", "list", "--json"}, sets...)...)
	var jobs []jobSummary
	if err != nil || json.Unmarshal([]byte(out), &jobs) != nil || len(jobs) != 1 || jobs[0].AdapterName != name || !jobs[0].AdapterRegistered ||
		jobs[0].PlannedAdapterName != planned {
		t.Errorf("train list --json: want adapter_name %s (registered), planned_adapter_name %s (%v):\n%s", name, planned, err, out)
	}
	// The name train list shows is the one trace adapters knows.
	out, err = runCLI(t, ctx, append([]string{"adapters", "list"}, sets...)...)
	if err != nil || !strings.Contains(out, name) {
		t.Errorf("adapters list lacks %s (%v):\n%s", name, err, out)
	}
	// A job that registered no adapter (yet) shows the planned name, marked.
	r2 := *r
	r2.EnvironmentID, r2.TriggerID = schemas.EnvironmentID("t-show-name-2"), "t-show-name-2"
	r2.Fetch.Path, r2.Fetch.ClickHouse.EnvironmentID = schemas.EnvironmentProgramPath(r2.EnvironmentID), r2.EnvironmentID
	res2, err := stage.HandleReady(ctx, &r2)
	if err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, ctx, append([]string{"train", "list", "--json"}, sets...)...)
	jobs = nil
	if err != nil || json.Unmarshal([]byte(out), &jobs) != nil || len(jobs) != 2 {
		t.Fatalf("train list --json (%v):\n%s", err, out)
	}
	for _, j := range jobs {
		if j.JobID == res2.JobID && (j.AdapterRegistered || j.AdapterName != j.PlannedAdapterName || j.AdapterName != plan.AdapterName("precondition_verification", r2.EnvironmentID, 1)) {
			t.Errorf("a job without an adapter: %+v", j)
		}
	}
	out, err = runCLI(t, ctx, append([]string{"train", "list"}, sets...)...)
	if err != nil || !strings.Contains(out, plan.AdapterName("precondition_verification", r2.EnvironmentID, 1)+" (not registered)") {
		t.Errorf("train list does not mark the unregistered adapter (%v):\n%s", err, out)
	}
}

// TestTrainDispatchWebhookRejected: a webhook that refuses the job (a 4xx,
// final) fails it; trace train dispatch says so and exits 1 instead of
// reporting the job dispatched.
func TestTrainDispatchWebhookRejected(t *testing.T) {
	ctx := context.Background()
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	st := ch.Store()
	env := doneEnvironment(t, st, "t-train-webhook-422", "get_reservation_details")
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no GPU quota for this team", http.StatusUnprocessableEntity)
	}))
	defer hook.Close()
	out, err := dispatchWebhook(t, ch, ns, env.ID, hook.URL)
	jobID := schemas.TrainingJobID(env.ID, 1)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), jobID) || !strings.Contains(err.Error(), "no GPU quota for this team") ||
		strings.Contains(out, "dispatched job") {
		t.Errorf("a rejected dispatch: %v\n%s", err, out)
	}
	if j, err := st.TrainingJob(ctx, jobID); err != nil || j == nil || j.Status != adapter.StatusFailed {
		t.Errorf("the rejected job: %+v %v", j, err)
	}
	// --json says so too, and exits 1.
	out, err = dispatchWebhook(t, ch, ns, env.ID, hook.URL, "--revision", "2", "--json")
	var v struct {
		JobID      string `json:"job_id"`
		Dispatched bool   `json:"dispatched"`
		Refused    bool   `json:"refused"`
		Error      string `json:"error"`
	}
	if jerr := json.Unmarshal([]byte(out), &v); jerr != nil || !errors.As(err, &ee) || ee.code != 1 || v.JobID != schemas.TrainingJobID(env.ID, 2) ||
		v.Dispatched || !v.Refused || !strings.Contains(v.Error, "no GPU quota for this team") {
		t.Errorf("a rejected dispatch, --json: %v %v\n%s", err, jerr, out)
	}
}

// TestTrainCancel: trace train cancel fails a dispatched job through the
// adapt role's events (once, with the reason given), and the job, which no
// trainer took, leaves the trainers' queue; a finished or unknown job
// exits 1 naming it.
func TestTrainCancel(t *testing.T) {
	ctx := context.Background()
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	st := ch.Store()
	done := doneEnvironment(t, st, "t-cancel", "get_reservation_details", "cancel_reservation")
	sets := []string{"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database, "--set", "nats.url=" + ns.URL(),
		"--set", "adapter.plan.env_server_url=http://trace-env:8090"}
	run := func(args ...string) (string, error) { return runCLI(t, ctx, append(args, sets...)...) }
	jobID := schemas.TrainingJobID(done.ID, 1)
	if out, err := run("train", "dispatch", done.ID); err != nil || !strings.Contains(out, "dispatched job "+jobID) {
		t.Fatalf("dispatch (%v):\n%s", err, out)
	}
	var ee *exitError
	if _, err := run("train", "cancel", "job-0000000000000000"); !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), `no training job "job-0000000000000000"`) {
		t.Errorf("unknown job: %v", err)
	}
	out, err := run("train", "cancel", jobID, "--reason", "wrong base model")
	if err != nil || !strings.Contains(out, "job "+jobID+" (DISPATCHED): cancel requested") {
		t.Fatalf("cancel (%v):\n%s", err, out)
	}
	b, err := bus.Connect(ctx, bus.Config{URL: ns.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// The adapt role applies it.
	stage, err := adapter.NewStage(adapter.Config{Plan: plan.DefaultConfig(), Store: st, Claims: b, Backend: dispatch.NATS{Pub: b}, Log: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	ec, err := b.TrainingEventsConsumer(rctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = stage.RunEvents(rctx, ec) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		j, _ := st.TrainingJob(ctx, jobID)
		if j != nil && j.Status == adapter.StatusFailed {
			if j.Reason != "cancelled by hand (trace train cancel): wrong base model" {
				t.Errorf("reason %q", j.Reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cancel was not applied: %+v", j)
		}
		time.Sleep(100 * time.Millisecond)
	}
	s, _ := b.JS.Stream(ctx, bus.StreamTrainingJobs)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if info, _ := s.Info(ctx); info.State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cancelled job is still in the trainers' queue")
		}
	}
	if _, err := run("train", "cancel", jobID); !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), "job "+jobID+" is FAILED already: nothing to cancel") {
		t.Errorf("cancel of a failed job: %v", err)
	}
}
