package envprog

import (
	"errors"
	"slices"
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

// TestWorkerEnviron: a worker gets its own variables, the Go runtime's
// settings and GOCOVERDIR from the parent, and nothing else.
func TestWorkerEnviron(t *testing.T) {
	base := []string{"TRACE_ENVPROG_WORKER=1", "TRACE_ENVPROG_MAX_MEMORY=1024"}
	for _, tc := range []struct {
		name   string
		parent []string
		want   []string // after base
	}{
		{"empty", nil, []string{"GODEBUG=gcshrinkstackoff=1"}},
		{"secrets and the rest dropped", []string{"TRACE_TOKEN=s3cret", "CLICKHOUSE_PASSWORD=pw", "HOME=/root", "PATH=/bin", "TRACE_ENVPROG_WORKER=0"},
			[]string{"GODEBUG=gcshrinkstackoff=1"}},
		{"the parent's GODEBUG kept", []string{"GODEBUG=madvdontneed=1"}, []string{"GODEBUG=madvdontneed=1,gcshrinkstackoff=1"}},
		{"an empty GODEBUG", []string{"GODEBUG="}, []string{"GODEBUG=gcshrinkstackoff=1"}},
		{"runtime, coverage and profile passed", []string{"GOMAXPROCS=2", "GOTRACEBACK=all", "GORACE=halt_on_error=1", "GOCOVERDIR=/tmp/cov",
			"LD_LIBRARY_PATH=/opt/lib", "TRACE_ENVPROG_WORKER_CPUPROFILE=/tmp/w.prof", "GOGC=50", "GOFLAGS=-x"},
			[]string{"GOMAXPROCS=2", "GOTRACEBACK=all", "GORACE=halt_on_error=1", "GOCOVERDIR=/tmp/cov",
				"LD_LIBRARY_PATH=/opt/lib", "TRACE_ENVPROG_WORKER_CPUPROFILE=/tmp/w.prof", "GODEBUG=gcshrinkstackoff=1"}},
		{"a variable without =", []string{"GOMAXPROCS", "JUNK"}, []string{"GOMAXPROCS", "GODEBUG=gcshrinkstackoff=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := workerEnviron(tc.parent, 1024)
			want := append(slices.Clone(base), tc.want...)
			if !slices.Equal(got, want) {
				t.Errorf("got %q\nwant %q", got, want)
			}
		})
	}
}

// TestFirstLines: a worker's stderr is summed up by its first non-blank
// lines, without the blank line Go puts after a fatal error.
func TestFirstLines(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"fatal error: out of memory\n\ngoroutine 1 [running]:\nmain.main()\n", 3, "fatal error: out of memory | goroutine 1 [running]: | main.main()"},
		{"fatal error: out of memory\n\n", 3, "fatal error: out of memory"},
		{"a\r\nb\n", 1, "a"},
		{"", 3, ""},
	} {
		if got := firstLines(tc.in, tc.n); got != tc.want {
			t.Errorf("firstLines(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
