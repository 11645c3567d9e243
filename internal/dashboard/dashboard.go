// Package dashboard serves trace's web UI and its JSON API.
//
// Routes (all GET):
//
//	/                 overview: pass rate, Cov and Δ per capability against ρ and δ, decisions
//	/capability       one capability: definition, statistics per run, LACKING failures with their conversation
//	/triggers         trigger timeline with the synthesis requests' payloads
//	/trends           weekly pass rate and top LACKING capabilities, per agent version
//	/environments     synthesized environments (environments.go): status, attempts, calibration
//	/environment      one environment: request, attempts, calibration histogram, program
//	/training         training jobs (training.go): status, reward curve per job, adapters
//	/loop             the closed loop (loop.go): each adapter's effect on its capability, the guard, the routing share
//	/api/             the API's endpoints and their parameters
//	/api/overview     the JSON of each page (same structs, same queries)
//	/api/capability
//	/api/triggers
//	/api/trends
//	/api/environments, /api/environments/{id}, /api/environments/{id}/program
//	/api/training
//	/api/loop
//	/assets/...       embedded CSS
//
// Every error of the API is JSON, {"error": "…"}: a bad parameter (400), no
// store (503), an unknown endpoint under /api/ (404) or another method than
// GET (405).
//
// Pages are rendered on the server with html/template; charts are inline SVG
// drawn in Go (svg.go). Nothing is loaded from the internet. The SQL lives in
// sink/dashboard.go (run through the Store interface's QueryDashboard) and is
// documented in docs/queries.md.
//
// A page URL that carries ?token= (the HTTP server's bearer token, see
// internal/app) keeps it on every link it renders. A page's selectors (a
// status, a range, a number of weeks) and filter forms change their own
// parameter and keep the others it was asked with (limit, the filters,
// examples, top, at).
package dashboard

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/sink"
)

// Store is what the dashboard reads from ClickHouse (sink.Store implements
// it): the analyzer's window statistics, the dictionaries, and the
// dashboard's own statements, which live in sink/dashboard.go.
type Store interface {
	AllDictionaries(ctx context.Context) ([]sink.DictionaryRow, error)
	// The cohorts' decision windows, read as the analyzer does (event time).
	analyzer.WindowReader
	FailedLabelRuns(ctx context.Context) ([]sink.FailedRuns, error)
	// LatestEvaluations are the evaluator's stored decisions (what the
	// pages show unless asked for a fresh computation).
	LatestEvaluations(ctx context.Context, cohorts []sink.Cohort) (map[sink.Cohort]sink.StoredEvaluation, error)
	// Watermarks are the cohorts' exact newest labeled end times (the
	// cohort list has only their hours), for the clock-skew warning.
	Watermarks(ctx context.Context, cohorts []sink.Cohort) (map[sink.Cohort]time.Time, error)
	QueryDashboard(ctx context.Context, q string, daily bool, args ...any) (driver.Rows, error)
	QueryDashboardRow(ctx context.Context, q string, args ...any) driver.Row
	// Location is the server's time zone, in which its hour and day
	// buckets start.
	Location() *time.Location
}

// Deps are what the dashboard reads from.
type Deps struct {
	Store Store // nil: every page says there is no store
	Dicts *analyzer.Registry
	Rho   float64
	Delta float64
	Log   *slog.Logger
	// Eval is the analyzer's configuration (K of N, decision window, minimum
	// failures), so a decision computed here matches the evaluator's. The
	// zero value means the analyzer's defaults; Rho and Delta above, when
	// set, take precedence over Eval's.
	Eval analyzer.EvalConfig
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
	// Environments are the synthesized environments (the Environments
	// pages); nil: those pages say there is no store.
	Environments EnvironmentStore
	// Training is the adapt role's jobs, curves and adapter registry (the
	// Training page); nil: that page says there is no store.
	Training TrainingStore
	// Labeling is the labeler setup, for saying why a cohort has no labels.
	Labeling analyzer.LabelingSetup
	// Loop is the closed loop (the /loop page); nil: that page says it is
	// not configured.
	Loop LoopSource
}

//go:embed assets templates
var files embed.FS

type server struct {
	d     Deps
	th    analyzer.Thresholds
	eval  analyzer.EvalConfig
	log   *slog.Logger
	now   func() time.Time
	pages map[string]*pageTemplate
	// warned are the rows whose unreadable JSON was logged (decodeColumn).
	warned onceSet
}

// onceSet remembers keys so that something is done once per key; it is
// emptied when it holds maxOnceSet (bounded memory for a long-running
// server; a key seen again after that is done once more).
type onceSet struct {
	mu   sync.Mutex
	seen map[string]bool
}

const maxOnceSet = 1024

// first reports whether key is new, and remembers it.
func (o *onceSet) first(key string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen[key] {
		return false
	}
	if o.seen == nil || len(o.seen) >= maxOnceSet {
		o.seen = map[string]bool{}
	}
	o.seen[key] = true
	return true
}

// location is the store's time zone (UTC without a store).
func (s *server) location() *time.Location {
	if s.d.Store == nil {
		return time.UTC
	}
	return s.d.Store.Location()
}

// New returns the dashboard handler.
func New(d Deps) http.Handler {
	eval := d.Eval
	if d.Rho != 0 {
		eval.Rho = d.Rho
	}
	if d.Delta != 0 {
		eval.Delta = d.Delta
	}
	eval = eval.WithDefaults()
	s := &server{d: d, eval: eval, th: analyzer.Thresholds{Rho: eval.Rho, Delta: eval.Delta, K: eval.K}, log: d.Log, now: d.Now}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.pages = mustParsePages()

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.pageOverview)
	mux.HandleFunc("GET /capability", s.pageCapability)
	mux.HandleFunc("GET /triggers", s.pageTriggers)
	mux.HandleFunc("GET /trends", s.pageTrends)
	mux.HandleFunc("GET /environments", s.pageEnvironments)
	mux.HandleFunc("GET /environment", s.pageEnvironment)
	mux.HandleFunc("GET /training", s.pageTraining)
	mux.HandleFunc("GET /loop", s.pageLoop)
	mux.HandleFunc("GET /api/loop", s.apiLoop)
	mux.HandleFunc("GET /api/{$}", s.apiIndex)
	mux.HandleFunc("GET /api/overview", apiHandler(s, parseOverview, (*server).overview))
	mux.HandleFunc("GET /api/capability", apiHandler(s, parseCapability, (*server).capability))
	mux.HandleFunc("GET /api/triggers", apiHandler(s, parseTriggers, (*server).triggers))
	mux.HandleFunc("GET /api/trends", apiHandler(s, parseTrends, (*server).trends))
	mux.HandleFunc("GET /api/environments", s.apiEnvironments)
	mux.HandleFunc("GET /api/environments/{id}", s.apiEnvironment)
	mux.HandleFunc("GET /api/environments/{id}/program", s.apiProgram)
	mux.HandleFunc("GET /api/training", s.apiTraining)
	mux.HandleFunc("/api/", s.apiUnknown)
	assets, _ := fs.Sub(files, "assets")
	static := http.StripPrefix("/assets/", http.FileServer(http.FS(assets)))
	mux.Handle("GET /assets/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		static.ServeHTTP(w, r)
	}))
	return nosniff(withDictMemo(mux))
}

// nosniff makes browsers take every answer as its Content-Type says. The
// dashboard serves text others wrote: a generated environment program
// (GET /api/environments/{id}/program, text/x-starlark), and programs,
// rollouts' messages and model answers inside JSON and pages. A browser
// that sniffed such text could render it as HTML or run it as a script
// (a <script src> of the program URL on another site's page).
func nosniff(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		h.ServeHTTP(w, r)
	})
}

func (s *server) thresholds() ThresholdsJSON {
	return ThresholdsJSON{Rho: s.eval.Rho, Delta: s.eval.Delta, K: s.eval.K, N: s.eval.N, MinFailures: s.eval.MinFailures,
		WindowHours: s.eval.Window.Hours(), WindowRollouts: s.eval.WindowRollouts}
}

// --- parameters -------------------------------------------------------------

type badRequest struct{ msg string }

func (e badRequest) Error() string { return e.msg }

type params struct {
	q   url.Values
	err error
}

func (p *params) str(name string) string { return strings.TrimSpace(p.q.Get(name)) }

// hours is the hours parameter: a count, or "all" (0: every rollout).
func (p *params) hours() int {
	if p.str("hours") == "all" {
		return 0
	}
	had := p.err
	h := p.intIn("hours", 168, 1, maxHours)
	if had == nil && p.err != nil {
		p.err = badRequest{fmt.Sprintf("parameter hours: want an integer in [1, %d] or all, got %q", maxHours, p.str("hours"))}
	}
	return h
}

func (p *params) intIn(name string, def, lo, hi int) int {
	v := p.str(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		if p.err == nil {
			p.err = badRequest{fmt.Sprintf("parameter %s: want an integer in [%d, %d], got %q", name, lo, hi, v)}
		}
		return def
	}
	return n
}

func (p *params) dict() uint32 {
	if p.str("dict") == "" {
		return 0
	}
	v := strings.TrimPrefix(strings.ToLower(p.str("dict")), "v")
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		if p.err == nil {
			p.err = badRequest{fmt.Sprintf("parameter dict: want a dictionary version number, got %q", p.str("dict"))}
		}
		return 0
	}
	return uint32(n)
}

// flag is a yes/no parameter: 1 or true, 0 or false, or absent (no).
func (p *params) flag(name string) bool {
	switch v := strings.ToLower(p.str(name)); v {
	case "1", "true":
		return true
	case "", "0", "false":
		return false
	default:
		if p.err == nil {
			p.err = badRequest{fmt.Sprintf("parameter %s: want 1 or 0 (true or false), got %q", name, v)}
		}
		return false
	}
}

func (p *params) bucket() string {
	switch v := p.str("bucket"); v {
	case "", bucketHour:
		return bucketHour
	case bucketDay:
		return bucketDay
	default:
		if p.err == nil {
			p.err = badRequest{fmt.Sprintf("parameter bucket: want hour or day, got %q", v)}
		}
		return bucketHour
	}
}

// time is a time parameter: Unix seconds or RFC 3339, within ClickHouse's
// DateTime (1970 to 2106), which it is bound as: a time outside would wrap
// around to another (milliseconds, as JavaScript gives them, to some other
// year).
func (p *params) time(name string) time.Time {
	v := p.str(name)
	if v == "" {
		return time.Time{}
	}
	var t time.Time
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		t = time.Unix(n, 0)
	} else if t, err = time.Parse(time.RFC3339, v); err != nil {
		if p.err == nil {
			p.err = badRequest{fmt.Sprintf("parameter %s: want Unix seconds or RFC 3339, got %q", name, v)}
		}
		return time.Time{}
	}
	if t.Unix() < 0 || t.Unix() > math.MaxUint32 {
		if p.err == nil {
			p.err = badRequest{fmt.Sprintf("parameter %s: want a time from 1970 to 2106 (Unix seconds, not milliseconds, or RFC 3339), got %q", name, v)}
		}
		return time.Time{}
	}
	return t
}

const maxHours = 24 * 92

// latestAt is the latest trends anchor whose week (and the day of time
// zones either side) ends inside ClickHouse's DateTime.
var latestAt = time.Unix(math.MaxUint32, 0).AddDate(0, 0, -8)

func parseOverview(r *http.Request) (overviewParams, error) {
	p := &params{q: r.URL.Query()}
	o := overviewParams{Env: p.str("env"), AgentVersion: p.str("agent_version"), Dict: p.dict(),
		Hours: p.hours(), Bucket: p.bucket(), Fresh: p.flag("fresh")}
	return o, p.err
}

func parseCapability(r *http.Request) (capabilityParams, error) {
	p := &params{q: r.URL.Query()}
	c := capabilityParams{Env: p.str("env"), AgentVersion: p.str("agent_version"), Dict: p.dict(), Name: p.str("name"),
		Examples: p.intIn("examples", 5, 0, 20), Hours: p.hours(), Bucket: p.bucket(), Fresh: p.flag("fresh")}
	if p.err == nil && (c.Env == "" || c.AgentVersion == "" || c.Name == "") {
		p.err = badRequest{"parameters env, agent_version and name are required (dict defaults to the newest labeled version)"}
	}
	return c, p.err
}

func parseTriggers(r *http.Request) (triggersParams, error) {
	p := &params{q: r.URL.Query()}
	t := triggersParams{Filter: TriggerFilter{Environment: p.str("env"), AgentVersion: p.str("agent_version"), Capability: p.str("capability")},
		Days: p.intIn("days", 30, 1, 3660), Limit: p.intIn("limit", 500, 1, 5000)}
	return t, p.err
}

func parseTrends(r *http.Request) (trendsParams, error) {
	p := &params{q: r.URL.Query()}
	t := trendsParams{Env: p.str("env"), Weeks: p.intIn("weeks", 8, 2, 104), Top: p.intIn("top", 5, 1, 10), At: p.time("at")}
	// The first week starts on the Monday weeks-1 weeks before at's: it
	// must not fall before 1970, where ClickHouse's Date wraps around.
	if earliest := time.Unix(0, 0).AddDate(0, 0, 7*t.Weeks+7); p.err == nil && !t.At.IsZero() && t.At.Before(earliest) {
		p.err = badRequest{fmt.Sprintf("parameter at: with weeks=%d, want a time from %s on, got %q", t.Weeks, earliest.UTC().Format(time.DateOnly), p.str("at"))}
	}
	// Its week ends on the next Monday: that must not pass 2106-02-07,
	// where ClickHouse's DateTime wraps around to 1970 (and the weeks
	// would read nothing).
	if p.err == nil && t.At.After(latestAt) {
		p.err = badRequest{fmt.Sprintf("parameter at: want a time up to %s, got %q", latestAt.UTC().Format(time.DateOnly), p.str("at"))}
	}
	return t, p.err
}

// --- JSON API -----------------------------------------------------------------

func (s *server) writeJSON(w http.ResponseWriter, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		s.log.Error("dashboard: encode json", "err", err)
		http.Error(w, `{"error":"encode response"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(buf.Bytes())
}

func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error, asJSON bool) {
	code := http.StatusInternalServerError
	var br badRequest
	switch {
	case errors.As(err, &br):
		code = http.StatusBadRequest
	case errors.Is(err, errNoStore), errors.Is(err, errNoEnvironments), errors.Is(err, errNoTraining):
		code = http.StatusServiceUnavailable
	case errors.As(err, new(notFound)):
		code = http.StatusNotFound
	case sink.LimitKind(err) == "timeout":
		// The server stopped the query at clickhouse.query_timeout (or the
		// request's deadline cancelled it there): a plain message, not the
		// driver's.
		code = http.StatusGatewayTimeout
		s.log.Warn("dashboard: query stopped at its time limit", "path", r.URL.Path, "err", err)
		err = errors.New("the query took longer than the dashboard's time limit (clickhouse.query_timeout) and was stopped on the server; choose a shorter range or try again")
	case sink.LimitKind(err) == "memory":
		code = http.StatusServiceUnavailable
		s.log.Warn("dashboard: query stopped at its memory limit", "path", r.URL.Path, "err", err)
		err = errors.New("the query needed more memory than the dashboard's limit (clickhouse.query_max_memory) and was stopped on the server; choose a shorter range or try again")
	case r.Context().Err() != nil:
		code = http.StatusServiceUnavailable
	default:
		s.log.Warn("dashboard: request failed", "path", r.URL.Path, "err", err)
	}
	if asJSON {
		WriteAPIError(w, code, err.Error())
		return
	}
	s.renderError(w, r, code, err)
}

// ctx bounds every request's queries.
func (s *server) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 30*time.Second)
}

func (s *server) apiIndex(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, map[string]any{
		"endpoints": map[string]string{
			"/api/overview":                  "?env=&agent_version=&dict=&hours=168|all&bucket=hour|day&fresh=0",
			"/api/capability":                "?env=&agent_version=&dict=&name=&examples=5&hours=168|all&bucket=hour|day&fresh=0",
			"/api/triggers":                  "?env=&agent_version=&capability=&days=30&limit=500",
			"/api/trends":                    "?env=&weeks=8&top=5&at=",
			"/api/environments":              "?status=&env=&agent_version=&limit=200",
			"/api/environments/{id}":         "the whole record of one environment",
			"/api/environments/{id}/program": "its program (text/x-starlark)",
			"/api/training":                  "?limit=100&adapters=100: training jobs with their reward curves, and the adapter registry (every active adapter and the newest others)",
			"/api/loop":                      "?hours=168|all&bucket=hour|day: the closed loop per capability and the routing share",
		},
	})
}

// apiUnknown answers what no endpoint of the API serves, in the API's
// error shape: another method than GET (405; the API only reads), or an
// unknown path (404).
func (s *server) apiUnknown(w http.ResponseWriter, r *http.Request) {
	code, msg := http.StatusNotFound, fmt.Sprintf("no endpoint %s: GET /api/ lists them", r.URL.Path)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		code, msg = http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed: the API answers GET only", r.Method)
	}
	WriteAPIError(w, code, msg)
}

// WriteAPIError answers a request to the API with its error shape,
// {"error": msg}, and status code (the serve role's bearer check answers
// /api/ requests without the token with it too).
func WriteAPIError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// fetch parses a request's parameters and loads its data; on failure it has
// written the error (as JSON for the API, as a page otherwise).
func fetch[P, R any](s *server, w http.ResponseWriter, r *http.Request, parse func(*http.Request) (P, error),
	load func(*server, context.Context, P) (R, error), asJSON bool) (P, R, bool) {
	var resp R
	p, err := parse(r)
	if err == nil && s.d.Store == nil {
		err = errNoStore
	}
	if err == nil {
		ctx, cancel := s.ctx(r)
		defer cancel()
		resp, err = load(s, ctx, p)
	}
	if err != nil {
		s.writeError(w, r, err, asJSON)
		return p, resp, false
	}
	return p, resp, true
}

// apiHandler serves one JSON endpoint.
func apiHandler[P, R any](s *server, parse func(*http.Request) (P, error), load func(*server, context.Context, P) (R, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, resp, ok := fetch(s, w, r, parse, load, true); ok {
			s.writeJSON(w, resp)
		}
	}
}
