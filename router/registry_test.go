package router_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/router"
	"github.com/traceops/trace/sink"
)

// countingRows is the real store, counting the registry's reads and
// whether each had a deadline.
type countingRows struct {
	*sink.Store
	reads, withDeadline atomic.Int64
}

func (c *countingRows) Adapters(ctx context.Context, f sink.AdapterFilter) ([]sink.AdapterRow, error) {
	c.reads.Add(1)
	if _, ok := ctx.Deadline(); ok {
		c.withDeadline.Add(1)
	}
	return c.Store.Adapters(ctx, f)
}

// TestRegistryRemembersAFailedRead: real ClickHouse whose adapters table
// goes away. A failed read is tried again only after the TTL, however many
// conversations ask meanwhile, and the last list is served while it is
// younger than 10 × TTL, then the error; each read has a deadline of its own
// although the caller's context has none. When the table is back, the next
// read after the TTL succeeds.
func TestRegistryRemembersAFailedRead(t *testing.T) {
	ctx := context.Background()
	st := testenv.ClickHouse(t).Store()
	if err := st.SaveAdapter(ctx, adapterRow("lora-ids", "id_verification")); err != nil {
		t.Fatal(err)
	}
	rows := &countingRows{Store: st}
	const ttl = 200 * time.Millisecond
	reg := &router.Registry{Rows: rows, TTL: ttl}
	ask := func() ([]router.Candidate, error) { return reg.ActiveAdapters(ctx, env, "1.0") }
	if c, err := ask(); err != nil || len(c) != 1 || c[0].Adapter != "lora-ids" {
		t.Fatalf("first read: %+v %v", c, err)
	}
	conn := testenv.StoreConn(t, st)
	if err := conn.Exec(ctx, "RENAME TABLE adapters TO adapters_away"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl)
	for i := range 20 { // twenty conversations within one TTL of the failed read
		if c, err := ask(); err != nil || len(c) != 1 {
			t.Fatalf("ask %d with the registry down: %+v %v, want the last list", i, c, err)
		}
	}
	if n := rows.reads.Load(); n != 2 {
		t.Fatalf("%d reads, want 2: a failed read is not repeated within the TTL", n)
	}
	// Past 10 × TTL the stale list is no longer served: the error is.
	time.Sleep(10 * ttl)
	if c, err := ask(); err == nil {
		t.Fatalf("a list older than 10 × TTL served: %+v", c)
	}
	if err := conn.Exec(ctx, "RENAME TABLE adapters_away TO adapters"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl)
	if c, err := ask(); err != nil || len(c) != 1 {
		t.Fatalf("after recovery: %+v %v", c, err)
	}
	if rows.withDeadline.Load() != rows.reads.Load() {
		t.Fatalf("%d of %d reads had a deadline", rows.withDeadline.Load(), rows.reads.Load())
	}
}
