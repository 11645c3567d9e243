package dashboard

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserTraining loads the Training page in headless chromium at
// 1280×800: the jobs table shows the seeded jobs, the succeeded job's
// reward curve is drawn (a path through its five points, rising, inside its
// figure), the adapter table shows the registered adapter with its status,
// and the page stays within the viewport with nothing fetched elsewhere.
func TestBrowserTraining(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test: skipped with -short")
	}
	ctx := browser(t)
	st := openStore(t)
	ok, failed := seedTraining(t, st)
	srv := httptest.NewServer(New(Deps{Training: st}))
	defer srv.Close()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	resp, err := chromedp.Run(tctx, chromedp.NavigateResponse(srv.URL+"/training"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != 200 {
		t.Fatalf("/training: HTTP %d", resp.Status)
	}
	got, err := chromedp.Run(tctx, chromedp.Evaluate[map[string]any](`(() => {
		const row = document.querySelector('#training-jobs tr.job-row[data-job="`+ok+`"]');
		const svg = document.querySelector('figure.curve-fig[data-job="`+ok+`"] svg.curve');
		const path = svg ? svg.querySelector('path.series') : null;
		const pts = svg ? [...svg.querySelectorAll('circle.pt')] : [];
		const cell = svg ? svg.closest('figure').getBoundingClientRect() : {left: 0, right: 0};
		const box = path ? path.getBoundingClientRect() : {left: 0, right: 0, width: 0};
		const ad = document.querySelector('#adapters tr.adapter-row');
		return {
			overflowX: document.documentElement.scrollWidth > window.innerWidth,
			foreign: performance.getEntriesByType('resource').map(e => e.name).filter(u => !u.startsWith(location.origin)).length,
			css: getComputedStyle(document.body).backgroundColor,
			nav: document.querySelector('header nav a.active')?.textContent || '',
			jobs: [...document.querySelectorAll('#training-jobs tr.job-row')].map(r => r.dataset.job + ':' + r.dataset.status).join(','),
			okSimulated: row ? !!row.querySelector('.simulated') : false,
			pathWidth: box.width,
			pathInside: box.left >= cell.left - 0.5 && box.right <= cell.right + 0.5,
			points: pts.length,
			firstY: pts.length ? pts[0].getBoundingClientRect().top : 0,
			lastY: pts.length ? pts[pts.length-1].getBoundingClientRect().top : 0,
			lastTip: pts.length ? pts[pts.length-1].querySelector('title').textContent : '',
			axis: svg ? svg.querySelector('.axis-label').textContent : '',
			failedPoints: document.querySelectorAll('figure.curve-fig[data-job="`+failed+`"] svg.curve circle.pt').length,
			adapter: ad ? ad.dataset.adapter + ':' + ad.dataset.status + ':' + ad.dataset.job : '',
			adapterText: ad ? ad.innerText : '',
		};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("/training: %v", got)
	if got["overflowX"] == true || num(got["foreign"]) != 0 || got["css"] != "rgb(244, 245, 247)" || got["nav"] != "Training" {
		t.Errorf("layout: %v", got)
	}
	if got["jobs"] != failed+":FAILED,"+ok+":SUCCEEDED" || got["okSimulated"] != true {
		t.Errorf("jobs table: %v (simulated mark %v)", got["jobs"], got["okSimulated"])
	}
	// The curve rises from 0.42 to 0.81: the last point is drawn higher (a
	// smaller y) than the first.
	if num(got["points"]) != 5 || num(got["pathWidth"]) < 300 || got["pathInside"] != true || num(got["lastY"]) >= num(got["firstY"]) {
		t.Errorf("reward curve: %v points, path %v px wide (inside its cell: %v), first y %v, last y %v",
			got["points"], got["pathWidth"], got["pathInside"], got["firstY"], got["lastY"])
	}
	if !strings.Contains(got["lastTip"].(string), "iteration 5: mean reward 0.810") || !strings.Contains(got["axis"].(string), "SIMULATED") || num(got["failedPoints"]) != 1 {
		t.Errorf("curve labels: tooltip %q, axis %q, failed job's points %v", got["lastTip"], got["axis"], got["failedPoints"])
	}
	if got["adapter"] != "sim-precondition-verification-00aa:candidate:"+ok || !strings.Contains(got["adapterText"].(string), "sim://simtrainer/") ||
		!strings.Contains(got["adapterText"].(string), "SIMULATED") {
		t.Errorf("adapters table: %v %q", got["adapter"], got["adapterText"])
	}
	shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(artifactsDir(t), "training-full.png")
	if err := os.WriteFile(p, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", p)
}
