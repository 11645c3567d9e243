package datadir

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary hold a lock as another process would
// (TRACE_TEST_DATADIR_HOLD=<dir>): it prints "locked" and holds the lock
// until it is killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("TRACE_TEST_DATADIR_HOLD"); dir != "" {
		if _, err := Acquire(dir); err != nil {
			os.Stdout.WriteString(err.Error() + "\n")
			os.Exit(2)
		}
		os.Stdout.WriteString("locked\n")
		select {}
	}
	os.Exit(m.Run())
}

func needFlock(t *testing.T) {
	t.Helper()
	if !supported {
		t.Skip("no flock(2) on this platform: Acquire does not lock")
	}
}

func wantBusy(t *testing.T, dir string, pid int) {
	t.Helper()
	l, err := Acquire(dir)
	var busy *BusyError
	if !errors.As(err, &busy) {
		l.Release()
		t.Fatalf("Acquire(%s) while another holds it: %v, want a *BusyError", dir, err)
	}
	msg := err.Error()
	if busy.Dir != dir || busy.PID != pid || !strings.Contains(msg, "data directory "+dir+" ") || !strings.Contains(msg, "(pid "+strconv.Itoa(pid)+")") {
		t.Fatalf("error %q (%+v): want it to name %s and pid %d", msg, *busy, dir, pid)
	}
}

// TestAcquireIsExclusive: a held directory cannot be acquired again (here
// by a second open file in this process, as flock(2) treats it like
// another process); the lock file names the holder's pid; once released,
// the directory can be acquired again.
func TestAcquireIsExclusive(t *testing.T) {
	needFlock(t)
	dir := filepath.Join(t.TempDir(), "data") // created by Acquire
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	if l.Dir() != dir {
		t.Errorf("Dir %s, want %s", l.Dir(), dir)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, FileName)); strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("lock file holds %q, want this process's pid %d", b, os.Getpid())
	}
	wantBusy(t, dir, os.Getpid())
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil { // twice: nothing
		t.Fatal(err)
	}
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("after Release: %v", err)
	}
	l2.Release()
}

// TestStaleLockFileDoesNotBlock: the lock file a dead process left (its
// pid still in it, no lock held) is simply taken over.
func TestStaleLockFileDoesNotBlock(t *testing.T) {
	needFlock(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte("2147483646\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Acquire(dir)
	if err != nil {
		t.Fatalf("a lock file nobody holds: %v", err)
	}
	defer l.Release()
	if b, _ := os.ReadFile(filepath.Join(dir, FileName)); strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("lock file holds %q, want this process's pid %d", b, os.Getpid())
	}
}

// TestAnotherProcessHolds: a directory another process holds fails with
// that process's pid; once it is killed (SIGKILL: no clean-up of its own),
// the kernel has dropped its lock and the directory is acquired.
func TestAnotherProcessHolds(t *testing.T) {
	needFlock(t)
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TRACE_TEST_DATADIR_HOLD="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if s != "locked\n" {
			t.Fatalf("holder: %q", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("holder did not lock within 30s")
	}
	wantBusy(t, dir, cmd.Process.Pid)

	cmd.Process.Kill()
	cmd.Wait()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatalf("after the holder was killed: %v", err)
	}
	l.Release()
}

// TestClearKeepsTheLock: Clear empties the directory but for the lock
// file, which stays locked.
func TestClearKeepsTheLock(t *testing.T) {
	needFlock(t)
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if err := os.MkdirAll(filepath.Join(dir, "clickhouse", "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kafka.log"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := l.Clear(); err != nil {
		t.Fatal(err)
	}
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].Name() != FileName {
		t.Errorf("after Clear: %v, want only %s", es, FileName)
	}
	wantBusy(t, dir, os.Getpid())
}
