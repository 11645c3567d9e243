package sink_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func openStore(t *testing.T) *sink.Store {
	t.Helper()
	return openStoreOn(t, testenv.ClickHouse(t))
}

// openStoreOn opens a migrated store on ch's database: called twice, two
// processes' stores on one database.
func openStoreOn(t *testing.T, ch *testenv.CH) *sink.Store {
	t.Helper()
	ctx := context.Background()
	cfg := sink.Config{Addr: []string{ch.Addr}, Database: ch.Database, RetentionDays: 365}
	s, err := sink.Open(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Features().TTL {
		// 18.16 has no TTL, and Migrate refuses a retention it cannot
		// keep (TestRetentionRefusedWithoutTTL).
		s.Close()
		cfg.RetentionDays = 0
		if s, err = sink.Open(ctx, cfg, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMigrateIsIdempotent(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	applied, err := s.AppliedMigrations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != len(sink.Migrations) {
		t.Fatalf("applied %v, want %d migrations", applied, len(sink.Migrations))
	}
	for _, tbl := range []string{"rollouts", "rollout_counts", "capability_labels", "label_counts", "dictionaries", "trigger_events", "llm_calls", "label_runs", "environments"} {
		var n uint64
		if err := testenv.StoreConn(t, s).QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = ?", s.Database(), tbl).Scan(&n); err != nil || n != 1 {
			t.Errorf("table %s: n=%d err=%v", tbl, n, err)
		}
	}
	t.Logf("server %s, features %+v", s.Version(), s.Features())
}

func TestDialectByVersion(t *testing.T) {
	old := sink.Dialect{Features: sink.FeaturesFor(sink.Version{18, 16, 1}), RetentionDays: 30}
	cur := sink.Dialect{Features: sink.FeaturesFor(sink.Version{26, 7, 3}), RetentionDays: 30}
	oldSQL := strings.Join(sink.Migrations[0].SQL(old), "\n")
	curSQL := strings.Join(sink.Migrations[0].SQL(cur), "\n")
	for _, s := range []string{"LowCardinality", "CODEC", "TTL"} {
		if strings.Contains(oldSQL, s) {
			t.Errorf("18.16 DDL uses %s", s)
		}
		if !strings.Contains(curSQL, s) {
			t.Errorf("modern DDL lacks %s", s)
		}
	}
	if strings.Contains(strings.Join(sink.Migrations[0].SQL(sink.Dialect{Features: cur.Features}), "\n"), "TTL") {
		t.Error("TTL without retention days")
	}
}

func rollout(id string, ok bool) *schemas.Rollout {
	reward := 0.0
	if ok {
		reward = 1
	}
	end := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	return &schemas.Rollout{RolloutID: id, Environment: "env", Agent: schemas.Agent{Name: "a", Version: "v1"}, TaskID: "t",
		StartTime: end.Add(-time.Minute), EndTime: end, Outcome: schemas.Outcome{Reward: reward},
		Messages: []schemas.Message{{Role: "user", Content: strings.Repeat("é", 400)},
			{Role: "assistant", ToolCalls: []schemas.ToolCall{{ID: "c1", Name: "f", Arguments: map[string]any{"x": strings.Repeat("y", 500)}}}},
			{Role: "tool", ToolCallID: "c1", Content: "{}", Error: true}},
		Tools: []schemas.Tool{{Type: "function", Function: schemas.FunctionDef{Name: "f"}}}}
}

func TestRolloutsCompactedAndDeduplicated(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	var rows []sink.RolloutRow
	for i := 0; i < 100; i++ {
		rows = append(rows, sink.RolloutRowFrom(rollout(fmt.Sprint("r", i), i%3 == 0), sink.Coord{Topic: "t", Partition: 0, Offset: int64(i)}))
	}
	for range 2 { // a redelivered batch
		if err := s.InsertRollouts(ctx, rows); err != nil {
			t.Fatal(err)
		}
	}
	distinct, total, err := s.CountDistinctRollouts(ctx)
	if err != nil || distinct != 100 || total != 200 {
		t.Fatalf("distinct=%d rows=%d err=%v", distinct, total, err)
	}
	var final uint64
	if err := testenv.StoreConn(t, s).QueryRow(ctx, "SELECT count() FROM rollouts FINAL").Scan(&final); err != nil || final != 100 {
		t.Fatalf("FINAL count %d %v", final, err)
	}
	var msgs string
	var calls, errs uint32
	if err := testenv.StoreConn(t, s).QueryRow(ctx, "SELECT messages, n_tool_calls, n_tool_errors FROM rollouts WHERE rollout_id = 'r1' LIMIT 1").Scan(&msgs, &calls, &errs); err != nil {
		t.Fatal(err)
	}
	if calls != 1 || errs != 1 || strings.Contains(msgs, strings.Repeat("é", 301)) || !strings.Contains(msgs, strings.Repeat("é", 299)+"…") {
		t.Fatalf("not compacted: calls=%d errs=%d %s", calls, errs, msgs[:200])
	}
	var total2, succ uint64
	if err := testenv.StoreConn(t, s).QueryRow(ctx, "SELECT uniqExactMerge(rollouts), uniqExactIfMerge(successes) FROM rollout_counts").Scan(&total2, &succ); err != nil {
		t.Fatal(err)
	}
	if total2 != 100 || succ != 34 {
		t.Fatalf("rollout_counts: %d rollouts %d successes, want 100 and 34", total2, succ)
	}
}

func TestTruncate(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 3, "abc"}, {"abcd", 3, "ab…"}, {"ééé", 3, "ééé"}, {"éééé", 3, "éé…"}, {"", 3, ""},
	}
	for _, tt := range tests {
		if got := sink.Truncate(tt.in, tt.n); got != tt.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

func label(id string, ok bool, capability string, run uint16, l string, end time.Time) sink.LabelRow {
	return sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: id, Environment: "env", AgentVersion: "v1", DictionaryVersion: 1,
		Capability: capability, Run: run, Label: l, Success: ok, Source: schemas.SourceExternal, TS: end}}
}

func TestWindowCountsExactUnderRedelivery(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var rows []sink.LabelRow
	// 30 failures, 10 successes; run 0: ids f00..f11 LACKING on failure.
	for i := 0; i < 40; i++ {
		ok := i >= 30
		id := fmt.Sprintf("f%02d", i)
		l := schemas.LabelPresent
		if !ok && i < 12 {
			l = schemas.LabelLacking
		}
		if !ok && i >= 25 {
			l = schemas.LabelNA
		}
		rows = append(rows, label(id, ok, "cap_a", 0, l, base.Add(time.Duration(i)*time.Minute)))
	}
	if err := s.InsertLabels(ctx, rows); err != nil {
		t.Fatal(err)
	}
	spec := sink.WindowSpec{Cohort: sink.Cohort{Environment: "env", AgentVersion: "v1", DictionaryVersion: 1}}
	before, err := s.WindowCounts(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	want := sink.RunCounts{Capability: "cap_a", Run: 0, LackingFailed: 12, PresentFailed: 13, NAFailed: 5, PresentPassed: 10,
		LackingFailedFirst: []string{"f00", "f01", "f02", "f03", "f04", "f05", "f06", "f07"}}
	if len(before) != 1 || fmt.Sprint(before[0]) != fmt.Sprint(want) {
		t.Fatalf("counts %+v\nwant %+v", before, want)
	}
	// Redeliver everything twice: nothing changes.
	for range 2 {
		if err := s.InsertLabels(ctx, rows); err != nil {
			t.Fatal(err)
		}
	}
	after, err := s.WindowCounts(ctx, spec)
	if err != nil || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("redelivery changed counts: %+v (err %v)", after, err)
	}
	info, err := s.WindowInfo(ctx, spec)
	if err != nil || info.Rollouts != 40 || info.Failures != 30 || !info.First.Equal(base) {
		t.Fatalf("info %+v %v", info, err)
	}
	// The trend table is exact under redelivery too.
	var lacking uint64
	if err := testenv.StoreConn(t, s).QueryRow(ctx, "SELECT uniqExactMerge(rollouts) FROM label_counts WHERE label = 'LACKING' AND success = 0").Scan(&lacking); err != nil || lacking != 12 {
		t.Fatalf("label_counts LACKING on failures = %d (%v), want 12", lacking, err)
	}
	// Window by time and by last M rollouts.
	spec.Since = base.Add(20 * time.Minute)
	c, _ := s.WindowCounts(ctx, spec)
	if c[0].LackingFailed != 0 || c[0].PresentFailed != 5 || c[0].NAFailed != 5 || c[0].PresentPassed != 10 {
		t.Fatalf("since window: %+v", c)
	}
	spec.Since = time.Time{}
	spec.LastRollouts = 15
	c, _ = s.WindowCounts(ctx, spec)
	if got := c[0].LackingFailed + c[0].PresentFailed + c[0].NAFailed + c[0].PresentPassed; got != 15 || c[0].PresentPassed != 10 || c[0].NAFailed != 5 {
		t.Fatalf("last-15 window: %+v", c)
	}
	cohorts, err := s.Cohorts(ctx, time.Time{})
	if err != nil || len(cohorts) != 1 || cohorts[0] != spec.Cohort {
		t.Fatalf("cohorts %v %v", cohorts, err)
	}
}

func TestIsRetryable(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&clickhouse.Exception{Code: 252, Message: "Too many parts"}, true},
		{&clickhouse.Exception{Code: 210, Message: "network"}, true},
		{&clickhouse.Exception{Code: 241, Message: "memory"}, true},
		{&clickhouse.Exception{Code: 62, Message: "syntax error"}, false},
		{&clickhouse.Exception{Code: 60, Message: "unknown table"}, false},
		{fmt.Errorf("insert: %w", &clickhouse.Exception{Code: 159}), true},
		{io.EOF, true},
		{context.DeadlineExceeded, true},
		{context.Canceled, false},
		{errors.New("clickhouse: expected 3 arguments, got 2"), false},
		// A full disk is backpressure, not a fatal error: the batch is
		// stored once space is freed (ClickHouse 18.16's exception, seen
		// with its data on a full tmpfs; NOT_ENOUGH_SPACE from newer servers).
		{&clickhouse.Exception{Code: 75, Message: "Cannot write to file /var/lib/clickhouse/data/trace/rollouts/tmp_insert_202603_2_2_0/kafka_offset.mrk, errno: 28, strerror: No space left on device"}, true},
		{&clickhouse.Exception{Code: 76, Message: "Cannot open file /var/lib/clickhouse/data/trace/rollouts/tmp_insert_202603_2_2_0/x.bin, errno: 122, strerror: Disk quota exceeded"}, true},
		{fmt.Errorf("insert rollouts: %w", &clickhouse.Exception{Code: 243, Message: "Cannot reserve 1.00 MiB, not enough space"}), true},
		{&clickhouse.Exception{Code: 75, Message: "Cannot write to file /x, errno: 5, strerror: Input/output error"}, false},
	}
	for _, tt := range tests {
		if got := sink.IsRetryable(tt.err); got != tt.want {
			t.Errorf("IsRetryable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tt := range []struct {
		cfg  sink.Config
		want string
	}{
		{sink.Config{}, "clickhouse.addr"},
		{sink.Config{Addr: []string{"localhost"}}, "clickhouse.addr"},
		{sink.Config{Addr: []string{"h:9000"}, Database: "bad-name"}, "clickhouse.database"},
		{sink.Config{Addr: []string{"h:9000"}, RetentionDays: -1}, "clickhouse.retention_days"},
		{sink.Config{Addr: []string{"h:9000"}, Compression: "gzip"}, "clickhouse.compression"},
	} {
		if err := tt.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Validate(%+v) = %v, want error naming %s", tt.cfg, err, tt.want)
		}
	}
}

// A batch larger than one block is sent as several blocks of one INSERT; the
// server squashes them into one part, and every row lands once.
func TestInsertRolloutsBlocksMakeOnePart(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	if err := testenv.StoreConn(t, s).Exec(ctx, "SYSTEM STOP MERGES "+s.Database()+".rollouts"); err != nil {
		t.Fatalf("stop merges: %v", err)
	}
	const n = 5000 // more than two blocks
	rows := make([]sink.RolloutRow, n)
	for i := range rows {
		rows[i] = sink.RolloutRowFrom(rollout(fmt.Sprint("r", i), i%2 == 0), sink.Coord{Topic: "t", Offset: int64(i)})
	}
	if err := s.InsertRollouts(ctx, rows); err != nil {
		t.Fatal(err)
	}
	var parts, count, distinct uint64
	if err := testenv.StoreConn(t, s).QueryRow(ctx, "SELECT count() FROM system.parts WHERE database = ? AND table = 'rollouts' AND active",
		s.Database()).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	if err := testenv.StoreConn(t, s).QueryRow(ctx, "SELECT count(), uniqExact(rollout_id) FROM rollouts").Scan(&count, &distinct); err != nil {
		t.Fatal(err)
	}
	if parts != 1 || count != n || distinct != n {
		t.Fatalf("%d parts, %d rows, %d distinct; want 1 part and %d rows", parts, count, distinct, n)
	}
}

func TestProtocolCompression(t *testing.T) {
	for _, tt := range []struct {
		compression string
		addr        []string
		want        string
	}{
		{"", []string{"127.0.0.1:9000"}, "none"},
		{"auto", []string{"localhost:9000", "[::1]:9000"}, "none"},
		{"auto", []string{"127.0.0.1:9000", "ch-2.internal:9000"}, "lz4"},
		{"", []string{"10.0.0.5:9000"}, "lz4"},
		{"lz4", []string{"127.0.0.1:9000"}, "lz4"},
		{"zstd", []string{"ch:9000"}, "zstd"},
		{"none", []string{"ch:9000"}, "none"},
	} {
		got, err := sink.Config{Addr: tt.addr, Compression: tt.compression}.ProtocolCompression()
		if err != nil || !strings.EqualFold(got, tt.want) {
			t.Errorf("compression %q for %v = %q, %v; want %s", tt.compression, tt.addr, got, err, tt.want)
		}
	}
}

// TestInlineBinds checks the bind substitution used for the docs.
func TestInlineBinds(t *testing.T) {
	got, err := sink.InlineBinds("a = ? AND b = ?", "'x'", "1")
	if err != nil || got != "a = 'x' AND b = 1" {
		t.Errorf("InlineBinds = %q, %v", got, err)
	}
	if _, err := sink.InlineBinds("a = ?"); err == nil {
		t.Error("missing literal accepted")
	}
	if _, err := sink.InlineBinds("a", "1"); err == nil {
		t.Error("extra literal accepted")
	}
}

// QueryDashboard runs the documented statements (hourly and daily) and
// refuses any other SQL.
func TestQueryDashboardRunsOnlyItsStatements(t *testing.T) {
	s := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	rows, err := s.QueryDashboard(ctx, sink.QPassRateHourly, true, "airline", uint32(0))
	if err != nil {
		t.Fatalf("daily pass rate: %v", err)
	}
	rows.Close()
	var monday, since time.Time
	if err := s.QueryDashboardRow(ctx, sink.QWeekBounds, uint32(1.7e9), uint32(1.7e9), uint32(14)).Scan(&monday, &since); err != nil {
		t.Fatal(err)
	}
	// Calendar days, not 14×24 hours: both are midnights of the server's
	// time zone, and in one with daylight saving time (America/New_York)
	// the two weeks before Monday 2023-11-13 hold the end of DST (Nov 5),
	// one more hour.
	const day = "2006-01-02"
	if monday.Weekday() != time.Monday || monday.Format(day) != "2023-11-13" || since.AddDate(0, 0, 14).Format(day) != monday.Format(day) ||
		since.Hour() != 0 || since.Minute() != 0 {
		t.Errorf("week bounds %v, %v: want Monday 2023-11-13 and midnight 14 days before it", monday, since)
	}
	if _, err := s.QueryDashboard(ctx, "DROP TABLE rollouts", false); err == nil {
		t.Error("QueryDashboard ran a statement that is not the dashboard's")
	}
	if err := s.QueryDashboardRow(ctx, "SELECT 1").Scan(new(uint8)); err == nil {
		t.Error("QueryDashboardRow ran a statement that is not the dashboard's")
	}
}

// A migration whose record was lost (a crash after its statements ran)
// runs again: its ADD COLUMNs find their columns there and still succeed
// (18.16 has no ADD COLUMN IF NOT EXISTS).
func TestMigrateAddColumnRerun(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	conn := testenv.StoreConn(t, s)
	if err := conn.Exec(ctx, "ALTER TABLE schema_migrations DELETE WHERE version = 9"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		applied, err := s.AppliedMigrations(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !applied[9] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the mutation deleting migration 9's record did not finish")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("re-running migration 9: %v", err)
	}
	applied, err := s.AppliedMigrations(ctx)
	if err != nil || !applied[9] {
		t.Fatalf("migration 9 not recorded again: %v %v", applied, err)
	}
}

// The rollout's optional conversation_id and routing reach their columns,
// from both row builders.
func TestRolloutRoutingColumns(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	routed := rollout("routed", false)
	routed.ConversationID = "conv-1"
	routed.Routing = &schemas.Routing{DecisionID: "dec-1", Adapter: "tau2-airline-precondition"}
	raw, err := json.Marshal(routed)
	if err != nil {
		t.Fatal(err)
	}
	rr, err := schemas.DecodeRawRollout(raw, schemas.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rows := []sink.RolloutRow{
		sink.RolloutRowFrom(routed, sink.Coord{Topic: "t"}),
		sink.RolloutRowFrom(rollout("plain", true), sink.Coord{Topic: "t", Offset: 1}),
	}
	fromWire := sink.RawRolloutRow(rr, sink.Coord{Topic: "t", Offset: 2})
	fromWire.RolloutID = "routed-wire"
	rows = append(rows, fromWire)
	if err := s.InsertRollouts(ctx, rows); err != nil {
		t.Fatal(err)
	}
	want := map[string][3]string{
		"routed":      {"conv-1", "dec-1", "tau2-airline-precondition"},
		"routed-wire": {"conv-1", "dec-1", "tau2-airline-precondition"},
		"plain":       {"", "", ""},
	}
	r, err := testenv.StoreConn(t, s).Query(ctx, "SELECT rollout_id, conversation_id, route_decision_id, toString(adapter) FROM rollouts")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := 0
	for r.Next() {
		var id string
		var got [3]string
		if err := r.Scan(&id, &got[0], &got[1], &got[2]); err != nil {
			t.Fatal(err)
		}
		if got != want[id] {
			t.Errorf("%s: (conversation, decision, adapter) = %q, want %q", id, got, want[id])
		}
		n++
	}
	if n != len(want) {
		t.Fatalf("%d rows, want %d", n, len(want))
	}
}

// TestManyCohorts: the window statements, watermarks and stored
// evaluations of more cohorts than one statement may name (each statement
// is bounded by max_query_size) are read in several statements, all of them.
func TestManyCohorts(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	const n = 2500 // one statement for all would be ~390 KiB: over max_query_size
	now := time.Now().UTC().Truncate(time.Second)
	var rows []sink.LabelRow
	var cohorts []sink.Cohort
	var evs []sink.StoredEvaluation
	for i := range n {
		c := sink.Cohort{Environment: "env", AgentVersion: fmt.Sprintf("v%04d", i), DictionaryVersion: 1}
		cohorts = append(cohorts, c)
		rows = append(rows, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: fmt.Sprintf("r%d", i), Environment: c.Environment,
			AgentVersion: c.AgentVersion, DictionaryVersion: 1, Capability: "cap", Label: schemas.LabelLacking, Source: schemas.SourceExternal, TS: now}})
		evs = append(evs, sink.StoredEvaluation{Cohort: c, EvaluatedNs: uint64(i + 1), Payload: fmt.Sprint(i)})
	}
	if err := s.InsertLabels(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveEvaluations(ctx, evs); err != nil {
		t.Fatal(err)
	}
	spec, marks, err := s.EventSpec(ctx, cohorts, 24*time.Hour, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := s.WindowInfoMulti(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	counts, err := s.WindowCountsMulti(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := s.LatestEvaluations(ctx, cohorts)
	if err != nil {
		t.Fatal(err)
	}
	if len(marks) != n || len(infos) != n || len(counts) != n || len(stored) != n {
		t.Fatalf("%d cohorts: %d watermarks, %d window infos, %d window counts, %d evaluations", n, len(marks), len(infos), len(counts), len(stored))
	}
	for _, c := range cohorts {
		if infos[c].Rollouts != 1 || len(counts[c]) != 1 || counts[c][0].LackingFailed != 1 || !marks[c].Equal(now) {
			t.Fatalf("%s: info %+v, counts %+v, watermark %v", c, infos[c], counts[c], marks[c])
		}
	}
	// The tools of every fifth cohort's rollouts, looked up for all of them.
	var rs []sink.RolloutRow
	var keys [][2]string
	for i, c := range cohorts {
		keys = append(keys, [2]string{c.Environment, c.AgentVersion})
		if i%5 != 0 {
			continue
		}
		ok := true
		r := &schemas.Rollout{RolloutID: fmt.Sprintf("r%d", i), Environment: c.Environment, Agent: schemas.Agent{Name: "a", Version: c.AgentVersion},
			TaskID: "t", StartTime: now.Add(-time.Minute), EndTime: now, Outcome: schemas.Outcome{Success: &ok},
			Tools: []schemas.Tool{{Type: "function", Function: schemas.FunctionDef{Name: "tool_" + c.AgentVersion}}}}
		rs = append(rs, sink.RolloutRowFrom(r, sink.Coord{Topic: "t", Offset: int64(i)}))
	}
	if err := s.InsertRollouts(ctx, rs); err != nil {
		t.Fatal(err)
	}
	tools, err := s.CohortTools(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(tools) != len(rs) {
		t.Fatalf("tools of %d cohorts, want %d", len(tools), len(rs))
	}
	for _, k := range [][2]string{keys[0], keys[5], keys[2495]} {
		one, err := s.CohortTools(ctx, [][2]string{k})
		if err != nil || len(one[k]) != 1 || !reflect.DeepEqual(tools[k], one[k]) || one[k][0].Function.Name != "tool_"+k[1] {
			t.Errorf("%v: %+v, alone %+v (%v)", k, tools[k], one[k], err)
		}
	}
	if _, ok := tools[keys[1]]; ok {
		t.Errorf("%v has no rollouts, got tools %+v", keys[1], tools[keys[1]])
	}
}

// TestLocationIsTheServers: Store.Location is the zone the server buckets
// in: its name is timezone()'s, and a day computed in it in Go starts
// where toStartOfDay starts it (run with TZ=America/New_York to check a
// zone other than UTC: the local server takes the machine's).
func TestLocationIsTheServers(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	var tz string
	var day time.Time
	at := time.Date(2026, 12, 1, 3, 47, 12, 0, time.UTC)
	if err := testenv.StoreConn(t, s).QueryRow(ctx, "SELECT timezone(), toStartOfDay(toDateTime(?))", uint32(at.Unix())).Scan(&tz, &day); err != nil {
		t.Fatal(err)
	}
	t.Logf("server time zone %s", tz)
	loc := s.Location()
	if loc.String() != tz {
		t.Fatalf("Location %q, server timezone() %q", loc, tz)
	}
	l := at.In(loc)
	if want := time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, loc); !day.Equal(want) {
		t.Fatalf("toStartOfDay = %v, the day in Location starts %v", day, want)
	}
}

// TestRolloutEndTimes: the stored end times of the rollouts asked for, of
// several cohorts in one query: the newest copy's of a redelivered rollout,
// none for a rollout not stored or stored in another cohort only, and as
// many ids as a batch holds, a statement longer than max_query_size.
func TestRolloutEndTimes(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	at := time.Date(2025, 5, 1, 10, 20, 30, 0, time.UTC)
	row := func(env, version, id string, end time.Time) sink.RolloutRow {
		return sink.RolloutRow{RolloutID: id, Environment: env, AgentName: "a", AgentVersion: version, TaskID: "t", StartTime: end.Add(-time.Minute), EndTime: end}
	}
	if err := s.InsertRollouts(ctx, []sink.RolloutRow{row("e1", "v1", "r1", at), row("e1", "v2", "r2", at.Add(time.Hour)), row("e2", "v1", "r1", at.Add(2*time.Hour))}); err != nil {
		t.Fatal(err)
	}
	// Stored again later with another end time: the newest copy's counts.
	time.Sleep(time.Millisecond)
	if err := s.InsertRollouts(ctx, []sink.RolloutRow{row("e1", "v2", "r2", at.Add(3*time.Hour))}); err != nil {
		t.Fatal(err)
	}
	keys := []sink.RolloutKey{{Environment: "e1", AgentVersion: "v1", RolloutID: "r1"}, {Environment: "e1", AgentVersion: "v2", RolloutID: "r2"},
		{Environment: "e2", AgentVersion: "v1", RolloutID: "r1"}, {Environment: "e1", AgentVersion: "v1", RolloutID: "r2"},
		{Environment: "e2", AgentVersion: "v2", RolloutID: "r1"}, {Environment: "e3", AgentVersion: "v1", RolloutID: "r1"}}
	got, err := s.RolloutEndTimes(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	want := map[sink.RolloutKey]time.Time{keys[0]: at, keys[1]: at.Add(3 * time.Hour), keys[2]: at.Add(2 * time.Hour)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("RolloutEndTimes = %v, want %v", got, want)
	}
	// A batch's worth of long ids: ~700 KiB of statement, one query.
	var many []sink.RolloutKey
	var rows []sink.RolloutRow
	for i := range 10000 {
		id := fmt.Sprintf("%064d", i)
		many = append(many, sink.RolloutKey{Environment: "e4", AgentVersion: "v1", RolloutID: id})
		if i%100 == 0 {
			rows = append(rows, row("e4", "v1", id, at.Add(time.Duration(i)*time.Second)))
		}
	}
	if err := s.InsertRollouts(ctx, rows); err != nil {
		t.Fatal(err)
	}
	got, err = s.RolloutEndTimes(ctx, many)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(rows) {
		t.Fatalf("%d end times of %d ids, %d of them stored", len(got), len(many), len(rows))
	}
	for _, r := range rows {
		if k := (sink.RolloutKey{Environment: "e4", AgentVersion: "v1", RolloutID: r.RolloutID}); !got[k].Equal(r.EndTime) {
			t.Fatalf("%s: %v, want %v", r.RolloutID, got[k], r.EndTime)
		}
	}
}
