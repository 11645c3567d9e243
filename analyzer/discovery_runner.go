package analyzer

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// DiscoveryRunner runs the discovery agent where TRACE says to: for an
// (environment, agent version) that has no dictionary of its own (Request,
// called by the labeling stage, also while the default dictionary labels
// it), and for a cohort whose window has too many failures that
// no LACKING label explains (checked every Interval). A scope is rediscovered
// at most once per Cooldown. The new dictionary is stored and announced by
// Apply, and every analyzer picks it up.
type DiscoveryRunner struct {
	Discoverer *Discoverer
	Store      DiscoveryStore
	Registry   *Registry
	// Apply stores and announces a new dictionary version.
	Apply func(ctx context.Context, d *Dictionary) error
	Log   *slog.Logger
	// Threshold is the unexplained-failure share that triggers discovery
	// (default DefaultUnexplainedThreshold); MinFailures the failures a
	// window needs before the share means anything (default 20).
	Threshold   float64
	MinFailures int
	Window      time.Duration // default 24h
	Interval    time.Duration // default 1m
	Cooldown    time.Duration // default 1h
	Sample      int           // rollouts per outcome in the sample, default 10

	mu      sync.Mutex
	pending map[[2]string]bool
	last    map[[2]string]time.Time
	// waits and retryAt: a pending scope with no failure stored yet is
	// asked again after waits[k] (noFailureWait), not before retryAt[k].
	waits   map[[2]string]time.Duration
	retryAt map[[2]string]time.Time
	kick    chan struct{}
}

// noFailureWait is how long a scope with no failure stored waits before
// it is looked at again, after waiting prev: 2 s at first (its rollouts
// may be on their way to ClickHouse), doubling up to max (the check
// interval), so that an agent version that does not fail is not queried
// every 2 s for as long as it runs.
func noFailureWait(prev, max time.Duration) time.Duration {
	if prev <= 0 {
		return min(2*time.Second, max)
	}
	return min(2*prev, max)
}

func (d *DiscoveryRunner) init() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending == nil {
		d.pending, d.last, d.kick = map[[2]string]bool{}, map[[2]string]time.Time{}, make(chan struct{}, 1)
		d.waits, d.retryAt = map[[2]string]time.Duration{}, map[[2]string]time.Time{}
	}
	d.Threshold = cmp.Or(d.Threshold, DefaultUnexplainedThreshold)
	d.MinFailures = cmp.Or(d.MinFailures, 20)
	d.Window = cmp.Or(d.Window, 24*time.Hour)
	d.Interval = cmp.Or(d.Interval, time.Minute)
	d.Cooldown = cmp.Or(d.Cooldown, time.Hour)
	d.Sample = cmp.Or(d.Sample, 10)
}

// Request asks for a dictionary for a scope that has none. Cheap and safe to
// call for every such rollout.
func (d *DiscoveryRunner) Request(env, agentVersion string) {
	d.init()
	d.mu.Lock()
	k := [2]string{env, agentVersion}
	fresh := !d.pending[k]
	d.pending[k] = true
	d.mu.Unlock()
	if fresh {
		select {
		case d.kick <- struct{}{}:
		default:
		}
	}
}

// Run processes requests and checks the cohorts until ctx ends.
func (d *DiscoveryRunner) Run(ctx context.Context) error {
	d.init()
	t := time.NewTicker(d.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.kick:
		case <-t.C:
			d.checkCohorts(ctx)
		}
		d.mu.Lock()
		var todo [][2]string
		for k := range d.pending {
			todo = append(todo, k)
		}
		d.mu.Unlock()
		for _, k := range todo {
			d.mu.Lock()
			recent := time.Since(d.last[k]) < d.Cooldown
			wait, notYet := d.waits[k], time.Now().Before(d.retryAt[k])
			d.mu.Unlock()
			if notYet {
				continue // still pending; its retry is scheduled
			}
			if recent {
				// Asked again within the cooldown (every rollout labeled by the
				// default dictionary asks): the cooldown is not extended.
				d.mu.Lock()
				delete(d.pending, k)
				d.mu.Unlock()
				continue
			}
			err := d.discover(ctx, k[0], k[1])
			if errors.Is(err, errNoFailures) {
				// Its failures are not in ClickHouse yet, or it has none:
				// try again shortly, then less and less often.
				wait = noFailureWait(wait, d.Interval)
				d.mu.Lock()
				d.waits[k], d.retryAt[k] = wait, time.Now().Add(wait)
				d.mu.Unlock()
				continue
			}
			if err != nil && ctx.Err() == nil {
				d.Log.Warn("discovery failed; the scope keeps its current dictionary", "environment", k[0], "agent_version", k[1], "err", err)
			}
			d.mu.Lock()
			delete(d.pending, k)
			delete(d.waits, k)
			delete(d.retryAt, k)
			d.last[k] = time.Now() // success or an agent failure: not again before Cooldown
			d.mu.Unlock()
		}
		// The soonest retry of a pending scope without failures.
		retry := time.Duration(0)
		d.mu.Lock()
		for k, at := range d.retryAt {
			if w := time.Until(at); d.pending[k] && (retry == 0 || w < retry) {
				retry = max(w, time.Millisecond)
			}
		}
		d.mu.Unlock()
		if retry > 0 {
			time.AfterFunc(retry, func() {
				select {
				case d.kick <- struct{}{}:
				default:
				}
			})
		}
	}
}

// checkCohorts queues cohorts whose failures the dictionary no longer explains.
func (d *DiscoveryRunner) checkCohorts(ctx context.Context) {
	// Each cohort's window ends at its watermark (event time), as the
	// evaluator's does.
	marks, err := d.Store.Watermarks(ctx, nil)
	if err != nil {
		d.Log.Warn("discovery: list cohorts", "err", err)
		return
	}
	for c, wm := range marks {
		cur := d.Registry.Resolve(c.Environment, c.AgentVersion)
		if cur == nil || cur.Version != c.DictionaryVersion {
			continue // an older dictionary's labels: the current one is judged on its own
		}
		failures, unexplained, err := d.Store.UnexplainedFailures(ctx, c, wm.Add(-d.Window))
		if err != nil {
			d.Log.Warn("discovery: unexplained failures", "cohort", c.String(), "err", err)
			continue
		}
		if failures < d.MinFailures || !NeedsDiscovery(true, failures, unexplained, d.Threshold) {
			continue
		}
		d.mu.Lock()
		recent := time.Since(d.last[[2]string{c.Environment, c.AgentVersion}]) < d.Cooldown
		d.mu.Unlock()
		if !recent {
			d.Log.Info("discovery: failures not explained by the dictionary", "cohort", c.String(), "failures", failures, "unexplained", unexplained)
			d.Request(c.Environment, c.AgentVersion)
		}
	}
}

var errNoFailures = errors.New("no failed rollouts stored yet")

func (d *DiscoveryRunner) discover(ctx context.Context, env, agentVersion string) error {
	d.mu.Lock()
	recent := time.Since(d.last[[2]string{env, agentVersion}]) < d.Cooldown
	d.mu.Unlock()
	if recent {
		return nil
	}
	sample, err := d.Store.SampleRollouts(ctx, env, agentVersion, d.Sample)
	if err != nil {
		return err
	}
	failed := 0
	for _, r := range sample {
		if !r.Succeeded() {
			failed++
		}
	}
	if failed == 0 {
		return errNoFailures
	}
	prev := d.Registry.Resolve(env, agentVersion)
	if prev != nil && prev.AgentVersion != agentVersion {
		prev = nil // an environment-wide dictionary: the new one is scoped to this version
	}
	nd, err := d.Discoverer.Discover(ctx, DiscoveryRequest{Environment: env, AgentVersion: agentVersion, Previous: prev, Rollouts: sample})
	if err != nil {
		return err
	}
	if err := d.Apply(ctx, nd); err != nil {
		return err
	}
	d.Log.Info("discovery: new dictionary", "environment", env, "agent_version", agentVersion, "version", nd.Version, "capabilities", nd.Names())
	return nil
}
