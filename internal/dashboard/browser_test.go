package dashboard

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
)

// chromiumPath finds Debian's chromium (apt-get install -y chromium), or the
// browser named by TRACE_TEST_CHROMIUM (which, when set, is the only one
// looked at).
func chromiumPath() (string, bool) {
	if p := os.Getenv("TRACE_TEST_CHROMIUM"); p != "" {
		_, err := os.Stat(p)
		return p, err == nil
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium", true
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, true
		}
	}
	return "", false
}

// artifactsDir is where screenshots go: $TRACE_ARTIFACTS_DIR/dashboard, or a
// test temporary directory.
func artifactsDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("TRACE_ARTIFACTS_DIR"); d != "" {
		dir := filepath.Join(d, "dashboard")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return t.TempDir()
}

// browser starts a headless chromium with a 1280×800 viewport.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, ok := chromiumPath()
	if !ok {
		if path != "" {
			testenv.Unavailable(t, "browser test: TRACE_TEST_CHROMIUM=%s does not exist", path)
		}
		testenv.Unavailable(t, "browser test: chromium is not installed (no /usr/bin/chromium, none on $PATH): apt-get install -y chromium")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// Start the browser without a deadline (a deadline on the first Run
	// would bind the browser's life to it).
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatalf("start chromium %s: %v", path, err)
	}
	return ctx
}

type pageCheck struct {
	name string // screenshot file stem
	path string
	// js returns an object of named numbers/booleans/strings; want checks them.
	js   string
	want func(t *testing.T, got map[string]any)
}

// longStore is a store holding only seedLongNames' data.
func longStore(t *testing.T, now time.Time) *sink.Store {
	st := openStore(t)
	seedLongNames(t, st, now)
	return st
}

func allMatch(ss []string, re string) bool {
	r := regexp.MustCompile(re)
	for _, s := range ss {
		if !r.MatchString(s) {
			return false
		}
	}
	return true
}

func anyMatch(ss []string, re string) bool {
	r := regexp.MustCompile(re)
	for _, s := range ss {
		if r.MatchString(s) {
			return true
		}
	}
	return false
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

// TestBrowser loads every page of a seeded dashboard in headless chromium at
// 1280×800, checks what was drawn and saves screenshots.
func TestBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test: skipped with -short")
	}
	ctx := browser(t)
	st := openStore(t)
	now := time.Now().UTC().Truncate(time.Second)
	seedDemo(t, st, now)
	srv := httptest.NewServer(newHandler(st, now, registry()))
	defer srv.Close()
	if !strings.HasPrefix(srv.URL, "http://127.0.0.1:") {
		t.Fatalf("test server on %s, want 127.0.0.1", srv.URL)
	}
	empty := httptest.NewServer(New(Deps{Store: openStore(t)}))
	defer empty.Close()
	dir := artifactsDir(t)

	// common is evaluated on every page: layout and offline checks.
	const common = `
		overflowX: document.documentElement.scrollWidth > window.innerWidth,
		viewport: window.innerWidth + 'x' + window.innerHeight,
		foreign: performance.getEntriesByType('resource').map(e => e.name).filter(u => !u.startsWith(location.origin)).length,
		css: getComputedStyle(document.body).backgroundColor,
		title: document.title,
	`
	checks := []pageCheck{
		{
			name: "overview", path: "/?env=airline&agent_version=v2",
			js: `(() => {
				const d = (id) => document.getElementById(id);
				const drawn = (sel) => [...document.querySelectorAll(sel)].filter(p => (p.getAttribute('d') || '').includes('L') && p.getBBox().width > 50).length;
				const rho = document.querySelector('#chart-cov line.threshold[data-threshold=rho]');
				const covBox = d('chart-cov').getBoundingClientRect();
				const rows = [...document.querySelectorAll('#decisions tr.cap-row')];
				return {` + common + `
					passSeries: drawn('#chart-pass-rate path.series'),
					covSeries: drawn('#chart-cov path.series'),
					deltaSeries: drawn('#chart-delta path.series'),
					points: document.querySelectorAll('#chart-cov circle.pt').length,
					rhoWidth: rho ? rho.getBoundingClientRect().width : 0,
					rhoLabel: document.querySelector('#chart-cov .threshold-label')?.textContent || '',
					deltaLine: !!document.querySelector('#chart-delta line.threshold[data-threshold=delta]'),
					yTicks: document.querySelectorAll('#chart-cov .y-axis .tick').length,
					xTicks: document.querySelectorAll('#chart-cov .x-axis .tick').length,
					covWidth: covBox.width, covRight: covBox.right,
					rows: rows.length,
					selected: rows.filter(r => r.dataset.decision === 'selected').map(r => r.dataset.capability).join(','),
					firstRow: rows.length ? rows[0].dataset.capability : '',
					legend: document.querySelectorAll('#legend-caps .key').length,
					selectedCells: [...document.querySelectorAll('#cohorts td.selected-count')].map(td => td.textContent.trim()).join(','),
					currentSelected: document.querySelector('#cohorts tr.current td.selected-count')?.textContent.trim() || '',
					statSelected: (document.getElementById('stat-selected')?.firstChild?.textContent || '').trim(),
				};
			})()`,
			want: func(t *testing.T, g map[string]any) {
				if num(g["passSeries"]) < 2 || num(g["covSeries"]) != 4 || num(g["deltaSeries"]) != 4 {
					t.Errorf("drawn series: pass %v cov %v delta %v", g["passSeries"], g["covSeries"], g["deltaSeries"])
				}
				if num(g["points"]) < 20 || num(g["rhoWidth"]) < 300 || g["rhoLabel"] != "ρ = 0.10" || g["deltaLine"] != true {
					t.Errorf("points %v, ρ line width %v label %q, δ line %v", g["points"], g["rhoWidth"], g["rhoLabel"], g["deltaLine"])
				}
				if num(g["yTicks"]) < 4 || num(g["xTicks"]) < 3 {
					t.Errorf("axes: %v y ticks, %v x ticks", g["yTicks"], g["xTicks"])
				}
				if num(g["covWidth"]) < 450 || num(g["covRight"]) > 1280 {
					t.Errorf("Cov chart %v px wide, right edge at %v", g["covWidth"], g["covRight"])
				}
				if num(g["rows"]) != 4 || g["firstRow"] != capMulti || !strings.Contains(g["selected"].(string), capMulti) || num(g["legend"]) != 4 {
					t.Errorf("decision table: %v rows, first %v, selected %v, legend %v", g["rows"], g["firstRow"], g["selected"], g["legend"])
				}
				// The Selected column is a count in every row (airline v1, v2, retail v1), never "—";
				// the current cohort's equals the Selected card.
				cells := strings.Split(g["selectedCells"].(string), ",")
				if len(cells) != 3 || !allMatch(cells, `^[0-9]+$`) || g["currentSelected"] != g["statSelected"] || g["statSelected"] == "" {
					t.Errorf("cohorts' Selected column %q, current %q, Selected card %q", g["selectedCells"], g["currentSelected"], g["statSelected"])
				}
			},
		},
		{
			name: "overview-daily", path: "/?env=airline&agent_version=v1&hours=720&bucket=day",
			js: `(() => ({` + common + `
				// A series counts when it is one unbroken line (a single
				// moveto) whose drawn width spans its points' x range, and
				// that range covers more than half the plot (v1: 19–20 of
				// 30 days, depending on the time of day the test runs).
				covSeries: [...document.querySelectorAll('#chart-cov g.series-group')].filter(g => {
					const path = g.querySelector('path.series');
					const xs = [...g.querySelectorAll('circle.pt')].map(c => +c.getAttribute('cx'));
					const plot = document.querySelector('#chart-cov .x-axis line.axis-line').getBBox().width;
					const span = Math.max(...xs) - Math.min(...xs);
					return (path.getAttribute('d').match(/M/g) || []).length === 1 &&
						path.getBBox().width >= span - 1 && span > plot / 2;
				}).length,
				covPoints: document.querySelectorAll('#chart-cov circle.pt').length,
				activeBucket: document.querySelector('.ranges a.active:last-child')?.textContent || '',
				heading: document.querySelector('.card-head h2')?.textContent || '',
				triggerLinks: document.querySelectorAll('#decisions a.ev-link').length,
			}))()`,
			want: func(t *testing.T, g map[string]any) {
				// v1 spans 20 days: one point per day and capability.
				if num(g["covSeries"]) != 4 || num(g["covPoints"]) < 4*19 || num(g["covPoints"]) > 4*22 {
					t.Errorf("daily Cov chart: %v series, %v points", g["covSeries"], g["covPoints"])
				}
				if g["activeBucket"] != "daily" || g["heading"] != "Pass rate per day" || num(g["triggerLinks"]) != 2 {
					t.Errorf("bucket %v, heading %v, trigger links %v", g["activeBucket"], g["heading"], g["triggerLinks"])
				}
			},
		},
		{
			name: "capability", path: "/capability?env=airline&agent_version=v2&dict=1&name=" + capMulti,
			js: `(() => ({` + common + `
				name: document.getElementById('cap-name')?.textContent || '',
				decision: document.getElementById('cap-decision')?.textContent || '',
				definition: document.getElementById('cap-definition')?.textContent.trim() || '',
				runRows: document.querySelectorAll('#per-run tr.run-row').length,
				examples: document.querySelectorAll('details.example').length,
				messages: document.querySelectorAll('details.example .msg').length,
				toolErrors: document.querySelectorAll('details.example .msg-error').length,
				calls: document.querySelectorAll('details.example .call').length,
				series: [...document.querySelectorAll('#chart-cov path.series')].filter(p => p.getBBox().width > 50).length,
				threshold: !!document.querySelector('#chart-delta line.threshold[data-threshold=delta]'),
			}))()`,
			want: func(t *testing.T, g map[string]any) {
				if g["name"] != capMulti || g["decision"] != "selected" || !strings.HasPrefix(g["definition"].(string), "Completes every step") {
					t.Errorf("header: %v %v %v", g["name"], g["decision"], g["definition"])
				}
				if num(g["runRows"]) != 10 || num(g["examples"]) != 5 || num(g["messages"]) < 50 || num(g["toolErrors"]) != 5 || num(g["calls"]) < 10 {
					t.Errorf("runs %v examples %v messages %v tool errors %v calls %v", g["runRows"], g["examples"], g["messages"], g["toolErrors"], g["calls"])
				}
				if num(g["series"]) != 1 || g["threshold"] != true {
					t.Errorf("chart: series %v threshold %v", g["series"], g["threshold"])
				}
			},
		},
		{
			name: "triggers", path: "/triggers",
			js: `(() => {
				const s = document.querySelector('details.payload summary');
				if (s) s.click();
				const pre = document.querySelector('details.payload[open] pre.json');
				return {` + common + `
					markers: document.querySelectorAll('#chart-triggers .event').length,
					fired: document.querySelectorAll('#chart-triggers .event[data-event=fired]').length,
					rows: document.querySelectorAll('#events tr.event-row').length,
					order: [...document.querySelectorAll('#events tr.event-row')].map(r => r.dataset.event).join(','),
					payloadVisible: pre ? pre.getBoundingClientRect().height > 50 : false,
					payloadText: pre ? pre.textContent.includes('"trigger_id"') : false,
					chartRows: document.querySelectorAll('#chart-triggers text.cat').length,
				};
			})()`,
			want: func(t *testing.T, g map[string]any) {
				if num(g["markers"]) != 5 || num(g["fired"]) != 3 || num(g["rows"]) != 5 || num(g["chartRows"]) != 2 {
					t.Errorf("timeline: %v markers (%v fired), %v rows, %v chart rows", g["markers"], g["fired"], g["rows"], g["chartRows"])
				}
				if g["order"] != "fired,fired,deselected,rearmed,fired" {
					t.Errorf("order = %v", g["order"])
				}
				if g["payloadVisible"] != true || g["payloadText"] != true {
					t.Errorf("payload after click: visible %v text %v", g["payloadVisible"], g["payloadText"])
				}
			},
		},
		{
			name: "trends", path: "/trends?env=airline",
			js: `(() => ({` + common + `
				series: [...document.querySelectorAll('#chart-weekly-pass path.series')].filter(p => (p.getAttribute('d') || '').length > 0).length,
				points: document.querySelectorAll('#chart-weekly-pass circle.pt').length,
				wow: document.querySelectorAll('figure.wow').length,
				bars: document.querySelectorAll('figure.wow rect.bar').length,
				rho: document.querySelectorAll('figure.wow line.threshold[data-threshold=rho]').length,
				weekRows: document.querySelectorAll('#weekly tr.week-row').length,
				topItems: document.querySelectorAll('#weekly ol.top li').length,
				firstTop: document.querySelector('#weekly ol.top li')?.dataset.capability || '',
				counts: [...document.querySelectorAll('.lacking-count')].map(e => e.textContent.trim()).join(','),
			}))()`,
			want: func(t *testing.T, g map[string]any) {
				if num(g["series"]) != 2 || num(g["points"]) < 4 {
					t.Errorf("weekly chart: %v series, %v points", g["series"], g["points"])
				}
				if num(g["wow"]) != 2 || num(g["bars"]) < 8 || num(g["rho"]) != 2 {
					t.Errorf("week over week: %v charts, %v bars, %v ρ lines", g["wow"], g["bars"], g["rho"])
				}
				if num(g["weekRows"]) < 3 || num(g["topItems"]) < 6 || g["firstTop"] != capMulti {
					t.Errorf("weekly table: %v rows, %v top items, first %v", g["weekRows"], g["topItems"], g["firstTop"])
				}
				// Means over 10 runs: a whole one prints as an integer, others with one decimal.
				if c := strings.Split(g["counts"].(string), ","); len(c) < 14 || !allMatch(c, `^[0-9]+(\.[0-9])?$`) || anyMatch(c, `\.0$`) {
					t.Errorf("LACKING failure counts %q: want integers or one decimal, never \".0\"", g["counts"])
				}
			},
		},
	}
	// Long names (τ²-bench agents), one labeling run.
	long := httptest.NewServer(newHandler(longStore(t, now), now, registry()))
	defer long.Close()
	longChecks := []pageCheck{
		{
			name: "triggers-long-names", path: "/triggers",
			js: `(() => {
				const card = document.getElementById('chart-triggers').closest('section.card').getBoundingClientRect();
				const svg = document.getElementById('chart-triggers').getBoundingClientRect();
				const labels = [...document.querySelectorAll('#chart-triggers text.cat, #chart-triggers text.cat-sub')];
				const out = labels.filter(e => { const r = e.getBoundingClientRect(); return r.left < card.left + 1 || r.right > card.right - 1 || r.left < svg.left - 0.5; });
				return {` + common + `
					labels: labels.length,
					outside: out.map(e => e.textContent).join(' | '),
					cut: labels.filter(e => e.textContent.endsWith('…')).length,
					titles: [...document.querySelectorAll('#chart-triggers g.row-label > title')].map(e => e.textContent).join(' | '),
					markers: document.querySelectorAll('#chart-triggers .event').length,
				};
			})()`,
			want: func(t *testing.T, g map[string]any) {
				// Two rows (two capabilities of one cohort), each a capability line and a cohort line.
				if num(g["labels"]) != 4 || g["outside"] != "" || num(g["markers"]) != 3 {
					t.Errorf("timeline labels: %v drawn, outside their card: %q, %v markers", g["labels"], g["outside"], g["markers"])
				}
				full := longEnv + "/" + longAV + " dict v3 · " + longCap
				if num(g["cut"]) < 1 || !strings.Contains(g["titles"].(string), full) {
					t.Errorf("long labels: %v cut, tooltips %q; want the long ones cut and the whole label as a tooltip", g["cut"], g["titles"])
				}
			},
		},
		{
			name: "trends-one-run", path: "/trends?env=" + longEnv,
			js: `(() => ({` + common + `
				counts: [...document.querySelectorAll('.lacking-count')].map(e => e.textContent.trim()).join(','),
				barLabels: document.querySelectorAll('figure.wow text.cat').length,
				barLabelsOutside: [...document.querySelectorAll('figure.wow text.cat')].filter(e => {
					const f = e.closest('figure').getBoundingClientRect(), r = e.getBoundingClientRect();
					return r.left < f.left - 0.5 || r.right > f.right + 0.5; }).length,
			}))()`,
			want: func(t *testing.T, g map[string]any) {
				if num(g["barLabels"]) != 2 || num(g["barLabelsOutside"]) != 0 {
					t.Errorf("week-over-week chart: %v labels, %v outside their figure", g["barLabels"], g["barLabelsOutside"])
				}
				// One labeling run: every count is a whole number, printed as one ("13", not "13.0").
				if c := strings.Split(g["counts"].(string), ","); len(c) < 2 || !allMatch(c, `^[0-9]+$`) {
					t.Errorf("LACKING failure counts of a one-run cohort: %q, want integers", g["counts"])
				}
			},
		},
	}
	run := func(t *testing.T, base string, c pageCheck) {
		tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		resp, err := chromedp.Run(tctx, chromedp.NavigateResponse(base+c.path))
		if err != nil {
			t.Fatalf("navigate %s: %v", c.path, err)
		}
		if resp.Status != 200 {
			t.Fatalf("%s: HTTP %d", c.path, resp.Status)
		}
		got, err := chromedp.Run(tctx, chromedp.Evaluate[map[string]any](c.js))
		if err != nil {
			t.Fatalf("%s: evaluate: %v", c.path, err)
		}
		t.Logf("%s: %v", c.path, got)
		if got["viewport"] != "1280x800" {
			t.Errorf("viewport = %v, want 1280x800", got["viewport"])
		}
		if got["overflowX"] == true {
			t.Errorf("%s: the page is wider than the 1280 px viewport", c.path)
		}
		if num(got["foreign"]) != 0 {
			t.Errorf("%s: %v resources loaded from outside the test server", c.path, got["foreign"])
		}
		if got["css"] != "rgb(244, 245, 247)" {
			t.Errorf("%s: stylesheet not applied (body background %v)", c.path, got["css"])
		}
		c.want(t, got)
		shot, err := chromedp.Run(tctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("%s: screenshot: %v", c.path, err)
		}
		full, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("%s: full screenshot: %v", c.path, err)
		}
		for name, b := range map[string][]byte{c.name + ".png": shot, c.name + "-full.png": full} {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("screenshot: %s", p)
		}
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { run(t, srv.URL, c) })
	}
	for _, c := range longChecks {
		t.Run(c.name, func(t *testing.T) { run(t, long.URL, c) })
	}
	t.Run("empty", func(t *testing.T) {
		for _, p := range []string{"/", "/trends"} {
			run(t, empty.URL, pageCheck{name: "empty" + strings.ReplaceAll(strings.TrimSuffix(p, "/"), "/", "-"), path: p,
				js: `(() => ({` + common + `
					empty: document.getElementById('empty')?.innerText || '',
					charts: document.querySelectorAll('svg.chart').length,
				}))()`,
				want: func(t *testing.T, g map[string]any) {
					if !strings.Contains(g["empty"].(string), "No rollouts yet") {
						t.Errorf("%s: empty state = %q", p, g["empty"])
					}
				}})
		}
	})
}
