package sink

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Batcher holds rows in memory and writes them in batches with Insert:
// every Every (default 1s), or as soon as FlushAt rows (default 1,000) are
// waiting. Add never blocks on I/O. A failed write keeps its rows for the
// next one; while ClickHouse is down at most Max rows (default 100,000)
// are held, the oldest dropped beyond that and counted in the log, so a
// record that must never stall its caller (an audit, a routing decision)
// never does.
//
// Insert must not keep rows after it returns: a written batch's buffer
// is cleared and reused for a later batch.
type Batcher[T any] struct {
	Insert  func(ctx context.Context, rows []T) error
	Name    string // in the log lines
	Log     *slog.Logger
	Every   time.Duration
	FlushAt int
	Max     int

	once    sync.Once
	mu      sync.Mutex
	buf     []T
	spare   []T // a written batch's buffer, cleared, for the next swap
	dropped int
	kick    chan struct{}

	// The rows of the batch being written, told to the INSERT through its
	// context (for the stall warning, sink/stall.go); the context is made
	// once per parent, so that a Flush allocates nothing.
	hint            atomic.Int64
	hintOf, hintCtx context.Context
}

func (b *Batcher[T]) init() {
	b.once.Do(func() {
		b.kick = make(chan struct{}, 1)
		if b.Every <= 0 {
			b.Every = time.Second
		}
		if b.FlushAt <= 0 {
			b.FlushAt = 1000
		}
		if b.Max <= 0 {
			b.Max = 100000
		}
		if b.Log == nil {
			b.Log = slog.New(slog.DiscardHandler)
		}
		b.buf = make([]T, 0, b.FlushAt)
	})
}

// Add queues a row. Its critical section is one copy into a buffer
// allocated in advance (Flush swaps in the next one before taking the
// lock), so that concurrent callers on a hot path (every proxied request)
// never wait behind a growing append.
func (b *Batcher[T]) Add(row T) {
	b.init()
	b.mu.Lock()
	if len(b.buf) >= b.Max {
		b.buf = b.buf[1:]
		b.dropped++
	}
	b.buf = append(b.buf, row)
	full := len(b.buf) >= b.FlushAt
	b.mu.Unlock()
	if full {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
}

// Run flushes until ctx ends, then flushes what is left (within 5s). A
// write in flight when ctx ends is not cancelled at once but given 5s too:
// a cancelled INSERT may have been stored all the same, and its rows, kept
// for the retry, would be written twice.
func (b *Batcher[T]) Run(ctx context.Context) error {
	b.init()
	t := time.NewTicker(b.Every)
	defer t.Stop()
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	defer context.AfterFunc(ctx, func() { time.AfterFunc(5*time.Second, cancelWork) })()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			b.Flush(fctx)
			return nil
		case <-t.C:
		case <-b.kick:
		}
		b.Flush(work)
	}
}

// Flush writes the waiting rows now; on failure they stay waiting.
func (b *Batcher[T]) Flush(ctx context.Context) {
	b.init()
	b.mu.Lock()
	empty := len(b.buf) == 0 && b.dropped == 0
	b.mu.Unlock()
	if empty {
		return
	}
	b.mu.Lock()
	next := b.spare
	b.spare = nil
	b.mu.Unlock()
	if next == nil {
		next = make([]T, 0, b.FlushAt) // allocated outside the lock
	}
	b.mu.Lock()
	rows, dropped := b.buf, b.dropped
	b.buf, b.dropped = next, 0
	b.mu.Unlock()
	if dropped > 0 {
		b.Log.Warn(b.Name+": buffer full while ClickHouse was unavailable; oldest rows dropped", "dropped", dropped)
	}
	if len(rows) == 0 {
		return
	}
	if err := b.Insert(b.insertCtx(ctx, len(rows)), rows); err != nil {
		b.Log.Warn(b.Name+": insert failed; will retry", "rows", len(rows), "err", err)
		b.mu.Lock()
		b.buf = append(rows, b.buf...)
		if over := len(b.buf) - b.Max; over > 0 {
			b.buf = b.buf[over:]
			b.dropped += over
		}
		b.mu.Unlock()
		return
	}
	// The written buffer is the next swap's, unless it grew past one
	// batch (a backlog after an outage is left to the collector).
	if cap(rows) <= 2*b.FlushAt {
		clear(rows[:cap(rows)]) // drop the rows' references
		b.mu.Lock()
		b.spare = rows[:0]
		b.mu.Unlock()
	}
}

// insertCtx is ctx telling the INSERT it holds n rows.
func (b *Batcher[T]) insertCtx(ctx context.Context, n int) context.Context {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.hintOf != ctx {
		b.hintOf, b.hintCtx = ctx, withPendingRows(ctx, &b.hint)
	}
	b.hint.Store(int64(n))
	return b.hintCtx
}

// Pending is the number of rows waiting for a write (a batch being
// written is not counted).
func (b *Batcher[T]) Pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.buf)
}
