package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/sink"
)

// Bucket widths of the time series.
const (
	bucketHour = "hour"
	bucketDay  = "day"
)

// emptyMessage is what every page says before the first rollout arrives.
const emptyMessage = "No rollouts yet. The dashboard fills in as rollouts arrive on Kafka and are labeled."

// cohorts lists every (environment, agent version, dictionary version) with
// rollouts or labels.
func (s *server) cohorts(ctx context.Context) ([]CohortSummary, error) {
	type rc struct {
		rollouts, successes uint64
		last                time.Time
	}
	byAV := map[[2]string]rc{}
	var order [][2]string
	type lc struct {
		c    CohortSummary
		last time.Time
	}
	var lcs []lc
	// The two lists are independent reads: they run at once.
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		rows, err := s.d.Store.QueryDashboard(gctx, sink.QRolloutCohorts, false)
		if err != nil {
			return fmt.Errorf("rollout cohorts: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var env, av string
			var r rc
			if err := rows.Scan(&env, &av, &r.rollouts, &r.successes, &r.last); err != nil {
				return fmt.Errorf("rollout cohorts: %w", err)
			}
			k := [2]string{env, av}
			byAV[k] = r
			order = append(order, k)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("rollout cohorts: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		rows, err := s.d.Store.QueryDashboard(gctx, sink.QLabelCohorts, false)
		if err != nil {
			return fmt.Errorf("label cohorts: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var x lc
			if err := rows.Scan(&x.c.Environment, &x.c.AgentVersion, &x.c.DictionaryVersion, &x.c.LabeledRollouts, &x.c.Capabilities, &x.c.Runs, &x.last); err != nil {
				return fmt.Errorf("label cohorts: %w", err)
			}
			lcs = append(lcs, x)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("label cohorts: %w", err)
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var out []CohortSummary
	labeled := map[[2]string]bool{}
	for _, x := range lcs {
		c := x.c
		k := [2]string{c.Environment, c.AgentVersion}
		labeled[k] = true
		r := byAV[k]
		c.Rollouts, c.Successes, c.PassRate = r.rollouts, r.successes, ratio(r.successes, r.rollouts)
		c.LastSeen = maxTime(x.last, r.last).UTC()
		out = append(out, c)
	}
	for _, k := range order {
		if labeled[k] {
			continue
		}
		r := byAV[k]
		out = append(out, CohortSummary{CohortKey: CohortKey{Environment: k[0], AgentVersion: k[1]},
			Rollouts: r.rollouts, Successes: r.successes, PassRate: ratio(r.successes, r.rollouts), LastSeen: r.last.UTC()})
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Environment != b.Environment {
			return a.Environment < b.Environment
		}
		if a.AgentVersion != b.AgentVersion {
			return a.AgentVersion < b.AgentVersion
		}
		return a.DictionaryVersion > b.DictionaryVersion // newest dictionary first
	})
	s.describeDictionaries(ctx, out)
	return out, nil
}

// countSelected sets every cohort's Selected to the number of capabilities
// its decision selects, by the rule of the decision table (decided, and
// passed in K of N runs): the evaluator's stored evaluation when preferStored and
// it has one, else computed from the window. A cohort without labels has
// none selected. It returns the decisions (without their triggers), every
// labeled cohort's computed in one round of window statements.
func (s *server) countSelected(ctx context.Context, list []CohortSummary, preferStored bool) (map[CohortKey]decided, error) {
	var keys []CohortKey
	for i := range list {
		list[i].Selected = 0
		if list[i].DictionaryVersion > 0 {
			keys = append(keys, list[i].CohortKey)
		}
	}
	decs, err := s.decisions(ctx, keys, preferStored)
	if err != nil {
		return nil, err
	}
	for i := range list {
		d, ok := decs[list[i].CohortKey]
		if !ok {
			continue
		}
		for _, c := range d.dec.Capabilities {
			if c.Decision == DecisionSelected {
				list[i].Selected++
			}
		}
	}
	return decs, nil
}

// describeDictionaries names each cohort's dictionary (its scope, and
// whether it is the default) and, for cohorts without labels, why.
func (s *server) describeDictionaries(ctx context.Context, list []CohortSummary) {
	var failed map[sink.Cohort]sink.FailedRuns
	for i := range list {
		c := &list[i]
		var d *analyzer.Dictionary
		if c.DictionaryVersion > 0 {
			d = s.dictionary(ctx, c.Environment, c.AgentVersion, c.DictionaryVersion)
		} else if s.d.Dicts != nil {
			d = s.d.Dicts.Resolve(c.Environment, c.AgentVersion)
		}
		if d != nil {
			c.Dictionary, c.DefaultDictionary = d.Scope(), d.IsDefault()
		}
		if c.DictionaryVersion > 0 {
			continue
		}
		if failed == nil {
			failed = map[sink.Cohort]sink.FailedRuns{}
			if fr, err := s.d.Store.FailedLabelRuns(ctx); err == nil {
				for _, f := range fr {
					failed[f.Cohort] = f
				}
			}
		}
		key := sink.Cohort{Environment: c.Environment, AgentVersion: c.AgentVersion}
		if d != nil {
			key.DictionaryVersion = d.Version
		}
		c.NoLabels = analyzer.WhyNoLabels(s.d.Labeling, c.Environment, c.AgentVersion, d, failed[key])
	}
}

// anchor is the watermark of what a page shows: the start of the newest
// hour holding a rollout or label of env's cohorts (the cohort lists read
// the hourly rollup, whose grain is the hour; the pass-rate chart covers
// every agent version of env), or now when there is none.
func anchor(list []CohortSummary, env string, now time.Time) time.Time {
	var wm time.Time
	for _, c := range list {
		if c.Environment == env && c.LastSeen.After(wm) {
			wm = c.LastSeen
		}
	}
	if wm.IsZero() {
		return now.UTC()
	}
	return wm.UTC()
}

// pickCohort chooses the cohort a page shows: the one the parameters name
// (missing parts filled with the most recently active match), else the most
// recently active labeled cohort.
func pickCohort(list []CohortSummary, env, av string, dict uint32) *CohortKey {
	var best *CohortSummary
	for i := range list {
		c := &list[i]
		if env != "" && c.Environment != env || av != "" && c.AgentVersion != av || dict != 0 && c.DictionaryVersion != dict {
			continue
		}
		if best == nil {
			best = c
			continue
		}
		// Prefer labeled cohorts, then the most recent, then the newest dictionary.
		bl, cl := best.DictionaryVersion > 0, c.DictionaryVersion > 0
		switch {
		case cl && !bl:
			best = c
		case cl == bl && c.LastSeen.After(best.LastSeen):
			best = c
		case cl == bl && c.LastSeen.Equal(best.LastSeen) && c.Environment == best.Environment &&
			c.AgentVersion == best.AgentVersion && c.DictionaryVersion > best.DictionaryVersion:
			best = c
		}
	}
	if best == nil {
		return nil
	}
	k := best.CohortKey
	return &k
}

// dictionary finds a cohort's dictionary version: in the registry, else in
// ClickHouse's dictionaries table, read at most once per request (see
// withDictMemo): a page resolves every cohort's dictionary, and thousands
// of cohorts must not mean thousands of reads.
func (s *server) dictionary(ctx context.Context, env, av string, version uint32) *analyzer.Dictionary {
	if s.d.Dicts != nil {
		if d := s.d.Dicts.Version(env, av, version); d != nil {
			return d
		}
	}
	m, _ := ctx.Value(dictMemoKey{}).(*dictMemo)
	if m == nil {
		m = &dictMemo{}
	}
	rows, err := m.rows(ctx, s.d.Store)
	if err != nil {
		s.log.Warn("dashboard: read dictionaries", "err", err)
		return nil
	}
	return findDictionary(rows, env, av, version)
}

// findDictionary is the most specific stored dictionary of version version
// whose scope covers (env, av).
func findDictionary(rows []sink.DictionaryRow, env, av string, version uint32) *analyzer.Dictionary {
	var found *analyzer.Dictionary
	for _, r := range rows {
		if (r.Environment != env && r.Environment != analyzer.AnyEnvironment) || r.Version != version || (r.AgentVersion != av && r.AgentVersion != analyzer.AnyVersion) {
			continue
		}
		d, err := analyzer.DictionaryFromRow(r)
		if err != nil {
			continue
		}
		if found == nil || d.Environment == env && (found.Environment != env || d.AgentVersion == av) {
			found = d // the most specific scope
		}
	}
	return found
}

type dictMemoKey struct{}

// dictMemo is one request's read of the stored dictionaries, shared by its
// concurrent reads; a failed read is not kept.
type dictMemo struct {
	mu     sync.Mutex
	loaded []sink.DictionaryRow
	ok     bool
}

func (m *dictMemo) rows(ctx context.Context, st Store) ([]sink.DictionaryRow, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ok {
		return m.loaded, nil
	}
	rows, err := st.AllDictionaries(ctx)
	if err != nil {
		return nil, err
	}
	m.loaded, m.ok = rows, true
	return rows, nil
}

// withDictMemo gives each request its own dictMemo.
func withDictMemo(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), dictMemoKey{}, &dictMemo{})))
	})
}

// decision computes (or reads from the evaluator) the window statistics of a
// cohort. counts are the raw per-run counts when computed.
func (s *server) decision(ctx context.Context, key CohortKey, preferStored bool) (*Decision, []sink.RunCounts, *analyzer.Dictionary, error) {
	decs, err := s.decisions(ctx, []CohortKey{key}, preferStored)
	if err != nil {
		return nil, nil, nil, err
	}
	d := decs[key]
	if err := s.addTriggers(ctx, key, d.dec); err != nil {
		return nil, nil, nil, err
	}
	return d.dec, d.counts, d.dict, nil
}

// decided is one cohort's decision (without its triggers), its window's
// counts when computed, and its dictionary.
type decided struct {
	dec    *Decision
	counts []sink.RunCounts
	dict   *analyzer.Dictionary
}

// decisions computes the decisions of cohorts: the analyzer's windows,
// back from each cohort's watermark (event time), read for all of them in
// one round of statements.
func (s *server) decisions(ctx context.Context, keys []CohortKey, preferStored bool) (map[CohortKey]decided, error) {
	out := make(map[CohortKey]decided, len(keys))
	cohortsOf := func(keys []CohortKey) []sink.Cohort {
		cs := make([]sink.Cohort, len(keys))
		for i, k := range keys {
			cs[i] = k.cohort()
		}
		return cs
	}
	if preferStored && len(keys) > 0 {
		// The evaluator's own latest evaluations (any process's), one small
		// read for every cohort; the others are computed below.
		stored, err := s.d.Store.LatestEvaluations(ctx, cohortsOf(keys))
		if err != nil {
			return nil, err
		}
		var rest []CohortKey
		for _, key := range keys {
			if st, ok := stored[key.cohort()]; ok {
				// An evaluation stored without its K of N (before it was
				// recorded) is computed again.
				if ev, err := analyzer.ParseEvaluation(st.Payload); err == nil && ev.N > 0 {
					dict := s.dictionary(ctx, key.Environment, key.AgentVersion, key.DictionaryVersion)
					dec := s.decide(key, dict, sink.WindowInfo{Rollouts: ev.Rollouts, Failures: ev.Failures},
						sink.Range{From: ev.WindowStart, To: ev.WindowEnd}, ev.AsOf, ev.KOfN, ev.Results, ev.Runs, "evaluator")
					dec.EvaluatedAt = ev.EvaluatedAt
					out[key] = decided{dec, ev.Counts, dict}
					continue
				}
			}
			rest = append(rest, key)
		}
		keys = rest
	}
	if len(keys) == 0 {
		return out, nil
	}
	cohorts := cohortsOf(keys)
	w, err := analyzer.ReadWindows(ctx, s.d.Store, cohorts, s.eval)
	if err != nil {
		return nil, err
	}
	for _, key := range keys {
		c := key.cohort()
		dict := s.dictionary(ctx, key.Environment, key.AgentVersion, key.DictionaryVersion)
		inputs, runs := analyzer.CohortInputs(w.Counts[c], dict)
		kn := w.KOfN[c]
		th := s.th
		th.K = kn.K
		dec := s.decide(key, dict, w.Infos[c], w.Spec.Ranges[c], w.Marks[c], kn, analyzer.Select(inputs, th), runs, "computed")
		out[key] = decided{dec, w.Counts[c], dict}
	}
	return out, nil
}

// decide is one cohort's decision from its window's info and its
// capabilities' results, selected by the cohort's K of N (source:
// "computed" or "evaluator").
func (s *server) decide(key CohortKey, dict *analyzer.Dictionary, info sink.WindowInfo, win sink.Range, asOf time.Time, kn analyzer.KOfN, results []analyzer.Result, runs int, source string) *Decision {
	dec := &Decision{Source: source, AsOf: asOf, Window: WindowJSON{Start: win.From.UTC(), End: win.To.UTC(), Rollouts: info.Rollouts, Failures: info.Failures}}
	dec.Runs, dec.K, dec.N = runs, kn.K, kn.N
	dec.Decided = info.Failures >= s.eval.MinFailures && runs >= kn.N
	switch {
	case info.Rollouts == 0 && kn.N > 1:
		// The window ends at the newest label: its labeled rollouts are
		// there, but none is labeled in every run, which the window counts.
		dec.Reason = fmt.Sprintf("no rollout in the %s up to the cohort's newest one is labeled in all %d runs (analyzer.n, llm.runs): a decision counts only rollouts labeled in every run",
			fmtDuration(s.eval.Window), kn.N)
	case info.Rollouts == 0:
		dec.Reason = fmt.Sprintf("no labeled rollouts in the %s up to the cohort's newest one", fmtDuration(s.eval.Window))
	case info.Failures < s.eval.MinFailures:
		dec.Reason = fmt.Sprintf("%d failed rollouts in the window; a decision needs at least %d (analyzer.min_failures)", info.Failures, s.eval.MinFailures)
	case runs < kn.N:
		dec.Reason = fmt.Sprintf("%d complete labeling runs; a decision needs %d (analyzer.n)", runs, kn.N)
	}
	seen := map[string]bool{}
	for i, r := range results {
		cd := CapabilityDecision{
			Name: r.Name, Definition: r.Description, Rank: i + 1,
			MeanCov: r.MeanCov, StdCov: r.StdCov, MeanDelta: r.MeanDelta, StdDelta: r.StdDelta,
			MeanERFail: r.MeanERFail, MeanERPass: r.MeanERPass, RunsPassed: r.RunsPassed, RunsTotal: r.RunsTotal,
			Selected: r.Selected, Rejection: r.Rejection, Examples: r.Examples,
		}
		if cd.Examples == nil {
			cd.Examples = []string{}
		}
		if cd.Definition == "" && dict != nil {
			if c, ok := dict.Lookup(r.Name); ok {
				cd.Definition = c.Definition
			}
		}
		switch {
		case !dec.Decided:
			cd.Decision = DecisionUndecided
		case r.Selected:
			cd.Decision = DecisionSelected
		default:
			cd.Decision = DecisionNotSelected
		}
		seen[r.Name] = true
		dec.Capabilities = append(dec.Capabilities, cd)
	}
	if dict != nil {
		for _, c := range dict.Capabilities {
			if seen[c.Name] {
				continue
			}
			dec.Capabilities = append(dec.Capabilities, CapabilityDecision{Name: c.Name, Definition: c.Definition,
				Decision: DecisionUndecided, Rejection: []string{"no labels in the window"}, Examples: []string{}})
		}
	}
	if dec.Capabilities == nil {
		dec.Capabilities = []CapabilityDecision{}
	}
	return dec
}

// addTriggers sets the newest trigger transition of each of dec's
// capabilities.
func (s *server) addTriggers(ctx context.Context, key CohortKey, dec *Decision) error {
	trig, err := s.latestTriggers(ctx, key)
	if err != nil {
		return err
	}
	for i := range dec.Capabilities {
		if t, ok := trig[dec.Capabilities[i].Name]; ok {
			dec.Capabilities[i].Trigger = &t
		}
	}
	return nil
}

func (s *server) latestTriggers(ctx context.Context, key CohortKey) (map[string]TriggerStatus, error) {
	rows, err := s.d.Store.QueryDashboard(ctx, sink.QLatestTriggers, false, key.Environment, key.AgentVersion, key.DictionaryVersion)
	if err != nil {
		return nil, fmt.Errorf("latest triggers: %w", err)
	}
	defer rows.Close()
	out := map[string]TriggerStatus{}
	for rows.Next() {
		var name string
		var t TriggerStatus
		if err := rows.Scan(&name, &t.Event, &t.Epoch, &t.At); err != nil {
			return nil, fmt.Errorf("latest triggers: %w", err)
		}
		t.At = t.At.UTC()
		out[name] = t
	}
	return out, rows.Err()
}

// passRateHourly is the hourly pass rate of every agent version of env.
func (s *server) passRateHourly(ctx context.Context, env string, since time.Time, bucket string) ([]PassSeries, error) {
	rows, err := s.d.Store.QueryDashboard(ctx, sink.QPassRateHourly, bucket == bucketDay, env, unix(since))
	if err != nil {
		return nil, fmt.Errorf("pass rate: %w", err)
	}
	defer rows.Close()
	out := []PassSeries{}
	for rows.Next() {
		var av string
		var p PassPoint
		if err := rows.Scan(&av, &p.Bucket, &p.Rollouts, &p.Successes); err != nil {
			return nil, fmt.Errorf("pass rate: %w", err)
		}
		p.Bucket = p.Bucket.UTC()
		p.PassRate = ratio(p.Successes, p.Rollouts)
		if n := len(out); n == 0 || out[n-1].AgentVersion != av {
			out = append(out, PassSeries{AgentVersion: av})
		}
		out[len(out)-1].Points = append(out[len(out)-1].Points, p)
	}
	return out, rows.Err()
}

// capabilityHourly is Cov and Δ per capability per hour of a cohort.
func (s *server) capabilityHourly(ctx context.Context, key CohortKey, since time.Time, bucket string) ([]CapSeries, error) {
	rows, err := s.d.Store.QueryDashboard(ctx, sink.QCapabilityHourly, bucket == bucketDay, key.Environment, key.AgentVersion, key.DictionaryVersion, unix(since))
	if err != nil {
		return nil, fmt.Errorf("capability series: %w", err)
	}
	defer rows.Close()
	out := []CapSeries{}
	for rows.Next() {
		var name string
		var p CapPoint
		if err := rows.Scan(&name, &p.Bucket, &p.MeanCov, &p.MeanDelta, &p.Runs, &p.Failed, &p.Passed); err != nil {
			return nil, fmt.Errorf("capability series: %w", err)
		}
		p.Bucket = p.Bucket.UTC()
		if n := len(out); n == 0 || out[n-1].Capability != name {
			out = append(out, CapSeries{Capability: name})
		}
		out[len(out)-1].Points = append(out[len(out)-1].Points, p)
	}
	return out, rows.Err()
}

// overviewParams are the query parameters of / and /api/overview.
type overviewParams struct {
	Env, AgentVersion string
	Dict              uint32
	Hours             int
	Bucket            string // hour | day
	Fresh             bool   // compute the decisions, not the evaluator's stored ones
}

func (s *server) overview(ctx context.Context, p overviewParams) (*OverviewResponse, error) {
	now := s.now()
	resp := &OverviewResponse{GeneratedAt: now.UTC(), Thresholds: s.thresholds(), Range: timeRange(now, now, p.Hours, p.Bucket, s.location()), PassRate: []PassSeries{}, Capabilities: []CapSeries{}}
	list, err := s.cohorts(ctx)
	if err != nil {
		return nil, err
	}
	resp.Cohorts = list
	if resp.Cohorts == nil {
		resp.Cohorts = []CohortSummary{}
	}
	key := pickCohort(list, p.Env, p.AgentVersion, p.Dict)
	// The decisions of every cohort, the pass rate and the capability
	// series are independent reads: they run at once.
	// (countSelected writes the list's Selected: the rest reads it before.)
	g, gctx := errgroup.WithContext(ctx)
	if key != nil {
		resp.Cohort = key
		resp.Range = timeRange(anchor(list, key.Environment, now), now, p.Hours, p.Bucket, s.location())
		since := resp.Range.Since
		g.Go(func() error {
			s.warnSkew(gctx, &resp.Range, list, key.Environment, now) // the only writer of resp.Range meanwhile
			return nil
		})
		g.Go(func() (err error) {
			resp.PassRate, err = s.passRateHourly(gctx, key.Environment, since, p.Bucket)
			return err
		})
		if key.DictionaryVersion > 0 {
			g.Go(func() (err error) {
				resp.Capabilities, err = s.capabilityHourly(gctx, *key, since, p.Bucket)
				return err
			})
		}
	}
	var decs map[CohortKey]decided
	g.Go(func() (err error) {
		decs, err = s.countSelected(gctx, list, !p.Fresh)
		return err
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if len(list) == 0 {
		resp.Empty, resp.Message = true, emptyMessage
		return resp, nil
	}
	if key == nil {
		resp.Empty = true
		resp.Message = fmt.Sprintf("No rollouts yet for %s.", describeFilter(p.Env, p.AgentVersion, p.Dict))
		return resp, nil
	}
	if resp.Range.All {
		var firsts []time.Time
		for _, ps := range resp.PassRate {
			if len(ps.Points) > 0 {
				firsts = append(firsts, ps.Points[0].Bucket)
			}
		}
		for _, cs := range resp.Capabilities {
			if len(cs.Points) > 0 {
				firsts = append(firsts, cs.Points[0].Bucket)
			}
		}
		resp.Range.startAtData(firsts, s.location())
	}
	if key.DictionaryVersion == 0 {
		resp.Message = "These rollouts are not labeled yet: no capability statistics."
		for _, c := range list {
			if c.CohortKey == *key && c.NoLabels != "" {
				resp.Message = "These rollouts are not labeled: " + c.NoLabels
			}
		}
		return resp, nil
	}
	d, ok := decs[*key]
	if !ok {
		if d.dec, _, _, err = s.decision(ctx, *key, !p.Fresh); err != nil {
			return nil, err
		}
	} else if err := s.addTriggers(ctx, *key, d.dec); err != nil {
		return nil, err
	}
	resp.Decision = d.dec
	return resp, nil
}

func describeFilter(env, av string, dict uint32) string {
	var parts []string
	if env != "" {
		parts = append(parts, "environment "+env)
	}
	if av != "" {
		parts = append(parts, "agent version "+av)
	}
	if dict != 0 {
		parts = append(parts, fmt.Sprintf("dictionary v%d", dict))
	}
	if len(parts) == 0 {
		return "this selection"
	}
	return strings.Join(parts, ", ")
}

// capabilityParams are the query parameters of /capability.
type capabilityParams struct {
	Env, AgentVersion, Name string
	Dict                    uint32
	Examples                int
	Hours                   int
	Bucket                  string
	Fresh                   bool
}

func (s *server) capability(ctx context.Context, p capabilityParams) (*CapabilityResponse, error) {
	now := s.now()
	list, err := s.cohorts(ctx)
	if err != nil {
		return nil, err
	}
	rg := timeRange(anchor(list, p.Env, now), now, p.Hours, p.Bucket, s.location())
	// The clock-skew warning's read runs beside the decision's.
	warning := make(chan string, 1)
	go func(r Range) {
		s.warnSkew(ctx, &r, list, p.Env, now)
		warning <- r.Warning
	}(rg)
	since := rg.Since
	resp := &CapabilityResponse{GeneratedAt: now.UTC(), Thresholds: s.thresholds(), Range: rg,
		PerRun: []RunRow{}, Series: []CapPoint{}, Triggers: []TriggerEvent{}, Examples: []ExampleRollout{}}
	if p.Dict == 0 {
		k := pickCohort(list, p.Env, p.AgentVersion, 0)
		if k != nil {
			p.Dict = k.DictionaryVersion
		}
	}
	key := CohortKey{Environment: p.Env, AgentVersion: p.AgentVersion, DictionaryVersion: p.Dict}
	resp.Cohort = key
	resp.Capability = DictCapability{Name: p.Name}
	// The evaluator's stored evaluation (its window's per-run counts
	// included) unless fresh; computed when there is none.
	dec, counts, dict, err := s.decision(ctx, key, !p.Fresh)
	resp.Range.Warning = <-warning
	if err != nil {
		return nil, err
	}
	resp.Source = dec.Source
	if dict != nil {
		if c, ok := dict.Lookup(p.Name); ok {
			resp.InDictionary = true
			resp.Capability = DictCapability{Name: c.Name, Definition: c.Definition, Examples: c.Examples, Detector: c.Detector}
		}
	}
	resp.Window, resp.Decided, resp.Reason, resp.K, resp.N = dec.Window, dec.Decided, dec.Reason, dec.K, dec.N
	for i := range dec.Capabilities {
		if dec.Capabilities[i].Name == p.Name {
			cd := dec.Capabilities[i]
			resp.Stats = &cd
		}
	}
	for _, rc := range counts {
		if rc.Capability != p.Name {
			continue
		}
		c := analyzer.Counts{LackingFailed: rc.LackingFailed, PresentFailed: rc.PresentFailed, NAFailed: rc.NAFailed,
			LackingPassed: rc.LackingPassed, PresentPassed: rc.PresentPassed, NAPassed: rc.NAPassed}
		st := analyzer.ComputeRun(c, s.th)
		resp.PerRun = append(resp.PerRun, RunRow{Run: rc.Run,
			LackingFailed: rc.LackingFailed, PresentFailed: rc.PresentFailed, NAFailed: rc.NAFailed,
			LackingPassed: rc.LackingPassed, PresentPassed: rc.PresentPassed, NAPassed: rc.NAPassed,
			ERFail: st.ERFailed, ERPass: st.ERPassed, Delta: st.Delta, Cov: st.Cov, Passed: st.Passed})
	}
	if !resp.InDictionary && resp.Stats == nil {
		resp.Message = fmt.Sprintf("No capability %q in %s/%s dictionary v%d, and no labels for it.", p.Name, p.Env, p.AgentVersion, p.Dict)
	} else if resp.Stats == nil || resp.Stats.RunsTotal == 0 {
		resp.Message = "No labels for this capability in the decision window yet."
	}
	// The series, the trigger timeline and the examples are independent
	// reads: they run at once.
	g, gctx := errgroup.WithContext(ctx)
	var series []CapSeries
	var evs []TriggerEvent
	g.Go(func() (err error) {
		series, err = s.capabilityHourly(gctx, key, since, p.Bucket)
		return err
	})
	g.Go(func() (err error) {
		evs, _, err = s.triggerEvents(gctx, time.Unix(0, 0), TriggerFilter{Environment: p.Env, AgentVersion: p.AgentVersion, Capability: p.Name}, 200)
		return err
	})
	g.Go(func() (err error) {
		resp.Examples, err = s.examples(gctx, key, p.Name, dec.Window.Start, p.Examples)
		return err
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for _, cs := range series {
		if cs.Capability == p.Name {
			resp.Series = cs.Points
		}
	}
	if resp.Range.All {
		var firsts []time.Time
		if len(resp.Series) > 0 {
			firsts = append(firsts, resp.Series[0].Bucket)
		}
		resp.Range.startAtData(firsts, s.location())
	}
	for _, e := range evs {
		if e.DictionaryVersion == p.Dict {
			resp.Triggers = append(resp.Triggers, e)
		}
	}
	return resp, nil
}

// examples reads the failed rollouts where name was LACKING, with their
// compacted conversations.
func (s *server) examples(ctx context.Context, key CohortKey, name string, since time.Time, limit int) ([]ExampleRollout, error) {
	out := []ExampleRollout{}
	if limit <= 0 {
		return out, nil
	}
	rows, err := s.d.Store.QueryDashboard(ctx, sink.QLackingExamples, false, key.Environment, key.AgentVersion, key.DictionaryVersion, name, unix(since), uint32(limit))
	if err != nil {
		return nil, fmt.Errorf("examples: %w", err)
	}
	var ids []string
	for rows.Next() {
		var e ExampleRollout
		if err := rows.Scan(&e.RolloutID, &e.LackingRuns, &e.Runs); err != nil {
			rows.Close()
			return nil, fmt.Errorf("examples: %w", err)
		}
		e.Messages = []sink.CompactMessage{}
		out = append(out, e)
		ids = append(ids, e.RolloutID)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("examples: %w", err)
	}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err = s.d.Store.QueryDashboard(ctx, sink.QRollouts, false, key.Environment, key.AgentVersion, ids)
	if err != nil {
		return nil, fmt.Errorf("example rollouts: %w", err)
	}
	defer rows.Close()
	byID := map[string]int{}
	for i, e := range out {
		byID[e.RolloutID] = i
	}
	for rows.Next() {
		var (
			id, task, msgs, grader string
			ok                     uint8
			reward                 float64
			end                    time.Time
		)
		if err := rows.Scan(&id, &task, &ok, &reward, &end, &msgs, &grader); err != nil {
			return nil, fmt.Errorf("example rollouts: %w", err)
		}
		i, found := byID[id]
		if !found {
			continue
		}
		e := &out[i]
		e.Found, e.TaskID, e.Success, e.Reward, e.EndTime = true, task, ok == 1, reward, end.UTC()
		if msgs != "" {
			if err := json.Unmarshal([]byte(msgs), &e.Messages); err != nil {
				s.log.Warn("dashboard: stored messages are not JSON", "rollout_id", id, "err", err)
			}
		}
		if grader != "" && json.Valid([]byte(grader)) {
			e.Grader = json.RawMessage(grader)
		}
	}
	return out, rows.Err()
}

// triggerEvents reads the newest limit trigger transitions, in time order;
// truncated reports that there were more.
func (s *server) triggerEvents(ctx context.Context, since time.Time, f TriggerFilter, limit int) ([]TriggerEvent, bool, error) {
	rows, err := s.d.Store.QueryDashboard(ctx, sink.QTriggerEvents, false, unix(since),
		f.Environment, f.Environment, f.AgentVersion, f.AgentVersion, f.Capability, f.Capability, uint32(limit+1))
	if err != nil {
		return nil, false, fmt.Errorf("trigger events: %w", err)
	}
	defer rows.Close()
	out := []TriggerEvent{}
	for rows.Next() {
		var e TriggerEvent
		var wr, wf uint32
		var payload string
		if err := rows.Scan(&e.TriggerID, &e.Environment, &e.AgentVersion, &e.DictionaryVersion, &e.Capability, &e.Epoch, &e.Event, &e.At,
			&e.MeanCov, &e.MeanDelta, &e.RunsPassed, &e.RunsTotal, &e.Window.Start, &e.Window.End, &wr, &wf, &payload); err != nil {
			return nil, false, fmt.Errorf("trigger events: %w", err)
		}
		e.At, e.Window.Start, e.Window.End = e.At.UTC(), e.Window.Start.UTC(), e.Window.End.UTC()
		e.Window.Rollouts, e.Window.Failures = int(wr), int(wf)
		if payload != "" && json.Valid([]byte(payload)) {
			e.Payload = json.RawMessage(payload)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	if len(out) > limit { // the query's limit+1 newest, in time order: drop the oldest
		return out[len(out)-limit:], true, nil
	}
	return out, false, nil
}

type triggersParams struct {
	Filter TriggerFilter
	Days   int
	Limit  int
}

func (s *server) triggers(ctx context.Context, p triggersParams) (*TriggersResponse, error) {
	now := s.now()
	since := now.Add(-time.Duration(p.Days) * 24 * time.Hour)
	resp := &TriggersResponse{GeneratedAt: now.UTC(), Since: since.UTC(), Filter: p.Filter, Counts: map[string]int{}}
	var err error
	if resp.Events, resp.Truncated, err = s.triggerEvents(ctx, since, p.Filter, p.Limit); err != nil {
		return nil, err
	}
	// The counts are of every event the filter matches, not only those shown.
	rows, err := s.d.Store.QueryDashboard(ctx, sink.QTriggerEventCounts, false, unix(since),
		p.Filter.Environment, p.Filter.Environment, p.Filter.AgentVersion, p.Filter.AgentVersion, p.Filter.Capability, p.Filter.Capability)
	if err != nil {
		return nil, fmt.Errorf("trigger event counts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var event string
		var n uint64
		if err := rows.Scan(&event, &n); err != nil {
			return nil, fmt.Errorf("trigger event counts: %w", err)
		}
		resp.Counts[event] = int(n)
		resp.Total += int(n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("trigger event counts: %w", err)
	}
	if len(resp.Events) == 0 {
		resp.Message = fmt.Sprintf("No trigger events in the last %d days.", p.Days)
	}
	return resp, nil
}

type trendsParams struct {
	Env   string
	Weeks int
	Top   int
	At    time.Time // a time in "this week"; zero = now
}

func (s *server) trends(ctx context.Context, p trendsParams) (*TrendsResponse, error) {
	now := s.now()
	at := p.At
	if at.IsZero() {
		at = now
	}
	resp := &TrendsResponse{GeneratedAt: now.UTC(), Environments: []string{}, Weeks: []time.Time{}, AgentVersions: []string{},
		PassRate: []WeeklyPass{}, Lacking: []WeeklyLacking{}, WeekOverWeek: []WeekOverWeek{}}
	list, err := s.cohorts(ctx)
	if err != nil {
		return nil, err
	}
	seenEnv := map[string]bool{}
	for _, c := range list {
		if !seenEnv[c.Environment] {
			seenEnv[c.Environment] = true
			resp.Environments = append(resp.Environments, c.Environment)
		}
	}
	if len(list) == 0 {
		resp.Empty, resp.Message = true, emptyMessage
		return resp, nil
	}
	resp.Environment = p.Env
	if resp.Environment == "" {
		resp.Environment = resp.Environments[0]
	}
	if !seenEnv[resp.Environment] {
		resp.Empty, resp.Message = true, fmt.Sprintf("No rollouts yet for environment %s.", resp.Environment)
		return resp, nil
	}
	if p.At.IsZero() {
		at = anchor(list, resp.Environment, now) // "this week" is the week of the newest data
	}
	var thisWeek, since time.Time
	if err := s.d.Store.QueryDashboardRow(ctx, sink.QWeekBounds, unix(at), unix(at), uint32(7*(p.Weeks-1))).Scan(&thisWeek, &since); err != nil {
		return nil, fmt.Errorf("trends: weeks: %w", err)
	}
	resp.ThisWeek, resp.Since = dateUTC(thisWeek), since.UTC()
	for i := p.Weeks - 1; i >= 0; i-- {
		resp.Weeks = append(resp.Weeks, resp.ThisWeek.AddDate(0, 0, -7*i))
	}
	// The pass rate, the weekly table and each agent version's week over
	// week are independent reads: they run at once. The week over week is
	// read for every agent version of the environment and kept for those
	// with rows in the range, as when it was read after the other two.
	var candidates []string
	for _, c := range list {
		if c.Environment == resp.Environment && !slices.Contains(candidates, c.AgentVersion) {
			candidates = append(candidates, c.AgentVersion)
		}
	}
	wow := make([][]WeekOverWeek, len(candidates))
	var passAVs, lackAVs []string
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	g.Go(func() error {
		rows, err := s.d.Store.QueryDashboard(gctx, sink.QPassRateWeekly, false, resp.Environment, unix(since), unix(at))
		if err != nil {
			return fmt.Errorf("trends: pass rate: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var w WeeklyPass
			if err := rows.Scan(&w.Week, &w.AgentVersion, &w.Rollouts, &w.Successes); err != nil {
				return fmt.Errorf("trends: pass rate: %w", err)
			}
			w.Week, w.PassRate = dateUTC(w.Week), ratio(w.Successes, w.Rollouts)
			passAVs = append(passAVs, w.AgentVersion)
			resp.PassRate = append(resp.PassRate, w)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("trends: pass rate: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		rows, err := s.d.Store.QueryDashboard(gctx, sink.QLackingWeekly, false, resp.Environment, unix(since), unix(at))
		if err != nil {
			return fmt.Errorf("trends: lacking: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var (
				week time.Time
				av   string
				c    CapWeek
			)
			if err := rows.Scan(&week, &av, &c.Capability, &c.MeanCov, &c.MeanDelta, &c.LackingFailed, &c.Failed); err != nil {
				return fmt.Errorf("trends: lacking: %w", err)
			}
			week = dateUTC(week)
			lackAVs = append(lackAVs, av)
			n := len(resp.Lacking)
			if n == 0 || !resp.Lacking[n-1].Week.Equal(week) || resp.Lacking[n-1].AgentVersion != av {
				resp.Lacking = append(resp.Lacking, WeeklyLacking{Week: week, AgentVersion: av, Top: []CapWeek{}})
				n++
			}
			// Rows come highest Cov first; keep the top ones that were LACKING at all.
			if len(resp.Lacking[n-1].Top) < p.Top && c.LackingFailed > 0 {
				resp.Lacking[n-1].Top = append(resp.Lacking[n-1].Top, c)
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("trends: lacking: %w", err)
		}
		return nil
	})
	for i, av := range candidates {
		g.Go(func() error {
			rows, err := s.d.Store.QueryDashboard(gctx, sink.QLackingWeekOverWeek, false, unix(at), resp.Environment, av, unix(at), unix(at), uint32(max(p.Top, 1)*2))
			if err != nil {
				return fmt.Errorf("trends: week over week: %w", err)
			}
			defer rows.Close()
			for rows.Next() {
				w := WeekOverWeek{AgentVersion: av}
				if err := rows.Scan(&w.Capability, &w.CovThisWeek, &w.CovLastWeek, &w.DeltaThisWeek, &w.DeltaLastWeek,
					&w.LackingThisWeek, &w.LackingLastWeek, &w.RunsThisWeek, &w.RunsLastWeek); err != nil {
					return fmt.Errorf("trends: week over week: %w", err)
				}
				wow[i] = append(wow[i], w)
			}
			if err := rows.Err(); err != nil {
				return fmt.Errorf("trends: week over week: %w", err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	avs := map[string]bool{}
	for _, av := range append(passAVs, lackAVs...) {
		avs[av] = true
	}
	for av := range avs {
		resp.AgentVersions = append(resp.AgentVersions, av)
	}
	sort.Strings(resp.AgentVersions)
	for _, av := range resp.AgentVersions {
		if i := slices.Index(candidates, av); i >= 0 {
			resp.WeekOverWeek = append(resp.WeekOverWeek, wow[i]...)
		}
	}
	if len(resp.PassRate) == 0 && len(resp.Lacking) == 0 {
		resp.Empty, resp.Message = true, fmt.Sprintf("No rollouts for %s in the last %d weeks.", resp.Environment, p.Weeks)
	}
	return resp, nil
}

// timeRange is the range of a time-series chart: the last hours up to asOf
// (the watermark of what is shown), from the start of the bucket they begin
// in, in loc (the server's time zone, where ClickHouse's buckets start);
// hours 0 is every rollout (Since is then set from the data). A watermark
// ahead of now by more than analyzer.FutureSkew gets a warning.
func timeRange(asOf, now time.Time, hours int, bucket string, loc *time.Location) Range {
	rg := Range{Until: asOf.UTC(), AsOf: asOf.UTC(), Hours: hours, Bucket: bucket}
	if hours == 0 {
		rg.All = true
	} else {
		rg.Since = bucketStart(asOf.Add(-time.Duration(hours)*time.Hour), bucket, loc).UTC()
	}
	rg.Warning = skewWarning(asOf, now)
	return rg
}

// skewWarning is the range's warning when the newest data ends more than
// analyzer.FutureSkew after the clock ("" otherwise).
func skewWarning(newest, now time.Time) string {
	if ahead := newest.Sub(now); ahead > analyzer.FutureSkew {
		return fmt.Sprintf("the newest rollout ends %s after this server's clock (clock skew?); it is shown as is", fmtDuration(ahead.Round(time.Minute)))
	}
	return ""
}

// warnSkew sets rg's clock-skew warning from env's exact newest labeled
// end time (the evaluator's watermark, which `trace report` warns from
// too): the cohort list knows only the hour it is in, which would
// understate the skew by up to an hour and miss one under an hour. An
// environment without labels keeps the warning of its newest hour.
func (s *server) warnSkew(ctx context.Context, rg *Range, list []CohortSummary, env string, now time.Time) {
	var cohorts []sink.Cohort
	for _, c := range list {
		if c.Environment == env && c.DictionaryVersion > 0 {
			cohorts = append(cohorts, sink.Cohort{Environment: c.Environment, AgentVersion: c.AgentVersion, DictionaryVersion: c.DictionaryVersion})
		}
	}
	if len(cohorts) == 0 {
		return
	}
	marks, err := s.d.Store.Watermarks(ctx, cohorts)
	if err != nil {
		s.log.Warn("dashboard: watermarks for the clock-skew warning", "err", err)
		return
	}
	var newest time.Time
	for _, wm := range marks {
		if wm.After(newest) {
			newest = wm
		}
	}
	if !newest.IsZero() {
		rg.Warning = skewWarning(newest, now)
	}
}

// startAtData sets an "all" range's start, which timeRange leaves to the
// data: the earliest of the series' first buckets, else (nothing to show)
// the bucket of the watermark, so that a chart never spans from the zero
// time.
func (rg *Range) startAtData(firsts []time.Time, loc *time.Location) {
	rg.Since = time.Time{}
	for _, f := range firsts {
		if rg.Since.IsZero() || f.Before(rg.Since) {
			rg.Since = f.UTC()
		}
	}
	if rg.Since.IsZero() {
		rg.Since = bucketStart(rg.Until, rg.Bucket, loc).UTC()
	}
}

// bucketStart is the start of the hour or day of t in loc, as
// toStartOfHour and toStartOfDay compute it on a server in loc (an hour
// starts at t less its local minutes and seconds, so a zone at a half-hour
// offset and the hour repeated at the end of DST are right too).
func bucketStart(t time.Time, bucket string, loc *time.Location) time.Time {
	if loc == nil {
		loc = time.UTC
	}
	l := t.In(loc)
	if bucket == bucketDay {
		return time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, loc)
	}
	return l.Add(-time.Duration(l.Minute())*time.Minute - time.Duration(l.Second())*time.Second - time.Duration(l.Nanosecond()))
}

func ratio(num, den uint64) float64 {
	if den == 0 {
		return 0
	}
	return float64(num) / float64(den)
}

func unix(t time.Time) uint32 { return uint32(max(t.Unix(), 0)) }

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// dateUTC keeps the calendar date of a ClickHouse Date at UTC midnight.
func dateUTC(t time.Time) time.Time {
	y, m, d := t.Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

func fmtDuration(d time.Duration) string {
	switch {
	case d%(24*time.Hour) == 0:
		n := int(d / (24 * time.Hour))
		if n == 1 {
			return "24 hours"
		}
		return fmt.Sprintf("%d days", n)
	case d%time.Hour == 0:
		return fmt.Sprintf("%d hours", int(d/time.Hour))
	}
	return d.String()
}

var errNoStore = errors.New("dashboard: no ClickHouse store configured")
