package adapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/traceops/trace/sink"
)

// Reconciler keeps the serving engine in step with the registry. The
// engine's runtime-loaded adapters live only in its process's memory: a
// restart of vLLM (a deploy, an OOM, a node move) forgets every one while
// the registry still says active, and the routers' conversations with
// `model: <adapter>` are answered 404. Each pass lists what the engine
// serves (Engine.Served) and
//
//   - loads again every active, non-simulated adapter the engine does not
//     serve (the load Activate does for an active adapter; nothing is
//     written);
//   - unloads again every adapter it serves that the registry has as
//     retired or rolled_back (an unload that failed);
//
// and leaves every other name alone (candidates, and names the registry
// does not know: the operator's own adapters). Loads and unloads are
// idempotent, so replicas running passes at the same time do no harm; a
// pass racing another replica's activation is put right by the next one.
type Reconciler struct {
	Registry *Registry
	Metrics  *ReconcileMetrics // nil: not counted
	Log      *slog.Logger
}

// Reconciliation is what one pass did.
type Reconciliation struct {
	Served   int      // adapters the engine served when listed
	Reloaded []string // active adapters it did not serve, loaded again
	Unloaded []string // retired or rolled-back adapters it served, unloaded again
}

func (c *Reconciler) log() *slog.Logger {
	if c.Log != nil {
		return c.Log
	}
	return slog.New(slog.DiscardHandler)
}

// Pass reconciles once. It returns an error when the engine's list or the
// registry's active adapters cannot be read (nothing done then), and the
// failed loads and unloads (the others are done); the next pass retries.
// Without an engine it does nothing.
func (c *Reconciler) Pass(ctx context.Context) (Reconciliation, error) {
	var out Reconciliation
	reg := c.Registry
	if reg == nil || reg.Engine == nil {
		return out, nil
	}
	eng := reg.Engine
	served, err := eng.Served(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.Metrics.pass(err)
		}
		return out, fmt.Errorf("serving reconciliation: listing the adapters %s serves: %w", eng.Endpoint(), err)
	}
	out.Served = len(served)
	active, err := reg.Store.Adapters(ctx, sink.AdapterFilter{Status: AdapterActive})
	if err != nil {
		if ctx.Err() == nil {
			c.Metrics.pass(err)
		}
		return out, fmt.Errorf("serving reconciliation: reading the active adapters: %w", err)
	}
	sort.Slice(active, func(i, j int) bool { return active[i].Name < active[j].Name })
	var errs []error
	isActive := map[string]bool{}
	for _, a := range active {
		isActive[a.Name] = true
		if _, ok := served[a.Name]; ok || a.Simulated || ctx.Err() != nil {
			continue
		}
		err := reg.reload(ctx, a.Name)
		switch {
		case errors.Is(err, ErrTransition):
			// Retired or rolled back since it was listed: nothing to load.
		case err != nil:
			c.Metrics.reload("failed")
			errs = append(errs, fmt.Errorf("adapter %s is active but not served by %s, and loading it again failed: %w", a.Name, eng.Endpoint(), err))
		default:
			c.Metrics.reload("ok")
			out.Reloaded = append(out.Reloaded, a.Name)
			c.log().Warn(fmt.Sprintf("adapter %s is active but was not served by %s (the engine restarted?); loaded again", a.Name, eng.Endpoint()),
				"adapter", a.Name, "engine", eng.Name(), "endpoint", eng.Endpoint())
		}
	}
	names := make([]string, 0, len(served))
	for name := range served {
		if !isActive[name] {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		if ctx.Err() != nil {
			break
		}
		unloaded, status, err := reg.unloadStale(ctx, name)
		switch {
		case err != nil && status == "":
			errs = append(errs, fmt.Errorf("adapter %s is served by %s, and reading it in the registry failed: %w", name, eng.Endpoint(), err))
		case err != nil:
			c.Metrics.unload("failed")
			errs = append(errs, fmt.Errorf("adapter %s is %s but served by %s, and unloading it again failed: %w", name, status, eng.Endpoint(), err))
		case unloaded:
			c.Metrics.unload("ok")
			out.Unloaded = append(out.Unloaded, name)
			c.log().Warn(fmt.Sprintf("adapter %s is %s but was still served by %s; unloaded", name, status, eng.Endpoint()),
				"adapter", name, "engine", eng.Name(), "endpoint", eng.Endpoint())
		}
	}
	err = errors.Join(errs...)
	if ctx.Err() != nil {
		return out, errors.Join(err, ctx.Err()) // stopping: not counted
	}
	c.Metrics.pass(err)
	return out, err
}

// Run reconciles at once and then every interval until ctx ends; a pass's
// error is logged, and the next pass tries again.
func (c *Reconciler) Run(ctx context.Context, every time.Duration) error {
	if every <= 0 {
		return fmt.Errorf("serving reconciliation: the interval must be positive, got %s", every)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := c.Pass(ctx); err != nil && ctx.Err() == nil {
			c.log().Warn("adapter: serving reconciliation (retried at the next pass)", "err", err, "every", every)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// reload loads the active adapter name into the engine again, as
// Activate does for an active adapter, re-read under the lock and refused
// (ErrTransition) when it is no longer active or is simulated. Unlike
// Activate it writes nothing: every replica reconciles, and a write of
// the active row racing another replica's retirement would undo it (a
// load racing it is unloaded by the next pass instead).
func (r *Registry) reload(ctx context.Context, name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, err := r.get(ctx, name)
	if err != nil {
		return err
	}
	if a.Status != AdapterActive || a.Simulated || r.Engine == nil {
		return fmt.Errorf("%w: adapter %s is %s (simulated %v), not an active adapter to load", ErrTransition, name, a.Status, a.Simulated)
	}
	path, err := LoRAPath(a.URI, r.PathMap)
	if err != nil {
		return err
	}
	return r.Engine.Load(ctx, name, path)
}

// unloadStale unloads name from the engine, which listed it, when the
// registry has it as retired or rolled_back (read under the lock); any
// other status, or a name the registry does not know, is left alone. The
// unload is recorded in its serving entry unless the row changed
// meanwhile (another replica's transition: its write stands). It returns
// whether it unloaded, and the status it found ("" when the adapter could
// not be read).
func (r *Registry) unloadStale(ctx context.Context, name string) (bool, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, err := r.Store.Adapter(ctx, name)
	if err != nil {
		return false, "", err
	}
	if a == nil {
		return false, "", nil
	}
	if a.Status != AdapterRetired && a.Status != AdapterRolledBack {
		return false, a.Status, nil
	}
	sv := &Serving{Engine: r.Engine.Name(), Endpoint: r.Engine.Endpoint(), At: r.now()}
	if prev := ServingOf(a); prev != nil {
		sv.LoRAPath = prev.LoRAPath
	}
	uerr := r.Engine.Unload(ctx, name)
	if uerr != nil {
		sv.Loaded, sv.Error = true, uerr.Error()
	}
	wctx := context.WithoutCancel(ctx)
	if cur, err := r.Store.Adapter(wctx, name); err == nil && cur != nil && cur.Version == a.Version {
		if err := r.save(wctx, a, a.Status, "", sv); err != nil {
			r.log().Warn("adapter: recording the reconciliation's unload", "adapter", name, "err", err)
		}
	}
	return uerr == nil, a.Status, uerr
}

// ReconcileMetrics count the reconciliation's work: passes
// (trace_adapter_reconcile_passes_total{result="ok|error"}), adapters
// loaded again (trace_adapter_reloads_total{result="ok|failed"}) and
// unloaded again (trace_adapter_unloads_total{result="ok|failed"}).
type ReconcileMetrics struct {
	passes, reloads, unloads *prometheus.CounterVec
}

// NewReconcileMetrics registers the reconciliation's metrics with reg
// (nil: not registered); metrics registered already are reused.
func NewReconcileMetrics(reg prometheus.Registerer) *ReconcileMetrics {
	m := &ReconcileMetrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "trace", Subsystem: "adapter", Name: "reconcile_passes_total",
			Help: "Serving reconciliation passes (adapter.serving.reconcile_every), by result: ok, or error (the engine or the registry unreadable, or a load or unload failed)."}, []string{"result"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "trace", Subsystem: "adapter", Name: "reloads_total",
			Help: "Active adapters the serving engine did not serve (it restarted), loaded again, by result: ok or failed."}, []string{"result"}),
		unloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "trace", Subsystem: "adapter", Name: "unloads_total",
			Help: "Retired or rolled-back adapters the serving engine still served, unloaded again, by result: ok or failed."}, []string{"result"}),
	}
	if reg == nil {
		return m
	}
	for _, c := range []**prometheus.CounterVec{&m.passes, &m.reloads, &m.unloads} {
		if err := reg.Register(*c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				panic(err)
			}
			*c = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	return m
}

func (m *ReconcileMetrics) pass(err error) {
	if m != nil {
		result := "ok"
		if err != nil {
			result = "error"
		}
		m.passes.WithLabelValues(result).Inc()
	}
}

func (m *ReconcileMetrics) reload(result string) {
	if m != nil {
		m.reloads.WithLabelValues(result).Inc()
	}
}

func (m *ReconcileMetrics) unload(result string) {
	if m != nil {
		m.unloads.WithLabelValues(result).Inc()
	}
}
