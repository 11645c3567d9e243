package envprog

import (
	"errors"
	"testing"
)

// TestDeathErrors: once the worker is gone, the call it died of gets the
// limit and the cause; every other call, in flight or made after, is told
// its episode is lost with the shared worker, and by whose call.
func TestDeathErrors(t *testing.T) {
	killed := &worker{death: "the worker process was killed: a call ran past 5s", limit: "timeout",
		culprit: pendingCall{id: 7, ep: 3, fn: "step"}}
	oom := &worker{death: "the worker process ran out of memory: fatal error: out of memory", limit: "memory",
		culprit: pendingCall{id: 9, ep: 4, fn: "reset"}}
	oomUnknown := &worker{death: "the worker process ran out of memory: fatal error: out of memory", limit: "memory"}
	const lost = "this episode is lost with the worker process the program's episodes share"
	for _, tc := range []struct {
		name  string
		w     *worker
		pc    pendingCall
		limit string
		msg   string
	}{
		{"the killed call", killed, pendingCall{id: 7, ep: 3}, "timeout", "the worker process was killed: a call ran past 5s"},
		{"another call that ran past the bound too", killed, pendingCall{id: 8, ep: 5, timeout: true}, "timeout", "the worker process was killed: a call ran past 5s"},
		{"another episode's call in flight", killed, pendingCall{id: 8, ep: 5}, "", lost + ", which another episode's call ended: the worker process was killed: a call ran past 5s"},
		{"another episode's later call", killed, pendingCall{ep: 5}, "", lost + ", which another episode's call ended: the worker process was killed: a call ran past 5s"},
		{"the killed episode's later call", killed, pendingCall{ep: 3}, "", lost + ", which this episode's step() call ended: the worker process was killed: a call ran past 5s"},
		{"the call that ran out of memory", oom, pendingCall{id: 9, ep: 4}, "memory", "the worker process ran out of memory: fatal error: out of memory"},
		{"a later call after running out of memory", oom, pendingCall{ep: 6}, "", lost + ", which another episode's call ended: the worker process ran out of memory: fatal error: out of memory"},
		{"one of several calls in flight", oomUnknown, pendingCall{id: 9, ep: 4}, "", lost + ": the worker process ran out of memory: fatal error: out of memory"},
		{"a timed-out call after running out of memory", oom, pendingCall{id: 10, ep: 6, timeout: true}, "", lost + ", which another episode's call ended: the worker process ran out of memory: fatal error: out of memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.w.deathError("step", 42, tc.pc)
			var pe *ProgramError
			if !errors.As(err, &pe) {
				t.Fatalf("got %v (%T)", err, err)
			}
			if pe.Func != "step" || pe.Seed != 42 || pe.Limit != tc.limit || pe.Msg != tc.msg {
				t.Errorf("got Func %q Seed %d Limit %q Msg %q\nwant step 42 %q %q", pe.Func, pe.Seed, pe.Limit, pe.Msg, tc.limit, tc.msg)
			}
		})
	}
}
