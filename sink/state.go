package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// DictionaryRow is one stored dictionary version (Body is its JSON).
type DictionaryRow struct {
	Environment, AgentVersion string
	Version                   uint32
	CreatedAt                 time.Time
	Source                    string
	Body                      string
}

// SaveDictionary stores a dictionary version. Saving the same version twice
// is harmless (ReplacingMergeTree on the key).
func (s *Store) SaveDictionary(ctx context.Context, d DictionaryRow) error {
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO dictionaries (environment, agent_version, version, created_at, source, body)")
	if err != nil {
		return fmt.Errorf("save dictionary: %w", err)
	}
	defer b.Abort()
	if err := b.Append(d.Environment, d.AgentVersion, d.Version, ts(d.CreatedAt, time.Now().UTC()), d.Source, d.Body); err != nil {
		return err
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("save dictionary: %w", err)
	}
	return nil
}

// LatestDictionaries returns the newest version of every dictionary scope.
func (s *Store) LatestDictionaries(ctx context.Context) ([]DictionaryRow, error) {
	return s.queryDictionaries(ctx, latestDictionariesSQL)
}

// AllDictionaries returns every stored version, newest first per scope.
func (s *Store) AllDictionaries(ctx context.Context) ([]DictionaryRow, error) {
	return s.queryDictionaries(ctx, allDictionariesSQL)
}

func (s *Store) queryDictionaries(ctx context.Context, q string) ([]DictionaryRow, error) {
	rows, err := s.conn.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("dictionaries: %w", err)
	}
	defer rows.Close()
	var out []DictionaryRow
	for rows.Next() {
		var d DictionaryRow
		if err := rows.Scan(&d.Environment, &d.AgentVersion, &d.Version, &d.CreatedAt, &d.Source, &d.Body); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// TriggerHistory returns every recorded trigger transition, oldest first per
// trigger, so an analyzer can rebuild its state machines after a restart.
func (s *Store) TriggerHistory(ctx context.Context) ([]TriggerEvent, error) {
	rows, err := s.conn.Query(ctx, triggerHistorySQL)
	if err != nil {
		return nil, fmt.Errorf("trigger history: %w", err)
	}
	defer rows.Close()
	var out []TriggerEvent
	for rows.Next() {
		var e TriggerEvent
		var wr, wf uint32
		if err := rows.Scan(&e.TriggerID, &e.Environment, &e.AgentVersion, &e.DictionaryVersion, &e.Capability, &e.Epoch, &e.Event, &e.At,
			&e.MeanCov, &e.MeanDelta, &e.RunsPassed, &e.RunsTotal, &e.Window.Start, &e.Window.End, &wr, &wf, &e.Payload); err != nil {
			return nil, err
		}
		e.Window.Rollouts, e.Window.Failures = int(wr), int(wf)
		out = append(out, e)
	}
	return out, rows.Err()
}

// LabelRun records that one labeling run of a rollout happened, with its
// status: "ok" (its labels are in capability_labels) or "failed" (no label
// was recorded; Reason says why).
type LabelRun struct {
	Environment, AgentVersion string
	DictionaryVersion         uint32
	RolloutID                 string
	Run                       uint16
	Labeler, Status, Reason   string
	At                        time.Time
}

// InsertLabelRuns records labeling runs.
func (s *Store) InsertLabelRuns(ctx context.Context, runs []LabelRun) error {
	if len(runs) == 0 {
		return nil
	}
	b, err := s.conn.PrepareBatch(ctx, `INSERT INTO label_runs (environment, agent_version, dictionary_version, rollout_id, run,
	labeler, status, reason, at, ingest_ns)`)
	if err != nil {
		return fmt.Errorf("insert label_runs: %w", err)
	}
	defer b.Abort()
	now := time.Now().UTC()
	ns := uint64(now.UnixNano())
	for _, r := range runs {
		if err := b.Append(r.Environment, r.AgentVersion, r.DictionaryVersion, r.RolloutID, r.Run, r.Labeler, r.Status, r.Reason, ts(r.At, now), ns); err != nil {
			return fmt.Errorf("insert label_runs: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert label_runs: %w", err)
	}
	return nil
}

// StoredRuns returns the labeling runs already done for a rollout under a
// dictionary version — those with labels and those recorded as failed — so
// that a non-deterministic labeler never labels a (rollout, dictionary
// version, run) twice and a redelivered rollout changes no statistic.
// The stream's labeler uses it: a redelivery never asks the model again,
// not even for a run that failed.
func (s *Store) StoredRuns(ctx context.Context, env, agentVersion, rolloutID string, dictVersion uint32) (map[int]bool, error) {
	q, args := storedRunsSQL(env, agentVersion, rolloutID, dictVersion)
	return s.runSet(ctx, "stored runs", q, args)
}

// DoneRuns is StoredRuns without the runs recorded as failed and not
// labeled since: what a backfill (trace relabel) skips, so that it labels
// the runs that failed (they have no label, so none is labeled twice).
func (s *Store) DoneRuns(ctx context.Context, env, agentVersion, rolloutID string, dictVersion uint32) (map[int]bool, error) {
	q, args := doneRunsSQL(env, agentVersion, rolloutID, dictVersion)
	return s.runSet(ctx, "done runs", q, args)
}

func (s *Store) runSet(ctx context.Context, what, q string, args []any) (map[int]bool, error) {
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	out := map[int]bool{}
	for rows.Next() {
		var r uint16
		if err := rows.Scan(&r); err != nil {
			return nil, err
		}
		out[int(r)] = true
	}
	return out, rows.Err()
}

// RolloutKey names a stored rollout: the rollouts table's key.
type RolloutKey struct {
	Environment, AgentVersion, RolloutID string
}

// RolloutEndTimes returns the stored end time of each of the given rollouts
// (of its most recently ingested copy: its end_time, start_time or Kafka
// message time, EventTime) in one query, however many; a rollout not stored
// is absent. The label events without ts take it (analyzer.LabelEventSink),
// as the built-in labelers' labels do.
func (s *Store) RolloutEndTimes(ctx context.Context, keys []RolloutKey) (map[RolloutKey]time.Time, error) {
	out := make(map[RolloutKey]time.Time, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	q, args := rolloutEndTimesSQL(keys)
	rows, err := s.conn.Query(withQuerySize(ctx, q, args), q, args...)
	if err != nil {
		return nil, fmt.Errorf("rollout end times: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			k   RolloutKey
			end time.Time
		)
		if err := rows.Scan(&k.Environment, &k.AgentVersion, &k.RolloutID, &end); err != nil {
			return nil, fmt.Errorf("rollout end times: %w", err)
		}
		out[k] = end.UTC()
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("rollout end times: %w", err)
	}
	return out, nil
}

// defaultMaxQuerySize is ClickHouse's default max_query_size: the longest
// statement (besides an INSERT's data) it parses.
const defaultMaxQuerySize = 256 << 10

// withQuerySize is ctx with max_query_size raised (a setting of this query
// only) when q with args bound in its text, as clickhouse-go binds them,
// may be longer than the default: a lookup of a whole batch's ids is one
// statement whatever their number, and ClickHouse would refuse it for good
// (a syntax error, not retried).
func withQuerySize(ctx context.Context, q string, args []any) context.Context {
	n := len(q)
	for _, a := range args {
		switch v := a.(type) {
		case string:
			n += 2*len(v) + 4 // quoted, each byte escaped at worst
		case []string:
			n += 2
			for _, s := range v {
				n += 2*len(s) + 4 // and ", "
			}
		default:
			n += 64
		}
	}
	if n <= defaultMaxQuerySize {
		return ctx
	}
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"max_query_size": n + 1024}))
}
