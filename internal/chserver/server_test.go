package chserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// needServer returns the ClickHouse binary, or skips the test when there is
// none (a failure when TRACE_REQUIRE_SERVERS=1, as in CI).
func needServer(t *testing.T) Binary {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a ClickHouse server; skipped with -short")
	}
	bin, err := Find()
	if err != nil {
		if os.Getenv("TRACE_REQUIRE_SERVERS") == "1" {
			t.Fatalf("TRACE_REQUIRE_SERVERS=1 but: %v", err)
		}
		t.Skipf("no ClickHouse server: %v", err)
	}
	return bin
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func startTest(t *testing.T, o Options) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if o.Logger == nil {
		o.Logger = testLogger(t)
	}
	s, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return s
}

func open(t *testing.T, addr string) driver.Conn {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{addr},
		Auth:        clickhouse.Auth{Database: "default", Username: "default"},
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func countRows(t *testing.T, conn driver.Conn, table string) (n, sum uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := conn.QueryRow(ctx, "SELECT count(), sum(id) FROM "+table).Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	return n, sum
}

// TestServerKillRestartKeepsData starts a real server, writes through the
// native protocol, kills the server, restarts it and reads the data back;
// then does the same with a graceful Stop.
func TestServerKillRestartKeepsData(t *testing.T) {
	bin := needServer(t)
	s := startTest(t, Options{Dir: t.TempDir(), Binary: bin})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if s.ParsedVersion().IsZero() {
		t.Fatalf("server version unknown")
	}
	t.Logf("ClickHouse %s at %s (http %s), pid %d", s.Version(), s.Addr(), s.HTTPAddr(), s.Pid())

	conn := open(t, s.Addr())
	if err := conn.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// LowCardinality needs allow_experimental_low_cardinality_type on 18.x:
	// creating this table proves the generated profile took effect.
	if err := conn.Exec(ctx, `CREATE TABLE kept (id UInt64, env LowCardinality(String), msg String)
		ENGINE = MergeTree ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO kept (id, env, msg)")
	if err != nil {
		t.Fatal(err)
	}
	const rows = 1000
	for i := 1; i <= rows; i++ {
		if err := batch.Append(uint64(i), fmt.Sprintf("env-%d", i%3), "m"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
	const wantSum = rows * (rows + 1) / 2
	if n, sum := countRows(t, conn, "kept"); n != rows || sum != wantSum {
		t.Fatalf("before kill: %d rows, sum %d", n, sum)
	}
	conn.Close()

	addr, pid := s.Addr(), s.Pid()
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if s.Pid() != 0 {
		t.Fatalf("Pid() = %d after Kill", s.Pid())
	}
	if err := s.Healthy(); err != nil {
		t.Fatalf("Healthy() after Kill, an exit asked for: %v", err)
	}
	if err := open(t, addr).Ping(ctx); err == nil {
		t.Fatal("server still answers after Kill")
	}

	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr || s.Pid() == pid || s.Pid() == 0 {
		t.Fatalf("after Restart: addr %s (was %s), pid %d (was %d)", s.Addr(), addr, s.Pid(), pid)
	}
	conn = open(t, s.Addr())
	if n, sum := countRows(t, conn, "kept"); n != rows || sum != wantSum {
		t.Fatalf("after kill and restart: %d rows, sum %d; want %d, %d", n, sum, rows, wantSum)
	}
	conn.Close()

	// Graceful stop, then restart.
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := countRows(t, open(t, s.Addr()), "kept"); n != rows {
		t.Fatalf("after stop and restart: %d rows", n)
	}

	// Killed from outside with no Supervise watching: from the moment the
	// process is reaped, Healthy names the exit (Supervise records it a
	// moment later; /readyz said "not running" in between).
	if err := syscall.Kill(s.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); s.Pid() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the killed server's process was not reaped within 30 s")
		}
	}
	if err := s.Healthy(); err == nil || !strings.Contains(err.Error(), "exited unexpectedly (signal: killed)") {
		t.Fatalf("Healthy() after an outside SIGKILL = %v, want the exit named", err)
	}
}

// TestStartTakesOverLeftoverServer: a server an earlier process left running
// on a Dir is killed by the next Start on that Dir, which then serves the
// same data.
func TestStartTakesOverLeftoverServer(t *testing.T) {
	bin := needServer(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	first := startTest(t, Options{Dir: dir, Binary: bin})
	conn := open(t, first.Addr())
	if err := conn.Exec(ctx, "CREATE TABLE left (id UInt64) ENGINE = MergeTree ORDER BY id"); err != nil {
		t.Fatal(err)
	}
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO left (id)")
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 10; i++ {
		if err := batch.Append(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	// While this process owns the server, a second Start on its Dir fails.
	if _, err := Start(ctx, Options{Dir: dir, Binary: bin, Logger: testLogger(t)}); err == nil || !strings.Contains(err.Error(), "started by this process") {
		t.Fatalf("second Start on a Dir in use: err = %v", err)
	}

	// Pretend the first server belongs to a process that crashed.
	ours.Delete(first.Pid())
	second := startTest(t, Options{Dir: dir, Binary: bin})
	if n, sum := countRows(t, open(t, second.Addr()), "left"); n != 10 || sum != 55 {
		t.Fatalf("taken-over data: %d rows, sum %d", n, sum)
	}
	if first.Pid() != 0 {
		t.Fatalf("leftover server pid %d still running", first.Pid())
	}
}

// TestStartIgnoresStalePidFile: a pid file naming a live process that is
// not a server on this Dir neither stops the start nor gets that process
// killed.
func TestStartIgnoresStalePidFile(t *testing.T) {
	bin := needServer(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startTest(t, Options{Dir: dir, Binary: bin})
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(s.Pid()) {
		t.Fatalf("pid file = %q, %v; want %d", b, err, s.Pid())
	}
}

func fakeBinary(t *testing.T, script string) Binary {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fake-clickhouse-server")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return Binary{Path: path}
}

// TestStartReportsEarlyExit: a server that exits at start-up gives an error
// with the tail of its output.
func TestStartReportsEarlyExit(t *testing.T) {
	bin := fakeBinary(t, `[ "$1" = --version ] && exit 78
echo "Code: 36, e.displayText() = DB::Exception: boom in $1" >&2; exit 70`)
	_, err := Start(context.Background(), Options{Dir: t.TempDir(), Binary: bin, Logger: testLogger(t)})
	if err == nil {
		t.Fatal("Start of a failing server succeeded")
	}
	for _, want := range []string{"exited during start-up", "boom in --config-file=", "stdout.log"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// TestStartTimesOut: a server that never answers /ping fails Start when ctx
// ends, with a clear error, and is killed.
func TestStartTimesOut(t *testing.T) {
	bin := fakeBinary(t, `[ "$1" = --version ] && exit 78
echo "still starting"; exec sleep 60`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	begin := time.Now()
	_, err := Start(ctx, Options{Dir: t.TempDir(), Binary: bin, Logger: testLogger(t)})
	if err == nil {
		t.Fatal("Start succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not answer") || !strings.Contains(err.Error(), "still starting") {
		t.Errorf("unexpected error: %v", err)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("Start took %s after its ctx ended", d)
	}
}

func TestFindErrorSaysHowToInstall(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	saved := sbinFallbacks
	sbinFallbacks = nil
	defer func() { sbinFallbacks = saved }()
	_, err := Find()
	if err == nil {
		t.Fatal("Find succeeded with an empty PATH")
	}
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("error does not wrap ErrNotFound: %v", err)
	}
	for _, want := range []string{"apt-get install -y clickhouse-server clickhouse-client", "single binary"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// TestStartWithUnknownVersion: when the binary cannot tell its version
// before it runs (here a wrapper script), Start asks the running server and
// restarts it with the config for that version: LowCardinality works on 18.x.
func TestStartWithUnknownVersion(t *testing.T) {
	real := needServer(t)
	wrapper := fakeBinary(t, `case "$1" in --version) echo "no version here" >&2; exit 78;; esac
exec `+real.String()+` "$@"`)
	if _, _, err := wrapper.DetectVersion(context.Background()); err == nil {
		t.Fatal("the wrapper's version is known; this test needs an unknown one")
	}
	s := startTest(t, Options{Dir: t.TempDir(), Binary: wrapper})
	if s.ParsedVersion().IsZero() {
		t.Fatal("version still unknown after start")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := open(t, s.Addr()).Exec(ctx, "CREATE TABLE lc (s LowCardinality(String)) ENGINE = Memory"); err != nil {
		t.Fatalf("ClickHouse %s: %v", s.Version(), err)
	}
}
