package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/oklog/run"

	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/httpauth"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/router"
)

// RouterIdleTimeout closes a caller's keep-alive connection that has been
// idle this long (an agent that went away without closing it). The router
// sets no ReadTimeout or WriteTimeout: they bound a whole request or
// response, and would cut long SSE streams.
const RouterIdleTimeout = 5 * time.Minute

// RouterAddr is where the route role listens (after Ready), "" without it.
func (a *App) RouterAddr() string { return a.routerAddr }

// addRoute adds the route role (TRACE step 4): the router over the
// registry's active adapters with the base model as classifier, and its
// proxy on router.addr. One actor serves the proxy and runs the decision
// recorder, so that on shutdown the requests in flight (streams) drain
// first, within router.drain_timeout (those still running then are
// closed, and their handlers waited for, within handlersWait), and their
// decisions are flushed to route_decisions after them.
func (a *App) addRoute(ctx context.Context, g *run.Group) error {
	rc := a.Cfg.Router
	if a.Bus == nil { // no role loaded the dictionaries: the descriptions come from them
		if err := a.Dicts.Load(ctx, a.Store); err != nil {
			return fmt.Errorf("router: dictionaries: %w", err)
		}
	}
	cls, err := llm.New(llm.Config{
		BaseURL: cmp.Or(rc.ClassifierURL, rc.UpstreamURL), Model: cmp.Or(rc.ClassifierModel, rc.BaseModel),
		APIKey: llm.Secret(cmp.Or(rc.ClassifierAPIKey, rc.UpstreamAPIKey)), Timeout: rc.ClassifierTimeout, MaxAttempts: rc.ClassifierAttempts,
		BackoffInitial: classifierBackoffInitial, BackoffMax: classifierBackoffMax, MaxRetryAfter: classifierBackoffMax, Concurrency: 16,
		Recorder: a.auditRecorder(), Logger: a.Log,
	})
	if err != nil {
		return fmt.Errorf("router classifier (router.classifier_url, router.classifier_model): %w", err)
	}
	var ret *router.Retriever
	if rv := rc.Retrieval; rv.EmbeddingsURL != "" {
		emb, err := llm.New(llm.Config{BaseURL: rv.EmbeddingsURL, Model: rv.EmbeddingsModel, APIKey: llm.Secret(rv.APIKey),
			Timeout: rc.ClassifierTimeout, MaxAttempts: embedderAttempts, BackoffInitial: classifierBackoffInitial, BackoffMax: classifierBackoffMax,
			MaxRetryAfter: classifierBackoffMax, Concurrency: 8, Recorder: a.auditRecorder(), Logger: a.Log})
		if err != nil {
			return fmt.Errorf("router retrieval (router.retrieval.embeddings_url, embeddings_model): %w", err)
		}
		ret = &router.Retriever{Embedder: emb, Source: a.Store, Pool: rv.Pool, TTL: rv.TTL, Timeout: classifierCall(rc, embedderAttempts),
			Log: a.Log.With("role", "route")}
	}
	extra, err := rc.ClassifierBody()
	if err != nil {
		return err
	}
	reg := &router.Registry{Rows: a.Store, TTL: rc.AdaptersRefresh, Describe: a.describeCapability}
	r, err := router.New(router.Config{BaseModel: rc.BaseModel, TopP: topP(rc.TopP), Temperature: rc.Temperature, TopLogprobs: rc.TopLogprobs,
		Context: rc.Context, LastN: rc.LastN, ContextMaxChars: rc.ContextMaxChars, CacheTTL: cacheTTL(rc.CacheTTL), CacheMax: rc.CacheMax, AdaptersRefresh: rc.AdaptersRefresh, LabelConstraint: rc.LabelConstraint,
		ClassifierAttempts: rc.ClassifierAttempts, ClassifierExtraBody: extra, DecisionTimeout: decisionTimeout(rc), Retriever: ret,
		Logger: a.Log.With("role", "route")}, cls, reg)
	if err != nil {
		return err
	}
	rec := &router.Recorder{W: a.Store, Log: a.Log.With("role", "route")}
	p, err := router.NewProxy(router.ProxyConfig{UpstreamURL: rc.UpstreamURL, UpstreamAPIKey: rc.UpstreamAPIKey, BearerToken: rc.BearerToken, Passthrough: rc.Passthrough,
		DefaultEnvironment: rc.DefaultEnvironment, NoAdapterFallback: !rc.FallbackOnMissingAdapter, MaxBodyBytes: rc.MaxBodyBytes, Registerer: a.Registry,
		Logger: a.Log.With("role", "route")}, r, rec)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", rc.Addr)
	if err != nil {
		return fmt.Errorf("router.addr %s: %w", rc.Addr, err)
	}
	a.routerAddr = ln.Addr().String()
	if httpauth.Exposed(ln.Addr(), rc.BearerToken) {
		a.Log.Warn("router.addr listens beyond this machine without a token: anyone who can reach it sends requests to the upstream with its key; set router.bearer_token", "addr", a.routerAddr)
	}
	hs := newHandlers()
	srv := &http.Server{Handler: hs.wrap(p.Handler()), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: RouterIdleTimeout}
	recCtx, stopRec := context.WithCancel(context.WithoutCancel(ctx))
	recDone := make(chan struct{})
	go func() { _ = rec.Run(recCtx); close(recDone) }()
	g.Add(func() error {
		err := srv.Serve(ln)
		if !errors.Is(err, http.ErrServerClosed) {
			stopRec()
			<-recDone
			return fmt.Errorf("router %s: %w", a.routerAddr, err)
		}
		return nil
	}, func(error) {
		sctx, cancel := context.WithTimeout(context.Background(), rc.DrainTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			a.Log.Warn("router: requests still in flight at router.drain_timeout; closing them", "err", err)
			_ = srv.Close()
		}
		// Closed connections cancel their handlers' contexts, and each
		// handler records its row as it returns: the recorder's final
		// flush comes after them.
		if !hs.wait(handlersWait) {
			a.Log.Warn("router: handlers still running after their connections closed; their decisions may not be recorded", "wait", handlersWait)
		}
		stopRec()
		<-recDone
	})
	a.Log.Info("route role: routing proxy", "url", "http://"+a.routerAddr+"/v1/chat/completions", "upstream", logURL(rc.UpstreamURL),
		"base_model", rc.BaseModel, "auth", rc.BearerToken != "")
	return nil
}

// handlersWait bounds the wait, on shutdown, for the proxy's handlers of
// closed connections to return (their contexts are cancelled: they return
// at once unless stuck).
const handlersWait = 5 * time.Second

// handlers counts the proxy's running handlers.
type handlers struct {
	n       atomic.Int64
	closing atomic.Bool
	idle    chan struct{} // signalled when the count falls to 0 while closing
}

func newHandlers() *handlers { return &handlers{idle: make(chan struct{}, 1)} }

func (h *handlers) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.n.Add(1)
		defer func() { // also when the handler aborts (http.ErrAbortHandler)
			if h.n.Add(-1) == 0 && h.closing.Load() {
				select {
				case h.idle <- struct{}{}:
				default:
				}
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// wait waits up to d for no handler to be running; false if some still are.
func (h *handlers) wait(d time.Duration) bool {
	h.closing.Store(true)
	t := time.NewTimer(d)
	defer t.Stop()
	for h.n.Load() > 0 {
		select {
		case <-h.idle:
		case <-t.C:
			return h.n.Load() == 0
		}
	}
	return true
}

// logURL is raw without its user information (user:password@), for the
// log.
func logURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(invalid url)"
	}
	u.User = nil
	return u.String()
}

// The classifier's and the retrieval embedder's retries: backoff from
// classifierBackoffInitial up to classifierBackoffMax (a server's
// Retry-After capped at it too); the embedder makes embedderAttempts.
const (
	classifierBackoffInitial = 100 * time.Millisecond
	classifierBackoffMax     = time.Second
	embedderAttempts         = 2
)

// decisionTimeout bounds a whole routing decision (router.Config's
// DecisionTimeout), derived from the classifier settings: every attempt
// (router.classifier_timeout each, router.classifier_attempts of them) and
// the waits between them (at most 1.5 × classifierBackoffMax each: the
// backoff's randomisation), plus, with retrieval on, the embedder's
// attempts (the retrieval's own bound, router.Retriever.Timeout). The wait
// for a classifier slot counts against it: an overloaded classifier routes
// new conversations to the base model (classifier_error) instead of
// queueing them without bound.
func decisionTimeout(rc config.Router) time.Duration {
	d := classifierCall(rc, rc.ClassifierAttempts)
	if rc.Retrieval.EmbeddingsURL != "" {
		d += classifierCall(rc, embedderAttempts)
	}
	return d
}

// classifierCall is the longest a call of the classifier's (or the
// embedder's) settings takes with attempts attempts and the waits between
// them.
func classifierCall(rc config.Router, attempts int) time.Duration {
	return time.Duration(attempts)*rc.ClassifierTimeout + time.Duration(max(attempts-1, 0))*classifierBackoffMax*3/2
}

// describeCapability is a capability's definition in the dictionary of the
// (environment, agent version), "" when none is known.
func (a *App) describeCapability(env, agentVersion, capability string) string {
	d := a.Dicts.Resolve(env, agentVersion)
	if d == nil {
		return ""
	}
	for _, c := range d.Capabilities {
		if c.Name == capability {
			return c.Definition
		}
	}
	return ""
}

// topP maps the configuration's "0 or less: the top adapter alone" to the
// router's negative value (its zero means the default).
func topP(p float64) float64 {
	if p <= 0 {
		return -1
	}
	return p
}

// cacheTTL maps router.cache_ttl 0 (no caching) to the router's negative value.
func cacheTTL(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
