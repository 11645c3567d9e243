package dashboard

// Charts are drawn on the server as inline SVG: no JavaScript, no chart
// library, nothing fetched at run time. Each chart has axes with ticks and
// labels, grid lines, one <path class="series"> per series (broken where
// buckets are missing), a <circle> per point with a <title> tooltip, and
// dashed threshold lines (<line class="threshold">) with their label.

import (
	"cmp"
	"fmt"
	"html"
	"html/template"
	"math"
	"sort"
	"strings"
	"time"
)

// palette is Tableau 10: distinct on white and for common color blindness.
var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

func colorAt(i int) string { return palette[i%len(palette)] }

type chartPoint struct {
	X   time.Time
	Y   float64
	Tip string
}

type chartSeries struct {
	Name   string
	Color  string
	Points []chartPoint
}

type hline struct {
	Y     float64
	Label string
	Name  string // data-threshold
	Color string
}

// lineChart is a time-series chart.
type lineChart struct {
	ID         string
	Title      string // aria label
	YLabel     string
	W, H       int
	YMin, YMax float64
	XMin, XMax time.Time
	Step       time.Duration // bucket width: points more than 1.5 steps apart are not joined
	Percent    bool
	Series     []chartSeries
	HLines     []hline
	Empty      string
}

const (
	padL, padR, padT, padB = 58, 70, 14, 34
)

func esc(s string) string { return html.EscapeString(s) }

func (c lineChart) render() template.HTML {
	c.W = cmp.Or(c.W, 1200)
	c.H = cmp.Or(c.H, 260)
	pw, ph := float64(c.W-padL-padR), float64(c.H-padT-padB)
	if !c.XMax.After(c.XMin) {
		c.XMax = c.XMin.Add(time.Hour)
	}
	if c.YMax <= c.YMin {
		c.YMax = c.YMin + 1
	}
	span := c.XMax.Sub(c.XMin).Seconds()
	x := func(t time.Time) float64 { return float64(padL) + pw*t.Sub(c.XMin).Seconds()/span }
	y := func(v float64) float64 {
		v = math.Max(c.YMin, math.Min(c.YMax, v))
		return float64(padT) + ph*(1-(v-c.YMin)/(c.YMax-c.YMin))
	}
	var b strings.Builder
	n := 0
	for _, s := range c.Series {
		n += len(s.Points)
	}
	fmt.Fprintf(&b, `<svg class="chart line-chart" id="%s" viewBox="0 0 %d %d" width="100%%" preserveAspectRatio="xMidYMid meet" role="img" aria-label="%s" data-points="%d">`,
		esc(c.ID), c.W, c.H, esc(c.Title), n)
	// Grid and y axis.
	b.WriteString(`<g class="axis y-axis">`)
	for _, v := range niceTicks(c.YMin, c.YMax, 5) {
		yy := y(v)
		fmt.Fprintf(&b, `<line class="grid" x1="%d" x2="%.1f" y1="%.1f" y2="%.1f"/>`, padL, float64(padL)+pw, yy, yy)
		fmt.Fprintf(&b, `<text class="tick" x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`, padL-6, yy, esc(fmtTick(v, c.Percent)))
	}
	if c.YLabel != "" {
		fmt.Fprintf(&b, `<text class="axis-label" transform="translate(14 %.1f) rotate(-90)" text-anchor="middle">%s</text>`, float64(padT)+ph/2, esc(c.YLabel))
	}
	b.WriteString(`</g>`)
	if c.YMin < 0 && c.YMax > 0 {
		fmt.Fprintf(&b, `<line class="zero" x1="%d" x2="%.1f" y1="%.1f" y2="%.1f"/>`, padL, float64(padL)+pw, y(0), y(0))
	}
	// X axis.
	b.WriteString(`<g class="axis x-axis">`)
	fmt.Fprintf(&b, `<line class="axis-line" x1="%d" x2="%.1f" y1="%.1f" y2="%.1f"/>`, padL, float64(padL)+pw, float64(padT)+ph, float64(padT)+ph)
	fmt.Fprintf(&b, `<line class="axis-line" x1="%d" x2="%d" y1="%d" y2="%.1f"/>`, padL, padL, padT, float64(padT)+ph)
	ticks, format := timeTicks(c.XMin, c.XMax, int(pw/80))
	for _, t := range ticks {
		xx := x(t)
		fmt.Fprintf(&b, `<line class="grid vgrid" x1="%.1f" x2="%.1f" y1="%d" y2="%.1f"/>`, xx, xx, padT, float64(padT)+ph)
		fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, xx, float64(padT)+ph+16, esc(t.UTC().Format(format)))
	}
	fmt.Fprintf(&b, `<text class="axis-note" x="%.1f" y="%d" text-anchor="end">UTC</text>`, float64(padL)+pw+padR-4, c.H-4)
	b.WriteString(`</g>`)
	// Thresholds.
	for _, h := range c.HLines {
		col := h.Color
		col = cmp.Or(col, "#d62728")
		yy := y(h.Y)
		fmt.Fprintf(&b, `<line class="threshold" data-threshold="%s" x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s"/>`,
			esc(h.Name), padL, float64(padL)+pw, yy, yy, col)
		fmt.Fprintf(&b, `<text class="threshold-label" x="%.1f" y="%.1f" fill="%s" dominant-baseline="middle">%s</text>`, float64(padL)+pw+4, yy, col, esc(h.Label))
	}
	// Series.
	if n == 0 {
		msg := c.Empty
		msg = cmp.Or(msg, "no data in this range")
		fmt.Fprintf(&b, `<text class="empty-note" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, float64(padL)+pw/2, float64(padT)+ph/2, esc(msg))
	}
	for i, s := range c.Series {
		col := s.Color
		col = cmp.Or(col, colorAt(i))
		pts := append([]chartPoint(nil), s.Points...)
		sort.SliceStable(pts, func(i, j int) bool { return pts[i].X.Before(pts[j].X) })
		var d strings.Builder
		for j, p := range pts {
			cmd := "L"
			if j == 0 || (c.Step > 0 && p.X.Sub(pts[j-1].X) > c.Step*3/2) {
				cmd = "M"
			}
			fmt.Fprintf(&d, "%s%.1f %.1f ", cmd, x(p.X), y(p.Y))
		}
		fmt.Fprintf(&b, `<g class="series-group" data-series="%s">`, esc(s.Name))
		fmt.Fprintf(&b, `<path class="series" data-series="%s" d="%s" stroke="%s" fill="none"/>`, esc(s.Name), strings.TrimSpace(d.String()), col)
		for j, p := range pts {
			// Small dots on dense series; isolated points (no neighbor
			// within a bucket) stay visible.
			r := 2.4
			if len(pts) > 60 {
				r = 1.5
				isolated := (j == 0 || (c.Step > 0 && p.X.Sub(pts[j-1].X) > c.Step*3/2)) &&
					(j == len(pts)-1 || (c.Step > 0 && pts[j+1].X.Sub(p.X) > c.Step*3/2))
				if isolated {
					r = 2.4
				}
			}
			fmt.Fprintf(&b, `<circle class="pt" cx="%.1f" cy="%.1f" r="%.1f" fill="%s"><title>%s</title></circle>`, x(p.X), y(p.Y), r, col, esc(p.Tip))
		}
		b.WriteString(`</g>`)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // every text node is escaped above
}

// barChart is a horizontal grouped bar chart: one row per category, one bar
// per group.
type barChart struct {
	ID         string
	Title      string
	W          int
	Categories []string
	Groups     []barGroup
	Max        float64
	Percent    bool
	VLines     []hline // vertical threshold lines at X = Y value
	XLabel     string
}

type barGroup struct {
	Name   string
	Color  string
	Values []float64
	Tips   []string
}

func (c barChart) render() template.HTML {
	c.W = cmp.Or(c.W, 1200)
	const left, right, top, bottom, bar, gap = 235, 40, 22, 36, 12, 10
	rowH := float64(len(c.Groups)*bar + gap)
	h := top + bottom + int(math.Ceil(rowH*float64(max(len(c.Categories), 1))))
	pw := float64(c.W - left - right)
	if c.Max <= 0 {
		c.Max = 1
	}
	x := func(v float64) float64 { return float64(left) + pw*math.Max(0, math.Min(v, c.Max))/c.Max }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart bar-chart" id="%s" viewBox="0 0 %d %d" width="100%%" role="img" aria-label="%s">`, esc(c.ID), c.W, h, esc(c.Title))
	base := float64(top) + rowH*float64(len(c.Categories))
	for _, v := range niceTicks(0, c.Max, 5) {
		fmt.Fprintf(&b, `<line class="grid" x1="%.1f" x2="%.1f" y1="%d" y2="%.1f"/>`, x(v), x(v), top, base)
		fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x(v), base+16, esc(fmtTick(v, c.Percent)))
	}
	if c.XLabel != "" {
		fmt.Fprintf(&b, `<text class="axis-label" x="%.1f" y="%d" text-anchor="middle">%s</text>`, float64(left)+pw/2, h-2, esc(c.XLabel))
	}
	fmt.Fprintf(&b, `<line class="axis-line" x1="%d" x2="%d" y1="%d" y2="%.1f"/>`, left, left, top, base)
	for i, cat := range c.Categories {
		y0 := float64(top) + rowH*float64(i) + gap/2
		// Cut to the label column (a long capability name would leave the
		// chart); the whole name is the tooltip.
		fmt.Fprintf(&b, `<g class="bar-label"><title>%s</title><text class="cat" x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text></g>`,
			esc(cat), left-8, y0+float64(len(c.Groups)*bar)/2, esc(fitText(cat, left-12, catFont)))
		for g, grp := range c.Groups {
			v := 0.0
			if i < len(grp.Values) {
				v = grp.Values[i]
			}
			tip := ""
			if i < len(grp.Tips) {
				tip = grp.Tips[i]
			}
			col := grp.Color
			col = cmp.Or(col, colorAt(g))
			fmt.Fprintf(&b, `<rect class="bar" data-group="%s" data-category="%s" x="%d" y="%.1f" width="%.1f" height="%d" fill="%s"><title>%s</title></rect>`,
				esc(grp.Name), esc(cat), left, y0+float64(g*bar), math.Max(x(v)-float64(left), 0.5), bar-2, col, esc(tip))
			fmt.Fprintf(&b, `<text class="bar-value" x="%.1f" y="%.1f" dominant-baseline="middle">%s</text>`, x(v)+4, y0+float64(g*bar)+float64(bar-2)/2, esc(fmtTick(v, c.Percent)))
		}
	}
	for _, l := range c.VLines {
		col := l.Color
		col = cmp.Or(col, "#d62728")
		fmt.Fprintf(&b, `<line class="threshold" data-threshold="%s" x1="%.1f" x2="%.1f" y1="%d" y2="%.1f" stroke="%s"/>`, esc(l.Name), x(l.Y), x(l.Y), top, base, col)
		fmt.Fprintf(&b, `<text class="threshold-label" x="%.1f" y="%d" fill="%s" text-anchor="middle">%s</text>`, x(l.Y), top-8, col, esc(l.Label))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // escaped
}

// timelineChart draws events on rows over time.
type timelineChart struct {
	ID         string
	Title      string
	W          int
	XMin, XMax time.Time
	Rows       []timelineRow
	Events     []timelineEvent
}

// timelineRow is a row's label: Label (the capability) and, below it in
// smaller type, Sub (the cohort). Each is cut with "…" to fit the label
// column; the whole text is the row's tooltip.
type timelineRow struct {
	Label, Sub string
}

type timelineEvent struct {
	Row  int
	At   time.Time
	Kind string
	Tip  string
	Href string
}

// eventColors are the trigger event kinds' colors (legend in the page).
var eventColors = map[string]string{"fired": "#2ca02c", "deselected": "#d62728", "reselected": "#ff7f0e", "rearmed": "#1f77b4"}

// Font sizes of the charts' category labels (style.css: .cat, .cat-sub).
const (
	catFont    = 12.0
	catSubFont = 10.5
)

// emWidth is a character's advance in em in DejaVu Sans, the widest of the
// stylesheet's fonts and what system-ui is on Debian, so that a label
// measured to fit does fit (with a 5 % margin in textWidth). Characters not
// listed count as 1 em.
func emWidth(r rune) float64 {
	const lower = "abcdefghijklmnopqrstuvwxyz"
	widths := [...]float64{0.613, 0.635, 0.550, 0.635, 0.615, 0.352, 0.635, 0.634, 0.278, 0.278, 0.579, 0.278, 0.974,
		0.634, 0.612, 0.635, 0.635, 0.411, 0.521, 0.392, 0.634, 0.592, 0.818, 0.592, 0.592, 0.525}
	switch {
	case r >= 'a' && r <= 'z':
		return widths[strings.IndexRune(lower, r)]
	case r >= '0' && r <= '9':
		return 0.636
	case r >= 'A' && r <= 'Z':
		return 0.79
	}
	switch r {
	case ' ', '.', ',', '·', ':', ';', '/', '|', '(', ')', '[', ']', '\'', '!':
		return 0.40
	case '-', '_', '…':
		return 0.50
	}
	return 1
}

// textWidth is an upper bound of s's width, in viewBox units, at size.
func textWidth(s string, size float64) float64 {
	w := 0.0
	for _, r := range s {
		w += emWidth(r)
	}
	return w * size * 1.05
}

// fitText cuts s to at most width viewBox units at font size size, marking
// a cut with "…" (the whole text goes into the element's tooltip).
func fitText(s string, width, size float64) string {
	if textWidth(s, size) <= width {
		return s
	}
	r := []rune(s)
	for n := len(r) - 1; n > 0; n-- {
		cut := strings.TrimRight(string(r[:n]), " ·/-_") + "…"
		if textWidth(cut, size) <= width {
			return cut
		}
	}
	return "…"
}

func (c timelineChart) render() template.HTML {
	c.W = cmp.Or(c.W, 1200)
	const right, top, bottom = 24, 10, 34
	// The label column fits the longest label, within [160, W/3]; longer
	// labels are cut (fitText), so no text leaves the chart.
	need, subs := 0.0, false
	for _, r := range c.Rows {
		need = math.Max(need, math.Max(textWidth(r.Label, catFont), textWidth(r.Sub, catSubFont)))
		subs = subs || r.Sub != ""
	}
	left := int(math.Min(math.Max(need+16, 160), float64(c.W)/3))
	rowH := 26
	if subs {
		rowH = 36
	}
	h := top + bottom + rowH*max(len(c.Rows), 1)
	pw := float64(c.W - left - right)
	if !c.XMax.After(c.XMin) {
		c.XMax = c.XMin.Add(time.Hour)
	}
	span := c.XMax.Sub(c.XMin).Seconds()
	x := func(t time.Time) float64 { return float64(left) + pw*t.Sub(c.XMin).Seconds()/span }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart timeline-chart" id="%s" viewBox="0 0 %d %d" width="100%%" role="img" aria-label="%s" data-label-width="%d">`, esc(c.ID), c.W, h, esc(c.Title), left)
	base := float64(top + rowH*len(c.Rows))
	ticks, format := timeTicks(c.XMin, c.XMax, int(pw/110))
	for _, t := range ticks {
		fmt.Fprintf(&b, `<line class="grid vgrid" x1="%.1f" x2="%.1f" y1="%d" y2="%.1f"/>`, x(t), x(t), top, base)
		fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x(t), base+16, esc(t.UTC().Format(format)))
	}
	fmt.Fprintf(&b, `<text class="axis-note" x="%d" y="%d" text-anchor="end">UTC</text>`, c.W-4, h-4)
	avail := float64(left - 12)
	for i, r := range c.Rows {
		yy := float64(top + rowH*i + rowH/2)
		full := r.Label
		if r.Sub != "" {
			full = r.Sub + " · " + r.Label
		}
		fmt.Fprintf(&b, `<line class="grid" x1="%d" x2="%.1f" y1="%.1f" y2="%.1f"/>`, left, float64(left)+pw, yy, yy)
		ly := yy
		if r.Sub != "" {
			ly = yy - 6
		}
		fmt.Fprintf(&b, `<g class="row-label"><title>%s</title>`, esc(full))
		fmt.Fprintf(&b, `<text class="cat" x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`, left-8, ly, esc(fitText(r.Label, avail, catFont)))
		if r.Sub != "" {
			fmt.Fprintf(&b, `<text class="cat-sub" x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`, left-8, yy+8, esc(fitText(r.Sub, avail, catSubFont)))
		}
		b.WriteString(`</g>`)
	}
	for _, e := range c.Events {
		yy := float64(top + rowH*e.Row + rowH/2)
		col := eventColors[e.Kind]
		col = cmp.Or(col, "#7f7f7f")
		xx := x(e.At)
		if e.Href != "" {
			fmt.Fprintf(&b, `<a href="%s">`, esc(e.Href))
		}
		switch e.Kind {
		case "fired":
			fmt.Fprintf(&b, `<circle class="event" data-event="%s" cx="%.1f" cy="%.1f" r="7" fill="%s"><title>%s</title></circle>`, esc(e.Kind), xx, yy, col, esc(e.Tip))
		case "deselected":
			fmt.Fprintf(&b, `<rect class="event" data-event="%s" x="%.1f" y="%.1f" width="12" height="12" fill="%s"><title>%s</title></rect>`, esc(e.Kind), xx-6, yy-6, col, esc(e.Tip))
		default:
			fmt.Fprintf(&b, `<path class="event" data-event="%s" d="M%.1f %.1f L%.1f %.1f L%.1f %.1f L%.1f %.1f Z" fill="%s"><title>%s</title></path>`,
				esc(e.Kind), xx, yy-7, xx+7, yy, xx, yy+7, xx-7, yy, col, esc(e.Tip))
		}
		if e.Href != "" {
			b.WriteString(`</a>`)
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // escaped
}

// niceTicks returns about n round values covering [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	if hi <= lo || n < 1 {
		return []float64{lo}
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for v := math.Ceil(lo/step-1e-9) * step; v <= hi+step*1e-9; v += step {
		out = append(out, math.Round(v/step)*step)
	}
	return out
}

func fmtTick(v float64, percent bool) string {
	if math.Abs(v) < 1e-9 {
		v = 0 // no "-0%"
	}
	if percent {
		return fmt.Sprintf("%.0f%%", v*100)
	}
	return fmt.Sprintf("%.2f", v)
}

// timeTicks picks round tick times (UTC) between lo and hi, at most about
// maxTicks of them, and the layout to print them with.
func timeTicks(lo, hi time.Time, maxTicks int) ([]time.Time, string) {
	maxTicks = max(maxTicks, 2)
	steps := []time.Duration{time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
		48 * time.Hour, 7 * 24 * time.Hour, 14 * 24 * time.Hour, 28 * 24 * time.Hour, 91 * 24 * time.Hour}
	span := hi.Sub(lo)
	step := steps[len(steps)-1]
	for _, s := range steps {
		if span/s <= time.Duration(maxTicks) {
			step = s
			break
		}
	}
	format := "Jan 2"
	if step < 24*time.Hour {
		format = "Jan 2 15:04"
	}
	var start time.Time
	if step >= 7*24*time.Hour {
		// Align to Mondays.
		d := lo.UTC().Truncate(24 * time.Hour)
		for d.Weekday() != time.Monday {
			d = d.Add(24 * time.Hour)
		}
		start = d
	} else {
		start = lo.UTC().Truncate(step)
		if start.Before(lo) {
			start = start.Add(step)
		}
	}
	var out []time.Time
	for t := start; !t.After(hi); t = t.Add(step) {
		if !t.Before(lo) {
			out = append(out, t)
		}
	}
	return out, format
}
