//go:build !unix || aix || solaris

package datadir

import "os"

// supported: Acquire does not lock.
const supported = false

// lockFile does not lock where syscall has no flock(2) (Windows, AIX,
// Solaris): the directory is not guarded there.
func lockFile(*os.File) error { return nil }
