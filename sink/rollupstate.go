package sink

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// The rollup's read state, evaluated once for many statements. Every
// rollup-backed dashboard statement names the watermark and the dirty hours
// as subqueries (wmThrough, wmClosed, dirtyLabels, dirtyRollouts), so the
// documented SQL runs as it is; on 18.16 those subqueries cost ~60–90 ms per
// statement, whatever the data size. QueryDashboard replaces them by their
// values, read once and kept for rollupStateTTL. That is exact: a watermark
// stays true once written (later changes show in the dirty set, which is
// read with it), and a set read a moment ago only makes the statement read
// the numbers of that moment for the hours changed since (a late rollout
// shows within rollupStateTTL).

// rollupStateTTL is how long the values are reused.
const rollupStateTTL = time.Second

// maxInlineDirty is the most dirty hours put into a statement as a literal
// set; more (a rollup far behind, just after migration 15) keeps the
// subqueries.
const maxInlineDirty = 500

type rollupState struct {
	through        uint64
	closed         uint32
	labels, outs   []dirtyHour
	at             time.Time
	tooMany, valid bool
}

type dirtyHour struct {
	env, av string
	hour    uint32
}

type rollupStateCache struct {
	mu sync.Mutex
	st rollupState
	// reading is the fresh read in flight (freshState), if any; gen counts
	// the invalidations, so that a read that started before one does not
	// become the cached state.
	reading *stateRead
	gen     uint64
}

// stateRead is one read of the state, shared by the window reads that
// asked for a state no older than its start.
type stateRead struct {
	started time.Time
	done    chan struct{}
	st      rollupState
	err     error
}

// invalidate drops the values: the next statement reads them again (after
// this process wrote labels or rollouts).
func (c *rollupStateCache) invalidate() {
	c.mu.Lock()
	c.st.valid = false
	c.gen++
	c.mu.Unlock()
}

// freshState returns a rollup state whose read started at or after asked,
// which is as good as reading it now: the cached one, the one being read,
// or a new read (the window reads of one evaluation, side by side, share
// one). The new state is cached for the dashboard's statements.
func (s *Store) freshState(ctx context.Context, asked time.Time) (rollupState, error) {
	c := &s.wm
	c.mu.Lock()
	if c.st.valid && !c.st.at.Before(asked) {
		st := c.st
		c.mu.Unlock()
		return st, nil
	}
	if r := c.reading; r != nil && !r.started.Before(asked) {
		c.mu.Unlock()
		select {
		case <-r.done:
			return r.st, r.err
		case <-ctx.Done():
			return rollupState{}, ctx.Err()
		}
	}
	r := &stateRead{started: time.Now(), done: make(chan struct{})}
	c.reading = r
	gen := c.gen
	c.mu.Unlock()
	r.st, r.err = s.readRollupState(ctx)
	c.mu.Lock()
	if c.reading == r {
		c.reading = nil
	}
	if r.err == nil && c.gen == gen && (!c.st.valid || !r.st.at.Before(c.st.at)) {
		c.st = r.st
	}
	c.mu.Unlock()
	close(r.done)
	return r.st, r.err
}

// rollupState returns the rollup's read state, read again when older than
// rollupStateTTL; ok false when it could not be read.
func (s *Store) rollupState(ctx context.Context) (rollupState, bool) {
	c := &s.wm
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st.valid && time.Since(c.st.at) < rollupStateTTL {
		return c.st, true
	}
	st, err := s.readRollupState(ctx)
	if err != nil {
		s.log.Debug("sink: rollup state not read; the statements read it themselves", "err", err)
		return rollupState{}, false
	}
	c.st = st
	return st, true
}

func (s *Store) readRollupState(ctx context.Context) (rollupState, error) {
	st := rollupState{at: time.Now(), valid: true}
	if err := s.conn.QueryRow(s.dashboardCtx(ctx), watermarkReadSQL).Scan(&st.through, &st.closed); err != nil {
		return st, fmt.Errorf("rollup watermark: %w", err)
	}
	rows, err := s.conn.Query(s.dashboardCtx(ctx), dirtyHoursSQL, st.through, uint64(maxInlineDirty+1))
	if err != nil {
		return st, fmt.Errorf("rollup dirty hours: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			kind uint8
			h    dirtyHour
		)
		if err := rows.Scan(&kind, &h.env, &h.av, &h.hour); err != nil {
			return st, fmt.Errorf("rollup dirty hours: %w", err)
		}
		if kind == rollupLabels {
			st.labels = append(st.labels, h)
		} else {
			st.outs = append(st.outs, h)
		}
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("rollup dirty hours: %w", err)
	}
	st.tooMany = len(st.labels) > maxInlineDirty || len(st.outs) > maxInlineDirty
	return st, nil
}

// watermarkReadSQL is the newest watermark of this build's layout (0 and
// 1970 when none).
const watermarkReadSQL = `SELECT argMax(through, at), toUInt32(argMax(closed_before, at)) FROM rollup_watermark WHERE slot = ` + rollupLayoutSQL

// dirtyHoursSQL lists the distinct hours of each kind changed after a
// watermark (binds: through, limit per kind).
const dirtyHoursSQL = `SELECT DISTINCT kind, environment, agent_version, toUInt32(hour) FROM rollup_log
WHERE last_ingest > ? ORDER BY kind, environment, agent_version LIMIT ? BY kind`

// inlineRollupState puts the rollup state's values in place of its
// subqueries in q; q as it is when the state cannot be read or the dirty
// sets are too large to inline.
func (s *Store) inlineRollupState(ctx context.Context, q string) string {
	st, ok := s.rollupState(ctx)
	return inlineState(q, st, ok)
}

// freshRollupState returns what puts the rollup state in place of its
// subqueries in the statements of one window read, with a state read since
// the call (once for all of the read's statements; see freshState), not up
// to rollupStateTTL ago: the decision windows (WindowCountsMulti,
// WindowInfoMulti) count a late label as soon as it is stored, whichever
// process stored it. A raw spec reads no state.
func (s *Store) freshRollupState(ctx context.Context, spec MultiSpec) func(string) string {
	if spec.raw() || len(spec.Cohorts) == 0 {
		return func(q string) string { return q }
	}
	st, err := s.freshState(ctx, time.Now())
	if err != nil {
		s.log.Debug("sink: rollup state not read; the statements read it themselves", "err", err)
		return func(q string) string { return q }
	}
	return func(q string) string { return inlineState(q, st, true) }
}

// inlineState puts st's values in place of the rollup state's subqueries
// in q (q as it is when !ok or the dirty sets are too large).
func inlineState(q string, st rollupState, ok bool) string {
	if !ok || st.tooMany {
		return q
	}
	// One pass, the dirty sets first (they contain wmThrough): the
	// literals put in are not searched again, since they hold agent
	// versions from rollouts, and one holding a subquery's text had it
	// replaced inside its quotes by a set whose quotes ended the literal
	// (SQL of a rollout's choosing in the dashboard's statements).
	return strings.NewReplacer(
		dirtyLabels, dirtyLiteral(st.labels),
		dirtyRollouts, dirtyLiteral(st.outs),
		wmThrough, fmt.Sprintf("toUInt64(%d)", st.through),
		wmClosed, fmt.Sprintf("toDateTime(%d)", st.closed),
	).Replace(q)
}

// dirtyLiteral is a literal set of (environment, agent_version, hour)
// tuples; an empty set is one tuple no cohort has (environments are never
// empty).
func dirtyLiteral(hs []dirtyHour) string {
	if len(hs) == 0 {
		return "(('', '', toDateTime(0)))"
	}
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = fmt.Sprintf("(%s, %s, toDateTime(%d))", quoteString(h.env), quoteString(h.av), h.hour)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// quoteString is a ClickHouse string literal.
func quoteString(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
