package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/verify"
	"github.com/traceops/trace/verify/verifytest"
)

// seedLoop stores two adapters on sim-airline: "pv-good", which closed its
// gap, and "msc-bad", which made things worse and was rolled back.
func seedLoop(t *testing.T) (*sink.Store, time.Time) {
	t.Helper()
	st := openStore(t)
	ctx := context.Background()
	act := time.Now().UTC().Truncate(time.Hour).Add(-2 * time.Hour)
	gap := verifytest.Mix{LF: 40, PF: 10, NF: 10, LP: 5, PP: 45, NP: 10}
	for _, a := range []verifytest.Adapter{
		{Name: "pv-good", Capability: "precondition_verification", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 2, PF: 28, NF: 5, LP: 2, PP: 60, NP: 3}, Simulated: true},
		{Name: "msc-bad", Capability: "multi_step_completion", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 45, PF: 40, NF: 5, LP: 2, PP: 13, NP: 5}},
	} {
		if err := verifytest.Seed(ctx, st, a); err != nil {
			t.Fatal(err)
		}
	}
	bad, err := st.Adapter(ctx, "msc-bad")
	if err != nil {
		t.Fatal(err)
	}
	meta, _ := json.Marshal(map[string]any{"activated_at": act, "rolled_back_by": "guard"})
	if err := st.MarkAdapterRolledBack(ctx, *bad, string(meta), act.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	return st, act
}

func loopHandler(st *sink.Store) http.Handler {
	return New(Deps{Store: st, Loop: verify.Reporter{Checker: verify.New(verify.Config{Guard: true}, st, nil, nil, nil),
		Shares: []verify.ShareSource{verify.DecisionShares{Store: st}, st}}})
}

func TestLoopAPI(t *testing.T) {
	st, act := seedLoop(t)
	srv := httptest.NewServer(loopHandler(st))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/api/loop?hours=all")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("HTTP %d: %s", resp.StatusCode, body)
	}
	var rep verify.Report
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range rep.Capabilities {
		for _, a := range c.Adapters {
			got[a.Adapter] = string(a.Verdict) + "/" + a.Status
		}
	}
	if got["pv-good"] != "gap_closed/active" || got["msc-bad"] != "worse/rolled_back" || len(rep.Capabilities) != 2 {
		t.Fatalf("verdicts %v\n%s", got, body)
	}
	if len(rep.Share) != 1 || rep.Share[0].Environment != "sim-airline" || len(rep.Share[0].Share) != 3 || rep.Share[0].Source != "rollouts.adapter" {
		t.Fatalf("share: %+v", rep.Share)
	}
	// Every bucket's shares sum to 1.
	sh := rep.Share[0]
	for i := range sh.Buckets {
		sum := 0.0
		for _, xs := range sh.Share {
			sum += xs[i]
		}
		if sum < 0.999 || sum > 1.001 {
			t.Fatalf("bucket %s: shares sum to %v", sh.Buckets[i], sum)
		}
	}
	// The page says what each verdict rests on: the cohort, the dictionary,
	// the training environment and the dates of each side's rollouts.
	resp, err = http.Get(srv.URL + "/loop?hours=all")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(body)
	if !strings.Contains(page, "agent 1.4.0 · dictionary v1 · trained on env-pv-good") ||
		!strings.Contains(page, `title="ended `+fmtTS(act.Add(time.Minute))+" – "+fmtTS(act.Add(time.Minute+99*time.Second))+`"`) ||
		!strings.Contains(page, `title="30 need the capability"`) {
		t.Fatalf("page lacks the provenance:\n%s", page)
	}
	// The active adapter's guard state, and the rule in the legend.
	if !strings.Contains(page, `<div class="muted reason guard">guard: not significantly worse at the guard&#39;s look `) ||
		!strings.Contains(page, "one of its 6 looks at the earliest routed rollouts worse at 99.2 %") ||
		strings.Count(page, `class="muted reason guard"`) != 1 {
		t.Fatalf("page lacks the guard's state:\n%s", page)
	}
	// The API has it too.
	for _, c := range rep.Capabilities {
		for _, a := range c.Adapters {
			if a.Adapter == "pv-good" && (a.Guard.Look < 1 || a.Guard.Worse || a.Guard.Comparison == nil) {
				t.Fatalf("pv-good's guard: %+v", a.Guard)
			}
		}
	}
	// A routing share that cannot be read leaves the rest of the report,
	// and the page and the API name what is missing.
	partial := httptest.NewServer(New(Deps{Store: st, Loop: verify.Reporter{Checker: verify.New(verify.Config{Guard: true}, st, nil, nil, nil),
		Shares: []verify.ShareSource{brokenShares{}}}}))
	defer partial.Close()
	for _, path := range []string{"/api/loop?hours=all", "/loop?hours=all"} {
		resp, err := http.Get(partial.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "routing share of sim-airline: share table unreachable") ||
			!strings.Contains(string(body), "pv-good") {
			t.Fatalf("%s with a broken share: HTTP %d %.2000s", path, resp.StatusCode, body)
		}
	}
	// Without a loop source the page says so.
	noLoop := httptest.NewServer(New(Deps{Store: st}))
	defer noLoop.Close()
	resp, err = http.Get(noLoop.URL + "/api/loop")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode < 400 || !strings.Contains(string(body), "closed loop is not configured") {
		t.Fatalf("no loop: HTTP %d %s", resp.StatusCode, body)
	}
}

// TestLoopPageInBrowser renders /loop in headless chromium: one section per
// capability with its verdict, the rolled-back adapter marked, the routing
// share chart drawn with a series per adapter and the base model.
func TestLoopPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test: skipped with -short")
	}
	ctx := browser(t)
	st, _ := seedLoop(t)
	srv := httptest.NewServer(loopHandler(st))
	defer srv.Close()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	resp, err := chromedp.Run(tctx, chromedp.NavigateResponse(srv.URL+"/loop?hours=all"))
	if err != nil || resp.Status != 200 {
		t.Fatalf("navigate: %v %v", resp, err)
	}
	g, err := chromedp.Run(tctx, chromedp.Evaluate[map[string]any](`(() => {
		const rows = [...document.querySelectorAll('tr.loop-adapter')];
		return {
			overflowX: document.documentElement.scrollWidth > window.innerWidth,
			sections: document.querySelectorAll('section.loop-capability').length,
			verdicts: rows.map(r => r.dataset.adapter + '=' + r.dataset.verdict + '/' + r.dataset.status).sort().join(','),
			badge: document.querySelector('tr[data-adapter=msc-bad] .verdict')?.textContent || '',
			action: document.querySelector('tr[data-adapter=pv-good] .action')?.textContent || '',
			simulated: document.querySelectorAll('tr[data-adapter=pv-good] .simulated').length,
			delta: document.querySelector('tr[data-adapter=pv-good] td.delta')?.innerText || '',
			series: [...document.querySelectorAll('section.share svg path.series')].filter(p => p.getBBox().width > 0 || p.getAttribute('d')).length,
			legend: [...document.querySelectorAll('section.share .legend .key')].map(e => e.textContent.trim()).join(','),
			nav: document.querySelector('header nav a.active')?.textContent || '',
		};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v", g)
	if g["overflowX"] == true || num(g["sections"]) != 2 || g["verdicts"] != "msc-bad=worse/rolled_back,pv-good=gap_closed/active" {
		t.Errorf("sections %v, verdicts %v, overflow %v", g["sections"], g["verdicts"], g["overflowX"])
	}
	if g["badge"] != "worse" || g["action"] != "" || num(g["simulated"]) != 1 || !strings.HasPrefix(g["delta"].(string), "0.700") {
		t.Errorf("badge %q action %q simulated %v delta %q", g["badge"], g["action"], g["simulated"], g["delta"])
	}
	if num(g["series"]) != 3 || g["legend"] != "base model,msc-bad,pv-good" || g["nav"] != "Closed loop" {
		t.Errorf("share chart: %v series, legend %q, nav %q", g["series"], g["legend"], g["nav"])
	}
	shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(artifactsDir(t), "loop-full.png")
	if err := os.WriteFile(p, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", p)
}

// brokenShares is a routing-share source that always fails.
type brokenShares struct{}

func (brokenShares) RoutingShare(context.Context, string, time.Duration, time.Duration) ([]sink.ShareRow, error) {
	return nil, errors.New("share table unreachable")
}

// TestLoopAPIEmpty: before any adapter, /api/loop's lists are empty lists,
// as every other endpoint's are (and trace report --loop's), not null.
func TestLoopAPIEmpty(t *testing.T) {
	st := openStore(t)
	code, body := getStatus(loopHandler(st), "/api/loop")
	if code != 200 {
		t.Fatalf("HTTP %d: %s", code, body)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	if string(raw["capabilities"]) != "[]" || string(raw["routing_share"]) != "[]" {
		t.Errorf("capabilities %s, routing_share %s; want []", raw["capabilities"], raw["routing_share"])
	}
}

// TestLoopTokens: once the router has recorded decisions with the
// upstream's usage, the API and the page show the tokens per day and
// adapter beside the routing share.
func TestLoopTokens(t *testing.T) {
	st, act := seedLoop(t)
	ctx := context.Background()
	if err := st.InsertRouteDecisions(ctx, []sink.RouteDecisionRow{
		{At: act, RequestID: "q1", DecisionID: "d1", ConversationID: "c1", Environment: "sim-airline", Endpoint: "proxy", Adapter: "pv-good", Outcome: "ok",
			Usage: true, PromptTokens: 1000, CompletionTokens: 120},
		{At: act.Add(time.Minute), RequestID: "q2", DecisionID: "d1", ConversationID: "c1", Environment: "sim-airline", Endpoint: "proxy", Adapter: "pv-good",
			Cached: true, Outcome: "ok", Stream: true},
		{At: act, RequestID: "q3", DecisionID: "d2", ConversationID: "c2", Environment: "sim-airline", Endpoint: "proxy", Outcome: "ok",
			Usage: true, PromptTokens: 300, CompletionTokens: 7},
	}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(loopHandler(st))
	defer srv.Close()
	get := func(path string) string {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: HTTP %d %s", path, resp.StatusCode, body)
		}
		return string(body)
	}
	var rep verify.Report
	if err := json.Unmarshal([]byte(get("/api/loop?hours=all")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Share) != 1 || rep.Share[0].Source != "route_decisions" || len(rep.Tokens) != 1 || rep.Tokens[0].Environment != "sim-airline" {
		t.Fatalf("share %+v, tokens %+v", rep.Share, rep.Tokens)
	}
	byAdapter := map[string]sink.TokenUsageRow{}
	for _, d := range rep.Tokens[0].Days {
		byAdapter[d.Adapter] = d
	}
	if g := byAdapter["pv-good"]; g.Requests != 2 || g.WithUsage != 1 || g.PromptTokens != 1000 || g.CompletionTokens != 120 {
		t.Fatalf("pv-good's tokens %+v", g)
	}
	if b := byAdapter[""]; b.Requests != 1 || b.WithUsage != 1 || b.PromptTokens != 300 || b.CompletionTokens != 7 {
		t.Fatalf("the base model's tokens %+v", b)
	}
	page := get("/loop?hours=all")
	day := act.Format(time.DateOnly)
	for _, want := range []string{`<table class="data tokens">`,
		`<tr class="token-day" data-adapter="pv-good"><td>` + day + `</td><td>pv-good</td><td class="num">2</td><td class="num">1</td><td class="num">1000</td><td class="num">120</td></tr>`,
		`<td>base model</td><td class="num">1</td><td class="num">1</td><td class="num">300</td><td class="num">7</td>`} {
		if !strings.Contains(page, want) {
			t.Fatalf("the page lacks %s:\n%.6000s", want, page[strings.Index(page, "Routing share"):])
		}
	}
}
