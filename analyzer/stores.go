package analyzer

import (
	"context"
	"time"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// The analyzer's storage, as the interfaces it consumes; *sink.Store
// implements all of them (checked below). Each is safe for concurrent use.

// EvaluatorStore is what the Evaluator reads and writes: the window
// statistics of cohorts, their tools, and the trigger history it rebuilds
// its state from and appends to.
type EvaluatorStore interface {
	Cohorts(ctx context.Context, since time.Time) ([]sink.Cohort, error)
	// ChangedCohorts are the (environment, agent version)s with labels
	// written (by any process) since a time.
	ChangedCohorts(ctx context.Context, since time.Time) (map[[2]string]bool, error)
	// CohortTools are the target's tool schemas of (environment, agent
	// version)s: their newest rollout's that declared any.
	CohortTools(ctx context.Context, keys [][2]string) (map[[2]string][]schemas.Tool, error)
	// The cohorts' event-time windows (back from their watermarks), their
	// statistics, and RecentLabels, what a window read of each costs (the
	// periodic tick sizes its rounds by it too).
	WindowReader
	TriggerHistory(ctx context.Context) ([]sink.TriggerEvent, error)
	InsertTriggerEvents(ctx context.Context, evs []sink.TriggerEvent) error
	// SaveEvaluations records what each evaluation decided.
	SaveEvaluations(ctx context.Context, evs []sink.StoredEvaluation) error
}

// LabelStore is where the labeling sinks write labels and labeling runs.
type LabelStore interface {
	InsertLabels(ctx context.Context, rows []sink.LabelRow) error
	InsertLabelRuns(ctx context.Context, runs []sink.LabelRun) error
}

// LabelEventStore is what the LabelEventSink writes labels to, and where it
// reads the times of their rollouts.
type LabelEventStore interface {
	LabelStore
	// RolloutEndTimes are the stored end times of rollouts, one query for
	// all of them; a rollout not stored is absent.
	RolloutEndTimes(ctx context.Context, keys []sink.RolloutKey) (map[sink.RolloutKey]time.Time, error)
}

// DiscoveryStore is what the DiscoveryRunner reads: cohorts, their
// unexplained failures, and sample rollouts.
type DiscoveryStore interface {
	Cohorts(ctx context.Context, since time.Time) ([]sink.Cohort, error)
	Watermarks(ctx context.Context, cohorts []sink.Cohort) (map[sink.Cohort]time.Time, error)
	UnexplainedFailures(ctx context.Context, c sink.Cohort, since time.Time) (failures, unexplained int, err error)
	SampleRollouts(ctx context.Context, env, agentVersion string, n int) ([]*schemas.Rollout, error)
}

// BackfillStore is what a Backfill reads (the stored rollouts and the runs
// already labeled) and writes (through the labeling sink).
type BackfillStore interface {
	LabelStore
	RolloutScopes(ctx context.Context) ([]sink.RolloutScope, error)
	StoredRollouts(ctx context.Context, env, agentVersion string, since time.Time) ([]sink.StoredRollout, error)
	LabeledRuns(ctx context.Context, c sink.Cohort) (map[string]int, error)
	CompactedRollouts(ctx context.Context, env, agentVersion string, ids []string) (map[string]*schemas.Rollout, error)
}

var (
	_ BackfillStore   = (*sink.Store)(nil)
	_ EvaluatorStore  = (*sink.Store)(nil)
	_ LabelStore      = (*sink.Store)(nil)
	_ LabelEventStore = (*sink.Store)(nil)
	_ DiscoveryStore  = (*sink.Store)(nil)
	_ DictionaryStore = (*sink.Store)(nil)
)
