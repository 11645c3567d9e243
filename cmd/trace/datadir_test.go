package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/traceops/trace/internal/datadir"
	"github.com/traceops/trace/internal/dev/testenv"
)

// TestSecondRunOnTheSameDataDir: a second `trace run` on the data directory
// of a running one (its embedded ClickHouse and broker) exits non-zero at
// once, naming the directory, the first process's pid and data_dir, and
// touches nothing: the first one's ClickHouse keeps its pid and the first
// process keeps running. It killed that ClickHouse as "a server left
// running on this directory" and shared the broker's files.
func TestSecondRunOnTheSameDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	if _, err := exec.LookPath("clickhouse-server"); err != nil {
		if _, err := exec.LookPath("clickhouse"); err != nil {
			testenv.Unavailable(t, "no clickhouse-server or clickhouse binary on PATH")
		}
	}
	dir := t.TempDir()
	args := []string{"run", "--roles", "ingest", "--set", "data_dir=" + dir, "--set", "kafka.embedded_addr=127.0.0.1:0",
		"--set", "embedded.clickhouse_port=0", "--set", "embedded.clickhouse_http_port=0", "--set", "http.addr=127.0.0.1:0"}
	first := traceProcess(args...)
	var logs testenv.SyncBuffer
	first.Stdout, first.Stderr = &logs, &logs
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- first.Wait() }()
	defer func() {
		first.Process.Kill()
		<-exited
	}()
	pidFile := filepath.Join(dir, "clickhouse", "clickhouse-server.pid")
	var chPID int
	deadline := time.Now().Add(120 * time.Second)
	for chPID == 0 {
		if strings.Contains(logs.String(), "embedded: started a local ClickHouse server") {
			b, _ := os.ReadFile(pidFile)
			chPID, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the first trace run exited: %v\n%s", err, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first trace run has no ClickHouse after 120s:\n%s", logs.String())
		}
	}

	second := traceProcess(append(args, "--set", "kafka.embedded_addr=127.0.0.1:0")...)
	var out testenv.SyncBuffer
	second.Stdout, second.Stderr = &out, &out
	start := time.Now()
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- second.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		second.Process.Kill()
		<-done
		t.Fatalf("the second trace run still runs after 30s:\n%s\nthe first:\n%s", out.String(), logs.String())
	}
	took := time.Since(start)
	msg := out.String()
	t.Logf("the second trace run exited after %s: %v\n%s", took.Round(time.Millisecond), err, msg)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Errorf("the second trace run: %v, want a non-zero exit", err)
	}
	for _, want := range []string{"data directory " + dir + " is in use", "(pid " + strconv.Itoa(first.Process.Pid) + ")", "data_dir"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the second trace run's output lacks %q", want)
		}
	}
	if strings.Contains(msg, "embedded: started") || strings.Contains(msg, "killing a server") {
		t.Errorf("the second trace run touched the directory before it failed")
	}

	time.Sleep(2 * time.Second) // a ClickHouse killed by the second would be restarted by the first by now
	b, _ := os.ReadFile(pidFile)
	if now, _ := strconv.Atoi(strings.TrimSpace(string(b))); now != chPID || syscall.Kill(chPID, 0) != nil {
		t.Errorf("the first trace run's ClickHouse: pid %d before the second run, %d after (alive: %v)\n%s", chPID, now, syscall.Kill(chPID, 0) == nil, logs.String())
	}
	if strings.Contains(logs.String(), "exited unexpectedly") {
		t.Errorf("the first trace run lost its ClickHouse:\n%s", logs.String())
	}
	select {
	case err := <-exited:
		exited <- err
		t.Fatalf("the first trace run exited: %v\n%s", err, logs.String())
	default:
	}

	if err := first.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("the first trace run after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the first trace run still runs 30s after SIGTERM:\n%s", logs.String())
	}
	l, err := datadir.Acquire(dir)
	if err != nil {
		t.Fatalf("after the first trace run exited: %v", err)
	}
	l.Release()
}
