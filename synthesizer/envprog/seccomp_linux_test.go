package envprog_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/traceops/trace/synthesizer/envprog"
)

func init() { probes["seccomp"] = seccompProbe }

// seccompProbe installs the worker's filter (unless the parent asked for
// the control run without it), tries what a program that broke out of
// Starlark would try, and what the Go runtime needs, and prints each
// outcome ("ok" or the error number's name) as JSON.
func seccompProbe() int {
	if os.Getenv("PROBE_FILTER") == "1" {
		if err := envprog.RestrictSyscalls(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
	}
	out := map[string]string{}
	res := func(name string, err error) {
		var errno syscall.Errno
		switch {
		case err == nil:
			out[name] = "ok"
		case errors.As(err, &errno):
			out[name] = errnoName(errno)
		default:
			out[name] = err.Error()
		}
	}
	f, err := os.Open("/proc/self/status")
	if err == nil {
		f.Close()
	}
	res("open a file", err)
	f, err = os.Create(filepath.Join(os.Getenv("PROBE_DIR"), "made"))
	if err == nil {
		f.Close()
	}
	res("create a file", err)
	c, err := net.Dial("tcp", os.Getenv("PROBE_ADDR"))
	if err == nil {
		c.Close()
	}
	res("connect", err)
	pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{Files: []uintptr{0, 1, 2}})
	if err == nil {
		var ws syscall.WaitStatus
		_, err = syscall.Wait4(pid, &ws, 0, nil)
	}
	res("run a program", err)
	res("signal the parent", syscall.Kill(os.Getppid(), 0))
	res("signal the process group", syscall.Kill(0, 0))
	res("signal the parent's thread", syscall.Tgkill(os.Getppid(), os.Getppid(), 0))
	res("signal itself", syscall.Kill(os.Getpid(), 0))
	res("signal its thread", syscall.Tgkill(os.Getpid(), syscall.Gettid(), 0))
	var lim syscall.Rlimit
	res("read a limit", syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	res("set a limit", syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
	res("set a limit with prlimit", prlimit(0, &lim, nil))
	res("read the parent's limit", prlimit(os.Getppid(), nil, &lim))
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, 1 /* PR_SET_PDEATHSIG */, 0, 0); e != 0 {
		res("undo the parent-death signal", e)
	} else {
		res("undo the parent-death signal", nil)
	}
	// What the runtime needs: memory, the collector, new threads, timers,
	// preemption of busy goroutines.
	var wg sync.WaitGroup
	sink := make([][]byte, 8)
	for i := range 8 {
		wg.Go(func() {
			runtime.LockOSThread() // a thread of its own: the runtime clones more
			sink[i] = make([]byte, 8<<20)
			time.Sleep(5 * time.Millisecond)
			x := 0
			for j := range 50_000_000 {
				x += j
			}
			sink[i][0] = byte(x)
		})
	}
	wg.Wait()
	runtime.GC()
	res("threads, memory, timers", nil)
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return 4
	}
	return 0
}

func prlimit(pid int, set, old *syscall.Rlimit) error {
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), uintptr(syscall.RLIMIT_NOFILE),
		uintptr(unsafe.Pointer(set)), uintptr(unsafe.Pointer(old)), 0, 0); e != 0 {
		return e
	}
	return nil
}

func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.EPERM:
		return "EPERM"
	case syscall.EACCES:
		return "EACCES"
	case syscall.ENOSYS:
		return "ENOSYS"
	}
	return fmt.Sprintf("errno %d (%v)", int(e), e)
}

func runSeccompProbe(t *testing.T, filter bool) map[string]string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), probeEnv+"=seccomp", "PROBE_DIR="+t.TempDir(), "PROBE_ADDR="+ln.Addr().String(),
		fmt.Sprintf("PROBE_FILTER=%d", map[bool]int{true: 1}[filter]))
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("probe (filter %v): %v\n%s", filter, err, b)
	}
	var out map[string]string
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("probe output %q: %v", b, err)
	}
	return out
}

// TestSeccompFilter: with the worker's filter, a process can no longer
// reach outside itself, and the Go runtime still works; the control run
// without it shows that each probe does reach outside.
func TestSeccompFilter(t *testing.T) {
	allowed := []string{"signal itself", "signal its thread", "read a limit", "threads, memory, timers"}
	denied := []string{"open a file", "create a file", "connect", "run a program", "signal the parent",
		"signal the process group", "signal the parent's thread", "set a limit", "set a limit with prlimit", "read the parent's limit", "undo the parent-death signal"}
	control := runSeccompProbe(t, false)
	filtered := runSeccompProbe(t, true)
	t.Logf("without the filter: %v", control)
	t.Logf("with the filter:    %v", filtered)
	for _, k := range append(allowed, denied...) {
		if control[k] != "ok" {
			t.Errorf("control run: %s: %s, want ok (the probe does not test what it says)", k, control[k])
		}
	}
	for _, k := range allowed {
		if filtered[k] != "ok" {
			t.Errorf("with the filter: %s: %s, want ok", k, filtered[k])
		}
	}
	for _, k := range denied {
		if filtered[k] != "EPERM" {
			t.Errorf("with the filter: %s: %s, want EPERM", k, filtered[k])
		}
	}
}

// TestSandboxWorkerFiltered: the sandbox worker runs under the filter.
func TestSandboxWorkerFiltered(t *testing.T) {
	got := map[string]string{}
	for _, line := range strings.Split(string(workerProcFile(t, "status")), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			got[k] = strings.TrimSpace(v)
		}
	}
	if got["Seccomp"] != "2" || got["NoNewPrivs"] != "1" || got["Seccomp_filters"] == "" || got["Seccomp_filters"] == "0" {
		t.Fatalf("worker %s: Seccomp %q, Seccomp_filters %q, NoNewPrivs %q; want 2 (filter), at least 1, 1",
			got["Pid"], got["Seccomp"], got["Seccomp_filters"], got["NoNewPrivs"])
	}
}
