package sink

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Retention: clickhouse.retention_days is the TTL of the raw and audit
// tables. The migrations write it into a table they create; Migrate then
// brings the tables that exist to it (reconcileRetention), so setting or
// changing it on a running deployment takes effect at the next start.

// retentionTables are the tables clickhouse.retention_days applies to, each
// with the time column its TTL is on. The migrations render the same TTL
// clause (Dialect.TTL) when they create them; a test keeps the two in step.
var retentionTables = []retentionTable{
	{"rollouts", "end_time"},
	{"capability_labels", "ts"},
	{"labels_by_time", "ts"},
	{"label_runs", "at"},
	{"llm_calls", "ts"},
	{"route_decisions", "ts"},
	{"env_episodes", "ended_at"},
}

// retentionTable is a table with a retention TTL on one time column.
type retentionTable struct{ Table, Column string }

// retentionTablesSQL reads the engine clause of the retention tables in the
// current database; its TTL, if any, is in it as the server renders it
// (`TTL end_time + toIntervalDay(180)`).
func retentionTablesSQL() string {
	names := make([]string, len(retentionTables))
	for i, t := range retentionTables {
		names[i] = "'" + t.Table + "'"
	}
	return `SELECT name, engine_full FROM system.tables
WHERE database = currentDatabase() AND name IN (` + strings.Join(names, ", ") + `)
ORDER BY name`
}

// ttlClauseRe finds the TTL clause of an engine_full text: what follows
// " TTL " up to the SETTINGS clause or the end.
var ttlClauseRe = regexp.MustCompile(`\sTTL\s+(.*?)(?:\s+SETTINGS\s.*)?$`)

// tableTTL returns the TTL expression of a table's engine_full text, "" when
// it has none.
func tableTTL(engineFull string) string {
	m := ttlClauseRe.FindStringSubmatch(engineFull)
	if m == nil {
		return ""
	}
	return strings.TrimSpace(m[1])
}

// traceTTLDays returns the days of a TTL expression of the form the
// migrations write on col (`col + toIntervalDay(N)` as the server renders
// `col + INTERVAL N DAY`), and false for any other expression: one an
// operator wrote, which trace leaves alone.
func traceTTLDays(expr, col string) (int, bool) {
	rest, ok := strings.CutPrefix(expr, col+" + toIntervalDay(")
	if !ok {
		return 0, false
	}
	n, ok := strings.CutSuffix(rest, ")")
	if !ok {
		return 0, false
	}
	days, err := strconv.Atoi(n)
	if err != nil || days <= 0 {
		return 0, false
	}
	return days, true
}

// retentionStep is what reconcileRetention does to one table.
type retentionStep struct {
	Table string
	// SQL is the ALTER to run; "" when the table is left as it is.
	SQL string
	// Current is the table's TTL expression before, "" when none.
	Current string
	// Shortens says that SQL deletes rows the table kept until now.
	Shortens bool
	// Foreign says the table has a TTL that trace did not write, which
	// SQL leaves alone.
	Foreign bool
}

// planRetention decides what a retention table with the given engine_full
// text needs for a retention of days (> 0). A table without a TTL gets
// one; one with trace's TTL at another number of days gets the new one;
// a TTL of any other form (an operator's, say one that moves parts to
// another volume) is left alone and reported as Foreign. Retention 0
// (keep forever, the default) plans nothing: trace does not remove a TTL
// (ALTER TABLE ... REMOVE TTL does), so a process started with a config
// that leaves retention_days out cannot undo another's.
func planRetention(t retentionTable, engineFull string, days int) retentionStep {
	step := retentionStep{Table: t.Table, Current: tableTTL(engineFull)}
	if days <= 0 {
		return step
	}
	if step.Current != "" {
		cur, ours := traceTTLDays(step.Current, t.Column)
		if !ours {
			step.Foreign = true
			return step
		}
		if cur == days {
			return step
		}
		step.Shortens = days < cur
	}
	step.SQL = fmt.Sprintf("ALTER TABLE %s MODIFY TTL %s + INTERVAL %d DAY", t.Table, t.Column, days)
	return step
}

// checkRetention refuses a retention the server cannot keep: 18.16 has no
// TTL, and rows it was meant to delete would stay without a word.
func (s *Store) checkRetention() error {
	if s.cfg.RetentionDays > 0 && !s.features.TTL {
		return fmt.Errorf("clickhouse.retention_days: %d, but ClickHouse %s has no table TTL (20.1 and later have); "+
			"set it to 0 and drop old monthly partitions instead (docs/operations.md, Retention)", s.cfg.RetentionDays, s.version)
	}
	return nil
}

// reconcileRetention brings the existing retention tables to
// clickhouse.retention_days. ClickHouse applies a modified TTL to the
// parts already written as a background mutation (system.mutations): rows
// past the new limit are deleted in the background, not by the ALTER.
func (s *Store) reconcileRetention(ctx context.Context) error {
	days := s.cfg.RetentionDays
	if days <= 0 || !s.features.TTL { // checkRetention refused the second
		return nil
	}
	rows, err := s.conn.Query(ctx, retentionTablesSQL())
	if err != nil {
		return fmt.Errorf("retention: read the tables' TTL: %w", err)
	}
	engines := map[string]string{}
	for rows.Next() {
		var name, engine string
		if err := rows.Scan(&name, &engine); err != nil {
			rows.Close()
			return fmt.Errorf("retention: read the tables' TTL: %w", err)
		}
		engines[name] = engine
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("retention: read the tables' TTL: %w", err)
	}
	for _, t := range retentionTables {
		engine, ok := engines[t.Table]
		if !ok {
			continue // a table a later migration creates, with the TTL in it
		}
		step := planRetention(t, engine, days)
		switch {
		case step.Foreign:
			s.log.Warn("clickhouse.retention_days: the table has a TTL trace did not set; left as it is",
				"table", t.Table, "ttl", step.Current, "retention_days", days)
		case step.SQL == "":
		default:
			if err := s.conn.Exec(ctx, step.SQL); err != nil {
				return fmt.Errorf("retention: %s: %w", step.SQL, err)
			}
			was := step.Current
			if was == "" {
				was = "none"
			}
			msg := "clickhouse.retention_days: TTL set; older rows are deleted by a background mutation"
			if step.Shortens {
				s.log.Warn(msg+" (retention shortened)", "table", t.Table, "was", was, "retention_days", days)
			} else {
				s.log.Info(msg, "table", t.Table, "was", was, "retention_days", days)
			}
		}
	}
	return nil
}
