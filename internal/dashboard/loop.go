package dashboard

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"time"

	"github.com/traceops/trace/verify"
)

// The Closed loop page (TRACE step 4): every adapter's effect on the
// capability it was trained for, and the routing share per adapter.
//
//	/loop        per capability: before activation vs routed after, with 95 % intervals, the verdict, the guard's action;
//	             per environment: the routing share per adapter over time
//	             and the token usage of the proxied requests per day and adapter
//	/api/loop    ?hours=168|all&bucket=hour|day: verify.Report (the share's hours back from each environment's newest rollout)

// LoopSource is the closed loop's report (verify.Reporter implements it).
type LoopSource interface {
	LoopReport(ctx context.Context, window, bucket time.Duration) (*verify.Report, error)
}

var errNoLoop = errors.New("dashboard: the closed loop is not configured (no store)")

type loopParams struct {
	Hours  int
	Bucket string
}

func parseLoop(r *http.Request) (loopParams, error) {
	p := &params{q: r.URL.Query()}
	return loopParams{Hours: p.hours(), Bucket: p.bucket()}, p.err
}

func (s *server) loop(ctx context.Context, p loopParams) (*verify.Report, error) {
	if s.d.Loop == nil {
		return nil, errNoLoop
	}
	step, _ := bucketStep(p.Bucket)
	return s.d.Loop.LoopReport(ctx, time.Duration(p.Hours)*time.Hour, step)
}

func (s *server) apiLoop(w http.ResponseWriter, r *http.Request) {
	if _, rep, ok := fetchEnv(s, w, r, parseLoop, (*server).loop, true); ok {
		s.writeJSON(w, rep)
	}
}

type loopPage struct {
	base
	Report       *verify.Report
	Capabilities []loopCapability
	Shares       []loopShare
	Ranges       []rangeLink
	Buckets      []rangeLink
}

type loopCapability struct {
	Environment, Capability string
	Adapters                []loopAdapter
}

type loopAdapter struct {
	verify.AdapterCheck
	Verdict   string
	Activated string
	// BeforeSpan and AfterSpan date each side's rollouts (first – last end).
	BeforeSpan, AfterSpan string
	// BeforeBound says where the before side ends when that is not at the
	// adapter's activation (an earlier adapter of the capability, or its
	// own first activation); empty otherwise.
	BeforeBound string
}

type loopShare struct {
	Environment string
	Source      string
	Chart       template.HTML
	Legend      []legendItem
	Tokens      []tokenDay // the proxied requests' token usage (route_decisions)
}

type tokenDay struct {
	Day, Adapter                                  string
	Requests, WithUsage, PromptTokens, Completion uint64
}

func (s *server) pageLoop(w http.ResponseWriter, r *http.Request) {
	p, rep, ok := fetchEnv(s, w, r, parseLoop, (*server).loop, false)
	if !ok {
		return
	}
	pg := loopPage{base: s.base(r, "Closed loop", "loop"), Report: rep}
	rg := Range{Hours: p.Hours, Bucket: p.Bucket}
	pg.Ranges, pg.Buckets = rangeLinks(pg.Tok, "/loop", nil, rg)
	for _, c := range rep.Capabilities {
		lc := loopCapability{Environment: c.Environment, Capability: c.Capability}
		for _, a := range c.Adapters {
			lc.Adapters = append(lc.Adapters, loopAdapter{AdapterCheck: a, Verdict: verdictLabel(a.Verdict), Activated: fmtTS(a.ActivatedAt),
				BeforeSpan: a.Before.Span(fmtTS), AfterSpan: a.After.Span(fmtTS), BeforeBound: a.BeforeNote(fmtTS)})
		}
		pg.Capabilities = append(pg.Capabilities, lc)
	}
	step, _ := bucketStep(p.Bucket)
	tokens := map[string][]tokenDay{}
	for _, et := range rep.Tokens {
		for _, d := range et.Days {
			tokens[et.Environment] = append(tokens[et.Environment], tokenDay{Day: d.Day.Format(time.DateOnly), Adapter: adapterName(d.Adapter),
				Requests: d.Requests, WithUsage: d.WithUsage, PromptTokens: d.PromptTokens, Completion: d.CompletionTokens})
		}
	}
	for _, sh := range rep.Share {
		ls := shareChart(sh, step)
		ls.Tokens = tokens[sh.Environment]
		pg.Shares = append(pg.Shares, ls)
	}
	s.render(w, r, "loop", pg)
}

func verdictLabel(v verify.Verdict) string {
	switch v {
	case verify.GapClosed:
		return "gap closed"
	case verify.NotEnoughData:
		return "not enough data"
	case verify.NoChange:
		return "no change"
	}
	return string(v)
}

// shareChart draws one environment's routing share per adapter.
func shareChart(sh verify.EnvShare, step time.Duration) loopShare {
	names := make([]string, 0, len(sh.Share))
	for n := range sh.Share {
		names = append(names, n)
	}
	sort.Strings(names) // "" (the base model) first
	c := lineChart{ID: "chart-share-" + sh.Environment, Title: "Routing share per adapter in " + sh.Environment, YLabel: "share",
		H: 220, YMin: 0, YMax: 1, Percent: true, Step: step, Empty: "no rollouts in the range"}
	if len(sh.Buckets) > 0 {
		c.XMin, c.XMax = sh.Buckets[0], sh.Buckets[len(sh.Buckets)-1].Add(step)
	}
	out := loopShare{Environment: sh.Environment, Source: sh.Source}
	unit := "rollouts"
	if sh.Source == "route_decisions" {
		unit = "decisions"
	}
	for i, n := range names {
		label := adapterName(n)
		ser := chartSeries{Name: label, Color: colorAt(i)}
		for j, b := range sh.Buckets {
			ser.Points = append(ser.Points, chartPoint{X: b, Y: sh.Share[n][j],
				Tip: fmt.Sprintf("%s %s: %.1f%% of %d %s", label, fmtTS(b), sh.Share[n][j]*100, sh.Totals[j], unit)})
		}
		c.Series = append(c.Series, ser)
		out.Legend = append(out.Legend, legendItem{Name: label, Color: colorAt(i)})
	}
	out.Chart = c.render()
	return out
}

// adapterName is an adapter's name, "base model" for "".
func adapterName(adapter string) string {
	if adapter == "" {
		return "base model"
	}
	return adapter
}
