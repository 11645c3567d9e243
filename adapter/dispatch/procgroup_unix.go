//go:build unix

package dispatch

import (
	"errors"
	"os/exec"
	"syscall"
)

// inGroup makes the command the leader of a process group of its own, so
// that a timeout reaches everything it started.
func inGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// signalGroup sends sig to the command's process group.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	if cmd.Process == nil {
		return errors.New("not started")
	}
	err := syscall.Kill(-cmd.Process.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// exitSignal names the signal that ended the process, if one did.
func exitSignal(cmd *exec.Cmd) string {
	if cmd.ProcessState == nil {
		return ""
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal().String()
	}
	return ""
}
