package testenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/traceops/trace/internal/chserver"
	"github.com/traceops/trace/sink"
)

// CH is a fresh ClickHouse database for one test, dropped when the test
// ends.
type CH struct {
	// Addr is the server's native protocol address, host:port.
	Addr string
	// Database is this test's database; Conn uses it as the default.
	Database string

	t    testing.TB
	once sync.Once
	conn driver.Conn
	err  error
}

// Store opens trace's store (sink.Store, default settings) on c's
// database and migrates it; it is closed when the test ends.
func (c *CH) Store() *sink.Store {
	c.t.Helper()
	ctx := context.Background()
	s, err := sink.Open(ctx, sink.Config{Addr: []string{c.Addr}, Database: c.Database}, nil)
	if err != nil {
		c.t.Fatalf("testenv: open the store on %s: %v", c.Database, err)
	}
	c.t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		c.t.Fatalf("testenv: migrate %s: %v", c.Database, err)
	}
	return s
}

// ClickHouse gives t its own new database on a ClickHouse server:
// TRACE_TEST_CLICKHOUSE (host:port, native protocol) when set, else a local
// server that internal/chserver starts once per test binary and that every
// test of the package shares (stopped by Main). Without a ClickHouse binary
// (or with an unreachable TRACE_TEST_CLICKHOUSE) the test is skipped, or
// fails with TRACE_REQUIRE_SERVERS=1.
//
// ClickHouse 18.16 (Debian's) needs an explicit column list for batch
// inserts: PrepareBatch(ctx, "INSERT INTO t (a, b)").
func ClickHouse(t testing.TB) *CH {
	t.Helper()
	addr := sharedClickHouse(t)
	admin, err := adminConn(addr)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	db := uniqueName(t, "test", '_', 60)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := admin.Exec(ctx, "CREATE DATABASE "+quoteIdent(db)); err != nil {
		t.Fatalf("testenv: create database %s on %s: %v", db, addr, err)
	}
	c := &CH{Addr: addr, Database: db, t: t}
	t.Cleanup(func() {
		if c.conn != nil {
			c.conn.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+quoteIdent(db)); err != nil {
			t.Logf("testenv: drop database %s: %v", db, err)
		}
	})
	return c
}

// Options are clickhouse-go options for this database (native protocol,
// user default without a password), for code under test that opens its own
// connection.
func (c *CH) Options() *clickhouse.Options {
	return &clickhouse.Options{
		Addr:        []string{c.Addr},
		Auth:        clickhouse.Auth{Database: c.Database, Username: "default"},
		DialTimeout: 10 * time.Second,
	}
}

// DSN is the clickhouse-go DSN of this database: clickhouse://addr/database.
func (c *CH) DSN() string { return "clickhouse://" + c.Addr + "/" + c.Database }

// Conn returns a native-protocol connection (pool) using this database,
// opened on first use and closed when the test ends.
func (c *CH) Conn() driver.Conn {
	c.t.Helper()
	c.once.Do(func() {
		c.conn, c.err = clickhouse.Open(c.Options())
		if c.err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c.err = c.conn.Ping(ctx)
		}
	})
	if c.err != nil {
		c.t.Fatalf("testenv: connect to ClickHouse %s/%s: %v", c.Addr, c.Database, c.err)
	}
	return c.conn
}

// OwnClickHouse starts a private local ClickHouse server for t, in
// t.TempDir() on free ports, stopped when t ends: for fault tests that Kill
// and Restart it. It needs a local ClickHouse binary even when
// TRACE_TEST_CLICKHOUSE is set.
func OwnClickHouse(t testing.TB) *chserver.Server {
	t.Helper()
	bin, err := chserver.Find()
	if err != nil {
		Unavailable(t, "testenv: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := chserver.Start(ctx, chserver.Options{
		Dir:    t.TempDir(),
		Binary: bin,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("testenv: stop ClickHouse: %v", err)
		}
	})
	return s
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// quoteIdent quotes a ClickHouse identifier.
func quoteIdent(s string) string {
	return "`" + strings.NewReplacer("\\", "\\\\", "`", "\\`").Replace(s) + "`"
}

// The server shared by the tests of one test binary.
var shared struct {
	mu     sync.Mutex
	done   bool   // the first ClickHouse call has run
	addr   string // where the server is
	skip   string // why there is none, as a skip (or failure) message
	err    error  // why there is none, as an error
	server *chserver.Server
	dir    string
}

// Connections to the default database of each server, for CREATE/DROP
// DATABASE.
var admins struct {
	mu    sync.Mutex
	conns map[string]driver.Conn
}

func sharedClickHouse(t testing.TB) string {
	t.Helper()
	shared.mu.Lock()
	if !shared.done {
		shared.done = true
		shared.addr, shared.skip, shared.err = setupShared()
	}
	addr, skip, err := shared.addr, shared.skip, shared.err
	shared.mu.Unlock()
	switch {
	case skip != "":
		Unavailable(t, "%s", skip)
	case err != nil:
		t.Fatalf("testenv: %v", err)
	}
	return addr
}

func setupShared() (addr, skip string, err error) {
	if addr := strings.TrimSpace(os.Getenv(EnvClickHouse)); addr != "" {
		conn, err := adminConn(addr)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = conn.Ping(ctx)
		}
		if err != nil {
			return "", fmt.Sprintf("testenv: %s=%s does not answer: %v", EnvClickHouse, addr, err), nil
		}
		return addr, "", nil
	}
	bin, err := chserver.Find()
	if err != nil {
		if errors.Is(err, chserver.ErrNotFound) {
			return "", fmt.Sprintf("testenv: %v (or set %s=host:port)", err, EnvClickHouse), nil
		}
		return "", "", err
	}
	removeStaleDirs(os.TempDir())
	dir, err := os.MkdirTemp("", scratchPrefix+"clickhouse-"+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := chserver.Start(ctx, chserver.Options{
		Dir:    dir,
		Binary: bin,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		os.RemoveAll(dir)
		return "", "", err
	}
	shared.server, shared.dir = s, dir
	return s.Addr(), "", nil
}

// adminConn is a shared connection to addr's default database, for
// CREATE/DROP DATABASE.
func adminConn(addr string) (driver.Conn, error) {
	admins.mu.Lock()
	defer admins.mu.Unlock()
	if c, ok := admins.conns[addr]; ok {
		return c, nil
	}
	c, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{addr},
		Auth:        clickhouse.Auth{Database: "default", Username: "default"},
		DialTimeout: 10 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("open ClickHouse %s: %w", addr, err)
	}
	if admins.conns == nil {
		admins.conns = map[string]driver.Conn{}
	}
	admins.conns[addr] = c
	return c, nil
}

// stopShared closes shared connections and stops the shared server.
func stopShared() {
	admins.mu.Lock()
	for addr, c := range admins.conns {
		c.Close()
		delete(admins.conns, addr)
	}
	admins.mu.Unlock()

	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.server != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := shared.server.Stop(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: stop ClickHouse: %v\n", err)
		}
		os.RemoveAll(shared.dir)
		shared.server = nil
	}
	shared.done = false
	shared.addr, shared.skip, shared.err = "", "", nil
}

// StoreConn returns a native-protocol connection (pool) to st's database,
// opened on first use per test and closed when t ends: for tests that check
// what a store wrote with their own SQL (sink.Store has no Conn escape
// hatch; every statement of trace is a Store method).
func StoreConn(t testing.TB, st *sink.Store) driver.Conn {
	t.Helper()
	cfg := st.Config()
	key := storeConnKey{t, cfg.Database, strings.Join(cfg.Addr, ",")}
	storeConns.mu.Lock()
	defer storeConns.mu.Unlock()
	if c, ok := storeConns.m[key]; ok {
		return c
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        cfg.Addr,
		Auth:        clickhouse.Auth{Database: cfg.Database, Username: cfg.User, Password: cfg.Password},
		DialTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatalf("testenv: connect to ClickHouse %v/%s: %v", cfg.Addr, cfg.Database, err)
	}
	if storeConns.m == nil {
		storeConns.m = map[storeConnKey]driver.Conn{}
	}
	storeConns.m[key] = conn
	t.Cleanup(func() {
		storeConns.mu.Lock()
		delete(storeConns.m, key)
		storeConns.mu.Unlock()
		conn.Close()
	})
	return conn
}

type storeConnKey struct {
	t        testing.TB
	db, addr string
}

var storeConns struct {
	mu sync.Mutex
	m  map[storeConnKey]driver.Conn
}
