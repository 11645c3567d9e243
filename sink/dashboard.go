package sink

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// The SQL the dashboard runs. Every statement works on ClickHouse 18.16
// (Debian's) and on current ClickHouse: no window functions, no DateTime64,
// no Map, no toStartOfInterval, no server-side {p:Type} parameters. The `?`
// are client-side binds (clickhouse-go substitutes them in order); times are
// bound as Unix seconds and wrapped in toDateTime(?).
//
// docs/queries.md is generated from the DashboardQueries table below (by
// internal/dashboard/docs.go); TestQueriesDoc keeps the two in sync. The
// dashboard runs them through Store.QueryDashboard, which runs nothing but
// these statements.
//
// Label statistics always take one label per (capability, run, rollout_id):
// the most recently ingested one (argMax(label, ingest_ns)), exactly as the
// analyzer's window statistics do (sink.WindowCounts), so a redelivered or
// relabeled row never counts twice.

// rawPassRateHourly (before the rollup) is the pass rate per agent version of one environment per
// hour, from the rollout_counts aggregate (exact distinct rollout ids).
// With toStartOfDay in place of toStartOfHour it is the daily pass rate
// (the dashboard's bucket=day; see QueryDashboard).
//
// Binds: environment, since (Unix seconds).
const rawPassRateHourly = `SELECT agent_version, toStartOfHour(bucket) AS time_bucket,
	uniqExactMerge(rollouts) AS rollouts,
	uniqExactIfMerge(successes) AS successes
FROM rollout_counts
WHERE environment = ? AND bucket >= toDateTime(?)
GROUP BY agent_version, time_bucket
ORDER BY agent_version, time_bucket`

// rawPassRateWeekly (before the rollup) is the pass rate per agent version of one environment per
// week (weeks start on Monday, in the server's time zone), from the week
// of since to the week of the anchor.
//
// Binds: environment, since (Unix seconds), anchor (Unix seconds).
const rawPassRateWeekly = `SELECT toMonday(bucket) AS week, agent_version,
	uniqExactMerge(rollouts) AS rollouts,
	uniqExactIfMerge(successes) AS successes
FROM rollout_counts
WHERE environment = ? AND bucket >= toDateTime(?) AND bucket < toDateTime(toMonday(toDateTime(?)) + 7)
GROUP BY week, agent_version
ORDER BY week, agent_version`

// rawCapabilityHourly (before the rollup) is Cov and Δ per capability per hour of one cohort: the
// TRACE statistics of each labeling run over the rollouts that ended in the
// hour, then averaged over the runs. Ratios with a zero denominator are 0.
// With toStartOfDay in place of toStartOfHour it is per day.
//
// Binds: environment, agent_version, dictionary_version, since (Unix seconds).
const rawCapabilityHourly = `SELECT capability, time_bucket,
	avg(cov) AS mean_cov,
	avg(delta) AS mean_delta,
	count() AS runs,
	max(failed) AS failed,
	max(passed) AS passed
FROM (
	SELECT capability, run, toStartOfHour(t) AS time_bucket,
		countIf(ok = 0 AND l = 'LACKING') AS lf,
		countIf(ok = 0 AND l = 'PRESENT') AS pf,
		countIf(ok = 0) AS failed,
		countIf(ok = 1 AND l = 'LACKING') AS lp,
		countIf(ok = 1 AND l = 'PRESENT') AS pp,
		countIf(ok = 1) AS passed,
		if(failed = 0, 0., lf / failed) AS cov,
		if(lf + pf = 0, 0., lf / (lf + pf)) - if(lp + pp = 0, 0., lp / (lp + pp)) AS delta
	FROM (
		SELECT capability, run, rollout_id,
			argMax(label, ingest_ns) AS l,
			argMax(success, ingest_ns) AS ok,
			argMax(ts, ingest_ns) AS t
		FROM capability_labels
		WHERE environment = ? AND agent_version = ? AND dictionary_version = ? AND ts >= toDateTime(?)
		GROUP BY capability, run, rollout_id
	)
	GROUP BY capability, run, time_bucket
)
GROUP BY capability, time_bucket
ORDER BY capability, time_bucket`

// rawLackingWeekly (before the rollup) is, per week, agent version and capability of one
// environment, the mean over runs of Cov (the share of failed rollouts
// labeled LACKING), of Δ and of the number of failures labeled LACKING: the
// failure trends, from since to the end of the anchor's week. Labels of
// every dictionary version count; a capability is matched by name.
//
// Binds: environment, since (Unix seconds), anchor (Unix seconds).
const rawLackingWeekly = `SELECT week, agent_version, capability,
	avg(cov) AS mean_cov,
	avg(delta) AS mean_delta,
	avg(lf) AS lacking_failed,
	max(failed) AS failed
FROM (
	SELECT toMonday(t) AS week, agent_version, capability, run,
		countIf(ok = 0 AND l = 'LACKING') AS lf,
		countIf(ok = 0 AND l = 'PRESENT') AS pf,
		countIf(ok = 0) AS failed,
		countIf(ok = 1 AND l = 'LACKING') AS lp,
		countIf(ok = 1 AND l = 'PRESENT') AS pp,
		if(failed = 0, 0., lf / failed) AS cov,
		if(lf + pf = 0, 0., lf / (lf + pf)) - if(lp + pp = 0, 0., lp / (lp + pp)) AS delta
	FROM (
		SELECT agent_version, capability, run, rollout_id,
			argMax(label, ingest_ns) AS l,
			argMax(success, ingest_ns) AS ok,
			argMax(ts, ingest_ns) AS t
		FROM capability_labels
		WHERE environment = ? AND ts >= toDateTime(?) AND ts < toDateTime(toMonday(toDateTime(?)) + 7)
		GROUP BY agent_version, capability, run, rollout_id
	)
	GROUP BY week, agent_version, capability, run
)
GROUP BY week, agent_version, capability
ORDER BY week, agent_version, mean_cov DESC, capability`

// rawLackingWeekOverWeek (before the rollup) compares, per capability of one environment and agent
// version, this week with last week: mean over runs of Cov, Δ and the
// failures labeled LACKING. "This week" is the week (Monday to Sunday, server
// time zone) that contains the anchor time; a week without labels gives 0
// (runs_* tell the two cases apart).
//
// Binds: anchor (Unix seconds), environment, agent_version, anchor, anchor, top-N limit.
const rawLackingWeekOverWeek = `SELECT capability,
	sumIf(cov, w = 1) / greatest(countIf(w = 1), 1) AS cov_this_week,
	sumIf(cov, w = 0) / greatest(countIf(w = 0), 1) AS cov_last_week,
	sumIf(delta, w = 1) / greatest(countIf(w = 1), 1) AS delta_this_week,
	sumIf(delta, w = 0) / greatest(countIf(w = 0), 1) AS delta_last_week,
	sumIf(lf, w = 1) / greatest(countIf(w = 1), 1) AS lacking_this_week,
	sumIf(lf, w = 0) / greatest(countIf(w = 0), 1) AS lacking_last_week,
	countIf(w = 1) AS runs_this_week,
	countIf(w = 0) AS runs_last_week
FROM (
	SELECT capability, run, toMonday(t) = toMonday(toDateTime(?)) AS w,
		countIf(ok = 0 AND l = 'LACKING') AS lf,
		countIf(ok = 0 AND l = 'PRESENT') AS pf,
		countIf(ok = 0) AS failed,
		countIf(ok = 1 AND l = 'LACKING') AS lp,
		countIf(ok = 1 AND l = 'PRESENT') AS pp,
		if(failed = 0, 0., lf / failed) AS cov,
		if(lf + pf = 0, 0., lf / (lf + pf)) - if(lp + pp = 0, 0., lp / (lp + pp)) AS delta
	FROM (
		SELECT capability, run, rollout_id,
			argMax(label, ingest_ns) AS l,
			argMax(success, ingest_ns) AS ok,
			argMax(ts, ingest_ns) AS t
		FROM capability_labels
		WHERE environment = ? AND agent_version = ?
			AND ts >= toDateTime(toMonday(toDateTime(?)) - 7)
			AND ts < toDateTime(toMonday(toDateTime(?)) + 7)
		GROUP BY capability, run, rollout_id
	)
	GROUP BY capability, run, w
)
GROUP BY capability
ORDER BY cov_this_week DESC, lacking_this_week DESC, capability
LIMIT ?`

// rawRolloutCohorts (before the rollup) lists every (environment, agent version) with rollouts and
// its totals.
const rawRolloutCohorts = `SELECT environment, agent_version,
	uniqExactMerge(rollouts) AS rollouts,
	uniqExactIfMerge(successes) AS successes,
	max(bucket) AS last_bucket
FROM rollout_counts
GROUP BY environment, agent_version
ORDER BY environment, agent_version`

// rawLabelCohorts (before the rollup) lists every labeled cohort (environment, agent version,
// dictionary version) with its labeled rollouts, capabilities and runs.
const rawLabelCohorts = `SELECT environment, agent_version, dictionary_version,
	uniqExactMerge(rollouts) AS labeled_rollouts,
	uniqExact(capability) AS capabilities,
	toUInt64(max(run) + 1) AS runs,
	max(bucket) AS last_bucket
FROM label_counts
GROUP BY environment, agent_version, dictionary_version
ORDER BY environment, agent_version, dictionary_version`

// QLackingExamples lists the failed rollouts of one capability labeled
// LACKING in at least one run, most often LACKING first. It reads
// labels_by_time, whose key prunes to the range (the decision window).
//
// Binds: environment, agent_version, dictionary_version, capability, since (Unix seconds), limit.
const QLackingExamples = `SELECT rollout_id,
	countIf(l = 'LACKING') AS lacking_runs,
	count() AS runs
FROM (
	SELECT run, rollout_id,
		argMax(label, ingest_ns) AS l,
		argMax(success, ingest_ns) AS ok
	FROM labels_by_time
	WHERE environment = ? AND agent_version = ? AND dictionary_version = ? AND capability = ? AND ts >= toDateTime(?)
	GROUP BY run, rollout_id
)
WHERE ok = 0
GROUP BY rollout_id
HAVING lacking_runs > 0
ORDER BY lacking_runs DESC, rollout_id
LIMIT ?`

// rawRollouts (before the rollup) reads stored rollouts by id (the latest ingested version of each).
//
// Binds: environment, agent_version, array of rollout ids.
const rawRollouts = `SELECT rollout_id,
	argMax(task_id, ingest_ns) AS task_id,
	argMax(success, ingest_ns) AS success,
	argMax(reward, ingest_ns) AS reward,
	argMax(end_time, ingest_ns) AS end_time,
	argMax(messages, ingest_ns) AS messages,
	argMax(grader, ingest_ns) AS grader
FROM rollouts
WHERE environment = ? AND agent_version = ? AND has(?, rollout_id)
GROUP BY rollout_id`

// The rollup-backed statements. Each reads the hours the rollup covers
// from label_hourly / labeled_hourly / rollout_hourly (the newest version
// of each row: the computation through the hour's newest change) and every
// other hour raw, from labels_by_time or rollout_counts, pruned by their
// time-sorted keys: the hours from the watermark's closed_before on (the
// open hour), the hours changed after its through (dirtyLabels,
// dirtyRollouts), and a partial first hour. The result is the raw
// computation's (raw* above, the statements before the rollup, which
// TestRollupExact and `trace bench query` compare them with). Filters on
// ts use toStartOfHour(ts), which the daily variant leaves alone; only the
// buckets become days.
//
// They are written with named binds ({env}, {since}, …; see named), which
// become the `?` of the text and DashboardQuery.Args.

// The rollup's watermark (sink/rollup.go): the changes its last complete
// run covered (ns) and the first hour it did not close. With no run yet
// they are 0 and 1970: every hour is read raw. Only this build's layout
// counts (rollupLayout): an older build's watermark may cover hours whose
// newer tables it never filled.
const (
	wmThrough = `(SELECT argMax(through, at) FROM rollup_watermark WHERE slot = ` + rollupLayoutSQL + `)`
	wmClosed  = `(SELECT argMax(closed_before, at) FROM rollup_watermark WHERE slot = ` + rollupLayoutSQL + `)`
)

// dirtyLabels and dirtyRollouts are the sets of (environment,
// agent_version, hour) of each kind changed after the watermark: rollup_log's
// sorted tail, normally a handful of hours. They cover every environment and
// take no bind, so that QueryDashboard can put the set itself in their place
// (sink/rollupstate.go) without changing the binds.
const (
	dirtyLabels   = `(SELECT environment, agent_version, hour FROM rollup_log WHERE kind = 1 AND last_ingest > ` + wmThrough + `)`
	dirtyRollouts = `(SELECT environment, agent_version, hour FROM rollup_log WHERE kind = 2 AND last_ingest > ` + wmThrough + `)`
)

// rolledUp is the condition on a rollup table's rows: the hour is closed by
// the watermark and unchanged since (dirty: the set of the statement).
func rolledUp(dirty string) string {
	return `hour < ` + wmClosed + ` AND (environment, agent_version, hour) NOT IN ` + dirty
}

// rawHours is the condition on raw rows (time column col, its hour hourCol)
// of the hours the rollup does not cover: after the watermark's closed hours,
// changed since, or (partial, when set) the partial first hour before since.
func rawHours(col, hourCol, dirty, partial string) string {
	c := `(` + col + ` >= ` + wmClosed + ` OR (environment, agent_version, ` + hourCol + `) IN ` + dirty
	if partial != "" {
		c += ` OR ` + hourCol + ` < toDateTime(` + partial + `)`
	}
	return c + `)`
}

// newestLabelCounts are a label_hourly row's counts in its newest version.
const newestLabelCounts = `argMax(lf, version) AS a_lf, argMax(pf, version) AS a_pf, argMax(nf, version) AS a_nf,
			argMax(lp, version) AS a_lp, argMax(pp, version) AS a_pp, argMax(np, version) AS a_np`

// named turns a statement written with {name} binds into its `?` text and,
// for each `?`, the index of the caller's bind it takes (the first of names
// with that name): DashboardQuery.Args.
func named(q string, names ...string) (string, []int) {
	var b strings.Builder
	var args []int
	for {
		i := strings.IndexByte(q, '{')
		if i < 0 {
			b.WriteString(q)
			return b.String(), args
		}
		j := strings.IndexByte(q[i:], '}')
		if j < 0 {
			panic("sink: unclosed bind in " + q)
		}
		name := q[i+1 : i+j]
		k := slices.Index(names, name)
		if k < 0 {
			panic("sink: unknown bind {" + name + "}")
		}
		b.WriteString(q[:i])
		b.WriteByte('?')
		args = append(args, k)
		q = q[i+j+1:]
	}
}

// QPassRateHourly is the pass rate per agent version of one environment per
// hour: exact distinct rollout ids, from the rollup's closed hours and the
// rollout_counts aggregate for the rest. With toStartOfDay in place of
// toStartOfHour it is the daily pass rate (the dashboard's bucket=day; see
// QueryDashboard).
//
// Binds: environment, since (Unix seconds).
var QPassRateHourly, passRateHourlyArgs = named(`SELECT agent_version, time_bucket, sum(r) AS rollouts, sum(s) AS successes
FROM (
	SELECT agent_version, toStartOfHour(hour) AS time_bucket, r, s
	FROM (
		SELECT agent_version, hour, argMax(rollouts, version) AS r, argMax(successes, version) AS s
		FROM rollout_hourly
		WHERE environment = {env} AND hour >= toDateTime({since}) AND `+rolledUp(dirtyRollouts)+`
		GROUP BY agent_version, hour)
	UNION ALL
	SELECT agent_version, toStartOfHour(bucket) AS time_bucket, uniqExactMerge(rollouts) AS r, uniqExactIfMerge(successes) AS s
	FROM rollout_counts
	WHERE environment = {env} AND bucket >= toDateTime({since}) AND `+rawHours("bucket", "bucket", dirtyRollouts, "")+`
	GROUP BY agent_version, time_bucket
)
GROUP BY agent_version, time_bucket
ORDER BY agent_version, time_bucket`, "env", "since")

// QPassRateWeekly is the pass rate per agent version of one environment per
// week (weeks start on Monday, in the server's time zone), from since to
// the end of the anchor's week (the trends page's "this week").
//
// Binds: environment, since (Unix seconds), anchor (Unix seconds).
var QPassRateWeekly, passRateWeeklyArgs = named(`SELECT week, agent_version, sum(r) AS rollouts, sum(s) AS successes
FROM (
	SELECT toMonday(hour) AS week, agent_version, r, s
	FROM (
		SELECT agent_version, hour, argMax(rollouts, version) AS r, argMax(successes, version) AS s
		FROM rollout_hourly
		WHERE environment = {env} AND hour >= toDateTime({since}) AND hour < toDateTime(toMonday(toDateTime({anchor})) + 7) AND `+rolledUp(dirtyRollouts)+`
		GROUP BY agent_version, hour)
	UNION ALL
	SELECT toMonday(bucket) AS week, agent_version, uniqExactMerge(rollouts) AS r, uniqExactIfMerge(successes) AS s
	FROM rollout_counts
	WHERE environment = {env} AND bucket >= toDateTime({since}) AND bucket < toDateTime(toMonday(toDateTime({anchor})) + 7)
		AND `+rawHours("bucket", "bucket", dirtyRollouts, "")+`
	GROUP BY week, agent_version
)
GROUP BY week, agent_version
ORDER BY week, agent_version`, "env", "since", "anchor")

// labelStats are each run's Cov and Δ from the summed counts.
const labelStats = `if(failed = 0, 0., lf / failed) AS cov,
		if(lf + pf = 0, 0., lf / (lf + pf)) - if(lp + pp = 0, 0., lp / (lp + pp)) AS delta`

const labelRollupCols = `a_lf AS c_lf, a_pf AS c_pf, a_lf + a_pf + a_nf AS c_failed, a_lp AS c_lp, a_pp AS c_pp, a_lp + a_pp + a_np AS c_passed`

const labelRawCols = `countIf(ok = 0 AND l = 'LACKING') AS c_lf, countIf(ok = 0 AND l = 'PRESENT') AS c_pf, countIf(ok = 0) AS c_failed,
		countIf(ok = 1 AND l = 'LACKING') AS c_lp, countIf(ok = 1 AND l = 'PRESENT') AS c_pp, countIf(ok = 1) AS c_passed`

const labelSumCols = `sum(c_lf) AS lf, sum(c_pf) AS pf, sum(c_failed) AS failed, sum(c_lp) AS lp, sum(c_pp) AS pp, sum(c_passed) AS passed`

// QCapabilityHourly is Cov and Δ per capability per hour of one cohort: the
// TRACE statistics of each labeling run over the rollouts that ended in the
// hour, then averaged over the runs. Ratios with a zero denominator are 0.
// With toStartOfDay in place of toStartOfHour it is per day.
//
// Binds: environment, agent_version, dictionary_version, since (Unix seconds).
var QCapabilityHourly, capabilityHourlyArgs = named(`SELECT capability, time_bucket,
	avg(cov) AS mean_cov,
	avg(delta) AS mean_delta,
	count() AS runs,
	max(failed) AS failed,
	max(passed) AS passed
FROM (
	SELECT capability, run, time_bucket, failed, passed,
		`+labelStats+`
	FROM (
		SELECT capability, run, time_bucket, `+labelSumCols+`
		FROM (
			SELECT capability, run, toStartOfHour(hour) AS time_bucket, `+labelRollupCols+`
			FROM (
				SELECT capability, run, hour, `+newestLabelCounts+`
				FROM label_hourly
				WHERE environment = {env} AND agent_version = {av} AND dicts = 0 AND dictionary_version = {dict} AND hour >= toDateTime({since})
					AND `+rolledUp(dirtyLabels)+`
				GROUP BY capability, run, hour)
			UNION ALL
			SELECT capability, run, toStartOfHour(t) AS time_bucket, `+labelRawCols+`
			FROM (
				SELECT capability, run, rollout_id,
					argMax(label, ingest_ns) AS l,
					argMax(success, ingest_ns) AS ok,
					argMax(ts, ingest_ns) AS t
				FROM labels_by_time
				WHERE environment = {env} AND agent_version = {av} AND dictionary_version = {dict} AND ts >= toDateTime({since})
					AND `+rawHours("ts", "toStartOfHour(ts)", dirtyLabels, "{since}")+`
				GROUP BY capability, run, rollout_id
			)
			GROUP BY capability, run, time_bucket
		)
		GROUP BY capability, run, time_bucket
	)
)
GROUP BY capability, time_bucket
ORDER BY capability, time_bucket`, "env", "av", "dict", "since")

// QLackingWeekly is, per week, agent version and capability of one
// environment, the mean over runs of Cov (the share of failed rollouts
// labeled LACKING), of Δ and of the number of failures labeled LACKING: the
// failure trends. Labels of every dictionary version count (one label per
// agent version, capability, run and rollout: the rollup's dicts = 1 rows);
// a capability is matched by name. It ends with the anchor's week (the
// trends page's "this week").
//
// Binds: environment, since (Unix seconds), anchor (Unix seconds).
var QLackingWeekly, lackingWeeklyArgs = named(`SELECT week, agent_version, capability,
	avg(cov) AS mean_cov,
	avg(delta) AS mean_delta,
	avg(lf) AS lacking_failed,
	max(failed) AS failed
FROM (
	SELECT week, agent_version, capability, run, lf, failed,
		`+labelStats+`
	FROM (
		SELECT week, agent_version, capability, run, `+labelSumCols+`
		FROM (
			SELECT toMonday(hour) AS week, agent_version, capability, run, `+labelRollupCols+`
			FROM (
				SELECT agent_version, capability, run, hour, `+newestLabelCounts+`
				FROM label_hourly
				WHERE environment = {env} AND dicts = 1 AND hour >= toDateTime({since}) AND hour < toDateTime(toMonday(toDateTime({anchor})) + 7)
					AND `+rolledUp(dirtyLabels)+`
				GROUP BY agent_version, capability, run, hour)
			UNION ALL
			SELECT toMonday(t) AS week, agent_version, capability, run, `+labelRawCols+`
			FROM (
				SELECT agent_version, capability, run, rollout_id,
					argMax(label, ingest_ns) AS l,
					argMax(success, ingest_ns) AS ok,
					argMax(ts, ingest_ns) AS t
				FROM labels_by_time
				WHERE environment = {env} AND ts >= toDateTime({since}) AND ts < toDateTime(toMonday(toDateTime({anchor})) + 7)
					AND `+rawHours("ts", "toStartOfHour(ts)", dirtyLabels, "{since}")+`
				GROUP BY agent_version, capability, run, rollout_id
			)
			GROUP BY week, agent_version, capability, run
		)
		GROUP BY week, agent_version, capability, run
	)
)
GROUP BY week, agent_version, capability
ORDER BY week, agent_version, mean_cov DESC, capability`, "env", "since", "anchor")

// QLackingWeekOverWeek compares, per capability of one environment and agent
// version, this week with last week: mean over runs of Cov, Δ and the
// failures labeled LACKING. "This week" is the week (Monday to Sunday, server
// time zone) that contains the anchor time; a week without labels gives 0
// (runs_* tell the two cases apart).
//
// Binds: anchor (Unix seconds), environment, agent_version, anchor, anchor, top-N limit.
var QLackingWeekOverWeek, lackingWeekOverWeekArgs = named(`SELECT capability,
	sumIf(cov, w = 1) / greatest(countIf(w = 1), 1) AS cov_this_week,
	sumIf(cov, w = 0) / greatest(countIf(w = 0), 1) AS cov_last_week,
	sumIf(delta, w = 1) / greatest(countIf(w = 1), 1) AS delta_this_week,
	sumIf(delta, w = 0) / greatest(countIf(w = 0), 1) AS delta_last_week,
	sumIf(lf, w = 1) / greatest(countIf(w = 1), 1) AS lacking_this_week,
	sumIf(lf, w = 0) / greatest(countIf(w = 0), 1) AS lacking_last_week,
	countIf(w = 1) AS runs_this_week,
	countIf(w = 0) AS runs_last_week
FROM (
	SELECT capability, run, w, lf,
		`+labelStats+`
	FROM (
		SELECT capability, run, w, `+labelSumCols+`
		FROM (
			SELECT capability, run, toMonday(hour) = toMonday(toDateTime({anchor})) AS w, `+labelRollupCols+`
			FROM (
				SELECT capability, run, hour, `+newestLabelCounts+`
				FROM label_hourly
				WHERE environment = {env} AND agent_version = {av} AND dicts = 1
					AND hour >= toDateTime(toMonday(toDateTime({anchor})) - 7) AND hour < toDateTime(toMonday(toDateTime({anchor})) + 7)
					AND `+rolledUp(dirtyLabels)+`
				GROUP BY capability, run, hour)
			UNION ALL
			SELECT capability, run, toMonday(t) = toMonday(toDateTime({anchor})) AS w, `+labelRawCols+`
			FROM (
				SELECT capability, run, rollout_id,
					argMax(label, ingest_ns) AS l,
					argMax(success, ingest_ns) AS ok,
					argMax(ts, ingest_ns) AS t
				FROM labels_by_time
				WHERE environment = {env} AND agent_version = {av}
					AND ts >= toDateTime(toMonday(toDateTime({anchor})) - 7)
					AND ts < toDateTime(toMonday(toDateTime({anchor})) + 7)
					AND `+rawHours("ts", "toStartOfHour(ts)", dirtyLabels, "")+`
				GROUP BY capability, run, rollout_id
			)
			GROUP BY capability, run, w
		)
		GROUP BY capability, run, w
	)
)
GROUP BY capability
ORDER BY cov_this_week DESC, lacking_this_week DESC, capability
LIMIT {top}`, "anchor", "env", "av", "anchor", "anchor", "top")

// QRolloutCohorts lists every (environment, agent version) with rollouts and
// its totals: the rollup's hours and rollout_counts for the others.
var QRolloutCohorts = `SELECT environment, agent_version, sum(r) AS rollouts, sum(s) AS successes, max(b) AS last_bucket
FROM (
	SELECT environment, agent_version, r, s, hour AS b
	FROM (
		SELECT environment, agent_version, hour, argMax(rollouts, version) AS r, argMax(successes, version) AS s
		FROM rollout_hourly
		WHERE ` + rolledUp(dirtyRollouts) + `
		GROUP BY environment, agent_version, hour)
	UNION ALL
	SELECT environment, agent_version, uniqExactMerge(rollouts) AS r, uniqExactIfMerge(successes) AS s, max(bucket) AS b
	FROM rollout_counts
	WHERE ` + rawHours("bucket", "bucket", dirtyRollouts, "") + `
	GROUP BY environment, agent_version
)
GROUP BY environment, agent_version
ORDER BY environment, agent_version`

// QLabelCohorts lists every labeled cohort (environment, agent version,
// dictionary version) with its labeled rollouts, capabilities and runs: the
// capabilities, runs and newest hour from the small label_capabilities
// table, the labeled rollouts from the rollup's hours and the raw rows of
// the others.
var QLabelCohorts = `SELECT environment, agent_version, dictionary_version,
	sum(n) AS labeled_rollouts,
	sum(caps) AS capabilities,
	toUInt64(max(mr) + 1) AS runs,
	max(lb) AS last_bucket
FROM (
	SELECT environment, agent_version, dictionary_version, toUInt64(0) AS n, toUInt64(1) AS caps,
		maxMerge(max_run) AS mr, toStartOfHour(maxMerge(last_ts)) AS lb
	FROM label_capabilities
	GROUP BY environment, agent_version, dictionary_version, capability
	UNION ALL
	SELECT environment, agent_version, dictionary_version, n, toUInt64(0) AS caps, toUInt16(0) AS mr, toDateTime(0) AS lb
	FROM (
		SELECT environment, agent_version, dictionary_version, hour, argMax(rollouts, version) AS n
		FROM labeled_hourly
		WHERE ` + rolledUp(dirtyLabels) + `
		GROUP BY environment, agent_version, dictionary_version, hour)
	UNION ALL
	SELECT environment, agent_version, dictionary_version, uniqExact(rollout_id) AS n, toUInt64(0) AS caps, toUInt16(0) AS mr, toDateTime(0) AS lb
	FROM labels_by_time
	WHERE ` + rawHours("ts", "toStartOfHour(ts)", dirtyLabels, "") + `
	GROUP BY environment, agent_version, dictionary_version, toStartOfHour(ts)
)
GROUP BY environment, agent_version, dictionary_version
ORDER BY environment, agent_version, dictionary_version`

// QRollouts reads stored rollouts by id (the latest ingested version of each).
// The ids are a set the sort key (environment, agent_version, rollout_id)
// serves.
//
// Binds: environment, agent_version, array of rollout ids.
var QRollouts = `SELECT rollout_id,
	argMax(task_id, ingest_ns) AS task_id,
	argMax(success, ingest_ns) AS success,
	argMax(reward, ingest_ns) AS reward,
	argMax(end_time, ingest_ns) AS end_time,
	argMax(messages, ingest_ns) AS messages,
	argMax(grader, ingest_ns) AS grader
FROM rollouts
WHERE environment = ? AND agent_version = ? AND rollout_id IN (SELECT arrayJoin(?))
GROUP BY rollout_id`

// QTriggerEvents lists the newest trigger transitions (at most the limit),
// in time order. An empty filter value matches everything.
//
// Binds: since (Unix seconds), environment ×2, agent_version ×2, capability ×2, limit.
const QTriggerEvents = `SELECT * FROM (
	SELECT trigger_id, environment, agent_version, dictionary_version, capability, epoch, event, at,
		mean_cov, mean_delta, runs_passed, runs_total,
		window_start, window_end, window_rollouts, window_failures, payload
	FROM trigger_events FINAL
	` + triggerFilter + `
	ORDER BY at DESC, environment DESC, agent_version DESC, dictionary_version DESC, capability DESC, epoch DESC, event DESC
	LIMIT ?)
ORDER BY at, environment, agent_version, dictionary_version, capability, epoch, event`

// triggerFilter is the WHERE of QTriggerEvents and QTriggerEventCounts.
const triggerFilter = `WHERE at >= toDateTime(?)
	AND (? = '' OR environment = ?)
	AND (? = '' OR agent_version = ?)
	AND (? = '' OR capability = ?)`

// triggerFilterBinds are triggerFilter's binds, with their docs' examples.
var triggerFilterBinds = []DashboardBind{{"since (Unix seconds)", "0"}, {"environment", "''"}, {"environment", "''"}, {"agent_version", "''"},
	{"agent_version", "''"}, {"capability", "''"}, {"capability", "''"}}

// QTriggerEventCounts counts the trigger transitions QTriggerEvents would
// list without its limit, per event kind.
//
// Binds: since (Unix seconds), environment ×2, agent_version ×2, capability ×2.
const QTriggerEventCounts = `SELECT event, count() AS events
FROM trigger_events FINAL
` + triggerFilter + `
GROUP BY event
ORDER BY event`

// QLatestTriggers is the newest trigger transition per capability of one
// cohort.
//
// Binds: environment, agent_version, dictionary_version.
const QLatestTriggers = `SELECT capability,
	argMax(event, (at, epoch)) AS last_event,
	max(epoch) AS last_epoch,
	max(at) AS last_at
FROM trigger_events FINAL
WHERE environment = ? AND agent_version = ? AND dictionary_version = ?
GROUP BY capability`

// QWeekBounds is the Monday (server time zone) of the week of a time, and
// the Monday a number of days before it: the trends page's weeks.
//
// Binds: anchor (Unix seconds) ×2, days back.
const QWeekBounds = `SELECT toMonday(toDateTime(?)), toDateTime(toMonday(toDateTime(?)) - ?)`

// dailySQL turns an hourly statement into its daily variant: its
// toStartOfHour buckets become toStartOfDay ones; the filters on
// toStartOfHour(ts) (which hours are read raw) stay hourly.
func dailySQL(q string) string {
	const keep = "\x00ts-hour\x00"
	q = strings.ReplaceAll(q, "toStartOfHour(ts)", keep)
	q = strings.ReplaceAll(q, "toStartOfHour(", "toStartOfDay(")
	return strings.ReplaceAll(q, keep, "toStartOfHour(ts)")
}

// dashboardSQL is the set of statements QueryDashboard runs.
var dashboardSQL = func() map[string]*DashboardQuery {
	m := map[string]*DashboardQuery{}
	for i := range DashboardQueries {
		m[DashboardQueries[i].SQL] = &DashboardQueries[i]
	}
	return m
}()

// args is the caller's binds in the order of q's `?` (see DashboardQuery.Args).
func (q *DashboardQuery) args(caller []any) ([]any, error) {
	if q.Args == nil {
		return caller, nil
	}
	out := make([]any, len(q.Args))
	for i, a := range q.Args {
		if a >= len(caller) {
			return nil, fmt.Errorf("sink: %s takes %d binds, got %d", q.Name, len(q.Binds), len(caller))
		}
		out[i] = caller[a]
	}
	return out, nil
}

// QueryDashboard runs q, one of the dashboard statements of this file (the
// Q* constants), with its binds; daily turns its toStartOfHour buckets
// into toStartOfDay ones. Any other SQL is refused: the dashboard reads
// through this method, and every statement trace runs lives in package sink.
// The query runs under the dashboard's limits (clickhouse.query_timeout and
// query_max_memory, see dashboardCtx). The caller closes the rows.
func (s *Store) QueryDashboard(ctx context.Context, q string, daily bool, args ...any) (driver.Rows, error) {
	dq := dashboardSQL[q]
	if dq == nil {
		return nil, fmt.Errorf("sink: not a dashboard statement: %.60q", q)
	}
	args, err := dq.args(args)
	if err != nil {
		return nil, err
	}
	if daily {
		q = dailySQL(q)
	}
	if dq.Raw != "" {
		q = s.inlineRollupState(ctx, q)
	}
	return s.conn.Query(s.dashboardCtx(ctx), q, args...)
}

// QueryDashboardRaw runs the statement q stood for before the rollup (its
// Raw SQL, reading only raw rows and the insert-time aggregates) with the
// same binds: the comparison of `trace bench query` and of the exactness
// tests. A statement without a rollup runs as itself.
func (s *Store) QueryDashboardRaw(ctx context.Context, q string, daily bool, args ...any) (driver.Rows, error) {
	dq := dashboardSQL[q]
	if dq == nil {
		return nil, fmt.Errorf("sink: not a dashboard statement: %.60q", q)
	}
	if dq.Raw == "" {
		return s.QueryDashboard(ctx, q, daily, args...)
	}
	raw := dq.Raw
	if daily {
		raw = dailySQL(raw)
	}
	return s.conn.Query(s.dashboardCtx(ctx), raw, args...)
}

// QueryDashboardRow is QueryDashboard for a statement of one row (the
// hourly variant).
func (s *Store) QueryDashboardRow(ctx context.Context, q string, args ...any) driver.Row {
	dq := dashboardSQL[q]
	if dq == nil {
		return errRow{fmt.Errorf("sink: not a dashboard statement: %.60q", q)}
	}
	args, err := dq.args(args)
	if err != nil {
		return errRow{err}
	}
	return s.conn.QueryRow(s.dashboardCtx(ctx), q, args...)
}

// errRow is a driver.Row that only fails.
type errRow struct{ err error }

func (r errRow) Err() error           { return r.err }
func (r errRow) Scan(...any) error    { return r.err }
func (r errRow) ScanStruct(any) error { return r.err }

// DashboardQuery is one documented statement of the dashboard.
type DashboardQuery struct {
	Name    string // Go constant
	Title   string
	Purpose string
	SQL     string
	Binds   []DashboardBind
	// More: listed under "Other statements of the dashboard".
	More bool
	// Args, when set, maps each `?` of SQL, in order, to the index of the
	// caller's bind it takes (a statement that reads the rollup and the raw
	// rows uses some binds twice); nil means the binds in order.
	Args []int
	// Raw is the statement before the rollup (raw rows and the insert-time
	// aggregates only), taking the caller's binds in order: what `trace
	// bench query` and the exactness tests compare with.
	Raw string
}

// DashboardBind documents one `?` of a query, in order, with the literal used in the
// docs' ready-to-run example.
type DashboardBind struct {
	Name    string
	Example string // SQL literal
}

// DashboardQueries are the statements documented in docs/queries.md, in
// order.
var DashboardQueries = []DashboardQuery{
	{
		Name: "QPassRateHourly", Title: "Pass rate over time per agent version (hourly)",
		Purpose: "The overview's pass-rate chart: rollouts and successes per hour and agent version of one environment.",
		SQL:     QPassRateHourly, Raw: rawPassRateHourly, Args: passRateHourlyArgs,
		Binds: []DashboardBind{{"environment", "'airline'"}, {"since (Unix seconds)", "toUInt32(now() - INTERVAL 7 DAY)"}},
	},
	{
		Name: "QPassRateWeekly", Title: "Pass rate over time per agent version (weekly)",
		Purpose: "The trends page's pass-rate chart: rollouts and successes per week and agent version, up to the anchor's week.",
		SQL:     QPassRateWeekly, Raw: rawPassRateWeekly, Args: passRateWeeklyArgs,
		Binds: []DashboardBind{{"environment", "'airline'"}, {"since (Unix seconds)", "toUInt32(toDateTime(toMonday(today()) - 7 * 7))"},
			{"anchor: a time in the last week shown (Unix seconds)", "toUInt32(now())"}},
	},
	{
		Name: "QCapabilityHourly", Title: "Cov and Δ over time per capability (hourly)",
		Purpose: "The overview's Cov and Δ charts: per hour, each run's Cov = L−/|failed| and Δ = ER− − ER+, averaged over runs.",
		SQL:     QCapabilityHourly, Raw: rawCapabilityHourly, Args: capabilityHourlyArgs,
		Binds: []DashboardBind{{"environment", "'airline'"}, {"agent_version", "'v2'"}, {"dictionary_version", "1"},
			{"since (Unix seconds)", "toUInt32(now() - INTERVAL 7 DAY)"}},
	},
	{
		Name: "QLackingWeekly", Title: "LACKING capabilities per week and agent version",
		Purpose: "The trends page's weekly table: mean Cov, Δ and LACKING failures per week, agent version and capability, highest Cov first, up to the anchor's week.",
		SQL:     QLackingWeekly, Raw: rawLackingWeekly, Args: lackingWeeklyArgs,
		Binds: []DashboardBind{{"environment", "'airline'"}, {"since (Unix seconds)", "toUInt32(toDateTime(toMonday(today()) - 7 * 7))"},
			{"anchor: a time in the last week shown (Unix seconds)", "toUInt32(now())"}},
	},
	{
		Name: "QLackingWeekOverWeek", Title: "Top LACKING capabilities this week vs last week",
		Purpose: "The trends page's comparison: per capability of one agent version, Cov, Δ and LACKING failures this week and last week.",
		SQL:     QLackingWeekOverWeek, Raw: rawLackingWeekOverWeek, Args: lackingWeekOverWeekArgs,
		Binds: []DashboardBind{{"anchor: a time in \"this week\" (Unix seconds)", "toUInt32(now())"}, {"environment", "'airline'"},
			{"agent_version", "'v2'"}, {"anchor", "toUInt32(now())"}, {"anchor", "toUInt32(now())"}, {"top N", "10"}},
	},
	{
		Name: "QLackingExamples", Title: "Failed rollouts where a capability was LACKING",
		Purpose: "The capability page's examples: failed rollouts labeled LACKING, with in how many runs.",
		SQL:     QLackingExamples,
		Binds: []DashboardBind{{"environment", "'airline'"}, {"agent_version", "'v2'"}, {"dictionary_version", "1"},
			{"capability", "'multi_step_transaction_completion'"}, {"since (Unix seconds)", "0"}, {"limit", "5"}},
	},
	{
		Name: "QTriggerEvents", Title: "Trigger timeline",
		Purpose: "The trigger page: the newest transitions (fired, deselected, reselected, rearmed), at most the limit, in time order; '' matches every value.",
		SQL:     QTriggerEvents,
		Binds:   append(slices.Clone(triggerFilterBinds), DashboardBind{"limit", "500"}),
	},
	{
		Name: "QTriggerEventCounts", Title: "Trigger transitions per kind", More: true,
		Purpose: "The trigger page's counts: the transitions of the timeline's filter per event kind, all of them, beyond its limit too.",
		SQL:     QTriggerEventCounts,
		Binds:   triggerFilterBinds,
	},
	{
		Name: "QRolloutCohorts", Title: "Environments and agent versions with rollouts", More: true,
		Purpose: "The overview's cohort list: rollouts, successes and the latest hour per (environment, agent version).",
		SQL:     QRolloutCohorts, Raw: rawRolloutCohorts,
	},
	{
		Name: "QLabelCohorts", Title: "Labeled cohorts", More: true,
		Purpose: "The overview's cohort list: labeled rollouts, capabilities and runs per (environment, agent version, dictionary version).",
		SQL:     QLabelCohorts, Raw: rawLabelCohorts,
	},
	{
		Name: "QLatestTriggers", Title: "Latest trigger transition per capability", More: true,
		Purpose: "The overview's trigger column.",
		SQL:     QLatestTriggers,
		Binds:   []DashboardBind{{"environment", "'airline'"}, {"agent_version", "'v1'"}, {"dictionary_version", "1"}},
	},
	{
		Name: "QRollouts", Title: "Stored rollouts by id", More: true,
		Purpose: "The capability page's conversations (compacted messages) and grader output.",
		SQL:     QRollouts, Raw: rawRollouts,
		Binds: []DashboardBind{{"environment", "'airline'"}, {"agent_version", "'v2'"}, {"rollout ids (array)", "['airline:v2:001', 'airline:v2:002']"}},
	},
	{
		Name: "QWeekBounds", Title: "Week boundaries", More: true,
		Purpose: "The trends page's weeks: the Monday of the anchor's week and the Monday N days before it.",
		SQL:     QWeekBounds,
		Binds:   []DashboardBind{{"anchor (Unix seconds)", "toUInt32(now())"}, {"anchor", "toUInt32(now())"}, {"days back", "42"}},
	},
}

// InlineBinds substitutes literals for the `?` binds of sql, in order. The
// dashboard's SQL has no `?` inside string literals, so a plain scan is
// enough.
func InlineBinds(sql string, literals ...string) (string, error) {
	var b strings.Builder
	i := 0
	for _, r := range sql {
		if r == '?' {
			if i >= len(literals) {
				return "", fmt.Errorf("more binds than the %d literals", len(literals))
			}
			b.WriteString(literals[i])
			i++
			continue
		}
		b.WriteRune(r)
	}
	if i != len(literals) {
		return "", fmt.Errorf("%d binds, %d literals", i, len(literals))
	}
	return b.String(), nil
}

// Example is q's SQL with the documented example literals.
func (q DashboardQuery) Example() (string, error) {
	lits := make([]string, len(q.Binds))
	for i, b := range q.Binds {
		lits[i] = b.Example
	}
	if q.Args != nil {
		exp := make([]string, len(q.Args))
		for i, a := range q.Args {
			if a >= len(lits) {
				return "", fmt.Errorf("%s: bind %d of %d documented", q.Name, a+1, len(lits))
			}
			exp[i] = lits[a]
		}
		lits = exp
	}
	return InlineBinds(q.SQL, lits...)
}
