// Package verify closes TRACE's loop (TRACE-METHOD.md, step 4): for every
// adapter it measures the effect on the capability the adapter was trained
// for, and its guard rolls back an adapter that makes things worse.
//
// The comparison, per adapter: the capability's ER−, ER+, Δ and Cov (the
// analyzer's formulas, analyzer.ComputeRun, averaged over labeling runs) and
// the pass rate on two samples of the same environment —
//
//   - before: the base model's rollouts of the adapter's cohort
//     (environment, agent version) that ended before the adapter was
//     activated, or before the first adapter of the same capability and
//     cohort was, when an earlier one served it (see baselines);
//   - after: the same cohort's rollouts routed to the adapter
//     (rollouts.adapter, from rollout v1's routing field).
//
// Each statistic has a 95 % interval (Wilson for proportions, a seeded
// percentile bootstrap over rollouts for Δ), and the verdict is one of
// not_enough_data, worse, gap_closed, improved, no_change (see Verdict).
//
// The guard (Checker.Guard, run periodically by the adapt role of `trace
// run`) rolls back every active adapter that its sequential test finds
// worse (GuardDecision: planned looks at the earliest routed rollouts, so
// that checking every minute does not turn chance into rollbacks): it
// publishes an adapter_event/v1 rolled_back on trace.adapters.events with
// the evidence, so routers stop choosing it, then moves the registry entry
// to rolled_back through RollBacker.
package verify

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// DefaultInterval is how often the guard runs by default.
const DefaultInterval = time.Minute

// Source reads the registry and the labeled samples (*sink.Store).
type Source interface {
	Adapters(ctx context.Context, f sink.AdapterFilter) ([]sink.AdapterRow, error)
	LoopDictionaries(ctx context.Context, environment, agentVersion, capability string) ([]uint32, error)
	LoopLabels(ctx context.Context, spec sink.LoopSample) ([]sink.RolloutLabels, error)
	// LabelSources are the sources of each cohort's labels, for its N
	// (read only with Config.Selection).
	LabelSources(ctx context.Context, cohorts []sink.Cohort) (map[sink.Cohort][]string, error)
}

// RollBacker moves an adapter to rolled_back in the registry and unloads
// it from serving. reason is the guard's; metadata is the adapter's
// metadata JSON with the guard's record merged in, for implementations
// that store it.
type RollBacker interface {
	RollBack(ctx context.Context, a sink.AdapterRow, reason, metadata string) error
}

// Publisher publishes adapter transitions (*bus.Bus).
type Publisher interface {
	PublishAdapterEvent(ctx context.Context, e *schemas.AdapterEvent) error
}

// StoreRollBack is the minimal RollBacker: the registry write only
// (sink.Store.MarkAdapterRolledBack), no unload from serving. trace run
// uses the adapter lifecycle's transition (adapter.Registry.RollBack, with
// the unload); this one serves tests and tools without a registry.
type StoreRollBack struct{ Store *sink.Store }

// RollBack implements RollBacker with the registry write alone.
func (s StoreRollBack) RollBack(ctx context.Context, a sink.AdapterRow, _ string, metadata string) error {
	return s.Store.MarkAdapterRolledBack(ctx, a, metadata, time.Now())
}

// AdapterCheck is one adapter's closed-loop comparison.
type AdapterCheck struct {
	Adapter      string `json:"adapter"`
	Capability   string `json:"capability"`
	Environment  string `json:"environment"`
	AgentVersion string `json:"agent_version"`
	// EnvironmentID is the training environment the adapter was trained on
	// (trace env list), JobID its training job.
	EnvironmentID string    `json:"environment_id"`
	JobID         string    `json:"job_id"`
	Status        string    `json:"status"`
	Simulated     bool      `json:"simulated"`
	ActivatedAt   time.Time `json:"activated_at"`
	// BeforeUntil bounds the before side: its rollouts ended before it.
	// It is ActivatedAt, or, when another adapter of the same capability
	// and cohort was active earlier (BaselineAdapter), that adapter's
	// first activation: while an adapter serves the capability, the router
	// sends it the conversations that need it, and the base model's
	// rollouts of that time are the others, no baseline for the gap.
	BeforeUntil       time.Time `json:"before_until"`
	BaselineAdapter   string    `json:"baseline_adapter,omitempty"`
	DictionaryVersion uint32    `json:"dictionary_version"`
	Comparison
	// Guard is the guard's sequential test (see GuardDecision), on the
	// same dictionary version's labels; it, not the verdict, decides a
	// rollback. Computed for active adapters only (absent otherwise).
	Guard GuardDecision `json:"guard,omitzero"`
	// Action is what the guard did: "rolled_back", "guard off: would roll
	// back", or empty.
	Action string `json:"action,omitempty"`
	row    sink.AdapterRow
}

// BeforeNote says where the before side ends when that is not at the
// adapter's activation ("until <t>, when <adapter>, the capability's first
// adapter, was activated", or "until <t>, its first activation"), with ts
// formatting the time; empty otherwise.
func (ac AdapterCheck) BeforeNote(ts func(time.Time) string) string {
	switch {
	case ac.BaselineAdapter != "":
		return "until " + ts(ac.BeforeUntil) + ", when " + ac.BaselineAdapter + ", the capability's first adapter, was activated"
	case !ac.BeforeUntil.IsZero() && !ac.BeforeUntil.Equal(ac.ActivatedAt):
		return "until " + ts(ac.BeforeUntil) + ", its first activation"
	}
	return ""
}

// Checker computes the comparisons and runs the guard.
type Checker struct {
	cfg      Config
	src      Source
	rollback RollBacker
	pub      Publisher
	log      *slog.Logger
	now      func() time.Time
}

// New returns a Checker. rollback and pub may be nil for a read-only
// checker (trace report, the dashboard); Guard needs both.
func New(cfg Config, src Source, rollback RollBacker, pub Publisher, log *slog.Logger) *Checker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Checker{cfg: cfg.Defaults(), src: src, rollback: rollback, pub: pub, log: log, now: time.Now}
}

// Config is the effective configuration.
func (c *Checker) Config() Config { return c.cfg }

// activation returns when the adapter became active: the metadata's
// activated_at when set, else the time of the last transition to active
// the registry recorded (adapter.Registry's metadata "transitions"), else
// the update time of its version (the activate transition's write); and
// first, when it first did: the earliest transition to active when that
// is earlier (a re-activated adapter), else the same time.
//
// It also says whether the adapter was ever in service: only a retired
// adapter whose registry history names transitions but none to active (a
// candidate retired before it was activated) was not; without a history,
// trace cannot tell, and counts it.
func activation(a sink.AdapterRow) (last, first time.Time, ever bool) {
	var m struct {
		ActivatedAt time.Time `json:"activated_at"`
		Transitions []struct {
			To string    `json:"to"`
			At time.Time `json:"at"`
		} `json:"transitions"`
	}
	if json.Unmarshal([]byte(a.Metadata), &m) != nil {
		return a.UpdatedAt, a.UpdatedAt, true
	}
	last, ever = a.UpdatedAt, a.Status != "retired" || len(m.Transitions) == 0
	if !m.ActivatedAt.IsZero() {
		last, ever = m.ActivatedAt.UTC(), true
	} else {
		for i := len(m.Transitions) - 1; i >= 0; i-- {
			if t := m.Transitions[i]; t.To == "active" && !t.At.IsZero() {
				last, ever = t.At.UTC(), true
				break
			}
		}
	}
	first = last
	for _, t := range m.Transitions {
		if t.To == "active" && !t.At.IsZero() && t.At.Before(first) {
			first = t.At.UTC()
		}
	}
	return last, first, ever
}

// baselineKey names a capability of a cohort.
type baselineKey struct{ environment, agentVersion, capability string }

// baseline is the earliest activation of an adapter of a capability and
// cohort, and that adapter.
type baseline struct {
	at      time.Time
	adapter string
}

// baselines are, per capability and cohort, the first activation of any
// of its adapters that was ever in service (any status): a before side
// ends there. After it the base model's rollouts are those the router did
// not send to the capability's adapter, mostly ones that do not need it.
func baselines(ads []sink.AdapterRow) map[baselineKey]baseline {
	out := map[baselineKey]baseline{}
	for _, a := range ads {
		_, at, ever := activation(a)
		if !ever {
			continue
		}
		k := baselineKey{a.Environment, a.AgentVersion, a.Capability}
		if b, ok := out[k]; !ok || at.Before(b.at) {
			out[k] = baseline{at, a.Name}
		}
	}
	return out
}

// Check computes the comparison of every adapter with one of the given
// statuses (active when none), in the registry's order. Each adapter is
// checked on its own: one whose queries fail is left out, its error
// joined to the returned error, and the others are still returned (so
// that the guard still acts on them). A retired adapter that was never
// active (see activation) is left out: nothing was routed to it.
func (c *Checker) Check(ctx context.Context, statuses ...string) ([]AdapterCheck, error) {
	if len(statuses) == 0 {
		statuses = []string{"active"}
	}
	var (
		out  []AdapterCheck
		errs []error
	)
	// One read of the registry: the adapters checked are those with the
	// statuses asked for, the baselines come from all of them (an earlier
	// adapter of the capability may be retired or rolled back).
	all, err := c.src.Adapters(ctx, sink.AdapterFilter{})
	if err != nil {
		return nil, fmt.Errorf("adapters: %w", err)
	}
	bases := baselines(all)
	for _, st := range statuses {
		for _, a := range all {
			if a.Status != st {
				continue
			}
			at, _, ever := activation(a)
			if !ever {
				continue // retired as a candidate: it never had routed traffic to check
			}
			ac, err := c.checkOne(ctx, a, at, bases[baselineKey{a.Environment, a.AgentVersion, a.Capability}])
			if err != nil {
				errs = append(errs, fmt.Errorf("adapter %s: %w", a.Name, err))
				continue
			}
			out = append(out, ac)
		}
	}
	return out, errors.Join(errs...)
}

func (c *Checker) checkOne(ctx context.Context, a sink.AdapterRow, activatedAt time.Time, base baseline) (AdapterCheck, error) {
	ac := AdapterCheck{Adapter: a.Name, Capability: a.Capability, Environment: a.Environment, AgentVersion: a.AgentVersion,
		EnvironmentID: a.EnvironmentID, JobID: a.JobID, Status: a.Status, Simulated: a.Simulated, ActivatedAt: activatedAt,
		BeforeUntil: activatedAt, row: a}
	if !base.at.IsZero() && base.at.Before(activatedAt) {
		ac.BeforeUntil = base.at
		if base.adapter != a.Name {
			ac.BaselineAdapter = base.adapter
		}
	}
	dvs, err := c.src.LoopDictionaries(ctx, a.Environment, a.AgentVersion, a.Capability)
	if err != nil {
		return ac, err
	}
	if len(dvs) == 0 {
		ac.Comparison = Compare(NewSample(nil), NewSample(nil), c.cfg, a.Name)
		ac.Reason = "no labels of " + a.Capability + " for " + a.Environment + "/" + a.AgentVersion + " yet"
		if a.Status == "active" {
			ac.Guard = guardDecide(NewSample(nil), NewSample(nil), c.cfg, false)
		}
		return ac, nil
	}
	// The newest dictionary whose labels decide (a verdict other than
	// not_enough_data). A new dictionary version labels the stream from
	// its start on, so until the rollouts before activation are labeled
	// with it too (trace relabel), its comparison has no before side:
	// the older version's labels still decide, and the guard still acts.
	var (
		newest, co   Comparison
		at           = -1
		deciding, s0 comparedSides
	)
	for i, dv := range dvs {
		s, err := c.read(ctx, a, ac.BeforeUntil, dv)
		if err != nil {
			return ac, err
		}
		co, deciding = Compare(s.before, s.after, c.cfg, a.Name), s
		if i == 0 {
			newest, s0 = co, s
		}
		if co.Verdict != NotEnoughData {
			if i > 0 {
				co.Reason += fmt.Sprintf(" (with dictionary v%d's labels; v%d, the newest labeling %s, cannot decide yet: %s)", dv, dvs[0], a.Capability, newest.Reason)
			}
			at = i
			break
		}
	}
	if at < 0 {
		at, co, deciding = 0, newest, s0
		if len(dvs) > 1 && newest.Before.Rollouts == 0 {
			co.Reason += fmt.Sprintf("; no rollout before activation is labeled with dictionary v%d (older versions' labels cannot decide either): trace relabel --env %s --agent-version %s labels them",
				dvs[0], a.Environment, a.AgentVersion)
		}
	}
	ac.DictionaryVersion, ac.Comparison = dvs[at], co
	if a.Status == "active" { // only the guard of an active adapter acts, and is shown
		ac.Guard, err = c.guard(ctx, a, activatedAt, dvs[at], deciding)
	}
	return ac, err
}

// guard is the guard's test of an active adapter on dictionary version
// dv's labels, s the sides its verdict was computed on: the looks at the
// routed rollouts from activation on, then, once they are over, the last
// complete watch block.
func (c *Checker) guard(ctx context.Context, a sink.AdapterRow, activatedAt time.Time, dv uint32, s comparedSides) (GuardDecision, error) {
	routed := c.sample(a, dv)
	routed.Adapter, routed.Oldest = a.Name, true
	first, err := c.src.LoopLabels(ctx, routed)
	if err != nil {
		return GuardDecision{}, err
	}
	runs := cmp.Or(s.runs, s.after.Runs)
	g := guardDecide(s.before, NewSampleOfRuns(byEndTime(first), runs), c.cfg, len(first) >= c.cfg.SampleLimit)
	if j, from, to := watchBlock(activatedAt, g.LooksEnd, c.now()); j > 0 {
		routed.From, routed.To = from, to
		rows, err := c.src.LoopLabels(ctx, routed)
		if err != nil {
			return g, err
		}
		w := watchDecide(s.before, NewSampleOfRuns(byEndTime(rows), runs), c.cfg, j, from, to)
		g.Watch = &w
	}
	return g, nil
}

// comparedSides are an adapter's two samples on one dictionary version's
// labels, with the number of runs they count.
type comparedSides struct {
	before, after Sample
	runs          int
}

// sample is what both sides of an adapter's samples share.
func (c *Checker) sample(a sink.AdapterRow, dv uint32) sink.LoopSample {
	return sink.LoopSample{Environment: a.Environment, AgentVersion: a.AgentVersion, DictionaryVersion: dv, Capability: a.Capability,
		Limit: c.cfg.SampleLimit}
}

// read reads the adapter's samples on dictionary version dv's labels, the
// before side ending at until, the after side the most recent routed
// rollouts.
func (c *Checker) read(ctx context.Context, a sink.AdapterRow, until time.Time, dv uint32) (comparedSides, error) {
	var s comparedSides
	b, r := c.sample(a, dv), c.sample(a, dv)
	b.Until, r.Adapter = until, a.Name
	before, err := c.src.LoopLabels(ctx, b)
	if err != nil {
		return s, err
	}
	after, err := c.src.LoopLabels(ctx, r)
	if err != nil {
		return s, err
	}
	// Without the selection's rule s.runs stays 0: each side counts the
	// most runs any of its rollouts has.
	if c.cfg.Selection != nil {
		co := sink.Cohort{Environment: a.Environment, AgentVersion: a.AgentVersion, DictionaryVersion: dv}
		srcs, err := c.src.LabelSources(ctx, []sink.Cohort{co})
		if err != nil {
			return s, err
		}
		s.runs = c.cfg.Selection.KOfN(srcs[co]).N
	}
	s.before, s.after = NewSampleOfRuns(before, s.runs), NewSampleOfRuns(after, s.runs)
	return s, nil
}

// Guard checks every active adapter and rolls back those whose guard
// decision is worse (when the guard is on); an adapter whose verdict is
// worse but whose look is not gets an Action saying so. It returns every
// check it could compute, with Action set on the adapters it acted on; an
// adapter whose check failed, or whose rollback failed, does not stop the
// others, and the errors are returned joined.
func (c *Checker) Guard(ctx context.Context) ([]AdapterCheck, error) {
	checks, err := c.Check(ctx, "active")
	errs := []error{err}
	for i := range checks {
		ac := &checks[i]
		if !ac.Guard.RollBack() {
			if ac.Verdict == Worse {
				ac.Action = "guard: not yet, " + ac.Guard.Summary()
			}
			continue
		}
		if !c.cfg.Guard {
			ac.Action = "guard off: would roll back"
			c.log.Warn("closed loop: adapter is worse than the base model; the guard is off", "adapter", ac.Adapter,
				"capability", ac.Capability, "reason", ac.Guard.RollBackReason())
			continue
		}
		if err := c.rollBack(ctx, ac); err != nil {
			errs = append(errs, fmt.Errorf("roll back %s: %w", ac.Adapter, err))
			continue
		}
		ac.Action, ac.Status = "rolled_back", "rolled_back"
	}
	return checks, errors.Join(errs...)
}

// rollBack publishes the event first (its id is deterministic per
// registry version, so a retry after a failed registry write is dropped
// by the stream's duplicate window) and then writes the registry: a crash
// between the two leaves the adapter active, and the next run repeats
// both, never a registry change the routers did not hear about.
func (c *Checker) rollBack(ctx context.Context, ac *AdapterCheck) error {
	if c.rollback == nil || c.pub == nil {
		return errors.New("the guard needs a rollback and a publisher")
	}
	now := c.now().UTC()
	eventID := schemas.AdapterEventID(ac.Adapter, schemas.AdapterRolledBack, ac.row.Version)
	reason := "closed-loop guard (event " + eventID + "): " + ac.Guard.RollBackReason()
	ev := &schemas.AdapterEvent{EventID: eventID,
		Type: schemas.AdapterRolledBack, Adapter: ac.Adapter, Capability: ac.Capability, Environment: ac.Environment,
		AgentVersion: ac.AgentVersion, At: now, By: "guard", Reason: reason, Simulated: ac.Simulated, Evidence: ac.Guard.Evidence()}
	if err := c.pub.PublishAdapterEvent(ctx, ev); err != nil {
		return err
	}
	meta := map[string]any{}
	_ = json.Unmarshal([]byte(ac.row.Metadata), &meta) // a malformed metadata is replaced, not fatal
	meta["activated_at"] = ac.ActivatedAt
	meta["rolled_back_at"] = now
	meta["rolled_back_by"] = "guard"
	meta["rollback_reason"] = reason
	meta["rollback_event"] = ev.EventID
	data, _ := json.Marshal(meta)
	if err := c.rollback.RollBack(ctx, ac.row, reason, string(data)); err != nil {
		return err
	}
	c.log.Warn("closed loop: adapter rolled back", "adapter", ac.Adapter, "capability", ac.Capability,
		"environment", ac.Environment, "reason", ac.Guard.RollBackReason(), "event", ev.EventID)
	return nil
}

// Evidence is the guard's deciding test in the adapter event's form: the
// look's, or the watch block's when that is what is worse (nil before the
// first look).
func (g GuardDecision) Evidence() *schemas.Evidence {
	c, level := g.Comparison, g.Level
	if g.watchDecides() {
		c, level = g.Watch.Comparison, g.Watch.Level
	}
	if c == nil {
		return nil
	}
	iv := func(i Interval) schemas.Interval { return schemas.Interval{Value: i.Value, Lo: i.Lo, Hi: i.Hi} }
	side := func(s Stats) schemas.Side {
		return schemas.Side{Rollouts: s.Rollouts, Failures: s.Failures, Delta: iv(s.Delta), PassRate: iv(s.PassRate)}
	}
	dc, pc := iv(c.DeltaChange), iv(c.PassRateChange)
	return &schemas.Evidence{Level: level, Verdict: string(c.Verdict), Before: side(c.Before), After: side(c.After), DeltaChange: &dc, PassRateChange: &pc}
}

// Run runs the guard every cfg.Interval until ctx ends; a failed run is
// logged and retried at the next tick. It returns nil when ctx ends (the
// run in flight finishes first: a rollback is never cut between the event
// and the registry write by shutdown, only by a crash).
func (c *Checker) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		// The run is not cancelled by shutdown: it finishes what it
		// started, bounded by one interval.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(c.cfg.Interval, 30*time.Second))
		checks, err := c.Guard(rctx)
		cancel()
		if err != nil {
			c.log.Warn("closed loop: guard run", "err", err)
		}
		for _, ac := range checks {
			c.log.Debug("closed loop", "adapter", ac.Adapter, "verdict", ac.Verdict, "reason", ac.Reason)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
