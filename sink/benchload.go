package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
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

// The simulated routing of the bulk load, for the guard's reads: every
// rollout has a conversation id; the router decided each conversation of
// the last BenchRouterDays of the history (3 decisions each: one per turn
// of an agent calling it); the adapter BenchAdapter, registered active
// BenchAdapterDays before the history's end, served half of the planted
// cohort's (BenchEnvironments[0], agent version 1.4.0) conversations
// since. Rollouts do not name the adapter (rollouts.adapter is empty):
// they are routed only through the decisions of their conversation, the
// guard's costlier join.
const (
	BenchAdapter     = "sim-precondition-verification"
	BenchRouterDays  = 30
	BenchAdapterDays = 7
	benchTurns       = 3
)

// BenchActivation is when the bulk load's adapter was activated, and
// since when the router decided, for a history [from, from+span).
func BenchActivation(from time.Time, span time.Duration) (activated, routerFrom time.Time) {
	end := from.Add(span)
	activated = end.Add(-BenchAdapterDays * 24 * time.Hour)
	routerFrom = end.Add(-BenchRouterDays * 24 * time.Hour)
	if activated.Before(from) {
		activated = from.Add(span / 2)
	}
	if routerFrom.Before(from) {
		routerFrom = from
	}
	return activated, routerFrom
}

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

// The generated columns the load's statements share, so that a rollout's
// labels and decisions agree with the rollout: its number n and end time e
// (benchRange; binds: first, n, from (Unix s), span (s), total), its
// environment, agent version, outcome and conversation.
var (
	benchRange        = `SELECT number + ? AS n, toUInt32(? + intDiv(n * ?, ?)) AS e FROM numbers(?)`
	benchEnv          = sqlArray(BenchEnvironments) + `[n % 3 + 1]`
	benchAgentVersion = sqlArray(BenchAgentVersions) + `[intDiv(n, 3) % 2 + 1]`
	benchOK           = `toUInt8(cityHash64(n, 'ok') % 100 < 55)`
	benchConversation = `concat('sim-conv-', toString(n))`
	// benchPlantedVersion is the planted deficit's agent version, whose
	// conversations BenchAdapter serves in BenchEnvironments[0].
	benchPlantedVersion = BenchAgentVersions[1]
)

// benchRolloutsSQL generates rollouts first..first+n-1 of total, their end
// times spread evenly over [from, from+span).
//
// Binds: ingest base (ns), then benchRange's.
var benchRolloutsSQL = `INSERT INTO rollouts (rollout_id, environment, agent_name, agent_version, task_id, success, reward,
	start_time, end_time, n_messages, n_tool_calls, n_tool_errors, messages, tools, grader, metadata,
	kafka_topic, kafka_partition, kafka_offset, ingested_at, ingest_ns, conversation_id)
SELECT concat('bench-', toString(n)), ` + benchEnv + `, 'sim-agent', ` + benchAgentVersion + `,
	concat('task-', toString(n % 500)), ` + benchOK + `, toFloat64(` + benchOK + `),
	toDateTime(e - 60), toDateTime(e), toUInt32(6), toUInt32(2), toUInt32(0), '[]', '', '', '{"simulated":true}',
	'bench', toInt32(0), toInt64(n), now(), toUInt64(? + n), ` + benchConversation + `
FROM (` + benchRange + `)`

// benchDecisionsSQL generates the router's decisions of those rollouts'
// conversations (BenchRouterDays, BenchAdapter).
//
// Binds: activation, router start (Unix s), then benchRange's.
var benchDecisionsSQL = `INSERT INTO route_decisions (ts, at_ns, request_id, decision_id, conversation_id, conversation_source,
	environment, agent_version, endpoint, adapter, capability, model, reason, outcome, upstream_status)
SELECT toDateTime(e - 60 + turn * 20), toInt64(e - 60 + turn * 20) * 1000000000, concat('sim-req-', toString(n), '-', toString(turn)),
	concat('sim-dec-', toString(n), '-', toString(turn)), ` + benchConversation + `, 'metadata', env, av, 'proxy',
	if(routed, '` + BenchAdapter + `', ''), if(routed, '` + BenchPlanted + `', ''), if(routed, '` + BenchAdapter + `', 'base'),
	'simulated', 'ok', toUInt16(200)
FROM (
	SELECT n, e, ` + benchEnv + ` AS env, ` + benchAgentVersion + ` AS av,
		env = '` + BenchEnvironments[0] + `' AND av = '` + benchPlantedVersion + `' AND e >= act AND cityHash64(n, 'route') % 2 = 0 AS routed
	FROM (SELECT toUInt32(?) AS act, toUInt32(?) AS since, n, e FROM (` + benchRange + `))
	WHERE e >= since)
ARRAY JOIN range(` + fmt.Sprint(benchTurns) + `) AS turn`

// benchLabelsSQL generates the labels of those rollouts: one run, every
// capability; failures are LACKING 15 % of the time (BenchPlanted for
// agent version 1.4.0: 65 %), successes 8 %, NA 10 %.
//
// Binds: as benchRolloutsSQL.
var benchLabelsSQL = `INSERT INTO capability_labels (environment, agent_version, dictionary_version, capability, run, rollout_id,
	label, success, reward, source, ts, ingest_ns)
SELECT env, av, toUInt32(1), capability, toUInt16(0), concat('bench-', toString(n)),
	CAST(multiIf(h < 10, 'NA', h < 10 + if(ok = 1, 8, if(capability = '` + BenchPlanted + `' AND av = '` + benchPlantedVersion + `', 65, 15)), 'LACKING', 'PRESENT') AS ` + labelEnum + `),
	ok, toFloat64(ok), 'simulated', toDateTime(e), toUInt64(? + n)
FROM (
	SELECT n, e, ` + benchEnv + ` AS env, ` + benchAgentVersion + ` AS av,
		` + benchOK + ` AS ok, capability, cityHash64(n, capability) % 100 AS h
	FROM (` + benchRange + `)
	ARRAY JOIN ` + sqlArray(BenchCapabilities) + ` AS capability)`

// BenchLoad writes total simulated rollouts with end times spread over
// [from, from+span), their labels and the router's decisions of their
// conversations, in chunks of chunk rollouts (0 = 500,000), calling
// progress after each chunk, and registers BenchAdapter, active since
// BenchActivation.
func (s *Store) BenchLoad(ctx context.Context, total int, from time.Time, span time.Duration, chunk int, progress func(done int)) error {
	if chunk <= 0 {
		chunk = 500_000
	}
	base := uint64(time.Now().UnixNano())
	act, since := BenchActivation(from, span)
	for first := 0; first < total; first += chunk {
		n := min(chunk, total-first)
		args := []any{base, uint64(first), unixSec(from), uint64(span.Seconds()), uint64(total), uint64(n)}
		if err := s.conn.Exec(ctx, benchRolloutsSQL, args...); err != nil {
			return fmt.Errorf("bench load: rollouts %d..%d: %w", first, first+n, err)
		}
		if err := s.conn.Exec(ctx, benchLabelsSQL, args...); err != nil {
			return fmt.Errorf("bench load: labels %d..%d: %w", first, first+n, err)
		}
		if err := s.conn.Exec(ctx, benchDecisionsSQL, append([]any{unixSec(act), unixSec(since)}, args[1:]...)...); err != nil {
			return fmt.Errorf("bench load: routing decisions %d..%d: %w", first, first+n, err)
		}
		s.wm.invalidate()
		if progress != nil {
			progress(first + n)
		}
	}
	meta, _ := json.Marshal(map[string]any{"activated_at": act.UTC(), "simulated": "bench load: no model was trained"})
	return s.SaveAdapter(ctx, AdapterRow{Name: BenchAdapter, JobID: "sim-job", EnvironmentID: "sim-env", Capability: BenchPlanted,
		Environment: BenchEnvironments[0], AgentVersion: benchPlantedVersion, BaseModel: "sim-base", URI: "sim://" + BenchAdapter,
		Status: "active", Simulated: true, Metadata: string(meta), CreatedAt: act, UpdatedAt: act, Version: 1})
}

// LoopLabelsBefore is LoopLabels through the statement it replaced, whose
// route_decisions subquery aggregated every environment's decisions and
// filtered the environment afterwards: `trace bench query`'s old way for
// the guard's reads.
func (s *Store) LoopLabelsBefore(ctx context.Context, spec LoopSample) ([]RolloutLabels, error) {
	q, args := loopLabelsSQL(spec)
	const was = `SELECT conversation_id FROM (SELECT environment, conversation_id,
	argMax(decision_id, at_ns) AS decision_id, argMax(adapter, at_ns) AS adapter
	FROM route_decisions WHERE conversation_id != ''
	GROUP BY environment, conversation_id) WHERE environment = ? AND`
	old := strings.Replace(q, "SELECT conversation_id FROM ("+RouteByConversationSQL+") WHERE", was, 1)
	if old == q {
		return nil, fmt.Errorf("loop labels before: the statement no longer has the routing subquery")
	}
	return s.loopLabels(ctx, spec.Capability, old, args)
}
