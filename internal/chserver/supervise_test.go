package chserver

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// syncBuffer collects log lines from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestSuperviseRestartsAfterKill9 kills the server's process with SIGKILL
// from outside (as the OOM killer or an operator would): Supervise logs the
// exit with its status, reports the server down, restarts it on the same
// address with its data, and reports it healthy again. A Stop is not
// restarted.
func TestSuperviseRestartsAfterKill9(t *testing.T) {
	bin := needServer(t)
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s := startTest(t, Options{Dir: t.TempDir(), Binary: bin, Logger: log})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var exits, restarts int
	var mu sync.Mutex
	var status error
	done := make(chan error, 1)
	go func() {
		done <- s.Supervise(ctx, SuperviseOptions{Initial: 200 * time.Millisecond, Max: time.Second,
			OnExit:    func(err error) { mu.Lock(); exits++; status = err; mu.Unlock() },
			OnRestart: func() { mu.Lock(); restarts++; mu.Unlock() }})
	}()

	conn := open(t, s.Addr())
	wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer wcancel()
	if err := conn.Exec(wctx, "CREATE TABLE kept (id UInt64) ENGINE = MergeTree ORDER BY id"); err != nil {
		t.Fatal(err)
	}
	if err := conn.Exec(wctx, "INSERT INTO kept SELECT number FROM system.numbers LIMIT 100"); err != nil {
		t.Fatal(err)
	}
	if err := s.Healthy(); err != nil {
		t.Fatalf("Healthy() before the crash: %v", err)
	}

	pid := s.Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Down until it is back, and Healthy says so: the first restart
	// attempt comes 200 ms ± 25 % after the exit.
	deadline := time.Now().Add(90 * time.Second)
	var down error
	for {
		mu.Lock()
		r := restarts
		mu.Unlock()
		if r > 0 {
			break
		}
		if err := s.Healthy(); err != nil && down == nil {
			down = err
		}
		if time.Now().After(deadline) {
			t.Fatalf("not restarted after 90 s; Healthy: %v\n%s", s.Healthy(), logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if down == nil || !strings.Contains(down.Error(), "exited unexpectedly") || !strings.Contains(down.Error(), "signal: killed") {
		t.Errorf("Healthy() while down = %v, want an error naming the exit", down)
	}
	mu.Lock()
	if exits != 1 || status == nil || status.Error() != "signal: killed" {
		t.Errorf("OnExit called %d times with %v, want once with signal: killed", exits, status)
	}
	mu.Unlock()
	out := logs.String()
	if !strings.Contains(out, "exited unexpectedly") || !strings.Contains(out, `status="signal: killed"`) ||
		!strings.Contains(out, "pid="+itoa(pid)) {
		t.Errorf("no log line with the exit and its status:\n%s", out)
	}
	if !strings.Contains(out, "restarted the local server") {
		t.Errorf("no log line for the restart:\n%s", out)
	}
	if err := s.Healthy(); err != nil {
		t.Errorf("Healthy() after the restart: %v", err)
	}
	if s.Pid() == 0 || s.Pid() == pid {
		t.Errorf("pid after restart = %d (was %d)", s.Pid(), pid)
	}
	if n, _ := countRows(t, open(t, s.Addr()), "kept"); n != 100 {
		t.Errorf("after the restart: %d rows, want 100", n)
	}

	// A Stop is asked for: no restart.
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if p := s.Pid(); p != 0 {
		t.Errorf("server running again (pid %d) after Stop", p)
	}
	mu.Lock()
	if exits != 1 || restarts != 1 {
		t.Errorf("after Stop: %d exits, %d restarts; want 1, 1", exits, restarts)
	}
	mu.Unlock()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Supervise: %v", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
