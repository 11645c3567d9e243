package sink

import "testing"

// An agent version (a rollout's, unconstrained) holding the text of a
// subquery that inlineState replaces stays the literal it was: it used to
// be replaced inside its quotes, by the other dirty set, whose quotes ended
// the literal and made the next agent version SQL.
func TestInlineStateLeavesLiteralsAlone(t *testing.T) {
	st := rollupState{through: 7, closed: 3600, valid: true,
		labels: []dirtyHour{{env: "e", av: "v" + dirtyRollouts, hour: 3600}, {env: "e", av: "w" + wmThrough, hour: 3600}},
		outs:   []dirtyHour{{env: "e", av: "1 OR 1 = 1 --", hour: 7200}}}
	q := "SELECT 1 WHERE a NOT IN " + dirtyLabels + " AND b NOT IN " + dirtyRollouts + " AND c > " + wmThrough + " AND d < " + wmClosed
	want := "SELECT 1 WHERE a NOT IN " + dirtyLiteral(st.labels) + " AND b NOT IN " + dirtyLiteral(st.outs) + " AND c > toUInt64(7) AND d < toDateTime(3600)"
	if got := inlineState(q, st, true); got != want {
		t.Errorf("inlineState:\n got %s\nwant %s", got, want)
	}
}
