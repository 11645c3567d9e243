package sink

import (
	"context"
	"fmt"
)

// CurvePoint is one progress event of a job's reward curve.
type CurvePoint struct {
	Iteration  int32
	MeanReward float64
	RewardStd  float64
	KL         float64
	HasKL      bool
}

// trainingCurvesSQL is TrainingCurves' query: the progress events of the
// newest jobs (by created_at, as TrainingJobs lists them), in iteration
// order. A redelivered event is one (FINAL); an iteration reported twice
// (a trainer that restarted) keeps both rows here, TrainingCurves keeps the
// later.
const trainingCurvesSQL = `SELECT job_id, iteration, mean_reward, reward_std, kl, has_kl
	FROM training_job_events FINAL
	WHERE type = 'progress' AND iteration >= 0 AND job_id IN (
		SELECT job_id FROM (SELECT job_id, created_at FROM training_jobs FINAL)
		ORDER BY created_at DESC, job_id LIMIT ?)
	ORDER BY job_id, iteration, at_ns, received_at, event_key`

// TrainingCurves returns the reward curves (progress events) of the limit
// newest jobs, by job id, in iteration order with one point per iteration
// (the last reported).
func (s *Store) TrainingCurves(ctx context.Context, limit int) (map[string][]CurvePoint, error) {
	rows, err := s.conn.Query(ctx, trainingCurvesSQL, uint64(max(limit, 1)))
	if err != nil {
		return nil, fmt.Errorf("training curves: %w", err)
	}
	defer rows.Close()
	out := map[string][]CurvePoint{}
	for rows.Next() {
		var (
			id    string
			p     CurvePoint
			hasKL uint8
		)
		if err := rows.Scan(&id, &p.Iteration, &p.MeanReward, &p.RewardStd, &p.KL, &hasKL); err != nil {
			return nil, fmt.Errorf("training curves: %w", err)
		}
		p.HasKL = hasKL == 1
		c := out[id]
		if n := len(c); n > 0 && c[n-1].Iteration == p.Iteration {
			c[n-1] = p
		} else {
			c = append(c, p)
		}
		out[id] = c
	}
	return out, rows.Err()
}
