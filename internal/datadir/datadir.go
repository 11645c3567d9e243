// Package datadir makes a data directory one trace process's at a time. A
// process that keeps embedded servers' data there (the local ClickHouse, the
// Kafka-protocol broker, NATS) holds an exclusive flock(2) on
// <dir>/trace.lock from before they start until it exits, with its pid in
// the file for the message another process gets. That second process fails
// at once, before it touches the directory: it killed the first one's
// ClickHouse as a server "left running" and shared its broker's files.
//
// The kernel drops the lock when its holder exits, however it exits, so a
// crashed run never blocks the next one: the lock file it leaves is simply
// locked again, and the servers it left running are the next owner's to
// clean up. The file is opened close-on-exec, so the servers trace starts
// as processes (ClickHouse) do not inherit the lock and one left running by
// a dead trace does not hold the directory.
package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// FileName is the lock file's name in the data directory.
const FileName = "trace.lock"

// BusyError is the error of Acquire on a directory another process holds.
type BusyError struct {
	Dir string // absolute
	PID int    // the holder's, as its lock file says; 0 when unknown
}

func (e *BusyError) Error() string {
	who := "another trace process"
	if e.PID > 0 {
		who += " (pid " + strconv.Itoa(e.PID) + ")"
	}
	return fmt.Sprintf("data directory %s is in use by %s, which holds its lock %s", e.Dir, who, filepath.Join(e.Dir, FileName))
}

// errBusy is what lockFile returns when another open file holds the lock.
var errBusy = errors.New("locked")

// Lock is a data directory held by this process.
type Lock struct {
	dir string
	f   *os.File
}

// Acquire creates dir if needed and takes its lock without waiting: a
// *BusyError when another process (or another Lock in this one) holds it.
func Acquire(dir string) (*Lock, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	path := filepath.Join(abs, FileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644) // O_CLOEXEC: Go's default
	if err != nil {
		return nil, fmt.Errorf("data directory lock: %w", err)
	}
	if err := lockFile(f); err != nil {
		defer f.Close()
		if errors.Is(err, errBusy) {
			return nil, &BusyError{Dir: abs, PID: readPID(f)}
		}
		return nil, fmt.Errorf("data directory lock %s: %w", path, err)
	}
	if err := writePID(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("data directory lock %s: %w", path, err)
	}
	return &Lock{dir: abs, f: f}, nil
}

// Dir is the locked directory (absolute).
func (l *Lock) Dir() string { return l.dir }

// Clear removes everything in the directory but the lock file (trace demo's
// reset). Removing the directory itself would let another process lock a
// new lock file while this one holds the old, unlinked one.
func (l *Lock) Clear() error {
	es, err := os.ReadDir(l.dir)
	if err != nil {
		return err
	}
	for _, e := range es {
		if e.Name() == FileName {
			continue
		}
		if err := os.RemoveAll(filepath.Join(l.dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// Release empties the lock file (no pid: nobody holds it) and drops the
// lock. The file stays: removing it would let one process lock the
// unlinked file while another locks its replacement. Release on nil or a
// released Lock does nothing.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	f := l.f
	l.f = nil
	terr := f.Truncate(0)
	return errors.Join(terr, f.Close()) // closing the file drops the lock
}

func writePID(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return err
}

// readPID is the pid in the lock file; 0 when it has none (its holder has
// not written it yet, or it is not a number).
func readPID(f *os.File) int {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
