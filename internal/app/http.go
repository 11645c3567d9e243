package app

import (
	"cmp"
	"crypto/subtle"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/dashboard"
	"github.com/traceops/trace/synthesizer"
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
		deps := dashboard.Deps{Evaluator: a.Evaluator, Dicts: a.Dicts,
			Rho: a.Cfg.Analyzer.Rho, Delta: a.Cfg.Analyzer.Delta, Eval: a.Cfg.Analyzer.EvalConfig, Log: a.Log,
			Labeling: analyzer.LabelingSetup{Labeler: a.Cfg.Analyzer.Labeler, LLM: a.Cfg.LLM.BaseURL != ""}}
		if a.Store != nil { // a nil *sink.Store must stay a nil Store
			deps.Store = a.Store
			deps.Environments = synthesizer.SinkStore{Rows: a.Store}
		}
		protected.Handle("/", dashboard.New(deps))
	}
	mux.Handle("/", bearer(a.Cfg.HTTP.BearerToken, protected))
	return &http.Server{Addr: a.Cfg.HTTP.Addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}

// bearer protects h with a static bearer token when one is configured. The
// dashboard's pages accept it as ?token= too, since a browser cannot set the
// header on navigation.
func bearer(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		got = cmp.Or(got, r.URL.Query().Get("token"))
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="trace"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
