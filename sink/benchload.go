package sink

import (
	"context"
	"fmt"
	"time"
)

// The bulk load of `trace bench query`: simulated rollouts and their labels
// generated inside ClickHouse (INSERT … SELECT from numbers()), so that 10M
// rollouts load in minutes rather than through the labelers. Everything it
// writes is simulated: rollout ids start with "bench-", the label source is
// "simulated", the messages are empty.

// BenchEnvironments, BenchAgentVersions and BenchCapabilities are the
// simulated fleet of the bulk load; BenchPlanted is the capability planted
// as a deficit of agent version 1.4.0 (LACKING on most of its failures).
var (
	BenchEnvironments  = []string{"sim-airline", "sim-retail", "sim-telecom"}
	BenchAgentVersions = []string{"1.3.0", "1.4.0"}
	BenchCapabilities  = []string{"precondition_verification", "multi_step_transaction_completion", "policy_adherence", "tool_argument_grounding", "user_confirmation"}
)

const BenchPlanted = "precondition_verification"

func sqlArray(xs []string) string {
	out := "["
	for i, x := range xs {
		if i > 0 {
			out += ", "
		}
		out += "'" + x + "'"
	}
	return out + "]"
}

// benchRolloutsSQL generates rollouts first..first+n-1 of total, their end
// times spread evenly over [from, from+span).
//
// Binds: first, n, from (Unix s), span (s), total, ingest base (ns).
var benchRolloutsSQL = `INSERT INTO rollouts (rollout_id, environment, agent_name, agent_version, task_id, success, reward,
	start_time, end_time, n_messages, n_tool_calls, n_tool_errors, messages, tools, grader, metadata,
	kafka_topic, kafka_partition, kafka_offset, ingested_at, ingest_ns)
SELECT concat('bench-', toString(n)), ` + sqlArray(BenchEnvironments) + `[n % 3 + 1], 'sim-agent', ` + sqlArray(BenchAgentVersions) + `[intDiv(n, 3) % 2 + 1],
	concat('task-', toString(n % 500)), toUInt8(cityHash64(n, 'ok') % 100 < 55), toFloat64(cityHash64(n, 'ok') % 100 < 55),
	toDateTime(e - 60), toDateTime(e), toUInt32(6), toUInt32(2), toUInt32(0), '[]', '', '', '{"simulated":true}',
	'bench', toInt32(0), toInt64(n), now(), toUInt64(? + n)
FROM (SELECT number + ? AS n, toUInt32(? + intDiv(n * ?, ?)) AS e FROM numbers(?))`

// benchLabelsSQL generates the labels of those rollouts: one run, every
// capability; failures are LACKING 15 % of the time (BenchPlanted for
// agent version 1.4.0: 65 %), successes 8 %, NA 10 %.
//
// Binds: as benchRolloutsSQL.
var benchLabelsSQL = `INSERT INTO capability_labels (environment, agent_version, dictionary_version, capability, run, rollout_id,
	label, success, reward, source, ts, ingest_ns)
SELECT env, av, toUInt32(1), capability, toUInt16(0), concat('bench-', toString(n)),
	CAST(multiIf(h < 10, 'NA', h < 10 + if(ok = 1, 8, if(capability = '` + BenchPlanted + `' AND av = '1.4.0', 65, 15)), 'LACKING', 'PRESENT') AS ` + labelEnum + `),
	ok, toFloat64(ok), 'simulated', toDateTime(e), toUInt64(? + n)
FROM (
	SELECT n, e, ` + sqlArray(BenchEnvironments) + `[n % 3 + 1] AS env, ` + sqlArray(BenchAgentVersions) + `[intDiv(n, 3) % 2 + 1] AS av,
		toUInt8(cityHash64(n, 'ok') % 100 < 55) AS ok, capability, cityHash64(n, capability) % 100 AS h
	FROM (SELECT number + ? AS n, toUInt32(? + intDiv(n * ?, ?)) AS e FROM numbers(?))
	ARRAY JOIN ` + sqlArray(BenchCapabilities) + ` AS capability)`

// BenchLoad writes total simulated rollouts with end times spread over
// [from, from+span) and their labels, in chunks of chunk rollouts (0 =
// 500,000), calling progress after each chunk.
func (s *Store) BenchLoad(ctx context.Context, total int, from time.Time, span time.Duration, chunk int, progress func(done int)) error {
	if chunk <= 0 {
		chunk = 500_000
	}
	base := uint64(time.Now().UnixNano())
	for first := 0; first < total; first += chunk {
		n := min(chunk, total-first)
		args := []any{base, uint64(first), unixSec(from), uint64(span.Seconds()), uint64(total), uint64(n)}
		if err := s.conn.Exec(ctx, benchRolloutsSQL, args...); err != nil {
			return fmt.Errorf("bench load: rollouts %d..%d: %w", first, first+n, err)
		}
		if err := s.conn.Exec(ctx, benchLabelsSQL, args...); err != nil {
			return fmt.Errorf("bench load: labels %d..%d: %w", first, first+n, err)
		}
		s.wm.invalidate()
		if progress != nil {
			progress(first + n)
		}
	}
	return nil
}
