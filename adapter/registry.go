package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/traceops/trace/sink"
)

// Engine is the serving engine's runtime adapter API (serving.VLLM): Load
// makes `model: name` select the adapter at path; Unload undoes it. Both
// retry what can be retried and return an error only when the engine did
// not do it; loading a name already loaded from the same path and
// unloading one that is not loaded succeed. Served lists the adapters the
// engine serves now (name → path), for the reconciliation (Reconciler).
type Engine interface {
	Name() string
	Endpoint() string
	Load(ctx context.Context, name, path string) error
	Unload(ctx context.Context, name string) error
	Served(ctx context.Context) (map[string]string, error)
}

// RegistryStore is what the registry needs of ClickHouse (sink.Store).
type RegistryStore interface {
	Adapter(ctx context.Context, name string) (*sink.AdapterRow, error)
	Adapters(ctx context.Context, f sink.AdapterFilter) ([]sink.AdapterRow, error)
	SaveAdapter(ctx context.Context, r sink.AdapterRow) error
}

// Registry errors.
var (
	// ErrUnknownAdapter: no adapter of that name is registered.
	ErrUnknownAdapter = errors.New("unknown adapter")
	// ErrTransition: the adapter's status does not allow the change.
	ErrTransition = errors.New("transition not allowed")
)

// storeError is a failure to read or write the registry's rows in the
// middle of a transition (ClickHouse away, a timeout): unlike the serving
// engine's refusal, the transition may succeed when tried again. Activate
// returns it with the engine's load undone (the registry is unchanged).
type storeError struct{ Err error }

func (e *storeError) Error() string { return e.Err.Error() }
func (e *storeError) Unwrap() error { return e.Err }

// Registry moves adapters between their statuses (candidate, active,
// retired, rolled_back) and keeps the serving engine in step:
//
//	Activate  candidate | retired → active   (loaded; the previous active one retired and unloaded)
//	Retire    candidate | active  → retired  (unloaded)
//	RollBack  active              → rolled_back (unloaded)
//
// At most one adapter is active per (target environment, capability).
// The registry never claims a load that did not happen: an adapter is
// saved active only after the engine loaded it, and an adapter leaving
// active is saved first and unloaded after, so a failed unload leaves an
// adapter that the registry no longer routes to but the engine still
// serves — recorded in its metadata ("serving") and returned as an error.
// With no Engine the registry only records.
//
// Transitions are serialised within one process; two processes changing
// the same (environment, capability) at once can both win (ClickHouse has
// no transactions): run them from one place (trace adapters, or the adapt
// role's auto-activation).
type Registry struct {
	Store  RegistryStore
	Engine Engine // nil: no serving engine (the registry only records)
	// PathMap rewrites adapter URIs before they become the engine's
	// lora_path: the longest matching prefix is replaced (e.g.
	// "file:///var/lib/trace/adapters" → "/models/adapters", where the
	// engine's host mounts them). See LoRAPath.
	PathMap map[string]string
	Now     func() time.Time
	Log     *slog.Logger

	mu sync.Mutex
}

// Change is one adapter's transition.
type Change struct {
	Name     string `json:"name"`
	From     string `json:"from"`
	To       string `json:"to"`
	Loaded   bool   `json:"loaded"`   // loaded into the engine now
	Unloaded bool   `json:"unloaded"` // unloaded from the engine now
}

// Serving is the "serving" entry of an adapter's metadata: what the
// engine was last told.
type Serving struct {
	Engine   string    `json:"engine"`
	Endpoint string    `json:"endpoint"`
	Loaded   bool      `json:"loaded"`
	LoRAPath string    `json:"lora_path,omitempty"`
	At       time.Time `json:"at"`
	Error    string    `json:"error,omitempty"`
}

func (r *Registry) now() time.Time {
	if r.Now != nil {
		return r.Now().UTC()
	}
	return time.Now().UTC()
}

func (r *Registry) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.New(slog.DiscardHandler)
}

func (r *Registry) get(ctx context.Context, name string) (*sink.AdapterRow, error) {
	a, err := r.Store.Adapter(ctx, name)
	if err != nil {
		return nil, err
	}
	if a == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownAdapter, name)
	}
	return a, nil
}

// LoRAPath is the engine's lora_path of an adapter URI: after the longest
// PathMap prefix is rewritten, a file:// URI is its path, an absolute path
// itself; other schemes (s3://, …) cannot be loaded by vLLM and are an
// error asking for a PathMap entry. A prefix matches whole path segments:
// file:///a/adapters maps file:///a/adapters/x, not file:///a/adapters2/x.
func LoRAPath(uri string, pathMap map[string]string) (string, error) {
	best := ""
	for from := range pathMap {
		rest, ok := strings.CutPrefix(uri, from)
		whole := rest == "" || strings.HasSuffix(from, "/") || strings.HasPrefix(rest, "/")
		if ok && whole && len(from) > len(best) {
			best = from
		}
	}
	if best != "" {
		uri = pathMap[best] + strings.TrimPrefix(uri, best)
	}
	if strings.HasPrefix(uri, "/") {
		return uri, nil
	}
	u, err := url.Parse(uri)
	if err != nil {
		return "", fmt.Errorf("adapter URI %q: %w", uri, err)
	}
	if u.Scheme == "file" && u.Path != "" {
		return u.Path, nil
	}
	return "", fmt.Errorf("adapter URI %q: the engine loads a local path; map its prefix with adapter.serving.path_map", uri)
}

// save stores a's next version with status to and the serving entry (nil:
// keep the one it has) and a transition appended to its metadata.
func (r *Registry) save(ctx context.Context, a *sink.AdapterRow, to, reason string, sv *Serving) error {
	now := r.now()
	meta := map[string]any{}
	if a.Metadata != "" {
		_ = json.Unmarshal([]byte(a.Metadata), &meta)
	}
	if sv != nil {
		meta["serving"] = sv
	}
	if to != a.Status {
		hist, _ := meta["transitions"].([]any)
		t := map[string]any{"from": a.Status, "to": to, "at": now}
		if reason != "" {
			t["reason"] = reason
		}
		meta["transitions"] = append(hist, t)
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	next := *a
	next.Status, next.Metadata, next.UpdatedAt = to, string(b), now
	next.Version = max(a.Version+1, uint64(now.UnixNano()))
	if err := r.Store.SaveAdapter(ctx, next); err != nil {
		return err
	}
	*a = next
	return nil
}

// ServingOf reads the serving entry of an adapter's metadata (nil when it
// has none: never sent to an engine).
func ServingOf(a *sink.AdapterRow) *Serving {
	var m struct {
		Serving *Serving `json:"serving"`
	}
	if json.Unmarshal([]byte(a.Metadata), &m) != nil {
		return nil
	}
	return m.Serving
}

// Activate makes name the active adapter of its (environment,
// capability): candidate or retired → active, loaded into the engine
// first (a failed load changes nothing and is returned); the adapter
// active before is retired and unloaded. Activating the active adapter
// loads it again (an engine restarted since forgot it) and changes no
// status. A failure to read or write the registry's rows is a storeError,
// returned with the engine's load undone.
func (r *Registry) Activate(ctx context.Context, name string) ([]Change, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, err := r.get(ctx, name)
	if err != nil {
		if !errors.Is(err, ErrUnknownAdapter) {
			err = &storeError{err}
		}
		return nil, err
	}
	switch a.Status {
	case AdapterCandidate, AdapterRetired, AdapterActive:
	default:
		return nil, fmt.Errorf("%w: adapter %s is %s; only a candidate or a retired adapter can be activated", ErrTransition, name, a.Status)
	}
	from := a.Status
	var sv *Serving
	if r.Engine != nil && a.Simulated {
		return nil, fmt.Errorf("%w: adapter %s is simulated (no model was trained): there is nothing to load into %s (with adapter.serving off the registry records it)",
			ErrTransition, name, r.Engine.Name())
	}
	if r.Engine != nil {
		path, err := LoRAPath(a.URI, r.PathMap)
		if err != nil {
			return nil, fmt.Errorf("activate %s: %w", name, err)
		}
		if err := r.Engine.Load(ctx, name, path); err != nil {
			return nil, fmt.Errorf("activate %s: the serving engine did not load it (the registry is unchanged): %w", name, err)
		}
		sv = &Serving{Engine: r.Engine.Name(), Endpoint: r.Engine.Endpoint(), Loaded: true, LoRAPath: path, At: r.now()}
	}
	prev, err := r.Store.Adapters(ctx, sink.AdapterFilter{Status: AdapterActive, Capability: a.Capability, Environment: a.Environment})
	if err != nil {
		return nil, r.undoLoad(ctx, name, from, sv, &storeError{err})
	}
	if err := r.save(ctx, a, AdapterActive, "activated", sv); err != nil {
		return nil, r.undoLoad(ctx, name, from, sv, &storeError{err})
	}
	changes := []Change{{Name: name, From: from, To: AdapterActive, Loaded: sv != nil}}
	r.log().Info("adapter activated", "adapter", name, "from", from, "capability", a.Capability, "environment", a.Environment, "loaded", sv != nil)
	sort.Slice(prev, func(i, j int) bool { return prev[i].Name < prev[j].Name })
	var errs []error
	for i := range prev {
		p := &prev[i]
		if p.Name == name {
			continue
		}
		c, err := r.leave(ctx, p, AdapterRetired, "replaced by "+name)
		if c != nil {
			changes = append(changes, *c)
		}
		errs = append(errs, err)
	}
	return changes, errors.Join(errs...)
}

// undoLoad unloads an adapter whose activation could not be recorded, so
// the engine does not serve what the registry does not claim. An adapter
// that was active already (a reload) stays loaded: the registry claims it.
func (r *Registry) undoLoad(ctx context.Context, name, from string, sv *Serving, cause error) error {
	if sv == nil || r.Engine == nil {
		return cause
	}
	if from == AdapterActive {
		return fmt.Errorf("activate %s: %w (it is still active, and loaded)", name, cause)
	}
	if err := r.Engine.Unload(context.WithoutCancel(ctx), name); err != nil {
		return fmt.Errorf("activate %s: %w; and unloading it again failed: %v", name, cause, err)
	}
	return fmt.Errorf("activate %s: %w (unloaded again)", name, cause)
}

// leave moves a to status to (retired or rolled_back): saved first, then
// unloaded when the engine may serve it. A failed unload is recorded in
// its metadata and returned.
func (r *Registry) leave(ctx context.Context, a *sink.AdapterRow, to, reason string) (*Change, error) {
	from := a.Status
	prevSv := ServingOf(a)
	loaded := r.Engine != nil && (from == AdapterActive || (prevSv != nil && prevSv.Loaded))
	if from != to {
		var sv *Serving
		if prevSv != nil {
			s := *prevSv
			sv = &s
		}
		if err := r.save(ctx, a, to, reason, sv); err != nil {
			return nil, fmt.Errorf("%s %s: %w", verb(to), a.Name, err)
		}
		r.log().Info("adapter "+to, "adapter", a.Name, "from", from, "reason", reason)
	}
	c := &Change{Name: a.Name, From: from, To: to}
	if !loaded {
		return c, nil
	}
	sv := &Serving{Engine: r.Engine.Name(), Endpoint: r.Engine.Endpoint(), At: r.now()}
	if prevSv != nil {
		sv.LoRAPath = prevSv.LoRAPath
	}
	uerr := r.Engine.Unload(ctx, a.Name)
	if uerr != nil {
		sv.Loaded, sv.Error = true, uerr.Error()
	} else {
		c.Unloaded = true
	}
	if err := r.save(context.WithoutCancel(ctx), a, to, "", sv); err != nil && uerr == nil {
		r.log().Warn("adapter: recording the unload", "adapter", a.Name, "err", err)
	}
	if uerr != nil {
		r.log().Warn("adapter: unload failed; the registry no longer routes to it but the engine still serves it", "adapter", a.Name, "err", uerr)
		return c, fmt.Errorf("%s %s: it is %s in the registry, but the serving engine still serves it: %w", verb(to), a.Name, to, uerr)
	}
	return c, nil
}

func verb(status string) string {
	if status == AdapterRolledBack {
		return "roll back"
	}
	return "retire"
}

// Retire takes an adapter out of use: candidate or active → retired, and
// unloaded from the engine. Retiring a retired adapter retries an unload
// that failed before, and otherwise changes nothing.
func (r *Registry) Retire(ctx context.Context, name, reason string) (*Change, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, err := r.get(ctx, name)
	if err != nil {
		return nil, err
	}
	switch a.Status {
	case AdapterCandidate, AdapterActive, AdapterRetired:
	default:
		return nil, fmt.Errorf("%w: adapter %s is %s; only a candidate or an active adapter can be retired", ErrTransition, name, a.Status)
	}
	if reason == "" {
		reason = "retired"
	}
	return r.leave(ctx, a, AdapterRetired, reason)
}

// RollBack is the closed loop's guard: it takes an active adapter whose
// effect in production is bad out of service — active → rolled_back, and
// unloaded from the serving engine — with the reason recorded in its
// metadata. A rolled-back adapter is never activated again (a new
// training run registers a new one). Rolling back an adapter that is
// rolled back already retries an unload that failed before, and otherwise
// changes nothing; any other status is ErrTransition.
func (r *Registry) RollBack(ctx context.Context, name, reason string) (*Change, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, err := r.get(ctx, name)
	if err != nil {
		return nil, err
	}
	if a.Status != AdapterActive && a.Status != AdapterRolledBack {
		return nil, fmt.Errorf("%w: adapter %s is %s; only an active adapter can be rolled back", ErrTransition, name, a.Status)
	}
	if reason == "" {
		reason = "rolled back"
	}
	return r.leave(ctx, a, AdapterRolledBack, reason)
}
