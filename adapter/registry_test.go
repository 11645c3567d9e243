package adapter_test

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/serving"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

func candidate(t *testing.T, st *sink.Store, name, capability, uri string) {
	t.Helper()
	now := time.Now().UTC()
	if err := st.SaveAdapter(context.Background(), sink.AdapterRow{Name: name, JobID: "job-" + name, EnvironmentID: "env-0123456789abcdef",
		Capability: capability, Environment: "sim-airline", AgentVersion: "1.4.0", BaseModel: "Qwen/Qwen3-8B", URI: uri,
		Status: adapter.AdapterCandidate, Metadata: `{"trainer":"external"}`, CreatedAt: now, UpdatedAt: now, Version: uint64(now.UnixNano())}); err != nil {
		t.Fatal(err)
	}
}

func statusOf(t *testing.T, st *sink.Store, name string) *sink.AdapterRow {
	t.Helper()
	a, err := st.Adapter(context.Background(), name)
	if err != nil || a == nil {
		t.Fatalf("adapter %s: %v", name, err)
	}
	return a
}

func chatStatus(t *testing.T, srv *llmtest.Server, model string) int {
	t.Helper()
	resp, err := http.Post(srv.URL+"/chat/completions", "application/json",
		strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestRegistryTransitionsAndServing drives activate, retire and roll back
// against ClickHouse and the scriptable server's vLLM LoRA routes: an
// active adapter is served under its name and only then recorded active,
// one adapter is active per (environment, capability), a failed load
// changes nothing, a failed unload is recorded and retried.
func TestRegistryTransitionsAndServing(t *testing.T) {
	ctx := context.Background()
	st := testenv.ClickHouse(t).Store()
	srv := llmtest.New(t)
	srv.ServeLoRA(llmtest.LoRAOptions{APIKey: "tok"})
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text("hello") })
	eng := &serving.VLLM{BaseURL: srv.URL, Token: "tok", InitialBackoff: time.Millisecond, MaxElapsed: time.Second}
	dir := t.TempDir()
	reg := &adapter.Registry{Store: st, Engine: eng, PathMap: map[string]string{"file:///var/lib/trace/adapters": dir}}
	candidate(t, st, "pv-1", "precondition_verification", "file:///var/lib/trace/adapters")
	candidate(t, st, "pv-2", "precondition_verification", "file://"+t.TempDir())
	candidate(t, st, "mt-1", "multi_turn", "file://"+t.TempDir())
	candidate(t, st, "gone", "multi_turn", "file:///nonexistent/adapter")

	if chatStatus(t, srv, "pv-1") != 404 {
		t.Fatal("a candidate is served")
	}
	ch, err := reg.Activate(ctx, "pv-1")
	if err != nil || len(ch) != 1 || !ch[0].Loaded || ch[0].From != adapter.AdapterCandidate {
		t.Fatalf("activate pv-1: %+v %v", ch, err)
	}
	if a := statusOf(t, st, "pv-1"); a.Status != adapter.AdapterActive || adapter.ServingOf(a) == nil || adapter.ServingOf(a).LoRAPath != dir || !adapter.ServingOf(a).Loaded {
		t.Fatalf("pv-1 after activation: %+v", a)
	}
	if chatStatus(t, srv, "pv-1") != 200 || srv.LoadedAdapters()["pv-1"] != dir {
		t.Fatal("the active adapter is not served under its name (path mapped)")
	}
	// The second adapter of the same capability replaces the first.
	ch, err = reg.Activate(ctx, "pv-2")
	if err != nil || len(ch) != 2 || ch[1].Name != "pv-1" || ch[1].To != adapter.AdapterRetired || !ch[1].Unloaded {
		t.Fatalf("activate pv-2: %+v %v", ch, err)
	}
	if statusOf(t, st, "pv-1").Status != adapter.AdapterRetired || chatStatus(t, srv, "pv-1") != 404 || chatStatus(t, srv, "pv-2") != 200 {
		t.Fatal("pv-1 not retired and unloaded")
	}
	// Another capability does not touch it.
	if _, err := reg.Activate(ctx, "mt-1"); err != nil {
		t.Fatal(err)
	}
	if as, _ := st.Adapters(ctx, sink.AdapterFilter{Status: adapter.AdapterActive}); len(as) != 2 {
		t.Fatalf("active adapters %+v", as)
	}
	// A load that fails leaves the registry as it was.
	if _, err := reg.Activate(ctx, "gone"); err == nil || !strings.Contains(err.Error(), "No adapter found for /nonexistent/adapter") ||
		!strings.Contains(err.Error(), "the registry is unchanged") {
		t.Fatalf("activate gone: %v", err)
	}
	if statusOf(t, st, "gone").Status != adapter.AdapterCandidate || statusOf(t, st, "mt-1").Status != adapter.AdapterActive {
		t.Fatal("a failed load changed the registry")
	}
	// Re-activating the active adapter reloads it (an engine restart).
	if err := eng.Unload(ctx, "pv-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Activate(ctx, "pv-2"); err != nil || chatStatus(t, srv, "pv-2") != 200 {
		t.Fatalf("reload: %v", err)
	}
	// Retire with an engine that fails: retired in the registry, the
	// failure recorded; retiring again retries the unload.
	eng.MaxElapsed = 30 * time.Millisecond
	for range 50 {
		srv.EnqueueLoRA(llmtest.ServerError())
	}
	c, err := reg.Retire(ctx, "pv-2", "operator")
	if err == nil || !strings.Contains(err.Error(), "retired in the registry, but the serving engine still serves it") || c == nil || c.Unloaded {
		t.Fatalf("retire with a failing engine: %+v %v", c, err)
	}
	a := statusOf(t, st, "pv-2")
	if sv := adapter.ServingOf(a); a.Status != adapter.AdapterRetired || sv == nil || !sv.Loaded || !strings.Contains(sv.Error, "HTTP 500") {
		t.Fatalf("pv-2 after a failed unload: %+v", a)
	}
	srv.DropLoRAFaults()
	eng.MaxElapsed = time.Second
	if c, err := reg.Retire(ctx, "pv-2", ""); err != nil || !c.Unloaded || c.From != adapter.AdapterRetired {
		t.Fatalf("retiring again retries the unload: %+v %v", c, err)
	}
	if chatStatus(t, srv, "pv-2") != 404 || adapter.ServingOf(statusOf(t, st, "pv-2")).Loaded {
		t.Fatal("the retried unload did not happen")
	}
	// Roll back: active → rolled_back, unloaded, never activated again.
	c, err = reg.RollBack(ctx, "mt-1", "closed loop: pass rate fell from 0.41 to 0.30")
	if err != nil || !c.Unloaded || c.To != adapter.AdapterRolledBack {
		t.Fatalf("roll back: %+v %v", c, err)
	}
	a = statusOf(t, st, "mt-1")
	if a.Status != adapter.AdapterRolledBack || !strings.Contains(a.Metadata, "pass rate fell from 0.41 to 0.30") || chatStatus(t, srv, "mt-1") != 404 {
		t.Fatalf("mt-1 after roll back: %+v", a)
	}
	if _, err := reg.Activate(ctx, "mt-1"); !errors.Is(err, adapter.ErrTransition) {
		t.Errorf("activating a rolled-back adapter: %v", err)
	}
	now := time.Now().UTC()
	if err := st.SaveAdapter(ctx, sink.AdapterRow{Name: "sim-x", Capability: "multi_turn", Environment: "sim-airline", URI: "sim://simtrainer/sim-x",
		Status: adapter.AdapterCandidate, Simulated: true, CreatedAt: now, UpdatedAt: now, Version: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Activate(ctx, "sim-x"); !errors.Is(err, adapter.ErrTransition) || !strings.Contains(err.Error(), "simulated") {
		t.Errorf("activating a simulated adapter into an engine: %v", err)
	}
	if _, err := reg.RollBack(ctx, "gone", ""); !errors.Is(err, adapter.ErrTransition) {
		t.Errorf("rolling back a candidate: %v", err)
	}
	if _, err := reg.Retire(ctx, "nope", ""); !errors.Is(err, adapter.ErrUnknownAdapter) || !strings.Contains(err.Error(), "nope") {
		t.Errorf("unknown adapter: %v", err)
	}
	// Every transition is in the metadata.
	if a := statusOf(t, st, "pv-1"); !strings.Contains(a.Metadata, `"from":"candidate","reason":"activated"`) || !strings.Contains(a.Metadata, `"reason":"replaced by pv-2"`) ||
		!strings.Contains(a.Metadata, `"trainer":"external"`) {
		t.Errorf("pv-1 metadata %s", a.Metadata)
	}
}

// TestAutoActivation: with AutoActivate, a job's success registers its
// adapter and requests its activation, which the activations consumer
// does (loaded into the engine), recorded in the job's history; without a
// registry or a queue the stage refuses the setting.
func TestAutoActivation(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	srv := llmtest.New(t)
	srv.ServeLoRA(llmtest.LoRAOptions{})
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text("hello") })
	reg := &adapter.Registry{Store: st, Engine: &serving.VLLM{BaseURL: srv.URL, InitialBackoff: time.Millisecond, MaxElapsed: time.Second}}
	if _, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, AutoActivate: true, Queue: b}); err == nil {
		t.Fatal("AutoActivate without a registry accepted")
	}
	if _, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, AutoActivate: true, Registry: reg}); err == nil {
		t.Fatal("AutoActivate without a queue accepted")
	}
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, AutoActivate: true, Registry: reg, Queue: b})
	if err != nil {
		t.Fatal(err)
	}
	defer runActivations(t, b, s)()
	res, err := s.HandleReady(ctx, readyFor("t-auto", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	job, _ := st.TrainingJob(ctx, res.JobID)
	dir := t.TempDir()
	e := &schemas.TrainingEvent{Schema: schemas.TrainingEventSchema, JobID: res.JobID, Type: schemas.EventSucceeded, At: time.Now().UTC(),
		Adapter: &schemas.EventAdapter{Name: job.AdapterName, URI: "file://" + dir}, Eval: &schemas.EvalMetrics{MeanReward: 0.7, SuccessRate: 0.6, Episodes: 200}}
	data, _ := e.Encode()
	if err := s.HandleEvent(ctx, e, "seq:1", data); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the activation", 20*time.Second, func() bool { return historyCount(t, st, res.JobID, "activated") == 1 })
	if a := statusOf(t, st, job.AdapterName); a.Status != adapter.AdapterActive || chatStatus(t, srv, job.AdapterName) != 200 {
		t.Fatalf("auto-activated adapter %+v", a)
	}
	evs, _ := st.TrainingEvents(ctx, res.JobID)
	if last := evs[len(evs)-1]; last.Type != "activated" || !strings.Contains(last.Payload, job.AdapterName) {
		t.Errorf("history %+v", evs)
	}
}

// TestSuccessNamingAnotherJobsAdapter: a trainer that reports, for a
// second job, the adapter name the first job's adapter is registered under
// (one that ignores output.adapter_name) does not leave the second job
// SUCCEEDED with nothing registered for it: the job fails naming the other
// job, and the first job's adapter (active) is left as it was, not
// reloaded by auto-activation.
func TestSuccessNamingAnotherJobsAdapter(t *testing.T) {
	ctx := context.Background()
	st, b := plannerFixture(t)
	eng := &fakeEngine{loaded: map[string]string{}}
	reg := &adapter.Registry{Store: st, Engine: eng}
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, AutoActivate: true, Registry: reg, Queue: b})
	if err != nil {
		t.Fatal(err)
	}
	defer runActivations(t, b, s)()
	succeed := func(jobID, name, dir string) {
		t.Helper()
		e := &schemas.TrainingEvent{Schema: schemas.TrainingEventSchema, JobID: jobID, Type: schemas.EventSucceeded, At: time.Now().UTC(),
			Adapter: &schemas.EventAdapter{Name: name, URI: "file://" + dir}, Eval: &schemas.EvalMetrics{MeanReward: 0.7, SuccessRate: 0.6, Episodes: 200}}
		data, _ := e.Encode()
		if err := s.HandleEvent(ctx, e, "seq:1", data); err != nil {
			t.Fatal(err)
		}
	}
	first, err := s.HandleReady(ctx, readyFor("t-name-1", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.HandleReady(ctx, readyFor("t-name-2", "precondition_verification"))
	if err != nil {
		t.Fatal(err)
	}
	firstDir := t.TempDir()
	succeed(first.JobID, "my-adapter", firstDir)
	waitFor(t, "the first job's activation", 20*time.Second, func() bool { return historyCount(t, st, first.JobID, "activated") == 1 })
	if a := statusOf(t, st, "my-adapter"); a.Status != adapter.AdapterActive || a.JobID != first.JobID {
		t.Fatalf("the first job's adapter: %+v", a)
	}
	_ = eng.Unload(ctx, "my-adapter") // to see whether it is loaded again
	succeed(second.JobID, "my-adapter", t.TempDir())

	j, err := st.TrainingJob(ctx, second.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != adapter.StatusFailed || !strings.Contains(j.Reason, `"my-adapter"`) || !strings.Contains(j.Reason, first.JobID) {
		t.Errorf("the second job is %s (%q), want FAILED naming the adapter and the job it belongs to", j.Status, j.Reason)
	}
	if a := statusOf(t, st, "my-adapter"); a.JobID != first.JobID || a.URI != "file://"+firstDir || a.Status != adapter.AdapterActive {
		t.Errorf("the first job's adapter changed: %+v", a)
	}
	if n := activationRequests(t, b); n != 1 || eng.has("my-adapter") {
		t.Errorf("the second job's success activated (loaded) the first job's adapter: %d activation requests, loaded %v", n, eng.has("my-adapter"))
	}
}

// fakeRegistryStore holds adapters in memory; adaptersErr fails Adapters
// and saveErr SaveAdapter.
type fakeRegistryStore struct {
	rows                 map[string]sink.AdapterRow
	adaptersErr, saveErr error
}

func (f *fakeRegistryStore) Adapter(_ context.Context, name string) (*sink.AdapterRow, error) {
	if a, ok := f.rows[name]; ok {
		return &a, nil
	}
	return nil, nil
}

func (f *fakeRegistryStore) Adapters(_ context.Context, fl sink.AdapterFilter) ([]sink.AdapterRow, error) {
	if f.adaptersErr != nil {
		return nil, f.adaptersErr
	}
	var out []sink.AdapterRow
	for _, a := range f.rows {
		if (fl.Status == "" || a.Status == fl.Status) && (fl.Capability == "" || a.Capability == fl.Capability) &&
			(fl.Environment == "" || a.Environment == fl.Environment) {
			out = append(out, a)
		}
	}
	return out, nil
}

func (f *fakeRegistryStore) SaveAdapter(_ context.Context, r sink.AdapterRow) error {
	if f.saveErr != nil {
		return f.saveErr
	}
	f.rows[r.Name] = r
	return nil
}

// fakeEngine keeps the loaded adapters (name → path).
type fakeEngine struct {
	mu     sync.Mutex
	loaded map[string]string
}

func (e *fakeEngine) Name() string     { return "fake" }
func (e *fakeEngine) Endpoint() string { return "http://fake/v1" }
func (e *fakeEngine) Load(_ context.Context, name, path string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.loaded[name] = path
	return nil
}
func (e *fakeEngine) Unload(_ context.Context, name string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.loaded, name)
	return nil
}

func (e *fakeEngine) Served(context.Context) (map[string]string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.loaded), nil
}

func (e *fakeEngine) has(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.loaded[name]
	return ok
}

// TestActivateStoreFailure: when the registry cannot record an
// activation, the engine is left as the registry says: a candidate loaded
// for it is unloaded again, but the active adapter being reloaded (after
// an engine restart) stays loaded — the registry says it is active.
func TestActivateStoreFailure(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, status         string
		adaptersErr, saveErr error
		wantLoaded           bool
	}{
		{"candidate, read fails", adapter.AdapterCandidate, errors.New("clickhouse away"), nil, false},
		{"candidate, save fails", adapter.AdapterCandidate, nil, errors.New("clickhouse away"), false},
		{"active, read fails", adapter.AdapterActive, errors.New("clickhouse away"), nil, true},
		{"active, save fails", adapter.AdapterActive, nil, errors.New("clickhouse away"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &fakeRegistryStore{rows: map[string]sink.AdapterRow{"pv-1": {Name: "pv-1", Capability: "precondition_verification",
				Environment: "sim-airline", URI: "file:///adapters/pv-1", Status: tc.status, Version: 1}}}
			eng := &fakeEngine{loaded: map[string]string{}}
			reg := &adapter.Registry{Store: st, Engine: eng}
			st.adaptersErr, st.saveErr = tc.adaptersErr, tc.saveErr
			if _, err := reg.Activate(ctx, "pv-1"); err == nil {
				t.Fatal("activation with a failing store succeeded")
			}
			if st.rows["pv-1"].Status != tc.status {
				t.Fatalf("status %s, want %s", st.rows["pv-1"].Status, tc.status)
			}
			if _, loaded := eng.loaded["pv-1"]; loaded != tc.wantLoaded {
				t.Errorf("%s adapter loaded in the engine: %v, want %v", tc.status, loaded, tc.wantLoaded)
			}
		})
	}
}

// TestLoRAPath: the engine's path of an adapter URI, with the longest
// path_map prefix that matches whole path segments rewritten.
func TestLoRAPath(t *testing.T) {
	pm := map[string]string{
		"s3://bucket/adapters":  "/mnt/adapters",
		"s3://bucket/adapters/": "/mnt/slash/",
		"file:///a/adapters":    "/srv/a",
		"file:///a":             "/srv/root",
	}
	for _, tt := range []struct{ uri, want, err string }{
		{"s3://bucket/adapters/pv-1", "/mnt/slash/pv-1", ""}, // the longer prefix
		{"s3://bucket/adapters", "/mnt/adapters", ""},
		{"s3://bucket/adapters2/pv-1", "", "path_map"}, // not a segment of s3://bucket/adapters
		{"file:///a/adapters/pv-1", "/srv/a/pv-1", ""},
		{"file:///a/adapters2/pv-1", "/srv/root/adapters2/pv-1", ""}, // file:///a is the segment that matches
		{"file:///b/pv-1", "/b/pv-1", ""},
		{"/abs/pv-1", "/abs/pv-1", ""},
		{"gs://other/pv-1", "", "path_map"},
	} {
		got, err := adapter.LoRAPath(tt.uri, pm)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: %q, %v; want an error naming %s", tt.uri, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: %q, %v; want %q", tt.uri, got, err, tt.want)
		}
	}
}
