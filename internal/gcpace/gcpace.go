// Package gcpace paces Go's garbage collector by bytes as well as by
// ratio. Go's GOGC lets the heap grow past the live heap by a percentage
// of it before the next collection; a process whose live heap is small and
// whose garbage is plentiful (a proxy: a few MB live, kilobytes of garbage
// per request) then collects many times a second, and each collection
// holds up the requests in flight. A Policy adds a floor in bytes: the
// heap may always grow by at least Headroom, so the collections come once
// per Headroom of garbage while the live heap is small, and at the ratio
// once it is large (Headroom no longer dominates).
//
// Go has no such setting (GOMEMLIMIT is a ceiling, not a floor), so Start
// sets GOGC again after every collection from the live heap that
// collection found (runtime/metrics /gc/heap/live:bytes). GOMEMLIMIT, when
// set, still caps the heap.
package gcpace

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// Policy is a collector target: the next collection comes when the heap
// has grown past the live heap by max(Headroom, live × Percent / 100).
type Policy struct {
	// Percent is Go's GOGC (0 means Go's default, 100).
	Percent int
	// Headroom is the least growth in bytes (0: the ratio alone).
	Headroom uint64
}

// minLive is the live heap assumed before the first collection, Go's own
// minimum heap goal at GOGC 100 (4 MB) halved.
const minLive = 2 << 20

// maxPercent bounds the target Start sets, far above any useful value
// (a 1 MB live heap with 10 GB of headroom).
const maxPercent = 1_000_000

// GOGC is the collector target that puts the next collection at the
// policy's heap goal for a live heap of live bytes.
func (p Policy) GOGC(live uint64) int {
	pct := p.Percent
	if pct <= 0 {
		pct = 100
	}
	if p.Headroom == 0 {
		return pct
	}
	live = max(live, minLive)
	byHeadroom := math.Ceil(float64(p.Headroom) * 100 / float64(live))
	return int(min(max(float64(pct), byHeadroom), maxPercent))
}

// Goal is the heap size the policy lets a live heap of live bytes reach.
func (p Policy) Goal(live uint64) uint64 {
	return live + live*uint64(p.GOGC(live))/100
}

// Start sets the collector target for the live heap now and again after
// every collection, until stop is called (stop leaves the last target
// set). A policy without Headroom is one fixed target, set once; the zero
// Policy changes nothing (Go's own setting, GOGC in the environment
// included, stays).
func Start(p Policy) (stop func()) {
	if p == (Policy{}) {
		return func() {}
	}
	pc := &pacer{p: p, last: -1}
	pc.apply()
	if p.Headroom == 0 {
		return func() {}
	}
	pc.arm()
	var once sync.Once
	return func() { once.Do(func() { pc.stopped.Store(true) }) }
}

type pacer struct {
	p       Policy
	stopped atomic.Bool
	mu      sync.Mutex
	last    int
	sample  [1]metrics.Sample
}

// sentinel is a heap object nothing refers to: its cleanup runs after the
// collection that finds it unreachable, which is every collection, since
// each cleanup arms a new one. It holds a pointer so that it is not
// placed in a tiny-allocator block beside other objects (whose cleanups
// would then wait for all of them).
type sentinel struct{ _ *pacer }

func (pc *pacer) arm() {
	runtime.AddCleanup(&sentinel{}, func(pc *pacer) {
		if pc.stopped.Load() {
			return
		}
		pc.apply()
		pc.arm()
	}, pc)
}

// apply sets the target for the live heap the last collection found, when
// it differs from the one set by more than an eighth (each change
// recomputes the collector's pacing).
func (pc *pacer) apply() {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.sample[0].Name = "/gc/heap/live:bytes"
	metrics.Read(pc.sample[:])
	var live uint64
	if pc.sample[0].Value.Kind() == metrics.KindUint64 {
		live = pc.sample[0].Value.Uint64()
	}
	n := pc.p.GOGC(live)
	if pc.last >= 0 && n >= pc.last-pc.last/8 && n <= pc.last+pc.last/8 {
		return
	}
	debug.SetGCPercent(n)
	pc.last = n
}
