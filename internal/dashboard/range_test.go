package dashboard

import (
	"strings"
	"testing"
	"time"
)

// TestTimeRange: a chart's range ends at the watermark of what it shows,
// not at the wall clock; "all" has no start; a watermark in the future is
// shown with a warning.
func TestTimeRange(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC)
	old := time.Date(2025, 6, 2, 14, 6, 19, 0, time.UTC)
	for _, c := range []struct {
		name        string
		asOf        time.Time
		hours       int
		bucket      string
		since       time.Time
		all, warned bool
	}{
		{"2025 data, 24 h", old, 24, bucketHour, time.Date(2025, 6, 1, 14, 0, 0, 0, time.UTC), false, false},
		{"2025 data, 7 days by day", old, 168, bucketDay, time.Date(2025, 5, 26, 0, 0, 0, 0, time.UTC), false, false},
		{"all", old, 0, bucketHour, time.Time{}, true, false},
		{"live", now, 24, bucketHour, now.Add(-24 * time.Hour).Truncate(time.Hour), false, false},
		{"a little ahead", now.Add(time.Minute), 24, bucketHour, now.Add(time.Minute - 24*time.Hour).Truncate(time.Hour), false, false},
		{"clock skew", now.Add(3 * time.Hour), 24, bucketHour, now.Add(3*time.Hour - 24*time.Hour).Truncate(time.Hour), false, true},
	} {
		rg := timeRange(c.asOf, now, c.hours, c.bucket)
		if !rg.Until.Equal(c.asOf) || !rg.AsOf.Equal(c.asOf) || !rg.Since.Equal(c.since) || rg.All != c.all || (rg.Warning != "") != c.warned {
			t.Errorf("%s: %+v; want since %v, until %v, all %v, warning %v", c.name, rg, c.since, c.asOf, c.all, c.warned)
		}
		if c.warned && !strings.Contains(rg.Warning, "3 hours") {
			t.Errorf("%s: warning %q", c.name, rg.Warning)
		}
	}
}

// TestAnchor: the watermark of an environment is its newest cohort's.
func TestAnchor(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	a, b := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2025, 6, 2, 0, 0, 0, 0, time.UTC)
	list := []CohortSummary{
		{CohortKey: CohortKey{Environment: "x", AgentVersion: "1"}, LastSeen: a},
		{CohortKey: CohortKey{Environment: "x", AgentVersion: "2"}, LastSeen: b},
		{CohortKey: CohortKey{Environment: "y", AgentVersion: "1"}, LastSeen: now.Add(time.Hour)},
	}
	if got := anchor(list, "x", now); !got.Equal(b) {
		t.Errorf("anchor(x) = %v, want %v", got, b)
	}
	if got := anchor(list, "nowhere", now); !got.Equal(now) {
		t.Errorf("anchor(nowhere) = %v, want now", got)
	}
}
