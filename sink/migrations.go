package sink

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Migration is one versioned schema step. Its statements must be idempotent
// (IF NOT EXISTS): two replicas that start at once may both run them.
type Migration struct {
	Version int
	Name    string
	SQL     func(d Dialect) []string
}

// Dialect renders the optional parts of DDL for a server's features.
type Dialect struct {
	Features      Features
	RetentionDays int
}

// LC is a low-cardinality string column type.
func (d Dialect) LC() string {
	if d.Features.LowCardinality {
		return "LowCardinality(String)"
	}
	return "String"
}

// Big is the codec clause of a large text column.
func (d Dialect) Big() string {
	if d.Features.Codecs {
		return " CODEC(ZSTD(3))"
	}
	return ""
}

// TTL is the retention clause on a DateTime column.
func (d Dialect) TTL(col string) string {
	if d.Features.TTL && d.RetentionDays > 0 {
		return fmt.Sprintf("\nTTL %s + INTERVAL %d DAY", col, d.RetentionDays)
	}
	return ""
}

// AddColumn adds a column to a table if it is not there yet. Servers
// with the modern features say IF NOT EXISTS; 18.16 does not know it, so
// Migrate treats its "column already exists" answer (code 44) to an ADD
// COLUMN as done.
func (d Dialect) AddColumn(table, column, typ string) string {
	if d.Features.LowCardinality { // the 20.1+ servers, which know IF NOT EXISTS
		return "ALTER TABLE " + table + " ADD COLUMN IF NOT EXISTS " + column + " " + typ
	}
	return "ALTER TABLE " + table + " ADD COLUMN " + column + " " + typ
}

const labelEnum = "Enum8('NA' = 0, 'PRESENT' = 1, 'LACKING' = 2)"

// Migrations is the ordered schema history. Append only: never edit a
// released step, add a new one.
var Migrations = []Migration{
	{1, "rollouts", func(d Dialect) []string {
		return []string{`CREATE TABLE IF NOT EXISTS rollouts (
	rollout_id String,
	environment ` + d.LC() + `,
	agent_name ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	task_id String,
	success UInt8,
	reward Float64,
	start_time DateTime,
	end_time DateTime,
	n_messages UInt32,
	n_tool_calls UInt32,
	n_tool_errors UInt32,
	messages String` + d.Big() + `,
	tools String` + d.Big() + `,
	grader String,
	metadata String,
	kafka_topic String,
	kafka_partition Int32,
	kafka_offset Int64,
	ingested_at DateTime,
	ingest_ns UInt64
) ENGINE = ReplacingMergeTree(ingest_ns)
PARTITION BY toYYYYMM(end_time)
ORDER BY (environment, agent_version, rollout_id)` + d.TTL("end_time"),
			// Pass rate over time: exact under redelivery (uniqExact of ids).
			`CREATE TABLE IF NOT EXISTS rollout_counts (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	bucket DateTime,
	rollouts AggregateFunction(uniqExact, String),
	successes AggregateFunction(uniqExactIf, String, UInt8)
) ENGINE = AggregatingMergeTree()
PARTITION BY toYYYYMM(bucket)
ORDER BY (environment, agent_version, bucket)`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS rollout_counts_mv TO rollout_counts AS
SELECT environment, agent_version, toStartOfHour(end_time) AS bucket,
	uniqExactState(rollout_id) AS rollouts, uniqExactIfState(rollout_id, success) AS successes
FROM rollouts GROUP BY environment, agent_version, bucket`,
		}
	}},
	{2, "capability_labels", func(d Dialect) []string {
		return []string{`CREATE TABLE IF NOT EXISTS capability_labels (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dictionary_version UInt32,
	capability ` + d.LC() + `,
	run UInt16,
	rollout_id String,
	label ` + labelEnum + `,
	success UInt8,
	reward Float64,
	source ` + d.LC() + `,
	ts DateTime,
	ingest_ns UInt64
) ENGINE = ReplacingMergeTree(ingest_ns)
PARTITION BY toYYYYMM(ts)
ORDER BY (environment, agent_version, dictionary_version, capability, run, rollout_id)` + d.TTL("ts"),
			// Counts per (cohort, capability, run, hour, outcome, label): the
			// trend view. uniqExact of rollout ids keeps them exact when a label
			// is redelivered.
			`CREATE TABLE IF NOT EXISTS label_counts (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dictionary_version UInt32,
	capability ` + d.LC() + `,
	run UInt16,
	bucket DateTime,
	success UInt8,
	label ` + labelEnum + `,
	rollouts AggregateFunction(uniqExact, String)
) ENGINE = AggregatingMergeTree()
PARTITION BY toYYYYMM(bucket)
ORDER BY (environment, agent_version, dictionary_version, capability, run, bucket, success, label)`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS label_counts_mv TO label_counts AS
SELECT environment, agent_version, dictionary_version, capability, run, toStartOfHour(ts) AS bucket, success, label,
	uniqExactState(rollout_id) AS rollouts
FROM capability_labels GROUP BY environment, agent_version, dictionary_version, capability, run, bucket, success, label`,
		}
	}},
	{3, "dictionaries_triggers_llm_calls", func(d Dialect) []string {
		return []string{`CREATE TABLE IF NOT EXISTS dictionaries (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	version UInt32,
	created_at DateTime,
	source ` + d.LC() + `,
	body String
) ENGINE = ReplacingMergeTree()
ORDER BY (environment, agent_version, version)`,
			`CREATE TABLE IF NOT EXISTS trigger_events (
	trigger_id String,
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dictionary_version UInt32,
	capability ` + d.LC() + `,
	epoch UInt32,
	event ` + d.LC() + `,
	at DateTime,
	mean_cov Float64,
	mean_delta Float64,
	runs_passed UInt16,
	runs_total UInt16,
	window_start DateTime,
	window_end DateTime,
	window_rollouts UInt32,
	window_failures UInt32,
	payload String
) ENGINE = ReplacingMergeTree()
ORDER BY (environment, agent_version, dictionary_version, capability, epoch, event)`,
			`CREATE TABLE IF NOT EXISTS llm_calls (
	ts DateTime,
	purpose ` + d.LC() + `,
	model ` + d.LC() + `,
	endpoint String,
	prompt_hash String,
	rollout_id String,
	run UInt16,
	attempt UInt8,
	prompt_tokens UInt32,
	completion_tokens UInt32,
	latency_ms UInt32,
	outcome ` + d.LC() + `,
	error String
) ENGINE = MergeTree()
PARTITION BY toYYYYMM(ts)
ORDER BY (purpose, ts)` + d.TTL("ts"),
		}
	}},
	{4, "label_runs", func(d Dialect) []string {
		// One row per labeling run of a rollout, valid or failed: the record
		// that a (rollout, dictionary version, run) was labeled, so that a
		// non-deterministic labeler never labels it again, and the audit of
		// runs that produced no labels.
		return []string{`CREATE TABLE IF NOT EXISTS label_runs (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dictionary_version UInt32,
	rollout_id String,
	run UInt16,
	labeler ` + d.LC() + `,
	status ` + d.LC() + `,
	reason String,
	at DateTime,
	ingest_ns UInt64
) ENGINE = ReplacingMergeTree(ingest_ns)
PARTITION BY toYYYYMM(at)
ORDER BY (environment, agent_version, dictionary_version, rollout_id, run)` + d.TTL("at"),
		}
	}},
	{5, "environments", func(d Dialect) []string {
		// One row per saved version of a synthesized environment's record
		// (synthesizer.Environment): the newest version wins, so saving a
		// status again is idempotent. No TTL: environments are the output.
		return []string{`CREATE TABLE IF NOT EXISTS environments (
	environment_id String,
	trigger_id String,
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dictionary_version UInt32,
	capability ` + d.LC() + `,
	family ` + d.LC() + `,
	status ` + d.LC() + `,
	reason String,
	attempts UInt8,
	program String` + d.Big() + `,
	program_hash String,
	tools String,
	mean_reward Float64,
	success_rate Float64,
	simulated UInt8,
	pass_at_k String,
	request String` + d.Big() + `,
	attempts_json String` + d.Big() + `,
	calibration String,
	details String,
	created_at DateTime,
	updated_at DateTime,
	version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY environment_id`,
		}
	}},
	{6, "env_episodes", func(d Dialect) []string {
		// One row per episode played through the environment server
		// (sampled): the reward curve of a training run. A retried insert
		// of the same episode replaces itself (same sorting key).
		return []string{`CREATE TABLE IF NOT EXISTS env_episodes (
	environment_id ` + d.LC() + `,
	program_hash String,
	session_id String,
	episode_id String,
	transport ` + d.LC() + `,
	seed Int64,
	hinted UInt8,
	steps UInt32,
	done_reason ` + d.LC() + `,
	reward Float64,
	components String,
	started_at DateTime,
	ended_at DateTime,
	duration_ms UInt32
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(ended_at)
ORDER BY (environment_id, ended_at, session_id, episode_id)` + d.TTL("ended_at"),
		}
	}},
	{7, "training_jobs", func(d Dialect) []string {
		// Training jobs (TRACE step 3): one row per saved version of a
		// job's status (the newest version wins), and the event history a
		// trainer reported, one row per event (a redelivered event has the
		// same key and replaces itself). No TTL: jobs are the record of
		// what trained each adapter.
		return []string{`CREATE TABLE IF NOT EXISTS training_jobs (
	job_id String,
	environment_id String,
	plan_revision UInt32,
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	capability ` + d.LC() + `,
	base_model String,
	backend ` + d.LC() + `,
	status ` + d.LC() + `,
	reason String,
	adapter_name String,
	iteration UInt32,
	iterations UInt32,
	mean_reward Float64,
	simulated UInt8,
	planner String,
	spec String` + d.Big() + `,
	dispatched_at DateTime,
	last_event_at DateTime,
	deadline_at DateTime,
	created_at DateTime,
	updated_at DateTime,
	version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY job_id`,
			`CREATE TABLE IF NOT EXISTS training_job_events (
	job_id String,
	event_key String,
	type ` + d.LC() + `,
	at DateTime,
	at_ns Int64,
	iteration Int32,
	mean_reward Float64,
	reward_std Float64,
	kl Float64,
	has_kl UInt8,
	payload String,
	received_at DateTime
) ENGINE = ReplacingMergeTree()
ORDER BY (job_id, event_key)`,
		}
	}},
	{8, "adapters", func(d Dialect) []string {
		// The adapter registry: one row per saved version of an adapter
		// (served name), status candidate | active | retired | rolled_back.
		return []string{`CREATE TABLE IF NOT EXISTS adapters (
	adapter_name String,
	job_id String,
	environment_id String,
	capability ` + d.LC() + `,
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	base_model String,
	uri String,
	eval String,
	eval_mean_reward Float64,
	eval_success_rate Float64,
	status ` + d.LC() + `,
	simulated UInt8,
	metadata String,
	created_at DateTime,
	updated_at DateTime,
	version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY adapter_name`,
		}
	}},
	{9, "rollouts_routing", func(d Dialect) []string {
		// Routed conversations (TRACE step 4): the rollout's conversation id,
		// and the routing decision and adapter that served it (rollout v1's
		// optional conversation_id and routing fields; empty when absent).
		return []string{
			d.AddColumn("rollouts", "conversation_id", "String DEFAULT ''"),
			d.AddColumn("rollouts", "route_decision_id", "String DEFAULT ''"),
			d.AddColumn("rollouts", "adapter", d.LC()+" DEFAULT ''"),
		}
	}},
	{10, "route_decisions", func(d Dialect) []string {
		// The router's decisions (TRACE step 4): one row per routed request
		// (POST /v1/route or the proxy's /v1/chat/completions); a cached
		// decision repeats its decision_id with cached = 1. Labels and
		// probabilities are parallel arrays (18.16 has no Map); adapter ''
		// is the base model. outcome is the proxied request's end (ok,
		// upstream_error, stream_error, unreachable, canceled) or 'routed'
		// for /v1/route. A batch retried after an ambiguous failure (sent,
		// its answer lost) lands twice: the copies are identical, merges
		// drop them, and reads take one row per request_id.
		return []string{`CREATE TABLE IF NOT EXISTS route_decisions (
	ts DateTime,
	at_ns Int64,
	request_id String,
	decision_id String,
	conversation_id String,
	conversation_source ` + d.LC() + `,
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	endpoint ` + d.LC() + `,
	cached UInt8,
	adapter ` + d.LC() + `,
	capability ` + d.LC() + `,
	model String,
	label String,
	labels Array(String),
	label_capabilities Array(String),
	label_adapters Array(String),
	probabilities Array(Float64),
	weight_adapters Array(String),
	weights Array(Float64),
	reason ` + d.LC() + `,
	error String,
	classifier_model String,
	classify_ms UInt32,
	overhead_us UInt32,
	upstream_status UInt16,
	outcome ` + d.LC() + `,
	stream UInt8
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(ts)
ORDER BY (environment, ts, request_id)` + d.TTL("ts"),
		}
	}},
	{12, "labels_by_time", func(d Dialect) []string {
		// capability_labels again, sorted by time within each cohort: the
		// evaluator's windows and the raw part of the dashboard's reads
		// (open and late hours) select a time range of a cohort, which
		// capability_labels' sort key (…, capability, run, rollout_id)
		// cannot prune. Kept by a materialized view; the existing labels
		// are copied once (a row copied twice, by two replicas migrating at
		// once, is collapsed: same sorting key and ingest_ns).
		cols := "environment, agent_version, dictionary_version, capability, run, rollout_id, label, success, ts, ingest_ns"
		return []string{`CREATE TABLE IF NOT EXISTS labels_by_time (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dictionary_version UInt32,
	capability ` + d.LC() + `,
	run UInt16,
	rollout_id String,
	label ` + labelEnum + `,
	success UInt8,
	ts DateTime,
	ingest_ns UInt64
) ENGINE = ReplacingMergeTree(ingest_ns)
PARTITION BY toYYYYMM(ts)
ORDER BY (environment, agent_version, dictionary_version, ts, capability, run, rollout_id)` + d.TTL("ts"),
			`CREATE MATERIALIZED VIEW IF NOT EXISTS labels_by_time_mv TO labels_by_time AS
SELECT ` + cols + ` FROM capability_labels`,
			`INSERT INTO labels_by_time (` + cols + `) SELECT ` + cols + ` FROM capability_labels`,
		}
	}},
	{13, "rollups", func(d Dialect) []string {
		// The exact hourly rollup (docs/ARCHITECTURE.md, "Analytics at
		// scale"). rollup_changes: per (kind, environment, agent version,
		// hour) the newest ingest_ns written (kind 1 = labels, 2 =
		// rollouts), kept at insert time. rollup_hours: the ingest_ns each
		// rolled-up hour was computed through (version) and the computation
		// that did it (run_ns, the version of its rollup rows); an hour whose
		// newest change is not a recorded version is stale and read raw. label_hourly, labeled_hourly,
		// rollout_hourly: the counts of closed hours, computed from the raw
		// rows with one label per identity (the newest version wins).
		return []string{`CREATE TABLE IF NOT EXISTS rollup_changes (
	kind UInt8,
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	hour DateTime,
	last_ingest AggregateFunction(max, UInt64)
) ENGINE = AggregatingMergeTree()
ORDER BY (kind, environment, agent_version, hour)`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_changes_labels_mv TO rollup_changes AS
SELECT toUInt8(1) AS kind, environment, agent_version, toStartOfHour(ts) AS hour, maxState(ingest_ns) AS last_ingest
FROM capability_labels GROUP BY environment, agent_version, hour`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_changes_rollouts_mv TO rollup_changes AS
SELECT toUInt8(2) AS kind, environment, agent_version, toStartOfHour(end_time) AS hour, maxState(ingest_ns) AS last_ingest
FROM rollouts GROUP BY environment, agent_version, hour`,
			`INSERT INTO rollup_changes (kind, environment, agent_version, hour, last_ingest)
SELECT toUInt8(1), environment, agent_version, toStartOfHour(ts) AS hour, maxState(ingest_ns)
FROM capability_labels GROUP BY environment, agent_version, hour`,
			`INSERT INTO rollup_changes (kind, environment, agent_version, hour, last_ingest)
SELECT toUInt8(2), environment, agent_version, toStartOfHour(end_time) AS hour, maxState(ingest_ns)
FROM rollouts GROUP BY environment, agent_version, hour`,
			`CREATE TABLE IF NOT EXISTS rollup_hours (
	kind UInt8,
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	hour DateTime,
	version UInt64,
	run_ns UInt64,
	rolled_at DateTime
) ENGINE = ReplacingMergeTree(version)
ORDER BY (kind, environment, agent_version, hour)`,
			`CREATE TABLE IF NOT EXISTS label_hourly (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dicts UInt8,
	dictionary_version UInt32,
	capability ` + d.LC() + `,
	run UInt16,
	hour DateTime,
	lf UInt64, pf UInt64, nf UInt64,
	lp UInt64, pp UInt64, np UInt64,
	version UInt64
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(hour)
ORDER BY (environment, agent_version, dicts, dictionary_version, hour, capability, run)`,
			`CREATE TABLE IF NOT EXISTS labeled_hourly (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dictionary_version UInt32,
	hour DateTime,
	rollouts UInt64,
	version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY (environment, agent_version, dictionary_version, hour)`,
			`CREATE TABLE IF NOT EXISTS rollout_hourly (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	hour DateTime,
	rollouts UInt64,
	successes UInt64,
	version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY (environment, agent_version, hour)`,
		}
	}},
	{14, "label_capabilities", func(d Dialect) []string {
		// The small table of labeled cohorts and their capabilities: one
		// row per (cohort, capability) once merged, with the highest run and
		// the newest label time (a cohort's watermark). The cohort lists and
		// the evaluator's watermarks read it instead of scanning labels.
		return []string{`CREATE TABLE IF NOT EXISTS label_capabilities (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dictionary_version UInt32,
	capability ` + d.LC() + `,
	max_run AggregateFunction(max, UInt16),
	last_ts AggregateFunction(max, DateTime)
) ENGINE = AggregatingMergeTree()
ORDER BY (environment, agent_version, dictionary_version, capability)`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS label_capabilities_mv TO label_capabilities AS
SELECT environment, agent_version, dictionary_version, capability, maxState(run) AS max_run, maxState(ts) AS last_ts
FROM capability_labels GROUP BY environment, agent_version, dictionary_version, capability`,
			`INSERT INTO label_capabilities (environment, agent_version, dictionary_version, capability, max_run, last_ts)
SELECT environment, agent_version, dictionary_version, capability, maxState(run), maxState(ts)
FROM capability_labels GROUP BY environment, agent_version, dictionary_version, capability`,
		}
	}},
	{15, "rollup_watermark", func(d Dialect) []string {
		// The read side of the rollup without per-statement set
		// comparisons (docs/ARCHITECTURE.md, "Analytics at scale").
		// rollup_log: the changes of rollup_changes sorted by ingest_ns, so
		// the hours changed after the watermark are read from its tail.
		// rollup_watermark: each rollup run that left no settled hour
		// behind. The rollup rows are now versioned by the change they were
		// computed through (they were versioned by the computation's clock):
		// the old rows and their records are dropped and recomputed by the
		// rollup job, and until it catches up every hour is read raw.
		return []string{`CREATE TABLE IF NOT EXISTS rollup_log (
	kind UInt8,
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	hour DateTime,
	last_ingest UInt64
) ENGINE = MergeTree()
ORDER BY (kind, last_ingest)`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_log_labels_mv TO rollup_log AS
SELECT toUInt8(1) AS kind, environment, agent_version, toStartOfHour(ts) AS hour, max(ingest_ns) AS last_ingest
FROM capability_labels GROUP BY environment, agent_version, hour`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_log_rollouts_mv TO rollup_log AS
SELECT toUInt8(2) AS kind, environment, agent_version, toStartOfHour(end_time) AS hour, max(ingest_ns) AS last_ingest
FROM rollouts GROUP BY environment, agent_version, hour`,
			`INSERT INTO rollup_log (kind, environment, agent_version, hour, last_ingest)
SELECT kind, environment, agent_version, hour, maxMerge(last_ingest) FROM rollup_changes
GROUP BY kind, environment, agent_version, hour`,
			`CREATE TABLE IF NOT EXISTS rollup_watermark (
	slot UInt8,
	through UInt64,
	closed_before DateTime,
	at UInt64
) ENGINE = ReplacingMergeTree(at)
ORDER BY slot`,
			// The watermark last: a replica migrating at the same time
			// as another one's rollup run leaves no watermark over
			// truncated rows.
			`TRUNCATE TABLE IF EXISTS label_hourly`,
			`TRUNCATE TABLE IF EXISTS labeled_hourly`,
			`TRUNCATE TABLE IF EXISTS rollout_hourly`,
			`TRUNCATE TABLE IF EXISTS rollup_hours`,
			`TRUNCATE TABLE IF EXISTS rollup_watermark`,
		}
	}},
	{16, "cohort_evaluations", func(d Dialect) []string {
		// The evaluator's latest evaluation of each cohort (sink/evaluations.go):
		// what the dashboard and the report show as its decision. One row per
		// cohort once merged.
		return []string{`CREATE TABLE IF NOT EXISTS cohort_evaluations (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dictionary_version UInt32,
	evaluated_ns UInt64,
	payload String
) ENGINE = ReplacingMergeTree(evaluated_ns)
ORDER BY (environment, agent_version, dictionary_version)`}
	}},
	{17, "window_rollup", func(d Dialect) []string {
		// The decision windows' rollup (sink/windowrollup.go): per closed
		// hour, cohort, capability, run and runs (the consecutive runs
		// 0, 1, … a rollout was labeled in), the counts and the first
		// LACKING-on-failure ids; per hour, cohort and runs, the labeled
		// rollouts. Every hour is rolled up again to fill them: the
		// watermark and the record of rolled-up hours are dropped (last, as
		// migration 15 does), so reads take every hour raw until the next
		// rollup run has caught up.
		return []string{`CREATE TABLE IF NOT EXISTS window_hourly (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dictionary_version UInt32,
	capability ` + d.LC() + `,
	run UInt16,
	hour DateTime,
	runs UInt16,
	lf UInt64, pf UInt64, nf UInt64,
	lp UInt64, pp UInt64, np UInt64,
	lacking_first Array(String),
	version UInt64
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(hour)
ORDER BY (environment, agent_version, dictionary_version, hour, capability, run, runs)`,
			`CREATE TABLE IF NOT EXISTS window_rollouts_hourly (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dictionary_version UInt32,
	hour DateTime,
	runs UInt16,
	rollouts UInt64,
	failures UInt64,
	first_ts DateTime,
	last_ts DateTime,
	version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY (environment, agent_version, dictionary_version, hour, runs)`,
			`TRUNCATE TABLE IF EXISTS rollup_hours`,
			`TRUNCATE TABLE IF EXISTS rollup_watermark`,
		}
	}},
	{18, "route_decisions_usage", func(d Dialect) []string {
		// The upstream's token usage of a proxied completion (its "usage"
		// object); NULL when it reported none, and for rows written before.
		return []string{
			d.AddColumn("route_decisions", "prompt_tokens", "Nullable(UInt32)"),
			d.AddColumn("route_decisions", "completion_tokens", "Nullable(UInt32)"),
		}
	}},
	{19, "label_sources", func(d Dialect) []string {
		// The sources of each cohort's labels (rules, llm, external), one
		// row per (cohort, source) once merged: with analyzer.k and
		// analyzer.n unset, a cohort is decided by the K of N of the
		// labeling that produced its labels (analyzer.EvalConfig.KOfN), so
		// the evaluator, the report and the dashboard read them with its
		// watermark instead of scanning its labels. Kept by a materialized
		// view; the existing labels are read once (a row written twice, by
		// the view and the copy, collapses).
		return []string{`CREATE TABLE IF NOT EXISTS label_sources (
	environment ` + d.LC() + `,
	agent_version ` + d.LC() + `,
	dictionary_version UInt32,
	source ` + d.LC() + `
) ENGINE = ReplacingMergeTree()
ORDER BY (environment, agent_version, dictionary_version, source)`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS label_sources_mv TO label_sources AS
SELECT DISTINCT environment, agent_version, dictionary_version, source FROM capability_labels`,
			`INSERT INTO label_sources (environment, agent_version, dictionary_version, source)
SELECT DISTINCT environment, agent_version, dictionary_version, source FROM capability_labels`,
		}
	}},
	{20, "rollup_layout", func(d Dialect) []string {
		// The rollup layout of each record (sink/rollup.go, rollupLayout):
		// a build that fills fewer rollup tables (one from before
		// migration 17, still running during a rolling upgrade) records
		// hours and watermarks that this build must not take as covering
		// the decision windows. Its records, and every record written
		// before, have layout 0: every hour is rolled up again once, read
		// raw until then.
		return []string{d.AddColumn("rollup_hours", "layout", "UInt8")}
	}},
	{21, "route_decisions_client_request_id", func(d Dialect) []string {
		// The caller's X-Request-Id of a routed request, to find its row
		// from the caller's or a gateway's logs; '' when it sent none (or
		// one that is not a plain token) and for rows written before.
		// request_id stays the router's own, unique per request: reads
		// take one row per request_id, and callers may reuse their ids.
		return []string{d.AddColumn("route_decisions", "client_request_id", "String DEFAULT ''")}
	}},
}

// ErrSchemaNewer is Migrate's refusal of a database that a newer trace
// migrated: its schema_migrations records a version this build does not know.
var ErrSchemaNewer = errors.New("the database's schema is newer than this trace")

// Migrate applies every migration not yet recorded in schema_migrations, in
// order, then brings the retention tables' TTL to clickhouse.retention_days
// (reconcileRetention). It is idempotent and safe to run from several
// processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
	version UInt32, name String, applied_at DateTime
) ENGINE = ReplacingMergeTree() ORDER BY version`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	applied, err := s.AppliedMigrations(ctx)
	if err != nil {
		return err
	}
	if err := s.checkNotNewer(applied); err != nil {
		return err
	}
	if err := s.checkRetention(); err != nil {
		return err
	}
	d := Dialect{Features: s.features, RetentionDays: s.cfg.RetentionDays}
	for _, m := range Migrations {
		if applied[m.Version] {
			continue
		}
		for _, stmt := range m.SQL(d) {
			if err := s.conn.Exec(ctx, stmt); err != nil && !columnExists(stmt, err) {
				return fmt.Errorf("migration %d (%s): %w\n%s", m.Version, m.Name, err, firstLine(stmt))
			}
		}
		b, err := s.conn.PrepareBatch(ctx, "INSERT INTO schema_migrations (version, name, applied_at)")
		if err != nil {
			return fmt.Errorf("migration %d: record: %w", m.Version, err)
		}
		if err := b.Append(uint32(m.Version), m.Name, time.Now()); err != nil {
			return err
		}
		if err := b.Send(); err != nil {
			return fmt.Errorf("migration %d: record: %w", m.Version, err)
		}
		s.log.Info("clickhouse migration applied", "version", m.Version, "name", m.Name, "database", s.cfg.Database)
	}
	return s.reconcileRetention(ctx)
}

// checkNotNewer refuses a schema with a migration newer than this build's
// last: a downgrade, or an old replica restarted after a new one migrated.
// Such a binary would read and write tables whose meaning changed under it
// (migrations 15 and 17 redefine the rollup) without noticing.
func (s *Store) checkNotNewer(applied map[int]bool) error {
	latest := Migrations[len(Migrations)-1].Version
	newest := 0
	for v := range applied {
		newest = max(newest, v)
	}
	if newest > latest {
		return fmt.Errorf("migrate: %w: database %s has migration %d applied, this trace knows migrations up to %d; "+
			"run a trace at least as new as the one that migrated it (downgrades are not supported)",
			ErrSchemaNewer, s.cfg.Database, newest, latest)
	}
	return nil
}

// columnExists reports an ADD COLUMN whose column is already there (a
// migration that ran before its record was written).
func columnExists(stmt string, err error) bool {
	return strings.Contains(stmt, " ADD COLUMN ") && ErrorCode(err) == 44
}

// AppliedMigrations returns the recorded migration versions.
func (s *Store) AppliedMigrations(ctx context.Context) (map[int]bool, error) {
	rows, err := s.conn.Query(ctx, "SELECT DISTINCT version FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("migrate: read schema_migrations: %w", err)
	}
	defer rows.Close()
	out := map[int]bool{}
	for rows.Next() {
		var v uint32
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out[int(v)] = true
	}
	return out, rows.Err()
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
