package sink_test

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// rollupBase is a Monday 00:00 UTC; the data spans its week and the week
// before, all hours closed.
var rollupBase = time.Date(2026, 10, 12, 0, 0, 0, 0, time.UTC)

// rollupNow is a wall-clock time past RollupGrace: the labels just written
// count as settled.
func rollupNow() time.Time { return time.Now().Add(sink.RollupGrace + time.Second) }

// rollupCase is one dashboard statement with binds.
type rollupCase struct {
	name  string
	q     string
	daily bool
	args  []any
}

func rollupCases() []rollupCase {
	u := func(t time.Time) uint32 { return uint32(max(t.Unix(), 0)) }
	var cs []rollupCase
	for _, since := range []time.Time{{}, rollupBase.Add(-7 * 24 * time.Hour), rollupBase.Add(3*time.Hour + 17*time.Minute)} {
		for _, daily := range []bool{false, true} {
			sfx := fmt.Sprintf(" since=%d daily=%v", u(since), daily)
			cs = append(cs,
				rollupCase{"QPassRateHourly" + sfx, sink.QPassRateHourly, daily, []any{"env", u(since)}},
				rollupCase{"QCapabilityHourly v1" + sfx, sink.QCapabilityHourly, daily, []any{"env", "v1", uint32(1), u(since)}},
				rollupCase{"QCapabilityHourly v2 dict2" + sfx, sink.QCapabilityHourly, daily, []any{"env", "v2", uint32(2), u(since)}},
			)
		}
		// The weeks end with the anchor's: this week, or the week before.
		for _, at := range []time.Time{rollupBase.Add(50 * time.Hour), rollupBase.Add(-50 * time.Hour)} {
			sfx := fmt.Sprintf(" since=%d at=%d", u(since), u(at))
			cs = append(cs,
				rollupCase{"QPassRateWeekly" + sfx, sink.QPassRateWeekly, false, []any{"env", u(since), u(at)}},
				rollupCase{"QLackingWeekly" + sfx, sink.QLackingWeekly, false, []any{"env", u(since), u(at)}})
		}
	}
	for _, at := range []time.Time{rollupBase.Add(50 * time.Hour), rollupBase.Add(-50 * time.Hour)} {
		for _, av := range []string{"v1", "v2"} {
			cs = append(cs, rollupCase{fmt.Sprintf("QLackingWeekOverWeek %s at=%d", av, u(at)), sink.QLackingWeekOverWeek, false,
				[]any{u(at), "env", av, u(at), u(at), uint32(10)}})
		}
	}
	return append(cs, rollupCase{"QRolloutCohorts", sink.QRolloutCohorts, false, nil}, rollupCase{"QLabelCohorts", sink.QLabelCohorts, false, nil})
}

// readAll runs a query and returns its rows as values.
func readAll(t *testing.T, s *sink.Store, raw bool, c rollupCase) [][]any {
	t.Helper()
	ctx := context.Background()
	run := s.QueryDashboard
	if raw {
		run = s.QueryDashboardRaw
	}
	rows, err := run(ctx, c.q, c.daily, c.args...)
	if err != nil {
		t.Fatalf("%s (raw=%v): %v", c.name, raw, err)
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
			t.Fatalf("%s: scan: %v", c.name, err)
		}
		vals := make([]any, len(ptrs))
		for i, p := range ptrs {
			vals[i] = reflect.ValueOf(p).Elem().Interface()
		}
		out = append(out, vals)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	return out
}

// sameRows compares two results; floats may differ in the last bits (the
// mean over runs is summed in another order).
func sameRows(a, b [][]any) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d rows vs %d rows", len(a), len(b))
	}
	for i := range a {
		for j := range a[i] {
			x, y := a[i][j], b[i][j]
			if fx, ok := x.(float64); ok {
				if fy, ok := y.(float64); ok && math.Abs(fx-fy) <= 1e-9*math.Max(1, math.Abs(fx)) {
					continue
				}
			}
			if tx, ok := x.(time.Time); ok {
				if ty, ok := y.(time.Time); ok && tx.Equal(ty) {
					continue
				}
			}
			if fmt.Sprint(x) != fmt.Sprint(y) {
				return fmt.Errorf("row %d col %d: %v vs %v\n  rollup %v\n  raw    %v", i, j, x, y, a[i], b[i])
			}
		}
	}
	return nil
}

// checkExact asserts that every rollup-backed statement gives the raw
// computation's rows, and returns the results (to see that a step changed
// them).
func checkExact(t *testing.T, s *sink.Store, step string) map[string][][]any {
	t.Helper()
	got := map[string][][]any{}
	nonEmpty := 0
	start := time.Now()
	defer func() { t.Logf("%s: %d statements compared in %v", step, len(got), time.Since(start)) }()
	for _, c := range rollupCases() {
		r, raw := readAll(t, s, false, c), readAll(t, s, true, c)
		if err := sameRows(r, raw); err != nil {
			t.Errorf("%s: %s: rollup differs from the raw computation: %v", step, c.name, err)
		}
		if len(r) > 0 {
			nonEmpty++
		}
		got[c.name] = r
	}
	if nonEmpty < len(got)*2/3 {
		t.Fatalf("%s: only %d of %d statements returned rows: the data does not exercise them", step, nonEmpty, len(got))
	}
	return got
}

func stale(t *testing.T, s *sink.Store) (uint64, uint64) {
	t.Helper()
	l, r, err := s.StaleHours(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return l, r
}

// rollupData is rollouts and their labels: agent versions v1 (dictionary 1)
// and v2 (dictionaries 1 and 2: the same rollouts labeled by both), 3
// capabilities, 2 runs, over 10 days either side of rollupBase.
func rollupData(prefix string, n int, from time.Time, span time.Duration) ([]sink.RolloutRow, []sink.LabelRow) {
	var rs []sink.RolloutRow
	var ls []sink.LabelRow
	caps := []string{"cap_a", "cap_b", "cap_c"}
	for i := range n {
		av := []string{"v1", "v2"}[i%2]
		end := from.Add(time.Duration(int64(span) * int64(i) / int64(n))).Truncate(time.Second)
		ok := i%3 == 0
		r := &schemas.Rollout{RolloutID: fmt.Sprintf("%s%05d", prefix, i), Environment: "env", Agent: schemas.Agent{Name: "a", Version: av},
			TaskID: "t", StartTime: end.Add(-time.Minute), EndTime: end, Outcome: schemas.Outcome{Reward: map[bool]float64{true: 1}[ok]}}
		r.Outcome.Success = &ok
		rs = append(rs, sink.RolloutRowFrom(r, sink.Coord{Topic: "t", Offset: int64(i)}))
		dicts := []uint32{1}
		if av == "v2" {
			dicts = []uint32{1, 2}
		}
		for _, dv := range dicts {
			for ci, c := range caps {
				for run := range uint16(2) {
					l := schemas.LabelPresent
					switch (i + ci*7 + int(run)*3 + int(dv)) % 5 {
					case 0, 1:
						l = schemas.LabelLacking
					case 2:
						l = schemas.LabelNA
					}
					ls = append(ls, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: r.RolloutID, Environment: "env", AgentVersion: av,
						DictionaryVersion: dv, Capability: c, Run: run, Label: l, Success: ok, Source: schemas.SourceRules, TS: end}})
				}
			}
		}
	}
	return rs, ls
}

// TestRollupExact: the dashboard's rollup-backed statements give exactly
// the raw computation's numbers — with nothing rolled up, everything rolled
// up, and after each of: redelivered labels, a crash between the rollup's
// insert and its commit, a conflicting external relabel, late rollouts for a
// closed hour (each checked before and after the rollup catches up).
func TestRollupExact(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	rs, ls := rollupData("r", 1200, rollupBase.Add(-10*24*time.Hour), 20*24*time.Hour)
	if err := s.InsertRollouts(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertLabels(ctx, ls); err != nil {
		t.Fatal(err)
	}
	if l, r := stale(t, s); l == 0 || r == 0 {
		t.Fatalf("before any rollup: %d label hours and %d rollout hours stale, want all", l, r)
	}
	first := checkExact(t, s, "nothing rolled up")

	start := time.Now()
	st, err := s.RollupAll(ctx, rollupNow())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rollup: %+v in %v", st, time.Since(start))
	if st.Hours == 0 {
		t.Fatal("rollup did nothing")
	}
	if l, r := stale(t, s); l != 0 || r != 0 {
		t.Fatalf("after the rollup: %d label hours and %d rollout hours still stale", l, r)
	}
	rolled := checkExact(t, s, "all rolled up")
	for k, v := range first {
		if err := sameRows(rolled[k], v); err != nil {
			t.Errorf("%s changed with the rollup alone: %v", k, err)
		}
	}
	// Every rollup row is versioned by the change its hour was computed
	// through, as rollup_hours records it.
	{
		var bad uint64
		if err := testenv.StoreConn(t, s).QueryRow(ctx, `SELECT count() FROM label_hourly
			WHERE (environment, agent_version, hour, version) NOT IN (SELECT environment, agent_version, hour, version FROM rollup_hours WHERE kind = 1)`).Scan(&bad); err != nil {
			t.Fatal(err)
		}
		var n uint64
		if err := testenv.StoreConn(t, s).QueryRow(ctx, `SELECT count() FROM rollout_hourly
			WHERE (environment, agent_version, hour, version) NOT IN (SELECT environment, agent_version, hour, version FROM rollup_hours WHERE kind = 2)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if bad != 0 || n != 0 {
			t.Fatalf("%d label_hourly and %d rollout_hourly rows are not versioned by their hour's change", bad, n)
		}
	}
	// A second run finds nothing to do (idempotent, no double counting).
	if st, err := s.RollupAll(ctx, rollupNow()); err != nil || st.Hours != 0 {
		t.Fatalf("second rollup: %+v %v", st, err)
	}

	// The reads really use the rollup: a forged rollup row shows.
	conn := testenv.StoreConn(t, s)
	forge := func(t *testing.T, conn interface {
		Exec(context.Context, string, ...any) error
	}) {
		if err := conn.Exec(ctx, `INSERT INTO label_hourly (environment, agent_version, dicts, dictionary_version, capability, run, hour, lf, pf, nf, lp, pp, np, version)
			SELECT environment, agent_version, dicts, dictionary_version, capability, run, hour, lf + 1000, pf, nf, lp, pp, np, version + 1
			FROM label_hourly WHERE agent_version = 'v1' AND dicts = 0 AND hour = ?`, rollupBase.Add(5*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("reads the rollup", func(t *testing.T) {
		s := openStore(t)
		insertRolledUp(t, s, rs, ls)
		forge(t, testenv.StoreConn(t, s))
		c := rollupCase{"QCapabilityHourly", sink.QCapabilityHourly, false, []any{"env", "v1", uint32(1), uint32(0)}}
		if sameRows(readAll(t, s, false, c), readAll(t, s, true, c)) == nil {
			t.Fatal("a forged rollup row did not change QCapabilityHourly: the rollup is not read")
		}
	})

	closedHour := func(prefix string, hs time.Duration) []sink.LabelRow {
		var out []sink.LabelRow
		for _, l := range ls {
			if l.TS.Sub(rollupBase) >= hs && l.TS.Sub(rollupBase) < hs+time.Hour {
				out = append(out, l)
			}
		}
		if len(out) == 0 {
			t.Fatalf("%s: no labels in hour %v", prefix, hs)
		}
		return out
	}
	catchUp := func(step string) map[string][][]any {
		t.Helper()
		if l, _ := stale(t, s); l == 0 {
			t.Errorf("%s: no label hour is stale: the change is not seen", step)
		}
		checkExact(t, s, step+", not rolled up yet")
		if _, err := s.RollupAll(ctx, rollupNow()); err != nil {
			t.Fatal(err)
		}
		if l, r := stale(t, s); l != 0 || r != 0 {
			t.Fatalf("%s: %d/%d hours stale after the rollup", step, l, r)
		}
		return checkExact(t, s, step+", rolled up again")
	}

	// Redelivered labels (a consumer that crashed between its insert and its
	// offset commit reads and writes them again): nothing changes.
	if err := s.InsertLabels(ctx, closedHour("redelivery", 3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := catchUp("redelivered labels"); sameRows(got["QLabelCohorts"], first["QLabelCohorts"]) != nil ||
		sameRows(got["QCapabilityHourly v1 since=0 daily=false"], first["QCapabilityHourly v1 since=0 daily=false"]) != nil {
		t.Error("redelivered labels changed the numbers")
	}

	// A crash of the rollup between its insert and its commit: the rows
	// are in label_hourly, rollup_hours never heard of them.
	if err := conn.Exec(ctx, "TRUNCATE TABLE rollup_hours"); err != nil {
		t.Fatal(err)
	}
	if l, r := stale(t, s); l == 0 || r == 0 {
		t.Fatalf("after the crash: %d/%d hours stale, want all", l, r)
	}
	checkExact(t, s, "rollup crashed before its commit")
	if _, err := s.RollupAll(ctx, rollupNow()); err != nil {
		t.Fatal(err)
	}
	if got := checkExact(t, s, "rollup re-run after the crash"); sameRows(got["QLabelCohorts"], first["QLabelCohorts"]) != nil {
		t.Error("the re-run rollup double counted")
	}

	// A conflicting external relabel of a closed hour: newer labels for the
	// same identities, different values.
	var relabel []sink.LabelRow
	for _, l := range closedHour("relabel", 7*time.Hour) {
		l.Source = schemas.SourceExternal
		if l.Label == schemas.LabelLacking {
			l.Label = schemas.LabelPresent
		} else {
			l.Label = schemas.LabelLacking
		}
		relabel = append(relabel, l)
	}
	if err := s.InsertLabels(ctx, relabel); err != nil {
		t.Fatal(err)
	}
	key := "QCapabilityHourly v1 since=0 daily=false"
	if got := catchUp("conflicting external relabel"); sameRows(got[key], first[key]) == nil {
		t.Error("the relabel did not change QCapabilityHourly: the test does not exercise it")
	}

	// Late rollouts for a closed, rolled-up hour.
	lateR, lateL := rollupData("late", 40, rollupBase.Add(9*time.Hour), 50*time.Minute)
	if err := s.InsertRollouts(ctx, lateR); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertLabels(ctx, lateL); err != nil {
		t.Fatal(err)
	}
	if _, r := stale(t, s); r == 0 {
		t.Error("late rollouts: no rollout hour is stale")
	}
	if got := catchUp("late rollouts"); sameRows(got["QRolloutCohorts"], first["QRolloutCohorts"]) == nil {
		t.Error("late rollouts did not change QRolloutCohorts")
	}
}

// TestRollupStateAcrossProcesses: a reader whose rollup state (watermark and
// dirty hours, kept rollupStateTTL) was read before another process wrote
// late labels for a rolled-up hour shows that hour as it was, and the raw
// computation's numbers once the state is read again (within a second).
func TestRollupStateAcrossProcesses(t *testing.T) {
	ch := testenv.ClickHouse(t)
	writer, reader := openStoreOn(t, ch), openStoreOn(t, ch)
	rs, ls := rollupData("r", 600, rollupBase.Add(-2*24*time.Hour), 4*24*time.Hour)
	insertRolledUp(t, writer, rs, ls)
	c := rollupCase{"QCapabilityHourly v1", sink.QCapabilityHourly, false, []any{"env", "v1", uint32(1), uint32(0)}}
	before := readAll(t, reader, false, c) // the reader's state is read now
	if err := sameRows(before, readAll(t, reader, true, c)); err != nil {
		t.Fatalf("rolled up: %v", err)
	}
	// Another process relabels a rolled-up hour.
	relabelHour(t, writer, ls)
	raw := readAll(t, reader, true, c)
	if sameRows(before, raw) == nil {
		t.Fatal("the relabel changed nothing: the test does not exercise it")
	}
	// Within the TTL the reader may still show the hour as it was; after
	// it, exactly the raw computation.
	time.Sleep(1100 * time.Millisecond)
	if err := sameRows(readAll(t, reader, false, c), raw); err != nil {
		t.Errorf("after the state's TTL: %v", err)
	}
	// The writer sees its own write at once.
	if err := sameRows(readAll(t, writer, false, c), raw); err != nil {
		t.Errorf("the writer: %v", err)
	}
}

// TestRollupLogPrune: pruning rollup_log removes the changes the watermark
// covers and keeps every read exact, including a relabel after the prune.
func TestRollupLogPrune(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	conn := testenv.StoreConn(t, s)
	count := func(where string) uint64 {
		t.Helper()
		var n uint64
		if err := conn.QueryRow(ctx, `SELECT count() FROM rollup_log WHERE `+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if bound, err := s.PruneRollupLog(ctx, 0); err != nil || bound != 0 {
		t.Fatalf("before any watermark: bound %d, %v; want 0 (nothing to prune)", bound, err)
	}
	rs, ls := rollupData("p", 400, rollupBase.Add(-3*24*time.Hour), 5*24*time.Hour)
	insertRolledUp(t, s, rs, ls)
	before := checkExact(t, s, "rolled up")
	// Counted before the prune: its mutation may be applied before the
	// next statement reads the table.
	var through uint64
	if err := conn.QueryRow(ctx, `SELECT argMax(through, at) FROM rollup_watermark`).Scan(&through); err != nil {
		t.Fatal(err)
	}
	if rows, old := count("1"), count(fmt.Sprintf("last_ingest < %d", through)); old == 0 {
		t.Fatalf("%d rows in rollup_log, none before the watermark (%d): the test prunes nothing", rows, through)
	}
	bound, err := s.PruneRollupLog(ctx, 0)
	if err != nil || bound != through {
		t.Fatalf("prune: bound %d, %v; want the watermark's through %d", bound, err, through)
	}
	// The delete is a mutation: the server applies it in the background.
	deadline := time.Now().Add(30 * time.Second)
	for count(fmt.Sprintf("last_ingest < %d", bound)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("rows before the bound still there after 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	after := checkExact(t, s, "pruned")
	if !reflect.DeepEqual(before, after) {
		t.Error("the prune changed a statement's rows")
	}
	// A relabel of a rolled-up hour after the prune is read raw at once.
	relabelHour(t, s, ls)
	relabeled := checkExact(t, s, "relabeled after the prune")
	if reflect.DeepEqual(before, relabeled) {
		t.Error("the relabel changed nothing: the test does not exercise it")
	}
}

// TestRecentLabels: the evaluator's estimate of a cohort's window is its
// labels in the rolled-up hours since the time, each identity once
// (a redelivery and a relabel do not add to it).
func TestRecentLabels(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	rs, ls := rollupData("e", 300, rollupBase.Add(-2*24*time.Hour), 4*24*time.Hour)
	if err := s.InsertRollouts(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertLabels(ctx, ls); err != nil {
		t.Fatal(err)
	}
	since := rollupBase.Add(-time.Hour)
	want := map[sink.Cohort]uint64{}
	var again []sink.LabelRow
	for _, l := range ls {
		if !l.TS.Before(since) {
			want[sink.Cohort{Environment: l.Environment, AgentVersion: l.AgentVersion, DictionaryVersion: l.DictionaryVersion}]++
			l.Source, l.Label = schemas.SourceExternal, schemas.LabelLacking
			again = append(again, l)
		}
	}
	if len(want) != 3 {
		t.Fatalf("%d cohorts in the data since %v, want 3", len(want), since)
	}
	if err := s.InsertLabels(ctx, again); err != nil { // relabeled, all of them
		t.Fatal(err)
	}
	if _, err := s.RollupAll(ctx, rollupNow()); err != nil {
		t.Fatal(err)
	}
	got, err := s.RecentLabels(ctx, since)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("recent labels %v, want %v", got, want)
	}
}

// relabelHour relabels, as an external labeler, every v1 label of the
// rolled-up hour 05:00 after rollupBase as LACKING.
func relabelHour(t *testing.T, s *sink.Store, ls []sink.LabelRow) {
	t.Helper()
	var relabel []sink.LabelRow
	for _, l := range ls {
		if l.AgentVersion == "v1" && l.TS.Sub(rollupBase) >= 5*time.Hour && l.TS.Sub(rollupBase) < 6*time.Hour {
			l.Source, l.Label = schemas.SourceExternal, schemas.LabelLacking
			relabel = append(relabel, l)
		}
	}
	if len(relabel) == 0 {
		t.Fatal("no labels in the hour")
	}
	if err := s.InsertLabels(context.Background(), relabel); err != nil {
		t.Fatal(err)
	}
}

// insertRolledUp writes rollouts and labels and rolls every settled hour up.
func insertRolledUp(t *testing.T, s *sink.Store, rs []sink.RolloutRow, ls []sink.LabelRow) {
	t.Helper()
	ctx := context.Background()
	if err := s.InsertRollouts(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertLabels(ctx, ls); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RollupAll(ctx, rollupNow()); err != nil {
		t.Fatal(err)
	}
}
