package sink

import (
	"fmt"
	"strings"
	"time"
)

// The SQL of the store's read queries, built apart from running them: each
// builder returns the query text and its `?` arguments in order. The Store
// runs them through clickhouse-go (ClickHouse 18.16 in CI), and the `chdb`
// build-tagged tests (chdb_test.go) run the very same text, with the
// arguments inlined as literals, on ClickHouse 26.7 in-process (chDB).

// windowCountsSQL is the query of WindowCountsMulti: per (cohort, capability,
// run) label counts over the window, each (rollout, capability, run) counted
// once with its most recently ingested label. spec.Cohorts must not be empty.
func windowCountsSQL(spec MultiSpec) (string, []any) {
	where, args := spec.where()
	return rawWindowCounts(where) + `
ORDER BY ` + cohortCols + `, capability, run`, args
}

// rawWindowCounts is the raw computation of the window counts of the labels
// matching where, per (cohort, capability, run).
func rawWindowCounts(where string) string {
	return fmt.Sprintf(`SELECT %s, capability, run,
	countIf(ok = 0 AND l = 'LACKING'), countIf(ok = 0 AND l = 'PRESENT'), countIf(ok = 0 AND l = 'NA'),
	countIf(ok = 1 AND l = 'LACKING'), countIf(ok = 1 AND l = 'PRESENT'), countIf(ok = 1 AND l = 'NA'),
	arraySlice(arraySort(groupArrayIf(rollout_id, ok = 0 AND l = 'LACKING')), 1, %d)
FROM (
	SELECT %s, capability, run, rollout_id, argMax(label, ingest_ns) AS l, argMax(success, ingest_ns) AS ok
	FROM labels_by_time
	WHERE %s
	GROUP BY %s, capability, run, rollout_id
)
GROUP BY %s, capability, run`, cohortCols, MaxExampleIDs, cohortCols, where, cohortCols, cohortCols)
}

// windowInfoSQL is the query of WindowInfoMulti: distinct rollouts, failures
// and the first and last label time per cohort. spec.Cohorts must not be
// empty.
func windowInfoSQL(spec MultiSpec) (string, []any) {
	where, args := spec.where()
	return rawWindowInfo(where), args
}

// rawWindowInfo is the raw computation of the window info of the labels
// matching where, per cohort.
func rawWindowInfo(where string) string {
	return fmt.Sprintf(`SELECT %s, count(), countIf(ok = 0), min(t), max(t) FROM (
	SELECT %s, rollout_id, argMax(success, ingest_ns) AS ok, max(ts) AS t
	FROM labels_by_time WHERE %s GROUP BY %s, rollout_id)
GROUP BY %s`, cohortCols, cohortCols, where, cohortCols, cohortCols)
}

// cohortsSQL is the query of Cohorts. It reads the small label_capabilities
// table (one row per cohort and capability) rather than the labels: the
// evaluator lists every cohort at each tick, whatever its age. since is
// taken to its hour.
func cohortsSQL(since time.Time) (string, []any) {
	return `SELECT environment, agent_version, dictionary_version
	FROM label_capabilities GROUP BY environment, agent_version, dictionary_version
	HAVING maxMerge(last_ts) >= toStartOfHour(toDateTime(?)) ORDER BY environment, agent_version, dictionary_version`, []any{uint32(max(since.Unix(), 0))}
}

// watermarksSQL is the query of Watermarks: the newest label time (the end
// time of the newest labeled rollout) per cohort, of the given cohorts or of
// all, from the small label_capabilities table (kept at insert time: the
// same max(ts) as over the labels).
func watermarksSQL(cohorts []Cohort) (string, []any) {
	where := ""
	var args []any
	if len(cohorts) > 0 {
		var in string
		in, args = cohortIn(cohorts)
		where = "\n\tWHERE " + in
	}
	return `SELECT ` + cohortCols + `, maxMerge(last_ts) FROM label_capabilities` + where + `
	GROUP BY ` + cohortCols + ` ORDER BY ` + cohortCols, args
}

// labelSourcesSQL is the query of LabelSources: the sources of the given
// cohorts' labels, from the small label_sources table (kept at insert time).
func labelSourcesSQL(cohorts []Cohort) (string, []any) {
	in, args := cohortIn(cohorts)
	return `SELECT ` + cohortCols + `, source FROM label_sources
	WHERE ` + in + `
	GROUP BY ` + cohortCols + `, source ORDER BY ` + cohortCols + `, source`, args
}

// cohortToolsSQL is the query of CohortTools.
func cohortToolsSQL(keys [][2]string) (string, []any) {
	tuples := make([]string, len(keys))
	args := make([]any, 0, 2*len(keys))
	for i, k := range keys {
		tuples[i] = "(?, ?)"
		args = append(args, k[0], k[1])
	}
	return `SELECT environment, agent_version, argMax(tools, end_time) FROM rollouts
	WHERE (environment, agent_version) IN (` + strings.Join(tuples, ", ") + `) AND tools != ''
	GROUP BY environment, agent_version`, args
}

// countDistinctRolloutsSQL is the query of CountDistinctRollouts.
const countDistinctRolloutsSQL = "SELECT uniqExact(rollout_id), count() FROM rollouts"

// unexplainedFailuresSQL is the query of UnexplainedFailures.
func unexplainedFailuresSQL(c Cohort, since time.Time) (string, []any) {
	return `SELECT countIf(ok = 0), countIf(ok = 0 AND lacking = 0) FROM (
	SELECT rollout_id, argMax(success, ingest_ns) AS ok, max(label = 'LACKING') AS lacking
	FROM labels_by_time
	WHERE environment = ? AND agent_version = ? AND dictionary_version = ? AND toUInt32(ts) >= ?
	GROUP BY rollout_id)`, []any{c.Environment, c.AgentVersion, c.DictionaryVersion, uint32(max(since.Unix(), 0))}
}

// sampleRolloutsSQL is the query of SampleRollouts.
func sampleRolloutsSQL(env, agentVersion string, n int) (string, []any) {
	return fmt.Sprintf(`SELECT rollout_id, task, agent, ok, rew, st, en, msgs, gr FROM (
	SELECT rollout_id, any(task_id) AS task, any(agent_name) AS agent, any(success) AS ok, any(reward) AS rew,
		any(start_time) AS st, any(end_time) AS en, any(messages) AS msgs, any(grader) AS gr
	FROM rollouts WHERE environment = ? AND agent_version = ?
	GROUP BY rollout_id)
ORDER BY en DESC, rollout_id LIMIT %d BY ok`, n), []any{env, agentVersion}
}

// rolloutsByIDSQL is the query of RolloutsByID: the columns of
// sampleRolloutsSQL for the given ids of a cohort (clickhouse-go binds a
// []string as an Array literal, hence IN over its arrayJoin: a set the sort
// key serves, where has() read the whole cohort).
func rolloutsByIDSQL(env, agentVersion string, ids []string) (string, []any) {
	return `SELECT rollout_id, any(task_id), any(agent_name), any(success), any(reward),
		any(start_time), any(end_time), any(messages), any(grader)
	FROM rollouts WHERE environment = ? AND agent_version = ? AND rollout_id IN (SELECT arrayJoin(?))
	GROUP BY rollout_id ORDER BY rollout_id`, []any{env, agentVersion, ids}
}

// latestDictionariesSQL is the query of LatestDictionaries.
const latestDictionariesSQL = `SELECT environment, agent_version, max(version) AS v,
	argMax(created_at, version), argMax(source, version), argMax(body, version)
	FROM dictionaries GROUP BY environment, agent_version ORDER BY environment, agent_version`

// allDictionariesSQL is the query of AllDictionaries.
const allDictionariesSQL = `SELECT environment, agent_version, version, any(created_at), any(source), any(body)
	FROM dictionaries GROUP BY environment, agent_version, version ORDER BY environment, agent_version, version DESC`

// triggerHistorySQL is the query of TriggerHistory.
const triggerHistorySQL = `SELECT trigger_id, environment, agent_version, dictionary_version, capability, epoch, event, at,
	mean_cov, mean_delta, runs_passed, runs_total, window_start, window_end, window_rollouts, window_failures, payload
	FROM trigger_events FINAL ORDER BY environment, agent_version, dictionary_version, capability, at, epoch`

// storedRunsSQL is the query of StoredRuns.
func storedRunsSQL(env, agentVersion, rolloutID string, dictVersion uint32) (string, []any) {
	return `SELECT DISTINCT run FROM capability_labels
	WHERE environment = ? AND agent_version = ? AND dictionary_version = ? AND rollout_id = ?
	UNION ALL
	SELECT DISTINCT run FROM label_runs
	WHERE environment = ? AND agent_version = ? AND dictionary_version = ? AND rollout_id = ?`,
		[]any{env, agentVersion, dictVersion, rolloutID, env, agentVersion, dictVersion, rolloutID}
}

// doneRunsSQL is the query of DoneRuns: the runs of a rollout with labels,
// or whose newest label_runs record is ok (a run recorded as failed and
// not labeled since is not done).
func doneRunsSQL(env, agentVersion, rolloutID string, dictVersion uint32) (string, []any) {
	return `SELECT DISTINCT run FROM capability_labels
	WHERE environment = ? AND agent_version = ? AND dictionary_version = ? AND rollout_id = ?
	UNION ALL
	SELECT run FROM label_runs
	WHERE environment = ? AND agent_version = ? AND dictionary_version = ? AND rollout_id = ?
	GROUP BY run HAVING argMax(status, ingest_ns) = 'ok'`,
		[]any{env, agentVersion, dictVersion, rolloutID, env, agentVersion, dictVersion, rolloutID}
}

// rolloutScopesSQL is the query of RolloutScopes.
const rolloutScopesSQL = `SELECT environment, agent_version, uniqExact(rollout_id), uniqExactIf(rollout_id, success = 0), max(end_time)
	FROM rollouts GROUP BY environment, agent_version ORDER BY environment, agent_version`

// changedCohortsSQL is the query of ChangedCohorts (bind: since, ns).
const changedCohortsSQL = `SELECT DISTINCT environment, agent_version FROM rollup_log WHERE kind = 1 AND last_ingest > ?`

// rolloutKeysSQL is the query of RolloutKeys.
const rolloutKeysSQL = `SELECT DISTINCT environment, agent_version FROM rollout_counts ORDER BY environment, agent_version`

// rolloutScopesOfSQL is the query of RolloutScopesOf (keys not empty).
func rolloutScopesOfSQL(keys [][2]string) (string, []any) {
	tuples := make([]string, len(keys))
	args := make([]any, 0, 2*len(keys))
	for i, k := range keys {
		tuples[i] = "(?, ?)"
		args = append(args, k[0], k[1])
	}
	return `SELECT environment, agent_version, uniqExact(rollout_id), uniqExactIf(rollout_id, success = 0), max(end_time)
	FROM rollouts WHERE (environment, agent_version) IN (` + strings.Join(tuples, ", ") + `)
	GROUP BY environment, agent_version ORDER BY environment, agent_version`, args
}

// failedLabelRunsSQL is the query of FailedLabelRuns: the (rollout, run)s
// whose newest label_runs record is failed (one labeled since, by a
// relabel, is not), read only for the keys that ever failed.
const failedLabelRunsSQL = `SELECT environment, agent_version, dictionary_version, any(lb), count(), any(rs) FROM (
	SELECT environment, agent_version, dictionary_version, rollout_id, run,
		argMax(labeler, ingest_ns) AS lb, argMax(status, ingest_ns) AS st, argMax(reason, ingest_ns) AS rs
	FROM label_runs
	WHERE (environment, agent_version, dictionary_version, rollout_id, run) IN
		(SELECT environment, agent_version, dictionary_version, rollout_id, run FROM label_runs WHERE status = 'failed')
	GROUP BY environment, agent_version, dictionary_version, rollout_id, run)
	WHERE st = 'failed'
	GROUP BY environment, agent_version, dictionary_version ORDER BY environment, agent_version, dictionary_version`

// storedRolloutsSQL is the query of StoredRollouts.
func storedRolloutsSQL(env, agentVersion string, since time.Time) (string, []any) {
	return `SELECT rollout_id, argMax(end_time, ingest_ns) AS en, argMax(kafka_topic, ingest_ns), argMax(kafka_partition, ingest_ns),
		argMax(kafka_offset, ingest_ns)
	FROM rollouts WHERE environment = ? AND agent_version = ? AND toUInt32(end_time) >= ?
	GROUP BY rollout_id ORDER BY en, rollout_id`, []any{env, agentVersion, uint32(max(since.Unix(), 0))}
}

// rolloutEndTimesSQL is the query of RolloutEndTimes: the stored end time
// of each given rollout (its most recently ingested copy's, as
// storedRolloutsSQL reads it), all in one statement, the ids of each
// (environment, agent version) bound as one array (IN over its arrayJoin,
// as rolloutsByIDSQL: a set the sort key serves, and one literal to parse
// however many ids). keys must not be empty.
func rolloutEndTimesSQL(keys []RolloutKey) (string, []any) {
	var order [][2]string
	ids := map[[2]string][]string{}
	for _, k := range keys {
		c := [2]string{k.Environment, k.AgentVersion}
		if _, ok := ids[c]; !ok {
			order = append(order, c)
		}
		ids[c] = append(ids[c], k.RolloutID)
	}
	conds := make([]string, len(order))
	args := make([]any, 0, 3*len(order))
	for i, c := range order {
		conds[i] = "(environment = ? AND agent_version = ? AND rollout_id IN (SELECT arrayJoin(?)))"
		args = append(args, c[0], c[1], ids[c])
	}
	return `SELECT environment, agent_version, rollout_id, argMax(end_time, ingest_ns)
	FROM rollouts WHERE ` + strings.Join(conds, "\n\t\tOR ") + `
	GROUP BY environment, agent_version, rollout_id`, args
}

// labeledRunsSQL is the query of LabeledRuns: the runs of each rollout of a
// cohort that have labels or whose newest label_runs record is ok.
func labeledRunsSQL(c Cohort) (string, []any) {
	return `SELECT rollout_id, uniqExact(run) FROM (
	SELECT rollout_id, run FROM capability_labels WHERE environment = ? AND agent_version = ? AND dictionary_version = ?
	UNION ALL
	SELECT rollout_id, run FROM label_runs WHERE environment = ? AND agent_version = ? AND dictionary_version = ?
	GROUP BY rollout_id, run HAVING argMax(status, ingest_ns) = 'ok')
GROUP BY rollout_id`, []any{c.Environment, c.AgentVersion, c.DictionaryVersion, c.Environment, c.AgentVersion, c.DictionaryVersion}
}

// compactedRolloutsSQL is the query of CompactedRollouts.
func compactedRolloutsSQL(env, agentVersion string, ids []string) (string, []any) {
	marks := make([]string, len(ids))
	args := []any{env, agentVersion}
	for i, id := range ids {
		marks[i] = "?"
		args = append(args, id)
	}
	return `SELECT rollout_id, argMax(task_id, ingest_ns), argMax(agent_name, ingest_ns), argMax(success, ingest_ns), argMax(reward, ingest_ns),
		argMax(start_time, ingest_ns), argMax(end_time, ingest_ns), argMax(messages, ingest_ns), argMax(tools, ingest_ns),
		argMax(grader, ingest_ns), argMax(metadata, ingest_ns)
	FROM rollouts WHERE environment = ? AND agent_version = ? AND rollout_id IN (` + strings.Join(marks, ", ") + `)
	GROUP BY rollout_id`, args
}
