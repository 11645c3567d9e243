package testenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
)

// TestClickHouseInsertSelect: create a table, insert with PrepareBatch (with
// the explicit column list 18.16 needs), select the rows back.
func TestClickHouseInsertSelect(t *testing.T) {
	ch := testenv.ClickHouse(t)
	conn := ch.Conn()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	if err := conn.Exec(ctx, `CREATE TABLE events (
		id  UInt64,
		env LowCardinality(String),
		msg String,
		ts  DateTime
	) ENGINE = MergeTree ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO events (id, env, msg, ts)")
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const rows = 100
	for i := 0; i < rows; i++ {
		if err := batch.Append(uint64(i), fmt.Sprintf("env-%d", i%2), fmt.Sprintf("message %d", i), base.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}

	var got []struct {
		ID  uint64    `ch:"id"`
		Env string    `ch:"env"`
		Msg string    `ch:"msg"`
		TS  time.Time `ch:"ts"`
	}
	if err := conn.Select(ctx, &got, "SELECT id, env, msg, ts FROM events ORDER BY id"); err != nil {
		t.Fatal(err)
	}
	if len(got) != rows {
		t.Fatalf("selected %d rows, want %d", len(got), rows)
	}
	for i, r := range got {
		if r.ID != uint64(i) || r.Env != fmt.Sprintf("env-%d", i%2) || r.Msg != fmt.Sprintf("message %d", i) || !r.TS.Equal(base.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("row %d = %+v", i, r)
		}
	}
	var db string
	if err := conn.QueryRow(ctx, "SELECT currentDatabase()").Scan(&db); err != nil || db != ch.Database {
		t.Errorf("connection database = %q, %v; want %q", db, err, ch.Database)
	}
}

// TestClickHouseDatabases: each call gets its own database, dropped when
// its test ends.
func TestClickHouseDatabases(t *testing.T) {
	outer := testenv.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var inner string
	t.Run("inner", func(t *testing.T) {
		ch := testenv.ClickHouse(t)
		inner = ch.Database
		if ch.Database == outer.Database || ch.Addr != outer.Addr {
			t.Fatalf("inner %s/%s, outer %s/%s", ch.Addr, ch.Database, outer.Addr, outer.Database)
		}
		for _, c := range []*testenv.CH{ch, outer} {
			if err := c.Conn().Exec(ctx, "CREATE TABLE same_name (x UInt8) ENGINE = Memory"); err != nil {
				t.Fatalf("%s: %v", c.Database, err)
			}
		}
	})
	var n uint64
	if err := outer.Conn().QueryRow(ctx, "SELECT count() FROM system.databases WHERE name = ?", inner).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("database %s still exists after its test ended", inner)
	}
}

// TestOwnClickHouse: a private server survives Kill and Restart with its data.
func TestOwnClickHouse(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a ClickHouse server; skipped with -short")
	}
	s := testenv.OwnClickHouse(t)
	ch := &testenv.CH{Addr: s.Addr(), Database: "default"}
	opts := ch.Options()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exec := func(q string) {
		t.Helper()
		conn, err := openConn(opts)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	exec("CREATE TABLE t (x UInt64) ENGINE = MergeTree ORDER BY x")
	exec("INSERT INTO t SELECT number FROM system.numbers LIMIT 1000")
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := openConn(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM t").Scan(&n); err != nil || n != 1000 {
		t.Fatalf("after kill and restart: %d rows, %v", n, err)
	}
}
