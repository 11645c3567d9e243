//go:build !linux

package envprog

import (
	"errors"
	"os/exec"
)

func limitAddressSpace(int64) error {
	return errors.New("the sandbox's memory bound (RLIMIT_AS above the start-up size) is implemented for Linux only")
}

func restrictSyscalls() error {
	return errors.New("the sandbox's seccomp filter is implemented for Linux only")
}

func sandboxAttr(*exec.Cmd) {}

const sandboxSupported = false
