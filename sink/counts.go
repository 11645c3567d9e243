package sink

import "context"

// The statements of the demo's and the benchmarks' progress checks. (The
// bench's clickhouse-client ceiling inserts with InsertRolloutsJSONEachRowSQL.)
const (
	countRolloutsSQL = "SELECT count() FROM rollouts"
	countLabelsSQL   = "SELECT uniqExact(rollout_id), count() FROM capability_labels"
	activeMergesSQL  = "SELECT count() FROM system.merges"

	// InsertRolloutsJSONEachRowSQL is the INSERT a clickhouse-client
	// writes rollouts rows with from JSONEachRow input (the bench's
	// ceiling): the columns of BeginRollouts' INSERT, in its order.
	InsertRolloutsJSONEachRowSQL = "INSERT INTO rollouts (rollout_id, environment, agent_name, agent_version, task_id, success, reward, start_time, end_time, n_messages, n_tool_calls, n_tool_errors, messages, tools, grader, metadata, kafka_topic, kafka_partition, kafka_offset, ingested_at, ingest_ns) FORMAT JSONEachRow"
)

// CountRollouts counts the rows of rollouts (redelivered ones included until
// merged; see CountDistinctRollouts for exact ids).
func (s *Store) CountRollouts(ctx context.Context) (uint64, error) {
	var n uint64
	err := s.conn.QueryRow(ctx, countRolloutsSQL).Scan(&n)
	return n, err
}

// CountLabels counts the labeled rollouts (distinct ids) and the label rows
// of capability_labels.
func (s *Store) CountLabels(ctx context.Context) (labeled, labels uint64, err error) {
	err = s.conn.QueryRow(ctx, countLabelsSQL).Scan(&labeled, &labels)
	return labeled, labels, err
}

// ActiveMerges is the number of merges the server is running (all
// databases): the benchmarks wait for 0 between steps.
func (s *Store) ActiveMerges(ctx context.Context) (uint64, error) {
	var n uint64
	err := s.conn.QueryRow(ctx, activeMergesSQL).Scan(&n)
	return n, err
}

// DropDatabase drops the database name if it exists (the benchmarks' scratch
// databases). name is a plain identifier chosen by the caller.
func (s *Store) DropDatabase(ctx context.Context, name string) error {
	return s.conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name)
}
