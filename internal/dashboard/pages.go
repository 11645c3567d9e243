package dashboard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/traceops/trace/verify"
)

type pageTemplate struct{ t *template.Template }

var pageNames = []string{"overview", "capability", "triggers", "trends", "environments", "environment", "training", "loop", "error"}

func mustParsePages() map[string]*pageTemplate {
	out := map[string]*pageTemplate{}
	for _, name := range pageNames {
		t := template.Must(template.New(name).Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/"+name+".html"))
		out[name] = &pageTemplate{t}
	}
	return out
}

var funcs = template.FuncMap{
	"href":       href,
	"pct":        func(f float64) string { return fmt.Sprintf("%.1f%%", f*100) },
	"f2":         func(f float64) string { return fmt.Sprintf("%.2f", f) },
	"f3":         func(f float64) string { return fmt.Sprintf("%.3f", f) },
	"count":      fmtCount,
	"signed":     func(f float64) string { return fmt.Sprintf("%+.3f", f) },
	"ts":         fmtTS,
	"day":        func(t time.Time) string { return t.UTC().Format("Mon Jan 2") },
	"ago":        ago,
	"join":       strings.Join,
	"pretty":     prettyJSON,
	"add":        func(a, b int) int { return a + b },
	"decision":   decisionLabel,
	"color":      func(kind string) string { return eventColors[kind] },
	"trend":      trendArrow,
	"guardLevel": func(c verify.Config) string { return verify.Pct(c.GuardLevel()) },
	"divf":       func(a, b int) float64 { return float64(a) / float64(max(b, 1)) },
	"deref":      func(k *CohortKey) CohortKey { return *k },
	"graderReasons": func(raw json.RawMessage) []string {
		var g struct {
			Reasons []string `json:"reasons"`
		}
		json.Unmarshal(raw, &g)
		return g.Reasons
	},
	"window": func(h float64) string { return fmtDuration(time.Duration(h * float64(time.Hour))) },
	"barw":   func(f float64) string { return fmt.Sprintf("%.1f%%", math.Max(0, math.Min(1, f))*100) },
}

// href builds a dashboard link; kv are name/value pairs, empty values are
// left out; the bearer token of the current page is kept.
func href(tok, path string, kv ...any) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		k := fmt.Sprint(kv[i])
		v := fmt.Sprint(kv[i+1])
		if v == "" || v == "0" && k == "dict" {
			continue
		}
		if k == "hours" && v == "0" { // Range.Hours 0: every rollout
			v = "all"
		}
		q.Set(k, v)
	}
	if tok != "" {
		q.Set("token", tok)
	}
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}

// fmtCount prints a count that is a mean over labeling runs: a whole number
// as an integer ("2369", as with one run), else with one decimal ("52.1").
func fmtCount(f float64) string {
	if r := math.Round(f); math.Abs(f-r) < 0.05 {
		return strconv.FormatFloat(r, 'f', 0, 64)
	}
	return strconv.FormatFloat(f, 'f', 1, 64)
}

func fmtTS(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "in the future"
	case d < time.Minute:
		return "just now"
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d/time.Hour))
	}
	return fmt.Sprintf("%d days ago", int(d/(24*time.Hour)))
}

func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}

func decisionLabel(d string) string {
	switch d {
	case DecisionSelected:
		return "selected"
	case DecisionNotSelected:
		return "not selected"
	}
	return "undecided"
}

func trendArrow(now, before float64) string {
	switch {
	case now > before+0.005:
		return "▲"
	case now < before-0.005:
		return "▼"
	}
	return "="
}

// base is what the layout needs.
type base struct {
	Title string
	Nav   string
	Tok   string
	Now   time.Time
}

func (s *server) base(r *http.Request, title, nav string) base {
	return base{Title: title, Nav: nav, Tok: r.URL.Query().Get("token"), Now: s.now().UTC()}
}

func (s *server) render(w http.ResponseWriter, r *http.Request, name string, data any) {
	var buf bytes.Buffer
	if err := s.pages[name].t.ExecuteTemplate(&buf, "layout", data); err != nil {
		s.log.Error("dashboard: render", "page", name, "err", err)
		http.Error(w, "render "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(buf.Bytes())
}

type errorPage struct {
	base
	Code    int
	Message string
}

func (s *server) renderError(w http.ResponseWriter, r *http.Request, code int, err error) {
	var buf bytes.Buffer
	data := errorPage{base: s.base(r, "Error", ""), Code: code, Message: err.Error()}
	if e := s.pages["error"].t.ExecuteTemplate(&buf, "layout", data); e != nil {
		http.Error(w, err.Error(), code)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

// bucketStep is a bucket's width and its name.
func bucketStep(bucket string) (time.Duration, string) {
	if bucket == bucketDay {
		return 24 * time.Hour, "day"
	}
	return time.Hour, "hour"
}

// keep are the request's parameters names as href's name/value pairs,
// followed by kv (which win): a link that changes some of a page's
// parameters keeps the others it was asked with (limit, the filters).
func keep(r *http.Request, names []string, kv ...any) []any {
	q := r.URL.Query()
	out := make([]any, 0, 2*len(names)+len(kv))
	for _, n := range names {
		out = append(out, n, strings.TrimSpace(q.Get(n)))
	}
	return append(out, kv...)
}

// rangeLinks are the time-range and bucket selectors of a page.
func rangeLinks(tok, path string, kv []any, rg Range) (ranges, buckets []rangeLink) {
	link := func(hours int, bucket string) string {
		var h any = hours
		if hours == 0 {
			h = "all"
		}
		return href(tok, path, append(append([]any(nil), kv...), "hours", h, "bucket", bucket)...)
	}
	for _, h := range []struct {
		l string
		h int
	}{{"24 h", 24}, {"3 days", 72}, {"7 days", 168}, {"14 days", 336}, {"30 days", 720}, {"all", 0}} {
		ranges = append(ranges, rangeLink{Label: h.l, Href: link(h.h, rg.Bucket), Active: h.h == rg.Hours})
	}
	buckets = []rangeLink{
		{Label: "hourly", Href: link(rg.Hours, bucketHour), Active: rg.Bucket == bucketHour},
		{Label: "daily", Href: link(rg.Hours, bucketDay), Active: rg.Bucket == bucketDay},
	}
	return ranges, buckets
}

type legendItem struct {
	Name, Color, Href string
}

type rangeLink struct {
	Label, Href string
	Active      bool
}

// --- overview -------------------------------------------------------------------

type overviewPage struct {
	base
	*OverviewResponse
	Summary                         *CohortSummary
	PassChart, CovChart, DeltaChart template.HTML
	PassLegend, CapLegend           []legendItem
	Ranges, Buckets                 []rangeLink
	Per                             string
	Selected                        int
}

func (s *server) pageOverview(w http.ResponseWriter, r *http.Request) {
	_, resp, ok := fetch(s, w, r, parseOverview, (*server).overview, false)
	if !ok {
		return
	}
	pg := overviewPage{base: s.base(r, "Overview", "overview"), OverviewResponse: resp}
	k := resp.Cohort
	var kv []any
	if k != nil {
		kv = []any{"env", k.Environment, "agent_version", k.AgentVersion, "dict", k.DictionaryVersion}
	}
	pg.Ranges, pg.Buckets = rangeLinks(pg.Tok, "/", kv, resp.Range)
	if k != nil {
		for i := range resp.Cohorts {
			if resp.Cohorts[i].CohortKey == *k {
				pg.Summary = &resp.Cohorts[i]
			}
		}
		step, per := bucketStep(resp.Range.Bucket)
		// Pass rate: every agent version of the environment, the shown one first.
		pass := lineChart{ID: "chart-pass-rate", Title: "Pass rate per " + per, YLabel: "pass rate", YMin: 0, YMax: 1, Percent: true,
			XMin: resp.Range.Since, XMax: resp.Range.Until, Step: step, H: 240, Empty: "no rollouts in this range"}
		sort.SliceStable(resp.PassRate, func(i, j int) bool {
			return resp.PassRate[i].AgentVersion == k.AgentVersion && resp.PassRate[j].AgentVersion != k.AgentVersion
		})
		for i, ps := range resp.PassRate {
			cs := chartSeries{Name: ps.AgentVersion, Color: colorAt(i)}
			for _, pt := range ps.Points {
				cs.Points = append(cs.Points, chartPoint{X: pt.Bucket, Y: pt.PassRate,
					Tip: fmt.Sprintf("%s %s: %.1f%% (%d of %d)", ps.AgentVersion, fmtTS(pt.Bucket), pt.PassRate*100, pt.Successes, pt.Rollouts)})
			}
			pass.Series = append(pass.Series, cs)
			pg.PassLegend = append(pg.PassLegend, legendItem{Name: ps.AgentVersion, Color: cs.Color,
				Href: href(pg.Tok, "/", "env", k.Environment, "agent_version", ps.AgentVersion, "hours", resp.Range.Hours, "bucket", resp.Range.Bucket)})
		}
		pg.PassChart = pass.render()
		if k.DictionaryVersion > 0 {
			pg.CovChart, pg.DeltaChart, pg.CapLegend = s.capCharts(pg.Tok, *k, resp.Capabilities, resp.Decision, resp.Range)
		}
	}
	if resp.Decision != nil {
		for _, c := range resp.Decision.Capabilities {
			if c.Decision == DecisionSelected {
				pg.Selected++
			}
		}
	}
	s.render(w, r, "overview", pg)
}

// capColors gives each capability a color by its place in the sorted
// names, so the same dictionary gets the same colors in every cohort.
func capColors(series []CapSeries, dec *Decision) map[string]string {
	var names []string
	seen := map[string]bool{}
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	if dec != nil {
		for _, c := range dec.Capabilities {
			add(c.Name)
		}
	}
	for _, cs := range series {
		add(cs.Capability)
	}
	sort.Strings(names)
	out := map[string]string{}
	for i, n := range names {
		out[n] = colorAt(i)
	}
	return out
}

func deltaMin(series []CapSeries) float64 {
	lo := 0.0
	for _, cs := range series {
		for _, p := range cs.Points {
			lo = math.Min(lo, p.MeanDelta)
		}
	}
	return math.Min(-0.2, math.Floor(lo/0.2)*0.2)
}

func (s *server) capCharts(tok string, k CohortKey, series []CapSeries, dec *Decision, rg Range) (cov, delta template.HTML, legend []legendItem) {
	colors := capColors(series, dec)
	step, per := bucketStep(rg.Bucket)
	covC := lineChart{ID: "chart-cov", Title: "Cov per capability per " + per, YLabel: "Cov = L− / |failed|", YMin: 0, YMax: 1,
		XMin: rg.Since, XMax: rg.Until, Step: step, W: 600, H: 280, Empty: "no labels in this range",
		HLines: []hline{{Y: s.eval.Rho, Label: fmt.Sprintf("ρ = %.2f", s.eval.Rho), Name: "rho"}}}
	deltaC := lineChart{ID: "chart-delta", Title: "Δ per capability per " + per, YLabel: "Δ = ER− − ER+", YMin: deltaMin(series), YMax: 1,
		XMin: rg.Since, XMax: rg.Until, Step: step, W: 600, H: 280, Empty: "no labels in this range",
		HLines: []hline{{Y: s.eval.Delta, Label: fmt.Sprintf("δ = %.2f", s.eval.Delta), Name: "delta"}}}
	for _, cs := range series {
		col := colors[cs.Capability]
		a := chartSeries{Name: cs.Capability, Color: col}
		b := chartSeries{Name: cs.Capability, Color: col}
		for _, p := range cs.Points {
			a.Points = append(a.Points, chartPoint{X: p.Bucket, Y: p.MeanCov,
				Tip: fmt.Sprintf("%s %s: Cov %.3f (%d runs, %d failed)", cs.Capability, fmtTS(p.Bucket), p.MeanCov, p.Runs, p.Failed)})
			b.Points = append(b.Points, chartPoint{X: p.Bucket, Y: p.MeanDelta,
				Tip: fmt.Sprintf("%s %s: Δ %+.3f (%d runs, %d failed, %d passed)", cs.Capability, fmtTS(p.Bucket), p.MeanDelta, p.Runs, p.Failed, p.Passed)})
		}
		covC.Series = append(covC.Series, a)
		deltaC.Series = append(deltaC.Series, b)
		legend = append(legend, legendItem{Name: cs.Capability, Color: col,
			Href: href(tok, "/capability", "env", k.Environment, "agent_version", k.AgentVersion, "dict", k.DictionaryVersion, "name", cs.Capability,
				"hours", rg.Hours, "bucket", rg.Bucket)})
	}
	return covC.render(), deltaC.render(), legend
}

// --- capability -----------------------------------------------------------------

type capabilityPage struct {
	base
	*CapabilityResponse
	CovChart, DeltaChart template.HTML
	Back                 string
	Ranges, Buckets      []rangeLink
	Per                  string
}

func (s *server) pageCapability(w http.ResponseWriter, r *http.Request) {
	p, resp, ok := fetch(s, w, r, parseCapability, (*server).capability, false)
	if !ok {
		return
	}
	pg := capabilityPage{base: s.base(r, p.Name, "overview"), CapabilityResponse: resp}
	k := resp.Cohort
	pg.Back = href(pg.Tok, "/", "env", k.Environment, "agent_version", k.AgentVersion, "dict", k.DictionaryVersion, "hours", resp.Range.Hours, "bucket", resp.Range.Bucket)
	pg.Ranges, pg.Buckets = rangeLinks(pg.Tok, "/capability",
		keep(r, []string{"examples"}, "env", k.Environment, "agent_version", k.AgentVersion, "dict", k.DictionaryVersion, "name", p.Name), resp.Range)
	_, pg.Per = bucketStep(resp.Range.Bucket)
	series := []CapSeries{{Capability: p.Name, Points: resp.Series}}
	if len(resp.Series) == 0 {
		series = nil
	}
	pg.CovChart, pg.DeltaChart, _ = s.capCharts(pg.Tok, k, series, nil, resp.Range)
	s.render(w, r, "capability", pg)
}

// --- triggers -------------------------------------------------------------------

type triggersPage struct {
	base
	*TriggersResponse
	Days     int
	Limit    string // as asked ("": the default), kept by the filter form
	DayLinks []rangeLink
	Timeline template.HTML
	Kinds    []legendItem
	Rows     []triggerRow
}

type triggerRow struct {
	TriggerEvent
	CapHref string
	Request *payloadSummary
	// Unreadable says why the payload's summary could not be read.
	Unreadable string
	Pretty     string
	Selected   bool
}

// summarizePayload reads a synthesis request's summary line (rank,
// example failures, tools) from a trigger's payload; an error says why a
// payload of another shape could not be read (its JSON is still shown).
func summarizePayload(payload json.RawMessage) (*payloadSummary, error) {
	var req struct {
		Rank       int `json:"rank"`
		Capability struct {
			Description string `json:"description"`
			Status      string `json:"status"`
		} `json:"capability"`
		Examples []string  `json:"example_failed_rollout_ids"`
		FiredAt  time.Time `json:"fired_at"`
		Tools    []struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(payload, &req); err != nil {
		return nil, err
	}
	ps := &payloadSummary{Rank: req.Rank, Examples: req.Examples, Status: req.Capability.Status, FiredAt: req.FiredAt, Desc: req.Capability.Description}
	for _, t := range req.Tools {
		ps.Tools = append(ps.Tools, t.Function.Name)
	}
	return ps, nil
}

type payloadSummary struct {
	Rank     int
	Tools    []string
	Examples []string
	Status   string
	FiredAt  time.Time
	Desc     string
}

func (s *server) pageTriggers(w http.ResponseWriter, r *http.Request) {
	p, resp, ok := fetch(s, w, r, parseTriggers, (*server).triggers, false)
	if !ok {
		return
	}
	pg := triggersPage{base: s.base(r, "Triggers", "triggers"), TriggersResponse: resp, Days: p.Days}
	pg.Limit = strings.TrimSpace(r.URL.Query().Get("limit"))
	for _, n := range []int{1, 7, 30, 90, 365} {
		pg.DayLinks = append(pg.DayLinks, rangeLink{Label: fmt.Sprintf("%d days", n), Active: n == p.Days,
			Href: href(pg.Tok, "/triggers", keep(r, []string{"env", "agent_version", "capability", "limit"}, "days", n)...)})
	}
	pg.DayLinks[0].Label = "24 h"
	for _, k := range []string{"fired", "deselected", "reselected", "rearmed"} {
		pg.Kinds = append(pg.Kinds, legendItem{Name: fmt.Sprintf("%s (%d)", k, resp.Counts[k]), Color: eventColors[k]})
	}
	rowIdx := map[timelineRow]int{}
	tl := timelineChart{ID: "chart-triggers", Title: "Trigger events over time", XMin: resp.Since, XMax: resp.GeneratedAt}
	for _, e := range resp.Events {
		lr := timelineRow{Label: e.Capability, Sub: fmt.Sprintf("%s/%s dict v%d", e.Environment, e.AgentVersion, e.DictionaryVersion)}
		i, ok := rowIdx[lr]
		if !ok {
			i = len(tl.Rows)
			rowIdx[lr] = i
			tl.Rows = append(tl.Rows, lr)
		}
		capHref := href(pg.Tok, "/capability", "env", e.Environment, "agent_version", e.AgentVersion, "dict", e.DictionaryVersion, "name", e.Capability)
		tl.Events = append(tl.Events, timelineEvent{Row: i, At: e.At, Kind: e.Event, Href: capHref,
			Tip: fmt.Sprintf("%s %s epoch %d at %s: Cov %.3f, Δ %+.3f, %d/%d runs", e.Capability, e.Event, e.Epoch, fmtTS(e.At), e.MeanCov, e.MeanDelta, e.RunsPassed, e.RunsTotal)})
		row := triggerRow{TriggerEvent: e, CapHref: capHref, Pretty: prettyJSON(e.Payload)}
		if len(e.Payload) > 0 {
			var err error
			if row.Request, err = summarizePayload(e.Payload); err != nil {
				row.Unreadable = err.Error()
			}
		}
		pg.Rows = append(pg.Rows, row)
	}
	if len(tl.Events) > 0 {
		pg.Timeline = tl.render()
	}
	s.render(w, r, "triggers", pg)
}

// --- trends ---------------------------------------------------------------------

type trendsPage struct {
	base
	*TrendsResponse
	PassChart  template.HTML
	PassLegend []legendItem
	EnvLinks   []rangeLink
	WeekLinks  []rangeLink
	Table      []trendWeek
	WoW        []wowBlock
}

type trendWeek struct {
	Week  time.Time
	Cells []trendCell
}

type trendCell struct {
	AgentVersion string
	Pass         *WeeklyPass
	Top          []CapWeek
}

type wowBlock struct {
	AgentVersion string
	Color        string
	Chart        template.HTML
	Rows         []WeekOverWeek
}

func (s *server) pageTrends(w http.ResponseWriter, r *http.Request) {
	p, resp, ok := fetch(s, w, r, parseTrends, (*server).trends, false)
	if !ok {
		return
	}
	pg := trendsPage{base: s.base(r, "Failure trends", "trends"), TrendsResponse: resp}
	for _, e := range resp.Environments {
		pg.EnvLinks = append(pg.EnvLinks, rangeLink{Label: e, Href: href(pg.Tok, "/trends", keep(r, []string{"top", "at"}, "env", e, "weeks", p.Weeks)...),
			Active: e == resp.Environment})
	}
	for _, n := range []int{4, 8, 12, 26} {
		pg.WeekLinks = append(pg.WeekLinks, rangeLink{Label: fmt.Sprintf("%d weeks", n),
			Href: href(pg.Tok, "/trends", keep(r, []string{"top", "at"}, "env", resp.Environment, "weeks", n)...), Active: n == p.Weeks})
	}
	if !resp.Empty {
		week := 7 * 24 * time.Hour
		xmin := resp.ThisWeek.Add(-time.Duration(p.Weeks-1) * week)
		chart := lineChart{ID: "chart-weekly-pass", Title: "Pass rate per week and agent version", YLabel: "pass rate", YMin: 0, YMax: 1, Percent: true,
			XMin: xmin.Add(-12 * time.Hour), XMax: resp.ThisWeek.Add(12 * time.Hour), Step: week, H: 250, Empty: "no rollouts in this range"}
		colors := map[string]string{}
		for i, av := range resp.AgentVersions {
			colors[av] = colorAt(i)
			cs := chartSeries{Name: av, Color: colors[av]}
			for _, wp := range resp.PassRate {
				if wp.AgentVersion == av {
					cs.Points = append(cs.Points, chartPoint{X: wp.Week, Y: wp.PassRate,
						Tip: fmt.Sprintf("%s week of %s: %.1f%% (%d of %d)", av, wp.Week.Format("Jan 2"), wp.PassRate*100, wp.Successes, wp.Rollouts)})
				}
			}
			chart.Series = append(chart.Series, cs)
			pg.PassLegend = append(pg.PassLegend, legendItem{Name: av, Color: colors[av],
				Href: href(pg.Tok, "/", "env", resp.Environment, "agent_version", av)})
		}
		pg.PassChart = chart.render()
		for i := len(resp.Weeks) - 1; i >= 0; i-- {
			wk := resp.Weeks[i]
			row := trendWeek{Week: wk}
			any := false
			for _, av := range resp.AgentVersions {
				c := trendCell{AgentVersion: av}
				for j := range resp.PassRate {
					if resp.PassRate[j].AgentVersion == av && resp.PassRate[j].Week.Equal(wk) {
						c.Pass = &resp.PassRate[j]
					}
				}
				for _, l := range resp.Lacking {
					if l.AgentVersion == av && l.Week.Equal(wk) {
						c.Top = l.Top
					}
				}
				any = any || c.Pass != nil || len(c.Top) > 0
				row.Cells = append(row.Cells, c)
			}
			if any {
				pg.Table = append(pg.Table, row)
			}
		}
		for _, av := range resp.AgentVersions {
			blk := wowBlock{AgentVersion: av, Color: colors[av]}
			bc := barChart{ID: "chart-wow-" + av, W: 590, Title: "Cov this week vs last week, " + av, Max: 1, Percent: true, XLabel: "Cov (share of failed rollouts labeled LACKING)",
				VLines: []hline{{Y: s.eval.Rho, Label: fmt.Sprintf("ρ = %.2f", s.eval.Rho), Name: "rho"}},
				Groups: []barGroup{{Name: "last week", Color: "#c7c7c7"}, {Name: "this week", Color: colors[av]}}}
			for _, wo := range resp.WeekOverWeek {
				if wo.AgentVersion != av || wo.RunsThisWeek+wo.RunsLastWeek == 0 {
					continue
				}
				blk.Rows = append(blk.Rows, wo)
				bc.Categories = append(bc.Categories, wo.Capability)
				bc.Groups[0].Values = append(bc.Groups[0].Values, wo.CovLastWeek)
				bc.Groups[0].Tips = append(bc.Groups[0].Tips, fmt.Sprintf("%s last week: Cov %.3f, %s LACKING failures", wo.Capability, wo.CovLastWeek, fmtCount(wo.LackingLastWeek)))
				bc.Groups[1].Values = append(bc.Groups[1].Values, wo.CovThisWeek)
				bc.Groups[1].Tips = append(bc.Groups[1].Tips, fmt.Sprintf("%s this week: Cov %.3f, %s LACKING failures", wo.Capability, wo.CovThisWeek, fmtCount(wo.LackingThisWeek)))
			}
			if len(blk.Rows) > 0 {
				blk.Chart = bc.render()
				pg.WoW = append(pg.WoW, blk)
			}
		}
	}
	s.render(w, r, "trends", pg)
}
