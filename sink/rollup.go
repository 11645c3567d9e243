package sink

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// The exact hourly rollup (docs/ARCHITECTURE.md, "Analytics at scale").
//
// Write side: rollup_changes (kept by materialized views at insert time)
// holds, per kind (1 = labels, 2 = rollouts), environment, agent version and
// hour, the newest ingest_ns written; rollup_log has the same changes sorted
// by ingest_ns. Rollup recomputes the closed hours whose newest change is not
// yet rolled up — from the raw rows, one label per identity, the newest
// version winning, exactly as the raw queries count — into label_hourly,
// labeled_hourly, rollout_hourly and the decision windows' window_hourly
// and window_rollouts_hourly (sink/windowrollup.go), each row versioned by the change it was
// computed through (ReplacingMergeTree: a later computation replaces an
// earlier one), and records in rollup_hours the change it computed through.
// When a run leaves no settled hour behind, it records the watermark
// (rollup_watermark): every closed hour (before closed_before) whose changes
// are all at most through is rolled up through its newest change. A crash at
// any point leaves the watermark behind, and the hours after it are read raw:
// every step is idempotent.
//
// Read side: an hour is read from the rollup when it is before the
// watermark's closed_before and has no change after its through (rollup_log
// answers that from its sorted tail: normally a handful of hours); its rows
// are the ones of the highest version (argMax(…, version)), the computation
// through its newest change. Every other hour — the open one, one that
// received late or redelivered data, a conflicting relabel, or one the job
// has not reached yet — is read from the raw rows, so the numbers are always
// the raw computation's, whatever the job's progress.

// rollupLayout is the set of tables a rollup run fills (migration 17
// added the decision windows'), written in each rollup_hours record
// (layout) and watermark (slot) this build makes; rollupLayoutSQL is it in
// statements. The rollup and the reads take only this layout's records, so
// those of an older build still running beside this one (a rolling
// upgrade), which filled fewer tables, leave their hours stale and read raw
// instead of covering hours whose window rows were never written. Raise
// both when a migration adds a table that Rollup fills.
const (
	rollupLayout    uint8 = 1
	rollupLayoutSQL       = "1"
)

// Rollup kinds (rollup_changes.kind, rollup_hours.kind).
const (
	rollupLabels   = 1
	rollupRollouts = 2
)

// RollupGrace is how long an hour's newest change must be old before the
// hour is rolled up: rows of one insert arrive together, and writers whose
// clocks disagree by less than this cannot slip a row behind a recorded
// change.
const RollupGrace = time.Minute

// rollupBatch is the number of hours recomputed per statement.
const rollupBatch = 200

// staleLabelHours and staleRolloutHours list the (environment,
// agent_version, hour) of labels and of rollouts whose newest change is not
// one the rollup was computed through (StaleHours counts them). Reads do
// not use them: they take the watermark and rollup_log's tail (dirtyLabels,
// dirtyRollouts in dashboard.go). They read only the small tables
// rollup_changes and rollup_hours.
const (
	staleLabelHours = `SELECT environment, agent_version, hour FROM (
		SELECT environment, agent_version, hour, maxMerge(last_ingest) AS v FROM rollup_changes
		WHERE kind = 1 GROUP BY environment, agent_version, hour)
	WHERE (environment, agent_version, hour, v) NOT IN (SELECT environment, agent_version, hour, version FROM rollup_hours WHERE kind = 1 AND layout = ` + rollupLayoutSQL + `)`
	staleRolloutHours = `SELECT environment, agent_version, hour FROM (
		SELECT environment, agent_version, hour, maxMerge(last_ingest) AS v FROM rollup_changes
		WHERE kind = 2 GROUP BY environment, agent_version, hour)
	WHERE (environment, agent_version, hour, v) NOT IN (SELECT environment, agent_version, hour, version FROM rollup_hours WHERE kind = 2 AND layout = ` + rollupLayoutSQL + `)`
)

// rollupTodoSQL lists the hours Rollup computes: closed (before now's hour),
// settled (newest change at most cutoff ns) and stale.
//
// Binds: now (Unix seconds), cutoff (ns), limit.
const rollupTodoSQL = `SELECT kind, environment, agent_version, hour, v FROM (
	SELECT kind, environment, agent_version, hour, maxMerge(last_ingest) AS v FROM rollup_changes
	GROUP BY kind, environment, agent_version, hour)
WHERE hour < toStartOfHour(toDateTime(?)) AND v <= ?
	AND (kind, environment, agent_version, hour, v) NOT IN (SELECT kind, environment, agent_version, hour, version FROM rollup_hours
		WHERE layout = ` + rollupLayoutSQL + `)
ORDER BY kind, environment, agent_version, hour
LIMIT ?`

// rollupHour is one hour to roll up and the change it is computed through.
type rollupHour struct {
	kind    uint8
	env, av string
	hour    time.Time
	version uint64
}

// RollupStats says what one Rollup call did.
type RollupStats struct {
	Hours      int  // hours recomputed
	Statements int  // INSERT … SELECT statements run
	More       bool // the limit was reached: call again
}

// labelHourlySQL recomputes label_hourly of a batch of hours: per cohort
// (dicts 0) and per agent version across dictionary versions (dicts 1, as
// QLackingWeekly counts), one label per identity.
func labelHourlySQL(dicts bool, in string) string {
	dv, group := "dictionary_version", "environment, agent_version, dictionary_version, capability, run, rollout_id"
	flag := "0"
	if dicts {
		dv, group, flag = "toUInt32(0)", "environment, agent_version, capability, run, rollout_id", "1"
	}
	return `INSERT INTO label_hourly (environment, agent_version, dicts, dictionary_version, capability, run, hour,
	lf, pf, nf, lp, pp, np, version)
SELECT environment, agent_version, toUInt8(` + flag + `), dv, capability, run, h,
	countIf(ok = 0 AND l = 'LACKING'), countIf(ok = 0 AND l = 'PRESENT'), countIf(ok = 0 AND l = 'NA'),
	countIf(ok = 1 AND l = 'LACKING'), countIf(ok = 1 AND l = 'PRESENT'), countIf(ok = 1 AND l = 'NA'),
	` + hourVersion("environment", "agent_version", "h") + `
FROM (
	SELECT ` + group + `, ` + dv + ` AS dv, toStartOfHour(ts) AS h,
		argMax(label, ingest_ns) AS l, argMax(success, ingest_ns) AS ok
	FROM labels_by_time
	WHERE (environment, agent_version, toStartOfHour(ts)) IN (` + in + `)
	GROUP BY ` + group + `, h)
GROUP BY environment, agent_version, dv, capability, run, h`
}

// labeledHourlySQL recomputes labeled_hourly: distinct labeled rollouts per
// cohort and hour.
func labeledHourlySQL(in string) string {
	return `INSERT INTO labeled_hourly (environment, agent_version, dictionary_version, hour, rollouts, version)
SELECT environment, agent_version, dictionary_version, toStartOfHour(ts) AS h, uniqExact(rollout_id),
	` + hourVersion("environment", "agent_version", "h") + `
FROM labels_by_time
WHERE (environment, agent_version, toStartOfHour(ts)) IN (` + in + `)
GROUP BY environment, agent_version, dictionary_version, h`
}

// rolloutHourlySQL recomputes rollout_hourly from the exact rollout_counts
// aggregate (distinct rollout ids per hour).
func rolloutHourlySQL(in string) string {
	return `INSERT INTO rollout_hourly (environment, agent_version, hour, rollouts, successes, version)
SELECT environment, agent_version, bucket, uniqExactMerge(rollouts), uniqExactIfMerge(successes),
	` + hourVersion("environment", "agent_version", "bucket") + `
FROM rollout_counts
WHERE (environment, agent_version, bucket) IN (` + in + `)
GROUP BY environment, agent_version, bucket`
}

// hourVersion is the version of a computed row: the change its hour is
// computed through, looked up by the row's (environment, agent_version,
// hour) in the batch's arrays (binds: the versions, then the hours' keys as
// hourKey strings; see rollupStatements).
func hourVersion(env, av, hour string) string {
	return "toUInt64(arrayElement(?, indexOf(?, " + hourKeyExpr(env, av, hour) + ")))"
}

// hourKeyExpr is the SQL of an hour's key string: environment, agent
// version and the hour's Unix seconds, NUL-separated (hourKey in Go).
func hourKeyExpr(env, av, hour string) string {
	return "concat(" + env + ", '\\0', " + av + ", '\\0', toString(toUInt32(" + hour + ")))"
}

// hourKey is the key string of an hour (hourKeyExpr in SQL).
func hourKey(h rollupHour) string {
	return h.env + "\x00" + h.av + "\x00" + fmt.Sprint(unixSec(h.hour))
}

// hourTuples renders hours as a literal IN list of (environment,
// agent_version, hour) tuples, with their binds.
func hourTuples(hs []rollupHour) (string, []any) {
	parts := make([]string, len(hs))
	args := make([]any, 0, 3*len(hs))
	for i, h := range hs {
		parts[i] = "(?, ?, toDateTime(?))"
		args = append(args, h.env, h.av, unixSec(h.hour))
	}
	return strings.Join(parts, ", "), args
}

// rollupStatement is one INSERT … SELECT of a batch, with its binds.
type rollupStatement struct {
	sql  string
	args []any
}

// rollupStatements are the statements that recompute a batch of hours of
// one kind, each row versioned by its hour's change.
func rollupStatements(batch []rollupHour) []rollupStatement {
	in, inArgs := hourTuples(batch)
	keys, vers := make([]string, len(batch)), make([]uint64, len(batch))
	for i, h := range batch {
		keys[i], vers[i] = hourKey(h), h.version
	}
	var qs []string
	if batch[0].kind == rollupLabels {
		qs = []string{labelHourlySQL(false, in), labelHourlySQL(true, in), labeledHourlySQL(in),
			windowHourlySQL(in), windowRolloutsHourlySQL(in)}
	} else {
		qs = []string{rolloutHourlySQL(in)}
	}
	out := make([]rollupStatement, len(qs))
	for i, q := range qs {
		// The version's arrays come first in the text:
		// arrayElement(versions, indexOf(keys, hourKeyExpr)).
		out[i] = rollupStatement{q, append([]any{vers, keys}, inArgs...)}
	}
	return out
}

// watermarkSQL records a run that left no settled hour behind: the changes
// it covered (through, ns) and the first hour it did not close (the hour of
// now, in the server's time zone, as rollupTodoSQL counts).
//
// Binds: through (ns), now (Unix seconds), at (ns).
const watermarkSQL = `INSERT INTO rollup_watermark (slot, through, closed_before, at)
SELECT toUInt8(` + rollupLayoutSQL + `), toUInt64(?), toStartOfHour(toDateTime(?)), toUInt64(?)`

// Rollup brings the hourly rollup up to date with the data stored by now:
// every closed hour (before now's hour) whose newest change is older than
// RollupGrace and not yet rolled up is recomputed from the raw rows. It does
// at most limit hours (0 = 2000) per call and says when more remain. It is
// safe to run from several processes at once and after any crash.
func (s *Store) Rollup(ctx context.Context, now time.Time, limit int) (RollupStats, error) {
	var st RollupStats
	if limit <= 0 {
		limit = 2000
	}
	cutoff := uint64(max(now.Add(-RollupGrace).UnixNano(), 0))
	// The watermark this run may record: the cutoff, and never later than
	// the wall clock at the read (a now in the future, as tests and loads
	// pass, must not cover rows written after the read).
	through := min(cutoff, uint64(time.Now().UnixNano()))
	rows, err := s.conn.Query(ctx, rollupTodoSQL, unixSec(now), cutoff, uint64(limit))
	if err != nil {
		return st, fmt.Errorf("rollup: stale hours: %w", err)
	}
	var todo []rollupHour
	for rows.Next() {
		var h rollupHour
		if err := rows.Scan(&h.kind, &h.env, &h.av, &h.hour, &h.version); err != nil {
			rows.Close()
			return st, fmt.Errorf("rollup: stale hours: %w", err)
		}
		todo = append(todo, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("rollup: stale hours: %w", err)
	}
	st.More = len(todo) == limit
	for len(todo) > 0 {
		n := 1
		for n < len(todo) && n < rollupBatch && todo[n].kind == todo[0].kind {
			n++
		}
		batch := todo[:n]
		todo = todo[n:]
		runNs := uint64(time.Now().UnixNano())
		for _, q := range rollupStatements(batch) {
			if err := s.conn.Exec(ctx, q.sql, q.args...); err != nil {
				return st, fmt.Errorf("rollup of %d hours: %w", len(batch), err)
			}
			st.Statements++
		}
		// The commit: these hours are fresh as of the change listed.
		b, err := s.conn.PrepareBatch(ctx, "INSERT INTO rollup_hours (kind, environment, agent_version, hour, version, run_ns, rolled_at, layout)")
		if err != nil {
			return st, fmt.Errorf("rollup: record: %w", err)
		}
		for _, h := range batch {
			if err := b.Append(h.kind, h.env, h.av, h.hour, h.version, runNs, now, rollupLayout); err != nil {
				_ = b.Abort()
				return st, fmt.Errorf("rollup: record: %w", err)
			}
		}
		if err := b.Send(); err != nil {
			return st, fmt.Errorf("rollup: record: %w", err)
		}
		st.Hours += len(batch)
	}
	if st.More {
		return st, nil
	}
	// No settled hour is left: every closed hour whose changes are all at
	// most through is rolled up through its newest change.
	if err := s.conn.Exec(ctx, watermarkSQL, through, unixSec(now), uint64(time.Now().UnixNano())); err != nil {
		return st, fmt.Errorf("rollup: watermark: %w", err)
	}
	return st, nil
}

// pruneRollupLogSQL deletes rollup_log's changes before a bound (ns).
const pruneRollupLogSQL = `ALTER TABLE rollup_log DELETE WHERE last_ingest < ?`

// PruneRollupLog deletes the rows of rollup_log that no read needs any
// more: the changes older than keep before the watermark's through. Every
// such change is covered by the rollup run that recorded the watermark,
// and reads (and the evaluator's tick) want only the changes after it; keep
// leaves room for a reader whose cached watermark is a little older. It
// returns the bound it used (0: no watermark yet, nothing deleted). The
// delete is a mutation, which the server applies in the background.
func (s *Store) PruneRollupLog(ctx context.Context, keep time.Duration) (uint64, error) {
	var through uint64
	if err := s.conn.QueryRow(ctx, `SELECT `+wmThrough).Scan(&through); err != nil {
		return 0, fmt.Errorf("rollup log: watermark: %w", err)
	}
	if through <= uint64(keep) {
		return 0, nil
	}
	bound := through - uint64(keep)
	if err := s.conn.Exec(ctx, pruneRollupLogSQL, bound); err != nil {
		return 0, fmt.Errorf("rollup log: prune: %w", err)
	}
	return bound, nil
}

// RollupAll calls Rollup until no settled stale hour is left (a load, a
// benchmark, a test) and returns the total.
func (s *Store) RollupAll(ctx context.Context, now time.Time) (RollupStats, error) {
	var tot RollupStats
	for {
		st, err := s.Rollup(ctx, now, 0)
		tot.Hours += st.Hours
		tot.Statements += st.Statements
		if err != nil || !st.More {
			return tot, err
		}
	}
}

// StaleHours counts the hours of each kind not rolled up through their
// newest change (not rolled up, or changed since): the tests check with it
// that a rollup left none.
func (s *Store) StaleHours(ctx context.Context) (labels, rollouts uint64, err error) {
	err = s.conn.QueryRow(ctx, staleCountSQL).Scan(&labels, &rollouts)
	return labels, rollouts, err
}

const staleCountSQL = `SELECT (SELECT count() FROM (` + staleLabelHours + `)), (SELECT count() FROM (` + staleRolloutHours + `))`
