package dashboard

import (
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // America/New_York on a machine without the zone files
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
		rg := timeRange(c.asOf, now, c.hours, c.bucket, time.UTC)
		if !rg.Until.Equal(c.asOf) || !rg.AsOf.Equal(c.asOf) || !rg.Since.Equal(c.since) || rg.All != c.all || (rg.Warning != "") != c.warned {
			t.Errorf("%s: %+v; want since %v, until %v, all %v, warning %v", c.name, rg, c.since, c.asOf, c.all, c.warned)
		}
		if c.warned && !strings.Contains(rg.Warning, "3 hours") {
			t.Errorf("%s: warning %q", c.name, rg.Warning)
		}
	}
}

// TestBucketStart: a chart's first bucket starts where the server's
// toStartOfHour / toStartOfDay start it, in the server's time zone.
func TestBucketStart(t *testing.T) {
	ist := time.FixedZone("IST", 5*3600+1800)
	est := time.FixedZone("EST", -5*3600)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatalf("tzdata: %v", err)
	}
	at := time.Date(2026, 12, 1, 3, 47, 12, 5, time.UTC)
	// DST ends in New York at 2026-11-01 06:00 UTC: 06:30 UTC is 01:30 EST,
	// the second 01:00–02:00 of that day.
	repeated := time.Date(2026, 11, 1, 6, 30, 0, 0, time.UTC)
	for _, c := range []struct {
		name   string
		t      time.Time
		bucket string
		loc    *time.Location
		want   time.Time
	}{
		{"hour, UTC", at, bucketHour, time.UTC, time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)},
		{"day, UTC", at, bucketDay, time.UTC, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		{"nil is UTC", at, bucketDay, nil, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		{"hour, +05:30", at, bucketHour, ist, time.Date(2026, 12, 1, 3, 30, 0, 0, time.UTC)},
		{"day, +05:30", at, bucketDay, ist, time.Date(2026, 11, 30, 18, 30, 0, 0, time.UTC)},
		{"day, -05:00 (the previous local day)", at, bucketDay, est, time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)},
		{"hour repeated at the end of DST", repeated, bucketHour, ny, time.Date(2026, 11, 1, 6, 0, 0, 0, time.UTC)},
	} {
		if got := bucketStart(c.t, c.bucket, c.loc); !got.Equal(c.want) {
			t.Errorf("%s: %v, want %v", c.name, got.UTC(), c.want)
		}
	}
	// The range's start is the bucket's, whatever the zone.
	if rg := timeRange(at, at, 24, bucketDay, est); !rg.Since.Equal(time.Date(2026, 11, 29, 5, 0, 0, 0, time.UTC)) {
		t.Errorf("24 hours by day in EST start %v, want the local day before's midnight", rg.Since)
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

// TestAllRangeStart: with hours=all a chart starts at its first bucket (on
// the capability page as on the overview), not at the zero time: the
// capability page drew its x axis from year 1, every point squeezed at the
// right edge under some 16,000 grid lines.
func TestAllRangeStart(t *testing.T) {
	st := openStore(t)
	now := time.Now().UTC().Truncate(time.Second)
	seedDemo(t, st, now)
	h := newHandler(st, now, registry())
	var c CapabilityResponse
	getJSON(t, h, "/api/capability?env=airline&agent_version=v2&dict=1&hours=all&name="+capMulti, &c)
	if !c.Range.All || len(c.Series) == 0 {
		t.Fatalf("range %+v, %d points", c.Range, len(c.Series))
	}
	if first := c.Series[0].Bucket; !c.Range.Since.Equal(first) {
		t.Errorf("capability, all: since %v, want its first bucket %v", c.Range.Since, first)
	}
	var o OverviewResponse
	getJSON(t, h, "/api/overview?env=airline&agent_version=v2&hours=all", &o)
	first := o.Range.Until
	for _, ps := range o.PassRate {
		if len(ps.Points) > 0 && ps.Points[0].Bucket.Before(first) {
			first = ps.Points[0].Bucket
		}
	}
	for _, cs := range o.Capabilities {
		if len(cs.Points) > 0 && cs.Points[0].Bucket.Before(first) {
			first = cs.Points[0].Bucket
		}
	}
	if !o.Range.All || !o.Range.Since.Equal(first) {
		t.Errorf("overview, all: %+v, want since %v", o.Range, first)
	}
	// A capability without labels: the range is the bucket of the
	// watermark, not the zero time.
	var none CapabilityResponse
	getJSON(t, h, "/api/capability?env=airline&agent_version=v2&dict=1&hours=all&name=no_such_thing", &none)
	if none.Range.Since.IsZero() || none.Range.Since.After(none.Range.Until) {
		t.Errorf("no labels, all: %+v", none.Range)
	}
	// The page's charts have a handful of x ticks each.
	code, body := getStatus(h, "/capability?env=airline&agent_version=v2&dict=1&hours=all&name="+capMulti)
	if n := strings.Count(body, `class="grid vgrid"`); code != 200 || n > 40 {
		t.Errorf("capability page, all: %d, %d x grid lines", code, n)
	}
}
