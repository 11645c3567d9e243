package sink

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// RouteDecisionRow is one routed request (the route_decisions table).
// Labels, LabelCapabilities, LabelAdapters and Probabilities are parallel
// (probabilities empty without a classification); WeightAdapters and
// Weights the top-p set. Adapter "" is the base model.
type RouteDecisionRow struct {
	At                 time.Time
	RequestID          string
	DecisionID         string
	ConversationID     string
	ConversationSource string
	Environment        string
	AgentVersion       string
	Endpoint           string // route | proxy
	Cached             bool
	Adapter            string
	Capability         string
	Model              string
	Label              string
	Labels             []string
	LabelCapabilities  []string
	LabelAdapters      []string
	Probabilities      []float64
	WeightAdapters     []string
	Weights            []float64
	Reason             string
	Error              string
	ClassifierModel    string
	ClassifyMS         uint32
	OverheadUS         uint32
	UpstreamStatus     uint16
	Outcome            string
	Stream             bool
	// Usage is whether the upstream reported the token usage of a proxied
	// completion, PromptTokens and CompletionTokens; the columns are NULL
	// when it did not (a stream without stream_options.include_usage, an
	// error, /v1/route).
	Usage                          bool
	PromptTokens, CompletionTokens uint32
	// ClientRequestID is the caller's X-Request-Id ('' without one).
	ClientRequestID string
}

const routeDecisionColumns = `ts, at_ns, request_id, decision_id, conversation_id, conversation_source, environment, agent_version, endpoint,
	cached, adapter, capability, model, label, labels, label_capabilities, label_adapters, probabilities, weight_adapters, weights,
	reason, error, classifier_model, classify_ms, overhead_us, upstream_status, outcome, stream, prompt_tokens, completion_tokens, client_request_id`

// InsertRouteDecisions writes decisions in one INSERT.
func (s *Store) InsertRouteDecisions(ctx context.Context, rows []RouteDecisionRow) error {
	if len(rows) == 0 {
		return nil
	}
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO route_decisions ("+routeDecisionColumns+")")
	if err != nil {
		return fmt.Errorf("insert route_decisions: %w", err)
	}
	defer b.Abort()
	now := time.Now().UTC()
	for _, r := range rows {
		at := ts(r.At, now)
		if err := b.Append(at, at.UnixNano(), r.RequestID, r.DecisionID, r.ConversationID, r.ConversationSource, r.Environment, r.AgentVersion, r.Endpoint,
			b2u(r.Cached), r.Adapter, r.Capability, r.Model, r.Label, strs(r.Labels), strs(r.LabelCapabilities), strs(r.LabelAdapters), floats(r.Probabilities),
			strs(r.WeightAdapters), floats(r.Weights), r.Reason, r.Error, r.ClassifierModel, r.ClassifyMS, r.OverheadUS, r.UpstreamStatus, r.Outcome, b2u(r.Stream),
			nullable(r.Usage, r.PromptTokens), nullable(r.Usage, r.CompletionTokens), r.ClientRequestID); err != nil {
			return fmt.Errorf("insert route_decisions: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert route_decisions: %w", err)
	}
	return nil
}

// nullable is v for a Nullable(UInt32) column, or NULL unless ok.
func nullable(ok bool, v uint32) *uint32 {
	if !ok {
		return nil
	}
	return &v
}

func strs(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}

func floats(v []float64) []float64 {
	if v == nil {
		return []float64{}
	}
	return v
}

// RouteDecisionFilter selects decisions; zero fields select all.
type RouteDecisionFilter struct {
	Environment, ConversationID, DecisionID string
	ClientRequestID                         string // the caller's X-Request-Id
	Since                                   time.Time
	Limit                                   int
}

func routeDecisionsSQL(f RouteDecisionFilter) (string, []any) {
	var where []string
	var args []any
	for _, c := range []struct{ col, v string }{{"environment", f.Environment}, {"conversation_id", f.ConversationID}, {"decision_id", f.DecisionID}, {"client_request_id", f.ClientRequestID}} {
		if c.v != "" {
			where = append(where, c.col+" = ?")
			args = append(args, c.v)
		}
	}
	if !f.Since.IsZero() {
		where = append(where, "ts >= ?")
		args = append(args, f.Since.UTC())
	}
	q := `SELECT ` + routeDecisionColumns + ` FROM route_decisions`
	if len(where) > 0 {
		q += "\n\tWHERE " + strings.Join(where, " AND ")
	}
	q += "\n\tORDER BY at_ns, request_id LIMIT 1 BY request_id"
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	return q, args
}

// RouteDecisions lists recorded decisions, oldest first.
func (s *Store) RouteDecisions(ctx context.Context, f RouteDecisionFilter) ([]RouteDecisionRow, error) {
	q, args := routeDecisionsSQL(f)
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("route decisions: %w", err)
	}
	defer rows.Close()
	var out []RouteDecisionRow
	for rows.Next() {
		var (
			r                  RouteDecisionRow
			atNS               int64
			cached, stream     uint8
			prompt, completion *uint32
		)
		if err := rows.Scan(&r.At, &atNS, &r.RequestID, &r.DecisionID, &r.ConversationID, &r.ConversationSource, &r.Environment, &r.AgentVersion, &r.Endpoint,
			&cached, &r.Adapter, &r.Capability, &r.Model, &r.Label, &r.Labels, &r.LabelCapabilities, &r.LabelAdapters, &r.Probabilities,
			&r.WeightAdapters, &r.Weights, &r.Reason, &r.Error, &r.ClassifierModel, &r.ClassifyMS, &r.OverheadUS, &r.UpstreamStatus, &r.Outcome, &stream,
			&prompt, &completion, &r.ClientRequestID); err != nil {
			return nil, fmt.Errorf("route decisions: %w", err)
		}
		r.At, r.Cached, r.Stream = time.Unix(0, atNS).UTC(), cached == 1, stream == 1
		if prompt != nil && completion != nil {
			r.Usage, r.PromptTokens, r.CompletionTokens = true, *prompt, *completion
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// RouteByConversationSQL is a subquery with one row per conversation_id
// of one environment (its one bind) that the router decided: the latest
// decision's id and adapter (empty: the base model). Join an environment's
// rollouts on it (rollouts.conversation_id) for producers that do not send
// rollout v1's routing field. The environment is filtered inside, before
// the aggregation: it is the first column of route_decisions' sort key, so
// only that environment's decisions are read (filtered outside, every
// environment's decisions were aggregated first; ClickHouse 18.16 does not
// move the condition in).
const RouteByConversationSQL = `SELECT conversation_id,
	argMax(decision_id, at_ns) AS decision_id, argMax(adapter, at_ns) AS adapter
	FROM route_decisions WHERE environment = ? AND conversation_id != ''
	GROUP BY conversation_id`

// tokenUsageSQL is TokenUsage's query. A request's row is counted once (a
// batch written twice lands twice until merged).
const tokenUsageSQL = `SELECT toDate(ts) AS day, adapter, count() AS requests, count(completion_tokens) AS with_usage,
	sum(prompt_tokens) AS prompt, sum(completion_tokens) AS completion
	FROM (SELECT request_id, ts, adapter, prompt_tokens, completion_tokens FROM route_decisions
		WHERE environment = ? AND endpoint = 'proxy' AND ts >= ? LIMIT 1 BY request_id)
	GROUP BY day, adapter ORDER BY day, adapter`

// TokenUsageRow is the proxied requests of one day and adapter ("" =
// base model) and the tokens of those whose usage the upstream reported.
type TokenUsageRow struct {
	Day              time.Time `json:"day"`
	Adapter          string    `json:"adapter"`
	Requests         uint64    `json:"requests"`
	WithUsage        uint64    `json:"with_usage"`
	PromptTokens     uint64    `json:"prompt_tokens"`
	CompletionTokens uint64    `json:"completion_tokens"`
}

// TokenUsage sums the token usage the proxy recorded (migration 18) per
// day and adapter of an environment since a time, oldest first.
func (s *Store) TokenUsage(ctx context.Context, environment string, since time.Time) ([]TokenUsageRow, error) {
	rows, err := s.conn.Query(ctx, tokenUsageSQL, environment, since.UTC())
	if err != nil {
		return nil, fmt.Errorf("token usage of %s: %w", environment, err)
	}
	defer rows.Close()
	var out []TokenUsageRow
	for rows.Next() {
		var (
			r                  TokenUsageRow
			prompt, completion *uint64 // NULL: no request of the group reported one
		)
		if err := rows.Scan(&r.Day, &r.Adapter, &r.Requests, &r.WithUsage, &prompt, &completion); err != nil {
			return nil, fmt.Errorf("token usage: %w", err)
		}
		if prompt != nil {
			r.PromptTokens = *prompt
		}
		if completion != nil {
			r.CompletionTokens = *completion
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// routeSharesSQL counts routed requests per adapter and hour of one environment.
const routeSharesSQL = `SELECT toStartOfHour(ts) AS hour, adapter, uniqExact(request_id) AS requests
	FROM route_decisions WHERE environment = ? AND ts >= ?
	GROUP BY hour, adapter ORDER BY hour, adapter`

// RouteShare is the number of requests routed to an adapter (” = base)
// in one hour.
type RouteShare struct {
	Hour     time.Time
	Adapter  string
	Requests uint64
}

// RouteShares returns the routed requests per hour and adapter of an
// environment since a time, oldest first.
func (s *Store) RouteShares(ctx context.Context, environment string, since time.Time) ([]RouteShare, error) {
	rows, err := s.conn.Query(ctx, routeSharesSQL, environment, since.UTC())
	if err != nil {
		return nil, fmt.Errorf("route shares: %w", err)
	}
	defer rows.Close()
	var out []RouteShare
	for rows.Next() {
		var r RouteShare
		if err := rows.Scan(&r.Hour, &r.Adapter, &r.Requests); err != nil {
			return nil, fmt.Errorf("route shares: %w", err)
		}
		r.Hour = r.Hour.UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}

// Trajectory is a stored rollout's compacted messages (rollouts.messages JSON).
type Trajectory struct {
	RolloutID string
	Messages  string
}

// successfulTrajectoriesSQL selects an environment's newest successful
// rollouts that some labeling run found to exhibit the capability (PRESENT).
const successfulTrajectoriesSQL = `SELECT rollout_id, messages FROM rollouts FINAL
	WHERE environment = ? AND success = 1 AND rollout_id IN (
		SELECT rollout_id FROM capability_labels WHERE environment = ? AND capability = ? AND label = 'PRESENT' AND success = 1)
	ORDER BY end_time DESC, rollout_id LIMIT ?`

// SuccessfulTrajectories returns up to limit of an environment's newest
// successful rollouts labeled PRESENT for the capability (the router's
// retrieval candidates).
func (s *Store) SuccessfulTrajectories(ctx context.Context, environment, capability string, limit int) ([]Trajectory, error) {
	rows, err := s.conn.Query(ctx, successfulTrajectoriesSQL, environment, environment, capability, max(limit, 1))
	if err != nil {
		return nil, fmt.Errorf("successful trajectories: %w", err)
	}
	defer rows.Close()
	var out []Trajectory
	for rows.Next() {
		var t Trajectory
		if err := rows.Scan(&t.RolloutID, &t.Messages); err != nil {
			return nil, fmt.Errorf("successful trajectories: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}
