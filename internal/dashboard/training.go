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

	"github.com/traceops/trace/sink"
)

// The Training page: the adapt role's training jobs (TRACE step 3), the
// reward curve each trainer reported, and the adapter registry.
//
//	/training       jobs with status, a reward curve per job, adapters with status
//	/api/training   the same as JSON (?limit=100 jobs, newest first;
//	                ?adapters=100: every active adapter and the newest others;
//	                the counts by status and the totals are of every job and
//	                adapter)

// TrainingStore is what the Training page reads (sink.Store implements
// it; the SQL is in sink/training.go and sink/training_curves.go).
type TrainingStore interface {
	TrainingJobs(ctx context.Context, f sink.TrainingJobFilter) ([]sink.TrainingJobRow, error)
	TrainingJobStatusCounts(ctx context.Context, f sink.TrainingJobFilter) (map[string]int, error)
	TrainingCurves(ctx context.Context, limit int) (map[string][]sink.CurvePoint, error)
	Adapters(ctx context.Context, f sink.AdapterFilter) ([]sink.AdapterRow, error)
	AdapterStatusCounts(ctx context.Context, f sink.AdapterFilter) (map[string]int, error)
}

var errNoTraining = errors.New("dashboard: no training store configured")

// trainingParams: Limit jobs (the newest), and every active adapter with
// the Adapters newest others (an adapter is active for one capability of
// a cohort at a time: few; the others grow with every job).
type trainingParams struct{ Limit, Adapters int }

func parseTraining(r *http.Request) (trainingParams, error) {
	p := &params{q: r.URL.Query()}
	return trainingParams{Limit: p.intIn("limit", 100, 1, 1000), Adapters: p.intIn("adapters", 100, 1, 1000)}, p.err
}

// adapterActive is the status of an adapter the router serves.
const adapterActive = "active"

// TrainingResponse is /api/training.
type TrainingResponse struct {
	Jobs     []TrainingJob     `json:"jobs"`
	Adapters []TrainingAdapter `json:"adapters"`
	// Counts and Total are of every job, not only the ones listed (at most
	// limit).
	Counts map[string]int `json:"counts"` // jobs by status
	Total  int            `json:"total"`
	// AdapterCounts and AdapterTotal are of every adapter, not only the
	// ones listed.
	AdapterCounts map[string]int `json:"adapter_counts"` // adapters by status
	AdapterTotal  int            `json:"adapter_total"`
}

// TrainingJob is one job with its reward curve.
type TrainingJob struct {
	JobID         string            `json:"job_id"`
	EnvironmentID string            `json:"environment_id"`
	Environment   string            `json:"environment"`
	AgentVersion  string            `json:"agent_version"`
	Capability    string            `json:"capability"`
	BaseModel     string            `json:"base_model"`
	Backend       string            `json:"backend"`
	Status        string            `json:"status"`
	Reason        string            `json:"reason,omitempty"`
	Iteration     int               `json:"iteration"`
	Iterations    int               `json:"iterations"`
	MeanReward    float64           `json:"mean_reward"` // the last progress event's
	AdapterName   string            `json:"adapter_name"`
	Simulated     bool              `json:"simulated"`
	PlanSource    string            `json:"plan_source,omitempty"`
	Curve         []sink.CurvePoint `json:"curve"`
	DispatchedAt  string            `json:"dispatched_at"`
	UpdatedAt     string            `json:"updated_at"`
	// Adapter is the job's registered adapter (nil: none).
	Adapter *TrainingAdapter `json:"adapter,omitempty"`
	// Unreadable names the JSON columns that do not decode (written by
	// another version, or damaged) with the decoder's error; what they
	// hold (PlanSource) is left empty.
	Unreadable map[string]string `json:"unreadable,omitempty"`
}

// TrainingAdapter is one adapter of the registry.
type TrainingAdapter struct {
	Name            string  `json:"name"`
	JobID           string  `json:"job_id"`
	Capability      string  `json:"capability"`
	Environment     string  `json:"environment"`
	AgentVersion    string  `json:"agent_version"`
	BaseModel       string  `json:"base_model"`
	URI             string  `json:"uri"`
	Status          string  `json:"status"`
	EvalMeanReward  float64 `json:"eval_mean_reward"`
	EvalSuccessRate float64 `json:"eval_success_rate"`
	Simulated       bool    `json:"simulated"`
	Trainer         string  `json:"trainer,omitempty"` // from the registry's metadata
	CreatedAt       string  `json:"created_at"`
	UpdatedAt       string  `json:"updated_at"`
	// Unreadable is as TrainingJob's (metadata: Trainer left empty).
	Unreadable map[string]string `json:"unreadable,omitempty"`
}

func (s *server) training(ctx context.Context, p trainingParams) (TrainingResponse, error) {
	if s.d.Training == nil {
		return TrainingResponse{}, errNoTraining
	}
	jobs, err := s.d.Training.TrainingJobs(ctx, sink.TrainingJobFilter{Limit: p.Limit})
	if err != nil {
		return TrainingResponse{}, err
	}
	curves, err := s.d.Training.TrainingCurves(ctx, p.Limit)
	if err != nil {
		return TrainingResponse{}, err
	}
	ads, err := s.d.Training.Adapters(ctx, sink.AdapterFilter{Status: adapterActive})
	if err != nil {
		return TrainingResponse{}, err
	}
	others, err := s.d.Training.Adapters(ctx, sink.AdapterFilter{NotStatus: adapterActive, Limit: p.Adapters})
	if err != nil {
		return TrainingResponse{}, err
	}
	ads = append(ads, others...)
	// The listed jobs' adapters, listed or not.
	var jobAds []sink.AdapterRow
	if len(jobs) > 0 {
		ids := make([]string, len(jobs))
		for i, j := range jobs {
			ids[i] = j.JobID
		}
		if jobAds, err = s.d.Training.Adapters(ctx, sink.AdapterFilter{JobIDs: ids}); err != nil {
			return TrainingResponse{}, err
		}
	}
	counts, err := s.d.Training.TrainingJobStatusCounts(ctx, sink.TrainingJobFilter{})
	if err != nil {
		return TrainingResponse{}, err
	}
	adCounts, err := s.d.Training.AdapterStatusCounts(ctx, sink.AdapterFilter{})
	if err != nil {
		return TrainingResponse{}, err
	}
	out := TrainingResponse{Jobs: []TrainingJob{}, Adapters: []TrainingAdapter{}, Counts: counts, AdapterCounts: adCounts}
	for _, n := range counts {
		out.Total += n
	}
	for _, n := range adCounts {
		out.AdapterTotal += n
	}
	// A job's adapter is the one it names, else the newest registered to
	// it (sink.PickJobAdapters, as trace train list shows it).
	byJob := map[string]*TrainingAdapter{}
	for id, a := range sink.PickJobAdapters(jobs, jobAds) {
		ta := s.trainingAdapter(a)
		byJob[id] = &ta
	}
	for _, j := range jobs {
		var planner struct {
			Source string `json:"source"`
		}
		bad := s.decodeColumn(j.Planner, &planner, "planner", "job_id", j.JobID, j.Version)
		row := TrainingJob{JobID: j.JobID, EnvironmentID: j.EnvironmentID, Environment: j.Environment, AgentVersion: j.AgentVersion,
			Capability: j.Capability, BaseModel: j.BaseModel, Backend: j.Backend, Status: j.Status, Reason: j.Reason,
			Iteration: int(j.Iteration), Iterations: int(j.Iterations), MeanReward: j.MeanReward, AdapterName: j.AdapterName,
			Simulated: j.Simulated, PlanSource: planner.Source, Curve: curves[j.JobID],
			DispatchedAt: fmtTS(j.DispatchedAt), UpdatedAt: fmtTS(j.UpdatedAt), Adapter: byJob[j.JobID], Unreadable: bad}
		if row.Curve == nil {
			row.Curve = []sink.CurvePoint{}
		}
		out.Jobs = append(out.Jobs, row)
	}
	for _, a := range ads {
		out.Adapters = append(out.Adapters, s.trainingAdapter(a))
	}
	return out, nil
}

func (s *server) trainingAdapter(a sink.AdapterRow) TrainingAdapter {
	var meta struct {
		Trainer string `json:"trainer"`
	}
	bad := s.decodeColumn(a.Metadata, &meta, "metadata", "adapter", a.Name, a.Version)
	return TrainingAdapter{Name: a.Name, JobID: a.JobID, Capability: a.Capability, Environment: a.Environment,
		AgentVersion: a.AgentVersion, BaseModel: a.BaseModel, URI: a.URI, Status: a.Status, EvalMeanReward: a.EvalMeanReward,
		EvalSuccessRate: a.EvalSuccessRate, Simulated: a.Simulated, Trainer: meta.Trainer, CreatedAt: fmtTS(a.CreatedAt), UpdatedAt: fmtTS(a.UpdatedAt),
		Unreadable: bad}
}

// decodeColumn decodes a row's JSON column into v. One that does not
// decode (written by another version, or damaged) leaves v as it was and
// is returned as {column: error}, to be shown as unreadable, and logged as
// a warning naming the row once per row version (the page is read again
// and again); an empty column is no column.
func (s *server) decodeColumn(raw string, v any, column, kind, id string, version uint64) map[string]string {
	if raw == "" {
		return nil
	}
	err := json.Unmarshal([]byte(raw), v)
	if err == nil {
		return nil
	}
	if s.warned.first(fmt.Sprintf("%s %s@%d %s", kind, id, version, column)) {
		s.log.Warn("dashboard: a JSON column does not decode; shown as unreadable", kind, id, "version", version, "column", column, "err", err)
	}
	return map[string]string{column: err.Error()}
}

// --- the page -----------------------------------------------------------------

type trainingPage struct {
	base
	TrainingResponse
	Rows []trainingRow
}

type trainingRow struct {
	TrainingJob
	Chart template.HTML
}

func (s *server) pageTraining(w http.ResponseWriter, r *http.Request) {
	_, resp, ok := fetchEnv(s, w, r, parseTraining, (*server).training, false)
	if !ok {
		return
	}
	pg := trainingPage{base: s.base(r, "Training", "training"), TrainingResponse: resp}
	for i, j := range resp.Jobs {
		pg.Rows = append(pg.Rows, trainingRow{TrainingJob: j,
			Chart: curveChart{ID: fmt.Sprintf("chart-curve-%d", i), JobID: j.JobID, Title: "Reward curve of " + j.JobID,
				Iterations: j.Iterations, Points: j.Curve, Simulated: j.Simulated}.render()})
	}
	s.render(w, r, "training", pg)
}

func (s *server) apiTraining(w http.ResponseWriter, r *http.Request) {
	if _, resp, ok := fetchEnv(s, w, r, parseTraining, (*server).training, true); ok {
		s.writeJSON(w, resp)
	}
}

// --- the reward curve -----------------------------------------------------------

// curveChart draws a job's reward curve: the mean reward per iteration
// (x: iteration 1…planned, y: reward in [0, 1]), a band of ± one reward std
// and a <circle class="pt"> per iteration with its figures as tooltip.
type curveChart struct {
	ID, JobID, Title string
	W, H             int
	Iterations       int // planned (the x axis' end)
	Points           []sink.CurvePoint
	Simulated        bool
}

func (c curveChart) render() template.HTML {
	if c.W == 0 {
		c.W = 560
	}
	if c.H == 0 {
		c.H = 200
	}
	const left, right, top, bottom = 40, 12, 10, 34
	xmax := max(c.Iterations, 1)
	for _, p := range c.Points {
		xmax = max(xmax, int(p.Iteration))
	}
	pw, ph := float64(c.W-left-right), float64(c.H-top-bottom)
	x := func(it int32) float64 {
		if xmax <= 1 {
			return float64(left) + pw/2
		}
		return float64(left) + pw*float64(it-1)/float64(xmax-1)
	}
	y := func(v float64) float64 { return float64(top) + ph*(1-math.Max(0, math.Min(1, v))) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart curve" id="%s" data-job="%s" data-points="%d" viewBox="0 0 %d %d" width="100%%" role="img" aria-label="%s">`,
		esc(c.ID), esc(c.JobID), len(c.Points), c.W, c.H, esc(c.Title))
	for _, t := range []float64{0, 0.25, 0.5, 0.75, 1} {
		fmt.Fprintf(&b, `<line class="grid" x1="%d" x2="%.1f" y1="%.1f" y2="%.1f"/>`, left, float64(left)+pw, y(t), y(t))
		fmt.Fprintf(&b, `<text class="tick" x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`, left-6, y(t), esc(fmtTick(t, false)))
	}
	fmt.Fprintf(&b, `<line class="axis-line" x1="%d" x2="%.1f" y1="%.1f" y2="%.1f"/>`, left, float64(left)+pw, float64(top)+ph, float64(top)+ph)
	for _, t := range niceTicks(1, float64(xmax), 5) {
		if t < 1 || t > float64(xmax) || t != math.Trunc(t) {
			continue
		}
		fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%.1f" text-anchor="middle">%d</text>`, x(int32(t)), float64(top)+ph+14, int(t))
	}
	label := "iteration"
	if c.Simulated {
		label += " · SIMULATED trainer (no model trained)"
	}
	fmt.Fprintf(&b, `<text class="axis-label" x="%.1f" y="%d" text-anchor="middle">%s</text>`, float64(left)+pw/2, c.H-4, esc(label))
	if len(c.Points) == 0 {
		fmt.Fprintf(&b, `<text class="empty-note" x="%.1f" y="%.1f" text-anchor="middle">no progress reported yet</text>`, float64(left)+pw/2, float64(top)+ph/2)
		b.WriteString(`</svg>`)
		return template.HTML(b.String()) //nolint:gosec // every text node is escaped above
	}
	col := colorAt(0)
	var upper, lower []string
	for _, p := range c.Points {
		upper = append(upper, fmt.Sprintf("%.1f,%.1f", x(p.Iteration), y(p.MeanReward+p.RewardStd)))
		lower = append([]string{fmt.Sprintf("%.1f,%.1f", x(p.Iteration), y(p.MeanReward-p.RewardStd))}, lower...)
	}
	fmt.Fprintf(&b, `<polygon class="band" points="%s" fill="%s" fill-opacity="0.15" stroke="none"/>`, strings.Join(append(upper, lower...), " "), col)
	var d strings.Builder
	for i, p := range c.Points {
		cmd := "L"
		if i == 0 {
			cmd = "M"
		}
		fmt.Fprintf(&d, "%s%.1f %.1f ", cmd, x(p.Iteration), y(p.MeanReward))
	}
	fmt.Fprintf(&b, `<path class="series" d="%s" fill="none" stroke="%s" stroke-width="2"/>`, strings.TrimSpace(d.String()), col)
	for _, p := range c.Points {
		tip := fmt.Sprintf("iteration %d: mean reward %.3f ± %.3f", p.Iteration, p.MeanReward, p.RewardStd)
		if p.HasKL {
			tip += fmt.Sprintf(", KL %.4f", p.KL)
		}
		fmt.Fprintf(&b, `<circle class="pt" cx="%.1f" cy="%.1f" r="2.5" fill="%s" data-iteration="%d" data-reward="%.4f"><title>%s</title></circle>`,
			x(p.Iteration), y(p.MeanReward), col, p.Iteration, p.MeanReward, esc(tip))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // every text node is escaped above
}
