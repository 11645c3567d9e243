//go:build linux

package envprog

import (
	"slices"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
)

// TestSeccompPolicy: every denied name is a system call of amd64 or arm64
// (a misspelt one would deny nothing), the policy assembles here, and
// nothing the Go runtime uses once running is denied.
func TestSeccompPolicy(t *testing.T) {
	var tables []*arch.Info
	for _, a := range []string{"amd64", "arm64"} {
		info, err := arch.GetInfo(a)
		if err != nil {
			t.Fatal(err)
		}
		tables = append(tables, info)
	}
	var all []string
	for _, g := range deniedSyscalls {
		for _, n := range g {
			if slices.Contains(all, n) {
				t.Errorf("%s is listed twice", n)
			}
			all = append(all, n)
			if !slices.ContainsFunc(tables, func(a *arch.Info) bool { _, ok := a.SyscallNames[n]; return ok }) {
				t.Errorf("%s is a system call of neither amd64 nor arm64", n)
			}
		}
	}
	runtimeNeeds := []string{"read", "write", "close", "mmap", "munmap", "madvise", "mprotect", "futex", "clone",
		"sched_yield", "nanosleep", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack", "gettid", "getpid",
		"exit", "exit_group", "epoll_create1", "epoll_ctl", "epoll_pwait", "eventfd2", "pipe2", "fcntl", "fstat",
		"timer_create", "timer_settime", "timer_delete", "setitimer", "clock_gettime", "getrlimit", "sched_getaffinity", "prctl"}
	for _, n := range runtimeNeeds {
		if slices.Contains(all, n) {
			t.Errorf("%s is denied, and the Go runtime uses it", n)
		}
	}
	for _, a := range tables {
		p := seccompPolicy(a, 1234)
		if a.Name != "x86_64" && a.Name != "aarch64" {
			t.Errorf("unexpected arch %s", a.Name)
		}
		if len(p.Syscalls) != 1 || len(p.Syscalls[0].Names) < 100 {
			t.Errorf("%s: %d names denied", a.Name, len(p.Syscalls[0].Names))
		}
	}
	host, err := arch.GetInfo("")
	if err != nil {
		t.Fatalf("the sandbox's filter cannot be made here: %v", err)
	}
	p := seccompPolicy(host, 1234)
	prog, err := p.Assemble()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d names denied, %d BPF instructions", host.Name, len(p.Syscalls[0].Names), len(prog))
}
