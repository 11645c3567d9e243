package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// memoryCgroup makes a child cgroup of the memory controller limited to
// limit bytes (cgroup v2 when its memory controller is enabled, else v1)
// and returns its directory; it skips without root or a writable memory
// controller.
func memoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a cgroup (CI runs as root)")
	}
	name := fmt.Sprintf("trace-memlimit-test-%d", os.Getpid())
	type layout struct{ root, limitFile string }
	var candidates []layout
	for _, v2 := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if c, err := os.ReadFile(filepath.Join(v2, "cgroup.subtree_control")); err == nil && strings.Contains(string(c), "memory") {
			candidates = append(candidates, layout{v2, "memory.max"})
		}
	}
	candidates = append(candidates, layout{"/sys/fs/cgroup/memory", "memory.limit_in_bytes"})
	for _, c := range candidates {
		dir := filepath.Join(c.root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			continue
		}
		t.Cleanup(func() {
			for range 50 { // the process leaves the cgroup when it exits
				if os.Remove(dir) == nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
		if err := os.WriteFile(filepath.Join(dir, c.limitFile), []byte(fmt.Sprint(limit)), 0o644); err != nil {
			t.Fatalf("limiting %s: %v", dir, err)
		}
		return dir
	}
	t.Skip("no writable cgroup memory controller (cgroup v2 with memory enabled, or v1 at /sys/fs/cgroup/memory)")
	return ""
}

// TestRunSetsGOMEMLIMITFromCgroup: `trace run` started in a cgroup limited
// to 1 GiB sets Go's soft memory limit to 90 % of it, and GOMEMLIMIT in the
// environment wins.
func TestRunSetsGOMEMLIMITFromCgroup(t *testing.T) {
	dir := memoryCgroup(t, 1<<30)
	run := func(env ...string) string {
		t.Helper()
		// The shell joins the cgroup, then becomes the trace process; a
		// role that does not exist ends it right after the limit is set.
		cmd := exec.Command("sh", "-c", `echo $$ > "$1/cgroup.procs" && exec "$0" -test.run='^$'`, os.Args[0], dir)
		cmd.Env = append(os.Environ(), append([]string{"TRACE_TEST_MAIN=1", "TRACE_TEST_ARGS=run --roles nosuchrole"}, env...)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err == nil || !strings.Contains(out.String(), "nosuchrole") {
			t.Fatalf("trace run --roles nosuchrole: %v\n%s", err, out.String())
		}
		return out.String()
	}
	gib := float64(1 << 30)
	want := uint64(gib * 0.9)
	if out := run(); !strings.Contains(out, "memory limit from the cgroup") || !strings.Contains(out, fmt.Sprintf("gomemlimit_bytes=%d", want)) {
		t.Fatalf("no GOMEMLIMIT of 90 %% of the cgroup's 1 GiB:\n%s", out)
	}
	if out := run("GOMEMLIMIT=300MiB"); !strings.Contains(out, "memory limit from GOMEMLIMIT in the environment") || strings.Contains(out, "from the cgroup") {
		t.Fatalf("GOMEMLIMIT in the environment did not win:\n%s", out)
	}
}
