package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// RSSResult is the outcome of RunRSS.
type RSSResult struct {
	Rollouts      int
	Bytes         int64
	Elapsed       time.Duration
	PeakRSSKB     int64 // VmHWM since the stream started (the peak was reset before it)
	ProcessPeakKB int64 // VmHWM of the whole process, setup included
	MaxSampledKB  int64 // highest VmRSS seen by the 250ms sampler
	StartRSSKB    int64 // VmRSS when the stream started
	MaxHeapInUse  uint64
	PeakReset     bool // whether /proc/self/clear_refs reset the peak
}

// RunRSS streams opt.RSSRollouts compact rollouts through the consumer while
// a producer generates them on the fly (only the 164 templates are held),
// and reports the peak resident memory of this process: trace's consumer,
// the embedded broker (its log on disk), the producer and the row
// conversion. The broker, the producer and the consumer run concurrently.
func RunRSS(ctx context.Context, opt Options) (RSSResult, error) {
	n := opt.RSSRollouts
	opt.Sets = []Set{}
	e, cleanup, err := setup(ctx, &opt)
	if err != nil {
		return RSSResult{}, err
	}
	defer cleanup()
	rollouts, err := LoadTau2(opt.Tau2Dir)
	if err != nil {
		return RSSResult{}, err
	}
	ds, err := NewDataset(Compact, rollouts, e.run)
	if err != nil {
		return RSSResult{}, err
	}
	rollouts = nil
	store, err := e.store(ctx, "bench_"+e.run+"_rss")
	if err != nil {
		return RSSResult{}, err
	}
	defer store.Close()
	topic := "bench-" + e.run + "-rss"
	// Create the topic before the consumer joins.
	if err := e.createTopic(ctx, topic); err != nil {
		return RSSResult{}, err
	}

	runtime.GC()
	debug.FreeOSMemory()
	res := RSSResult{Rollouts: n, StartRSSKB: ProcStatusKB("VmRSS"), ProcessPeakKB: ProcStatusKB("VmHWM")}
	// Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
	res.PeakReset = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil

	var maxRSS atomic.Int64
	var maxHeap atomic.Uint64
	sample := func() {
		if v := ProcStatusKB("VmRSS"); v > maxRSS.Load() {
			maxRSS.Store(v)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-t.C:
				sample()
				if i%8 == 0 {
					runtime.ReadMemStats(&ms)
					if ms.HeapInuse > maxHeap.Load() {
						maxHeap.Store(ms.HeapInuse)
					}
				}
			}
		}
	}()

	prodErr := make(chan error, 1)
	var produced atomic.Int64
	pctx, cancelProd := context.WithCancel(ctx)
	defer cancelProd()
	go func() {
		b, err := e.produce(pctx, topic, ds, n)
		produced.Store(b)
		prodErr <- err
	}()
	t0 := time.Now()
	_, _, err = e.runConsumer(ctx, topic, "bench-rss-"+e.run, store, int64(n), func() {
		sample()
	})
	res.Elapsed = time.Since(t0)
	close(stop)
	wg.Wait()
	if err != nil {
		return res, err
	}
	if err := <-prodErr; err != nil {
		return res, err
	}
	res.Bytes = produced.Load()
	res.PeakRSSKB = ProcStatusKB("VmHWM")
	res.MaxSampledKB = maxRSS.Load()
	res.MaxHeapInUse = maxHeap.Load()
	res.ProcessPeakKB = max(res.ProcessPeakKB, res.PeakRSSKB)
	e.log.Info("rss run done", "rollouts", n, "elapsed", res.Elapsed.Round(time.Millisecond), "peak_rss_MB", res.PeakRSSKB>>10)
	return res, e.checkCount(ctx, "bench_"+e.run+"_rss", n)
}

// String formats the result.
func (r RSSResult) String() string {
	s := fmt.Sprintf("streamed %d compact rollouts (%.0f MB) in %v: %.0f rollouts/s\n", r.Rollouts, float64(r.Bytes)/1e6,
		r.Elapsed.Round(time.Millisecond), float64(r.Rollouts)/r.Elapsed.Seconds())
	s += fmt.Sprintf("peak RSS (VmHWM) during the stream: %d MB  (RSS at start %d MB, highest 250ms sample %d MB, max Go heap in use %d MB)\n",
		r.PeakRSSKB>>10, r.StartRSSKB>>10, r.MaxSampledKB>>10, r.MaxHeapInUse>>20)
	s += fmt.Sprintf("peak RSS of the whole process, setup (τ² conversion) included: %d MB\n", r.ProcessPeakKB>>10)
	if !r.PeakReset {
		s += "(the kernel did not let the peak be reset: VmHWM covers the whole process, setup included)\n"
	}
	return s
}
