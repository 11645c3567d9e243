package adapter_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/serving"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
)

// counter is the value of the counter name{result} in reg (0 if absent).
func counter(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// reconcileFixture is a registry on ClickHouse and the scriptable
// server's vLLM LoRA routes, with a Reconciler counting into its own
// metrics registry.
func reconcileFixture(t *testing.T) (*sink.Store, *llmtest.Server, *serving.VLLM, *adapter.Reconciler, *prometheus.Registry) {
	t.Helper()
	st := testenv.ClickHouse(t).Store()
	srv := llmtest.New(t)
	srv.ServeLoRA(llmtest.LoRAOptions{})
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text("hello") })
	eng := &serving.VLLM{BaseURL: srv.URL, InitialBackoff: time.Millisecond, MaxElapsed: 200 * time.Millisecond, Timeout: 5 * time.Second}
	pr := prometheus.NewRegistry()
	rec := &adapter.Reconciler{Registry: &adapter.Registry{Store: st, Engine: eng}, Metrics: adapter.NewReconcileMetrics(pr)}
	return st, srv, eng, rec, pr
}

// TestReconcileReloadsAfterEngineRestart: vLLM restarted (every runtime-
// loaded adapter forgotten) while the registry says active; the router's
// conversations got 404. One pass loads every active adapter again from
// its path (statuses unchanged, counted, the simulated one left alone); a
// reload that fails (the adapter's files gone) does not stop the others
// and is retried by the next pass; a pass with nothing to do loads
// nothing.
func TestReconcileReloadsAfterEngineRestart(t *testing.T) {
	ctx := context.Background()
	st, srv, _, rec, pr := reconcileFixture(t)
	reg := rec.Registry
	dirs := map[string]string{}
	for _, c := range []struct{ name, capability string }{{"pv-1", "precondition_verification"}, {"mt-1", "multi_turn"}, {"lt-1", "long_tail"}} {
		dirs[c.name] = t.TempDir()
		candidate(t, st, c.name, c.capability, "file://"+dirs[c.name])
		if _, err := reg.Activate(ctx, c.name); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	if err := st.SaveAdapter(ctx, sink.AdapterRow{Name: "sim-x", Capability: "sim_cap", Environment: "sim-airline", URI: "sim://simtrainer/sim-x",
		Status: adapter.AdapterActive, Simulated: true, CreatedAt: now, UpdatedAt: now, Version: 1}); err != nil {
		t.Fatal(err)
	}
	if r, err := rec.Pass(ctx); err != nil || len(r.Reloaded) != 0 || r.Served != 3 {
		t.Fatalf("a pass with every active adapter served: %+v %v", r, err)
	}

	srv.RestartLoRA()
	if chatStatus(t, srv, "pv-1") != 404 {
		t.Fatal("the restarted engine still serves pv-1")
	}
	if err := os.RemoveAll(dirs["lt-1"]); err != nil {
		t.Fatal(err)
	}
	r, err := rec.Pass(ctx)
	if err == nil || !strings.Contains(err.Error(), "adapter lt-1 is active but not served by "+srv.URL) || !strings.Contains(err.Error(), "No adapter found") {
		t.Fatalf("a reload that fails: %v", err)
	}
	if !slices.Equal(r.Reloaded, []string{"mt-1", "pv-1"}) {
		t.Fatalf("reloaded %v, want mt-1 and pv-1", r.Reloaded)
	}
	for _, name := range []string{"pv-1", "mt-1"} {
		if chatStatus(t, srv, name) != 200 || srv.LoadedAdapters()[name] != dirs[name] {
			t.Errorf("%s is not served from %s after the pass: %v", name, dirs[name], srv.LoadedAdapters())
		}
	}
	for _, name := range []string{"pv-1", "mt-1", "lt-1", "sim-x"} {
		if s := statusOf(t, st, name).Status; s != adapter.AdapterActive {
			t.Errorf("%s is %s after the pass, want active", name, s)
		}
	}
	if _, ok := srv.LoadedAdapters()["sim-x"]; ok {
		t.Error("the simulated adapter was loaded")
	}
	if ok, failed := counter(t, pr, "trace_adapter_reloads_total", "ok"), counter(t, pr, "trace_adapter_reloads_total", "failed"); ok != 2 || failed != 1 {
		t.Errorf("trace_adapter_reloads_total ok=%v failed=%v, want 2 and 1", ok, failed)
	}

	// The files are back: the next pass loads lt-1, and then nothing.
	if err := os.MkdirAll(dirs["lt-1"], 0o755); err != nil {
		t.Fatal(err)
	}
	if r, err := rec.Pass(ctx); err != nil || !slices.Equal(r.Reloaded, []string{"lt-1"}) || chatStatus(t, srv, "lt-1") != 200 {
		t.Fatalf("the next pass: %+v %v", r, err)
	}
	loads := len(srv.LoRACalls())
	if r, err := rec.Pass(ctx); err != nil || len(r.Reloaded)+len(r.Unloaded) != 0 || len(srv.LoRACalls()) != loads {
		t.Fatalf("a pass with nothing to do: %+v %v, %d LoRA calls", r, err, len(srv.LoRACalls())-loads)
	}
}

// TestReconcileUnloadsRetired: an adapter the registry retired or rolled
// back while its unload failed is still served; a pass unloads it (the
// serving entry says so) and leaves alone the names the registry does not
// know (the operator's own) and a candidate.
func TestReconcileUnloadsRetired(t *testing.T) {
	ctx := context.Background()
	st, srv, eng, rec, pr := reconcileFixture(t)
	reg := rec.Registry
	for _, c := range []struct{ name, capability string }{{"old-1", "precondition_verification"}, {"new-1", "precondition_verification"},
		{"rb-1", "multi_turn"}, {"cand-1", "long_tail"}} {
		candidate(t, st, c.name, c.capability, "file://"+t.TempDir())
	}
	for _, name := range []string{"old-1", "rb-1"} {
		if _, err := reg.Activate(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	// The engine fails every unload: new-1 replaces old-1 and rb-1 is
	// rolled back, both still served.
	for range 40 {
		srv.EnqueueLoRA(llmtest.Status(503, "busy"))
	}
	eng.MaxElapsed = 20 * time.Millisecond
	if _, err := reg.RollBack(ctx, "rb-1", "closed loop"); err == nil {
		t.Fatal("a failed unload was not reported")
	}
	srv.DropLoRAFaults()
	if _, err := reg.Activate(ctx, "new-1"); err != nil {
		t.Fatal(err)
	}
	eng.MaxElapsed = time.Second
	// old-1 was unloaded when new-1 replaced it; served again here behind
	// the registry's back (its serving entry says unloaded), as are the
	// operator's own adapter and a candidate.
	mine, candDir := t.TempDir(), t.TempDir()
	for name, dir := range map[string]string{"old-1": t.TempDir(), "operators-own": mine, "cand-1": candDir} {
		if err := eng.Load(ctx, name, dir); err != nil {
			t.Fatal(err)
		}
	}
	if s := statusOf(t, st, "old-1").Status; s != adapter.AdapterRetired {
		t.Fatalf("old-1 is %s", s)
	}
	// While the engine fails unloads, the pass reports them, records the
	// failure, and the next pass retries.
	for range 40 {
		srv.EnqueueLoRA(llmtest.Status(503, "busy"))
	}
	eng.MaxElapsed = 20 * time.Millisecond
	if _, err := rec.Pass(ctx); err == nil || !strings.Contains(err.Error(), "adapter old-1 is retired but served by "+srv.URL+", and unloading it again failed") {
		t.Fatalf("a pass whose unloads fail: %v", err)
	}
	if sv := adapter.ServingOf(statusOf(t, st, "old-1")); sv == nil || !sv.Loaded || !strings.Contains(sv.Error, "HTTP 503") {
		t.Errorf("old-1's serving entry after a failed unload: %+v", sv)
	}
	srv.DropLoRAFaults()
	eng.MaxElapsed = time.Second
	r, err := rec.Pass(ctx)
	if err != nil || !slices.Equal(r.Unloaded, []string{"old-1", "rb-1"}) || len(r.Reloaded) != 0 {
		t.Fatalf("pass: %+v %v", r, err)
	}
	loaded := srv.LoadedAdapters()
	for _, name := range []string{"old-1", "rb-1"} {
		if _, ok := loaded[name]; ok {
			t.Errorf("%s is still served", name)
		}
		if sv := adapter.ServingOf(statusOf(t, st, name)); sv == nil || sv.Loaded || sv.Error != "" {
			t.Errorf("%s's serving entry after the unload: %+v", name, sv)
		}
	}
	if loaded["operators-own"] != mine || loaded["cand-1"] != candDir || loaded["new-1"] == "" {
		t.Errorf("the pass touched what it must leave: %v", loaded)
	}
	if s := statusOf(t, st, "rb-1").Status; s != adapter.AdapterRolledBack {
		t.Errorf("rb-1 is %s after the pass", s)
	}
	if ok, failed := counter(t, pr, "trace_adapter_unloads_total", "ok"), counter(t, pr, "trace_adapter_unloads_total", "failed"); ok != 2 || failed != 2 {
		t.Errorf("trace_adapter_unloads_total ok=%v failed=%v, want 2 and 2", ok, failed)
	}
}

// TestReconcileEngineDown: a pass while the engine is down returns an
// error naming its endpoint and changes nothing; the next pass, once the
// engine is back (restarted: it serves nothing), loads the active adapter.
func TestReconcileEngineDown(t *testing.T) {
	ctx := context.Background()
	st, srv, _, rec, pr := reconcileFixture(t)
	candidate(t, st, "pv-1", "precondition_verification", "file://"+t.TempDir())
	if _, err := rec.Registry.Activate(ctx, "pv-1"); err != nil {
		t.Fatal(err)
	}
	before := statusOf(t, st, "pv-1").Version
	srv.SetDown(true)
	srv.RestartLoRA()
	if _, err := rec.Pass(ctx); err == nil || !strings.Contains(err.Error(), "listing the adapters "+srv.URL+" serves") {
		t.Fatalf("a pass while the engine is down: %v", err)
	}
	if v := statusOf(t, st, "pv-1").Version; v != before {
		t.Error("a pass that could not list the engine changed the registry")
	}
	srv.SetDown(false)
	if r, err := rec.Pass(ctx); err != nil || !slices.Equal(r.Reloaded, []string{"pv-1"}) || chatStatus(t, srv, "pv-1") != 200 {
		t.Fatalf("the pass after the engine is back: %+v %v", r, err)
	}
	if ok, bad := counter(t, pr, "trace_adapter_reconcile_passes_total", "ok"), counter(t, pr, "trace_adapter_reconcile_passes_total", "error"); ok != 1 || bad != 1 {
		t.Errorf("trace_adapter_reconcile_passes_total ok=%v error=%v, want 1 and 1", ok, bad)
	}
}

// TestReconcilerRun: the loop runs passes until its context ends: an
// engine restart while it runs is repaired without calling Pass, and Run
// returns when the context is cancelled.
func TestReconcilerRun(t *testing.T) {
	ctx := context.Background()
	st, srv, _, rec, _ := reconcileFixture(t)
	candidate(t, st, "pv-1", "precondition_verification", "file://"+t.TempDir())
	if _, err := rec.Registry.Activate(ctx, "pv-1"); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rec.Run(rctx, 50*time.Millisecond) }()
	srv.RestartLoRA()
	waitFor(t, "pv-1 loaded again", 30*time.Second, func() bool { return chatStatus(t, srv, "pv-1") == 200 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// staleActives is the registry's store (over the real ClickHouse) whose
// list of active adapters was read before an operator retired one: the
// reconciliation's list racing a retirement.
type staleActives struct {
	adapter.RegistryStore
	active []sink.AdapterRow
}

func (s staleActives) Adapters(ctx context.Context, f sink.AdapterFilter) ([]sink.AdapterRow, error) {
	if f.Status == adapter.AdapterActive && f.Capability == "" {
		return s.active, nil
	}
	return s.RegistryStore.Adapters(ctx, f)
}

// TestReconcileDoesNotReactivate: an adapter retired after the pass listed
// it as active (and, the engine restarted, not served) is not loaded
// again nor made active again: the reload re-reads it under the
// registry's lock.
func TestReconcileDoesNotReactivate(t *testing.T) {
	ctx := context.Background()
	st, srv, _, rec, _ := reconcileFixture(t)
	candidate(t, st, "pv-1", "precondition_verification", "file://"+t.TempDir())
	if _, err := rec.Registry.Activate(ctx, "pv-1"); err != nil {
		t.Fatal(err)
	}
	listed, err := st.Adapters(ctx, sink.AdapterFilter{Status: adapter.AdapterActive})
	if err != nil || len(listed) != 1 {
		t.Fatalf("%v %v", listed, err)
	}
	if _, err := rec.Registry.Retire(ctx, "pv-1", "operator"); err != nil {
		t.Fatal(err)
	}
	srv.RestartLoRA()
	rec.Registry.Store = staleActives{RegistryStore: st, active: listed}
	if r, err := rec.Pass(ctx); err != nil || len(r.Reloaded) != 0 {
		t.Fatalf("pass: %+v %v", r, err)
	}
	if s := statusOf(t, st, "pv-1").Status; s != adapter.AdapterRetired || chatStatus(t, srv, "pv-1") != 404 {
		t.Fatalf("pv-1 is %s, served: %v", s, chatStatus(t, srv, "pv-1") == 200)
	}
}
