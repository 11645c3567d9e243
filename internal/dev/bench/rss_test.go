package bench

import (
	"strings"
	"testing"
	"time"
)

// TestRSSResultRate: the RSS run's rate is printed only when the backlog
// took at least one of its once-a-second counts to store; stored by the
// first count, it has none (it printed 41,797,283 rollouts/s).
func TestRSSResultRate(t *testing.T) {
	for _, tc := range []struct {
		elapsed time.Duration
		want    string
	}{
		{0, "no rate"},
		{300 * time.Millisecond, "no rate"},
		{time.Second, "2000 rollouts/s"},
		{10 * time.Second, "200 rollouts/s"},
	} {
		got := RSSResult{Rollouts: 2000, Elapsed: tc.elapsed}.String()
		if !strings.Contains(got, tc.want) {
			t.Errorf("elapsed %v: %q, want it to say %q", tc.elapsed, got, tc.want)
		}
	}
}
