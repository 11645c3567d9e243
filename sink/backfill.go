package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/traceops/trace/schemas"
)

// RolloutScope is one (environment, agent version) of the rollouts table.
type RolloutScope struct {
	Environment, AgentVersion string
	Rollouts, Failures        int
	Watermark                 time.Time // the newest rollout's end time
}

// RolloutScopes lists every (environment, agent version) with stored
// rollouts: what `trace report` compares with the labeled cohorts to say
// which got no labels.
func (s *Store) RolloutScopes(ctx context.Context) ([]RolloutScope, error) {
	return s.rolloutScopes(ctx, rolloutScopesSQL)
}

func (s *Store) rolloutScopes(ctx context.Context, q string, args ...any) ([]RolloutScope, error) {
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("rollout scopes: %w", err)
	}
	defer rows.Close()
	var out []RolloutScope
	for rows.Next() {
		var (
			r    RolloutScope
			n, f uint64
			wm   time.Time
		)
		if err := rows.Scan(&r.Environment, &r.AgentVersion, &n, &f, &wm); err != nil {
			return nil, fmt.Errorf("rollout scopes: %w", err)
		}
		r.Rollouts, r.Failures, r.Watermark = int(n), int(f), wm.UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}

// RolloutKeys lists every (environment, agent version) with stored
// rollouts, from the small rollout_counts aggregate (no scan of rollouts).
func (s *Store) RolloutKeys(ctx context.Context) ([][2]string, error) {
	rows, err := s.conn.Query(ctx, rolloutKeysSQL)
	if err != nil {
		return nil, fmt.Errorf("rollout keys: %w", err)
	}
	defer rows.Close()
	var out [][2]string
	for rows.Next() {
		var k [2]string
		if err := rows.Scan(&k[0], &k[1]); err != nil {
			return nil, fmt.Errorf("rollout keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// RolloutScopesOf is RolloutScopes of some (environment, agent version)s
// only: the rollouts table's sort key prunes the read to them.
func (s *Store) RolloutScopesOf(ctx context.Context, keys [][2]string) ([]RolloutScope, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	q, args := rolloutScopesOfSQL(keys)
	return s.rolloutScopes(ctx, q, args...)
}

// FailedRuns is the count of failed labeling runs of one cohort and one of
// their reasons.
type FailedRuns struct {
	Cohort
	Labeler string
	Runs    int
	Reason  string
}

// FailedLabelRuns lists, per cohort, the labeling runs recorded as failed
// in label_runs and not labeled since.
func (s *Store) FailedLabelRuns(ctx context.Context) ([]FailedRuns, error) {
	rows, err := s.conn.Query(ctx, failedLabelRunsSQL)
	if err != nil {
		return nil, fmt.Errorf("failed label runs: %w", err)
	}
	defer rows.Close()
	var out []FailedRuns
	for rows.Next() {
		var (
			r FailedRuns
			n uint64
		)
		if err := rows.Scan(&r.Environment, &r.AgentVersion, &r.DictionaryVersion, &r.Labeler, &n, &r.Reason); err != nil {
			return nil, fmt.Errorf("failed label runs: %w", err)
		}
		r.Runs = int(n)
		out = append(out, r)
	}
	return out, rows.Err()
}

// StoredRollout is a stored rollout's identity and where it was read from
// in Kafka (its original, uncompacted message).
type StoredRollout struct {
	RolloutID string
	EndTime   time.Time
	Coord     Coord
}

// StoredRollouts lists the rollouts of (environment, agent version) that
// ended at or after since (zero: all), oldest first, one per rollout id
// (the most recently ingested copy's Kafka coordinates).
func (s *Store) StoredRollouts(ctx context.Context, env, agentVersion string, since time.Time) ([]StoredRollout, error) {
	q, args := storedRolloutsSQL(env, agentVersion, since)
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("stored rollouts of %s/%s: %w", env, agentVersion, err)
	}
	defer rows.Close()
	var out []StoredRollout
	for rows.Next() {
		var (
			r StoredRollout
			p int32
		)
		if err := rows.Scan(&r.RolloutID, &r.EndTime, &r.Coord.Topic, &p, &r.Coord.Offset); err != nil {
			return nil, fmt.Errorf("stored rollouts: %w", err)
		}
		r.EndTime, r.Coord.Partition = r.EndTime.UTC(), int(p)
		out = append(out, r)
	}
	return out, rows.Err()
}

// LabeledRuns returns, per rollout of a cohort, how many of its labeling
// runs are done: with labels in capability_labels, or recorded ok in
// label_runs. A backfill labels only the runs not done, so a (rollout,
// dictionary version, run) is never labeled twice, an interrupted backfill
// resumes where it stopped, and a run recorded as failed (no label: an
// endpoint that was down, a wrong llm.model) is tried again.
func (s *Store) LabeledRuns(ctx context.Context, c Cohort) (map[string]int, error) {
	q, args := labeledRunsSQL(c)
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("labeled runs of %s: %w", c, err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			id string
			n  uint64
		)
		if err := rows.Scan(&id, &n); err != nil {
			return nil, fmt.Errorf("labeled runs: %w", err)
		}
		out[id] = int(n)
	}
	return out, rows.Err()
}

// CompactedRollouts reads stored rollouts back as rollouts, as compacted at
// ingest (contents cut to 300 characters, tool arguments to 200; arguments
// cut by compaction are kept as their JSON text under "_compacted"): what a
// backfill labels when a rollout's original message is no longer in Kafka.
func (s *Store) CompactedRollouts(ctx context.Context, env, agentVersion string, ids []string) (map[string]*schemas.Rollout, error) {
	out := map[string]*schemas.Rollout{}
	if len(ids) == 0 {
		return out, nil
	}
	q, args := compactedRolloutsSQL(env, agentVersion, ids)
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("compacted rollouts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			r                         schemas.Rollout
			ok                        uint8
			msgs, tools, grader, meta string
			start, end                time.Time
		)
		if err := rows.Scan(&r.RolloutID, &r.TaskID, &r.Agent.Name, &ok, &r.Outcome.Reward, &start, &end, &msgs, &tools, &grader, &meta); err != nil {
			return nil, err
		}
		r.Environment, r.Agent.Version, r.StartTime, r.EndTime = env, agentVersion, start.UTC(), end.UTC()
		succ := ok == 1
		r.Outcome.Success = &succ
		if err := decodeStored(&r, msgs, tools, grader, meta); err != nil {
			return nil, err
		}
		out[r.RolloutID] = &r
	}
	return out, rows.Err()
}

// decodeStored fills a rollout's messages, tools, grader and metadata from
// their stored JSON columns.
func decodeStored(r *schemas.Rollout, msgs, tools, grader, meta string) error {
	var cms []CompactMessage
	if err := json.Unmarshal([]byte(msgs), &cms); err != nil {
		return fmt.Errorf("stored messages of %s: %w", r.RolloutID, err)
	}
	r.Messages = StoredMessages(cms)
	if tools != "" {
		if err := json.Unmarshal([]byte(tools), &r.Tools); err != nil {
			return fmt.Errorf("stored tools of %s: %w", r.RolloutID, err)
		}
	}
	if grader != "" {
		var g schemas.Grader
		if json.Unmarshal([]byte(grader), &g) == nil {
			r.Grader = &g
		}
	}
	if meta != "" && meta != "null" {
		_ = json.Unmarshal([]byte(meta), &r.Metadata)
	}
	return nil
}

// StoredMessages turns stored compacted messages back into messages.
func StoredMessages(cms []CompactMessage) []schemas.Message {
	out := make([]schemas.Message, 0, len(cms))
	for _, cm := range cms {
		m := schemas.Message{Role: cm.Role, Content: cm.Content, ToolCallID: cm.ToolCallID, Error: cm.Error, Requestor: cm.Requestor}
		for _, tc := range cm.ToolCalls {
			var args map[string]any
			if json.Unmarshal([]byte(tc.Arguments), &args) != nil {
				args = map[string]any{"_compacted": tc.Arguments}
			}
			m.ToolCalls = append(m.ToolCalls, schemas.ToolCall{ID: tc.ID, Name: tc.Name, Arguments: args, Requestor: tc.Requestor})
		}
		out = append(out, m)
	}
	return out
}
