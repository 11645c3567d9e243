package envprog

import (
	"fmt"
	"os"
	"runtime"
	"slices"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
)

// The sandbox worker's seccomp filter.
//
// A program is Starlark: it has no I/O of its own, and the worker's
// built-ins give it none. The filter is the second wall, for a bug in the
// interpreter or a built-in: once it is installed, the worker process (and
// every thread and child it could make) gets EPERM for any system call
// that would reach outside it (open a file, make a socket, run a program,
// signal or trace another process, change its limits or privileges, or
// load something into the kernel). Reading and writing the pipes it was
// given, memory, threads, timers and signals to itself stay allowed: what
// the Go runtime needs.
//
// It is a list of what is denied, not of what is allowed: the runtime's
// own needs change with Go versions (a new prctl for naming mappings, an
// eventfd for the poller), and a worker that dies of an allowlist is an
// outage; nothing on the list is used by a running Go program that does
// no I/O.

// deniedSyscalls are refused with EPERM. Names missing on an architecture
// (arm64 has no open, fork or mkdir; its programs use the *at forms,
// which are listed too) are skipped there.
var deniedSyscalls = [][]string{
	// Files: no path is opened, made, changed or removed.
	{"open", "openat", "openat2", "creat", "open_by_handle_at", "name_to_handle_at",
		"link", "linkat", "symlink", "symlinkat", "unlink", "unlinkat",
		"rename", "renameat", "renameat2", "mkdir", "mkdirat", "rmdir", "mknod", "mknodat",
		"chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat",
		"truncate", "ftruncate", "utime", "utimes", "utimensat", "futimesat",
		"setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
		"chdir", "fchdir", "chroot", "pivot_root", "mount", "umount2", "mount_setattr",
		"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree",
		"fanotify_init", "fanotify_mark", "inotify_init", "inotify_init1",
		"memfd_create", "swapon", "swapoff", "acct", "quotactl"},
	// Network.
	{"socket", "socketpair", "connect", "bind", "listen", "accept", "accept4"},
	// Programs and other processes (signals to the worker itself are
	// allowed below).
	{"execve", "execveat", "fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev",
		"process_madvise", "kcmp", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
		"tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "migrate_pages", "move_pages"},
	// Limits, privileges, scheduling, namespaces.
	{"setrlimit", "setuid", "setgid", "setreuid", "setregid", "setresuid",
		"setresgid", "setfsuid", "setfsgid", "setgroups", "capset", "setpriority",
		"sched_setscheduler", "sched_setparam", "sched_setattr", "ioprio_set",
		"personality", "unshare", "setns", "setsid", "setpgid"},
	// The kernel's wider surfaces.
	{"bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
		"io_uring_register", "keyctl", "add_key", "request_key", "init_module", "finit_module",
		"delete_module", "kexec_load", "kexec_file_load", "reboot", "syslog", "modify_ldt",
		"iopl", "ioperm", "lookup_dcookie", "uselib", "vhangup", "settimeofday",
		"clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
		"landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self"},
}

// deniedWhen are system calls refused with EPERM when a condition on an
// argument holds (any one of a name's conditions).
var deniedWhen = []seccomp.NameWithConditions{
	// Go reads its limits with prlimit64(0, resource, nil, &old): the
	// worker may read its own, not set them or read another process's.
	{Name: "prlimit64", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.NotEqual, Value: 0}}},
	{Name: "prlimit64", Conditions: seccomp.ArgumentConditions{{Argument: 2, Operation: seccomp.NotEqual, Value: 0}}},
	// PR_SET_PDEATHSIG (1): a worker must not undo the kill it gets when
	// its parent dies (sandboxAttr). Go names its mappings with prctl.
	{Name: "prctl", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: 1}}},
}

// signalsToSelf are allowed only when their first argument is the worker's
// own process id: the runtime signals its threads with tgkill(getpid, …)
// and itself with kill(getpid, …) (a crash); kill(0, …) would reach the
// whole process group, trace's server among it.
var signalsToSelf = []string{"kill", "tgkill"}

// seccompPolicy is the filter's policy for process pid on architecture a.
func seccompPolicy(a *arch.Info, pid int) seccomp.Policy {
	deny := seccomp.SyscallGroup{Action: seccomp.ActionErrno}
	for _, group := range deniedSyscalls {
		for _, n := range group {
			if _, ok := a.SyscallNames[n]; ok {
				deny.Names = append(deny.Names, n)
			}
		}
	}
	deny.NamesWithCondtions = slices.Clone(deniedWhen)
	for _, n := range signalsToSelf {
		deny.NamesWithCondtions = append(deny.NamesWithCondtions, seccomp.NameWithConditions{
			Name:       n,
			Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.NotEqual, Value: uint64(pid)}},
		})
	}
	return seccomp.Policy{DefaultAction: seccomp.ActionAllow, Syscalls: []seccomp.SyscallGroup{deny}}
}

// restrictSyscalls installs the filter on every thread of the process
// (TSYNC) and sets no_new_privs. It cannot be undone.
func restrictSyscalls() error {
	a, err := arch.GetInfo("")
	if err != nil {
		return fmt.Errorf("the sandbox's seccomp filter has no system call table for %s (it has for amd64, arm64, 386 and arm): %w", runtime.GOARCH, err)
	}
	f := seccomp.Filter{NoNewPrivs: true, Flag: seccomp.FilterFlagTSync, Policy: seccompPolicy(a, os.Getpid())}
	if err := seccomp.LoadFilter(f); err != nil {
		return fmt.Errorf("installing the seccomp filter (the sandbox needs a kernel with seccomp filters, Linux 3.17 or later): %w", err)
	}
	return nil
}
