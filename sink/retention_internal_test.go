package sink

import (
	"regexp"
	"slices"
	"testing"
)

// The tables the migrations create with a TTL are the tables
// reconcileRetention keeps at clickhouse.retention_days, on the same
// columns.
func TestRetentionTablesMatchMigrations(t *testing.T) {
	d := Dialect{Features: FeaturesFor(Version{26, 7, 3}), RetentionDays: 7}
	create := regexp.MustCompile(`CREATE TABLE IF NOT EXISTS (\w+)`)
	ttl := regexp.MustCompile(`\nTTL (\w+) \+ INTERVAL 7 DAY`)
	var got []retentionTable
	for _, m := range Migrations {
		for _, stmt := range m.SQL(d) {
			c, tt := create.FindStringSubmatch(stmt), ttl.FindStringSubmatch(stmt)
			if tt == nil {
				continue
			}
			if c == nil {
				t.Fatalf("migration %d: a TTL outside a CREATE TABLE:\n%s", m.Version, stmt)
			}
			got = append(got, retentionTable{c[1], tt[1]})
		}
	}
	want := slices.Clone(retentionTables)
	cmp := func(a, b retentionTable) int {
		if a.Table < b.Table {
			return -1
		}
		if a.Table > b.Table {
			return 1
		}
		return 0
	}
	slices.SortFunc(got, cmp)
	slices.SortFunc(want, cmp)
	if !slices.Equal(got, want) {
		t.Errorf("tables created with a TTL: %v\nretentionTables: %v", got, want)
	}
}

func TestPlanRetention(t *testing.T) {
	rollouts := retentionTable{"rollouts", "end_time"}
	const head = "MergeTree PARTITION BY toYYYYMM(end_time) ORDER BY (environment, agent_version, rollout_id)"
	const tail = " SETTINGS index_granularity = 8192"
	for _, tc := range []struct {
		name, engine string
		days         int
		sql, current string
		shortens     bool
		foreign      bool
	}{
		{"no TTL, retention set", head + tail, 30,
			"ALTER TABLE rollouts MODIFY TTL end_time + INTERVAL 30 DAY", "", false, false},
		{"no TTL, no SETTINGS", head, 30,
			"ALTER TABLE rollouts MODIFY TTL end_time + INTERVAL 30 DAY", "", false, false},
		{"trace's TTL, same days", head + " TTL end_time + toIntervalDay(30)" + tail, 30,
			"", "end_time + toIntervalDay(30)", false, false},
		{"trace's TTL, fewer days", head + " TTL end_time + toIntervalDay(90)" + tail, 30,
			"ALTER TABLE rollouts MODIFY TTL end_time + INTERVAL 30 DAY", "end_time + toIntervalDay(90)", true, false},
		{"trace's TTL, more days", head + " TTL end_time + toIntervalDay(30)", 90,
			"ALTER TABLE rollouts MODIFY TTL end_time + INTERVAL 90 DAY", "end_time + toIntervalDay(30)", false, false},
		{"retention 0 leaves trace's TTL", head + " TTL end_time + toIntervalDay(30)" + tail, 0,
			"", "end_time + toIntervalDay(30)", false, false},
		{"retention 0, no TTL", head + tail, 0, "", "", false, false},
		{"an operator's move to a volume", head + " TTL end_time + toIntervalDay(30) TO VOLUME 'cold'" + tail, 30,
			"", "end_time + toIntervalDay(30) TO VOLUME 'cold'", false, true},
		{"an operator's TTL on another column", head + " TTL ingest_time + toIntervalDay(30)" + tail, 30,
			"", "ingest_time + toIntervalDay(30)", false, true},
		{"an operator's TTL in months", head + " TTL end_time + toIntervalMonth(3)" + tail, 30,
			"", "end_time + toIntervalMonth(3)", false, true},
		{"an operator's conditional delete", head + " TTL end_time + toIntervalDay(30) WHERE environment = 'x'" + tail, 30,
			"", "end_time + toIntervalDay(30) WHERE environment = 'x'", false, true},
		{"two TTL rules", head + " TTL end_time + toIntervalDay(30), end_time + toIntervalDay(10)" + tail, 30,
			"", "end_time + toIntervalDay(30), end_time + toIntervalDay(10)", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := planRetention(rollouts, tc.engine, tc.days)
			want := retentionStep{Table: "rollouts", SQL: tc.sql, Current: tc.current, Shortens: tc.shortens, Foreign: tc.foreign}
			if got != want {
				t.Errorf("planRetention(%q, %d)\n got %+v\nwant %+v", tc.engine, tc.days, got, want)
			}
		})
	}
}
