package sink

import (
	"context"
	"fmt"
	"strings"
)

// The evaluator's latest evaluation of each cohort (cohort_evaluations,
// migration 16): the dashboard and `trace report` show the decision the
// evaluator made — its window, counts and results — instead of computing the
// decision window again on every page load. The payload is the analyzer's
// JSON (analyzer.Evaluation); sink only stores and returns it.

// StoredEvaluation is one evaluation of a cohort.
type StoredEvaluation struct {
	Cohort
	EvaluatedNs uint64 // when it was computed (ns); the newest wins
	Payload     string // JSON
}

// SaveEvaluations writes evaluations in one INSERT.
func (s *Store) SaveEvaluations(ctx context.Context, evs []StoredEvaluation) error {
	if len(evs) == 0 {
		return nil
	}
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO cohort_evaluations (environment, agent_version, dictionary_version, evaluated_ns, payload)")
	if err != nil {
		return fmt.Errorf("insert cohort_evaluations: %w", err)
	}
	defer b.Abort()
	for _, e := range evs {
		if err := b.Append(e.Environment, e.AgentVersion, e.DictionaryVersion, e.EvaluatedNs, e.Payload); err != nil {
			return fmt.Errorf("insert cohort_evaluations: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert cohort_evaluations: %w", err)
	}
	return nil
}

// latestEvaluationsSQL is the newest evaluation of each of the given
// cohorts (binds: their (environment, agent_version, dictionary_version)).
func latestEvaluationsSQL(n int) string {
	tuples := strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", n), ", ")
	return `SELECT environment, agent_version, dictionary_version, max(evaluated_ns), argMax(payload, evaluated_ns)
FROM cohort_evaluations
WHERE (environment, agent_version, dictionary_version) IN (` + tuples + `)
GROUP BY environment, agent_version, dictionary_version`
}

// LatestEvaluations returns the newest stored evaluation of each cohort that
// has one.
func (s *Store) LatestEvaluations(ctx context.Context, cohorts []Cohort) (map[Cohort]StoredEvaluation, error) {
	out := map[Cohort]StoredEvaluation{}
	for i := 0; i < len(cohorts); i += MaxCohortsPerStatement {
		if err := s.latestEvaluations(ctx, cohorts[i:min(i+MaxCohortsPerStatement, len(cohorts))], out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *Store) latestEvaluations(ctx context.Context, cohorts []Cohort, out map[Cohort]StoredEvaluation) error {
	args := make([]any, 0, 3*len(cohorts))
	for _, c := range cohorts {
		args = append(args, c.Environment, c.AgentVersion, c.DictionaryVersion)
	}
	rows, err := s.conn.Query(s.dashboardCtx(ctx), latestEvaluationsSQL(len(cohorts)), args...)
	if err != nil {
		return fmt.Errorf("latest evaluations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e StoredEvaluation
		if err := rows.Scan(&e.Environment, &e.AgentVersion, &e.DictionaryVersion, &e.EvaluatedNs, &e.Payload); err != nil {
			return fmt.Errorf("latest evaluations: %w", err)
		}
		out[e.Cohort] = e
	}
	return rows.Err()
}
