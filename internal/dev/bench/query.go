package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/dashboard"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/verify"
)

// QueryOptions configure `trace bench query`.
type QueryOptions struct {
	ClickHouse string // host:port, native protocol
	Database   string // scratch database; with several sizes, one per size: <Database>_<size>
	Reuse      bool   // a size's database that already holds its load is timed as it is
	NoCheck    bool   // skip the exactness check (a re-run of data an earlier run checked)
	Sizes      []int  // rollouts per size, loaded cumulatively
	Reps       int    // repetitions per endpoint
	Days       int    // history spread
	Keep       bool
	// Eval is the analyzer's configuration (the config's defaults: the
	// rules labeler's one run), for the evaluator and the dashboard alike.
	Eval analyzer.EvalConfig
	// Verify is the closed loop's configuration (the guard's sample limit
	// and looks).
	Verify verify.Config
	Out    io.Writer
	Log    *slog.Logger
	// Report runs `trace report` (its buildReport) against st: from the
	// evaluator's stored evaluations, or fresh.
	Report func(ctx context.Context, st *sink.Store, now time.Time, fresh bool) ([]ReportCap, error)
}

// ReportCap is one capability row of `trace report`.
type ReportCap struct {
	Environment, AgentVersion string
	DictionaryVersion         uint32
	Capability                string
	Cov, Delta                float64
	RunsPassed                int
	Decision                  string // selected, rejected, undecided
	Rollouts, Failures        int
}

// QueryResult is one endpoint at one size.
type QueryResult struct {
	Size           int
	Endpoint       string
	New, Old       []time.Duration // sorted
	NewErr, OldErr string
	NoOld          bool
}

// add records one timing, the old way's when old.
func (r *QueryResult) add(old bool, d time.Duration, err error) {
	times, msg := &r.New, &r.NewErr
	if old {
		times, msg = &r.Old, &r.OldErr
	}
	*times = append(*times, d)
	if err != nil {
		*msg = err.Error()
	}
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(ds)))) - 1
	return ds[max(i, 0)]
}

// rawStore is the dashboard's store the old way: every statement as it was
// before the rollup (sink.DashboardQuery.Raw).
type rawStore struct{ *sink.Store }

func (r rawStore) QueryDashboard(ctx context.Context, q string, daily bool, args ...any) (driver.Rows, error) {
	return r.Store.QueryDashboardRaw(ctx, q, daily, args...)
}

// WindowInfoMulti and WindowCountsMulti read the decision windows (fresh=1)
// from the labels alone, as before their rollup.
func (r rawStore) WindowInfoMulti(ctx context.Context, spec sink.MultiSpec) (map[sink.Cohort]sink.WindowInfo, error) {
	spec.Raw = true
	return r.Store.WindowInfoMulti(ctx, spec)
}

func (r rawStore) WindowCountsMulti(ctx context.Context, spec sink.MultiSpec) (map[sink.Cohort][]sink.RunCounts, error) {
	spec.Raw = true
	return r.Store.WindowCountsMulti(ctx, spec)
}

// heldPublisher is the benchmark's publisher: it has no NATS, so the
// synthesis requests a firing capability makes are counted and not sent
// (the run prints how many).
type heldPublisher struct{ n *atomic.Int64 }

func (p heldPublisher) PublishSynthesis(context.Context, *schemas.SynthesisRequest) (analyzer.PublishResult, error) {
	p.n.Add(1)
	return analyzer.PublishResult{}, nil
}

// endpoint is one timed request.
type endpoint struct{ name, path string }

func queryEndpoints() []endpoint {
	env, av, capName := sink.BenchEnvironments[0], sink.BenchAgentVersions[1], sink.BenchPlanted
	c := "env=" + env + "&agent_version=" + av + "&dict=1"
	return []endpoint{
		{"overview API, 24 h", "/api/overview?" + c + "&hours=24"},
		{"overview API, 24 h, fresh decisions", "/api/overview?" + c + "&hours=24&fresh=1"},
		{"overview API, 30 d", "/api/overview?" + c + "&hours=720"},
		{"overview API, 30 d daily", "/api/overview?" + c + "&hours=720&bucket=day"},
		{"overview API, all", "/api/overview?" + c + "&hours=all&bucket=day"},
		{"capability API, 30 d", "/api/capability?" + c + "&name=" + capName + "&hours=720"},
		{"capability API, all", "/api/capability?" + c + "&name=" + capName + "&hours=all&bucket=day"},
		{"trends API, 8 weeks", "/api/trends?env=" + env + "&weeks=8"},
		{"trends API, 104 weeks (all)", "/api/trends?env=" + env + "&weeks=104"},
		{"overview page", "/?" + c + "&hours=168"},
		{"trends page", "/trends?env=" + env + "&weeks=8"},
	}
}

func timeHandler(ctx context.Context, h http.Handler, path string) (time.Duration, error) {
	req := httptest.NewRequest(http.MethodGet, path, nil).WithContext(ctx)
	rec := httptest.NewRecorder()
	start := time.Now()
	h.ServeHTTP(rec, req)
	d := time.Since(start)
	if rec.Code != http.StatusOK {
		return d, fmt.Errorf("HTTP %d: %.200s", rec.Code, rec.Body.String())
	}
	return d, nil
}

// RunQuery loads each size, rolls it up, checks exactness on a sample and
// times every endpoint the new way and the old way.
func RunQuery(ctx context.Context, opt QueryOptions) ([]QueryResult, error) {
	if opt.Reps <= 0 {
		opt.Reps = 5
	}
	if opt.Days <= 0 {
		opt.Days = 90
	}
	if opt.Database == "" {
		opt.Database = "trace_bench_query"
	}
	log := opt.Log
	if log == nil {
		log = slog.Default()
	}
	out := opt.Out
	now := time.Now()
	from := now.Add(-time.Duration(opt.Days) * 24 * time.Hour)
	span := now.Sub(from)
	var results []QueryResult
	for _, size := range opt.Sizes {
		// Each size is a database of its own with size rollouts over the
		// same span; with Reuse, one a run before loaded (and kept) is
		// timed as it is.
		db := opt.Database
		if len(opt.Sizes) > 1 {
			db += "_" + sizeName(size)
		}
		st, loaded, err := sizeStore(ctx, opt, db, size, log)
		if err != nil {
			return results, err
		}
		defer st.Close()
		hNew := dashboard.New(dashboard.Deps{Store: st, Log: log, Eval: opt.Eval})
		hOld := dashboard.New(dashboard.Deps{Store: rawStore{st}, Log: log, Eval: opt.Eval})
		start := time.Now()
		if loaded {
			fmt.Fprintf(out, "size %d: reusing database %s (loaded by an earlier run)\n", size, db)
			// Its "now" was the earlier run's: the history ends then.
		} else if err := st.BenchLoad(ctx, size, from, span, 0, func(done int) {
			fmt.Fprintf(out, "  loaded %d / %d rollouts (%v)\n", done, size, time.Since(start).Round(time.Second))
		}); err != nil {
			return results, err
		}
		load := time.Since(start)
		_, labels, _ := st.CountLabels(ctx)
		start = time.Now()
		rs, err := st.RollupAll(ctx, time.Now().Add(sink.RollupGrace+time.Second))
		if err != nil {
			return results, err
		}
		roll := time.Since(start)
		fmt.Fprintf(out, "size %d: %d rollouts, %d labels (simulated, bulk-loaded in %v); rollup of %d hours in %v (%d statements)\n",
			size, size, labels, load.Round(time.Second), rs.Hours, roll.Round(time.Millisecond), rs.Statements)
		// Exactness on a sample: every cohort, ranges 24 h, 30 d, all,
		// hourly and daily, rollup-backed statements against the raw ones.
		// The check is not timed: the raw statements run without the
		// dashboard's time limit (at 10M they take longer than 10 s).
		if opt.NoCheck {
			fmt.Fprintf(out, "size %d: exactness: not checked (--no-check)\n", size)
		} else {
			chk, err := sink.Open(ctx, sink.Config{Addr: []string{opt.ClickHouse}, Database: db, QueryTimeout: time.Hour, QueryMaxMemory: 8 << 30}, log)
			if err != nil {
				return results, err
			}
			n, err := checkSample(ctx, chk, now)
			if err == nil {
				var w int
				w, err = checkWindows(ctx, chk, opt.Eval)
				n += w
			}
			chk.Close()
			if err != nil {
				return results, fmt.Errorf("size %d: exactness: %w", size, err)
			}
			fmt.Fprintf(out, "size %d: exactness: %d statement results compared with the raw computation, all equal\n", size, n)
		}
		// One evaluation of every cohort, as the analyze role's evaluator
		// makes every 10 s: the pages show its stored decisions.
		held := heldPublisher{new(atomic.Int64)}
		ev := analyzer.NewEvaluator(opt.Eval, st, held, analyzer.NewRegistry(), log, nil)
		if cs, err := st.Cohorts(ctx, time.Time{}); err != nil {
			return results, err
		} else if err := ev.Evaluate(ctx, cs...); err != nil {
			return results, fmt.Errorf("size %d: evaluation: %w", size, err)
		} else {
			fmt.Fprintf(out, "size %d: evaluated %d cohorts (%d synthesis requests held: the benchmark has no NATS)\n", size, len(cs), held.n.Load())
		}
		if opt.Report != nil {
			n, err := sameAsReport(ctx, hNew, opt, st)
			if err != nil {
				return results, fmt.Errorf("size %d: dashboard vs report: %w", size, err)
			}
			fmt.Fprintf(out, "size %d: the overview's decisions equal trace report's: %d capabilities, stored and fresh\n", size, n)
		}
		// Every endpoint the new way, then every endpoint the old way: an
		// old-way statement (at 10M it reads gigabytes up to the memory
		// limit) evicts the server's caches, and a deployment runs one
		// way or the other, not both in turn.
		eps := queryEndpoints()
		rows := make([]QueryResult, len(eps))
		for pass, h := range []http.Handler{hNew, hOld} {
			for i, ep := range eps {
				r := &rows[i]
				r.Size, r.Endpoint = size, ep.name
				for range opt.Reps {
					d, err := timeHandler(ctx, h, ep.path)
					r.add(pass == 1, d, err)
				}
			}
		}
		for _, r := range rows {
			slices.Sort(r.New)
			slices.Sort(r.Old)
			results = append(results, r)
			fmt.Fprintf(out, "  %-36s new p50 %v, old p50 %v\n", r.Endpoint, pct(r.New, .5).Round(time.Millisecond), pct(r.Old, .5).Round(time.Millisecond))
			for _, e := range []string{r.NewErr, r.OldErr} {
				if e != "" {
					fmt.Fprintf(out, "    error: %.300s\n", e)
				}
			}
		}
		if opt.Report != nil {
			for _, fresh := range []bool{false, true} {
				r := QueryResult{Size: size, Endpoint: "trace report", NoOld: true}
				if fresh {
					r.Endpoint += " --fresh"
				}
				for range opt.Reps {
					s := time.Now()
					if _, err := opt.Report(ctx, st, time.Now(), fresh); err != nil {
						r.NewErr = err.Error()
					}
					r.New = append(r.New, time.Since(s))
				}
				slices.Sort(r.New)
				results = append(results, r)
			}
		}
		r := QueryResult{Size: size, Endpoint: "evaluator tick (6 cohorts, 24 h)", NoOld: true}
		cohorts, err := st.Cohorts(ctx, time.Time{})
		if err != nil {
			return results, err
		}
		for range opt.Reps {
			s := time.Now()
			if err := ev.Evaluate(ctx, cohorts...); err != nil {
				r.NewErr = err.Error()
			}
			r.New = append(r.New, time.Since(s))
		}
		slices.Sort(r.New)
		results = append(results, r)
		g, err := timeGuard(ctx, opt, st, size, log)
		if err != nil {
			return results, err
		}
		results = append(results, g)
		if !opt.Keep {
			if err := st.DropDatabase(ctx, db); err != nil {
				return results, err
			}
		}
	}
	return results, nil
}

// loopBefore is the guard's source the old way: its samples read through
// the statement before the routing subquery was filtered by environment.
type loopBefore struct{ *sink.Store }

func (l loopBefore) LoopLabels(ctx context.Context, spec sink.LoopSample) ([]sink.RolloutLabels, error) {
	return l.Store.LoopLabelsBefore(ctx, spec)
}

// timeGuard times the reads of one guard tick (verify's Check of the
// active adapters: both samples, the looks, the watch block) over the bulk
// load's adapter, the new way and then the old way, prints what the first
// check found, and fails when the two ways' samples differ.
func timeGuard(ctx context.Context, opt QueryOptions, st *sink.Store, size int, log *slog.Logger) (QueryResult, error) {
	r := QueryResult{Size: size, Endpoint: "guard tick (1 active adapter)"}
	var first [2]string // each way's samples and decisions (the watch block's, which moves with the clock, left out)
	for pass, src := range []verify.Source{st, loopBefore{st}} {
		c := verify.New(opt.Verify, src, nil, nil, log)
		for i := range opt.Reps {
			s := time.Now()
			checks, err := c.Check(ctx, "active")
			d := time.Since(s)
			if err == nil && len(checks) != 1 {
				err = fmt.Errorf("%d active adapters checked, want the bulk load's %s (a database loaded before the load registered it?)", len(checks), sink.BenchAdapter)
			}
			r.add(pass == 1, d, err)
			if err == nil && i == 0 {
				a := checks[0]
				first[pass] = fmt.Sprintf("before %d rollouts, after %d (routed through their conversations' decisions), verdict %s; guard: %s",
					a.Comparison.Before.Rollouts, a.Comparison.After.Rollouts, a.Comparison.Verdict, a.Guard.Reason)
				if pass == 0 {
					fmt.Fprintf(opt.Out, "size %d: guard of %s: %s\n", size, a.Adapter, first[0])
				}
			}
		}
	}
	if first[0] != first[1] && r.NewErr == "" && r.OldErr == "" {
		return r, fmt.Errorf("size %d: the guard's samples differ between the statements:\n  new: %s\n  old: %s", size, first[0], first[1])
	}
	slices.Sort(r.New)
	slices.Sort(r.Old)
	fmt.Fprintf(opt.Out, "  %-36s new p50 %v, old p50 %v\n", r.Endpoint, pct(r.New, .5).Round(time.Millisecond), pct(r.Old, .5).Round(time.Millisecond))
	return r, nil
}

// sameAsReport compares every labeled cohort's decision on the overview
// API with trace report's rows, from the stored evaluations and fresh.
func sameAsReport(ctx context.Context, h http.Handler, opt QueryOptions, st *sink.Store) (int, error) {
	n := 0
	for _, fresh := range []bool{false, true} {
		rows, err := opt.Report(ctx, st, time.Now(), fresh)
		if err != nil {
			return n, err
		}
		byCohort := map[string][]ReportCap{}
		var keys []string
		for _, r := range rows {
			if r.Capability == "" {
				continue
			}
			k := fmt.Sprintf("env=%s&agent_version=%s&dict=%d", url.QueryEscape(r.Environment), url.QueryEscape(r.AgentVersion), r.DictionaryVersion)
			if byCohort[k] == nil {
				keys = append(keys, k)
			}
			byCohort[k] = append(byCohort[k], r)
		}
		if len(keys) == 0 {
			return n, errors.New("trace report has no capability rows")
		}
		for _, k := range sampleCohorts(keys) {
			path := "/api/overview?" + k + "&hours=24"
			if fresh {
				path += "&fresh=1"
			}
			var resp dashboard.OverviewResponse
			if err := getJSON(ctx, h, path, &resp); err != nil {
				return n, err
			}
			if resp.Decision == nil {
				return n, fmt.Errorf("%s: no decision", path)
			}
			want := map[string]ReportCap{}
			for _, r := range byCohort[k] {
				want[r.Capability] = r
			}
			if len(resp.Decision.Capabilities) != len(want) {
				return n, fmt.Errorf("%s: %d capabilities, trace report %d", path, len(resp.Decision.Capabilities), len(want))
			}
			for _, c := range resp.Decision.Capabilities {
				r, ok := want[c.Name]
				dec := map[string]string{dashboard.DecisionSelected: "selected", dashboard.DecisionNotSelected: "rejected", dashboard.DecisionUndecided: "undecided"}[c.Decision]
				if !ok || math.Abs(r.Cov-c.MeanCov) > 1e-9 || math.Abs(r.Delta-c.MeanDelta) > 1e-9 || r.RunsPassed != c.RunsPassed || r.Decision != dec ||
					r.Rollouts != resp.Decision.Window.Rollouts || r.Failures != resp.Decision.Window.Failures {
					return n, fmt.Errorf("%s: %s: overview %+v (window %+v), trace report %+v", path, c.Name, c, resp.Decision.Window, r)
				}
				n++
			}
		}
	}
	return n, nil
}

// sampleCohorts keeps the load's own cohorts and at most 25 others (a kept
// database may have thousands, left by the TriggerLatency benchmark): each
// is an overview request.
func sampleCohorts(keys []string) []string {
	var own, other []string
	for _, k := range keys {
		if slices.ContainsFunc(sink.BenchEnvironments, func(e string) bool { return strings.HasPrefix(k, "env="+url.QueryEscape(e)+"&") }) {
			own = append(own, k)
		} else if len(other) < 25 {
			other = append(other, k)
		}
	}
	return append(own, other...)
}

func getJSON(ctx context.Context, h http.Handler, path string, v any) error {
	req := httptest.NewRequest(http.MethodGet, path, nil).WithContext(ctx)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d: %.200s", path, rec.Code, rec.Body.String())
	}
	return json.Unmarshal(rec.Body.Bytes(), v)
}

// sizeStore opens db migrated: with Reuse, as it is when it already holds
// size simulated rollouts (loaded true); otherwise dropped and created.
func sizeStore(ctx context.Context, opt QueryOptions, db string, size int, log *slog.Logger) (*sink.Store, bool, error) {
	cfg := sink.Config{Addr: []string{opt.ClickHouse}, Database: db}
	st, err := sink.Open(ctx, cfg, log)
	if err != nil {
		return nil, false, err
	}
	if opt.Reuse {
		if err := st.Migrate(ctx); err != nil {
			st.Close()
			return nil, false, err
		}
		if n, err := st.CountRollouts(ctx); err == nil && n == uint64(size) {
			return st, true, nil
		}
	}
	if err := st.DropDatabase(ctx, db); err != nil {
		st.Close()
		return nil, false, err
	}
	st.Close()
	if st, err = sink.Open(ctx, cfg, log); err != nil {
		return nil, false, err
	}
	if err := st.Migrate(ctx); err != nil {
		st.Close()
		return nil, false, err
	}
	return st, false, nil
}

// checkSample compares the rollup-backed dashboard statements with the raw
// ones for every cohort of the load over several ranges.
func checkSample(ctx context.Context, st *sink.Store, now time.Time) (int, error) {
	u := func(t time.Time) uint32 { return uint32(max(t.Unix(), 0)) }
	type c struct {
		q     string
		daily bool
		args  []any
	}
	var cs []c
	for _, env := range sink.BenchEnvironments {
		for _, since := range []time.Time{now.Add(-24 * time.Hour), now.Add(-30 * 24 * time.Hour), {}} {
			for _, daily := range []bool{false, true} {
				cs = append(cs, c{sink.QPassRateHourly, daily, []any{env, u(since)}})
				for _, av := range sink.BenchAgentVersions {
					cs = append(cs, c{sink.QCapabilityHourly, daily, []any{env, av, uint32(1), u(since)}})
				}
			}
			cs = append(cs, c{sink.QLackingWeekly, false, []any{env, u(since), u(now)}}, c{sink.QPassRateWeekly, false, []any{env, u(since), u(now)}})
		}
		for _, av := range sink.BenchAgentVersions {
			cs = append(cs, c{sink.QLackingWeekOverWeek, false, []any{u(now), env, av, u(now), u(now), uint32(10)}})
		}
	}
	cs = append(cs, c{sink.QRolloutCohorts, false, nil}, c{sink.QLabelCohorts, false, nil})
	for i, x := range cs {
		a, err := readRows(ctx, st.QueryDashboard, x.q, x.daily, x.args)
		if err != nil {
			return i, err
		}
		b, err := readRows(ctx, st.QueryDashboardRaw, x.q, x.daily, x.args)
		if err != nil {
			return i, err
		}
		if err := sameRows(a, b); err != nil {
			return i, fmt.Errorf("%.40q %v: %w", x.q, x.args, err)
		}
		if len(a) == 0 {
			return i, fmt.Errorf("%.40q %v: no rows: the sample does not exercise it", x.q, x.args)
		}
	}
	return len(cs), nil
}

// checkWindows compares the evaluator's decision windows read through the
// rollup with their raw computation, for every cohort of the load: the
// configured window and one of 7 days, both by event time (partial first
// and last hours).
func checkWindows(ctx context.Context, st *sink.Store, ev analyzer.EvalConfig) (int, error) {
	cohorts, err := st.Cohorts(ctx, time.Time{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, window := range []time.Duration{ev.Window, 7 * 24 * time.Hour} {
		spec, _, err := st.EventSpec(ctx, cohorts, window, ev.WindowRollouts, ev.N)
		if err != nil {
			return n, err
		}
		read := func(raw bool) (map[sink.Cohort]sink.WindowInfo, map[sink.Cohort][]sink.RunCounts, error) {
			spec.Raw = raw
			info, err := st.WindowInfoMulti(ctx, spec)
			if err != nil {
				return nil, nil, err
			}
			counts, err := st.WindowCountsMulti(ctx, spec)
			return info, counts, err
		}
		info, counts, err := read(false)
		if err != nil {
			return n, err
		}
		rawInfo, rawCounts, err := read(true)
		if err != nil {
			return n, err
		}
		if len(rawInfo) == 0 || !reflect.DeepEqual(info, rawInfo) || !reflect.DeepEqual(counts, rawCounts) {
			return n, fmt.Errorf("decision windows of %v over %d cohorts differ from the raw computation (or are empty)", window, len(cohorts))
		}
		n += 2
	}
	return n, nil
}

type queryFn func(ctx context.Context, q string, daily bool, args ...any) (driver.Rows, error)

func readRows(ctx context.Context, run queryFn, q string, daily bool, args []any) ([][]any, error) {
	rows, err := run(ctx, q, daily, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][]any
	types := rows.ColumnTypes()
	for rows.Next() {
		ptrs := make([]any, len(types))
		for i, ct := range types {
			ptrs[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		vals := make([]any, len(ptrs))
		for i, p := range ptrs {
			vals[i] = reflect.ValueOf(p).Elem().Interface()
		}
		out = append(out, vals)
	}
	return out, rows.Err()
}

func sameRows(a, b [][]any) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d rows vs %d raw", len(a), len(b))
	}
	for i := range a {
		for j := range a[i] {
			x, y := a[i][j], b[i][j]
			if fx, ok := x.(float64); ok {
				if fy, ok := y.(float64); ok && math.Abs(fx-fy) <= 1e-9*math.Max(1, math.Abs(fx)) {
					continue
				}
			}
			if fmt.Sprint(x) != fmt.Sprint(y) {
				return fmt.Errorf("row %d column %d: %v vs %v raw", i, j, x, y)
			}
		}
	}
	return nil
}

// QueryTable renders the results as a markdown table: p50 / p95 of the new
// way, of the old way, and the ratio of the p50s.
func QueryTable(rs []QueryResult) string {
	var b strings.Builder
	b.WriteString("| endpoint | rollouts | new p50 | new p95 | old p50 | old p95 | old/new (p50) |\n|---|---|---|---|---|---|---|\n")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }
	for _, r := range rs {
		newCol := ms(pct(r.New, .5)) + " | " + ms(pct(r.New, .95))
		if r.NewErr != "" {
			newCol = "error | " + shortErr(r.NewErr)
		}
		oldCol, ratio := "— | —", "—"
		if !r.NoOld {
			oldCol = ms(pct(r.Old, .5)) + " | " + ms(pct(r.Old, .95))
			if r.OldErr != "" {
				oldCol = "error | " + shortErr(r.OldErr)
			}
			if n := pct(r.New, .5); n > 0 && r.OldErr == "" && r.NewErr == "" {
				ratio = fmt.Sprintf("%.1f×", float64(pct(r.Old, .5))/float64(n))
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.Endpoint, sizeName(r.Size), newCol, oldCol, ratio)
	}
	return b.String()
}

// shortErr is an endpoint's error for the table: its HTTP status and what
// stopped it (the whole text is logged above the table).
func shortErr(e string) string {
	status, _, _ := strings.Cut(e, ":")
	switch {
	case strings.Contains(e, "memory"):
		return status + ", memory limit"
	case strings.Contains(e, "time"):
		return status + ", time limit"
	}
	return status
}

func sizeName(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}
