package analyzer

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// EvalConfig configures the rolling evaluation and the trigger.
type EvalConfig struct {
	Rho   float64 `koanf:"rho"`   // default 0.10
	Delta float64 `koanf:"delta"` // default 0.20
	// K and N: a capability is selected when it passes in at least K of N
	// labeling runs. Only rollouts labeled in all N runs take part (see
	// sink.WindowSpec.Runs). Set, they apply to every cohort; unset (0),
	// each cohort's follow the source of its labels (KOfN): the rules
	// labeler's 1 of 1 (one deterministic run), the llm labeler's 8/10 of
	// llm.runs (LLMRuns), 8 of 10 for external labels.
	K int `koanf:"k"` // default 0: the cohort's
	N int `koanf:"n"` // default 0: the cohort's
	// LLMRuns is llm.runs, the N of the llm labeler's cohorts when N is
	// unset (0: 10). config.Load sets it.
	LLMRuns int `koanf:"-"`
	// Window: a cohort's rollouts that ended within Window of its
	// watermark (the end time of its newest labeled rollout: event time,
	// not the wall clock), and, when WindowRollouts > 0, only the
	// WindowRollouts of them that ended last.
	Window         time.Duration `koanf:"window"`          // default 24h
	WindowRollouts int           `koanf:"window_rollouts"` // default 0 (all in the time window)
	MinFailures    int           `koanf:"min_failures"`    // default 20: no decision below
	RearmAfter     time.Duration `koanf:"rearm_after"`     // default 1h deselected before re-arming
	Interval       time.Duration `koanf:"interval"`        // default 10s: periodic re-evaluation of every cohort
	// A changed cohort is evaluated once its labels have been quiet for
	// Settle, or MaxDelay after its first unevaluated change, whichever
	// comes first: a burst of label batches (an import, a backlog) is
	// decided on as a whole, and a steady stream still within MaxDelay.
	Settle   time.Duration `koanf:"settle"`    // default 300ms
	MaxDelay time.Duration `koanf:"max_delay"` // default 1s
}

// WithDefaults fills unset fields.
func (c EvalConfig) WithDefaults() EvalConfig {
	c.Rho = cmp.Or(c.Rho, DefaultThresholds.Rho)
	c.Delta = cmp.Or(c.Delta, DefaultThresholds.Delta)
	c.LLMRuns = cmp.Or(c.LLMRuns, DefaultRuns)
	c.Window = cmp.Or(c.Window, 24*time.Hour)
	c.MinFailures = cmp.Or(c.MinFailures, 20)
	c.RearmAfter = cmp.Or(c.RearmAfter, time.Hour)
	c.Interval = cmp.Or(c.Interval, 10*time.Second)
	c.Settle = cmp.Or(c.Settle, 300*time.Millisecond)
	c.MaxDelay = cmp.Or(c.MaxDelay, time.Second)
	return c
}

// Validate names the first bad field.
func (c EvalConfig) Validate() error {
	// K unset (0) is each cohort's, at least 1.
	if err := (Thresholds{c.Rho, c.Delta, cmp.Or(c.K, 1)}).Validate(); err != nil {
		return fmt.Errorf("analyzer.%w", err) // "analyzer.rho must be …"
	}
	switch {
	case c.N < 0:
		return fmt.Errorf("analyzer.n: must be at least 1, or 0 for each cohort's labeling runs; got %d", c.N)
	case c.N > 0 && c.N < c.K:
		return fmt.Errorf("analyzer.n: %d is less than analyzer.k %d", c.N, c.K)
	case c.Window < 0:
		return fmt.Errorf("analyzer.window: must be positive")
	case c.WindowRollouts < 0:
		return fmt.Errorf("analyzer.window_rollouts: must be >= 0")
	case c.MinFailures < 1:
		return fmt.Errorf("analyzer.min_failures: must be >= 1")
	case c.RearmAfter < 0:
		return fmt.Errorf("analyzer.rearm_after: must be >= 0")
	}
	return nil
}

// Publisher delivers synthesis requests exactly once per trigger id. A
// returned error means the request may not be delivered: the evaluator keeps
// the trigger pending and retries. (internal/bus's Bus does this over NATS
// JetStream; the wiring adapts it, see app.BusPublisher.)
type Publisher interface {
	PublishSynthesis(ctx context.Context, req *schemas.SynthesisRequest) (PublishResult, error)
}

// PublishResult says what a Publisher did with a request.
type PublishResult struct {
	Published bool // a new message is in the stream
	Duplicate bool // the stream had it already (same message id within the window)
	Claimed   bool // another publisher had published it earlier
	// Stored is the request as the stream holds it when it was there
	// already (nil when unknown): its trigger record is written from it,
	// so that trigger_events says what was requested, not this replica's
	// later recomputation.
	Stored *schemas.SynthesisRequest
}

// PublisherFunc adapts a function to a Publisher.
type PublisherFunc func(ctx context.Context, req *schemas.SynthesisRequest) (PublishResult, error)

// PublishSynthesis calls f.
func (f PublisherFunc) PublishSynthesis(ctx context.Context, req *schemas.SynthesisRequest) (PublishResult, error) {
	return f(ctx, req)
}

// Evaluator recomputes the window statistics of cohorts whose labels changed
// (and of every recent cohort periodically), drives the trigger state
// machines, and publishes synthesis requests. Its state is rebuilt from
// ClickHouse trigger_events at start, so replicas and restarts agree.
type Evaluator struct {
	cfg   EvalConfig
	store EvaluatorStore
	pub   Publisher
	reg   *Registry
	log   *slog.Logger
	now   func() time.Time
	met   *Metrics

	mu       sync.Mutex
	dirty    map[sink.Cohort]dirtySpan // unevaluated changes per cohort
	wake     chan struct{}
	triggers map[TriggerKey]Trigger
	last     map[sink.Cohort][]Result
	// evalAt is when each cohort was last evaluated, and tickFrom the
	// ingest time the next periodic tick reads changes from.
	evalAt   map[sink.Cohort]time.Time
	tickFrom time.Time
	// background are the periodic tick's cohorts not evaluated yet: taken
	// backgroundBatch at a time, only when no touched cohort is due, so a
	// long tick never holds up the triggers of new labels.
	background []sink.Cohort
	queued     map[sink.Cohort]bool
	// cost is each cohort's estimated window size in labels (the last
	// tick's RecentLabels): a background round stops at backgroundBudget.
	cost    map[sink.Cohort]uint64
	tools   map[[2]string][]schemas.Tool // (env, agent version) -> the target's tool schemas
	noTools map[[2]string]time.Time      // cohorts whose rollouts had no tools, when last looked up
	skewed  map[sink.Cohort]bool         // cohorts warned of a watermark in the future
}

// NewEvaluator builds an evaluator. Call Recover before Run.
func NewEvaluator(cfg EvalConfig, st EvaluatorStore, pub Publisher, reg *Registry, log *slog.Logger, m *Metrics) *Evaluator {
	if log == nil {
		log = slog.Default()
	}
	return &Evaluator{cfg: cfg.WithDefaults(), store: st, pub: pub, reg: reg, log: log, now: time.Now, met: m,
		dirty: map[sink.Cohort]dirtySpan{}, wake: make(chan struct{}, 1), triggers: map[TriggerKey]Trigger{}, last: map[sink.Cohort][]Result{}, evalAt: map[sink.Cohort]time.Time{}, queued: map[sink.Cohort]bool{}, cost: map[sink.Cohort]uint64{}, tools: map[[2]string][]schemas.Tool{}, noTools: map[[2]string]time.Time{}, skewed: map[sink.Cohort]bool{}}
}

// Recover rebuilds every trigger from trigger_events.
func (e *Evaluator) Recover(ctx context.Context) error {
	hist, err := e.store.TriggerHistory(ctx)
	if err != nil {
		return err
	}
	byKey := map[TriggerKey][]RecordedAction{}
	for _, h := range hist {
		k := TriggerKey{h.Environment, h.AgentVersion, h.DictionaryVersion, h.Capability}
		byKey[k] = append(byKey[k], RecordedAction{Action(h.Event), h.Epoch, h.At})
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, evs := range byKey {
		e.triggers[k] = Replay(evs)
	}
	if len(byKey) > 0 {
		e.log.Info("analyzer: trigger state recovered from clickhouse", "triggers", len(byKey))
	}
	return nil
}

// Touch marks cohorts as changed; Run evaluates them promptly.
func (e *Evaluator) Touch(cohorts ...sink.Cohort) {
	e.mu.Lock()
	now := e.now()
	for _, c := range cohorts {
		d, ok := e.dirty[c]
		if !ok {
			d.first = now
		}
		d.last = now
		e.dirty[c] = d
	}
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Run evaluates touched cohorts as they come and, each Interval, the
// cohorts tickCohorts names (in rounds behind the touched ones), until ctx
// ends. A failing evaluation (ClickHouse
// or NATS down) is retried with backoff and never drops a pending trigger.
func (e *Evaluator) Run(ctx context.Context) error {
	tick := time.NewTicker(e.cfg.Interval)
	defer tick.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.wake:
		case <-timer.C:
		case <-tick.C:
			cohorts, err := e.tickCohorts(ctx)
			if err != nil {
				e.log.Warn("analyzer: list cohorts", "err", err)
				continue
			}
			e.queueBackground(cohorts)
		}
		due, next := e.due()
		if len(due) == 0 {
			due = e.takeBackground()
		}
		if e.backgroundLeft() {
			next = 0 // more of the tick's cohorts after this round
		}
		timer.Reset(next)
		if len(due) == 0 {
			continue
		}
		cohorts := make([]sink.Cohort, len(due))
		for i, d := range due {
			cohorts[i] = d.cohort
		}
		err := backoff.Retry(func() error {
			err := e.Evaluate(ctx, cohorts...)
			if err != nil && ctx.Err() == nil {
				e.log.Warn("analyzer: evaluation failed, retrying", "cohorts", len(cohorts), "err", err)
				e.met.evalFailed()
			}
			return err
		}, backoff.WithContext(capped(200*time.Millisecond, 5*time.Second), ctx))
		if err != nil {
			return nil // ctx ended
		}
		for _, d := range due {
			e.met.observeEval(e.now().Sub(d.first))
		}
	}
}

// sweepPerTick is how many cohorts without new labels a periodic tick
// evaluates again (the least recently evaluated first), so that every
// cohort's time-based transitions (rearm_after) still happen.
const sweepPerTick = 200

// tickCohorts are the cohorts a periodic tick evaluates: whatever their age
// (windows follow event time, and labels may have been written by another
// process, a backfill), those with labels written since the last tick (any
// process's), those this evaluator never evaluated, and sweepPerTick of the
// others. Evaluating every cohort at every tick cost one window read per
// cohort: with thousands of cohorts a tick took longer than the interval and
// held up the triggers of new labels.
func (e *Evaluator) tickCohorts(ctx context.Context) ([]sink.Cohort, error) {
	cohorts, err := e.store.Cohorts(ctx, time.Time{})
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	from := e.tickFrom
	e.mu.Unlock()
	start := e.now()
	var changed map[[2]string]bool
	if !from.IsZero() {
		// A margin for writers' clocks and inserts in flight.
		if changed, err = e.store.ChangedCohorts(ctx, from.Add(-time.Minute)); err != nil {
			return nil, err
		}
	}
	// What each cohort's window read costs, so that one large cohort
	// does not make a background round long. An estimate: without it
	// the rounds are as long as backgroundBatch makes them.
	cost, err := e.store.RecentLabels(ctx, start.Add(-e.cfg.Window-time.Hour))
	if err != nil {
		e.log.Warn("analyzer: window sizes for the periodic tick", "err", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tickFrom = start
	if err == nil {
		e.cost = cost
	}
	var out, rest []sink.Cohort
	for _, c := range cohorts {
		if _, seen := e.evalAt[c]; from.IsZero() || !seen || changed[[2]string{c.Environment, c.AgentVersion}] {
			out = append(out, c)
		} else {
			rest = append(rest, c)
		}
	}
	sort.Slice(rest, func(i, j int) bool { return e.evalAt[rest[i]].Before(e.evalAt[rest[j]]) })
	return append(out, rest[:min(len(rest), sweepPerTick)]...), nil
}

// queueBackground adds the periodic tick's cohorts to the background queue.
func (e *Evaluator) queueBackground(cohorts []sink.Cohort) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range cohorts {
		if !e.queued[c] {
			e.queued[c] = true
			e.background = append(e.background, c)
		}
	}
}

// backgroundBatch is how many of the tick's cohorts one round evaluates
// at most, and backgroundBudget how many labels (estimated) their windows
// hold together at most, unless one cohort alone holds more: small, so that
// a touched cohort waits for one short round at most. (At 10M rollouts
// stored, six cohorts with 90k labels each in their windows made a round
// of 0.7 s.)
const (
	backgroundBatch  = 25
	backgroundBudget = 50_000
)

// roundSize is how many of the queue's first cohorts one background round
// takes: at least one, at most backgroundBatch, and no more than fit in
// backgroundBudget labels by cost.
func roundSize(queue []sink.Cohort, cost map[sink.Cohort]uint64) int {
	var sum uint64
	for n, c := range queue {
		if n == backgroundBatch || (n > 0 && sum+cost[c] > backgroundBudget) {
			return n
		}
		sum += cost[c]
	}
	return len(queue)
}

// takeBackground takes the next round of the background queue (roundSize),
// as due now.
func (e *Evaluator) takeBackground() []dueCohort {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := roundSize(e.background, e.cost)
	now := e.now()
	out := make([]dueCohort, n)
	for i, c := range e.background[:n] {
		out[i] = dueCohort{c, now}
		delete(e.queued, c)
	}
	e.background = e.background[n:]
	return out
}

func (e *Evaluator) backgroundLeft() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.background) > 0
}

type dirtySpan struct{ first, last time.Time }

type dueCohort struct {
	cohort sink.Cohort
	first  time.Time
}

// due takes the cohorts whose changes have settled (or waited MaxDelay) out
// of the dirty set, and returns how long until the next one is due.
func (e *Evaluator) due() ([]dueCohort, time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	next := time.Hour
	var out []dueCohort
	for c, d := range e.dirty {
		at := d.last.Add(e.cfg.Settle)
		if lim := d.first.Add(e.cfg.MaxDelay); lim.Before(at) {
			at = lim
		}
		if !at.After(now) {
			out = append(out, dueCohort{c, d.first})
			delete(e.dirty, c)
			continue
		}
		next = min(next, at.Sub(now))
	}
	return out, next
}

func capped(initial, maxI time.Duration) backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = initial, maxI, 0
	return b
}

// ObserveTools remembers the tool schemas a cohort's agent had, as seen on
// a rollout by the labeling stage; synthesis requests carry them. Cohorts
// whose labels come from outside fall back to the rollouts table.
func (e *Evaluator) ObserveTools(env, agentVersion string, tools []schemas.Tool) {
	if len(tools) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	k := [2]string{env, agentVersion}
	if len(e.tools[k]) < len(tools) {
		e.tools[k] = tools
	}
}

// lookupTools reads, in one statement per 200, the tools of the cohorts
// whose tools are neither known nor found missing in the last minute (one
// statement per fired cohort, in turn, made a thousand new cohorts a minute
// seconds of every trigger's wait). cohortTools then answers from what it
// found.
func (e *Evaluator) lookupTools(ctx context.Context, cohorts []sink.Cohort) error {
	now := e.now()
	var keys [][2]string
	seen := map[[2]string]bool{}
	e.mu.Lock()
	for _, c := range cohorts {
		k := [2]string{c.Environment, c.AgentVersion}
		if seen[k] || len(e.tools[k]) > 0 || now.Sub(e.noTools[k]) < time.Minute {
			continue
		}
		seen[k] = true
		keys = append(keys, k)
	}
	e.mu.Unlock()
	if len(keys) == 0 {
		return nil
	}
	found, err := e.store.CohortTools(ctx, keys)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range keys {
		if t := found[k]; len(t) > 0 {
			e.tools[k] = t
		} else {
			e.noTools[k] = now
		}
	}
	return nil
}

// cohortTools are the target's tool schemas of the cohort, as lookupTools
// or ObserveTools last saw them (nil: its rollouts declared none).
func (e *Evaluator) cohortTools(c sink.Cohort) []schemas.Tool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tools[[2]string{c.Environment, c.AgentVersion}]
}

// Snapshot returns the latest evaluation results per cohort.
func (e *Evaluator) Snapshot() map[sink.Cohort][]Result {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[sink.Cohort][]Result, len(e.last))
	for k, v := range e.last {
		out[k] = v
	}
	return out
}

// Evaluate computes the window statistics of cohorts (two queries for all
// of them) and applies their triggers.
func (e *Evaluator) Evaluate(ctx context.Context, cohorts ...sink.Cohort) error {
	now := e.now()
	// Each cohort's window follows its own event time: it ends at the
	// cohort's watermark (its newest labeled rollout's end time), not at the
	// wall clock, so replayed history decides as it did live.
	w, err := ReadWindows(ctx, e.store, cohorts, e.cfg)
	if err != nil {
		return err
	}
	spec, marks, infos, counts := w.Spec, w.Marks, w.Infos, w.Counts
	e.warnFuture(now, marks)
	if err := e.lookupTools(ctx, cohorts); err != nil {
		return err
	}
	// Transitions are recorded in one insert for all cohorts; the state
	// machines advance only after it succeeded. A failure anywhere leaves
	// them as they were, and the retry publishes again with the same Msg-Ids
	// (deduplicated) and records again.
	var evs []sink.TriggerEvent
	var steps []transition
	stored := make([]sink.StoredEvaluation, 0, len(cohorts))
	for _, c := range cohorts {
		ce, cs, ev, err := e.apply(ctx, now, spec.Ranges[c], c, w.KOfN[c], infos[c], counts[c])
		evs, steps = append(evs, ce...), append(steps, cs...)
		if err != nil {
			return err
		}
		ev.AsOf = marks[c]
		b, err := json.Marshal(ev)
		if err != nil {
			return fmt.Errorf("evaluation of %s: %w", c, err)
		}
		stored = append(stored, sink.StoredEvaluation{Cohort: c, EvaluatedNs: uint64(now.UnixNano()), Payload: string(b)})
	}
	if err := e.store.InsertTriggerEvents(ctx, evs); err != nil {
		return err
	}
	// What was decided, for the dashboard and the report (a failure is
	// retried with the rest: the transitions above are idempotent).
	if err := e.store.SaveEvaluations(ctx, stored); err != nil {
		return err
	}
	e.mu.Lock()
	for _, st := range steps {
		e.triggers[st.key] = st.next
	}
	e.mu.Unlock()
	return nil
}

// Evaluation is one evaluation of a cohort as the evaluator made it: its
// window by event time (back from the cohort's watermark, AsOf), the
// window's labeled rollouts and failures, the complete labeling runs, the
// cohort's K of N, whether that is enough to decide (min_failures, N), and
// every capability's statistics and decision. The evaluator stores each one
// (sink.StoredEvaluation, JSON) for the dashboard and `trace report`.
type Evaluation struct {
	EvaluatedAt time.Time `json:"evaluated_at"`
	AsOf        time.Time `json:"as_of"`
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	Rollouts    int       `json:"rollouts"`
	Failures    int       `json:"failures"`
	Runs        int       `json:"runs"`
	// KOfN is the cohort's K of N the decision was made with (zero in
	// evaluations stored before it was recorded).
	KOfN
	Decided bool     `json:"decided"`
	Results []Result `json:"results"`
	// Counts are the window's label counts per capability and run (the
	// capability page's per-run table).
	Counts []sink.RunCounts `json:"counts"`
}

// ParseEvaluation reads a stored evaluation (sink.StoredEvaluation.Payload,
// as Evaluate writes it).
func ParseEvaluation(payload string) (Evaluation, error) {
	var ev Evaluation
	if err := json.Unmarshal([]byte(payload), &ev); err != nil {
		return ev, fmt.Errorf("stored evaluation: %w", err)
	}
	return ev, nil
}

// FutureSkew is how far ahead of the wall clock a watermark may be before
// the evaluator warns of clock skew (the window still follows it).
const FutureSkew = 5 * time.Minute

// warnFuture logs, once per cohort, a watermark ahead of the wall clock.
func (e *Evaluator) warnFuture(now time.Time, marks map[sink.Cohort]time.Time) {
	for c, wm := range marks {
		if wm.Sub(now) <= FutureSkew {
			continue
		}
		e.mu.Lock()
		seen := e.skewed[c]
		e.skewed[c] = true
		e.mu.Unlock()
		if !seen {
			e.log.Warn("analyzer: a rollout ends in the future (clock skew?); the cohort's window ends at it", "cohort", c.String(),
				"watermark", wm.Format(time.RFC3339), "ahead", wm.Sub(now).Round(time.Second).String())
		}
	}
}

type transition struct {
	key  TriggerKey
	next Trigger
}

// apply runs one cohort's triggers on its window statistics.
func (e *Evaluator) apply(ctx context.Context, now time.Time, win sink.Range, c sink.Cohort, kn KOfN, info sink.WindowInfo, counts []sink.RunCounts) (evs []sink.TriggerEvent, steps []transition, eval Evaluation, err error) {
	dict := e.reg.Version(c.Environment, c.AgentVersion, c.DictionaryVersion)
	inputs, runs := CohortInputs(counts, dict)
	results := Select(inputs, Thresholds{Rho: e.cfg.Rho, Delta: e.cfg.Delta, K: kn.K})
	// K of N needs N runs: with fewer complete runs there is no decision.
	decided := info.Failures >= e.cfg.MinFailures && runs >= kn.N
	e.mu.Lock()
	e.last[c] = results
	e.evalAt[c] = now
	e.mu.Unlock()
	eval = Evaluation{EvaluatedAt: now.UTC(), WindowStart: win.From.UTC(), WindowEnd: win.To.UTC(), Rollouts: info.Rollouts,
		Failures: info.Failures, Runs: runs, KOfN: kn, Decided: decided, Results: results, Counts: counts}

	var tools []schemas.Tool
	rank := 0
	for _, r := range results {
		if r.Selected {
			rank++
		}
		k := TriggerKey{c.Environment, c.AgentVersion, c.DictionaryVersion, r.Name}
		e.mu.Lock()
		cur := e.triggers[k]
		e.mu.Unlock()
		next, act := cur.Observe(now, decided, r.Selected, e.cfg.RearmAfter)
		if act == ActNone {
			continue
		}
		ev := sink.TriggerEvent{
			TriggerID: TriggerID(k, next.Epoch), Environment: c.Environment, AgentVersion: c.AgentVersion,
			DictionaryVersion: c.DictionaryVersion, Capability: r.Name, Epoch: next.Epoch, Event: string(act), At: now,
			MeanCov: r.MeanCov, MeanDelta: r.MeanDelta, RunsPassed: uint16(r.RunsPassed), RunsTotal: uint16(r.RunsTotal),
			Window: schemas.Window{Start: win.From, End: win.To, Rollouts: info.Rollouts, Failures: info.Failures},
		}
		if act == ActFire {
			if tools == nil {
				tools = e.cohortTools(c)
			}
			req := &schemas.SynthesisRequest{
				TriggerID: ev.TriggerID, Environment: c.Environment, AgentVersion: c.AgentVersion,
				DictionaryVersion: c.DictionaryVersion, Epoch: next.Epoch, Capability: r.Record(), Rank: rank,
				Window: ev.Window, ExampleFailedRolloutIDs: r.Examples, Tools: tools, FiredAt: now,
			}
			res, err := e.pub.PublishSynthesis(ctx, req)
			if err != nil {
				return evs, steps, eval, err // state unchanged: the next attempt publishes again with the same Msg-Id
			}
			if st := res.Stored; st != nil && st.TriggerID == req.TriggerID {
				// Another replica (or this one's earlier attempt, whose
				// record failed) requested it: record that request.
				req = st
				ev.At, ev.Window = st.FiredAt, st.Window
				ev.MeanCov, ev.MeanDelta = st.Capability.MeanCov, st.Capability.MeanDelta
				ev.RunsPassed, ev.RunsTotal = uint16(st.Capability.NRunsPassed), uint16(st.Capability.NRunsTotal)
			}
			b, _ := json.Marshal(req)
			ev.Payload = string(b)
			e.log.Info("analyzer: capability selected, synthesis requested", "cohort", c.String(), "capability", r.Name,
				"mean_cov", round4(r.MeanCov), "mean_delta", round4(r.MeanDelta), "runs_passed", fmt.Sprintf("%d/%d", r.RunsPassed, r.RunsTotal),
				"epoch", next.Epoch, "duplicate", res.Duplicate || res.Claimed)
			// Counted where a new message entered the stream: a retry
			// (the record failed after the publication) or another
			// replica gets a duplicate and counts nothing.
			if res.Published {
				e.met.fired(c.Environment, r.Name)
			}
		}
		evs = append(evs, ev)
		steps = append(steps, transition{k, next})
	}
	return evs, steps, eval, nil
}

func round4(f float64) float64 { return math.Round(f*1e4) / 1e4 }

// CohortInputs groups window counts per capability into selection inputs,
// runs in run order, and returns the largest number of runs seen. Capability
// descriptions come from the dictionary when it is known.
func CohortInputs(counts []sink.RunCounts, dict *Dictionary) ([]CapabilityRuns, int) {
	byCap := map[string][]sink.RunCounts{}
	for _, rc := range counts {
		byCap[rc.Capability] = append(byCap[rc.Capability], rc)
	}
	names := make([]string, 0, len(byCap))
	for n := range byCap {
		names = append(names, n)
	}
	sort.Strings(names)
	maxRuns := 0
	out := make([]CapabilityRuns, 0, len(names))
	for _, n := range names {
		rcs := byCap[n]
		sort.Slice(rcs, func(i, j int) bool { return rcs[i].Run < rcs[j].Run })
		cr := CapabilityRuns{Name: n}
		if dict != nil {
			if c, ok := dict.Lookup(n); ok {
				cr.Description = c.Definition
			}
		}
		for _, rc := range rcs {
			cr.Runs = append(cr.Runs, RunInput{
				Counts:           Counts{rc.LackingFailed, rc.PresentFailed, rc.NAFailed, rc.LackingPassed, rc.PresentPassed, rc.NAPassed},
				LackingFailedIDs: rc.LackingFailedFirst,
			})
		}
		maxRuns = max(maxRuns, len(cr.Runs))
		out = append(out, cr)
	}
	return out, maxRuns
}

// Metrics of the analyzer.
type Metrics struct {
	triggers   *prometheus.CounterVec
	evalLag    prometheus.Histogram
	evalFails  prometheus.Counter
	labels     *prometheus.CounterVec
	runsFailed *prometheus.CounterVec
}

// NewMetrics registers the analyzer's metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		triggers: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "trace", Subsystem: "analyzer", Name: "triggers_fired_total",
			Help: "Synthesis requests published: new messages in the stream (a duplicate publication, by a retry or another replica, is not counted)."}, []string{"environment", "capability"}),
		evalLag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "trace", Subsystem: "analyzer", Name: "evaluation_lag_seconds",
			Help: "Time from a label batch becoming durable to the end of its cohort's evaluation.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
		evalFails: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "trace", Subsystem: "analyzer", Name: "evaluation_failures_total",
			Help: "Cohort evaluations that failed and are retried (ClickHouse or NATS unreachable): their triggers wait meanwhile."}),
		labels: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "trace", Subsystem: "analyzer", Name: "labels_written_total",
			Help: "Capability labels written to ClickHouse."}, []string{"source"}),
		runsFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "trace", Subsystem: "analyzer", Name: "label_runs_failed_total",
			Help: "Labeling runs that produced no valid labels (recorded, never invented)."}, []string{"labeler"}),
	}
	if reg != nil {
		reg.MustRegister(m.triggers, m.evalLag, m.evalFails, m.labels, m.runsFailed)
	}
	return m
}

func (m *Metrics) fired(env, capability string) {
	if m != nil {
		m.triggers.WithLabelValues(env, capability).Inc()
	}
}

func (m *Metrics) observeEval(d time.Duration) {
	if m != nil {
		m.evalLag.Observe(d.Seconds())
	}
}

func (m *Metrics) evalFailed() {
	if m != nil {
		m.evalFails.Inc()
	}
}

func (m *Metrics) wroteLabels(source string, n int) {
	if m != nil {
		m.labels.WithLabelValues(source).Add(float64(n))
	}
}

func (m *Metrics) runFailed(labeler string) {
	if m != nil {
		m.runsFailed.WithLabelValues(labeler).Inc()
	}
}
