package gcpace

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPolicyGOGC(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name string
		p    Policy
		live uint64
		want int
	}{
		{"ratio alone", Policy{Percent: 400}, 8 * mib, 400},
		{"ratio alone, Go's default", Policy{}, 8 * mib, 100},
		{"headroom dominates a small heap", Policy{Percent: 100, Headroom: 128 * mib}, 8 * mib, 1600},
		{"headroom rounds up", Policy{Percent: 100, Headroom: 128 * mib}, 3 * 8 * mib, 534},
		{"the ratio dominates a large heap", Policy{Percent: 100, Headroom: 128 * mib}, 400 * mib, 100},
		{"equal at the crossover", Policy{Percent: 100, Headroom: 128 * mib}, 128 * mib, 100},
		{"Go's default with headroom", Policy{Headroom: 128 * mib}, 64 * mib, 200},
		{"before the first collection", Policy{Percent: 100, Headroom: 128 * mib}, 0, 6400},
		{"bounded", Policy{Percent: 100, Headroom: 1 << 50}, 8 * mib, maxPercent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.GOGC(tc.live); got != tc.want {
				t.Errorf("GOGC(%d MiB) = %d, want %d", tc.live/mib, got, tc.want)
			}
			goal := tc.p.Goal(tc.live)
			if tc.live > 0 && tc.want < maxPercent {
				if floor := tc.live + tc.p.Headroom; goal < floor {
					t.Errorf("goal %d MiB below live + headroom %d MiB", goal/mib, floor/mib)
				}
				if pct := max(tc.p.Percent, 100); tc.p.Percent > 0 && goal < tc.live+tc.live*uint64(pct)/100 {
					t.Errorf("goal %d MiB below the ratio's", goal/mib)
				}
			}
		})
	}
}

func gcPercent(t *testing.T) int {
	t.Helper()
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// TestStartFollowsTheLiveHeap: Start sets the target at once and again
// after collections, as the live heap changes; stop ends it.
func TestStartFollowsTheLiveHeap(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	p := Policy{Percent: 100, Headroom: 256 << 20}
	stop := Start(p)
	defer stop()
	runtime.GC()
	live := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	// The cleanup runs on its own goroutine after the collection.
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: GOGC %d, live heap %d MiB", what, gcPercent(t), live()>>20)
			}
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
		}
	}
	near := func(got, want int) bool { return got >= want-want/8 && got <= want+want/8 }
	waitFor("small live heap", func() bool { return near(gcPercent(t), p.GOGC(live())) && gcPercent(t) > 1000 })

	// A live heap of ~512 MiB: the ratio (100) takes over.
	big := make([][]byte, 512)
	for i := range big {
		big[i] = make([]byte, 1<<20)
	}
	waitFor("large live heap", func() bool { return gcPercent(t) == 100 })
	runtime.KeepAlive(big)
	big = nil

	waitFor("small again", func() bool { return gcPercent(t) > 1000 })
	stop()
	debug.SetGCPercent(123)
	for range 3 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	if got := gcPercent(t); got != 123 {
		t.Fatalf("after stop the target was set again: %d", got)
	}
}

// TestStartWithoutHeadroom sets the ratio once.
func TestStartWithoutHeadroom(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	stop := Start(Policy{Percent: 321})
	defer stop()
	if got := gcPercent(t); got != 321 {
		t.Fatalf("GOGC %d, want 321", got)
	}
}

// TestStartZeroPolicyChangesNothing: the zero Policy (a process that sets
// none, or GOGC in the environment) leaves the collector target as it is.
func TestStartZeroPolicyChangesNothing(t *testing.T) {
	prev := debug.SetGCPercent(237)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	stop := Start(Policy{})
	defer stop()
	runtime.GC()
	if got := gcPercent(t); got != 237 {
		t.Fatalf("GOGC %d after Start(Policy{}), want the 237 set before", got)
	}
}
