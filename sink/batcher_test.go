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
