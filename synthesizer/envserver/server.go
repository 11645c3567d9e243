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
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Options are what New needs beyond the configuration.
type Options struct {
	Catalog Catalog
	// Writer stores sampled episodes (a *sink.Store); nil records nothing.
	Writer EpisodeWriter
	// Registerer takes the metrics; nil registers none.
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

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

	recCancel context.CancelFunc

	mu     sync.Mutex
	envs   map[string]*served
	closed bool
}

// New returns a server; it starts the idle reaper and the episode recorder.
func New(cfg Config, o Options) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.Catalog == nil {
		return nil, errors.New("envserver: no catalog")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	s := &Server{cfg: cfg, cat: o.Catalog, log: o.Log, stop: make(chan struct{}), envs: map[string]*served{}}
	queued := func() float64 { return 0 }
	s.m = newMetrics(o.Registerer, func() float64 { return queued() })
	if o.Writer != nil {
		s.rec = newRecorder(o.Writer, cfg, s.m, o.Log)
		queued = func() float64 { return float64(len(s.rec.q)) }
		ctx, cancel := context.WithCancel(context.Background())
		s.recCancel = cancel
		go s.rec.run(ctx)
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

// Close ends every session, closes the environments it opened and writes
// the episodes still queued (bounded by ctx).
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
	for _, e := range envs {
		e.mu.Lock()
		sessions := make([]*session, 0, len(e.sessions))
		for _, ss := range e.sessions {
			sessions = append(sessions, ss)
		}
		e.mu.Unlock()
		for _, ss := range sessions {
			if ss.onEvict != nil {
				ss.onEvict("the server is shutting down")
			}
			e.release(ss)
		}
		if err := e.env.Close(); err != nil {
			errs = append(errs, fmt.Errorf("environment %s: %w", e.id, err))
		}
	}
	if s.rec != nil {
		s.recCancel()
		select {
		case <-s.rec.done:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("envserver: episodes still queued at shutdown: %w", ctx.Err()))
		}
	}
	return errors.Join(errs...)
}

// environment returns the served environment id, opening it on first use.
func (s *Server) environment(ctx context.Context, id string) (*served, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("envserver: shutting down")
	}
	if e := s.envs[id]; e != nil {
		return e, nil
	}
	entries, err := s.cat.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("envserver: catalog: %w", err)
	}
	var entry *Entry
	for i := range entries {
		if entries[i].ID == id {
			entry = &entries[i]
		}
	}
	if entry == nil {
		return nil, ErrNotFound
	}
	env, err := s.cat.Open(ctx, id)
	if err != nil {
		return nil, err
	}
	e, err := newServed(s, *entry, env)
	if err != nil {
		env.Close()
		return nil, err
	}
	s.envs[id] = e
	return e, nil
}

// Handler serves the API: GET /health and the environments' health are
// open, everything else needs the bearer token when one is configured.
func (s *Server) Handler() http.Handler {
	open := http.NewServeMux()
	health := func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "healthy"})
	}
	open.HandleFunc("GET /health", health)
	open.HandleFunc("GET /v1/environments/{id}/health", health)

	p := http.NewServeMux()
	p.HandleFunc("GET /v1/environments", s.listEnvironments)
	p.HandleFunc("GET /v1/environments/{id}/ws", s.withEnv(s.serveWS))
	p.HandleFunc("POST /v1/environments/{id}/reset", s.withEnv(s.httpReset))
	p.HandleFunc("POST /v1/environments/{id}/step", s.withEnv(s.httpStep))
	p.HandleFunc("GET /v1/environments/{id}/state", s.withEnv(s.httpState))
	p.HandleFunc("GET /v1/environments/{id}/schema", s.withEnv(s.httpSchema))
	p.HandleFunc("GET /v1/environments/{id}/metadata", s.withEnv(s.httpMetadata))
	p.HandleFunc("POST /v1/environments/{id}/mcp", s.withEnv(s.httpMCP))
	p.HandleFunc("GET /v1/environments/{id}/mcp", s.withEnv(s.serveMCPWS))
	open.Handle("/", Auth(s.cfg.BearerToken, p))
	return open
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
			s.log.Error("env server: open environment", "environment", id, "err", err)
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"detail": err.Error(), "code": "FACTORY_ERROR"})
			return
		}
		h(w, r, e)
	}
}

func (s *Server) listEnvironments(w http.ResponseWriter, r *http.Request) {
	entries, err := s.cat.List(r.Context())
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"detail": err.Error()})
		return
	}
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

// Auth protects h with a static token when one is configured (trace's HTTP
// token model, internal/app): "Authorization: Bearer T", the password of
// HTTP Basic authentication (any user name; a WebSocket client that cannot
// set headers sends it from the URL, ws://trace:T@host/…), or ?token=T.
func Auth(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := ""
		authz := r.Header.Get("Authorization")
		switch {
		case strings.HasPrefix(authz, "Bearer "):
			got = strings.TrimPrefix(authz, "Bearer ")
		case strings.HasPrefix(authz, "Basic "):
			if b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(authz, "Basic ")); err == nil {
				if _, pass, ok := strings.Cut(string(b), ":"); ok {
					got = pass
				}
			}
		}
		if got == "" {
			got = r.URL.Query().Get("token")
		}
		if subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="trace"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": "unauthorized: send the token as Authorization: Bearer, as the Basic password, or as ?token="})
			return
		}
		h.ServeHTTP(w, r)
	})
}
