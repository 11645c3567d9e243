package dashboard

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestTrendsAtBoundsTheWeeks: with at in the past, the trends show the
// weeks up to at's week and none after it: the pass rate and the weekly
// LACKING table end with "this week", as the week over week and the weeks
// listed do, before and after the rollup.
func TestTrendsAtBoundsTheWeeks(t *testing.T) {
	st := openStore(t)
	now := time.Now().UTC().Truncate(time.Second)
	d := seedDemo(t, st, now)
	h := newHandler(st, now, registry())
	at := now.Add(-14 * 24 * time.Hour)
	check := func(t *testing.T) {
		var tr TrendsResponse
		getJSON(t, h, fmt.Sprintf("/api/trends?env=airline&weeks=2&at=%d", at.Unix()), &tr)
		if got, want := tr.ThisWeek.Format(time.DateOnly), d.monday(at); got != want || len(tr.Weeks) != 2 {
			t.Fatalf("this week %s, weeks %v; want %s and 2 weeks", got, tr.Weeks, want)
		}
		n := 0
		for _, w := range tr.PassRate {
			if !slices.ContainsFunc(tr.Weeks, w.Week.Equal) {
				t.Errorf("pass rate of %s week %s, outside the weeks shown %v", w.AgentVersion, w.Week.Format(time.DateOnly), tr.Weeks)
				continue
			}
			n++
			if e := d.passWeekly("airline", w.AgentVersion)[w.Week.Format(time.DateOnly)]; w.Rollouts != e[0] || w.Successes != e[1] {
				t.Errorf("%s week %s: %d/%d, want %v", w.AgentVersion, w.Week.Format(time.DateOnly), w.Successes, w.Rollouts, e)
			}
		}
		if n == 0 {
			t.Error("no pass rate in the weeks shown")
		}
		for _, l := range tr.Lacking {
			if !slices.ContainsFunc(tr.Weeks, l.Week.Equal) {
				t.Errorf("LACKING table of %s week %s, outside the weeks shown %v", l.AgentVersion, l.Week.Format(time.DateOnly), tr.Weeks)
			}
		}
		// Only v1 has rollouts in those weeks (v2's are of the last 5 days).
		if !slices.Equal(tr.AgentVersions, []string{"v1"}) {
			t.Errorf("agent versions = %v, want [v1]", tr.AgentVersions)
		}
	}
	t.Run("raw", check)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := st.RollupAll(ctx, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	t.Run("rollup", check)
}
