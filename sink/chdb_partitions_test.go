//go:build chdb

package sink

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// On a modern engine, one INSERT of rollouts (through its materialized
// views) and one of labels whose times span 150 months is refused with
// TOO_MANY_PARTS under the server's defaults, and accepted under the
// settings the store's connections carry (sessionSettings).
func TestChdbInsertSpanningManyMonths(t *testing.T) {
	c := openChdb(t)
	c.exec("CREATE DATABASE IF NOT EXISTS trace_chdb_months")
	c.exec("USE trace_chdb_months")
	for _, m := range Migrations {
		for _, stmt := range m.SQL(chdbDialect) {
			c.exec(stmt)
		}
	}
	var set []string
	for k, v := range sessionSettings(chdbDialect.Features) {
		set = append(set, fmt.Sprintf("%s = %v", k, v))
	}
	if len(set) == 0 {
		t.Fatal("no session settings for a modern server")
	}
	now := time.Now().UTC()
	for _, tc := range []struct{ table, cols string }{
		{"rollouts", rolloutCols},
		{"capability_labels", labelCols},
	} {
		values := func(prefix string) string {
			var rows []string
			for i := range 150 {
				end := time.Date(2010, time.Month(1+i), 15, 0, 0, 0, 0, time.UTC)
				var r []any
				if tc.table == "rollouts" {
					row := RolloutRowFrom(chdbRollout(fmt.Sprintf("%s%d", prefix, i), i%2 == 0, end, ""), Coord{})
					r = rolloutValues(row, now)
				} else {
					r = labelValues(Cohort{Environment: "env", AgentVersion: "v1", DictionaryVersion: 1}, fmt.Sprintf("%s%d", prefix, i), true, "cap", 0, "PRESENT", end, uint64(now.UnixNano()))
				}
				lits := make([]string, len(r))
				for j, v := range r {
					var err error
					if lits[j], err = literal(v); err != nil {
						t.Fatal(err)
					}
				}
				rows = append(rows, "("+strings.Join(lits, ", ")+")")
			}
			return strings.Join(rows, ",")
		}
		_, err := c.db.Exec(fmt.Sprintf("INSERT INTO %s (%s) VALUES %s", tc.table, tc.cols, values("a")))
		if err == nil || !strings.Contains(err.Error(), "TOO_MANY_PARTS") {
			t.Errorf("%s, defaults: err %v, want TOO_MANY_PARTS (the limit this test is about)", tc.table, err)
		}
		if _, err := c.db.Exec(fmt.Sprintf("INSERT INTO %s (%s) SETTINGS %s VALUES %s", tc.table, tc.cols, strings.Join(set, ", "), values("b"))); err != nil {
			t.Errorf("%s, with the store's settings: %v", tc.table, err)
		}
	}
}
