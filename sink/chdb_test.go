//go:build chdb

// The same DDL and the same read queries as on the 18.16 server, on a modern
// engine: ClickHouse 26.7 in-process (chDB), through chdb-go's database/sql
// driver. It needs libchdb.so: chdb-go's package init panics without it, so
// this file only builds with the `chdb` tag. Run it as
//
//	export "$(scripts/chdb-lib.sh | tail -n 1)"   # CHDB_LIB_PATH=.../libchdb.so
//	go test -tags chdb -run Chdb -count=1 ./sink/
//
// The migrations are rendered with the modern dialect (LowCardinality, ZSTD
// codecs and TTL on), a small known data set is inserted with plain INSERT ...
// VALUES, and then the exact SQL text of the Store's read queries (sql.go) runs
// with its `?` arguments inlined as literals; the results must be the numbers
// the 18.16 tests (sink_test.go) expect for the same data.
//
// Reads go through the driver's session in JSONCompactEachRowWithNamesAndTypes
// rather than through database/sql rows: chdb-go's rows decode Parquet, and
// they cannot return Array or Enum columns (an Array(String) column comes back
// nil, with the columns after it, and ColumnTypes panics on it), while
// WindowCountsMulti returns an Array(String). DDL and inserts go through
// database/sql (db.Exec).
package sink

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chdb-io/chdb-go/chdb"
	_ "github.com/chdb-io/chdb-go/chdb/driver" // registers the "chdb" database/sql driver

	"github.com/traceops/trace/schemas"
)

// chdbDialect is what FeaturesFor gives a 26.7 server: every optional
// feature on, with a retention so that the TTL clauses are rendered.
var chdbDialect = Dialect{Features: FeaturesFor(Version{26, 7, 3}), RetentionDays: 90}

// chdbDB is one chDB session with a database of its own.
type chdbDB struct {
	t    *testing.T
	db   *sql.DB
	sess *chdb.Session
	loc  *time.Location // the engine's time zone, to read DateTime text
}

func openChdb(t *testing.T) *chdbDB {
	t.Helper()
	if os.Getenv("CHDB_LIB_PATH") == "" {
		t.Log("CHDB_LIB_PATH is not set: chdb-go looked for libchdb.so on its default paths")
	}
	dir, err := os.MkdirTemp("", "trace-chdb-")
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("chdb", "session="+dir)
	if err != nil {
		t.Fatalf("open chdb: %v", err)
	}
	// The driver made the session at Open; chdb-go keeps one per process,
	// and NewSession hands back that one.
	sess, err := chdb.NewSession(dir)
	if err != nil {
		t.Fatalf("chdb session: %v", err)
	}
	if sess.Path() != dir {
		t.Fatalf("chdb session at %s, want the driver's %s", sess.Path(), dir)
	}
	t.Cleanup(func() {
		db.Close()
		sess.Cleanup() // closes the session and removes dir
	})
	c := &chdbDB{t: t, db: db, sess: sess, loc: time.UTC}
	tz := c.query("SELECT timezone()").rows[0].str(0)
	if c.loc, err = time.LoadLocation(tz); err != nil {
		t.Fatalf("engine time zone %q: %v", tz, err)
	}
	return c
}

// on is c reporting to t (a subtest's).
func (c *chdbDB) on(t *testing.T) *chdbDB {
	cc := *c
	cc.t = t
	return &cc
}

func (c *chdbDB) exec(stmt string) {
	c.t.Helper()
	if _, err := c.db.Exec(stmt); err != nil {
		c.t.Fatalf("chdb exec: %v\n%s", err, clip(stmt))
	}
}

func clip(s string) string {
	if len(s) > 600 {
		return s[:600] + " …"
	}
	return s
}

// chdbResult is a query's result as JSONCompactEachRowWithNamesAndTypes.
type chdbResult struct {
	names, types []string
	rows         []chdbRow
}

type chdbRow struct {
	c    *chdbDB
	vals []json.RawMessage
}

// query runs q with args inlined as literals (inlineArgs) and returns its rows.
func (c *chdbDB) query(q string, args ...any) chdbResult {
	c.t.Helper()
	text, err := inlineArgs(q, args)
	if err != nil {
		c.t.Fatalf("inline args: %v\n%s", err, q)
	}
	res, err := c.sess.Query(text, "JSONCompactEachRowWithNamesAndTypes")
	if err != nil {
		c.t.Fatalf("chdb query: %v\n%s", err, text)
	}
	defer res.Free()
	var out chdbResult
	dec := json.NewDecoder(bytes.NewReader(res.Buf()))
	for i := 0; dec.More(); i++ {
		var vals []json.RawMessage
		if err := dec.Decode(&vals); err != nil {
			c.t.Fatalf("chdb result line %d: %v\n%s", i+1, err, text)
		}
		switch i {
		case 0:
			for _, v := range vals {
				out.names = append(out.names, jsonString(c.t, v))
			}
		case 1:
			for _, v := range vals {
				out.types = append(out.types, jsonString(c.t, v))
			}
		default:
			out.rows = append(out.rows, chdbRow{c: c, vals: vals})
		}
	}
	return out
}

// wantTypes checks the result's column types, LowCardinality(T) read as T:
// the types the Store scans into on 18.16 (where the modern dialect's
// LowCardinality columns are plain String).
func (r chdbResult) wantTypes(t *testing.T, what string, want ...string) {
	t.Helper()
	got := make([]string, len(r.types))
	for i, ty := range r.types {
		if s, ok := strings.CutPrefix(ty, "LowCardinality("); ok {
			ty = strings.TrimSuffix(s, ")")
		}
		got[i] = ty
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s: column types %v (raw %v), want %v", what, got, r.types, want)
	}
}

func jsonString(t *testing.T, v json.RawMessage) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		t.Fatalf("not a JSON string: %s", v)
	}
	return s
}

func (r chdbRow) str(i int) string { return jsonString(r.c.t, r.vals[i]) }

// uint reads an unsigned integer; 64-bit ones come quoted.
func (r chdbRow) uint(i int) uint64 {
	r.c.t.Helper()
	s := strings.Trim(string(r.vals[i]), `"`)
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		r.c.t.Fatalf("column %d: not an unsigned integer: %s", i, r.vals[i])
	}
	return n
}

func (r chdbRow) float(i int) float64 {
	r.c.t.Helper()
	f, err := strconv.ParseFloat(strings.Trim(string(r.vals[i]), `"`), 64)
	if err != nil {
		r.c.t.Fatalf("column %d: not a number: %s", i, r.vals[i])
	}
	return f
}

func (r chdbRow) time(i int) time.Time {
	r.c.t.Helper()
	tm, err := time.ParseInLocation(time.DateTime, r.str(i), r.c.loc)
	if err != nil {
		r.c.t.Fatalf("column %d: not a DateTime: %v", i, err)
	}
	return tm.UTC()
}

func (r chdbRow) strs(i int) []string {
	r.c.t.Helper()
	out := []string{}
	if err := json.Unmarshal(r.vals[i], &out); err != nil {
		r.c.t.Fatalf("column %d: not an array of strings: %s", i, r.vals[i])
	}
	return out
}

// inlineArgs replaces each `?` placeholder of q (outside quotes) by its
// argument as a ClickHouse literal, as clickhouse-go's client-side binding
// does: strings quoted and escaped, numbers as they are, times as
// toDateTime(unix seconds). The count of placeholders must match.
func inlineArgs(q string, args []any) (string, error) {
	var b strings.Builder
	n := 0
	var quote byte // the open quote character, or 0
	for i := 0; i < len(q); i++ {
		ch := q[i]
		switch {
		case quote != 0:
			b.WriteByte(ch)
			if ch == '\\' && i+1 < len(q) {
				i++
				b.WriteByte(q[i])
			} else if ch == quote {
				quote = 0
			}
		case ch == '\'' || ch == '"' || ch == '`':
			quote = ch
			b.WriteByte(ch)
		case ch == '?':
			if n >= len(args) {
				return "", fmt.Errorf("more placeholders than the %d arguments", len(args))
			}
			lit, err := literal(args[n])
			if err != nil {
				return "", fmt.Errorf("argument %d: %w", n+1, err)
			}
			b.WriteString(lit)
			n++
		default:
			b.WriteByte(ch)
		}
	}
	if quote != 0 {
		return "", fmt.Errorf("unterminated %c quote", quote)
	}
	if n != len(args) {
		return "", fmt.Errorf("%d placeholders for %d arguments", n, len(args))
	}
	return b.String(), nil
}

var literalEscaper = strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`, "\r", `\r`, "\t", `\t`, "\x00", `\0`)

// literal is v as a ClickHouse literal.
func literal(v any) (string, error) {
	switch v := v.(type) {
	case nil: // a Nullable column's NULL
		return "NULL", nil
	case string:
		return "'" + literalEscaper.Replace(v) + "'", nil
	case bool:
		if v {
			return "1", nil
		}
		return "0", nil
	case int:
		return strconv.FormatInt(int64(v), 10), nil
	case int8:
		return strconv.FormatInt(int64(v), 10), nil
	case int16:
		return strconv.FormatInt(int64(v), 10), nil
	case int32:
		return strconv.FormatInt(int64(v), 10), nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case uint:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint8:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint16:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint32:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint64:
		return strconv.FormatUint(v, 10), nil
	case float32:
		return literal(float64(v))
	case float64:
		switch {
		case math.IsNaN(v):
			return "nan", nil
		case math.IsInf(v, 1):
			return "inf", nil
		case math.IsInf(v, -1):
			return "-inf", nil
		}
		return strconv.FormatFloat(v, 'g', -1, 64), nil
	case time.Time:
		return "toDateTime(" + strconv.FormatInt(v.Unix(), 10) + ")", nil
	case []string: // as clickhouse-go binds a slice: an Array literal
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i], _ = literal(e)
		}
		return "[" + strings.Join(parts, ", ") + "]", nil
	case []uint64:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i], _ = literal(e)
		}
		return "[" + strings.Join(parts, ", ") + "]", nil
	case []float64:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i], _ = literal(e)
		}
		return "[" + strings.Join(parts, ", ") + "]", nil
	}
	return "", fmt.Errorf("no ClickHouse literal for %T", v)
}

// insert writes rows with a plain INSERT ... VALUES (fine on chDB; never on
// 18.16 through clickhouse-go, where Exec of it hangs).
func (c *chdbDB) insert(table, cols string, rows ...[]any) {
	c.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "INSERT INTO %s (%s) VALUES", table, cols)
	for i, r := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(" (")
		for j, v := range r {
			if j > 0 {
				b.WriteString(", ")
			}
			lit, err := literal(v)
			if err != nil {
				c.t.Fatalf("insert into %s: row %d column %d: %v", table, i, j, err)
			}
			b.WriteString(lit)
		}
		b.WriteByte(')')
	}
	c.exec(b.String())
}

func TestChdbInlineArgs(t *testing.T) {
	// Five placeholders: the ones inside quotes are text.
	q := `SELECT '?', "a?", ? , ? FROM t WHERE x IN (?, ?) AND s = 'it\'s ?' AND y = ?`
	got, err := inlineArgs(q, []any{"o'k\\\n", uint16(7), int64(-3), 1.5, time.Unix(1700000000, 0)})
	want := `SELECT '?', "a?", 'o\'k\\\n' , 7 FROM t WHERE x IN (-3, 1.5) AND s = 'it\'s ?' AND y = toDateTime(1700000000)`
	if err != nil || got != want {
		t.Fatalf("inlineArgs = %q, %v\nwant %q", got, err, want)
	}
	if _, err := inlineArgs(q, []any{"a", 1, 2, 3, 4, 5}); err == nil {
		t.Fatal("inlineArgs with an extra argument: no error")
	}
	if _, err := inlineArgs("SELECT ?, ?", []any{1}); err == nil {
		t.Fatal("inlineArgs with a missing argument: no error")
	}
	if _, err := inlineArgs("SELECT ?", []any{[]int{1}}); err == nil {
		t.Fatal("inlineArgs of a slice: no error")
	}
}

// The data set. Cohort A is the one of TestWindowCountsExactUnderRedelivery
// (sink_test.go): 40 rollouts of capability cap_a, run 0, delivered three
// times; its expected numbers are that test's. Cohort B has N = 3 labeling
// runs, a conflicting relabel, incomplete rollouts and failures no LACKING
// label explains; cohort C only differs from B by its dictionary version.
var (
	cohortA = Cohort{Environment: "env", AgentVersion: "v1", DictionaryVersion: 1}
	cohortB = Cohort{Environment: "env", AgentVersion: "v2", DictionaryVersion: 1}
	cohortC = Cohort{Environment: "env", AgentVersion: "v2", DictionaryVersion: 2}
)

const labelCols = "environment, agent_version, dictionary_version, capability, run, rollout_id, label, success, reward, source, ts, ingest_ns"

func labelValues(c Cohort, id string, ok bool, capability string, run uint16, l string, at time.Time, ingestNS uint64) []any {
	reward := 0.0
	if ok {
		reward = 1
	}
	return []any{c.Environment, c.AgentVersion, c.DictionaryVersion, capability, run, id, l, b2u(ok), reward, schemas.SourceExternal, at, ingestNS}
}

func TestChdbModernDialect(t *testing.T) {
	t0 := time.Now()
	c := openChdb(t)
	t.Logf("chDB open in %s", time.Since(t0).Round(time.Millisecond))
	version := c.query("SELECT version()").rows[0].str(0)
	t.Logf("engine: ClickHouse %s (chDB), time zone %s", version, c.loc)
	if !strings.HasPrefix(version, "26.") {
		t.Errorf("chDB runs ClickHouse %s, want 26.x", version)
	}

	c.exec("CREATE DATABASE IF NOT EXISTS trace_chdb")
	c.exec("USE trace_chdb")
	if db := c.query("SELECT currentDatabase()").rows[0].str(0); db != "trace_chdb" {
		t.Fatalf("USE did not stick in the chDB session: current database %s", db)
	}

	t.Run("migrations", func(t *testing.T) { chdbMigrations(t, c) })
	if t.Failed() {
		t.FailNow()
	}
	// All times relative to now: the modern dialect's TTL (90 days) would
	// drop fixed old dates.
	base := time.Now().UTC().Truncate(time.Hour).Add(-24 * time.Hour)
	t.Run("labels", func(t *testing.T) { chdbLabels(t, c, base) })
	t.Run("rollouts", func(t *testing.T) { chdbRollouts(t, c, base.Add(-3*time.Hour)) })
	t.Run("state", func(t *testing.T) { chdbState(t, c, base) })
	t.Run("dashboard", func(t *testing.T) { chdbDashboard(t, c) })
	t.Run("ttl", func(t *testing.T) { chdbTTL(t, c) })
	t.Run("retention", func(t *testing.T) { chdbRetention(t, c) })
	t.Run("environments", func(t *testing.T) { chdbEnvironments(t, c, base) })
	t.Run("training", func(t *testing.T) { chdbTraining(t, c, base) })
	t.Run("routing", func(t *testing.T) { chdbRouting(t, c, base) })
	t.Run("loop", func(t *testing.T) { chdbLoop(t, c, base) })
	t.Logf("total %s", time.Since(t0).Round(time.Millisecond))
}

// chdbMigrations renders every migration with the modern dialect and runs
// each statement twice (they must be idempotent), then checks that the
// dialect's features reached the tables.
func chdbMigrations(t *testing.T, c *chdbDB) {
	c = c.on(t)
	f := chdbDialect.Features
	if !f.LowCardinality || !f.Codecs || !f.TTL {
		t.Fatalf("FeaturesFor(26.7.3) = %+v, want all on", f)
	}
	n := 0
	for round := range 2 {
		for _, m := range Migrations {
			for _, stmt := range m.SQL(chdbDialect) {
				if _, err := c.db.Exec(stmt); err != nil {
					t.Fatalf("migration %d (%s), round %d: %v\n%s", m.Version, m.Name, round+1, err, stmt)
				}
				n++
			}
		}
	}
	t.Logf("%d migrations, %d statements (each run twice)", len(Migrations), n/2)

	tables := map[string]string{}
	for _, r := range c.query("SELECT name, engine FROM system.tables WHERE database = currentDatabase()").rows {
		tables[r.str(0)] = r.str(1)
	}
	for name, engine := range map[string]string{
		"rollouts": "ReplacingMergeTree", "rollout_counts": "AggregatingMergeTree", "rollout_counts_mv": "MaterializedView",
		"capability_labels": "ReplacingMergeTree", "label_counts": "AggregatingMergeTree", "label_counts_mv": "MaterializedView",
		"dictionaries": "ReplacingMergeTree", "trigger_events": "ReplacingMergeTree", "llm_calls": "MergeTree", "label_runs": "ReplacingMergeTree",
		"environments":  "ReplacingMergeTree",
		"env_episodes":  "ReplacingMergeTree",
		"training_jobs": "ReplacingMergeTree", "training_job_events": "ReplacingMergeTree", "adapters": "ReplacingMergeTree",
		"route_decisions": "ReplacingMergeTree",
	} {
		if tables[name] != engine {
			t.Errorf("table %s: engine %q, want %s", name, tables[name], engine)
		}
	}
	col := func(table, name string) (typ, codec string) {
		r := c.query("SELECT type, compression_codec FROM system.columns WHERE database = currentDatabase() AND table = ? AND name = ?", table, name)
		if len(r.rows) != 1 {
			t.Fatalf("no column %s.%s", table, name)
		}
		return r.rows[0].str(0), r.rows[0].str(1)
	}
	if typ, _ := col("rollouts", "environment"); typ != "LowCardinality(String)" {
		t.Errorf("rollouts.environment is %s, want LowCardinality(String)", typ)
	}
	if typ, _ := col("env_episodes", "environment_id"); typ != "LowCardinality(String)" {
		t.Errorf("env_episodes.environment_id is %s, want LowCardinality(String)", typ)
	}
	if typ, _ := col("label_counts", "capability"); typ != "LowCardinality(String)" {
		t.Errorf("label_counts.capability is %s, want LowCardinality(String)", typ)
	}
	for _, name := range []string{"messages", "tools"} {
		if _, codec := col("rollouts", name); codec != "CODEC(ZSTD(3))" {
			t.Errorf("rollouts.%s codec %q, want CODEC(ZSTD(3))", name, codec)
		}
	}
	for table, ttl := range map[string]string{"rollouts": "end_time", "capability_labels": "ts", "llm_calls": "ts", "label_runs": "at", "env_episodes": "ended_at", "route_decisions": "ts"} {
		r := c.query("SELECT create_table_query FROM system.tables WHERE database = currentDatabase() AND name = ?", table)
		if q := r.rows[0].str(0); !strings.Contains(q, "TTL "+ttl+" + toIntervalDay(90)") {
			t.Errorf("%s has no TTL on %s:\n%s", table, ttl, q)
		}
	}
}

func chdbLabels(t *testing.T, c *chdbDB, base time.Time) {
	c = c.on(t)
	// Cohort A, as TestWindowCountsExactUnderRedelivery: 30 failures, 10
	// successes; f00..f11 LACKING, f12..f24 PRESENT, f25..f29 NA on
	// failures; every success PRESENT. Delivered once, then redelivered
	// twice (later ingest_ns, same labels).
	var rowsA [][]any
	for i := 0; i < 40; i++ {
		ok := i >= 30
		l := schemas.LabelPresent
		if !ok && i < 12 {
			l = schemas.LabelLacking
		}
		if !ok && i >= 25 {
			l = schemas.LabelNA
		}
		rowsA = append(rowsA, labelValues(cohortA, fmt.Sprintf("f%02d", i), ok, "cap_a", 0, l, base.Add(time.Duration(i)*time.Minute), 0))
	}
	deliver := func(ns uint64) {
		for _, r := range rowsA {
			r[len(r)-1] = ns
		}
		c.insert("capability_labels", labelCols, rowsA...)
	}
	deliver(1_000)
	specA := MultiSpec{Cohorts: []Cohort{cohortA}}
	before := chdbWindowCounts(t, c, specA)
	wantA := RunCounts{Capability: "cap_a", Run: 0, LackingFailed: 12, PresentFailed: 13, NAFailed: 5, PresentPassed: 10,
		LackingFailedFirst: []string{"f00", "f01", "f02", "f03", "f04", "f05", "f06", "f07"}}
	if got := before[cohortA]; len(got) != 1 || !reflect.DeepEqual(got[0], wantA) {
		t.Fatalf("cohort A counts %+v\nwant %+v", got, wantA)
	}
	deliver(2_000)
	deliver(3_000)
	if after := chdbWindowCounts(t, c, specA); !reflect.DeepEqual(after, before) {
		t.Fatalf("redelivery changed counts: %+v\nwas %+v", after, before)
	}

	// Cohort B: capability cap_x with N = 3 runs, cap_y complete for b3 and b5.
	//   b0 failed: LACKING in runs 0-2
	//   b1 failed: run 0 LACKING; run 1 PRESENT then relabeled LACKING (the
	//      relabel has the later ingest_ns and is inserted first); run 2 PRESENT
	//   b2 passed: PRESENT in runs 0-2, run 0 redelivered
	//   b3 failed: NA in runs 0-1 only (run 2 still arriving); cap_y PRESENT 0-2
	//   b4 passed: PRESENT in runs 0-3 (run 3 is beyond N)
	//   b5 failed: NA in runs 0-2; cap_y PRESENT 0-2 (no LACKING anywhere)
	//   b6 failed: LACKING in run 0 only
	// Rollout bK's labels are at baseB + K minutes.
	baseB := base.Add(time.Hour)
	at := func(k int) time.Time { return baseB.Add(time.Duration(k) * time.Minute) }
	L, P, NA := schemas.LabelLacking, schemas.LabelPresent, schemas.LabelNA
	b := func(k int, ok bool, capability string, run uint16, l string, ns uint64) []any {
		return labelValues(cohortB, fmt.Sprint("b", k), ok, capability, run, l, at(k), ns)
	}
	c.insert("capability_labels", labelCols,
		b(0, false, "cap_x", 0, L, 10), b(0, false, "cap_x", 1, L, 10), b(0, false, "cap_x", 2, L, 10),
		b(1, false, "cap_x", 0, L, 10), b(1, false, "cap_x", 1, L, 200), b(1, false, "cap_x", 2, P, 10),
		b(2, true, "cap_x", 0, P, 10), b(2, true, "cap_x", 1, P, 10), b(2, true, "cap_x", 2, P, 10),
		b(3, false, "cap_x", 0, NA, 10), b(3, false, "cap_x", 1, NA, 10),
		b(3, false, "cap_y", 0, P, 10), b(3, false, "cap_y", 1, P, 10), b(3, false, "cap_y", 2, P, 10),
		b(4, true, "cap_x", 0, P, 10), b(4, true, "cap_x", 1, P, 10), b(4, true, "cap_x", 2, P, 10), b(4, true, "cap_x", 3, P, 10),
		b(5, false, "cap_x", 0, NA, 10), b(5, false, "cap_x", 1, NA, 10), b(5, false, "cap_x", 2, NA, 10),
		b(5, false, "cap_y", 0, P, 10), b(5, false, "cap_y", 1, P, 10), b(5, false, "cap_y", 2, P, 10),
		b(6, false, "cap_x", 0, L, 10),
	)
	c.insert("capability_labels", labelCols,
		b(1, false, "cap_x", 1, P, 100), // the earlier label of the relabel, arriving late
		b(2, true, "cap_x", 0, P, 20),   // a redelivered duplicate
	)
	// Cohort C: B's environment and agent version, another dictionary.
	c.insert("capability_labels", labelCols,
		labelValues(cohortC, "c0", false, "cap_x", 0, L, baseB.Add(30*time.Minute), 10))

	rc := func(capability string, run, lf, pf, nf, lp, pp, np int, first ...string) RunCounts {
		if first == nil {
			first = []string{}
		}
		return RunCounts{Capability: capability, Run: run, LackingFailed: lf, PresentFailed: pf, NAFailed: nf,
			LackingPassed: lp, PresentPassed: pp, NAPassed: np, LackingFailedFirst: first}
	}
	AB := []Cohort{cohortA, cohortB}
	for _, tc := range []struct {
		name   string
		spec   MultiSpec
		counts map[Cohort][]RunCounts
		info   map[Cohort]WindowInfo
	}{
		{"all", MultiSpec{Cohorts: AB},
			map[Cohort][]RunCounts{cohortA: {wantA}, cohortB: {
				rc("cap_x", 0, 3, 0, 2, 0, 2, 0, "b0", "b1", "b6"),
				rc("cap_x", 1, 2, 0, 2, 0, 2, 0, "b0", "b1"),
				rc("cap_x", 2, 1, 1, 1, 0, 2, 0, "b0"),
				rc("cap_x", 3, 0, 0, 0, 0, 1, 0),
				rc("cap_y", 0, 0, 2, 0, 0, 0, 0), rc("cap_y", 1, 0, 2, 0, 0, 0, 0), rc("cap_y", 2, 0, 2, 0, 0, 0, 0),
			}},
			map[Cohort]WindowInfo{
				cohortA: {Rollouts: 40, Failures: 30, First: base, Last: base.Add(39 * time.Minute)},
				cohortB: {Rollouts: 7, Failures: 5, First: at(0), Last: at(6)},
			}},
		// TestWindowCountsExactUnderRedelivery's time window.
		{"since", MultiSpec{Cohorts: []Cohort{cohortA}, Since: base.Add(20 * time.Minute)},
			map[Cohort][]RunCounts{cohortA: {rc("cap_a", 0, 0, 5, 5, 0, 10, 0)}},
			map[Cohort]WindowInfo{cohortA: {Rollouts: 20, Failures: 10, First: base.Add(20 * time.Minute), Last: base.Add(39 * time.Minute)}}},
		{"since-until", MultiSpec{Cohorts: AB, Since: base.Add(20 * time.Minute), Until: at(3)},
			map[Cohort][]RunCounts{cohortA: {rc("cap_a", 0, 0, 5, 5, 0, 10, 0)}, cohortB: {
				rc("cap_x", 0, 2, 0, 0, 0, 1, 0, "b0", "b1"),
				rc("cap_x", 1, 2, 0, 0, 0, 1, 0, "b0", "b1"),
				rc("cap_x", 2, 1, 1, 0, 0, 1, 0, "b0"),
			}},
			map[Cohort]WindowInfo{
				cohortA: {Rollouts: 20, Failures: 10, First: base.Add(20 * time.Minute), Last: base.Add(39 * time.Minute)},
				cohortB: {Rollouts: 3, Failures: 2, First: at(0), Last: at(2)},
			}},
		// Event-time ranges, one per cohort: the since-until case above as
		// closed ranges ending at a cohort's own time.
		{"ranges", MultiSpec{Cohorts: AB, Ranges: map[Cohort]Range{cohortA: {base.Add(20 * time.Minute), base.Add(39 * time.Minute)}, cohortB: {at(0), at(2)}}},
			map[Cohort][]RunCounts{cohortA: {rc("cap_a", 0, 0, 5, 5, 0, 10, 0)}, cohortB: {
				rc("cap_x", 0, 2, 0, 0, 0, 1, 0, "b0", "b1"),
				rc("cap_x", 1, 2, 0, 0, 0, 1, 0, "b0", "b1"),
				rc("cap_x", 2, 1, 1, 0, 0, 1, 0, "b0"),
			}},
			map[Cohort]WindowInfo{
				cohortA: {Rollouts: 20, Failures: 10, First: base.Add(20 * time.Minute), Last: base.Add(39 * time.Minute)},
				cohortB: {Rollouts: 3, Failures: 2, First: at(0), Last: at(2)},
			}},
		// A cohort without a range selects nothing.
		{"ranges-one", MultiSpec{Cohorts: AB, Ranges: map[Cohort]Range{cohortB: {at(4), at(6)}}},
			map[Cohort][]RunCounts{cohortB: {
				rc("cap_x", 0, 1, 0, 1, 0, 1, 0, "b6"),
				rc("cap_x", 1, 0, 0, 1, 0, 1, 0),
				rc("cap_x", 2, 0, 0, 1, 0, 1, 0),
				rc("cap_x", 3, 0, 0, 0, 0, 1, 0),
				rc("cap_y", 0, 0, 1, 0, 0, 0, 0), rc("cap_y", 1, 0, 1, 0, 0, 0, 0), rc("cap_y", 2, 0, 1, 0, 0, 0, 0),
			}},
			map[Cohort]WindowInfo{cohortB: {Rollouts: 3, Failures: 2, First: at(4), Last: at(6)}}},
		// TestWindowCountsExactUnderRedelivery's last-15 window: f25..f39.
		{"last-15", MultiSpec{Cohorts: []Cohort{cohortA}, LastRollouts: 15},
			map[Cohort][]RunCounts{cohortA: {rc("cap_a", 0, 0, 0, 5, 0, 10, 0)}},
			map[Cohort]WindowInfo{cohortA: {Rollouts: 15, Failures: 5, First: base.Add(25 * time.Minute), Last: base.Add(39 * time.Minute)}}},
		{"last-3", MultiSpec{Cohorts: AB, LastRollouts: 3},
			map[Cohort][]RunCounts{cohortA: {rc("cap_a", 0, 0, 0, 0, 0, 3, 0)}, cohortB: {
				rc("cap_x", 0, 1, 0, 1, 0, 1, 0, "b6"),
				rc("cap_x", 1, 0, 0, 1, 0, 1, 0),
				rc("cap_x", 2, 0, 0, 1, 0, 1, 0),
				rc("cap_x", 3, 0, 0, 0, 0, 1, 0),
				rc("cap_y", 0, 0, 1, 0, 0, 0, 0), rc("cap_y", 1, 0, 1, 0, 0, 0, 0), rc("cap_y", 2, 0, 1, 0, 0, 0, 0),
			}},
			map[Cohort]WindowInfo{
				cohortA: {Rollouts: 3, Failures: 0, First: base.Add(37 * time.Minute), Last: base.Add(39 * time.Minute)},
				cohortB: {Rollouts: 3, Failures: 2, First: at(4), Last: at(6)},
			}},
		// Runs > 1: only rollouts labeled in every run 0..2 of a capability;
		// cohort A (run 0 only) has none, b3 counts through cap_y alone, b6
		// not at all, b4's run 3 is out.
		{"runs-3", MultiSpec{Cohorts: AB, Runs: 3},
			map[Cohort][]RunCounts{cohortB: {
				rc("cap_x", 0, 2, 0, 1, 0, 2, 0, "b0", "b1"),
				rc("cap_x", 1, 2, 0, 1, 0, 2, 0, "b0", "b1"),
				rc("cap_x", 2, 1, 1, 1, 0, 2, 0, "b0"),
				rc("cap_y", 0, 0, 2, 0, 0, 0, 0), rc("cap_y", 1, 0, 2, 0, 0, 0, 0), rc("cap_y", 2, 0, 2, 0, 0, 0, 0),
			}},
			map[Cohort]WindowInfo{cohortB: {Rollouts: 6, Failures: 4, First: at(0), Last: at(5)}}},
		// Both: the last 3 rollouts (b4, b5, b6), then the complete ones.
		{"last-3-runs-3", MultiSpec{Cohorts: AB, LastRollouts: 3, Runs: 3},
			map[Cohort][]RunCounts{cohortB: {
				rc("cap_x", 0, 0, 0, 1, 0, 1, 0), rc("cap_x", 1, 0, 0, 1, 0, 1, 0), rc("cap_x", 2, 0, 0, 1, 0, 1, 0),
				rc("cap_y", 0, 0, 1, 0, 0, 0, 0), rc("cap_y", 1, 0, 1, 0, 0, 0, 0), rc("cap_y", 2, 0, 1, 0, 0, 0, 0),
			}},
			map[Cohort]WindowInfo{cohortB: {Rollouts: 2, Failures: 1, First: at(4), Last: at(5)}}},
		{"dictionary-2", MultiSpec{Cohorts: []Cohort{cohortC}},
			map[Cohort][]RunCounts{cohortC: {rc("cap_x", 0, 1, 0, 0, 0, 0, 0, "c0")}},
			map[Cohort]WindowInfo{cohortC: {Rollouts: 1, Failures: 1, First: baseB.Add(30 * time.Minute), Last: baseB.Add(30 * time.Minute)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := chdbWindowCounts(t, c, tc.spec); !reflect.DeepEqual(got, tc.counts) {
				t.Errorf("WindowCountsMulti(%s):\n got %+v\nwant %+v", tc.name, got, tc.counts)
			}
			if got := chdbWindowInfo(t, c, tc.spec); !reflect.DeepEqual(got, tc.info) {
				t.Errorf("WindowInfoMulti(%s):\n got %+v\nwant %+v", tc.name, got, tc.info)
			}
		})
	}

	for _, tc := range []struct {
		c                     Cohort
		since                 time.Time
		failures, unexplained int
	}{
		{cohortA, time.Time{}, 30, 18},                // f12..f29 have no LACKING label
		{cohortA, base.Add(20 * time.Minute), 10, 10}, // f20..f29
		{cohortB, time.Time{}, 5, 2},                  // b3 and b5
		{cohortB, at(5), 2, 1},                        // b5 (b6 has a LACKING label)
		{cohortC, time.Time{}, 1, 0},
	} {
		q, args := unexplainedFailuresSQL(tc.c, tc.since)
		r := c.query(q, args...)
		r.wantTypes(t, "UnexplainedFailures", "UInt64", "UInt64")
		if f, u := int(r.rows[0].uint(0)), int(r.rows[0].uint(1)); f != tc.failures || u != tc.unexplained {
			t.Errorf("UnexplainedFailures(%s, since %v) = %d, %d; want %d, %d", tc.c, tc.since, f, u, tc.failures, tc.unexplained)
		}
	}

	// Watermarks: the newest label time per cohort, of all or of some.
	marks := func(cs []Cohort) map[Cohort]time.Time {
		q, args := watermarksSQL(cs)
		r := c.query(q, args...)
		r.wantTypes(t, "Watermarks", "String", "String", "UInt32", "DateTime")
		out := map[Cohort]time.Time{}
		for _, row := range r.rows {
			out[Cohort{Environment: row.str(0), AgentVersion: row.str(1), DictionaryVersion: uint32(row.uint(2))}] = row.time(3)
		}
		return out
	}
	if got, want := marks(nil), map[Cohort]time.Time{cohortA: base.Add(39 * time.Minute), cohortB: at(6), cohortC: baseB.Add(30 * time.Minute)}; !reflect.DeepEqual(got, want) {
		t.Errorf("Watermarks(all) = %v, want %v", got, want)
	}
	if got, want := marks([]Cohort{cohortB}), map[Cohort]time.Time{cohortB: at(6)}; !reflect.DeepEqual(got, want) {
		t.Errorf("Watermarks(B) = %v, want %v", got, want)
	}

	// LabeledRuns: cohort B's runs per rollout (capability_labels only here).
	q, args := labeledRunsSQL(cohortB)
	r := c.query(q, args...)
	r.wantTypes(t, "LabeledRuns", "String", "UInt64")
	runsOf := map[string]uint64{}
	for _, row := range r.rows {
		runsOf[row.str(0)] = row.uint(1)
	}
	if want := map[string]uint64{"b0": 3, "b1": 3, "b2": 3, "b3": 3, "b4": 4, "b5": 3, "b6": 1}; !reflect.DeepEqual(runsOf, want) {
		t.Errorf("LabeledRuns(B) = %v, want %v", runsOf, want)
	}

	cohorts := func(since time.Time) []Cohort {
		q, args := cohortsSQL(since)
		r := c.query(q, args...)
		r.wantTypes(t, "Cohorts", "String", "String", "UInt32")
		var out []Cohort
		for _, row := range r.rows {
			out = append(out, Cohort{Environment: row.str(0), AgentVersion: row.str(1), DictionaryVersion: uint32(row.uint(2))})
		}
		return out
	}
	if got := cohorts(time.Time{}); !reflect.DeepEqual(got, []Cohort{cohortA, cohortB, cohortC}) {
		t.Errorf("Cohorts(zero) = %v", got)
	}
	if got := cohorts(baseB); !reflect.DeepEqual(got, []Cohort{cohortB, cohortC}) {
		t.Errorf("Cohorts(%v) = %v", baseB, got)
	}

	// The trend table, exact under redelivery: cohort A's 12 LACKING
	// failures, whatever was delivered three times (the 18.16 test's check).
	r = c.query("SELECT uniqExactMerge(rollouts) FROM label_counts WHERE agent_version = 'v1' AND label = 'LACKING' AND success = 0")
	if n := r.rows[0].uint(0); n != 12 {
		t.Errorf("label_counts: cohort A LACKING on failures = %d, want 12", n)
	}
	// Per (capability, run, label) over every bucket of cohort B: one row per
	// distinct rollout, redelivery included; the relabeled b1 run 1 keeps both
	// of its labels (the view aggregates rows as inserted).
	got := map[string]uint64{}
	for _, row := range c.query(`SELECT capability, run, label, uniqExactMerge(rollouts) FROM label_counts
	WHERE agent_version = 'v2' AND dictionary_version = 1 GROUP BY capability, run, label`).rows {
		got[fmt.Sprintf("%s/%d/%s", row.str(0), row.uint(1), row.str(2))] = row.uint(3)
	}
	want := map[string]uint64{
		"cap_x/0/LACKING": 3, "cap_x/0/PRESENT": 2, "cap_x/0/NA": 2,
		"cap_x/1/LACKING": 2, "cap_x/1/PRESENT": 3, "cap_x/1/NA": 2,
		"cap_x/2/LACKING": 1, "cap_x/2/PRESENT": 3, "cap_x/2/NA": 1,
		"cap_x/3/PRESENT": 1,
		"cap_y/0/PRESENT": 2, "cap_y/1/PRESENT": 2, "cap_y/2/PRESENT": 2,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("label_counts of cohort B:\n got %v\nwant %v", got, want)
	}
}

// chdbWindowCounts runs WindowCountsMulti's statement (windowCountsSQL, or
// windowCountsRollupSQL with the rollup state as subqueries) and reads it as
// WindowCountsMulti does.
func chdbWindowCounts(t *testing.T, c *chdbDB, spec MultiSpec) map[Cohort][]RunCounts {
	t.Helper()
	c = c.on(t)
	q, args := windowCountsSQL(spec)
	if !spec.raw() {
		q, args = windowCountsRollupSQL(spec)
	}
	r := c.query(q, args...)
	r.wantTypes(t, "WindowCountsMulti", "String", "String", "UInt32", "String", "UInt16",
		"UInt64", "UInt64", "UInt64", "UInt64", "UInt64", "UInt64", "Array(String)")
	out := map[Cohort][]RunCounts{}
	for _, row := range r.rows {
		co := Cohort{Environment: row.str(0), AgentVersion: row.str(1), DictionaryVersion: uint32(row.uint(2))}
		out[co] = append(out[co], RunCounts{Capability: row.str(3), Run: int(row.uint(4)),
			LackingFailed: int(row.uint(5)), PresentFailed: int(row.uint(6)), NAFailed: int(row.uint(7)),
			LackingPassed: int(row.uint(8)), PresentPassed: int(row.uint(9)), NAPassed: int(row.uint(10)),
			LackingFailedFirst: row.strs(11)})
	}
	return out
}

// chdbWindowInfo runs WindowInfoMulti's statement (as chdbWindowCounts)
// and reads it as WindowInfoMulti does.
func chdbWindowInfo(t *testing.T, c *chdbDB, spec MultiSpec) map[Cohort]WindowInfo {
	t.Helper()
	c = c.on(t)
	q, args := windowInfoSQL(spec)
	if !spec.raw() {
		q, args = windowInfoRollupSQL(spec)
	}
	r := c.query(q, args...)
	r.wantTypes(t, "WindowInfoMulti", "String", "String", "UInt32", "UInt64", "UInt64", "DateTime", "DateTime")
	out := map[Cohort]WindowInfo{}
	for _, row := range r.rows {
		co := Cohort{Environment: row.str(0), AgentVersion: row.str(1), DictionaryVersion: uint32(row.uint(2))}
		out[co] = WindowInfo{Rollouts: int(row.uint(3)), Failures: int(row.uint(4)), First: row.time(5), Last: row.time(6)}
	}
	return out
}

const rolloutCols = `rollout_id, environment, agent_name, agent_version, task_id,
	success, reward, start_time, end_time, n_messages, n_tool_calls, n_tool_errors, messages, tools, grader, metadata,
	kafka_topic, kafka_partition, kafka_offset, ingested_at, ingest_ns`

// rolloutValues is InsertRollouts' row, as literals.
func rolloutValues(r RolloutRow, ingested time.Time) []any {
	return []any{r.RolloutID, r.Environment, r.AgentName, r.AgentVersion, r.TaskID,
		b2u(r.Success), r.Reward, r.StartTime.UTC(), r.EndTime.UTC(), r.NMessages, r.NToolCalls, r.NToolErrors,
		r.Messages, r.Tools, r.Grader, r.Metadata,
		r.Coord.Topic, int32(r.Coord.Partition), r.Coord.Offset, ingested, uint64(ingested.UnixNano())}
}

// chdbRollout is sink_test.go's rollout(), with an end time and a tool of
// its own.
func chdbRollout(id string, ok bool, end time.Time, tool string) *schemas.Rollout {
	reward := 0.0
	if ok {
		reward = 1
	}
	r := &schemas.Rollout{RolloutID: id, Environment: "env", Agent: schemas.Agent{Name: "a", Version: "v1"}, TaskID: "t",
		StartTime: end.Add(-time.Minute), EndTime: end, Outcome: schemas.Outcome{Reward: reward},
		Messages: []schemas.Message{{Role: "user", Content: strings.Repeat("é", 400)},
			{Role: "assistant", ToolCalls: []schemas.ToolCall{{ID: "c1", Name: "f", Arguments: map[string]any{"x": strings.Repeat("y", 500)}}}},
			{Role: "tool", ToolCallID: "c1", Content: "{}", Error: true}}}
	if tool != "" {
		r.Tools = []schemas.Tool{{Type: "function", Function: schemas.FunctionDef{Name: tool}}}
	}
	return r
}

// chdbRollouts: TestRolloutsCompactedAndDeduplicated's 100 rollouts (every
// third one passed), delivered twice, ending one minute apart from base (an
// hour boundary), so over two hourly buckets.
func chdbRollouts(t *testing.T, c *chdbDB, base time.Time) {
	c = c.on(t)
	var rows [][]any
	for i := 0; i < 100; i++ {
		r := RolloutRowFrom(chdbRollout(fmt.Sprint("r", i), i%3 == 0, base.Add(time.Duration(i)*time.Minute), fmt.Sprint("tool_", i)),
			Coord{Topic: "t", Partition: 0, Offset: int64(i)})
		rows = append(rows, rolloutValues(r, base.Add(2*time.Hour)))
	}
	c.insert("rollouts", rolloutCols, rows...)
	for _, r := range rows { // the redelivered batch
		r[len(r)-2], r[len(r)-1] = base.Add(3*time.Hour), uint64(base.Add(3*time.Hour).UnixNano())
	}
	c.insert("rollouts", rolloutCols, rows...)

	r := c.query(countDistinctRolloutsSQL)
	r.wantTypes(t, "CountDistinctRollouts", "UInt64", "UInt64")
	if distinct, total := r.rows[0].uint(0), r.rows[0].uint(1); distinct != 100 || total != 200 {
		t.Errorf("distinct=%d rows=%d, want 100 and 200", distinct, total)
	}
	if n := c.query("SELECT count() FROM rollouts FINAL").rows[0].uint(0); n != 100 {
		t.Errorf("FINAL count %d, want 100", n)
	}
	r = c.query("SELECT uniqExactMerge(rollouts), uniqExactIfMerge(successes) FROM rollout_counts")
	if total, succ := r.rows[0].uint(0), r.rows[0].uint(1); total != 100 || succ != 34 {
		t.Errorf("rollout_counts: %d rollouts %d successes, want 100 and 34", total, succ)
	}
	var buckets []string
	for _, row := range c.query(`SELECT bucket, uniqExactMerge(rollouts), uniqExactIfMerge(successes) FROM rollout_counts
	WHERE environment = 'env' AND agent_version = 'v1' GROUP BY bucket ORDER BY bucket`).rows {
		buckets = append(buckets, fmt.Sprintf("%s %d/%d", row.time(0).Format("15:04"), row.uint(1), row.uint(2)))
	}
	// r0..r59 (20 passed: 0, 3, .., 57) and r60..r99 (14 passed: 60, .., 99).
	if want := []string{base.Format("15:04") + " 60/20", base.Add(time.Hour).Format("15:04") + " 40/14"}; !slices.Equal(buckets, want) {
		t.Errorf("rollout_counts by hour: %v, want %v", buckets, want)
	}

	// SampleRollouts: the 3 latest failed and 3 latest passed, latest first.
	q, args := sampleRolloutsSQL("env", "v1", 3)
	r = c.query(q, args...)
	r.wantTypes(t, "SampleRollouts", "String", "String", "String", "UInt8", "Float64", "DateTime", "DateTime", "String", "String")
	var ids []string
	for _, row := range r.rows {
		id := row.str(0)
		ids = append(ids, id)
		var i int
		fmt.Sscanf(id, "r%d", &i)
		end := base.Add(time.Duration(i) * time.Minute)
		if ok := row.uint(3) == 1; ok != (i%3 == 0) || row.float(4) != float64(b2u(ok)) || row.str(1) != "t" || row.str(2) != "a" ||
			!row.time(5).Equal(end.Add(-time.Minute)) || !row.time(6).Equal(end) || row.str(8) != "" {
			t.Errorf("sample %s: %s", id, row.vals)
		}
		var cms []CompactMessage
		if err := json.Unmarshal([]byte(row.str(7)), &cms); err != nil || len(cms) != 3 ||
			cms[0].Content != strings.Repeat("é", 299)+"…" || len(cms[1].ToolCalls) != 1 || !cms[2].Error {
			t.Errorf("sample %s: stored messages %v (%v)", id, cms, err)
		}
	}
	if want := []string{"r99", "r98", "r97", "r96", "r95", "r93"}; !slices.Equal(ids, want) {
		t.Errorf("SampleRollouts = %v, want %v", ids, want)
	}

	// RolloutsByID: the named ids of the cohort, one row each although
	// every rollout is stored twice; an unknown id is left out.
	q, args = rolloutsByIDSQL("env", "v1", []string{"r7", "r3", "nope"})
	r = c.query(q, args...)
	r.wantTypes(t, "RolloutsByID", "String", "String", "String", "UInt8", "Float64", "DateTime", "DateTime", "String", "String")
	if len(r.rows) != 2 || r.rows[0].str(0) != "r3" || r.rows[1].str(0) != "r7" || r.rows[0].uint(3) != 1 || r.rows[1].uint(3) != 0 {
		t.Errorf("RolloutsByID rows %v", r.rows)
	}
	// RolloutEndTimes: the stored end time of each named rollout, one row
	// each; an unknown id and another cohort's are left out.
	q, args = rolloutEndTimesSQL([]RolloutKey{{"env", "v1", "r7"}, {"env", "v1", "r3"}, {"env", "v1", "nope"}, {"env", "nope", "r1"}})
	r = c.query(q, args...)
	r.wantTypes(t, "RolloutEndTimes", "String", "String", "String", "DateTime")
	if len(r.rows) != 2 {
		t.Errorf("RolloutEndTimes rows %v, want r3 and r7", r.rows)
	}
	for _, row := range r.rows {
		var i int
		fmt.Sscanf(row.str(2), "r%d", &i)
		if row.str(0) != "env" || row.str(1) != "v1" || (i != 3 && i != 7) || !row.time(3).Equal(base.Add(time.Duration(i)*time.Minute)) {
			t.Errorf("RolloutEndTimes row %v, want r3 or r7 of env/v1 at its end time", row.vals)
		}
	}
	// RolloutScopes, StoredRollouts and CompactedRollouts (backfill).
	r = c.query(rolloutScopesSQL)
	r.wantTypes(t, "RolloutScopes", "String", "String", "UInt64", "UInt64", "DateTime")
	if len(r.rows) != 1 || r.rows[0].str(0) != "env" || r.rows[0].uint(2) != 100 || r.rows[0].uint(3) != 66 || !r.rows[0].time(4).Equal(base.Add(99*time.Minute)) {
		t.Errorf("RolloutScopes = %v", r.rows)
	}
	q, args = rolloutScopesOfSQL([][2]string{{"env", "v1"}, {"env", "nope"}})
	if r2 := c.query(q, args...); len(r2.rows) != 1 || r2.rows[0].uint(2) != 100 || r2.rows[0].uint(3) != 66 {
		t.Errorf("RolloutScopesOf = %v", r2.rows)
	}
	if r2 := c.query(rolloutKeysSQL); len(r2.rows) != 1 || r2.rows[0].str(0) != "env" {
		t.Errorf("RolloutKeys = %v", r2.rows)
	}
	// LatestEvaluations: the newest of a cohort's evaluations.
	c.insert("cohort_evaluations", "environment, agent_version, dictionary_version, evaluated_ns, payload",
		[]any{"env", "v1", uint32(1), uint64(10), `{"runs":1}`}, []any{"env", "v1", uint32(1), uint64(20), `{"runs":2}`}, []any{"env", "v2", uint32(1), uint64(5), `{}`})
	if text, err := inlineArgs(latestEvaluationsSQL(1), []any{"env", "v1", uint32(1)}); err != nil {
		t.Fatal(err)
	} else if r2 := c.query(text); len(r2.rows) != 1 || r2.rows[0].uint(3) != 20 || r2.rows[0].str(4) != `{"runs":2}` {
		t.Errorf("LatestEvaluations = %v", r2.rows)
	}
	q, args = storedRolloutsSQL("env", "v1", base.Add(90*time.Minute))
	r = c.query(q, args...)
	r.wantTypes(t, "StoredRollouts", "String", "DateTime", "String", "Int32", "Int64")
	if len(r.rows) != 10 || r.rows[0].str(0) != "r90" || r.rows[9].str(0) != "r99" || r.rows[9].uint(4) != 99 || r.rows[0].str(2) != "t" {
		t.Errorf("StoredRollouts since r90 = %v", r.rows)
	}
	q, args = compactedRolloutsSQL("env", "v1", []string{"r3", "r4"})
	r = c.query(q, args...)
	r.wantTypes(t, "CompactedRollouts", "String", "String", "String", "UInt8", "Float64", "DateTime", "DateTime", "String", "String", "String", "String")
	if len(r.rows) != 2 {
		t.Errorf("CompactedRollouts = %v", r.rows)
	}
	for _, row := range r.rows {
		ro := schemas.Rollout{RolloutID: row.str(0)}
		if err := decodeStored(&ro, row.str(7), row.str(8), row.str(9), row.str(10)); err != nil || len(ro.Messages) != 3 || len(ro.Tools) != 1 {
			t.Errorf("CompactedRollouts %s: %v %+v", row.str(0), err, ro)
		}
	}

	// CohortTools: the latest rollout that declared tools. r100 ends later
	// and declares none.
	c.insert("rollouts", rolloutCols, rolloutValues(RolloutRowFrom(chdbRollout("r100", false, base.Add(3*time.Hour), ""), Coord{Topic: "t", Offset: 100}), base.Add(3*time.Hour)))
	q, args = cohortToolsSQL([][2]string{{"env", "v1"}, {"env", "nope"}})
	r = c.query(q, args...)
	r.wantTypes(t, "CohortTools", "String", "String", "String")
	if len(r.rows) != 1 || r.rows[0].str(1) != "v1" {
		t.Fatalf("CohortTools = %v, want env/v1 only (an unknown cohort has none)", r.rows)
	}
	var tools []schemas.Tool
	if err := json.Unmarshal([]byte(r.rows[0].str(2)), &tools); err != nil || len(tools) != 1 || tools[0].Function.Name != "tool_99" {
		t.Errorf("CohortTools = %s (%v), want tool_99", r.rows[0].vals[2], err)
	}
}

func chdbState(t *testing.T, c *chdbDB, base time.Time) {
	c = c.on(t)
	// Dictionaries: env/v1 versions 1..3 (version 2 saved twice), env2/v1
	// version 1.
	dict := func(env, av string, v uint32, at time.Time, src, body string) []any {
		return []any{env, av, v, at, src, body}
	}
	const dictCols = "environment, agent_version, version, created_at, source, body"
	c.insert("dictionaries", dictCols,
		dict("env", "v1", 1, base, "builtin", `{"v":1}`),
		dict("env", "v1", 2, base.Add(time.Hour), "discovery", `{"v":2}`),
		dict("env2", "v1", 1, base, "builtin", `{"it's":"quoted \\ text"}`))
	c.insert("dictionaries", dictCols,
		dict("env", "v1", 3, base.Add(2*time.Hour), "discovery", `{"v":3}`),
		dict("env", "v1", 2, base.Add(time.Hour), "discovery", `{"v":2}`))
	readDicts := func(q string) []DictionaryRow {
		r := c.query(q)
		r.wantTypes(t, "dictionaries", "String", "String", "UInt32", "DateTime", "String", "String")
		var out []DictionaryRow
		for _, row := range r.rows {
			out = append(out, DictionaryRow{Environment: row.str(0), AgentVersion: row.str(1), Version: uint32(row.uint(2)),
				CreatedAt: row.time(3), Source: row.str(4), Body: row.str(5)})
		}
		return out
	}
	d := func(env string, v uint32, at time.Time, src, body string) DictionaryRow {
		return DictionaryRow{Environment: env, AgentVersion: "v1", Version: v, CreatedAt: at, Source: src, Body: body}
	}
	wantLatest := []DictionaryRow{
		d("env", 3, base.Add(2*time.Hour), "discovery", `{"v":3}`),
		d("env2", 1, base, "builtin", `{"it's":"quoted \\ text"}`),
	}
	if got := readDicts(latestDictionariesSQL); !reflect.DeepEqual(got, wantLatest) {
		t.Errorf("LatestDictionaries:\n got %+v\nwant %+v", got, wantLatest)
	}
	wantAll := []DictionaryRow{
		d("env", 3, base.Add(2*time.Hour), "discovery", `{"v":3}`),
		d("env", 2, base.Add(time.Hour), "discovery", `{"v":2}`),
		d("env", 1, base, "builtin", `{"v":1}`),
		d("env2", 1, base, "builtin", `{"it's":"quoted \\ text"}`),
	}
	if got := readDicts(allDictionariesSQL); !reflect.DeepEqual(got, wantAll) {
		t.Errorf("AllDictionaries:\n got %+v\nwant %+v", got, wantAll)
	}

	// Trigger transitions: a redelivered "fired" collapses under FINAL; the
	// order is per capability, then by time.
	ev := func(capability string, epoch uint32, event string, at time.Time, cov float64) TriggerEvent {
		return TriggerEvent{TriggerID: fmt.Sprintf("%s-%d", capability, epoch), Environment: "env", AgentVersion: "v1", DictionaryVersion: 1,
			Capability: capability, Epoch: epoch, Event: event, At: at, MeanCov: cov, MeanDelta: -0.25, RunsPassed: 2, RunsTotal: 3,
			Window: schemas.Window{Start: at.Add(-time.Hour), End: at, Rollouts: 40, Failures: 30}, Payload: `{"event":"` + event + `"}`}
	}
	evValues := func(e TriggerEvent) []any {
		return []any{e.TriggerID, e.Environment, e.AgentVersion, e.DictionaryVersion, e.Capability, e.Epoch,
			e.Event, e.At, e.MeanCov, e.MeanDelta, e.RunsPassed, e.RunsTotal,
			e.Window.Start, e.Window.End, uint32(e.Window.Rollouts), uint32(e.Window.Failures), e.Payload}
	}
	const evCols = `trigger_id, environment, agent_version,
	dictionary_version, capability, epoch, event, at, mean_cov, mean_delta, runs_passed, runs_total,
	window_start, window_end, window_rollouts, window_failures, payload`
	fired := ev("cap_a", 1, "fired", base.Add(time.Hour), 0.6)
	desel := ev("cap_a", 1, "deselected", base.Add(2*time.Hour), 0.1)
	rearm := ev("cap_a", 2, "rearmed", base.Add(3*time.Hour), 0.05)
	other := ev("cap_b", 1, "fired", base, 0.75)
	c.insert("trigger_events", evCols, evValues(fired), evValues(rearm), evValues(other))
	c.insert("trigger_events", evCols, evValues(desel), evValues(fired))
	r := c.query(triggerHistorySQL)
	r.wantTypes(t, "TriggerHistory", "String", "String", "String", "UInt32", "String", "UInt32", "String", "DateTime",
		"Float64", "Float64", "UInt16", "UInt16", "DateTime", "DateTime", "UInt32", "UInt32", "String")
	var hist []TriggerEvent
	for _, row := range r.rows {
		hist = append(hist, TriggerEvent{TriggerID: row.str(0), Environment: row.str(1), AgentVersion: row.str(2),
			DictionaryVersion: uint32(row.uint(3)), Capability: row.str(4), Epoch: uint32(row.uint(5)), Event: row.str(6), At: row.time(7),
			MeanCov: row.float(8), MeanDelta: row.float(9), RunsPassed: uint16(row.uint(10)), RunsTotal: uint16(row.uint(11)),
			Window:  schemas.Window{Start: row.time(12), End: row.time(13), Rollouts: int(row.uint(14)), Failures: int(row.uint(15))},
			Payload: row.str(16)})
	}
	if want := []TriggerEvent{fired, desel, rearm, other}; !reflect.DeepEqual(hist, want) {
		t.Errorf("TriggerHistory:\n got %+v\nwant %+v", hist, want)
	}

	// StoredRuns: the runs with labels (capability_labels, from the labels
	// subtest: b6 has run 0) and those recorded in label_runs, valid or
	// failed, of this dictionary version only.
	const runCols = "environment, agent_version, dictionary_version, rollout_id, run, labeler, status, reason, at, ingest_ns"
	lr := func(av string, dv uint32, id string, run uint16, status, reason string, ns uint64) []any {
		return []any{"env", av, dv, id, run, "llm", status, reason, base.Add(time.Hour), ns}
	}
	c.insert("label_runs", runCols,
		lr("v2", 1, "b6", 0, "ok", "", 10),
		lr("v2", 1, "b6", 1, "failed", "timeout: no answer in 30s", 10),
		lr("v2", 2, "b6", 4, "failed", "other dictionary", 10),
		lr("v1", 1, "b6", 7, "ok", "other agent version", 10))
	c.insert("label_runs", runCols, lr("v2", 1, "b6", 1, "failed", "timeout: no answer in 30s", 20)) // redelivered
	// Run 2 failed, then a relabel labeled it: done, and no longer failed.
	c.insert("label_runs", runCols, lr("v2", 1, "b6", 2, "failed", "HTTP 400: no such model", 10))
	c.insert("label_runs", runCols, lr("v2", 1, "b6", 2, "ok", "", 30))
	// runSet runs a query of distinct run numbers (StoredRuns, DoneRuns).
	runSet := func(name string, query func(env, av, id string, dv uint32) (string, []any)) func(av, id string, dv uint32) []int {
		return func(av, id string, dv uint32) []int {
			q, args := query("env", av, id, dv)
			r := c.query(q, args...)
			r.wantTypes(t, name, "UInt16")
			var out []int
			for _, row := range r.rows {
				if n := int(row.uint(0)); !slices.Contains(out, n) {
					out = append(out, n)
				}
			}
			slices.Sort(out)
			return out
		}
	}
	storedRuns := runSet("StoredRuns", storedRunsSQL)
	for _, tc := range []struct {
		av, id string
		dv     uint32
		want   []int
	}{
		{"v2", "b6", 1, []int{0, 1, 2}},
		{"v2", "b6", 2, []int{4}},
		{"v2", "b3", 1, []int{0, 1, 2}}, // cap_x runs 0-1, cap_y runs 0-2
		{"v2", "b4", 1, []int{0, 1, 2, 3}},
		{"v2", "nope", 1, nil},
	} {
		if got := storedRuns(tc.av, tc.id, tc.dv); !slices.Equal(got, tc.want) {
			t.Errorf("StoredRuns(%s, %s, dict %d) = %v, want %v", tc.av, tc.id, tc.dv, got, tc.want)
		}
	}

	// DoneRuns: as StoredRuns, less the runs whose newest record is failed.
	doneRuns := runSet("DoneRuns", doneRunsSQL)
	for _, tc := range []struct {
		av, id string
		dv     uint32
		want   []int
	}{
		{"v2", "b6", 1, []int{0, 2}},
		{"v2", "b6", 2, nil},
		{"v1", "b6", 1, []int{7}},
		{"v2", "b4", 1, []int{0, 1, 2, 3}},
	} {
		if got := doneRuns(tc.av, tc.id, tc.dv); !slices.Equal(got, tc.want) {
			t.Errorf("DoneRuns(%s, %s, dict %d) = %v, want %v", tc.av, tc.id, tc.dv, got, tc.want)
		}
	}

	// FailedLabelRuns: per cohort, distinct (rollout, run)s whose newest
	// record is failed.
	r = c.query(failedLabelRunsSQL)
	r.wantTypes(t, "FailedLabelRuns", "String", "String", "UInt32", "String", "UInt64", "String")
	var failed []string
	for _, row := range r.rows {
		failed = append(failed, fmt.Sprintf("%s/%s/%d %s %d %s", row.str(0), row.str(1), row.uint(2), row.str(3), row.uint(4), row.str(5)))
	}
	if want := []string{"env/v2/1 llm 1 timeout: no answer in 30s", "env/v2/2 llm 1 other dictionary"}; !slices.Equal(failed, want) {
		t.Errorf("FailedLabelRuns = %v, want %v", failed, want)
	}
	// LabeledRuns counts label_runs too, but not a failed run: b6 has
	// labels in run 0, run 0 ok, run 1 failed and run 2 failed then ok in
	// label_runs.
	q, args := labeledRunsSQL(cohortB)
	runsOf := map[string]uint64{}
	for _, row := range c.query(q, args...).rows {
		runsOf[row.str(0)] = row.uint(1)
	}
	if runsOf["b6"] != 2 {
		t.Errorf("LabeledRuns(B)[b6] = %d, want 2 (runs 0 and 2)", runsOf["b6"])
	}
}

// chdbTTL checks that the modern dialect's retention works: a row older
// than RetentionDays is gone after a merge.
func chdbTTL(t *testing.T, c *chdbDB) {
	c = c.on(t)
	now := time.Now().UTC()
	call := func(at time.Time, id string) []any {
		return []any{at, "label", "m", "http://127.0.0.1:1/v1", "h", id, uint16(0), uint8(1), uint32(10), uint32(5), uint32(100), "ok", ""}
	}
	c.insert("llm_calls", "ts, purpose, model, endpoint, prompt_hash, rollout_id, run, attempt, prompt_tokens, completion_tokens, latency_ms, outcome, error",
		call(now.AddDate(0, 0, -(chdbDialect.RetentionDays+10)), "old"), call(now.Add(-time.Hour), "new"))
	c.exec("OPTIMIZE TABLE llm_calls FINAL")
	var ids []string
	for _, row := range c.query("SELECT rollout_id FROM llm_calls ORDER BY ts").rows {
		ids = append(ids, row.str(0))
	}
	if !slices.Equal(ids, []string{"new"}) {
		t.Errorf("llm_calls after OPTIMIZE FINAL: %v, want only the row within %d days", ids, chdbDialect.RetentionDays)
	}
}

// chdbRetention: reconcileRetention's SQL on 26.7. The migrations' TTL is
// read back as trace's own on every retention table, and a planned change
// of retention, run on a copy of llm_calls, takes effect: the copy's TTL is
// the new one and a row past it goes at the next merge. An operator's TTL
// is left alone.
func chdbRetention(t *testing.T, c *chdbDB) {
	c = c.on(t)
	engines := map[string]string{}
	for _, row := range c.query(retentionTablesSQL()).rows {
		engines[row.str(0)] = row.str(1)
	}
	for _, tbl := range retentionTables {
		e, ok := engines[tbl.Table]
		if !ok {
			t.Errorf("%s: not in the retention tables' query", tbl.Table)
			continue
		}
		if step := planRetention(tbl, e, chdbDialect.RetentionDays); step.SQL != "" || step.Foreign {
			t.Errorf("%s made with retention %d: plan %+v, want nothing to do\n%s", tbl.Table, chdbDialect.RetentionDays, step, e)
		}
	}

	probe := retentionTable{"retention_probe", "ts"}
	c.exec("CREATE TABLE retention_probe AS llm_calls")
	engine := func() string {
		return c.query("SELECT engine_full FROM system.tables WHERE database = currentDatabase() AND name = 'retention_probe'").rows[0].str(0)
	}
	step := planRetention(probe, engine(), 30)
	if step.SQL == "" || !step.Shortens {
		t.Fatalf("retention 90 -> 30: plan %+v, want a shortening ALTER", step)
	}
	c.exec(step.SQL)
	if got, ok := traceTTLDays(tableTTL(engine()), "ts"); !ok || got != 30 {
		t.Fatalf("after %s: TTL %q", step.SQL, tableTTL(engine()))
	}
	if again := planRetention(probe, engine(), 30); again.SQL != "" {
		t.Errorf("a second start with retention 30 plans %q", again.SQL)
	}
	now := time.Now().UTC()
	call := func(at time.Time, id string) []any {
		return []any{at, "label", "m", "http://127.0.0.1:1/v1", "h", id, uint16(0), uint8(1), uint32(10), uint32(5), uint32(100), "ok", ""}
	}
	c.insert("retention_probe", "ts, purpose, model, endpoint, prompt_hash, rollout_id, run, attempt, prompt_tokens, completion_tokens, latency_ms, outcome, error",
		call(now.AddDate(0, 0, -40), "past 30 days"), call(now.Add(-time.Hour), "new"))
	c.exec("OPTIMIZE TABLE retention_probe FINAL")
	var ids []string
	for _, row := range c.query("SELECT rollout_id FROM retention_probe ORDER BY ts").rows {
		ids = append(ids, row.str(0))
	}
	if !slices.Equal(ids, []string{"new"}) {
		t.Errorf("retention_probe at retention 30 after OPTIMIZE FINAL: %v, want only the new row", ids)
	}

	c.exec("ALTER TABLE retention_probe MODIFY TTL ts + INTERVAL 5 DAY DELETE WHERE purpose = 'x'")
	if step := planRetention(probe, engine(), 30); step.SQL != "" || !step.Foreign {
		t.Errorf("an operator's TTL %q: plan %+v, want it left alone", tableTTL(engine()), step)
	}
	c.exec("DROP TABLE retention_probe")
}

// chdbEnvironments: the environments table's statements (SaveEnvironment's
// column list, Environment, Environments with every filter) on 26.7, with
// the outcomes sink's 18.16 test expects: the newest version of each
// environment wins, an old version never matches a filter.
func chdbEnvironments(t *testing.T, c *chdbDB, base time.Time) {
	c = c.on(t)
	row := func(id, status string, version uint64, at time.Time) []any {
		return []any{id, "t-" + id, "sim-airline", "1.4.0", uint32(1), "precondition_verification", "precondition_verification",
			status, "", uint8(version), "def reset(seed):\n    pass\n", "ab", `["get_reservation_details"]`, 0.4, 0.35, uint8(1), `{"1":0.35}`,
			`{"trigger_id":"t-` + id + `"}`, `[{"n":1}]`, `{"accepted":true}`, `{"rank":1}`, at, at, version}
	}
	c.insert("environments", environmentColumns,
		row("env-a", "PENDING", 1, base), row("env-a", "GENERATING", 2, base), row("env-b", "GENERATING", 1, base.Add(time.Minute)))
	c.insert("environments", environmentColumns,
		row("env-a", "DONE", 4, base), row("env-a", "DONE", 4, base), row("env-a", "CALIBRATING", 3, base), row("env-c", "FAILED", 7, base.Add(-time.Minute)))

	r := c.query(environmentSQL, "env-a")
	r.wantTypes(t, "Environment", "String", "String", "String", "String", "UInt32", "String",
		"String", "String", "String", "UInt8", "String", "String", "String", "Float64", "Float64", "UInt8",
		"String", "String", "String", "String", "String", "DateTime", "DateTime", "UInt64")
	if len(r.rows) != 1 || r.rows[0].str(7) != "DONE" || r.rows[0].uint(23) != 4 || r.rows[0].str(10) != "def reset(seed):\n    pass\n" {
		t.Fatalf("Environment(env-a) = %v", r.rows)
	}
	if r := c.query(environmentSQL, "env-zzz"); len(r.rows) != 0 {
		t.Fatalf("a missing environment: %v", r.rows)
	}
	for _, tt := range []struct {
		f    EnvironmentFilter
		want []string
	}{
		{EnvironmentFilter{}, []string{"env-b", "env-a", "env-c"}},
		{EnvironmentFilter{Status: "CALIBRATING"}, nil},
		{EnvironmentFilter{Status: "GENERATING"}, []string{"env-b"}},
		{EnvironmentFilter{Status: "DONE", Full: true}, []string{"env-a"}},
		{EnvironmentFilter{Environment: "sim-airline", AgentVersion: "1.4.0", Limit: 2}, []string{"env-b", "env-a"}},
	} {
		q, args := environmentsSQL(tt.f)
		r := c.query(q, args...)
		var ids []string
		for _, row := range r.rows {
			ids = append(ids, row.str(0))
			if st := row.str(7); row.str(0) == "env-a" && st != "DONE" {
				t.Errorf("filter %+v: env-a listed as %s", tt.f, st)
			}
			if prog := row.str(10); (prog != "") != tt.f.Full {
				t.Errorf("filter %+v: program %q", tt.f, prog)
			}
		}
		if !slices.Equal(ids, tt.want) {
			t.Errorf("Environments(%+v) = %v, want %v", tt.f, ids, tt.want)
		}
	}
	for _, tt := range []struct {
		f    EnvironmentFilter
		want map[string]uint64
	}{
		{EnvironmentFilter{Limit: 1}, map[string]uint64{"DONE": 1, "GENERATING": 1, "FAILED": 1}},
		{EnvironmentFilter{Status: "CALIBRATING"}, map[string]uint64{}},
		{EnvironmentFilter{Environment: "sim-airline", AgentVersion: "1.4.0", Status: "DONE"}, map[string]uint64{"DONE": 1}},
	} {
		q, args := environmentCountsSQL(tt.f)
		r := c.query(q, args...)
		r.wantTypes(t, "EnvironmentStatusCounts", "String", "UInt64")
		got := map[string]uint64{}
		for _, row := range r.rows {
			got[row.str(0)] = row.uint(1)
		}
		if !maps.Equal(got, tt.want) {
			t.Errorf("EnvironmentStatusCounts(%+v) = %v, want %v", tt.f, got, tt.want)
		}
	}
}

// chdbDashboard runs the dashboard's statements (sink/dashboard.go) with
// their documented example binds, hourly and daily, and the demo's and the
// benchmarks' counts, on the data of the sections before: the dialect must
// accept every one. (Their numbers are checked on 18.16 by the dashboard's
// tests.)
func chdbDashboard(t *testing.T, c *chdbDB) {
	c = c.on(t)
	chdbRollup(t, c)
	for _, q := range DashboardQueries {
		text, err := q.Example()
		if err != nil {
			t.Fatalf("%s: %v", q.Name, err)
		}
		c.query(text)
		if daily := dailySQL(text); daily != text {
			c.query(daily)
		}
	}
	r := c.query(QWeekBounds, uint32(1.7e9), uint32(1.7e9), uint32(14))
	if len(r.rows) != 1 {
		t.Fatalf("QWeekBounds: %d rows", len(r.rows))
	}
	if n := c.query(countRolloutsSQL).rows[0].uint(0); n < 200 {
		t.Errorf("CountRollouts: %d rows, want at least the 200 rows of the rollouts section", n)
	}
	r = c.query(countLabelsSQL)
	r.wantTypes(t, "CountLabels", "UInt64", "UInt64")
	if r.rows[0].uint(0) == 0 || r.rows[0].uint(1) < r.rows[0].uint(0) {
		t.Errorf("CountLabels: %d labeled rollouts, %d labels", r.rows[0].uint(0), r.rows[0].uint(1))
	}
	c.query(activeMergesSQL)
}

// chdbTraining: the training_jobs, training_job_events and adapters
// statements on 26.7 with the outcomes sink's 18.16 test expects: the
// newest job version wins, only open jobs past their deadline are overdue,
// a redelivered event is one, the newest adapter version wins.
func chdbTraining(t *testing.T, c *chdbDB, base time.Time) {
	c = c.on(t)
	job := func(id, status string, v uint64, deadline time.Time) []any {
		return []any{id, "env-" + id, uint32(1), "sim-airline", "1.4.0", "precondition_verification", "m", "nats", status, "", "a-" + id,
			uint32(0), uint32(20), 0.0, uint8(0), `{}`, `{}`, base, base, deadline, base.Add(time.Duration(len(id)) * time.Second), base, v}
	}
	c.insert("training_jobs", trainingJobColumns, job("j1", "DISPATCHED", 1, base.Add(time.Hour)), job("j1", "SUCCEEDED", 3, base.Add(time.Hour)),
		job("j22", "RUNNING", 1, base.Add(time.Minute)), job("j333", "DISPATCHED", 1, base.Add(3*time.Hour)))
	r := c.query(trainingJobSQL, "j1")
	r.wantTypes(t, "TrainingJob", "String", "String", "UInt32", "String", "String", "String", "String", "String",
		"String", "String", "String", "UInt32", "UInt32", "Float64", "UInt8", "String", "String",
		"DateTime", "DateTime", "DateTime", "DateTime", "DateTime", "UInt64")
	if len(r.rows) != 1 || r.rows[0].str(8) != "SUCCEEDED" {
		t.Fatalf("TrainingJob(j1) = %v", r.rows)
	}
	r = c.query(overdueJobsSQL, base.Add(2*time.Hour))
	if len(r.rows) != 1 || r.rows[0].str(0) != "j22" {
		t.Fatalf("overdue: %v", r.rows)
	}
	q, args := trainingJobsSQL(TrainingJobFilter{Status: "DISPATCHED", Capability: "precondition_verification", EnvironmentID: "env-j333", Limit: 5})
	if r := c.query(q, args...); len(r.rows) != 1 || r.rows[0].str(0) != "j333" {
		t.Fatalf("TrainingJobs: %v", r.rows)
	}
	q, args = trainingJobCountsSQL(TrainingJobFilter{Limit: 1})
	r = c.query(q, args...)
	r.wantTypes(t, "TrainingJobStatusCounts", "String", "UInt64")
	counts := map[string]uint64{}
	for _, row := range r.rows {
		counts[row.str(0)] = row.uint(1)
	}
	if want := map[string]uint64{"SUCCEEDED": 1, "RUNNING": 1, "DISPATCHED": 1}; !maps.Equal(counts, want) {
		t.Errorf("TrainingJobStatusCounts = %v, want %v", counts, want)
	}
	ev := []any{"j1", "s1", "progress", base, base.UnixNano(), int32(1), 0.4, 0.1, 0.0, uint8(0), `{}`, base}
	c.insert("training_job_events", trainingEventColumns, ev, ev)
	r = c.query(trainingEventsSQL, "j1")
	r.wantTypes(t, "TrainingEvents", "String", "String", "String", "DateTime", "Int64", "Int32", "Float64", "Float64", "Float64", "UInt8", "String", "DateTime")
	if len(r.rows) != 1 {
		t.Fatalf("a redelivered event is one: %v", r.rows)
	}
	ad := func(name, status string, v uint64) []any {
		return []any{name, "j1", "env-j1", "precondition_verification", "sim-airline", "1.4.0", "m", "file:///a", `{}`, 0.7, 0.5, status, uint8(1), `{}`, base, base, v}
	}
	c.insert("adapters", adapterColumns, ad("a1", "candidate", 1), ad("a1", "active", 2), ad("a2", "candidate", 1))
	r = c.query(adapterSQL, "a1")
	r.wantTypes(t, "Adapter", "String", "String", "String", "String", "String", "String", "String", "String",
		"String", "Float64", "Float64", "String", "UInt8", "String", "DateTime", "DateTime", "UInt64")
	if len(r.rows) != 1 || r.rows[0].str(11) != "active" {
		t.Fatalf("Adapter(a1) = %v", r.rows)
	}
	q, args = adaptersSQL(AdapterFilter{Status: "candidate", Environment: "sim-airline", Capability: "precondition_verification"})
	if r := c.query(q, args...); len(r.rows) != 1 || r.rows[0].str(0) != "a2" {
		t.Fatalf("Adapters(candidate) = %v", r.rows)
	}
	// The Training page's: the adapters but the active ones, bounded; the
	// listed jobs' adapters; the counts of every adapter by status.
	q, args = adaptersSQL(AdapterFilter{NotStatus: "active", Limit: 5})
	if r := c.query(q, args...); len(r.rows) != 1 || r.rows[0].str(0) != "a2" {
		t.Fatalf("Adapters(not active) = %v", r.rows)
	}
	q, args = adaptersSQL(AdapterFilter{JobIDs: []string{"j1", "j-none"}})
	if r := c.query(q, args...); len(r.rows) != 2 {
		t.Fatalf("Adapters(jobs j1) = %v", r.rows)
	}
	q, args = adapterCountsSQL(AdapterFilter{Limit: 1})
	r = c.query(q, args...)
	r.wantTypes(t, "AdapterStatusCounts", "String", "UInt64")
	adCounts := map[string]uint64{}
	for _, row := range r.rows {
		adCounts[row.str(0)] = row.uint(1)
	}
	if want := map[string]uint64{"active": 1, "candidate": 1}; !maps.Equal(adCounts, want) {
		t.Errorf("AdapterStatusCounts = %v, want %v", adCounts, want)
	}
	// Reward curves (the dashboard's Training page): progress events of the
	// newest jobs, in iteration order; j1 is the oldest job.
	pe := func(job, key string, it int32, r float64) []any {
		return []any{job, key, "progress", base, base.UnixNano() + int64(it), it, r, 0.2, 0.01, uint8(1), `{}`, base}
	}
	c.insert("training_job_events", trainingEventColumns, pe("j22", "s2", 2, 0.6), pe("j22", "s1", 1, 0.3),
		[]any{"j22", "s9", "succeeded", base, base.UnixNano() + 9, int32(2), 0.9, 0.0, 0.0, uint8(0), `{}`, base})
	r = c.query(trainingCurvesSQL, uint64(10))
	r.wantTypes(t, "TrainingCurves", "String", "Int32", "Float64", "Float64", "Float64", "UInt8")
	if len(r.rows) != 3 || r.rows[0].str(0) != "j1" || r.rows[1].str(0) != "j22" || r.rows[1].float(1) != 1 || r.rows[2].float(2) != 0.6 {
		t.Fatalf("TrainingCurves(10) = %v", r.rows)
	}
	if r := c.query(trainingCurvesSQL, uint64(2)); len(r.rows) != 2 || r.rows[0].str(0) != "j22" {
		t.Fatalf("TrainingCurves(2) = %v", r.rows)
	}
}

// chdbRouting: route_decisions' reads on 26.7 with the outcomes of sink's
// 18.16 test (TestRouteDecisions): rows in order with their arrays, the
// latest decision per conversation, requests per adapter and hour.
func chdbRouting(t *testing.T, c *chdbDB, base time.Time) {
	c = c.on(t)
	row := func(req, dec, conv, adapter string, off time.Duration, cached uint8) []any {
		at := base.Add(off)
		return []any{at, at.UnixNano(), req, dec, conv, "header", "sim-airline", "1.4.0", "proxy", cached, adapter, "cap", adapter, "A",
			[]string{"A", "B"}, []string{"cap", "none"}, []string{"a1", ""}, []float64{0.75, 0.25}, []string{"a1"}, []float64{1},
			"classified", "", "base", uint32(12), uint32(150), uint16(200), "ok", uint8(1), nil, nil, ""}
	}
	r1 := row("r1", "d1", "c1", "a1", 0, 0)
	r1[28], r1[29] = uint32(1200), uint32(34) // its usage; the others reported none
	r1[30] = "caller-7"                       // its caller's X-Request-Id
	c.insert("route_decisions", routeDecisionColumns, r1, row("r2", "d1", "c1", "a1", time.Second, 1),
		row("r3", "d2", "c2", "", 90*time.Minute, 0))
	q, args := routeDecisionsSQL(RouteDecisionFilter{Environment: "sim-airline", Since: base.Add(-time.Hour), Limit: 10})
	r := c.query(q, args...)
	if len(r.rows) != 3 || r.rows[0].str(2) != "r1" || r.rows[2].str(2) != "r3" || !slices.Equal(r.rows[0].strs(14), []string{"A", "B"}) ||
		r.rows[0].uint(28) != 1200 || r.rows[0].uint(29) != 34 || string(r.rows[1].vals[28]) != "null" ||
		r.rows[0].str(30) != "caller-7" || r.rows[1].str(30) != "" {
		t.Fatalf("RouteDecisions: %v", r.rows)
	}
	r = c.query(tokenUsageSQL, "sim-airline", base.Add(-time.Hour))
	if len(r.rows) != 2 || (r.rows[0].str(1) == "a1") == (r.rows[1].str(1) == "a1") {
		t.Fatalf("TokenUsage: %v, want a row for a1 and one for the base model", r.rows)
	}
	for _, row := range r.rows {
		want := "1 0 null null" // r3, the base model's, reported none
		if row.str(1) == "a1" {
			want = "2 1 1200 34" // r1 and r2 (cached, none)
		}
		if got := fmt.Sprintf("%d %d %s %s", row.uint(2), row.uint(3), strings.Trim(string(row.vals[4]), `"`), strings.Trim(string(row.vals[5]), `"`)); got != want {
			t.Fatalf("TokenUsage of %q: %s, want %s", row.str(1), got, want)
		}
	}
	r = c.query(`SELECT conversation_id, decision_id, adapter FROM (`+RouteByConversationSQL+`) WHERE has(?, conversation_id)`, "sim-airline", []string{"c1", "c2", "c3"})
	got := map[string]string{}
	for _, row := range r.rows {
		got[row.str(0)] = row.str(1) + "/" + row.str(2)
	}
	if len(got) != 2 || got["c1"] != "d1/a1" || got["c2"] != "d2/" {
		t.Fatalf("RouteByConversationSQL: %v", got)
	}
	// Retrieval candidates: successful, labeled PRESENT for the capability.
	coh := Cohort{Environment: "route-env", AgentVersion: "v1", DictionaryVersion: 1}
	for _, x := range []struct {
		id    string
		ok    bool
		label string
	}{{"rt-ok", true, "PRESENT"}, {"rt-failed", false, "PRESENT"}, {"rt-na", true, "NA"}} {
		ro := chdbRollout(x.id, x.ok, base.Add(time.Duration(len(x.id))*time.Second), "")
		ro.Environment = "route-env"
		c.insert("rollouts", rolloutCols, rolloutValues(RolloutRowFrom(ro, Coord{}), base))
		c.insert("capability_labels", labelCols, labelValues(coh, x.id, x.ok, "policy_lookup", 0, x.label, base, 1))
	}
	r = c.query(successfulTrajectoriesSQL, "route-env", "route-env", "policy_lookup", 5)
	if len(r.rows) != 1 || r.rows[0].str(0) != "rt-ok" || !strings.Contains(r.rows[0].str(1), `"role":"user"`) {
		t.Fatalf("SuccessfulTrajectories: %v", r.rows)
	}
	r = c.query(routeSharesSQL, "sim-airline", base.Add(-time.Hour))
	if len(r.rows) != 2 || r.rows[0].str(1) != "a1" || r.rows[0].uint(2) != 2 || r.rows[1].str(1) != "" || r.rows[1].uint(2) != 1 {
		t.Fatalf("RouteShares: %v", r.rows)
	}
}

// chdbRollup runs the rollup's statements (rollup.go) on 26.7 over the data
// of the sections before, as Store.Rollup does, then checks that every
// rollup-backed dashboard statement gives its raw statement's rows (the
// documented example binds), and that the rollup left no stale hour.
func chdbRollup(t *testing.T, c *chdbDB) {
	now := time.Now().Add(RollupGrace + time.Second)
	todo := c.query(rollupTodoSQL, unixSec(now), uint64(now.UnixNano()), uint64(100000))
	todo.wantTypes(t, "rollup todo", "UInt8", "String", "String", "DateTime", "UInt64")
	if len(todo.rows) == 0 {
		t.Fatal("rollup: no stale hour in the data of the sections before")
	}
	byKind := map[uint64][]rollupHour{}
	for _, r := range todo.rows {
		k := r.uint(0)
		byKind[k] = append(byKind[k], rollupHour{kind: uint8(k), env: r.str(1), av: r.str(2), hour: r.time(3), version: r.uint(4)})
	}
	for _, hs := range byKind {
		for _, q := range rollupStatements(hs) {
			text, err := inlineArgs(q.sql, q.args)
			if err != nil {
				t.Fatal(err)
			}
			c.exec(text)
		}
		var marks [][]any
		for _, h := range hs {
			marks = append(marks, []any{h.kind, h.env, h.av, h.hour, h.version, uint64(now.UnixNano()), now, rollupLayout})
		}
		c.insert("rollup_hours", "kind, environment, agent_version, hour, version, run_ns, rolled_at, layout", marks...)
	}
	wm, err := inlineArgs(watermarkSQL, []any{uint64(now.UnixNano()), unixSec(now), uint64(now.UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	c.exec(wm)
	prune, err := inlineArgs(pruneRollupLogSQL, []any{uint64(1)})
	if err != nil {
		t.Fatal(err)
	}
	c.exec(prune) // the hourly prune's mutation (nothing is that old)
	recent, err := inlineArgs(recentLabelsSQL, []any{uint32(0)})
	if err != nil {
		t.Fatal(err)
	}
	if r := c.query(recent); len(r.rows) == 0 {
		t.Error("recent labels: no cohort in the rollup")
	} else {
		r.wantTypes(t, "recent labels", "String", "String", "UInt32", "UInt64")
	}
	if r := c.query(staleCountSQL); r.rows[0].uint(0) != 0 || r.rows[0].uint(1) != 0 {
		t.Errorf("after the rollup: %s/%s hours stale", r.rows[0].vals[0], r.rows[0].vals[1])
	}
	chdbWindowRollup(t, c)
	for _, q := range DashboardQueries {
		if q.Raw == "" || q.Name == "QRollouts" {
			continue
		}
		text, err := q.Example()
		if err != nil {
			t.Fatal(err)
		}
		lits := make([]string, len(q.Binds))
		for i, b := range q.Binds {
			lits[i] = b.Example
		}
		raw, err := InlineBinds(q.Raw, lits...)
		if err != nil {
			t.Fatal(err)
		}
		got, want := c.query(text), c.query(raw)
		// And as QueryDashboard runs it, with the rollup state inlined.
		wm := c.query(watermarkReadSQL)
		dh, err := inlineArgs(dirtyHoursSQL, []any{wm.rows[0].uint(0), uint64(maxInlineDirty + 1)})
		if err != nil {
			t.Fatal(err)
		}
		if d := c.query(dh); len(d.rows) != 0 {
			t.Errorf("dirty hours after the rollup: %v", d.rows)
		}
		st := rollupState{through: wm.rows[0].uint(0), closed: uint32(wm.rows[0].uint(1))}
		inl := strings.NewReplacer(dirtyLabels, dirtyLiteral(st.labels), dirtyRollouts, dirtyLiteral(st.outs)).Replace(text)
		inl = strings.NewReplacer(wmThrough, fmt.Sprintf("toUInt64(%d)", st.through), wmClosed, fmt.Sprintf("toDateTime(%d)", st.closed)).Replace(inl)
		if inl == text {
			t.Errorf("%s: nothing inlined", q.Name)
		}
		if g2 := c.query(inl); len(g2.rows) != len(got.rows) || (len(got.rows) > 0 && string(g2.rows[0].vals[0]) != string(got.rows[0].vals[0])) {
			t.Errorf("%s: inlined %d rows, as documented %d", q.Name, len(g2.rows), len(got.rows))
		}
		if len(got.rows) != len(want.rows) {
			t.Errorf("%s: %d rows from the rollup, %d raw", q.Name, len(got.rows), len(want.rows))
			continue
		}
		for i := range got.rows {
			for j := range got.rows[i].vals {
				a, b := string(got.rows[i].vals[j]), string(want.rows[i].vals[j])
				if a == b {
					continue
				}
				fa, ea := strconv.ParseFloat(strings.Trim(a, `"`), 64)
				fb, eb := strconv.ParseFloat(strings.Trim(b, `"`), 64)
				if ea == nil && eb == nil && math.Abs(fa-fb) <= 1e-9*math.Max(1, math.Abs(fa)) {
					continue
				}
				t.Errorf("%s row %d column %s: %s from the rollup, %s raw", q.Name, i, got.names[j], a, b)
			}
		}
	}
}

// chdbWindowRollup checks, after the rollup, that the decision windows read
// through window_hourly and window_rollouts_hourly equal their raw
// computation, for every cohort of the data: all of it, N = 3, wall-clock
// bounds and event-time ranges with partial hours.
func chdbWindowRollup(t *testing.T, c *chdbDB) {
	t.Helper()
	for _, table := range []string{"window_hourly", "window_rollouts_hourly"} {
		if r := c.query("SELECT count() FROM " + table); r.rows[0].uint(0) == 0 {
			t.Fatalf("%s is empty after the rollup", table)
		}
	}
	q, args := watermarksSQL(nil)
	marks := c.query(q, args...)
	var cohorts []Cohort
	ranges := map[Cohort]Range{}
	var newest time.Time
	for _, row := range marks.rows {
		co := Cohort{Environment: row.str(0), AgentVersion: row.str(1), DictionaryVersion: uint32(row.uint(2))}
		cohorts = append(cohorts, co)
		ranges[co] = EventRange(row.time(3), 26*time.Hour+7*time.Minute+11*time.Second)
		if row.time(3).After(newest) {
			newest = row.time(3)
		}
	}
	for name, spec := range map[string]MultiSpec{
		"all":         {Cohorts: cohorts},
		"runs-3":      {Cohorts: cohorts, Runs: 3},
		"since-until": {Cohorts: cohorts, Since: newest.Add(-400*24*time.Hour - 13*time.Minute), Until: newest.Truncate(time.Hour)},
		"ranges":      {Cohorts: cohorts, Ranges: ranges, Runs: 2},
	} {
		raw := spec
		raw.Raw = true
		got, want := chdbWindowCounts(t, c, spec), chdbWindowCounts(t, c, raw)
		if len(want) == 0 || !reflect.DeepEqual(got, want) {
			t.Errorf("window %s: counts through the rollup\n %+v\nraw\n %+v", name, got, want)
		}
		if gi, wi := chdbWindowInfo(t, c, spec), chdbWindowInfo(t, c, raw); !reflect.DeepEqual(gi, wi) {
			t.Errorf("window %s: info through the rollup\n %+v\nraw\n %+v", name, gi, wi)
		}
	}
}
