package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/traceops/trace/schemas"
)

// Cohort is the unit statistics are computed over: one agent version on one
// environment, labeled against one dictionary version.
type Cohort struct {
	Environment       string
	AgentVersion      string
	DictionaryVersion uint32
}

func (c Cohort) String() string {
	return fmt.Sprintf("%s/%s/dict-v%d", c.Environment, c.AgentVersion, c.DictionaryVersion)
}

// WindowSpec selects the labels a decision is made on: the cohort's labels
// whose rollout ended in [Since, Until), and, when LastRollouts > 0, only
// those of the cohort's most recent LastRollouts rollouts.
type WindowSpec struct {
	Cohort
	Since, Until time.Time // zero = unbounded
	LastRollouts int
	// Runs is N, the labeling runs per rollout. When N > 1 only complete
	// rollouts take part: those labeled for the capability in every run
	// 0..N-1. A rollout whose runs are still arriving (or one whose LLM run
	// failed) is left out instead of skewing one run's ratios, so the window
	// statistics never depend on where a consumer batch happened to end.
	Runs int
}

// RunCounts are the label counts of one capability in one run over a window,
// one label per (rollout, capability, run) whatever was redelivered.
type RunCounts struct {
	Capability string
	Run        int
	LackingFailed, PresentFailed, NAFailed,
	LackingPassed, PresentPassed, NAPassed int
	// LackingFailedFirst are the first MaxExampleIDs ids labeled LACKING on
	// failures, sorted as strings; enough to compute the first 8 of the
	// union over runs.
	LackingFailedFirst []string
}

// MaxExampleIDs bounds the example ids read per (capability, run).
const MaxExampleIDs = 8

// WindowInfo describes the rollouts in a window.
type WindowInfo struct {
	Rollouts, Failures int
	First, Last        time.Time
}

// MultiSpec is a window over several cohorts at once: one query evaluates
// every cohort that changed, instead of one query per cohort.
type MultiSpec struct {
	Cohorts      []Cohort
	Since, Until time.Time
	// Ranges, when set, gives every cohort its own window (by event time,
	// see EventSpec) instead of Since and Until; a cohort without a range
	// selects nothing.
	Ranges       map[Cohort]Range
	LastRollouts int // per cohort
	Runs         int
	// Raw reads every hour from the labels, the rollup of closed hours
	// ignored (the computation the rollup is checked against: tests and
	// `trace bench query`'s old way). Windows of LastRollouts are always
	// read raw.
	Raw bool
}

// Range is a closed interval of rollout end times, [From, To], at the
// second resolution of the tables.
type Range struct{ From, To time.Time }

// EventRange is the window of a cohort whose newest labeled rollout ended
// at watermark: the window length back from the watermark, both ends
// included. Rollouts that end behind the watermark (late arrivals) count as
// long as they are inside it; the wall clock plays no part.
func EventRange(watermark time.Time, window time.Duration) Range {
	return Range{From: watermark.Add(-window), To: watermark}
}

// Multi turns a single-cohort spec into a MultiSpec.
func (spec WindowSpec) Multi() MultiSpec {
	return MultiSpec{Cohorts: []Cohort{spec.Cohort}, Since: spec.Since, Until: spec.Until, LastRollouts: spec.LastRollouts, Runs: spec.Runs}
}

const cohortCols = "environment, agent_version, dictionary_version"

// cohortIn is the condition that the row is of one of the cohorts.
func cohortIn(cohorts []Cohort) (string, []any) {
	tuples := make([]string, len(cohorts))
	args := make([]any, 0, 3*len(cohorts))
	for i, c := range cohorts {
		tuples[i] = "(?, ?, ?)"
		args = append(args, c.Environment, c.AgentVersion, c.DictionaryVersion)
	}
	return "(" + cohortCols + ") IN (" + strings.Join(tuples, ", ") + ")", args
}

func (spec MultiSpec) where() (string, []any) { return spec.whereAnd("", nil) }

// whereAnd is where with one more condition on the labels (extra, with its
// binds), which the completeness and LastRollouts subqueries apply too.
func (spec MultiSpec) whereAnd(extra string, extraArgs []any) (string, []any) {
	in, args := cohortIn(spec.Cohorts)
	conds := []string{in}
	if spec.Ranges != nil {
		per := make([]string, 0, len(spec.Cohorts))
		for _, c := range spec.Cohorts {
			r, ok := spec.Ranges[c]
			if !ok {
				continue
			}
			per = append(per, "(environment = ? AND agent_version = ? AND dictionary_version = ? AND toUInt32(ts) >= ? AND toUInt32(ts) <= ?)")
			args = append(args, c.Environment, c.AgentVersion, c.DictionaryVersion, unixSec(r.From), unixSec(r.To))
		}
		if len(per) == 0 {
			per = append(per, "0")
		}
		conds = append(conds, "("+strings.Join(per, " OR ")+")")
	}
	if !spec.Since.IsZero() {
		conds = append(conds, "toUInt32(ts) >= ?")
		args = append(args, uint32(spec.Since.Unix()))
	}
	if !spec.Until.IsZero() {
		conds = append(conds, "toUInt32(ts) < ?")
		args = append(args, uint32(spec.Until.Unix()))
	}
	if spec.Runs > 1 {
		conds = append(conds, "run < ?")
		args = append(args, uint16(spec.Runs))
	}
	if extra != "" {
		conds = append(conds, extra)
		args = append(args, extraArgs...)
	}
	where := strings.Join(conds, " AND ")
	base, baseArgs := where, append([]any(nil), args...)
	if spec.LastRollouts > 0 {
		where += fmt.Sprintf(` AND (%s, rollout_id) IN (SELECT %s, rollout_id FROM labels_by_time WHERE %s
	GROUP BY %s, rollout_id ORDER BY max(ts) DESC, rollout_id DESC LIMIT %d BY %s)`,
			cohortCols, cohortCols, base, cohortCols, spec.LastRollouts, cohortCols)
		args = append(args, baseArgs...)
	}
	if spec.Runs > 1 {
		where += fmt.Sprintf(` AND (%s, capability, rollout_id) IN (SELECT %s, capability, rollout_id FROM labels_by_time WHERE %s
	GROUP BY %s, capability, rollout_id HAVING uniqExact(run) >= %d)`, cohortCols, cohortCols, base, cohortCols, spec.Runs)
		args = append(args, baseArgs...)
	}
	return where, args
}

// WindowCounts returns per (capability, run) label counts over the window.
// Each (rollout, capability, run) counts once, with its most recently
// ingested label (argMax over ingest_ns).
func (s *Store) WindowCounts(ctx context.Context, spec WindowSpec) ([]RunCounts, error) {
	m, err := s.WindowCountsMulti(ctx, spec.Multi())
	return m[spec.Cohort], err
}

// WindowCountsMulti is WindowCounts for several cohorts in one query.
func (s *Store) WindowCountsMulti(ctx context.Context, spec MultiSpec) (map[Cohort][]RunCounts, error) {
	out := map[Cohort][]RunCounts{}
	inline := s.freshRollupState(ctx, spec)
	for _, part := range spec.chunks() {
		if err := s.windowCounts(ctx, part, inline, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *Store) windowCounts(ctx context.Context, spec MultiSpec, inline func(string) string, out map[Cohort][]RunCounts) error {
	q, args := spec.statement(windowCountsSQL, windowCountsRollupSQL, inline)
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("window counts of %d cohorts: %w", len(spec.Cohorts), err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			c                      Cohort
			rc                     RunCounts
			run                    uint16
			lf, pf, nf, lp, pp, np uint64
		)
		if err := rows.Scan(&c.Environment, &c.AgentVersion, &c.DictionaryVersion, &rc.Capability, &run, &lf, &pf, &nf, &lp, &pp, &np, &rc.LackingFailedFirst); err != nil {
			return fmt.Errorf("window counts: %w", err)
		}
		rc.Run = int(run)
		rc.LackingFailed, rc.PresentFailed, rc.NAFailed = int(lf), int(pf), int(nf)
		rc.LackingPassed, rc.PresentPassed, rc.NAPassed = int(lp), int(pp), int(np)
		out[c] = append(out[c], rc)
	}
	return rows.Err()
}

// statement is a window read's statement of spec: raw, or over the rollup
// with the rollup state put in place by inline (freshRollupState).
func (spec MultiSpec) statement(raw, rolled func(MultiSpec) (string, []any), inline func(string) string) (string, []any) {
	if spec.raw() {
		return raw(spec)
	}
	q, args := rolled(spec)
	return inline(q), args
}

// WindowInfo counts the distinct rollouts and failures labeled in the window.
func (s *Store) WindowInfo(ctx context.Context, spec WindowSpec) (WindowInfo, error) {
	m, err := s.WindowInfoMulti(ctx, spec.Multi())
	return m[spec.Cohort], err
}

// WindowInfoMulti is WindowInfo for several cohorts in one query.
func (s *Store) WindowInfoMulti(ctx context.Context, spec MultiSpec) (map[Cohort]WindowInfo, error) {
	out := map[Cohort]WindowInfo{}
	inline := s.freshRollupState(ctx, spec)
	for _, part := range spec.chunks() {
		if err := s.windowInfo(ctx, part, inline, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *Store) windowInfo(ctx context.Context, spec MultiSpec, inline func(string) string, out map[Cohort]WindowInfo) error {
	q, args := spec.statement(windowInfoSQL, windowInfoRollupSQL, inline)
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("window info of %d cohorts: %w", len(spec.Cohorts), err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			c           Cohort
			n, f        uint64
			first, last time.Time
		)
		if err := rows.Scan(&c.Environment, &c.AgentVersion, &c.DictionaryVersion, &n, &f, &first, &last); err != nil {
			return fmt.Errorf("window info: %w", err)
		}
		out[c] = WindowInfo{Rollouts: int(n), Failures: int(f), First: first.UTC(), Last: last.UTC()}
	}
	return rows.Err()
}

// raw reports a spec read from the labels alone: asked for, or a window of
// the last rollouts (which the hourly rollup cannot select).
func (spec MultiSpec) raw() bool { return spec.Raw || spec.LastRollouts > 0 }

// MaxCohortsPerStatement is the most cohorts one window statement names:
// each adds ~200 bytes of conditions, and ClickHouse refuses a statement
// longer than max_query_size (256 KiB by default). More cohorts are read in
// several statements.
const MaxCohortsPerStatement = 200

// chunks splits the spec by MaxCohortsPerStatement cohorts.
func (spec MultiSpec) chunks() []MultiSpec {
	var out []MultiSpec
	for i := 0; i < len(spec.Cohorts); i += MaxCohortsPerStatement {
		part := spec
		part.Cohorts = spec.Cohorts[i:min(i+MaxCohortsPerStatement, len(spec.Cohorts))]
		out = append(out, part)
	}
	return out
}

// unixSec is t as the Unix seconds of a DateTime column (0 before 1970).
func unixSec(t time.Time) uint32 { return uint32(max(t.Unix(), 0)) }

// Watermarks returns, per cohort, its watermark: the end time of its newest
// labeled rollout (max ts of its labels). Cohorts without labels are absent.
// With no cohorts given, it returns every cohort's.
func (s *Store) Watermarks(ctx context.Context, cohorts []Cohort) (map[Cohort]time.Time, error) {
	out := map[Cohort]time.Time{}
	if len(cohorts) == 0 {
		return out, s.watermarks(ctx, nil, out)
	}
	for i := 0; i < len(cohorts); i += MaxCohortsPerStatement {
		if err := s.watermarks(ctx, cohorts[i:min(i+MaxCohortsPerStatement, len(cohorts))], out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *Store) watermarks(ctx context.Context, cohorts []Cohort, out map[Cohort]time.Time) error {
	q, args := watermarksSQL(cohorts)
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("watermarks: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			c  Cohort
			wm time.Time
		)
		if err := rows.Scan(&c.Environment, &c.AgentVersion, &c.DictionaryVersion, &wm); err != nil {
			return fmt.Errorf("watermarks: %w", err)
		}
		out[c] = wm.UTC()
	}
	return rows.Err()
}

// LabelSources returns, per cohort, the sources its labels came from
// (schemas.SourceRules, SourceLLM, SourceExternal), sorted: what decides
// its K of N when analyzer.k and analyzer.n are not set. Cohorts without
// labels are absent.
func (s *Store) LabelSources(ctx context.Context, cohorts []Cohort) (map[Cohort][]string, error) {
	out := map[Cohort][]string{}
	for i := 0; i < len(cohorts); i += MaxCohortsPerStatement {
		q, args := labelSourcesSQL(cohorts[i:min(i+MaxCohortsPerStatement, len(cohorts))])
		if err := s.labelSources(ctx, q, args, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *Store) labelSources(ctx context.Context, q string, args []any, out map[Cohort][]string) error {
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("label sources: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			c      Cohort
			source string
		)
		if err := rows.Scan(&c.Environment, &c.AgentVersion, &c.DictionaryVersion, &source); err != nil {
			return fmt.Errorf("label sources: %w", err)
		}
		out[c] = append(out[c], source)
	}
	return rows.Err()
}

// EventSpec is the decision window of each cohort by event time: the last
// window of rollout end times back from the cohort's own watermark (see
// EventRange), and, when lastRollouts > 0, only its lastRollouts newest
// rollouts. It returns the watermarks too; cohorts without labels get no
// range and select nothing.
func (s *Store) EventSpec(ctx context.Context, cohorts []Cohort, window time.Duration, lastRollouts, runs int) (MultiSpec, map[Cohort]time.Time, error) {
	spec := MultiSpec{Cohorts: cohorts, Ranges: map[Cohort]Range{}, LastRollouts: lastRollouts, Runs: runs}
	if len(cohorts) == 0 {
		return spec, map[Cohort]time.Time{}, nil
	}
	marks, err := s.Watermarks(ctx, cohorts)
	if err != nil {
		return spec, nil, err
	}
	for c, wm := range marks {
		spec.Ranges[c] = EventRange(wm, window)
	}
	return spec, marks, nil
}

// Cohorts lists the cohorts that have labels ending at or after since's
// hour (from the label_counts aggregate).
func (s *Store) Cohorts(ctx context.Context, since time.Time) ([]Cohort, error) {
	q, args := cohortsSQL(since)
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("cohorts: %w", err)
	}
	defer rows.Close()
	var out []Cohort
	for rows.Next() {
		var c Cohort
		if err := rows.Scan(&c.Environment, &c.AgentVersion, &c.DictionaryVersion); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// recentLabelsSQL counts each cohort's labels in the rollup's hours since
// an hour (each row in its newest version; the open hour is not there).
//
// Binds: since (Unix seconds).
const recentLabelsSQL = `SELECT environment, agent_version, dictionary_version, sum(c) FROM (
	SELECT environment, agent_version, dictionary_version, capability, run, hour,
		argMax(lf + pf + nf + lp + pp + np, version) AS c
	FROM label_hourly
	WHERE dicts = 0 AND hour >= toDateTime(?)
	GROUP BY environment, agent_version, dictionary_version, capability, run, hour)
GROUP BY environment, agent_version, dictionary_version`

// RecentLabels estimates each cohort's labels since a time from the hourly
// rollup (its closed hours): what a window read of the cohort costs, for
// the evaluator's scheduling. Cohorts without rolled-up labels since then
// are absent.
func (s *Store) RecentLabels(ctx context.Context, since time.Time) (map[Cohort]uint64, error) {
	rows, err := s.conn.Query(ctx, recentLabelsSQL, unixSec(since))
	if err != nil {
		return nil, fmt.Errorf("recent labels: %w", err)
	}
	defer rows.Close()
	out := map[Cohort]uint64{}
	for rows.Next() {
		var c Cohort
		var n uint64
		if err := rows.Scan(&c.Environment, &c.AgentVersion, &c.DictionaryVersion, &n); err != nil {
			return nil, fmt.Errorf("recent labels: %w", err)
		}
		out[c] = n
	}
	return out, rows.Err()
}

// ChangedCohorts returns the (environment, agent version)s with labels
// written since a time (by ingest time, any process's): the sorted tail of
// rollup_log.
func (s *Store) ChangedCohorts(ctx context.Context, since time.Time) (map[[2]string]bool, error) {
	rows, err := s.conn.Query(ctx, changedCohortsSQL, uint64(max(since.UnixNano(), 0)))
	if err != nil {
		return nil, fmt.Errorf("changed cohorts: %w", err)
	}
	defer rows.Close()
	out := map[[2]string]bool{}
	for rows.Next() {
		var k [2]string
		if err := rows.Scan(&k[0], &k[1]); err != nil {
			return nil, fmt.Errorf("changed cohorts: %w", err)
		}
		out[k] = true
	}
	return out, rows.Err()
}

// CohortTools returns the tool schemas of each (environment, agent
// version)'s most recent rollout that declared tools (the synthesizer
// mirrors the target's interface), MaxCohortsPerStatement a statement;
// those whose rollouts declared none are absent.
func (s *Store) CohortTools(ctx context.Context, keys [][2]string) (map[[2]string][]schemas.Tool, error) {
	out := map[[2]string][]schemas.Tool{}
	for i := 0; i < len(keys); i += MaxCohortsPerStatement {
		q, args := cohortToolsSQL(keys[i:min(i+MaxCohortsPerStatement, len(keys))])
		rows, err := s.conn.Query(ctx, q, args...)
		if err != nil {
			return nil, fmt.Errorf("cohort tools: %w", err)
		}
		for rows.Next() {
			var k [2]string
			var raw string
			if err := rows.Scan(&k[0], &k[1], &raw); err != nil {
				rows.Close()
				return nil, fmt.Errorf("cohort tools: %w", err)
			}
			var tools []schemas.Tool
			if err := json.Unmarshal([]byte(raw), &tools); err != nil {
				rows.Close()
				return nil, fmt.Errorf("cohort tools of %s/%s: %w", k[0], k[1], err)
			}
			if len(tools) > 0 {
				out[k] = tools
			}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("cohort tools: %w", err)
		}
	}
	return out, nil
}

// CountDistinctRollouts counts distinct rollout ids (FINAL-free, exact).
func (s *Store) CountDistinctRollouts(ctx context.Context) (distinct, rows uint64, err error) {
	err = s.conn.QueryRow(ctx, countDistinctRolloutsSQL).Scan(&distinct, &rows)
	return distinct, rows, err
}

// UnexplainedFailures counts, for a cohort's window, the failed rollouts and
// those among them with no LACKING label in any capability or run: the
// failures the dictionary does not explain (discovery's trigger).
func (s *Store) UnexplainedFailures(ctx context.Context, c Cohort, since time.Time) (failures, unexplained int, err error) {
	var f, u uint64
	q, args := unexplainedFailuresSQL(c, since)
	err = s.conn.QueryRow(ctx, q, args...).Scan(&f, &u)
	if err != nil {
		return 0, 0, fmt.Errorf("unexplained failures %s: %w", c, err)
	}
	return int(f), int(u), nil
}

// SampleRollouts returns up to n recent failed and n recent passed rollouts
// of (environment, agent version) as stored (compacted), for the discovery
// agent. Tool arguments cut by compaction are kept as their JSON text.
func (s *Store) SampleRollouts(ctx context.Context, env, agentVersion string, n int) ([]*schemas.Rollout, error) {
	q, args := sampleRolloutsSQL(env, agentVersion, n)
	out, err := s.queryRollouts(ctx, env, agentVersion, q, args...)
	if err != nil {
		return nil, fmt.Errorf("sample rollouts: %w", err)
	}
	return out, nil
}

// RolloutsByID returns the stored (compacted) rollouts of a cohort with the
// given ids, in the order of ids; ids not stored are left out.
func (s *Store) RolloutsByID(ctx context.Context, env, agentVersion string, ids []string) ([]*schemas.Rollout, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	q, args := rolloutsByIDSQL(env, agentVersion, ids)
	rs, err := s.queryRollouts(ctx, env, agentVersion, q, args...)
	if err != nil {
		return nil, fmt.Errorf("rollouts by id: %w", err)
	}
	byID := make(map[string]*schemas.Rollout, len(rs))
	for _, r := range rs {
		byID[r.RolloutID] = r
	}
	out := make([]*schemas.Rollout, 0, len(rs))
	for _, id := range ids {
		if r, ok := byID[id]; ok {
			out = append(out, r)
			delete(byID, id)
		}
	}
	return out, nil
}

// queryRollouts runs a query with the columns of sampleRolloutsSQL and
// rebuilds the rollouts from their stored, compacted form.
func (s *Store) queryRollouts(ctx context.Context, env, agentVersion, q string, args ...any) ([]*schemas.Rollout, error) {
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*schemas.Rollout
	for rows.Next() {
		var (
			r            schemas.Rollout
			ok           uint8
			msgs, grader string
			start, end   time.Time
		)
		if err := rows.Scan(&r.RolloutID, &r.TaskID, &r.Agent.Name, &ok, &r.Outcome.Reward, &start, &end, &msgs, &grader); err != nil {
			return nil, err
		}
		r.Environment, r.Agent.Version, r.StartTime, r.EndTime = env, agentVersion, start.UTC(), end.UTC()
		succ := ok == 1
		r.Outcome.Success = &succ
		var cms []CompactMessage
		if err := json.Unmarshal([]byte(msgs), &cms); err != nil {
			return nil, fmt.Errorf("stored messages of %s: %w", r.RolloutID, err)
		}
		for _, cm := range cms {
			m := schemas.Message{Role: cm.Role, Content: cm.Content, Reasoning: cm.Reasoning, ToolCallID: cm.ToolCallID,
				Error: cm.Error, ErrorText: cm.ErrorText, Requestor: cm.Requestor}
			for _, tc := range cm.ToolCalls {
				var args map[string]any
				if json.Unmarshal([]byte(tc.Arguments), &args) != nil {
					args = map[string]any{"_compacted": tc.Arguments}
				}
				m.ToolCalls = append(m.ToolCalls, schemas.ToolCall{ID: tc.ID, Name: tc.Name, Arguments: args, Requestor: tc.Requestor})
			}
			r.Messages = append(r.Messages, m)
		}
		if grader != "" {
			var g schemas.Grader
			if json.Unmarshal([]byte(grader), &g) == nil {
				r.Grader = &g
			}
		}
		out = append(out, &r)
	}
	return out, rows.Err()
}
