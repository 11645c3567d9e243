package analyzer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// LabelingSink is the analyze stage's stream.Sink for rollouts: it labels each
// rollout of a batch against its cohort's dictionary, writes the labels to
// ClickHouse in one block, and then tells the evaluator which cohorts changed.
//
// Redelivery never changes a statistic: deterministic labelers (rules) give
// the same labels again, which the tables deduplicate; the llm labeler is not
// called again for runs already stored (LLMLabelerConfig.AlreadyLabeled, wired
// to sink.StoredRuns).
type LabelingSink struct {
	Labeler     Labeler
	Registry    *Registry
	Store       LabelStore
	Evaluator   *Evaluator // may be nil
	Concurrency int        // rollouts labeled at once; default 8
	Log         *slog.Logger
	Metrics     *Metrics
	// ShouldLabel, when set, samples rollouts (per outcome); nil labels all.
	ShouldLabel func(*schemas.Rollout) bool
	// OnMissingDictionary is called for a rollout whose cohort has no
	// dictionary of its own (for example to schedule discovery): none at
	// all, and the rollout is skipped, or only the default (environment
	// "*"), which labels it meanwhile.
	OnMissingDictionary func(env, agentVersion string)

	chosen sync.Map // (env, agent version) -> "scope vN": the last choice logged
}

// logChoice logs, once per cohort and dictionary, which dictionary labels
// it and why.
func (s *LabelingSink) logChoice(env, agentVersion string, d *Dictionary) {
	if s.Log == nil {
		return
	}
	k := [2]string{env, agentVersion}
	choice := fmt.Sprintf("%s v%d", d.Scope(), d.Version)
	if prev, loaded := s.chosen.Swap(k, choice); loaded && prev == choice {
		return
	}
	why := "its own dictionary"
	switch {
	case d.IsDefault():
		why = "the default dictionary: no dictionary of its own (write one and `trace dict apply FILE --backfill`, or configure analyzer.labeler: llm and llm.base_url for discovery)"
	case d.AgentVersion == AnyVersion && agentVersion != AnyVersion:
		why = "its environment's dictionary for every agent version"
	}
	s.Log.Info("analyzer: dictionary chosen for cohort", "environment", env, "agent_version", agentVersion,
		"dictionary", d.Scope(), "dictionary_version", d.Version, "source", d.Source, "why", why)
}

// Write implements stream.Sink.
func (s *LabelingSink) Write(ctx context.Context, batch []stream.Record[*schemas.Rollout]) error {
	events := make([][]schemas.LabelEvent, len(batch))
	runRecs := make([][]sink.LabelRun, len(batch))
	record := s.Labeler.Runs() > 1 || s.Labeler.Name() == schemas.SourceLLM
	g, gctx := errgroup.WithContext(ctx)
	limit := s.Concurrency
	if limit <= 0 {
		limit = 8
	}
	g.SetLimit(limit)
	for i, rec := range batch {
		r := rec.Value
		r.EndTime = sink.EventTime(r.EndTime, r.StartTime, rec.Time) // as the ingest stage stores it
		d := s.Registry.Resolve(r.Environment, r.Agent.Version)
		if (d == nil || d.IsDefault()) && s.OnMissingDictionary != nil {
			s.OnMissingDictionary(r.Environment, r.Agent.Version)
		}
		if d == nil {
			continue
		}
		s.logChoice(r.Environment, r.Agent.Version, d)
		if s.Evaluator != nil {
			s.Evaluator.ObserveTools(r.Environment, r.Agent.Version, r.Tools)
		}
		if s.ShouldLabel != nil && !s.ShouldLabel(r) {
			continue
		}
		g.Go(func() error {
			// Non-deterministic labelers (llm) consult the store themselves and
			// never label a (rollout, dictionary version, run) twice.
			runs, err := s.Labeler.Label(gctx, d, r)
			if err != nil {
				return fmt.Errorf("label %s: %w", r.RolloutID, err)
			}
			kept := runs[:0]
			for _, rl := range runs {
				// Every failed run is recorded (trace report says why a
				// cohort has no labels); valid runs of non-deterministic
				// labelers too, so that they are never labeled twice.
				if record || rl.Failed != "" {
					lr := sink.LabelRun{Environment: r.Environment, AgentVersion: r.Agent.Version, DictionaryVersion: d.Version,
						RolloutID: r.RolloutID, Run: uint16(rl.Run), Labeler: s.Labeler.Name(), Status: "ok", Reason: rl.Failed, At: r.EndTime}
					if rl.Failed != "" {
						lr.Status = "failed"
					}
					runRecs[i] = append(runRecs[i], lr)
				}
				if rl.Failed != "" {
					s.Metrics.runFailed(s.Labeler.Name())
					if s.Log != nil {
						s.Log.Warn("analyzer: labeling run failed; no labels recorded for it", "rollout", r.RolloutID, "run", rl.Run, "reason", rl.Failed)
					}
					continue
				}
				kept = append(kept, rl)
			}
			events[i] = Events(d, r, s.Labeler.Name(), kept)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	var rows []sink.LabelRow
	for _, evs := range events {
		for i := range evs {
			rows = append(rows, sink.LabelRowFrom(&evs[i]))
		}
	}
	// Labels first, then the run records: a retry after a failure between
	// the two finds the runs in capability_labels and does not label again.
	if err := writeLabels(ctx, s.Store, s.Evaluator, s.Metrics, s.Labeler.Name(), rows); err != nil {
		return err
	}
	var lrs []sink.LabelRun
	for _, r := range runRecs {
		lrs = append(lrs, r...)
	}
	if err := s.Store.InsertLabelRuns(ctx, lrs); err != nil {
		if !sink.IsRetryable(err) {
			return stream.Fatal(err)
		}
		return err
	}
	return nil
}

// LabelEventSink is the stream.Sink of the external label topic
// (trace.labels): events are validated by the decoder and written as they are.
type LabelEventSink struct {
	Store     LabelStore
	Evaluator *Evaluator
	Metrics   *Metrics
}

// Write implements stream.Sink.
func (s *LabelEventSink) Write(ctx context.Context, batch []stream.Record[*schemas.LabelEvent]) error {
	rows := make([]sink.LabelRow, len(batch))
	for i, rec := range batch {
		rows[i] = sink.LabelRowFrom(rec.Value)
	}
	return writeLabels(ctx, s.Store, s.Evaluator, s.Metrics, schemas.SourceExternal, rows)
}

func writeLabels(ctx context.Context, st LabelStore, ev *Evaluator, m *Metrics, source string, rows []sink.LabelRow) error {
	if len(rows) == 0 {
		return nil
	}
	if err := st.InsertLabels(ctx, rows); err != nil {
		if !sink.IsRetryable(err) {
			return stream.Fatal(err)
		}
		return err
	}
	m.wroteLabels(source, len(rows))
	if ev != nil {
		seen := map[sink.Cohort]bool{}
		var cohorts []sink.Cohort
		for _, r := range rows {
			c := sink.Cohort{Environment: r.Environment, AgentVersion: r.AgentVersion, DictionaryVersion: r.DictionaryVersion}
			if !seen[c] {
				seen[c] = true
				cohorts = append(cohorts, c)
			}
		}
		ev.Touch(cohorts...)
	}
	return nil
}
