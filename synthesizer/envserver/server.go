// Package envserver serves environment programs (synthesizer/envprog) to RL
// trainers over OpenEnv, the protocol of openenv-core 0.3.0's reference
// server, which TRL, verifiers and AgileRL consume unchanged. Each
// environment of a Catalog is served under /v1/environments/{id}/: ws
// (stateful sessions), reset, step, state (stateless as OpenEnv's HTTP is,
// or stateful with a session id), schema, metadata, health and mcp
// (JSON-RPC tools/list and tools/call). GET /v1/environments lists them.
//
// An action is the policy's assistant message in OpenAI chat format; an
// observation carries the messages so far, the tools, the last tool
// results and, once done, the reward with its components. Sessions are
// bounded per environment, evicted when idle, and every program call runs
// under a step timeout; each limit is answered with OpenEnv's error code.
// Finished episodes are sampled into ClickHouse env_episodes through a
// bounded queue that never holds up a step.
package envserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"github.com/traceops/trace/internal/httpauth"
)

// Options are what New needs beyond the configuration.
type Options struct {
	Catalog Catalog
	// Writer stores sampled episodes (a *sink.Store); nil records nothing.
	Writer EpisodeWriter
	// Registerer takes the metrics; nil registers none.
	Registerer prometheus.Registerer
	Log        *slog.Logger
	// RecordDrain is how long Close lets the recorder write the episodes
	// still queued, on top of the sessions' shutdown; 0: 10 s.
	RecordDrain time.Duration
	// SettingName names a setting in the errors clients get (a limit they
	// hit), given its configuration key; nil: ConfigName (env.…). trace
	// env serve names its flags.
	SettingName func(key string) string
}

// defaultRecordDrain is Options.RecordDrain's default.
const defaultRecordDrain = 10 * time.Second

// Server is the OpenEnv environment server. Its handler is safe for
// concurrent use; Close ends every session.
type Server struct {
	cfg  Config
	cat  Catalog
	m    *metrics
	rec  *recorder
	log  *slog.Logger
	stop chan struct{}
	wg   sync.WaitGroup

	recDrain time.Duration
	name     func(key string) string // Options.SettingName

	// loads opens an environment once however many requests ask for it
	// meanwhile, outside mu.
	loads singleflight.Group
	// lists shares one catalog listing among the requests that ask for
	// one meanwhile.
	lists singleflight.Group
	// catalogTimeout bounds one catalog call (listing, opening).
	catalogTimeout time.Duration
	// lingering counts the connections refused at capacity that wait for
	// their client's first frame (see refuse).
	lingering atomic.Int32

	mu   sync.Mutex
	envs map[string]*served
	// missing holds ids the catalog did not know, until when that answer
	// is kept (notFoundTTL).
	missing map[string]time.Time
	// failed holds the environments whose last open failed (failedTTL).
	failed map[string]*failure
	// listFailed is the catalog's last listing when it failed, answered
	// without asking the catalog again until its until (failedTTL).
	listFailed *failure
	closed     bool
}

// failure is a failed call to the catalog, answered as it is without
// asking the catalog again until until: a listing (the registry's
// ClickHouse away; GET /v1/environments, and the requests for an
// environment not open yet), or an environment's open (version: its
// record's), which is also answered until a listing shows another version
// of its record, and kept after until, so that the same failure found
// again is not logged as an error again. It has been logged once made.
type failure struct {
	err     error
	version uint64
	until   time.Time
}

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

// catalogTimeout bounds one catalog call: a registry query, or loading a
// program into a fresh sandbox worker.
const catalogTimeout = 30 * time.Second

// notFoundTTL is how long an id the catalog did not know is answered 404
// without asking it again (an environment accepted meanwhile is served
// after at most that long).
const notFoundTTL = 5 * time.Second

// failedTTL is how long an environment that failed to open (its record
// does not decode, its program does not load), or a failed listing of the
// catalog, is answered 503 without asking the catalog again.
const failedTTL = notFoundTTL

// New returns a server; it starts the idle reaper and the episode recorder.
func New(cfg Config, o Options) (*Server, error) {
	if o.SettingName == nil {
		o.SettingName = ConfigName
	}
	if err := cfg.Check(o.SettingName); err != nil {
		return nil, err
	}
	if o.Catalog == nil {
		return nil, errors.New("envserver: no catalog")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	s := &Server{cfg: cfg, cat: o.Catalog, log: o.Log, name: o.SettingName, stop: make(chan struct{}), catalogTimeout: catalogTimeout,
		envs: map[string]*served{}, missing: map[string]time.Time{}, failed: map[string]*failure{}}
	queued := func() float64 { return 0 }
	s.m = newMetrics(o.Registerer, func() float64 { return queued() })
	if o.Writer != nil {
		s.rec = newRecorder(o.Writer, cfg, s.m, o.Log)
		queued = func() float64 { return float64(len(s.rec.q)) }
		s.recDrain = cmp.Or(o.RecordDrain, defaultRecordDrain)
		go s.rec.run()
	}
	s.wg.Add(1)
	go s.reaper()
	return s, nil
}

func (s *Server) reaper() {
	defer s.wg.Done()
	every := min(max(s.cfg.IdleTimeout/4, 10*time.Millisecond), 5*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.mu.Lock()
			envs := make([]*served, 0, len(s.envs))
			for _, e := range s.envs {
				envs = append(envs, e)
			}
			s.mu.Unlock()
			for _, e := range envs {
				e.reap(now)
			}
		}
	}
}

// Close ends every session, all at once and within ctx (a WebSocket peer
// that does not answer the close handshake is not waited for past it),
// closes the environments it opened, and then, within a budget of its own
// (Options.RecordDrain) whatever is left of ctx, writes the episodes still
// queued: those it cannot write are counted in
// trace_env_episodes_dropped_total{reason="shutdown"} and logged.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	envs := s.envs
	s.mu.Unlock()
	close(s.stop)
	s.wg.Wait()
	var errs []error
	if err := endSessions(ctx, envs); err != nil {
		errs = append(errs, err)
	}
	for _, e := range envs {
		if err := e.env.Close(); err != nil {
			errs = append(errs, fmt.Errorf("environment %s: %w", e.id, err))
		}
	}
	if s.rec != nil {
		if n := s.rec.stop(s.recDrain); n > 0 {
			errs = append(errs, fmt.Errorf("envserver: %d episodes not written at shutdown", n))
		}
	}
	return errors.Join(errs...)
}

// endSessions tells every session's client the server is going (a
// WebSocket's SESSION_ERROR and close) and releases the session, all at
// once; it returns when all are done or ctx ends, whichever is first.
func endSessions(ctx context.Context, envs map[string]*served) error {
	var wg sync.WaitGroup
	for _, e := range envs {
		e.mu.Lock()
		sessions := make([]*session, 0, len(e.sessions))
		for _, ss := range e.sessions {
			sessions = append(sessions, ss)
		}
		e.mu.Unlock()
		for _, ss := range sessions {
			if ss.onEvict != nil {
				wg.Go(func() { ss.onEvict(ctx, "the server is shutting down") })
			}
			wg.Go(func() { e.release(ss) })
		}
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("envserver: sessions still ending at shutdown: %w", ctx.Err())
	}
}

// environment returns the served environment id, opening it on first use.
// The server's lock covers only the lookup: the catalog is asked outside
// it (one load per id at a time, bounded by catalogTimeout), so a slow
// registry or sandbox start holds up only the requests for that id.
func (s *Server) environment(ctx context.Context, id string) (*served, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errShuttingDown
	}
	if e := s.envs[id]; e != nil {
		s.mu.Unlock()
		return e, nil
	}
	if until, ok := s.missing[id]; ok {
		if time.Now().Before(until) {
			s.mu.Unlock()
			return nil, ErrNotFound
		}
		delete(s.missing, id)
	}
	if f := s.failed[id]; f != nil && time.Now().Before(f.until) {
		s.mu.Unlock()
		s.log.Debug("env server: open environment (failed before, retried after a while)", "environment", id, "err", f.err)
		return nil, f
	}
	s.mu.Unlock()
	// The load is not the first caller's: it goes on (within its own
	// bound) when that caller goes away, for the others waiting on it.
	ch := s.loads.DoChan(id, func() (any, error) { return s.load(id) })
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*served), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

var errShuttingDown = errors.New("envserver: shutting down")

// load asks the catalog for environment id and keeps what it opened.
func (s *Server) load(id string) (*served, error) {
	s.mu.Lock()
	e := s.envs[id] // opened by a load that ended since the caller looked
	s.mu.Unlock()
	if e != nil {
		return e, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.catalogTimeout)
	defer cancel()
	entries, err := s.list(ctx)
	if err != nil {
		return nil, err
	}
	var entry *Entry
	for i := range entries {
		if entries[i].ID == id {
			entry = &entries[i]
		}
	}
	if entry == nil {
		s.notFound(id)
		return nil, ErrNotFound
	}
	env, err := s.cat.Open(ctx, id)
	if errors.Is(err, ErrNotFound) {
		s.notFound(id)
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, s.openFailed(id, entry.Version, fmt.Errorf("envserver: open %s: %w", id, err))
	}
	e, err = newServed(s, *entry, env)
	if err != nil {
		env.Close()
		return nil, s.openFailed(id, entry.Version, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.failed, id)
	if s.closed {
		env.Close()
		return nil, errShuttingDown
	}
	s.envs[id] = e
	return e, nil
}

// list lists the catalog; the entries are shared, read only. Listings
// asked for while one runs (a trainer fleet discovering environments at
// once) share its catalog call, which runs under its own deadline
// (catalogTimeout), so that a caller going away fails only itself. A
// failed listing is kept for failedTTL and answered meanwhile without
// asking the catalog (a trainer fleet polling GET /v1/environments while
// ClickHouse is away): logged as an error when the catalog was asked, at
// debug level when answered from it.
func (s *Server) list(ctx context.Context) ([]Entry, error) {
	s.mu.Lock()
	f := s.listFailed
	s.mu.Unlock()
	if f != nil && time.Now().Before(f.until) {
		s.log.Debug("env server: list environments (failed before, retried after a while)", "err", f.err)
		return nil, f
	}
	call := s.lists.DoChan("", func() (any, error) {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.catalogTimeout)
		defer cancel()
		entries, err := s.cat.List(lctx)
		if err != nil {
			f := &failure{err: fmt.Errorf("envserver: catalog: %w", err), until: time.Now().Add(failedTTL)}
			s.mu.Lock()
			s.listFailed = f
			s.mu.Unlock()
			s.log.Error("env server: list environments", "err", f.err, "retry_after", failedTTL)
			return nil, f
		}
		s.mu.Lock()
		s.listFailed = nil
		s.mu.Unlock()
		return entries, nil
	})
	select {
	case r := <-call:
		entries, _ := r.Val.([]Entry)
		return entries, r.Err
	case <-ctx.Done():
		return nil, fmt.Errorf("envserver: catalog: %w", ctx.Err())
	}
}

// notFound keeps the catalog's answer that id is unknown for notFoundTTL.
func (s *Server) notFound(id string) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	// ids asked for at random: keep the map small
	if roomFor(s.missing, id, now, func(until time.Time) time.Time { return until }) {
		s.missing[id] = now.Add(notFoundTTL)
	}
}

// maxKept bounds the ids the server keeps an answer for (Server.missing,
// Server.failed).
const maxKept = 1024

// roomFor reports whether m may hold key: it does already, or it holds
// fewer than maxKept once the entries whose until has passed are dropped.
func roomFor[V any](m map[string]V, key string, now time.Time, until func(V) time.Time) bool {
	if _, ok := m[key]; ok || len(m) < maxKept {
		return true
	}
	for k, v := range m {
		if now.After(until(v)) {
			delete(m, k)
		}
	}
	return len(m) < maxKept
}

// openFailed keeps err, opening version of environment id, for failedTTL
// and logs it: as an error the first time, at debug level when the same
// failure of the same version is found again.
func (s *Server) openFailed(id string, version uint64, err error) error {
	now := time.Now()
	f := &failure{err: err, version: version, until: now.Add(failedTTL)}
	s.mu.Lock()
	prev := s.failed[id]
	if roomFor(s.failed, id, now, func(f *failure) time.Time { return f.until }) {
		s.failed[id] = f
	}
	s.mu.Unlock()
	if prev != nil && prev.version == version && prev.err.Error() == err.Error() {
		s.log.Debug("env server: open environment failed again", "environment", id, "version", version, "err", err)
	} else {
		s.log.Error("env server: open environment", "environment", id, "version", version, "err", err,
			"retry_after", failedTTL)
	}
	return f
}

// newVersions lets the environments of entries whose record has another
// version than the one that failed to open be opened again at once.
func (s *Server) newVersions(entries []Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failed) == 0 {
		return
	}
	for _, e := range entries {
		if f := s.failed[e.ID]; f != nil && f.version != e.Version {
			f.until = time.Time{}
		}
	}
}

// Handler serves the API: GET /health and the environments' health are
// open (an environment's health opens it, as its first reset would),
// everything else needs the bearer token when one is configured.
func (s *Server) Handler() http.Handler {
	open := http.NewServeMux()
	health := func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "healthy"})
	}
	open.HandleFunc("GET /health", health)
	// An environment's health says whether it can be served: 404 for an
	// id the catalog does not know (cached, see notFoundTTL), 503 when it
	// fails to open.
	open.HandleFunc("GET /v1/environments/{id}/health", s.withEnv(func(w http.ResponseWriter, r *http.Request, _ *served) { health(w, r) }))
	open.HandleFunc("/health", methodNotAllowed("GET"))
	open.HandleFunc("/v1/environments/{id}/health", methodNotAllowed("GET"))

	p := http.NewServeMux()
	routes := []struct {
		method, path string
		h            http.HandlerFunc
	}{
		{"GET", "/v1/environments", s.listEnvironments},
		{"GET", "/v1/environments/{id}/ws", s.withEnv(s.serveWS)},
		{"POST", "/v1/environments/{id}/reset", s.withEnv(s.httpReset)},
		{"POST", "/v1/environments/{id}/step", s.withEnv(s.httpStep)},
		{"GET", "/v1/environments/{id}/state", s.withEnv(s.httpState)},
		{"GET", "/v1/environments/{id}/schema", s.withEnv(s.httpSchema)},
		{"GET", "/v1/environments/{id}/metadata", s.withEnv(s.httpMetadata)},
		{"GET", "/v1/environments/{id}/openapi.json", s.withEnv(s.httpOpenAPI)},
		{"POST", "/v1/environments/{id}/mcp", s.withEnv(s.httpMCP)},
		{"GET", "/v1/environments/{id}/mcp", s.withEnv(s.serveMCPWS)},
	}
	allow := map[string][]string{} // the methods of each path
	var paths []string
	for _, rt := range routes {
		p.HandleFunc(rt.method+" "+rt.path, rt.h)
		if allow[rt.path] == nil {
			paths = append(paths, rt.path)
		}
		allow[rt.path] = append(allow[rt.path], rt.method)
	}
	for _, path := range paths {
		p.HandleFunc(path, methodNotAllowed(allow[path]...))
	}
	// 404 and 405 in JSON, as openenv-core's server (FastAPI) answers
	// them, not net/http's text.
	p.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	})
	open.Handle("/", Auth(s.cfg.BearerToken, p))
	return open
}

// methodNotAllowed answers a path's other methods as openenv-core's
// server (FastAPI) does: 405 with Allow and a JSON detail.
func methodNotAllowed(methods ...string) http.HandlerFunc {
	allow := strings.Join(methods, ", ")
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Allow", allow)
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
	}
}

func (s *Server) withEnv(h func(http.ResponseWriter, *http.Request, *served)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		e, err := s.environment(r.Context(), id)
		switch {
		case errors.Is(err, ErrNotFound):
			writeJSON(w, http.StatusNotFound, map[string]string{"detail": fmt.Sprintf("no environment %q (GET /v1/environments lists them)", id)})
			return
		case err != nil:
			if f := (*failure)(nil); !errors.As(err, &f) { // openFailed, list logged it
				s.log.Error("env server: open environment", "environment", id, "err", err)
			}
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"detail": err.Error(), "code": "FACTORY_ERROR"})
			return
		}
		h(w, r, e)
	}
}

func (s *Server) listEnvironments(w http.ResponseWriter, r *http.Request) {
	entries, err := s.list(r.Context()) // the catalog call has its own deadline
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"detail": err.Error()})
		return
	}
	s.newVersions(entries)
	type item struct {
		Entry
		URL string `json:"url"`
	}
	out := make([]item, len(entries))
	for i, e := range entries {
		if e.Tools == nil {
			e.Tools = nil
		}
		out[i] = item{Entry: e, URL: "/v1/environments/" + e.ID}
	}
	writeJSON(w, http.StatusOK, map[string]any{"environments": out})
}

// Auth protects h with a static token when one is configured: a bearer
// header or a bare token, the Basic password that openenv's WebSocket
// client sends from the URL (ws://trace:T@host/…), or ?token=T, which counts whatever Authorization says (a reverse
// proxy's own credentials, passed on).
func Auth(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		authz := r.Header.Get("Authorization")
		if !httpauth.Match(token, httpauth.Bearer(authz), httpauth.BasicPassword(authz), r.URL.Query().Get("token")) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="trace"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": "unauthorized: send the token as Authorization: Bearer, as the Basic password, or as ?token="})
			return
		}
		h.ServeHTTP(w, r)
	})
}
