package sink

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// EnvironmentRow is one version of a synthesized environment's record (the
// environments table; the synthesizer's Environment in columns). The JSON
// columns hold what only one environment's page reads: Request (the
// synthesis request), Attempts (every attempt with its validation and
// calibration), Calibration (the accepted one), PassAtK, Tools and Details
// (the rest of the record). Version orders the rows of one environment:
// the table is a ReplacingMergeTree(version) by environment_id, so
// re-saving a status is idempotent and the newest version wins.
type EnvironmentRow struct {
	EnvironmentID     string
	TriggerID         string
	Environment       string
	AgentVersion      string
	DictionaryVersion uint32
	Capability        string
	Family            string
	Status            string
	Reason            string
	Attempts          uint8 // attempts recorded
	Program           string
	ProgramHash       string
	Tools             string  // JSON array of tool names
	MeanReward        float64 // of the accepted calibration (0 before)
	SuccessRate       float64
	Simulated         bool   // the accepted calibration was played by a simulated policy
	PassAtK           string // JSON object {"1": …}
	Request           string // JSON
	AttemptsJSON      string // JSON array
	Calibration       string // JSON object, "" before DONE
	Details           string // JSON object
	CreatedAt         time.Time
	UpdatedAt         time.Time
	Version           uint64
}

// environmentColumns is the column list of every INSERT and SELECT of
// environments, in EnvironmentRow's order.
const environmentColumns = `environment_id, trigger_id, environment, agent_version, dictionary_version, capability, family,
	status, reason, attempts, program, program_hash, tools, mean_reward, success_rate, simulated, pass_at_k,
	request, attempts_json, calibration, details, created_at, updated_at, version`

// environmentListColumns are the columns of a list: every column but the
// program and the attempts (empty strings instead). The accepted
// calibration is listed (the environment server's catalog shows it whole).
const environmentListColumns = `environment_id, trigger_id, environment, agent_version, dictionary_version, capability, family,
	status, reason, attempts, '' AS program, program_hash, tools, mean_reward, success_rate, simulated, pass_at_k,
	request, '' AS attempts_json, calibration, details, created_at, updated_at, version`

// environmentSQL is the query of Environment: the newest version of one.
const environmentSQL = `SELECT ` + environmentColumns + `
	FROM environments WHERE environment_id = ? ORDER BY version DESC LIMIT 1`

// environmentsSQL is the query of Environments: the newest version of every
// environment (FINAL, then the filters, so a filter never sees an old
// version), newest first.
func environmentsSQL(f EnvironmentFilter) (string, []any) {
	cols := environmentListColumns
	if f.Full {
		cols = environmentColumns
	}
	where, args := environmentsWhere(f)
	return latestSQL(cols, "environments", where, "created_at DESC, environment_id", f.Limit), args
}

// environmentCountsSQL is the query of EnvironmentStatusCounts: the
// environments environmentsSQL lists without its limit (the newest version
// of each, the same filters), counted by status.
func environmentCountsSQL(f EnvironmentFilter) (string, []any) {
	where, args := environmentsWhere(f)
	return statusCountsSQL("environments", where), args
}

// environmentsWhere is the WHERE clause of f's filters ("" for none).
func environmentsWhere(f EnvironmentFilter) (string, []any) {
	return equalsWhere([][2]string{{"status", f.Status}, {"environment", f.Environment}, {"agent_version", f.AgentVersion}})
}

// latestSQL selects cols of the newest version of each row of table
// (FINAL, then the WHERE clause where, so a filter never sees an old
// version), in order, at most limit rows (0: all).
func latestSQL(cols, table, where, order string, limit int) string {
	q := `SELECT ` + cols + ` FROM (SELECT * FROM ` + table + ` FINAL)` + where + "\n\tORDER BY " + order
	if limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", limit)
	}
	return q
}

// statusCountsSQL counts the rows latestSQL lists (without a limit) by
// status.
func statusCountsSQL(table, where string) string {
	return `SELECT status, count() FROM (SELECT * FROM ` + table + ` FINAL)` + where + "\n\tGROUP BY status"
}

// equalsWhere is a WHERE clause requiring each column (pair[0]) to equal
// its value (pair[1]), leaving out the empty values ("" when all are).
func equalsWhere(pairs [][2]string) (string, []any) {
	var where []string
	var args []any
	for _, c := range pairs {
		if c[1] != "" {
			where = append(where, c[0]+" = ?")
			args = append(args, c[1])
		}
	}
	if len(where) == 0 {
		return "", nil
	}
	return "\n\tWHERE " + strings.Join(where, " AND "), args
}

// EnvironmentFilter selects environments; zero fields select all.
type EnvironmentFilter struct {
	Status, Environment, AgentVersion string
	Limit                             int
	// Full reads the program and every JSON column too (default: what a
	// list shows).
	Full bool
}

// SaveEnvironment stores a version of an environment's record.
func (s *Store) SaveEnvironment(ctx context.Context, r EnvironmentRow) error {
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO environments ("+environmentColumns+")")
	if err != nil {
		return fmt.Errorf("save environment: %w", err)
	}
	defer b.Abort()
	now := time.Now().UTC()
	if err := b.Append(r.EnvironmentID, r.TriggerID, r.Environment, r.AgentVersion, r.DictionaryVersion, r.Capability, r.Family,
		r.Status, r.Reason, r.Attempts, r.Program, r.ProgramHash, r.Tools, r.MeanReward, r.SuccessRate, b2u(r.Simulated), r.PassAtK,
		r.Request, r.AttemptsJSON, r.Calibration, r.Details, ts(r.CreatedAt, now), ts(r.UpdatedAt, now), r.Version); err != nil {
		return fmt.Errorf("save environment: %w", err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("save environment: %w", err)
	}
	return nil
}

// Environment returns the newest version of environment id, nil when
// there is none.
func (s *Store) Environment(ctx context.Context, id string) (*EnvironmentRow, error) {
	rs, err := s.queryEnvironments(ctx, environmentSQL, id)
	if err != nil || len(rs) == 0 {
		return nil, err
	}
	return &rs[0], nil
}

// Environments lists environments (their newest versions) matching f.
func (s *Store) Environments(ctx context.Context, f EnvironmentFilter) ([]EnvironmentRow, error) {
	q, args := environmentsSQL(f)
	return s.queryEnvironments(ctx, q, args...)
}

// EnvironmentStatusCounts counts the environments matching f (their newest
// versions; f.Limit and f.Full do not apply) by status: what a listing
// limited to f.Limit rows cannot count.
func (s *Store) EnvironmentStatusCounts(ctx context.Context, f EnvironmentFilter) (map[string]int, error) {
	q, args := environmentCountsSQL(f)
	out, err := s.statusCounts(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("environment counts: %w", err)
	}
	return out, nil
}

// statusCounts runs a SELECT status, count() … GROUP BY status.
func (s *Store) statusCounts(ctx context.Context, q string, args ...any) (map[string]int, error) {
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			status string
			n      uint64
		)
		if err := rows.Scan(&status, &n); err != nil {
			return nil, err
		}
		out[status] = int(n)
	}
	return out, rows.Err()
}

func (s *Store) queryEnvironments(ctx context.Context, q string, args ...any) ([]EnvironmentRow, error) {
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("environments: %w", err)
	}
	defer rows.Close()
	var out []EnvironmentRow
	for rows.Next() {
		var (
			r   EnvironmentRow
			sim uint8
		)
		if err := rows.Scan(&r.EnvironmentID, &r.TriggerID, &r.Environment, &r.AgentVersion, &r.DictionaryVersion, &r.Capability, &r.Family,
			&r.Status, &r.Reason, &r.Attempts, &r.Program, &r.ProgramHash, &r.Tools, &r.MeanReward, &r.SuccessRate, &sim, &r.PassAtK,
			&r.Request, &r.AttemptsJSON, &r.Calibration, &r.Details, &r.CreatedAt, &r.UpdatedAt, &r.Version); err != nil {
			return nil, fmt.Errorf("environments: %w", err)
		}
		r.Simulated = sim == 1
		r.CreatedAt, r.UpdatedAt = r.CreatedAt.UTC(), r.UpdatedAt.UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}
