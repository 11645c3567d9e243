package envprog

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// The sandbox protocol between a parent (LoadSandboxed) and its worker
// process: frames of a 4-byte big-endian length and a message in the
// binary encoding of codec.go (the JSON tags below name the fields in
// error messages and docs only), requests
// on the worker's stdin, responses on its stdout. Requests carry an id the
// response repeats; the worker answers requests concurrently (one at a time
// per episode, as the parent never has two calls of one episode in flight).
// "close" and "cancel" have no response. A "close" of an episode whose
// reset is still running drops the episode that reset makes (the parent
// sends one when it gives up waiting for a reset).
//
// "stats" is introspection for tests (export_test.go): the worker answers
// with counts of its goroutines, episodes and calls in flight (Stats),
// from the reading goroutine, at the cost of one lock. Only the parent
// writes requests; a program has no way to send one.

const maxFrame = 64 << 20

type request struct {
	ID      uint64  `json:"id"`
	Op      string  `json:"op"` // load, reset, step, reward, hint, reference, close, cancel, stats
	Episode uint64  `json:"ep,omitempty"`
	Seed    int64   `json:"seed,omitempty"`
	Name    string  `json:"name,omitempty"`
	Src     []byte  `json:"src,omitempty"`
	Limits  *Limits `json:"limits,omitempty"`
	Action  *Action `json:"action,omitempty"`
	Target  uint64  `json:"target,omitempty"` // the request a cancel cancels
}

type response struct {
	ID        uint64      `json:"id"`
	Err       *wireError  `json:"err,omitempty"`
	Info      *Info       `json:"info,omitempty"`
	Start     *Start      `json:"start,omitempty"`
	Cached    bool        `json:"cached,omitempty"`    // with Start: the reset was answered from the reset cache
	Assistant *Message    `json:"assistant,omitempty"` // the turn as the transcript records it
	Step      *StepResult `json:"step,omitempty"`
	Reward    *Reward     `json:"reward,omitempty"`
	Hint      string      `json:"hint,omitempty"`
	Reference []Action    `json:"reference,omitempty"`
	// On the step that ends an episode the worker scores it at once
	// (reward is a pure function of state and transcript), saving the
	// round trip of the Reward call that almost always follows.
	Final    *Reward      `json:"final,omitempty"`
	FinalErr *wireError   `json:"final_err,omitempty"`
	Stats    *workerStats `json:"stats,omitempty"`
}

// workerStats is the answer to "stats".
type workerStats struct {
	Goroutines int `json:"goroutines"` // runtime.NumGoroutine()
	Episodes   int `json:"episodes"`   // episodes stored
	Calls      int `json:"calls"`      // requests being handled
	Resets     int `json:"resets"`     // of which resets
	// ResetCache is the program's reset cache's counts.
	ResetCache ResetCacheStats `json:"reset_cache"`
}

// wireError carries an error across the pipe: a ProgramError field for
// field, or one of the runtime's sentinel errors by code.
type wireError struct {
	Code  string `json:"code,omitempty"` // "program", "done", "closed", "canceled", "deadline", "other"
	Func  string `json:"func,omitempty"`
	Seed  int64  `json:"seed,omitempty"`
	Limit string `json:"limit,omitempty"`
	Msg   string `json:"msg"`
}

func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	var pe *ProgramError
	switch {
	case errors.As(err, &pe):
		return &wireError{Code: "program", Func: pe.Func, Seed: pe.Seed, Limit: pe.Limit, Msg: pe.Msg}
	case errors.Is(err, ErrDone):
		return &wireError{Code: "done", Msg: err.Error()}
	case errors.Is(err, errClosed):
		return &wireError{Code: "closed", Msg: err.Error()}
	case errors.Is(err, context.Canceled):
		return &wireError{Code: "canceled", Msg: err.Error()}
	case errors.Is(err, context.DeadlineExceeded):
		return &wireError{Code: "deadline", Msg: err.Error()}
	default:
		return &wireError{Code: "other", Msg: err.Error()}
	}
}

func (w *wireError) err() error {
	if w == nil {
		return nil
	}
	switch w.Code {
	case "program":
		return &ProgramError{Func: w.Func, Seed: w.Seed, Limit: w.Limit, Msg: w.Msg}
	case "done":
		return ErrDone
	case "closed":
		return errClosed
	case "canceled":
		return context.Canceled
	case "deadline":
		return context.DeadlineExceeded
	default:
		return fmt.Errorf("envprog worker: %s", w.Msg)
	}
}

// appendFrame appends v's frame: its length, then v in the binary
// encoding of codec.go.
func appendFrame(buf []byte, v message) ([]byte, error) {
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0)
	buf, err := v.encode(buf)
	if err != nil {
		return buf[:start], err
	}
	n := len(buf) - start - 4
	if n > maxFrame {
		return buf[:start], &frameTooLarge{n: n}
	}
	binary.BigEndian.PutUint32(buf[start:], uint32(n))
	return buf, nil
}

// frameTooLarge is appendFrame's error for a message above maxFrame.
type frameTooLarge struct{ n int }

func (e *frameTooLarge) Error() string {
	return fmt.Sprintf("frame of %d bytes exceeds %d", e.n, maxFrame)
}

// message is a request or a response.
type message interface {
	encode([]byte) ([]byte, error)
	decode([]byte) error
}

// readFrame reads one frame into v, using *scratch as its buffer.
func readFrame(r *bufio.Reader, v message, scratch *[]byte) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxFrame {
		return fmt.Errorf("frame of %d bytes exceeds %d", n, maxFrame)
	}
	if cap(*scratch) < int(n) {
		*scratch = make([]byte, n)
	}
	b := (*scratch)[:n]
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	return v.decode(b)
}

// frameWriter writes frames from many goroutines straight from the
// caller (no hand-off to a writer goroutine, which costs a wake-up per
// call); the last of the writers waiting on the lock flushes, so the
// frames of concurrent calls share one system call.
type frameWriter struct {
	waiting atomic.Int32
	mu      sync.Mutex
	bw      *bufio.Writer
	failed  bool
}

func newFrameWriter(w io.Writer) *frameWriter {
	return &frameWriter{bw: bufio.NewWriterSize(w, 64<<10)}
}

// send writes one frame; false once writing failed (the peer is gone).
func (fw *frameWriter) send(f []byte) bool {
	fw.waiting.Add(1)
	fw.mu.Lock()
	defer fw.mu.Unlock()
	last := fw.waiting.Add(-1) == 0
	if fw.failed {
		return false
	}
	_, err := fw.bw.Write(f)
	if err == nil && last {
		err = fw.bw.Flush()
	}
	fw.failed = err != nil
	return !fw.failed
}
