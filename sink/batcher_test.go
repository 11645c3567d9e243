package sink

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// A failed write keeps its rows (in order, before newer ones) for the next
// one; beyond Max the oldest are dropped.
func TestBatcherRetainsAndBounds(t *testing.T) {
	var written [][]int
	fail := true
	b := &Batcher[int]{Max: 4, Insert: func(_ context.Context, rows []int) error {
		if fail {
			return errors.New("down")
		}
		written = append(written, slices.Clone(rows))
		return nil
	}}
	ctx := context.Background()
	b.Add(1)
	b.Add(2)
	b.Flush(ctx) // fails: 1, 2 kept
	if b.Pending() != 2 || len(written) != 0 {
		t.Fatalf("after a failed flush: pending %d, written %v", b.Pending(), written)
	}
	for _, v := range []int{3, 4, 5} { // 5 exceeds Max: 1 is dropped
		b.Add(v)
	}
	fail = false
	b.Flush(ctx)
	if len(written) != 1 || !slices.Equal(written[0], []int{2, 3, 4, 5}) || b.Pending() != 0 {
		t.Fatalf("written %v, pending %d; want [[2 3 4 5]] and 0", written, b.Pending())
	}
	b.Flush(ctx) // nothing waiting: no write
	if len(written) != 1 {
		t.Fatalf("an empty flush wrote %v", written)
	}
}

// A written batch's buffer is reused: in the steady state (Add, then a
// successful Flush) nothing is allocated, every batch is written whole
// and in order, and a reused buffer holds no row of an earlier batch.
func TestBatcherReusesWrittenBuffers(t *testing.T) {
	written := make([]*int, 0, 1024) // preallocated: the test's own record allocates nothing
	b := &Batcher[*int]{FlushAt: 8, Insert: func(_ context.Context, rows []*int) error {
		if len(rows) > 0 && cap(rows) > len(rows) && rows[:cap(rows)][len(rows)] != nil {
			t.Errorf("a reused buffer still holds an earlier batch's row past its %d rows", len(rows))
		}
		written = append(written, rows...)
		return nil
	}}
	ctx := context.Background()
	vals := make([]int, 64)
	next := 0
	batch := func(n int) {
		for range n {
			b.Add(&vals[next%len(vals)])
			next++
		}
		b.Flush(ctx)
	}
	batch(5) // the first batches allocate the two buffers
	batch(3)
	if allocs := testing.AllocsPerRun(20, func() { batch(2) }); allocs > 0 {
		t.Errorf("Add and Flush allocated %.1f times per batch in the steady state; want 0", allocs)
	}
	for i, p := range written {
		if p != &vals[i%len(vals)] {
			t.Fatalf("row %d is not the %dth added", i, i)
		}
	}
	if len(written) != next {
		t.Fatalf("%d rows written, %d added", len(written), next)
	}
}

// An insert in flight when Run's context ends is not cancelled (a
// cancelled insert may have been stored all the same: its rows, kept for
// the retry, would be written again by the last flush).
func TestBatcherRunDoesNotCancelTheInsertInFlight(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var written []int
	b := &Batcher[int]{FlushAt: 1, Insert: func(ctx context.Context, rows []int) error {
		if len(written) == 0 {
			close(started)
			<-release
		}
		written = append(written, rows...) // stored, whatever the client then hears
		return ctx.Err()
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	b.Add(1) // FlushAt: written at once
	<-started
	cancel() // shutdown while the insert is in flight
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(written, []int{1}) || b.Pending() != 0 {
		t.Fatalf("written %v, pending %d; want [1] once", written, b.Pending())
	}
}
