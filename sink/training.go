package sink

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// TrainingJobRow is one version of a training job's status (the
// training_jobs table; ReplacingMergeTree(version) by job_id, so the
// newest version wins). Spec is the training_job/v1 JSON; Planner the
// plan's planner record (source, overrides, the agent's reason).
type TrainingJobRow struct {
	JobID         string
	EnvironmentID string
	PlanRevision  uint32
	Environment   string
	AgentVersion  string
	Capability    string
	BaseModel     string
	Backend       string
	Status        string
	Reason        string
	AdapterName   string
	Iteration     uint32 // the last progress event's
	Iterations    uint32 // planned
	MeanReward    float64
	Simulated     bool
	Planner       string
	Spec          string
	DispatchedAt  time.Time
	LastEventAt   time.Time
	DeadlineAt    time.Time
	CreatedAt     time.Time
	UpdatedAt     time.Time
	Version       uint64
}

const trainingJobColumns = `job_id, environment_id, plan_revision, environment, agent_version, capability, base_model, backend,
	status, reason, adapter_name, iteration, iterations, mean_reward, simulated, planner, spec,
	dispatched_at, last_event_at, deadline_at, created_at, updated_at, version`

// trainingJobSQL is TrainingJob's query: the newest version of one job.
const trainingJobSQL = `SELECT ` + trainingJobColumns + `
	FROM training_jobs WHERE job_id = ? ORDER BY version DESC LIMIT 1`

// overdueJobsSQL selects the jobs still open (DISPATCHED or RUNNING) whose
// deadline passed: the newest version of each decides.
const overdueJobsSQL = `SELECT ` + trainingJobColumns + ` FROM (SELECT * FROM training_jobs FINAL)
	WHERE status IN ('DISPATCHED', 'RUNNING') AND deadline_at < ?
	ORDER BY deadline_at, job_id`

// TrainingJobFilter selects jobs; zero fields select all.
type TrainingJobFilter struct {
	Status, EnvironmentID, Capability string
	Environment                       string // the target environment (e.g. sim-airline)
	Limit                             int
}

func trainingJobsSQL(f TrainingJobFilter) (string, []any) {
	where, args := trainingJobsWhere(f)
	return latestSQL(trainingJobColumns, "training_jobs", where, "created_at DESC, job_id", f.Limit), args
}

// trainingJobCountsSQL is the query of TrainingJobStatusCounts: the jobs
// trainingJobsSQL lists without its limit (the newest version of each, the
// same filters), counted by status.
func trainingJobCountsSQL(f TrainingJobFilter) (string, []any) {
	where, args := trainingJobsWhere(f)
	return statusCountsSQL("training_jobs", where), args
}

// trainingJobsWhere is the WHERE clause of f's filters ("" for none).
func trainingJobsWhere(f TrainingJobFilter) (string, []any) {
	return equalsWhere([][2]string{{"status", f.Status}, {"environment_id", f.EnvironmentID}, {"environment", f.Environment}, {"capability", f.Capability}})
}

// SaveTrainingJob stores a version of a job's status.
func (s *Store) SaveTrainingJob(ctx context.Context, r TrainingJobRow) error {
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO training_jobs ("+trainingJobColumns+")")
	if err != nil {
		return fmt.Errorf("save training job: %w", err)
	}
	defer b.Abort()
	now := time.Now().UTC()
	if err := b.Append(r.JobID, r.EnvironmentID, r.PlanRevision, r.Environment, r.AgentVersion, r.Capability, r.BaseModel, r.Backend,
		r.Status, r.Reason, r.AdapterName, r.Iteration, r.Iterations, r.MeanReward, b2u(r.Simulated), r.Planner, r.Spec,
		ts(r.DispatchedAt, now), ts(r.LastEventAt, now), ts(r.DeadlineAt, now), ts(r.CreatedAt, now), ts(r.UpdatedAt, now), r.Version); err != nil {
		return fmt.Errorf("save training job: %w", err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("save training job: %w", err)
	}
	return nil
}

// TrainingJob returns the newest version of a job, nil when there is none.
func (s *Store) TrainingJob(ctx context.Context, id string) (*TrainingJobRow, error) {
	rs, err := s.queryTrainingJobs(ctx, trainingJobSQL, id)
	if err != nil || len(rs) == 0 {
		return nil, err
	}
	return &rs[0], nil
}

// TrainingJobs lists jobs (newest version of each), newest first.
func (s *Store) TrainingJobs(ctx context.Context, f TrainingJobFilter) ([]TrainingJobRow, error) {
	q, args := trainingJobsSQL(f)
	return s.queryTrainingJobs(ctx, q, args...)
}

// TrainingJobStatusCounts counts the jobs matching f (their newest
// versions; f.Limit does not apply) by status.
func (s *Store) TrainingJobStatusCounts(ctx context.Context, f TrainingJobFilter) (map[string]int, error) {
	q, args := trainingJobCountsSQL(f)
	out, err := s.statusCounts(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("training job counts: %w", err)
	}
	return out, nil
}

// OverdueTrainingJobs lists the open jobs whose deadline is before now.
func (s *Store) OverdueTrainingJobs(ctx context.Context, now time.Time) ([]TrainingJobRow, error) {
	return s.queryTrainingJobs(ctx, overdueJobsSQL, now.UTC())
}

func (s *Store) queryTrainingJobs(ctx context.Context, q string, args ...any) ([]TrainingJobRow, error) {
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("training jobs: %w", err)
	}
	defer rows.Close()
	var out []TrainingJobRow
	for rows.Next() {
		var (
			r   TrainingJobRow
			sim uint8
		)
		if err := rows.Scan(&r.JobID, &r.EnvironmentID, &r.PlanRevision, &r.Environment, &r.AgentVersion, &r.Capability, &r.BaseModel, &r.Backend,
			&r.Status, &r.Reason, &r.AdapterName, &r.Iteration, &r.Iterations, &r.MeanReward, &sim, &r.Planner, &r.Spec,
			&r.DispatchedAt, &r.LastEventAt, &r.DeadlineAt, &r.CreatedAt, &r.UpdatedAt, &r.Version); err != nil {
			return nil, fmt.Errorf("training jobs: %w", err)
		}
		r.Simulated = sim == 1
		for _, t := range []*time.Time{&r.DispatchedAt, &r.LastEventAt, &r.DeadlineAt, &r.CreatedAt, &r.UpdatedAt} {
			*t = t.UTC()
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// TrainingEventRow is one event of a job's history. Key identifies the
// event within its job (the trainer's seq, the JetStream sequence, the
// line of a command's output, or trace's own "trace:…"): a redelivered
// event has the same key and replaces itself.
type TrainingEventRow struct {
	JobID      string
	Key        string
	Type       string
	At         time.Time
	Iteration  int32 // -1 when the event has none
	MeanReward float64
	RewardStd  float64
	KL         float64
	HasKL      bool
	Payload    string // the event's JSON (or the malformed line, type "malformed")
	ReceivedAt time.Time
}

const trainingEventColumns = `job_id, event_key, type, at, at_ns, iteration, mean_reward, reward_std, kl, has_kl, payload, received_at`

// trainingEventsSQL is TrainingEvents' query: one job's history in order.
const trainingEventsSQL = `SELECT ` + trainingEventColumns + ` FROM training_job_events FINAL
	WHERE job_id = ? ORDER BY at_ns, received_at, event_key`

// InsertTrainingEvents writes events in one INSERT.
func (s *Store) InsertTrainingEvents(ctx context.Context, evs []TrainingEventRow) error {
	if len(evs) == 0 {
		return nil
	}
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO training_job_events ("+trainingEventColumns+")")
	if err != nil {
		return fmt.Errorf("insert training events: %w", err)
	}
	defer b.Abort()
	now := time.Now().UTC()
	for _, e := range evs {
		at := ts(e.At, now)
		if err := b.Append(e.JobID, e.Key, e.Type, at, at.UnixNano(), e.Iteration, e.MeanReward, e.RewardStd, e.KL, b2u(e.HasKL), e.Payload, ts(e.ReceivedAt, now)); err != nil {
			return fmt.Errorf("insert training events: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert training events: %w", err)
	}
	return nil
}

// TrainingEvents returns a job's history, oldest first.
func (s *Store) TrainingEvents(ctx context.Context, jobID string) ([]TrainingEventRow, error) {
	rows, err := s.conn.Query(ctx, trainingEventsSQL, jobID)
	if err != nil {
		return nil, fmt.Errorf("training events: %w", err)
	}
	defer rows.Close()
	var out []TrainingEventRow
	for rows.Next() {
		var (
			e     TrainingEventRow
			hasKL uint8
			atNS  int64
		)
		if err := rows.Scan(&e.JobID, &e.Key, &e.Type, &e.At, &atNS, &e.Iteration, &e.MeanReward, &e.RewardStd, &e.KL, &hasKL, &e.Payload, &e.ReceivedAt); err != nil {
			return nil, fmt.Errorf("training events: %w", err)
		}
		e.HasKL = hasKL == 1
		e.At, e.ReceivedAt = time.Unix(0, atNS).UTC(), e.ReceivedAt.UTC()
		out = append(out, e)
	}
	return out, rows.Err()
}

// AdapterRow is one version of a registered adapter (the adapters table;
// ReplacingMergeTree(version) by adapter_name). Eval is the evaluation
// metrics' JSON; Metadata says, among others, whether a simulated trainer
// produced it (no model trained).
type AdapterRow struct {
	Name            string
	JobID           string
	EnvironmentID   string
	Capability      string
	Environment     string
	AgentVersion    string
	BaseModel       string
	URI             string
	Eval            string
	EvalMeanReward  float64
	EvalSuccessRate float64
	Status          string // candidate | active | retired | rolled_back
	Simulated       bool
	Metadata        string
	CreatedAt       time.Time
	UpdatedAt       time.Time
	Version         uint64
}

const adapterColumns = `adapter_name, job_id, environment_id, capability, environment, agent_version, base_model, uri,
	eval, eval_mean_reward, eval_success_rate, status, simulated, metadata, created_at, updated_at, version`

const adapterSQL = `SELECT ` + adapterColumns + ` FROM adapters WHERE adapter_name = ? ORDER BY version DESC LIMIT 1`

// AdapterFilter selects adapters; zero fields select all.
type AdapterFilter struct {
	Status, Capability, Environment string
	// NotStatus leaves out the adapters with that status.
	NotStatus string
	// JobIDs selects the adapters of these jobs (nil or empty: all).
	JobIDs []string
	// Limit bounds the list (the newest first); 0: no bound.
	Limit int
}

func adaptersSQL(f AdapterFilter) (string, []any) {
	where, args := adaptersWhere(f)
	return latestSQL(adapterColumns, "adapters", where, "created_at DESC, adapter_name", f.Limit), args
}

// adapterCountsSQL is the query of AdapterStatusCounts: the adapters
// adaptersSQL lists without its limit (the newest version of each, the
// same filters), counted by status.
func adapterCountsSQL(f AdapterFilter) (string, []any) {
	where, args := adaptersWhere(f)
	return statusCountsSQL("adapters", where), args
}

// adaptersWhere is the WHERE clause of f's filters ("" for none).
func adaptersWhere(f AdapterFilter) (string, []any) {
	where, args := equalsWhere([][2]string{{"status", f.Status}, {"capability", f.Capability}, {"environment", f.Environment}})
	var more []string
	if f.NotStatus != "" {
		more = append(more, "status != ?")
		args = append(args, f.NotStatus)
	}
	if len(f.JobIDs) > 0 {
		more = append(more, "has(?, job_id)")
		args = append(args, f.JobIDs)
	}
	if len(more) == 0 {
		return where, args
	}
	if where == "" {
		return "\n\tWHERE " + strings.Join(more, " AND "), args
	}
	return where + " AND " + strings.Join(more, " AND "), args
}

// SaveAdapter stores a version of an adapter's record.
func (s *Store) SaveAdapter(ctx context.Context, r AdapterRow) error {
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO adapters ("+adapterColumns+")")
	if err != nil {
		return fmt.Errorf("save adapter: %w", err)
	}
	defer b.Abort()
	now := time.Now().UTC()
	if err := b.Append(r.Name, r.JobID, r.EnvironmentID, r.Capability, r.Environment, r.AgentVersion, r.BaseModel, r.URI,
		r.Eval, r.EvalMeanReward, r.EvalSuccessRate, r.Status, b2u(r.Simulated), r.Metadata, ts(r.CreatedAt, now), ts(r.UpdatedAt, now), r.Version); err != nil {
		return fmt.Errorf("save adapter: %w", err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("save adapter: %w", err)
	}
	return nil
}

// Adapter returns the newest version of an adapter, nil when none.
func (s *Store) Adapter(ctx context.Context, name string) (*AdapterRow, error) {
	rs, err := s.queryAdapters(ctx, adapterSQL, name)
	if err != nil || len(rs) == 0 {
		return nil, err
	}
	return &rs[0], nil
}

// Adapters lists adapters (newest version of each), newest first.
func (s *Store) Adapters(ctx context.Context, f AdapterFilter) ([]AdapterRow, error) {
	q, args := adaptersSQL(f)
	return s.queryAdapters(ctx, q, args...)
}

// JobAdapters returns the adapter each of jobs registered, by job id; a
// job that registered none is absent. See PickJobAdapters.
func (s *Store) JobAdapters(ctx context.Context, jobs []TrainingJobRow) (map[string]AdapterRow, error) {
	if len(jobs) == 0 {
		return map[string]AdapterRow{}, nil
	}
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		ids[i] = j.JobID
	}
	ads, err := s.Adapters(ctx, AdapterFilter{JobIDs: ids})
	if err != nil {
		return nil, err
	}
	return PickJobAdapters(jobs, ads), nil
}

// PickJobAdapters picks each job's adapter among ads (newest first, as
// Adapters lists them): the one registered to the job under its planned
// name (the job's AdapterName, its plan's output.adapter_name), else the
// newest other one registered to the job — a trainer may register the
// adapter under another name (the demo's simulated trainer reports
// sim-<planned name>), and that name is the one trace adapters and the
// router know.
func PickJobAdapters(jobs []TrainingJobRow, ads []AdapterRow) map[string]AdapterRow {
	planned := make(map[string]string, len(jobs))
	for _, j := range jobs {
		planned[j.JobID] = j.AdapterName
	}
	out := map[string]AdapterRow{}
	for _, a := range ads {
		want, ok := planned[a.JobID]
		if !ok {
			continue
		}
		if prev, seen := out[a.JobID]; !seen || (a.Name == want && prev.Name != want) {
			out[a.JobID] = a
		}
	}
	return out
}

// AdapterStatusCounts counts the adapters matching f (their newest
// versions; f.Limit does not apply) by status.
func (s *Store) AdapterStatusCounts(ctx context.Context, f AdapterFilter) (map[string]int, error) {
	q, args := adapterCountsSQL(f)
	out, err := s.statusCounts(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("adapter counts: %w", err)
	}
	return out, nil
}

func (s *Store) queryAdapters(ctx context.Context, q string, args ...any) ([]AdapterRow, error) {
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("adapters: %w", err)
	}
	defer rows.Close()
	var out []AdapterRow
	for rows.Next() {
		var (
			r   AdapterRow
			sim uint8
		)
		if err := rows.Scan(&r.Name, &r.JobID, &r.EnvironmentID, &r.Capability, &r.Environment, &r.AgentVersion, &r.BaseModel, &r.URI,
			&r.Eval, &r.EvalMeanReward, &r.EvalSuccessRate, &r.Status, &sim, &r.Metadata, &r.CreatedAt, &r.UpdatedAt, &r.Version); err != nil {
			return nil, fmt.Errorf("adapters: %w", err)
		}
		r.Simulated = sim == 1
		r.CreatedAt, r.UpdatedAt = r.CreatedAt.UTC(), r.UpdatedAt.UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}
