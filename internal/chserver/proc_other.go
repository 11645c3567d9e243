//go:build !linux

package chserver

import "syscall"

func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

const parentDeathSignal = false

// serversUsing cannot see other processes' command lines here.
func serversUsing(cfgPath string) []int { return nil }

func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}
