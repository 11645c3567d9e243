package sink

import (
	"context"
	"fmt"
	"time"
)

// The closed loop's reads (package verify): the per-rollout labels of one
// capability on the rollouts an adapter served and on its cohort before it
// was activated, and the routing share per adapter over time. They live
// here, apart from the window queries the analyzer uses, and read tables
// that exist already (rollouts' routing columns, migration 9;
// route_decisions, migration 10) — no migration of their own.

// LoopSample selects the rollouts one side of a before/after comparison is
// computed on, and the capability whose labels are read for them.
//
//   - Adapter set: the "after" side, the rollouts of the cohort
//     (Environment, AgentVersion) routed to that adapter (rollouts.adapter
//     = Adapter). Other agent versions the router sent to the adapter are
//     left out: both sides are the same cohort.
//   - Adapter empty: the "before" side, the base model's rollouts
//     (rollouts.adapter is empty) of the cohort (Environment, AgentVersion) that
//     ended before Until.
//
// Either side keeps the Limit most recent rollouts (by end time).
type LoopSample struct {
	Environment       string
	AgentVersion      string
	Adapter           string
	Until             time.Time // the before side only: end_time < Until
	DictionaryVersion uint32
	Capability        string
	Limit             int
	// Oldest takes the earliest Limit rollouts instead of the most recent
	// (the guard's looks start at activation).
	Oldest bool
	// From and To bound the routed side's end times (From ≤ end_time <
	// To, whole seconds; zero: unbounded): the guard's watch blocks.
	From, To time.Time
}

// RolloutLabels are one rollout's labels for one capability: Labels[run]
// is NA, PRESENT, LACKING, or "" when that run has not labeled it. EndTime
// is the rollout's end time (the labels' ts), which dates the sample.
type RolloutLabels struct {
	RolloutID string
	Success   bool
	EndTime   time.Time
	Labels    []string
}

// DefaultLoopLimit bounds a sample when LoopSample.Limit is 0.
const DefaultLoopLimit = 5000

// loopRolloutsSQL is the subquery selecting a sample's rollout ids.
//
// A rollout is routed to an adapter when it says so (rollout v1's routing
// field, rollouts.adapter) or, for producers that send only the
// conversation id, when the router's latest decision for its conversation
// chose the adapter (route_decisions, joined on RouteByConversationSQL).
// The before side keeps the base model's rollouts: no adapter, and no
// decision for another adapter found through the conversation.
func loopRolloutsSQL(s LoopSample) (string, []any) {
	limit := s.Limit
	if limit <= 0 {
		limit = DefaultLoopLimit
	}
	joined := `(adapter = '' AND route_decision_id = '' AND conversation_id != '' AND conversation_id IN (
			SELECT conversation_id FROM (` + RouteByConversationSQL + `) WHERE %s))`
	order := "DESC"
	if s.Oldest {
		order = "ASC"
	}
	if s.Adapter != "" {
		args := []any{s.Environment, s.AgentVersion}
		var span string
		if !s.From.IsZero() {
			span += " AND toUInt32(end_time) >= ?"
			args = append(args, unixSec(s.From))
		}
		if !s.To.IsZero() {
			span += " AND toUInt32(end_time) < ?"
			args = append(args, unixSec(s.To))
		}
		return fmt.Sprintf(`SELECT rollout_id FROM rollouts WHERE environment = ? AND agent_version = ?`+span+` AND (adapter = ? OR `+fmt.Sprintf(joined, "adapter = ?")+`)
		GROUP BY rollout_id ORDER BY max(end_time) %s, rollout_id LIMIT %d`, order, limit),
			append(args, s.Adapter, s.Environment, s.Adapter)
	}
	return fmt.Sprintf(`SELECT rollout_id FROM rollouts WHERE environment = ? AND agent_version = ? AND adapter = '' AND toUInt32(end_time) < ?
		AND NOT `+fmt.Sprintf(joined, "adapter != ''")+`
		GROUP BY rollout_id ORDER BY max(end_time) %s, rollout_id LIMIT %d`, order, limit),
		[]any{s.Environment, s.AgentVersion, unixSec(s.Until), s.Environment}
}

// loopLabelsSQL is LoopLabels' query: per (rollout, run) the most recently
// ingested label of the capability, the rollout's outcome and its end time.
func loopLabelsSQL(s LoopSample) (string, []any) {
	sub, subArgs := loopRolloutsSQL(s)
	q := `SELECT rollout_id, run, argMax(label, ingest_ns) AS l, argMax(success, ingest_ns) AS ok, max(ts) AS end_ts
	FROM capability_labels
	WHERE environment = ? AND dictionary_version = ? AND capability = ? AND rollout_id IN (` + sub + `)
	GROUP BY rollout_id, run
	ORDER BY rollout_id, run`
	return q, append([]any{s.Environment, s.DictionaryVersion, s.Capability}, subArgs...)
}

// LoopLabels returns the sample's labeled rollouts, ordered by id. A
// rollout of the sample that no run labeled yet is absent.
func (s *Store) LoopLabels(ctx context.Context, spec LoopSample) ([]RolloutLabels, error) {
	q, args := loopLabelsSQL(spec)
	return s.loopLabels(ctx, spec.Capability, q, args)
}

func (s *Store) loopLabels(ctx context.Context, capability, q string, args []any) ([]RolloutLabels, error) {
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("loop labels of %s: %w", capability, err)
	}
	defer rows.Close()
	var out []RolloutLabels
	for rows.Next() {
		var (
			id, label string
			run       uint16
			ok        uint8
			end       time.Time
		)
		if err := rows.Scan(&id, &run, &label, &ok, &end); err != nil {
			return nil, fmt.Errorf("loop labels: %w", err)
		}
		if len(out) == 0 || out[len(out)-1].RolloutID != id {
			out = append(out, RolloutLabels{RolloutID: id})
		}
		r := &out[len(out)-1]
		r.Success = ok == 1
		r.EndTime = end.UTC()
		for len(r.Labels) <= int(run) {
			r.Labels = append(r.Labels, "")
		}
		r.Labels[run] = label
	}
	return out, rows.Err()
}

// loopDictionariesSQL is LoopDictionaries' query.
const loopDictionariesSQL = `SELECT DISTINCT dictionary_version FROM capability_labels
	WHERE environment = ? AND agent_version = ? AND capability = ?
	ORDER BY dictionary_version DESC`

// LoopDictionaries are the dictionary versions whose labels of the
// capability exist for the cohort, the newest first; none when there are
// no labels.
func (s *Store) LoopDictionaries(ctx context.Context, environment, agentVersion, capability string) ([]uint32, error) {
	rows, err := s.conn.Query(ctx, loopDictionariesSQL, environment, agentVersion, capability)
	if err != nil {
		return nil, fmt.Errorf("loop dictionaries: %w", err)
	}
	defer rows.Close()
	var out []uint32
	for rows.Next() {
		var v uint32
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("loop dictionaries: %w", err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// ShareRow is the number of an environment's rollouts (RoutingShare) or
// routing decisions (DecisionShare) of one adapter ("" for the base model)
// in one time bucket.
type ShareRow struct {
	Bucket   time.Time
	Adapter  string
	Rollouts uint64
}

// routingShareSQL is RoutingShare's query: distinct rollouts per (bucket of
// end time, adapter) over the window back from the environment's newest
// rollout (event time, as the analyzer's windows; window 0: every
// rollout). The bucket is computed on the epoch seconds, which every
// ClickHouse version has (18.16 lacks toStartOfInterval).
func routingShareSQL(environment string, window, bucket time.Duration) (string, []any) {
	sec := max(int64(bucket/time.Second), 1)
	w := int64(window / time.Second)
	if window <= 0 {
		w = 1 << 32
	}
	q := fmt.Sprintf(`SELECT toDateTime(intDiv(toUInt32(end_time), %d) * %d) AS b, adapter, uniqExact(rollout_id)
	FROM rollouts WHERE environment = ?
		AND toInt64(toUInt32(end_time)) >= (SELECT toInt64(toUInt32(max(end_time))) FROM rollouts WHERE environment = ?) - %d
	GROUP BY b, adapter ORDER BY b, adapter`, sec, sec, w)
	return q, []any{environment, environment}
}

// RoutingShare counts the environment's rollouts per adapter and time
// bucket over the window back from its newest rollout, from
// rollouts.adapter (the routing the rollouts themselves report).
func (s *Store) RoutingShare(ctx context.Context, environment string, window, bucket time.Duration) ([]ShareRow, error) {
	q, args := routingShareSQL(environment, window, bucket)
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("routing share of %s: %w", environment, err)
	}
	defer rows.Close()
	var out []ShareRow
	for rows.Next() {
		var r ShareRow
		if err := rows.Scan(&r.Bucket, &r.Adapter, &r.Rollouts); err != nil {
			return nil, fmt.Errorf("routing share: %w", err)
		}
		r.Bucket = r.Bucket.UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}

// decisionShareSQL is DecisionShare's query: the router's decisions per
// (bucket, adapter) over the window back from the environment's newest
// decision. A decision counts once per bucket it served requests in
// (cached repeats count once), under the adapter that served its last
// request there: a conversation whose adapter the upstream stopped
// serving (the proxy's fallback rows, adapter "") moves to the base
// model rather than counting under both, so a bucket's counts sum to its
// decisions.
func decisionShareSQL(environment string, window, bucket time.Duration) (string, []any) {
	sec := max(int64(bucket/time.Second), 1)
	w := int64(window / time.Second)
	if window <= 0 {
		w = 1 << 32
	}
	q := fmt.Sprintf(`SELECT b, adapter, count() FROM (
		SELECT toDateTime(intDiv(toUInt32(ts), %d) * %d) AS b, decision_id, argMax(adapter, at_ns) AS adapter
		FROM route_decisions WHERE environment = ?
			AND toInt64(toUInt32(ts)) >= (SELECT toInt64(toUInt32(max(ts))) FROM route_decisions WHERE environment = ?) - %d
		GROUP BY b, decision_id)
	GROUP BY b, adapter ORDER BY b, adapter`, sec, sec, w)
	return q, []any{environment, environment}
}

// DecisionShare counts the router's decisions per adapter and time bucket
// over the window back from the environment's newest decision
// (route_decisions; "" is the base model).
func (s *Store) DecisionShare(ctx context.Context, environment string, window, bucket time.Duration) ([]ShareRow, error) {
	q, args := decisionShareSQL(environment, window, bucket)
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("decision share of %s: %w", environment, err)
	}
	defer rows.Close()
	var out []ShareRow
	for rows.Next() {
		var r ShareRow
		if err := rows.Scan(&r.Bucket, &r.Adapter, &r.Rollouts); err != nil {
			return nil, fmt.Errorf("decision share: %w", err)
		}
		r.Bucket = r.Bucket.UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}

// MarkAdapterRolledBack saves a new version of the adapter with status
// rolled_back and the reason in its metadata.
//
// It is the registry write alone: nothing is unloaded from serving.
// trace run's guard rolls back through the adapter lifecycle
// (adapter.Registry.RollBack, which unloads); this write serves
// verify.StoreRollBack, for tests and tools without a registry.
func (s *Store) MarkAdapterRolledBack(ctx context.Context, a AdapterRow, metadata string, now time.Time) error {
	next := a
	next.Status, next.Metadata, next.UpdatedAt = "rolled_back", metadata, now.UTC()
	next.Version = max(a.Version+1, uint64(now.UnixNano()))
	return s.SaveAdapter(ctx, next)
}
