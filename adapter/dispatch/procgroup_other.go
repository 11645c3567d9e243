//go:build !unix

package dispatch

import (
	"errors"
	"os/exec"
	"syscall"
)

// Without process groups, only the command itself is killed.
func inGroup(*exec.Cmd) {}

func signalGroup(cmd *exec.Cmd, _ syscall.Signal) error {
	if cmd.Process == nil {
		return errors.New("not started")
	}
	return cmd.Process.Kill()
}

func exitSignal(*exec.Cmd) string { return "" }
