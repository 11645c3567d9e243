package sink_test

import (
	"context"
	"strings"
	"testing"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
)

// clickhouse.retention_days on a running deployment: on a server without
// TTL (18.16, CI's) Migrate refuses it, naming the setting, before any
// table is made; on a modern server (TRACE_TEST_CLICKHOUSE) a change takes
// effect on the existing tables at the next start.
func TestRetentionRefusedWithoutTTL(t *testing.T) {
	ch := testenv.ClickHouse(t)
	ctx := context.Background()
	open := func(days int) (*sink.Store, error) {
		s, err := sink.Open(ctx, sink.Config{Addr: []string{ch.Addr}, Database: ch.Database, RetentionDays: days}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s, s.Migrate(ctx)
	}
	s, err := open(30)
	if !s.Features().TTL {
		if err == nil || !strings.Contains(err.Error(), "clickhouse.retention_days: 30") || !strings.Contains(err.Error(), s.Version().String()) {
			t.Fatalf("Migrate with retention_days 30 on ClickHouse %s: %v, want a refusal naming the setting and the version", s.Version(), err)
		}
		var n uint64
		if err := testenv.StoreConn(t, s).QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = 'rollouts'", ch.Database).Scan(&n); err != nil || n != 0 {
			t.Fatalf("rollouts made before the refusal: n=%d err=%v", n, err)
		}
		if _, err := open(0); err != nil {
			t.Fatalf("Migrate with retention_days 0: %v", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	engine := func(s *sink.Store) string {
		var e string
		if err := testenv.StoreConn(t, s).QueryRow(ctx, "SELECT engine_full FROM system.tables WHERE database = ? AND name = 'rollouts'", ch.Database).Scan(&e); err != nil {
			t.Fatal(err)
		}
		return e
	}
	if e := engine(s); !strings.Contains(e, "TTL end_time + toIntervalDay(30)") {
		t.Fatalf("rollouts made with retention 30: %s", e)
	}
	s2, err := open(60)
	if err != nil {
		t.Fatal(err)
	}
	if e := engine(s2); !strings.Contains(e, "TTL end_time + toIntervalDay(60)") {
		t.Fatalf("rollouts after a start with retention 60: %s", e)
	}
	s3, err := open(0)
	if err != nil {
		t.Fatal(err)
	}
	if e := engine(s3); !strings.Contains(e, "TTL end_time + toIntervalDay(60)") {
		t.Fatalf("a start with retention 0 changed the TTL: %s", e)
	}
}
