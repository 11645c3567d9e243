package dashboard

import (
	"fmt"
	"html"
	"strings"
	"testing"
	"time"
)

func TestNiceTicks(t *testing.T) {
	if got := niceTicks(0, 1, 5); len(got) != 6 || got[0] != 0 || got[5] != 1 {
		t.Errorf("niceTicks(0, 1) = %v", got)
	}
	for _, r := range [][2]float64{{-0.4, 1}, {-1, 1}, {0, 0.3}, {0, 250}} {
		got := niceTicks(r[0], r[1], 5)
		if len(got) < 3 || len(got) > 11 || got[0] < r[0]-1e-9 || got[len(got)-1] > r[1]+1e-9 {
			t.Errorf("niceTicks(%v, %v) = %v", r[0], r[1], got)
		}
	}
	for _, c := range []struct {
		v       float64
		percent bool
		want    string
	}{{-1e-12, true, "0%"}, {-1e-12, false, "0.00"}, {-0.5, false, "-0.50"}, {0.25, true, "25%"}} {
		if got := fmtTick(c.v, c.percent); got != c.want {
			t.Errorf("fmtTick(%v, %v) = %q, want %q", c.v, c.percent, got, c.want)
		}
	}
}

func TestTimeTicks(t *testing.T) {
	lo := time.Date(2026, 11, 23, 3, 20, 0, 0, time.UTC)
	ticks, format := timeTicks(lo, lo.Add(7*24*time.Hour), 8)
	if len(ticks) < 4 || len(ticks) > 8 || format != "Jan 2" {
		t.Fatalf("7 days: %v %q", ticks, format)
	}
	for _, tk := range ticks {
		if tk.Hour() != 0 || tk.Before(lo) {
			t.Errorf("tick %v not at midnight within range", tk)
		}
	}
	ticks, format = timeTicks(lo, lo.Add(12*time.Hour), 8)
	if len(ticks) < 4 || format != "Jan 2 15:04" {
		t.Errorf("12 hours: %v %q", ticks, format)
	}
	ticks, _ = timeTicks(lo, lo.Add(60*24*time.Hour), 8)
	for _, tk := range ticks {
		if tk.Weekday() != time.Monday {
			t.Errorf("weekly tick %v is not a Monday", tk)
		}
	}
}

func TestLineChartSVG(t *testing.T) {
	h0 := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	c := lineChart{ID: "c", XMin: h0, XMax: h0.Add(10 * time.Hour), Step: time.Hour, YMin: 0, YMax: 1,
		HLines: []hline{{Y: 0.1, Label: "ρ = 0.10", Name: "rho"}},
		Series: []chartSeries{{Name: "<script>x</script>", Points: []chartPoint{
			{X: h0, Y: 0.2, Tip: "a&b"}, {X: h0.Add(time.Hour), Y: 0.4}, {X: h0.Add(5 * time.Hour), Y: 0.5}}}}}
	svg := string(c.render())
	if strings.Contains(svg, "<script>") || !strings.Contains(svg, "&lt;script&gt;") || !strings.Contains(svg, "a&amp;b") {
		t.Error("text not escaped")
	}
	// The gap of 4 hours breaks the line: two subpaths.
	i := strings.Index(svg, `class="series"`)
	d := svg[i:]
	d = d[strings.Index(d, ` d="`)+4:]
	d = d[:strings.Index(d, `"`)]
	if strings.Count(d, "M") != 2 || strings.Count(d, "L") != 1 {
		t.Errorf("path %q: want 2 subpaths", d)
	}
	if strings.Count(svg, `<circle class="pt"`) != 3 || !strings.Contains(svg, `data-threshold="rho"`) || !strings.Contains(svg, `data-points="3"`) {
		t.Errorf("svg lacks points or threshold: %s", svg)
	}
	empty := string(lineChart{ID: "e", Empty: "nothing here"}.render())
	if !strings.Contains(empty, "nothing here") {
		t.Error("empty chart has no message")
	}
}

func TestFmtCount(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{{2369, "2369"}, {0, "0"}, {4.0, "4"}, {52.1, "52.1"}, {3.96, "4"}, {1.94, "1.9"}, {0.5, "0.5"}, {12.25, "12.2"}} {
		if got := fmtCount(c.v); got != c.want {
			t.Errorf("fmtCount(%v) = %q, want %q", c.v, got, c.want)
		}
	}
}

func TestFitText(t *testing.T) {
	w := func(s string) float64 { return textWidth(s, catFont) }
	for _, c := range []struct {
		s     string
		width float64
		want  string
	}{
		{"short", 100, "short"},
		{"multi_step_transaction_completion", w("multi_step_transaction_completion"), "multi_step_transaction_completion"},
		{"multi_step_transaction_completion", w("multi_step_transaction_completion") - 1, "multi_step_transaction_completio…"},
		{"tau2-airline/v1 dict v1", w("tau2-airline/v1…") + 1, "tau2-airline/v1…"}, // no dangling separator before the mark
		{"αβγδε", w("αβ…"), "αβ…"},
		{"abc", 1, "…"},
	} {
		if got := fitText(c.s, c.width, catFont); got != c.want {
			t.Errorf("fitText(%q, %.1f) = %q, want %q", c.s, c.width, got, c.want)
		}
		if got := fitText(c.s, c.width, catFont); got != "…" && w(got) > c.width {
			t.Errorf("fitText(%q, %.1f) = %q is %.1f wide", c.s, c.width, got, w(got))
		}
	}
	// Wide letters take more room than narrow ones.
	if textWidth("mmmm", 12) <= textWidth("iiii", 12)*2 {
		t.Errorf("widths: mmmm %.1f, iiii %.1f", textWidth("mmmm", 12), textWidth("iiii", 12))
	}
}

// TestTimelineLabelsFit: however long a row's label, what is drawn fits the
// label column (by the width bound of its font size), the column never takes
// more than a third of the chart, and the tooltip keeps the whole label.
func TestTimelineLabelsFit(t *testing.T) {
	h0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	long := timelineRow{Label: strings.Repeat("handling_concurrent_intents_", 4), Sub: "tau2-airline/" + strings.Repeat("claude-3-7-sonnet-", 5) + " dict v2"}
	c := timelineChart{ID: "tl", XMin: h0, XMax: h0.Add(48 * time.Hour),
		Rows:   []timelineRow{long, {Label: "short", Sub: "env/v1 dict v1"}},
		Events: []timelineEvent{{Row: 0, At: h0.Add(time.Hour), Kind: "fired"}, {Row: 1, At: h0.Add(2 * time.Hour), Kind: "deselected"}}}
	svg := string(c.render())
	var left int
	if _, err := fmt.Sscanf(svg[strings.Index(svg, `data-label-width="`)+len(`data-label-width="`):], "%d", &left); err != nil {
		t.Fatal(err)
	}
	if left > 1200/3 || left < 160 {
		t.Errorf("label column %d wide", left)
	}
	texts := map[string]float64{`class="cat"`: catFont, `class="cat-sub"`: catSubFont}
	n := 0
	for cls, w := range texts {
		for rest := svg; strings.Contains(rest, cls); {
			rest = rest[strings.Index(rest, cls):]
			txt := rest[strings.Index(rest, ">")+1 : strings.Index(rest, "</text>")]
			rest = rest[len(cls):]
			n++
			if width := textWidth(html.UnescapeString(txt), w); width > float64(left-12) {
				t.Errorf("label %q is %.0f wide, the column %d", txt, width, left)
			}
		}
	}
	if n != 4 {
		t.Errorf("%d label lines, want 4", n)
	}
	if !strings.Contains(svg, "<title>"+esc(long.Sub+" · "+long.Label)+"</title>") || !strings.Contains(svg, "…") {
		t.Errorf("the long label is not cut, or its tooltip is not whole")
	}
	if !strings.Contains(svg, ">short</text>") {
		t.Errorf("a short label was changed")
	}
}
