package sink_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// windowData is rollupData with a third run for most rollouts and some
// rollouts' labels incomplete, so that a window of N = 1, 2 or 3 runs
// selects different rollouts: run 2 is missing for every fourth rollout,
// and run 0 of cap_c for every seventh. late are the run-2 labels held back
// from the hour 05:00 after rollupBase (written later, into a rolled-up
// hour: those rollouts become complete for N = 3).
func windowData(n int) (rs []sink.RolloutRow, ls, late []sink.LabelRow) {
	rs, base := rollupData("w", n, rollupBase.Add(-6*24*time.Hour), 8*24*time.Hour)
	index := map[string]int{}
	for i, r := range rs {
		index[r.RolloutID] = i
	}
	for _, l := range base {
		i := index[l.RolloutID]
		if l.Capability == "cap_c" && l.Run == 0 && i%7 == 0 {
			continue
		}
		ls = append(ls, l)
		if l.Run != 1 || i%4 == 0 {
			continue
		}
		l3 := l
		l3.Run = 2
		if (i+len(l.Capability))%3 == 0 {
			l3.Label = schemas.LabelLacking
		}
		if d := l.TS.Sub(rollupBase); d >= 5*time.Hour && d < 6*time.Hour {
			late = append(late, l3)
		} else {
			ls = append(ls, l3)
		}
	}
	return rs, ls, late
}

// windowSpecs are the windows compared: by event time (partial first and
// last hours, an hour-aligned one, one inside a single hour) and by
// wall-clock bounds, for N = 1, 2 and 3.
func windowSpecs(t *testing.T, s *sink.Store) map[string]sink.MultiSpec {
	t.Helper()
	ctx := context.Background()
	cohorts := []sink.Cohort{{Environment: "env", AgentVersion: "v1", DictionaryVersion: 1},
		{Environment: "env", AgentVersion: "v2", DictionaryVersion: 1}, {Environment: "env", AgentVersion: "v2", DictionaryVersion: 2}}
	out := map[string]sink.MultiSpec{}
	for _, n := range []int{1, 2, 3} {
		ev, _, err := s.EventSpec(ctx, cohorts, 5*24*time.Hour+17*time.Minute+3*time.Second, 0, n)
		if err != nil {
			t.Fatal(err)
		}
		if len(ev.Ranges) != len(cohorts) {
			t.Fatalf("event spec: %d ranges", len(ev.Ranges))
		}
		out[fmt.Sprintf("event N=%d", n)] = ev
		out[fmt.Sprintf("ranges N=%d", n)] = sink.MultiSpec{Cohorts: cohorts, Runs: n, Ranges: map[sink.Cohort]sink.Range{
			cohorts[0]: {From: rollupBase.Add(-48 * time.Hour), To: rollupBase.Add(30*time.Hour - time.Second)},
			cohorts[1]: {From: rollupBase.Add(5*time.Hour + 10*time.Minute), To: rollupBase.Add(5*time.Hour + 50*time.Minute)},
			cohorts[2]: {From: rollupBase.Add(-3*time.Hour - 1), To: rollupBase.Add(7 * time.Hour)},
		}}
		for name, b := range map[string][2]time.Time{
			"since+until": {rollupBase.Add(-3*24*time.Hour + 29*time.Minute), rollupBase.Add(49 * time.Hour)},
			"since":       {rollupBase.Add(-time.Minute), {}},
			"until":       {{}, rollupBase.Add(6*time.Hour + 30*time.Second)},
			"all":         {},
		} {
			out[fmt.Sprintf("%s N=%d", name, n)] = sink.MultiSpec{Cohorts: cohorts, Runs: n, Since: b[0], Until: b[1]}
		}
	}
	return out
}

// windowResult is what the evaluator reads of a window.
type windowResult struct {
	Info   map[sink.Cohort]sink.WindowInfo
	Counts map[sink.Cohort][]sink.RunCounts
}

func readWindow(s *sink.Store, spec sink.MultiSpec) (windowResult, error) {
	ctx := context.Background()
	info, err := s.WindowInfoMulti(ctx, spec)
	if err != nil {
		return windowResult{}, err
	}
	counts, err := s.WindowCountsMulti(ctx, spec)
	return windowResult{info, counts}, err
}

// checkWindowsExact asserts that every window read through the rollup
// equals the raw computation, and returns the results. The windows are
// read side by side.
func checkWindowsExact(t *testing.T, s *sink.Store, step string) map[string]windowResult {
	t.Helper()
	specs := windowSpecs(t, s)
	type result struct {
		name     string
		got, raw windowResult
		err      error
	}
	results := make(chan result, len(specs))
	sem := make(chan struct{}, 6)
	for name, spec := range specs {
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			r := result{name: name}
			if r.got, r.err = readWindow(s, spec); r.err == nil {
				spec.Raw = true
				r.raw, r.err = readWindow(s, spec)
			}
			results <- r
		}()
	}
	got := map[string]windowResult{}
	for range specs {
		r := <-results
		if r.err != nil {
			t.Fatalf("%s: window %s: %v", step, r.name, r.err)
		}
		if !reflect.DeepEqual(r.got, r.raw) {
			t.Errorf("%s: window %s: rollup differs from the raw computation:\n rollup %+v\n    raw %+v", step, r.name, r.got, r.raw)
		}
		got[r.name] = r.got
	}
	// The data exercises completeness: fewer rollouts are complete for 3
	// runs than for 2, and some are.
	v1 := sink.Cohort{Environment: "env", AgentVersion: "v1", DictionaryVersion: 1}
	n2, n3 := got["all N=2"].Info[v1].Rollouts, got["all N=3"].Info[v1].Rollouts
	if n3 == 0 || n3 >= n2 || len(got["event N=3"].Counts[v1]) == 0 {
		t.Fatalf("%s: %d rollouts complete for 2 runs, %d for 3: the data does not exercise completeness", step, n2, n3)
	}
	return got
}

// TestWindowRollupExact: the decision windows (WindowInfoMulti,
// WindowCountsMulti) read through the rollup equal the raw computation for
// every kind of window and N — with nothing rolled up, everything rolled
// up, and after redelivered labels, late runs that complete rollouts of a
// rolled-up hour, a conflicting external relabel, late rollouts for a
// closed hour and a rollup crash before its commit (each checked before and
// after the rollup catches up).
func TestWindowRollupExact(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	rs, ls, late := windowData(900)
	if err := s.InsertRollouts(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertLabels(ctx, ls); err != nil {
		t.Fatal(err)
	}
	first := checkWindowsExact(t, s, "nothing rolled up")
	if _, err := s.RollupAll(ctx, rollupNow()); err != nil {
		t.Fatal(err)
	}
	if l, _ := stale(t, s); l != 0 {
		t.Fatalf("%d label hours stale after the rollup", l)
	}
	if got := checkWindowsExact(t, s, "all rolled up"); !reflect.DeepEqual(got, first) {
		t.Error("the rollup alone changed a window")
	}
	step := func(name string, rows []sink.LabelRow) map[string]windowResult {
		t.Helper()
		if rows != nil {
			if err := s.InsertLabels(ctx, rows); err != nil {
				t.Fatal(err)
			}
		}
		if l, _ := stale(t, s); l == 0 {
			t.Fatalf("%s: no label hour stale: the change is not seen", name)
		}
		checkWindowsExact(t, s, name+", not rolled up yet")
		if _, err := s.RollupAll(ctx, rollupNow()); err != nil {
			t.Fatal(err)
		}
		return checkWindowsExact(t, s, name+", rolled up again")
	}

	var again []sink.LabelRow
	for _, l := range ls {
		if d := l.TS.Sub(rollupBase); d >= 2*time.Hour && d < 3*time.Hour {
			again = append(again, l)
		}
	}
	if got := step("redelivered labels", again); !reflect.DeepEqual(got, first) {
		t.Error("redelivered labels changed a window")
	}
	// Late runs: rollouts of a rolled-up hour become complete for N = 3, so
	// the hour's rows of runs = 2 give way to rows of runs = 3. Reading both
	// would count those rollouts twice for N = 2.
	if len(late) == 0 {
		t.Fatal("no late runs in the data")
	}
	if got := step("late runs completing rollouts", late); reflect.DeepEqual(got["event N=3"], first["event N=3"]) {
		t.Error("late runs did not change the window of N = 3: the test does not exercise them")
	}
	relabelHour(t, s, ls)
	relabeled := step("conflicting external relabel", nil)
	if reflect.DeepEqual(relabeled["event N=2"], first["event N=2"]) {
		t.Error("the relabel did not change the window: the test does not exercise it")
	}
	lateR, lateL := rollupData("late", 30, rollupBase.Add(9*time.Hour), 50*time.Minute)
	if err := s.InsertRollouts(ctx, lateR); err != nil {
		t.Fatal(err)
	}
	step("late rollouts for a closed hour", lateL)

	conn := testenv.StoreConn(t, s)
	// A crash of the rollup between its inserts and its commit: the rows are
	// in the tables, rollup_hours and the watermark never heard of them.
	for _, q := range []string{"TRUNCATE TABLE rollup_hours", "TRUNCATE TABLE rollup_watermark"} {
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	step("rollup crashed before its commit", nil)

	// The windows really read the rollup: a forged row of a whole hour
	// inside every window shows.
	if err := conn.Exec(ctx, `INSERT INTO window_hourly (environment, agent_version, dictionary_version, capability, run, hour, runs, lf, pf, nf, lp, pp, np, lacking_first, version)
		SELECT environment, agent_version, dictionary_version, capability, run, hour, runs, lf + 1000, pf, nf, lp, pp, np, lacking_first, version + 1
		FROM window_hourly WHERE agent_version = 'v1' AND hour = ?`, rollupBase.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	spec := windowSpecs(t, s)["event N=2"]
	forged, err := readWindow(s, spec)
	spec.Raw = true
	raw, err2 := readWindow(s, spec)
	if err != nil || err2 != nil {
		t.Fatal(err, err2)
	}
	if reflect.DeepEqual(forged, raw) {
		t.Fatal("a forged window_hourly row did not change the window: the rollup is not read")
	}
}

// TestWindowStateAcrossProcesses: a window read counts a late label another
// process wrote into a rolled-up hour at once — the dashboard's statements
// may show it up to a second late, the decision windows never — and the
// Info and Counts reads of one evaluation, side by side, agree.
func TestWindowStateAcrossProcesses(t *testing.T) {
	ch := testenv.ClickHouse(t)
	writer, reader := openStoreOn(t, ch), openStoreOn(t, ch)
	rs, ls, _ := windowData(300)
	insertRolledUp(t, writer, rs, ls)
	spec := sink.MultiSpec{Cohorts: []sink.Cohort{{Environment: "env", AgentVersion: "v1", DictionaryVersion: 1}}, Runs: 2,
		Since: rollupBase.Add(-24 * time.Hour), Until: rollupBase.Add(24 * time.Hour)}
	// The reader's cached state is read now, before the relabel.
	c := rollupCase{"QCapabilityHourly v1", sink.QCapabilityHourly, false, []any{"env", "v1", uint32(1), uint32(0)}}
	readAll(t, reader, false, c)
	before, err := readWindow(reader, spec)
	if err != nil {
		t.Fatal(err)
	}
	relabelHour(t, writer, ls) // another process, a rolled-up hour
	raw := spec
	raw.Raw = true
	want, err := readWindow(reader, raw)
	if err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(before, want) {
		t.Fatal("the relabel changed nothing: the test does not exercise it")
	}
	// Info and Counts side by side, as the evaluator reads them (one state
	// read shared), then each alone.
	got := make(chan windowResult, 1)
	go func() {
		info, err := reader.WindowInfoMulti(context.Background(), spec)
		if err != nil {
			t.Error(err)
		}
		got <- windowResult{Info: info}
	}()
	counts, err := reader.WindowCountsMulti(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	both := <-got
	both.Counts = counts
	if !reflect.DeepEqual(both, want) {
		t.Errorf("side by side, right after another process's relabel:\n got %+v\nwant %+v", both, want)
	}
	if alone, err := readWindow(reader, spec); err != nil || !reflect.DeepEqual(alone, want) {
		t.Errorf("right after another process's relabel: %v\n got %+v\nwant %+v", err, alone, want)
	}
}

// An older build's rollup (one from before migration 17, still running
// during a rolling upgrade) records hours and a watermark without filling
// the decision windows' tables. Its records cover nothing for this build:
// the windows read those hours raw, and this build's rollup fills the
// window tables for them. (Reproduced with a build of 22c2e92 beside the
// current one: every later window of a cohort read from the rollup lost
// the hours the old build had recorded, for good.)
func TestWindowRollupBesideAnOlderBuild(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	rs, ls, _ := windowData(900)
	if err := s.InsertRollouts(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertLabels(ctx, ls); err != nil {
		t.Fatal(err)
	}
	first := checkWindowsExact(t, s, "nothing rolled up")
	// The older build's records, as its Rollup writes them: every hour
	// through its newest change, and a watermark over every closed hour.
	conn := testenv.StoreConn(t, s)
	for _, q := range []string{
		`INSERT INTO rollup_hours (kind, environment, agent_version, hour, version, run_ns, rolled_at)
SELECT kind, environment, agent_version, hour, maxMerge(last_ingest), toUInt64(1), now() FROM rollup_changes
GROUP BY kind, environment, agent_version, hour`,
		fmt.Sprintf(`INSERT INTO rollup_watermark (slot, through, closed_before, at)
SELECT toUInt8(0), toUInt64(%d), toStartOfHour(now()), toUInt64(%[1]d)`, time.Now().UnixNano()),
	} {
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if got := checkWindowsExact(t, s, "rolled up by an older build"); !reflect.DeepEqual(got, first) {
		t.Error("an older build's rollup records changed a window")
	}
	if _, err := s.RollupAll(ctx, rollupNow()); err != nil {
		t.Fatal(err)
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM window_rollouts_hourly").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Error("this build's rollup left the hours an older build recorded without window rows")
	}
	if got := checkWindowsExact(t, s, "rolled up by this build after an older one"); !reflect.DeepEqual(got, first) {
		t.Error("the rollup after an older build's changed a window")
	}
}
