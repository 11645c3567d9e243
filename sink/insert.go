package sink

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ts turns a zero time into the insert time, so a rollout without times still
// lands in a sane partition.
func ts(t, now time.Time) time.Time {
	if t.IsZero() {
		return now
	}
	return t.UTC()
}

// EventTime is a rollout's end time as stored: its own, else its own start
// time (history exported with start times only keeps its place in time;
// the message of a replay is sent today), else its Kafka message's
// timestamp (the producer's or the broker's, kept in the log, so a
// redelivered message gets the same one, and the ingest and analyze
// stages, which read the message apart, agree on it); zero when none is
// usable, and the insert then takes the insert time (ts).
func EventTime(end, start, msg time.Time) time.Time {
	switch {
	case !end.IsZero():
		return end
	case !start.IsZero():
		return start
	case !msg.IsZero() && InDateTimeRange(msg):
		return msg.UTC()
	}
	return end
}

// The time columns (DateTime) hold whole seconds since 1970 in a UInt32:
// from MinDateTime to MaxDateTime. The driver sends a time outside that
// range wrapped around (2110 as 1973, 1960 as 2096) without an error, so the
// decoders refuse such times (ingest.DecodeRolloutRow, ingest.DecodeLabel).
var (
	MinDateTime = time.Unix(0, 0).UTC()
	MaxDateTime = time.Unix(math.MaxUint32, 0).UTC()
)

// InDateTimeRange reports whether a DateTime column stores t as itself (its
// second).
func InDateTimeRange(t time.Time) bool {
	s := t.Unix()
	return s >= 0 && s <= math.MaxUint32
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// Rows are sent to the server in blocks of at most insertBlockRows rows or
// about insertBlockBytes bytes of row data, all in one INSERT: the client
// holds one block's column buffers (plus its encoded and compressed copies)
// instead of the whole batch three times over, and the server parses one
// block while the next is appended. The server squashes the blocks of an
// INSERT (min_insert_block_size_rows/bytes) into one part, so a batch is
// still one part, written when the INSERT ends.
const (
	insertBlockRows  = 2048
	insertBlockBytes = 8 << 20
)

// InsertRollouts writes rows in one INSERT. A nil error means the rows are
// durable on the server. Redelivered rows are deduplicated by the table key.
func (s *Store) InsertRollouts(ctx context.Context, rows []RolloutRow) error {
	if len(rows) == 0 {
		return nil
	}
	ins, err := s.BeginRollouts(ctx)
	if err != nil {
		return err
	}
	defer ins.Abort()
	for i := range rows {
		if err := ins.Append(&rows[i]); err != nil {
			return err
		}
	}
	return ins.Commit()
}

// RolloutInsert is one INSERT into rollouts, fed row by row: each block is
// sent as soon as it is full, so the caller may drop a row once Append
// returned. Nothing is durable before Commit returned nil; after an error the
// INSERT is dead (call Abort) and none of its rows may be assumed stored,
// though some may be (the table deduplicates). Not safe for concurrent use.
type RolloutInsert struct {
	s           *Store
	b           driver.Batch
	now         time.Time
	ns          uint64
	block, size int
	done        bool
}

// BeginRollouts starts an INSERT into rollouts; ctx bounds the whole INSERT.
func (s *Store) BeginRollouts(ctx context.Context) (*RolloutInsert, error) {
	b, err := s.conn.PrepareBatch(ctx, `INSERT INTO rollouts (rollout_id, environment, agent_name, agent_version, task_id,
	success, reward, start_time, end_time, n_messages, n_tool_calls, n_tool_errors, messages, tools, grader, metadata,
	kafka_topic, kafka_partition, kafka_offset, ingested_at, ingest_ns, conversation_id, route_decision_id, adapter)`)
	if err != nil {
		return nil, fmt.Errorf("insert rollouts: %w", err)
	}
	now := time.Now().UTC()
	return &RolloutInsert{s: s, b: b, now: now, ns: uint64(now.UnixNano())}, nil
}

// Append adds one row; it may send a block to the server.
func (ins *RolloutInsert) Append(r *RolloutRow) error {
	if ins.block >= insertBlockRows || ins.size >= insertBlockBytes {
		if err := ins.b.Flush(); err != nil {
			return fmt.Errorf("insert rollouts: %w", err)
		}
		ins.block, ins.size = 0, 0
	}
	end := ts(r.EndTime, ins.now)
	start := r.StartTime
	if start.IsZero() {
		start = end
	}
	if err := ins.b.Append(r.RolloutID, r.Environment, r.AgentName, r.AgentVersion, r.TaskID,
		b2u(r.Success), r.Reward, start.UTC(), end, r.NMessages, r.NToolCalls, r.NToolErrors,
		r.Messages, r.Tools, r.Grader, r.Metadata,
		r.Coord.Topic, int32(r.Coord.Partition), r.Coord.Offset, ins.now, ins.ns,
		r.ConversationID, r.RouteDecisionID, r.Adapter); err != nil {
		return fmt.Errorf("insert rollouts: append %s: %w", r.RolloutID, err)
	}
	ins.block++
	ins.size += r.size()
	return nil
}

// Commit ends the INSERT; nil means every appended row is durable.
func (ins *RolloutInsert) Commit() error {
	ins.done = true
	defer ins.s.wm.invalidate() // this process's reads see its own writes at once
	if err := ins.b.Send(); err != nil {
		return fmt.Errorf("insert rollouts: %w", err)
	}
	return nil
}

// Abort ends an INSERT that is not to be committed (a no-op after Commit).
func (ins *RolloutInsert) Abort() {
	if !ins.done {
		ins.done = true
		_ = ins.b.Abort()
	}
}

// InsertLabels writes label rows in one block.
func (s *Store) InsertLabels(ctx context.Context, rows []LabelRow) error {
	if len(rows) == 0 {
		return nil
	}
	b, err := s.conn.PrepareBatch(ctx, `INSERT INTO capability_labels (environment, agent_version, dictionary_version,
	capability, run, rollout_id, label, success, reward, source, ts, ingest_ns)`)
	if err != nil {
		return fmt.Errorf("insert labels: %w", err)
	}
	defer b.Abort()
	now := time.Now().UTC()
	ns := uint64(now.UnixNano())
	for _, r := range rows {
		if err := b.Append(r.Environment, r.AgentVersion, r.DictionaryVersion, r.Capability, r.Run, r.RolloutID,
			r.Label, b2u(r.Success), r.Reward, r.Source, ts(r.TS, now), ns); err != nil {
			return fmt.Errorf("insert labels: append %s: %w", r.RolloutID, err)
		}
	}
	defer s.wm.invalidate() // this process's reads see its own writes at once
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert labels: %w", err)
	}
	return nil
}

// InsertLLMCalls writes the LLM audit rows.
func (s *Store) InsertLLMCalls(ctx context.Context, calls []LLMCall) error {
	if len(calls) == 0 {
		return nil
	}
	b, err := s.conn.PrepareBatch(ctx, `INSERT INTO llm_calls (ts, purpose, model, endpoint, prompt_hash, rollout_id, run,
	attempt, prompt_tokens, completion_tokens, latency_ms, outcome, error)`)
	if err != nil {
		return fmt.Errorf("insert llm_calls: %w", err)
	}
	defer b.Abort()
	now := time.Now().UTC()
	for _, c := range calls {
		if err := b.Append(ts(c.TS, now), c.Purpose, c.Model, c.Endpoint, c.PromptHash, c.RolloutID, c.Run,
			c.Attempt, c.PromptTokens, c.CompletionTokens, c.LatencyMS, c.Outcome, c.Error); err != nil {
			return fmt.Errorf("insert llm_calls: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert llm_calls: %w", err)
	}
	return nil
}

// InsertTriggerEvents records trigger transitions.
func (s *Store) InsertTriggerEvents(ctx context.Context, evs []TriggerEvent) error {
	if len(evs) == 0 {
		return nil
	}
	b, err := s.conn.PrepareBatch(ctx, `INSERT INTO trigger_events (trigger_id, environment, agent_version,
	dictionary_version, capability, epoch, event, at, mean_cov, mean_delta, runs_passed, runs_total,
	window_start, window_end, window_rollouts, window_failures, payload)`)
	if err != nil {
		return fmt.Errorf("insert trigger_events: %w", err)
	}
	defer b.Abort()
	now := time.Now().UTC()
	for _, e := range evs {
		if err := b.Append(e.TriggerID, e.Environment, e.AgentVersion, e.DictionaryVersion, e.Capability, e.Epoch,
			e.Event, ts(e.At, now), e.MeanCov, e.MeanDelta, e.RunsPassed, e.RunsTotal,
			ts(e.Window.Start, now), ts(e.Window.End, now), uint32(e.Window.Rollouts), uint32(e.Window.Failures), e.Payload); err != nil {
			return fmt.Errorf("insert trigger_events: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert trigger_events: %w", err)
	}
	return nil
}
