package analyzer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// LabelingSink is the analyze stage's stream.Sink for rollouts: it labels each
// rollout of a batch against its cohort's dictionary, writes the labels to
// ClickHouse (in one block, or every FlushEvery for the llm labeler), and
// then tells the evaluator which cohorts changed.
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
	// FlushEvery is how often a non-deterministic labeler's labels are
	// written while its batch is in flight (see Write). Default
	// DefaultFlushEvery.
	FlushEvery time.Duration

	chosen  sync.Map   // (env, agent version) -> "scope vN": the last choice logged
	flushMu sync.Mutex // one flush at a time
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

// DefaultFlushEvery is how often LabelingSink makes the LLM labels of a
// batch in flight durable (LabelingSink.FlushEvery).
const DefaultFlushEvery = time.Second

// labeled holds the labels and run records of a batch not yet written.
type labeled struct {
	mu   sync.Mutex
	rows []sink.LabelRow
	runs []sink.LabelRun
}

func (l *labeled) add(rows []sink.LabelRow, runs []sink.LabelRun) {
	l.mu.Lock()
	l.rows, l.runs = append(l.rows, rows...), append(l.runs, runs...)
	l.mu.Unlock()
}

func (l *labeled) take() ([]sink.LabelRow, []sink.LabelRun) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rows, runs := l.rows, l.runs
	l.rows, l.runs = nil, nil
	return rows, runs
}

// Write implements stream.Sink.
//
// A non-deterministic labeler's (llm) labels and run records are written
// as its rollouts are done, every FlushEvery, not only when the whole batch
// is: a batch of thousands of rollouts takes the LLM hours, and a restart,
// a crash or a drain deadline would otherwise lose every answer paid for
// so far (the batch is redelivered, and nothing stored says its runs were
// done). The offsets are still committed only after the whole batch.
//
// When the consumer stops (stream.Stopping), such a labeler's batch is
// given up rather than drained: its model calls start no new attempt (a
// 429's Retry-After, a backoff or a wait for a slot ends at once:
// llm.WithRetryStop), no further rollout is started, the calls in flight
// finish, and each one's answers are written as it finishes (not at the
// next tick: the drain deadline may come first); Write then returns
// stream.ErrStopped, so the batch is not committed, and after the restart
// only the runs not stored are asked. A batch of the llm labeler takes
// minutes, not the drain's seconds, and waiting out a Retry-After held
// every shutdown for the whole drain. A stopped run is not a failed one.
//
// When one rollout finds the endpoint unavailable (ErrLLMUnavailable: a
// refused key, an unknown model, nothing listening), the batch is held
// the same way: no further rollout is started and no call starts another
// attempt (it would fail alike), the calls in flight for the other
// rollouts finish and their answers are written, and Write then returns
// that error, so the batch is not committed and the consumer retries it
// with backoff; the runs not stored are asked once the endpoint answers.
// The other rollouts' calls are not cancelled: their answers are paid for.
func (s *LabelingSink) Write(ctx context.Context, batch []stream.Record[*schemas.Rollout]) error {
	out := &labeled{}
	record := s.Labeler.Runs() > 1 || s.Labeler.Name() == schemas.SourceLLM
	stop := stream.Stopping(ctx)
	if !record {
		stop = nil // a deterministic labeler's batch is quick: it drains
	}
	// halt starts no further rollout and ends the model calls' waits and
	// further attempts: closed at the consumer's stop, or once the
	// endpoint is found unavailable (held).
	halt := make(chan struct{})
	var haltOnce sync.Once
	haltNow := func() { haltOnce.Do(func() { close(halt) }) }
	defer haltNow()
	if stop != nil {
		go func() {
			select {
			case <-stop:
				haltNow()
			case <-halt:
			}
		}()
	}
	ctx = llm.WithRetryStop(ctx, halt)
	var (
		skipped atomic.Bool // rollouts or runs left for the batch's redelivery
		heldMu  sync.Mutex
		held    error // the first ErrLLMUnavailable: the batch waits for the endpoint
	)
	halted := func() bool {
		select {
		case <-stop:
		case <-halt:
		default:
			return false
		}
		skipped.Store(true)
		return true
	}
	if record {
		every := s.FlushEvery
		if every <= 0 {
			every = DefaultFlushEvery
		}
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			t := time.NewTicker(every)
			defer t.Stop()
			warned := false
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					if err := s.flush(ctx, out); err != nil && ctx.Err() == nil && s.Log != nil && !warned {
						warned = true // once a batch: the batch's own write reports it again
						s.Log.Warn("analyzer: writing the labels of a batch in flight failed; kept for its next write", "err", err)
					}
				}
			}
		}()
		defer func() { close(stop); <-done }()
	}
	g, gctx := errgroup.WithContext(ctx)
	limit := s.Concurrency
	if limit <= 0 {
		limit = 8
	}
	g.SetLimit(limit)
	for _, rec := range batch {
		if halted() {
			break
		}
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
			if halted() { // waited for a slot of g meanwhile
				return nil
			}
			// Non-deterministic labelers (llm) consult the store themselves and
			// never label a (rollout, dictionary version, run) twice.
			runs, err := s.Labeler.Label(gctx, d, r)
			// An unavailable endpoint (a refused key, nothing listening)
			// holds the batch: its runs are not recorded as failed, the
			// runs it did answer are kept, and the consumer retries the
			// batch with backoff, committing nothing, until it answers.
			// Runs stopped at shutdown, or by the halt once the endpoint
			// was found unavailable, are left out likewise, and the
			// answered ones kept. Neither returns an error here, which
			// would cancel the other rollouts' calls in flight and lose
			// their answers.
			switch {
			case err == nil:
			case errors.Is(err, ErrLabelingStopped):
				skipped.Store(true)
			case errors.Is(err, ErrLLMUnavailable):
				heldMu.Lock()
				held = cmp.Or(held, fmt.Errorf("label %s: %w; the batch waits for it", r.RolloutID, err))
				heldMu.Unlock()
				haltNow()
			default:
				return fmt.Errorf("label %s: %w", r.RolloutID, err)
			}
			var lrs []sink.LabelRun
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
					lrs = append(lrs, lr)
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
			evs := Events(d, r, s.Labeler.Name(), kept)
			rows := make([]sink.LabelRow, len(evs))
			for i := range evs {
				rows[i] = sink.LabelRowFrom(&evs[i])
			}
			out.add(rows, lrs)
			select {
			case <-stop:
				// Stopping: the drain deadline can come before the next
				// tick, and an answer not written by then is paid for
				// again after the restart. What fails stays for the
				// batch's last write.
				_ = s.flush(ctx, out)
			default:
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		if record && ctx.Err() == nil {
			_ = s.flush(ctx, out) // the answers paid for so far; the batch is retried
		}
		return err
	}
	// Not committed, the answers written: at the stop, a batch with work
	// left is redelivered after the restart; a held one is retried.
	stopping := false
	select {
	case <-stop:
		stopping = true
	default:
	}
	switch {
	case skipped.Load() && stopping:
		return s.flushThen(ctx, out, fmt.Errorf("%w: the labeling runs not done are done after the restart", stream.ErrStopped))
	case held != nil:
		return s.flushThen(ctx, out, held)
	}
	return s.flush(ctx, out)
}

// flushThen writes the answers of a batch that is not committed and
// returns err, why not.
func (s *LabelingSink) flushThen(ctx context.Context, out *labeled, err error) error {
	if ferr := s.flush(ctx, out); ferr != nil {
		return fmt.Errorf("%w; the answers not written are asked again when the batch comes back: %w", err, ferr)
	}
	return err
}

// flush writes the labels and run records not yet written: labels first,
// then the run records, so that a retry after a failure between the two
// finds the runs in capability_labels and does not label them again. What
// fails to be written stays for the next flush.
func (s *LabelingSink) flush(ctx context.Context, out *labeled) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	rows, lrs := out.take()
	if err := writeLabels(ctx, s.Store, s.Evaluator, s.Metrics, s.Labeler.Name(), rows); err != nil {
		out.add(rows, lrs)
		return err
	}
	if len(lrs) == 0 {
		return nil
	}
	if err := s.Store.InsertLabelRuns(ctx, lrs); err != nil {
		out.add(nil, lrs)
		if !sink.IsRetryable(err) {
			return stream.Fatal(err)
		}
		return err
	}
	return nil
}

// LabelEventSink is the stream.Sink of the external label topic
// (trace.labels): events are validated by the decoder and written as they
// are, those without ts placed in time first (Write).
type LabelEventSink struct {
	Store     LabelEventStore
	Evaluator *Evaluator
	Metrics   *Metrics
}

// Write implements stream.Sink.
//
// A label without ts is placed at its rollout's stored time (its end time,
// as the built-in labelers' labels are), read for the whole batch in one
// query, so that the same label published again later (trace labels import
// run again) stays in its rollout's hour and window. One whose rollout is
// not stored (labels arriving before their rollouts) takes its Kafka
// message's timestamp, as a rollout without times does (sink.EventTime),
// which a redelivery keeps. A lookup that fails is retried as an insert
// that fails is: the batch is not committed.
func (s *LabelEventSink) Write(ctx context.Context, batch []stream.Record[*schemas.LabelEvent]) error {
	rows := make([]sink.LabelRow, len(batch))
	var keys []sink.RolloutKey
	seen := map[sink.RolloutKey]bool{}
	for i, rec := range batch {
		rows[i] = sink.LabelRowFrom(rec.Value)
		if k := rolloutKey(&rows[i]); rows[i].TS.IsZero() && !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		times, err := s.Store.RolloutEndTimes(ctx, keys)
		if err != nil {
			err = fmt.Errorf("label events: the times of their rollouts: %w", err)
			if !sink.IsRetryable(err) {
				return stream.Fatal(err)
			}
			return err
		}
		for i, rec := range batch {
			if !rows[i].TS.IsZero() {
				continue
			}
			if t, ok := times[rolloutKey(&rows[i])]; ok {
				rows[i].TS = t
			} else {
				rows[i].TS = sink.EventTime(time.Time{}, time.Time{}, rec.Time)
			}
		}
	}
	return writeLabels(ctx, s.Store, s.Evaluator, s.Metrics, schemas.SourceExternal, rows)
}

// rolloutKey is the stored rollout a label is of.
func rolloutKey(r *sink.LabelRow) sink.RolloutKey {
	return sink.RolloutKey{Environment: r.Environment, AgentVersion: r.AgentVersion, RolloutID: r.RolloutID}
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
