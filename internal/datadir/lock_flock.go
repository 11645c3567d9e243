//go:build unix && !aix && !solaris

package datadir

import (
	"errors"
	"os"
	"syscall"
)

// supported: Acquire locks.
const supported = true

// lockFile takes an exclusive flock(2) on f without waiting; errBusy when
// another open file description holds one.
func lockFile(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			return errBusy
		default:
			return &os.PathError{Op: "flock", Path: f.Name(), Err: err}
		}
	}
}
