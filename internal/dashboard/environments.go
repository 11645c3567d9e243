package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
)

// The Environments pages: what the synthesize role made of each synthesis
// request (TRACE step 2).
//
//	/environments                 every environment: status, attempts, tools, calibration
//	/environment?id=              one: the request, every attempt, the calibration histogram, the program
//	/api/environments             ?status=&env=&agent_version=&limit=200
//	/api/environments/{id}        the whole record
//	/api/environments/{id}/program  the program text (the fetch path of environment_ready.v1)

// EnvironmentStore is what the Environments pages read
// (synthesizer.SinkStore implements it over sink.Store). A row that does
// not decode is listed apart, and shown as unreadable.
type EnvironmentStore interface {
	ListReadable(ctx context.Context, f sink.EnvironmentFilter) ([]*synthesizer.Environment, []synthesizer.UnreadableRow, error)
	// StatusCounts counts every environment matching f by status (f.Limit
	// does not apply), each in its newest version as List has it.
	StatusCounts(ctx context.Context, f sink.EnvironmentFilter) (map[string]int, error)
	LoadEnvironment(ctx context.Context, id string) (*synthesizer.Environment, error)
}

var errNoEnvironments = errors.New("dashboard: no environment store configured")

type environmentsParams struct {
	Filter sink.EnvironmentFilter
}

func parseEnvironments(r *http.Request) (environmentsParams, error) {
	p := &params{q: r.URL.Query()}
	f := sink.EnvironmentFilter{Status: strings.ToUpper(p.str("status")), Environment: p.str("env"), AgentVersion: p.str("agent_version"),
		Limit: p.intIn("limit", 200, 1, 5000)}
	if f.Status != "" && p.err == nil {
		ok := false
		for _, s := range synthesizer.Statuses {
			ok = ok || string(s) == f.Status
		}
		if !ok {
			p.err = badRequest{fmt.Sprintf("parameter status: want one of %v, got %q", synthesizer.Statuses, f.Status)}
		}
	}
	return environmentsParams{Filter: f}, p.err
}

// EnvironmentsResponse is /api/environments.
type EnvironmentsResponse struct {
	Environments []EnvironmentRow `json:"environments"`
	// Counts and Total are of every environment matching the filters, not
	// only the ones listed (at most limit).
	Counts map[string]int `json:"counts"` // by status
	Total  int            `json:"total"`
	// Unreadable are the rows that do not decode (written by another
	// version, or damaged), left out of environments (counts has them
	// under their status).
	Unreadable []synthesizer.UnreadableRow `json:"unreadable"`
}

// EnvironmentRow is one environment of the list.
type EnvironmentRow struct {
	ID           string             `json:"id"`
	Environment  string             `json:"environment"`
	AgentVersion string             `json:"agent_version"`
	Capability   string             `json:"capability"`
	Status       string             `json:"status"`
	Reason       string             `json:"reason,omitempty"`
	Attempts     int                `json:"attempts"`
	Family       string             `json:"family,omitempty"`
	Tools        []string           `json:"tools"`
	MeanReward   *float64           `json:"mean_reward,omitempty"`
	SuccessRate  *float64           `json:"success_rate,omitempty"`
	PassAtK      map[string]float64 `json:"pass_at_k,omitempty"`
	PassAt       []passAt           `json:"-"` // PassAtK by k, for the page (a map ranges @1, @16, @4)
	Simulated    bool               `json:"simulated"`
	// Progress is the calibration's: the running one's while the status
	// is CALIBRATING, else the last one's as it ended. ProgressText is the
	// running one's "400/1600 (25 %)", for the page.
	Progress     *synthesizer.CalibrationProgress `json:"calibration_progress,omitempty"`
	ProgressText string                           `json:"-"`
	CreatedAt    string                           `json:"created_at"`
	UpdatedAt    string                           `json:"updated_at"`
}

func (s *server) environments(ctx context.Context, p environmentsParams) (EnvironmentsResponse, error) {
	if s.d.Environments == nil {
		return EnvironmentsResponse{}, errNoEnvironments
	}
	es, bad, err := s.d.Environments.ListReadable(ctx, p.Filter)
	if err != nil {
		return EnvironmentsResponse{}, err
	}
	counts, err := s.d.Environments.StatusCounts(ctx, p.Filter)
	if err != nil {
		return EnvironmentsResponse{}, err
	}
	out := EnvironmentsResponse{Environments: []EnvironmentRow{}, Counts: counts, Unreadable: bad}
	if out.Unreadable == nil {
		out.Unreadable = []synthesizer.UnreadableRow{}
	}
	for _, n := range counts {
		out.Total += n
	}
	for _, e := range es {
		row := EnvironmentRow{ID: e.ID, Environment: e.Environment, AgentVersion: e.AgentVersion, Capability: e.Capability,
			Status: string(e.Status), Reason: e.Reason, Attempts: e.Attempt, Family: e.Family, Tools: e.Tools,
			Progress: e.Progress, CreatedAt: fmtTS(e.CreatedAt), UpdatedAt: fmtTS(e.UpdatedAt)}
		if p := e.CalibratingProgress(); p != nil {
			row.ProgressText = p.Text()
		}
		if row.Tools == nil {
			row.Tools = []string{}
		}
		if c := e.Calibration; c != nil && e.Status == synthesizer.StatusDone {
			row.MeanReward, row.SuccessRate, row.PassAtK, row.Simulated = &c.MeanReward, &c.SuccessRate, c.PassAtK, c.Simulated
			for _, k := range c.PassAtKeys() {
				row.PassAt = append(row.PassAt, passAt{K: k, Rate: c.PassAtK[k]})
			}
		}
		out.Environments = append(out.Environments, row)
	}
	return out, nil
}

func (s *server) environment(ctx context.Context, id string) (*synthesizer.Environment, error) {
	if s.d.Environments == nil {
		return nil, errNoEnvironments
	}
	if id == "" {
		return nil, badRequest{"parameter id is required (an environment id, see /environments)"}
	}
	e, err := s.d.Environments.LoadEnvironment(ctx, id)
	if err != nil {
		return nil, err
	}
	if e == nil {
		return nil, notFound{fmt.Sprintf("no environment %q", id)}
	}
	return e, nil
}

type notFound struct{ msg string }

func (e notFound) Error() string { return e.msg }

// --- pages ------------------------------------------------------------------

type environmentsPage struct {
	base
	EnvironmentsResponse
	Filter      sink.EnvironmentFilter
	StatusLinks []rangeLink
	Limit       string // as asked ("": the default), kept by the filter form
}

func (s *server) pageEnvironments(w http.ResponseWriter, r *http.Request) {
	p, resp, ok := fetchEnv(s, w, r, parseEnvironments, (*server).environments, false)
	if !ok {
		return
	}
	pg := environmentsPage{base: s.base(r, "Environments", "environments"), EnvironmentsResponse: resp, Filter: p.Filter}
	pg.Limit = strings.TrimSpace(r.URL.Query().Get("limit"))
	others := []string{"env", "agent_version", "limit"} // what a status link keeps
	pg.StatusLinks = append(pg.StatusLinks, rangeLink{Label: "all", Active: p.Filter.Status == "",
		Href: href(pg.Tok, "/environments", keep(r, others)...)})
	for _, st := range synthesizer.Statuses {
		pg.StatusLinks = append(pg.StatusLinks, rangeLink{Label: string(st), Active: p.Filter.Status == string(st),
			Href: href(pg.Tok, "/environments", keep(r, others, "status", string(st))...)})
	}
	s.render(w, r, "environments", pg)
}

type environmentPage struct {
	base
	E         *synthesizer.Environment
	Histogram template.HTML
	Attempts  []attemptRow
	PassAtK   []passAt
	Request   string
	CapHref   string
}

type attemptRow struct {
	synthesizer.Attempt
	Duration   string
	Checks     []synthesizer.Check
	Histogram  template.HTML
	KnobsText  string
	Verdict    string
	Calibrated bool
}

type passAt struct {
	K    string
	Rate float64
}

func (s *server) pageEnvironment(w http.ResponseWriter, r *http.Request) {
	if s.d.Environments == nil {
		s.writeError(w, r, errNoEnvironments, false)
		return
	}
	ctx, cancel := s.ctx(r)
	defer cancel()
	e, err := s.environment(ctx, strings.TrimSpace(r.URL.Query().Get("id")))
	if err != nil {
		s.writeError(w, r, err, false)
		return
	}
	pg := environmentPage{base: s.base(r, "Environment "+e.ID, "environments"), E: e}
	pg.CapHref = href(pg.Tok, "/capability", "env", e.Environment, "agent_version", e.AgentVersion, "dict", e.DictionaryVersion, "name", e.Capability)
	if e.Request != nil {
		if b, err := json.Marshal(e.Request); err == nil {
			pg.Request = prettyJSON(b)
		}
	}
	if c := e.Calibration; c != nil {
		pg.Histogram = histogramChart{ID: "chart-calibration", Title: "Reward histogram of the accepted calibration", Counts: c.Histogram, Simulated: c.Simulated}.render()
		for _, k := range c.PassAtKeys() {
			pg.PassAtK = append(pg.PassAtK, passAt{K: k, Rate: c.PassAtK[k]})
		}
	}
	for _, a := range e.Attempts {
		row := attemptRow{Attempt: a, Duration: a.EndedAt.Sub(a.StartedAt).Round(time.Millisecond).String(), KnobsText: string(a.Knobs), Verdict: "failed at " + a.Stage}
		if a.Accepted {
			row.Verdict = "accepted"
		}
		if a.Validation != nil {
			row.Checks = a.Validation.Checks
		}
		if c := a.Calibration; c != nil && len(c.Histogram) > 0 {
			row.Calibrated = true
			row.Histogram = histogramChart{ID: fmt.Sprintf("chart-attempt-%d", a.N), Title: fmt.Sprintf("Reward histogram of attempt %d", a.N),
				Counts: c.Histogram, Simulated: c.Simulated, W: 520, H: 160}.render()
		}
		pg.Attempts = append(pg.Attempts, row)
	}
	s.render(w, r, "environment", pg)
}

// fetchEnv is fetch for the environment pages, which need the environment
// store rather than the window store.
func fetchEnv[P, R any](s *server, w http.ResponseWriter, r *http.Request, parse func(*http.Request) (P, error),
	load func(*server, context.Context, P) (R, error), asJSON bool) (P, R, bool) {
	var resp R
	p, err := parse(r)
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

// --- API --------------------------------------------------------------------

func (s *server) apiEnvironments(w http.ResponseWriter, r *http.Request) {
	if _, resp, ok := fetchEnv(s, w, r, parseEnvironments, (*server).environments, true); ok {
		s.writeJSON(w, resp)
	}
}

func (s *server) apiEnvironment(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	e, err := s.environment(ctx, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err, true)
		return
	}
	s.writeJSON(w, e)
}

// apiProgram serves an environment's program text: the fetch path of
// environment_ready.v1 (a trainer downloads the program from here).
func (s *server) apiProgram(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	e, err := s.environment(ctx, r.PathValue("id"))
	if err == nil && e.Program == "" {
		err = notFound{fmt.Sprintf("environment %s has no program yet (status %s)", e.ID, e.Status)}
	}
	if err != nil {
		s.writeError(w, r, err, true)
		return
	}
	w.Header().Set("Content-Type", "text/x-starlark; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Trace-Program-Sha256", e.ProgramHash)
	w.Header().Set("X-Trace-Environment-Status", string(e.Status))
	w.Write([]byte(e.Program))
}

// --- the histogram ------------------------------------------------------------

// histogramChart draws a calibration's reward histogram: one bar per bin of
// [0, 1], the count on the y axis.
type histogramChart struct {
	ID, Title string
	W, H      int
	Counts    []int
	Simulated bool
}

func (c histogramChart) render() template.HTML {
	if c.W == 0 {
		c.W = 760
	}
	if c.H == 0 {
		c.H = 240
	}
	const left, right, top, bottom = 52, 16, 18, 40
	n := max(len(c.Counts), 1)
	total, peak := 0, 0
	for _, v := range c.Counts {
		total += v
		peak = max(peak, v)
	}
	ticks := niceTicks(0, float64(max(peak, 1)), 4)
	ymax := math.Max(float64(peak), ticks[len(ticks)-1])
	pw, ph := float64(c.W-left-right), float64(c.H-top-bottom)
	y := func(v float64) float64 { return float64(top) + ph*(1-v/ymax) }
	bw := pw / float64(n)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart histogram" id="%s" viewBox="0 0 %d %d" width="100%%" role="img" aria-label="%s">`, esc(c.ID), c.W, c.H, esc(c.Title))
	for _, t := range ticks {
		fmt.Fprintf(&b, `<line class="grid" x1="%d" x2="%.1f" y1="%.1f" y2="%.1f"/>`, left, float64(left)+pw, y(t), y(t))
		fmt.Fprintf(&b, `<text class="tick" x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`, left-6, y(t), esc(fmtTick(t, false)))
	}
	for i, v := range c.Counts {
		lo, hi := float64(i)/float64(n), float64(i+1)/float64(n)
		closer := ")"
		if i == n-1 {
			closer = "]"
		}
		x0 := float64(left) + bw*float64(i)
		share := float64(v) / float64(max(total, 1))
		fmt.Fprintf(&b, `<rect class="bar" data-bin="%d" data-count="%d" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>reward [%.1f, %.1f%s: %d rollouts (%.1f%%)</title></rect>`,
			i, v, x0+1, y(float64(v)), math.Max(bw-2, 1), float64(top)+ph-y(float64(v)), colorAt(0), lo, hi, closer, v, share*100)
		fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%.1f" text-anchor="middle">%.1f</text>`, x0, float64(top)+ph+14, lo)
	}
	fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%.1f" text-anchor="middle">1.0</text>`, float64(left)+pw, float64(top)+ph+14)
	fmt.Fprintf(&b, `<line class="axis-line" x1="%d" x2="%.1f" y1="%.1f" y2="%.1f"/>`, left, float64(left)+pw, float64(top)+ph, float64(top)+ph)
	label := fmt.Sprintf("reward (%d rollouts)", total)
	if c.Simulated {
		label += " · SIMULATED policy"
	}
	fmt.Fprintf(&b, `<text class="axis-label" x="%.1f" y="%d" text-anchor="middle">%s</text>`, float64(left)+pw/2, c.H-4, esc(label))
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // every text node is escaped above
}
