// Package sink is trace's ClickHouse storage: versioned idempotent
// migrations, batched inserts with explicit column lists, the classification
// of ClickHouse errors into retryable and fatal, and the window queries the
// analyzer decides on.
//
// Exactness under at-least-once delivery rests on two table designs:
//
//   - rollouts and capability_labels are ReplacingMergeTree tables keyed by
//     the message identity (rollout_id; and environment, agent_version,
//     dictionary_version, capability, run, rollout_id for labels). A
//     redelivered message writes a row with the same key that merges away.
//   - every statistic reads exactly one row per identity at query time
//     (argMax over ingest_ns, or uniqExact of rollout_id), so a duplicate that
//     has not merged yet is never counted twice.
//
// The SQL runs on ClickHouse 18.16 (Debian, CI) and on current ClickHouse;
// LowCardinality, ZSTD codecs and TTL retention are switched on only when the
// server's version has them (see Features).
package sink
