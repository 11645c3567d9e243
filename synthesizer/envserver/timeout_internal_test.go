package envserver

import (
	"math"
	"testing"
	"time"
)

// TestStepTimeoutOverride: a step's timeout_s lowers the server's step
// timeout and never raises it; a huge value (whose Duration would
// overflow), infinity, NaN, zero and negative values leave the server's.
func TestStepTimeoutOverride(t *testing.T) {
	const server = 30 * time.Second
	f := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		name string
		in   *float64
		want time.Duration
	}{
		{"absent", nil, server},
		{"lower", f(0.5), 500 * time.Millisecond},
		{"equal", f(30), server},
		{"higher", f(31), server},
		{"overflows a Duration", f(1e10), server},
		{"largest float", f(math.MaxFloat64), server},
		{"infinity", f(math.Inf(1)), server},
		{"NaN", f(math.NaN()), server},
		{"zero", f(0), server},
		{"negative", f(-1), server},
		{"negative infinity", f(math.Inf(-1)), server},
	} {
		if got := stepTimeout(server, c.in); got != c.want {
			t.Errorf("%s: stepTimeout = %s, want %s", c.name, got, c.want)
		}
	}
}
