package app

import (
	"cmp"
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/traceops/trace/adapter/dispatch"
	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/dashboard"
	"github.com/traceops/trace/internal/httpauth"
	"github.com/traceops/trace/synthesizer"
	"github.com/traceops/trace/synthesizer/envserver"
	"github.com/traceops/trace/verify"
)

// httpServer serves /healthz, /readyz and /metrics for every role, so that
// each replica can be probed and scraped, and the dashboard and JSON API
// with the serve role.
func (a *App) httpServer() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", a.readyz)
	protected := http.NewServeMux()
	protected.Handle("GET /metrics", promhttp.HandlerFor(a.Registry, promhttp.HandlerOpts{Registry: a.Registry}))
	if a.Cfg.Has("serve") {
		deps := dashboard.Deps{Dicts: a.Dicts,
			Rho: a.Cfg.Analyzer.Rho, Delta: a.Cfg.Analyzer.Delta, Eval: a.Cfg.Analyzer.EvalConfig, Log: a.Log,
			Labeling: analyzer.LabelingSetup{Labeler: a.Cfg.Analyzer.Labeler, LLM: a.Cfg.LLM.BaseURL != "" && a.Cfg.Analyzer.Labeler == "llm"}}
		if a.Store != nil { // a nil *sink.Store must stay a nil Store
			deps.Store = a.Store
			deps.Environments = synthesizer.SinkStore{Rows: a.Store, Log: a.Log}
			deps.Training = a.Store
			// Read-only: the dashboard reports; the adapt role's guard acts.
			deps.Loop = verify.Reporter{Checker: verify.New(a.Cfg.Verify, a.Store, nil, nil, a.Log),
				Shares: []verify.ShareSource{verify.DecisionShares{Store: a.Store}, a.Store}}
		}
		protected.Handle("/", dashboard.New(deps))
		if a.envSrv != nil && a.Cfg.Env.Addr == "" {
			// The environment server checks its own token (env.bearer_token,
			// else http.bearer_token) and leaves its health endpoints open.
			h := a.envSrv.Handler()
			mux.Handle("/v1/environments", h)
			mux.Handle("/v1/environments/", h)
		}
	}
	if cb := a.trainingCallback(); cb != nil {
		// Authenticated by the webhook's HMAC signature (or its callback
		// token), not by http.bearer_token: trainers hold those.
		mux.Handle(dispatch.CallbackRoute, cb)
	}
	mux.Handle("/", bearer(a.Cfg.HTTP.BearerToken, protected))
	return &http.Server{Addr: a.Cfg.HTTP.Addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}

// bearer protects h with a static token when one is configured: a bearer
// header or a bare token (httpauth.Bearer). The dashboard's pages accept it as ?token= too, since
// a browser cannot set the header on navigation; an Authorization that
// carries something else (a reverse proxy's own credentials, passed on)
// does not hide it.
func bearer(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !httpauth.Match(token, httpauth.Bearer(r.Header.Get("Authorization")), r.URL.Query().Get("token")) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="trace"`)
			if strings.HasPrefix(r.URL.Path, "/api/") { // the API's errors are JSON
				dashboard.WriteAPIError(w, http.StatusUnauthorized, "unauthorized: send http.bearer_token as Authorization: Bearer <token>")
				return
			}
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// newEnvServer is the serve role's OpenEnv environment server over the
// registry's DONE environments (synthesizer.Catalog), recording sampled
// episodes in env_episodes. Nil without a store.
func (a *App) newEnvServer() (*envserver.Server, error) {
	if a.Store == nil {
		return nil, nil
	}
	cfg := a.Cfg.Env
	cfg.BearerToken = cmp.Or(cfg.BearerToken, a.Cfg.HTTP.BearerToken)
	return envserver.New(cfg, envserver.Options{
		Catalog:    synthesizer.Catalog{Store: synthesizer.SinkStore{Rows: a.Store, Log: a.Log.With("component", "envserver")}, Limits: a.Cfg.Programs},
		Writer:     a.Store,
		Registerer: a.Registry,
		Log:        a.Log.With("component", "envserver"),
	})
}

// trainingCallback is the webhook backend's callback endpoint on the serve
// role (adapter.webhook.events: callback): an authenticated event is
// relayed to trace.training.events.<job_id>, which the adapt role
// consumes, wherever it runs. Nil when not configured.
func (a *App) trainingCallback() http.Handler {
	if !a.Cfg.Has("serve") || !a.Cfg.TrainingCallback() || a.Bus == nil || a.Store == nil {
		return nil
	}
	wc := a.Cfg.WebhookConfig()
	return &dispatch.Callback{Secret: []byte(wc.Secret), Token: wc.CallbackToken, Tolerance: wc.Tolerance, Relay: a.Bus,
		Jobs: func(ctx context.Context, id string) (bool, error) {
			j, err := a.Store.TrainingJob(ctx, id)
			return j != nil, err
		}, Log: a.Log.With("component", "training-callback")}
}
