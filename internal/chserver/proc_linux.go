package chserver

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// sysProcAttr puts the server in its own process group (so a terminal's
// Ctrl-C reaches only the parent, which stops the server in order) and has
// the kernel send it SIGTERM when the parent dies, so a crashed parent or a
// test binary killed at its timeout leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// parentDeathSignal reports whether sysProcAttr ties the server's life to
// the thread that started it (see startProcess).
const parentDeathSignal = true

// serversUsing returns the pids of live processes whose command line has
// --config-file=cfgPath: servers started on this Dir by an earlier process.
func serversUsing(cfgPath string) []int {
	want := []byte("--config-file=" + cfgPath + "\x00")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(append(cmdline, 0), want) {
			continue
		}
		if !alive(pid) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	switch stat[i+2] {
	case 'Z', 'X', 'x':
		return false
	}
	return true
}
