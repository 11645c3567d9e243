package sink

import (
	"fmt"
	"strings"
)

// The decision windows from the rollup (docs/ARCHITECTURE.md, "Analytics at
// scale"). The evaluator, `trace report --fresh` and the dashboard's fresh=1
// read a window of every cohort they decide on; at 10M rollouts a 24 h
// window is ~500k labels, read twice (the completeness check and the
// counts). window_hourly and window_rollouts_hourly hold the same numbers
// per closed hour, computed by Rollup with the other rollup tables (same
// batches, same versions), so a window reads its whole closed hours from
// them and only the rest raw: its partial first and last hours, the open
// hour, and the hours changed since the watermark.
//
// Completeness (WindowSpec.Runs) is kept exact for any N: each row carries
// runs, the number of consecutive runs 0, 1, … the rollout was labeled in
// for the capability (window_hourly), or the largest such number over its
// capabilities (window_rollouts_hourly). A rollout is complete for N exactly
// when runs ≥ N, so a window of N reads the rows with run < N and runs ≥ N,
// and a window of N ≤ 1 reads every row. The first LACKING-on-failure ids
// are kept per row (the first MaxExampleIDs, sorted as strings): the first
// of a window's union are the first of the union of its hours' firsts.
//
// A recomputed hour may have fewer rows than before (late runs raise a
// rollout's runs, and the row of its old value disappears), so reads take
// only the rows of each hour's newest version, not each key's newest row.
// Success and end time are properties of a rollout, the same in all of its
// labels, as the rest of the rollup assumes (a rollout's labels are in one
// hour).

// windowHourlySQL recomputes window_hourly of a batch of hours.
func windowHourlySQL(in string) string {
	return `INSERT INTO window_hourly (environment, agent_version, dictionary_version, capability, run, hour, runs,
	lf, pf, nf, lp, pp, np, lacking_first, version)
SELECT environment, agent_version, dictionary_version, capability, run, h, runs,
	countIf(ok = 0 AND l = 'LACKING'), countIf(ok = 0 AND l = 'PRESENT'), countIf(ok = 0 AND l = 'NA'),
	countIf(ok = 1 AND l = 'LACKING'), countIf(ok = 1 AND l = 'PRESENT'), countIf(ok = 1 AND l = 'NA'),
	arraySlice(arraySort(groupArrayIf(rollout_id, ok = 0 AND l = 'LACKING')), 1, ` + fmt.Sprint(MaxExampleIDs) + `),
	` + hourVersion("environment", "agent_version", "h") + `
FROM (
	SELECT environment, agent_version, dictionary_version, capability, rollout_id, h, runs,
		tupleElement(e, 1) AS run, tupleElement(e, 2) AS l, tupleElement(e, 3) AS ok
	FROM (
		SELECT environment, agent_version, dictionary_version, capability, rollout_id, h,
			groupArray((r, l1, ok1)) AS es, ` + consecutiveRuns("groupArray(r)") + ` AS runs
		FROM (
			SELECT environment, agent_version, dictionary_version, capability, run AS r, rollout_id, toStartOfHour(ts) AS h,
				argMax(label, ingest_ns) AS l1, argMax(success, ingest_ns) AS ok1
			FROM labels_by_time
			WHERE (environment, agent_version, toStartOfHour(ts)) IN (` + in + `)
			GROUP BY environment, agent_version, dictionary_version, capability, run, rollout_id, h)
		GROUP BY environment, agent_version, dictionary_version, capability, rollout_id, h)
	ARRAY JOIN es AS e)
GROUP BY environment, agent_version, dictionary_version, capability, run, h, runs`
}

// windowRolloutsHourlySQL recomputes window_rollouts_hourly of a batch of
// hours: per cohort, hour and runs (the most over the rollout's
// capabilities), the labeled rollouts, their failures and end times.
func windowRolloutsHourlySQL(in string) string {
	return `INSERT INTO window_rollouts_hourly (environment, agent_version, dictionary_version, hour, runs,
	rollouts, failures, first_ts, last_ts, version)
SELECT environment, agent_version, dictionary_version, h, runs, count(), countIf(ok = 0), min(t), max(t),
	` + hourVersion("environment", "agent_version", "h") + `
FROM (
	SELECT environment, agent_version, dictionary_version, rollout_id, h, max(k) AS runs, argMax(ok1, ing) AS ok, max(t1) AS t
	FROM (
		SELECT environment, agent_version, dictionary_version, capability, rollout_id, toStartOfHour(ts) AS h,
			` + consecutiveRuns("groupUniqArray(run)") + ` AS k,
			argMax(success, ingest_ns) AS ok1, max(ingest_ns) AS ing, max(ts) AS t1
		FROM labels_by_time
		WHERE (environment, agent_version, toStartOfHour(ts)) IN (` + in + `)
		GROUP BY environment, agent_version, dictionary_version, capability, rollout_id, h)
	GROUP BY environment, agent_version, dictionary_version, rollout_id, h)
GROUP BY environment, agent_version, dictionary_version, h, runs`
}

// consecutiveRuns is the SQL of the number of consecutive runs 0, 1, … in
// arr, an array of distinct runs: in the sorted array the runs before the
// first gap are exactly those equal to their index.
func consecutiveRuns(arr string) string {
	return "toUInt16(arrayCount((x, i) -> x + 1 = i, arraySort(" + arr + "), arrayEnumerate(" + arr + ")))"
}

// firstWholeHour is the bind of the start of the first whole hour at or
// after from (the hour of from + 3599 s, in the server's time zone as the
// rollup's hours are); the end of the last whole hour before an exclusive
// end is the hour of that end.
func firstWholeHour(from uint32) uint32 { return from + 3599 }

// wholeHours renders, for every cohort with a range, the cohort and clause,
// whose two binds are the start of the cohort's first whole hour and the
// end of its last, with their binds.
func (spec MultiSpec) wholeHours(clause string) ([]string, []any) {
	var out []string
	var args []any
	for _, c := range spec.Cohorts {
		r, ok := spec.Ranges[c]
		if !ok {
			continue
		}
		first, end := firstWholeHour(unixSec(r.From)), unixSec(r.To)+1
		out = append(out, "(environment = ? AND agent_version = ? AND dictionary_version = ? AND "+clause+")")
		args = append(args, c.Environment, c.AgentVersion, c.DictionaryVersion, first, end)
	}
	return out, args
}

// rolledWindow is the condition on a window rollup table's rows: the
// cohorts' whole hours inside their windows that the rollup covers (closed
// by the watermark, unchanged since).
func (spec MultiSpec) rolledWindow() (string, []any) {
	in, args := cohortIn(spec.Cohorts)
	conds := []string{in}
	if spec.Ranges != nil {
		per, perArgs := spec.wholeHours("hour >= toStartOfHour(toDateTime(?)) AND hour < toStartOfHour(toDateTime(?))")
		conds = append(conds, "("+strings.Join(append([]string{"0"}, per...), " OR ")+")")
		args = append(args, perArgs...)
	}
	bounds, boundArgs := spec.bounds("hour >= toStartOfHour(toDateTime(?))", "hour < toStartOfHour(toDateTime(?))")
	conds = append(append(conds, bounds...), rolledUp(dirtyLabels))
	args = append(args, boundArgs...)
	return strings.Join(conds, " AND "), args
}

// rawWindow is the condition on the labels of a window that the rollup does
// not cover (rolledWindow's complement inside the window): outside the
// cohort's whole hours, from the watermark's closed_before on, or changed
// since.
func (spec MultiSpec) rawWindow() (string, []any) {
	var edges []string
	var args []any
	if spec.Ranges != nil {
		edges, args = spec.wholeHours("(ts < toStartOfHour(toDateTime(?)) OR ts >= toStartOfHour(toDateTime(?)))")
	} else {
		edges, args = spec.bounds("ts < toStartOfHour(toDateTime(?))", "ts >= toStartOfHour(toDateTime(?))")
	}
	edges = append(edges, rawHours("ts", "toStartOfHour(ts)", dirtyLabels, ""))
	return "(" + strings.Join(edges, " OR ") + ")", args
}

// bounds renders the window's wall-clock bounds as conditions: onSince
// with the start of the first whole hour at or after Since, onUntil with
// the hour of Until (each only when set).
func (spec MultiSpec) bounds(onSince, onUntil string) ([]string, []any) {
	var conds []string
	var args []any
	if !spec.Since.IsZero() {
		conds = append(conds, onSince)
		args = append(args, firstWholeHour(unixSec(spec.Since)))
	}
	if !spec.Until.IsZero() {
		conds = append(conds, onUntil)
		args = append(args, unixSec(spec.Until))
	}
	return conds, args
}

// rollupParts are what a window statement over the rollup is made of: the
// condition on a rollup table's rows (rolledWindow), which the statement
// applies twice (to the rows and to their hours' newest version), and the
// condition on the labels it reads raw (where with rawWindow); args are
// their binds in that order.
func (spec MultiSpec) rollupParts() (rolled, where string, args []any) {
	rolled, rolledArgs := spec.rolledWindow()
	rawCond, rawCondArgs := spec.rawWindow()
	where, whereArgs := spec.whereAnd(rawCond, rawCondArgs)
	return rolled, where, append(append(append([]any{}, rolledArgs...), rolledArgs...), whereArgs...)
}

// windowRuns is the condition on window_hourly rows of a window of N runs.
func (spec MultiSpec) windowRuns(perRun bool) string {
	if spec.Runs <= 1 {
		return ""
	}
	if perRun {
		return fmt.Sprintf(" AND run < %d AND runs >= %d", spec.Runs, spec.Runs)
	}
	return fmt.Sprintf(" AND runs >= %d", spec.Runs)
}

// newestHours keeps a rollup table's grouped rows (columns environment,
// agent_version, hour and v, their version) of each hour's newest version.
func newestHours(table, rolled string) string {
	return `(environment, agent_version, hour, v) IN (SELECT environment, agent_version, hour, max(version) FROM ` + table + `
		WHERE ` + rolled + ` GROUP BY environment, agent_version, hour)`
}

// windowCountsRollupSQL is WindowCountsMulti's statement over the rollup:
// the whole closed hours from window_hourly, the rest raw, summed. It names
// the rollup state as subqueries (wmClosed, dirtyLabels), which the store
// replaces by their values.
func windowCountsRollupSQL(spec MultiSpec) (string, []any) {
	rolled, where, args := spec.rollupParts()
	q := fmt.Sprintf(`SELECT %[1]s, capability, run, sum(lf), sum(pf), sum(nf), sum(lp), sum(pp), sum(np),
	arraySlice(arraySort(groupArrayArray(ids)), 1, %[2]d)
FROM (
	SELECT %[1]s, capability, run, a_lf AS lf, a_pf AS pf, a_nf AS nf, a_lp AS lp, a_pp AS pp, a_np AS np, a_ids AS ids
	FROM (
		SELECT %[1]s, capability, run, runs, hour, argMax(lf, version) AS a_lf, argMax(pf, version) AS a_pf, argMax(nf, version) AS a_nf,
			argMax(lp, version) AS a_lp, argMax(pp, version) AS a_pp, argMax(np, version) AS a_np,
			argMax(lacking_first, version) AS a_ids, max(version) AS v
		FROM window_hourly
		WHERE %[3]s%[4]s
		GROUP BY %[1]s, capability, run, runs, hour)
	WHERE %[5]s
	UNION ALL
	%[6]s
)
GROUP BY %[1]s, capability, run
ORDER BY %[1]s, capability, run`, cohortCols, MaxExampleIDs, rolled, spec.windowRuns(true),
		newestHours("window_hourly", rolled), rawWindowCounts(where))
	return q, args
}

// windowInfoRollupSQL is WindowInfoMulti's statement over the rollup (see
// windowCountsRollupSQL).
func windowInfoRollupSQL(spec MultiSpec) (string, []any) {
	rolled, where, args := spec.rollupParts()
	q := fmt.Sprintf(`SELECT %[1]s, sum(n), sum(f), min(t0), max(t1)
FROM (
	SELECT %[1]s, a_n AS n, a_f AS f, a_first AS t0, a_last AS t1
	FROM (
		SELECT %[1]s, hour, runs, argMax(rollouts, version) AS a_n, argMax(failures, version) AS a_f,
			argMax(first_ts, version) AS a_first, argMax(last_ts, version) AS a_last, max(version) AS v
		FROM window_rollouts_hourly
		WHERE %[2]s%[3]s
		GROUP BY %[1]s, hour, runs)
	WHERE %[4]s
	UNION ALL
	%[5]s
)
GROUP BY %[1]s`, cohortCols, rolled, spec.windowRuns(false),
		newestHours("window_rollouts_hourly", rolled), rawWindowInfo(where))
	return q, args
}
