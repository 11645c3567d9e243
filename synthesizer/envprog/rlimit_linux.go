package envprog

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// limitAddressSpace sets RLIMIT_AS to the process's current virtual size
// plus budget. The Go runtime reserves address space at start-up (heap
// arena index, goroutine stacks, thread stacks, the mapped binary) that
// depends on the Go version and the binary, so a fixed limit would either
// fail the start or give a program more than it was granted; measuring
// after start-up grants every program the same budget.
func limitAddressSpace(budget int64) error {
	vm, err := virtualSize()
	if err != nil {
		return fmt.Errorf("measuring the address space: %w", err)
	}
	lim := uint64(vm + budget)
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: lim, Max: lim}); err != nil {
		return fmt.Errorf("setting RLIMIT_AS to %d bytes: %w", lim, err)
	}
	return nil
}

// virtualSize is VmSize of /proc/self/status, in bytes.
func virtualSize() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := bytes.CutPrefix([]byte(line), []byte("VmSize:")); ok {
			fields := bytes.Fields(rest)
			if len(fields) != 2 || string(fields[1]) != "kB" {
				return 0, fmt.Errorf("unexpected VmSize line %q", line)
			}
			kb, err := strconv.ParseInt(string(fields[0]), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmSize in /proc/self/status")
}

// sandboxAttr makes the kernel kill the worker when the parent dies, so a
// crashed trace never leaves workers behind.
func sandboxAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

const sandboxSupported = true
