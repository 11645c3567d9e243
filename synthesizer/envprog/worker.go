package envprog

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The worker process of LoadSandboxed: the current binary started again
// with workerEnv set. It bounds its own address space, then serves the
// protocol of protocol.go for one program and many episodes.

const (
	workerEnv    = "TRACE_ENVPROG_WORKER"
	workerMemEnv = "TRACE_ENVPROG_MAX_MEMORY"
	// workerProfileEnv, set in the parent's environment, makes each worker
	// write a CPU profile to that path (the last worker to exit wins).
	workerProfileEnv = "TRACE_ENVPROG_WORKER_CPUPROFILE"
	// workerGCPercent is the worker's GOGC (see serveWorker).
	workerGCPercent = 400
)

// RunWorkerIfRequested turns the process into a sandbox worker when it was
// started as one by LoadSandboxed, and never returns then; otherwise it
// returns at once. Every binary that calls LoadSandboxed must call it first
// thing in main (cmd/trace does), and test binaries from TestMain:
//
//	func TestMain(m *testing.M) {
//		envprog.RunWorkerIfRequested()
//		os.Exit(m.Run())
//	}
func RunWorkerIfRequested() {
	if os.Getenv(workerEnv) != "1" {
		return
	}
	os.Exit(serveWorker(os.Stdin, os.Stdout))
}

func serveWorker(in io.Reader, out io.Writer) int {
	maxMem, err := strconv.ParseInt(os.Getenv(workerMemEnv), 10, 64)
	if err != nil || maxMem <= 0 {
		fmt.Fprintf(os.Stderr, "envprog worker: %s=%q is not a positive byte count\n", workerMemEnv, os.Getenv(workerMemEnv))
		return 3
	}
	// The soft limit makes the collector work hard before the hard
	// address-space limit would fail an allocation of live data.
	debug.SetMemoryLimit(maxMem)
	// A worker's live heap is small (the program and the episodes' states)
	// and its garbage plentiful (every reset builds a store): with the
	// default GOGC of 100 the collector runs every few megabytes and takes
	// ~20% of the CPU. The memory limit above still bounds the heap, so a
	// laxer percentage costs only some tens of megabytes of slack.
	debug.SetGCPercent(workerGCPercent)
	if err := limitAddressSpace(maxMem); err != nil {
		fmt.Fprintf(os.Stderr, "envprog worker: %v\n", err)
		return 3
	}
	if path := os.Getenv(workerProfileEnv); path != "" {
		// Debugging aid: a CPU profile of the worker, written when the
		// parent closes the program.
		if f, err := os.Create(path); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				defer pprof.StopCPUProfile()
			}
		}
	}
	r := bufio.NewReaderSize(in, 64<<10)
	w := &workerState{
		fw:       newFrameWriter(out),
		idle:     make(chan *request),
		episodes: map[uint64]*episode{},
		cancels:  map[uint64]context.CancelFunc{},
	}
	return w.serve(r)
}

// serve reads requests and dispatches them until the parent closes the
// pipe, and returns the worker's exit status.
func (w *workerState) serve(r *bufio.Reader) int {
	var scratch []byte
	for {
		var req request
		if err := readFrame(r, &req, &scratch); err != nil {
			if errors.Is(err, io.EOF) {
				pprof.StopCPUProfile()
				return 0 // the parent closed the program
			}
			fmt.Fprintf(os.Stderr, "envprog worker: reading a request: %v\n", err)
			return 4
		}
		switch req.Op {
		case "load":
			w.load(&req)
		case "cancel":
			w.cancel(req.Target)
		case "close":
			w.mu.Lock()
			delete(w.episodes, req.Episode)
			w.mu.Unlock()
		default:
			// A lone request is handled right here: handing it to
			// another goroutine costs a wake-up, which is most of a
			// round trip. When more requests are already waiting
			// (concurrent episodes), this one goes to a handler
			// goroutine so that they run in parallel.
			if r.Buffered() > 0 {
				w.hand(&req)
			} else if !w.inline(&req, r) {
				// Another goroutine reads the requests now: this one
				// stays on as a handler.
				for req := range w.idle {
					w.handle(req)
				}
			}
		}
	}
}

// readerTakeover is how long a request handled on the reading goroutine
// runs before another goroutine takes over the reading, so that what the
// parent sends meanwhile (a cancel at its deadline, other episodes'
// requests) is read and acted on.
const readerTakeover = 2 * time.Millisecond

// inline handles req on the reading goroutine; it returns false when, req
// having run past readerTakeover, a new goroutine took over the reading.
func (w *workerState) inline(req *request, r *bufio.Reader) bool {
	var state atomic.Int32 // 0 running, 1 finished on time, 2 taken over
	t := time.AfterFunc(readerTakeover, func() {
		if state.CompareAndSwap(0, 2) {
			go func() { os.Exit(w.serve(r)) }()
		}
	})
	w.handle(req)
	t.Stop()
	return state.CompareAndSwap(0, 1)
}

type workerState struct {
	fw   *frameWriter
	prog *program
	// idle hands requests to handler goroutines waiting for one (see hand).
	idle chan *request

	mu       sync.Mutex
	episodes map[uint64]*episode
	cancels  map[uint64]context.CancelFunc
}

// handlerIdle is how long a handler goroutine waits for another request
// before it exits.
const handlerIdle = 10 * time.Second

// hand runs req on a handler goroutine: one waiting for work if there is
// one, else a new one, which then stays for handlerIdle. A goroutine per
// request would grow a fresh stack to the interpreter's depth each time
// (copying it at every doubling); a waiting handler has grown it already.
func (w *workerState) hand(req *request) {
	select {
	case w.idle <- req:
		return
	default:
	}
	go func() {
		t := time.NewTimer(handlerIdle)
		defer t.Stop()
		for {
			w.handle(req)
			t.Reset(handlerIdle)
			select {
			case req = <-w.idle:
			case <-t.C:
				return
			}
		}
	}()
}

func (w *workerState) reply(resp *response) {
	f, err := appendFrame(nil, resp)
	if err != nil {
		f, _ = appendFrame(nil, &response{ID: resp.ID, Err: toWire(fmt.Errorf("encoding the response: %w", err))})
	}
	w.fw.send(f)
}

func (w *workerState) load(req *request) {
	lim := DefaultLimits
	if req.Limits != nil {
		lim = req.Limits.withDefaults()
	}
	p, err := load(context.Background(), req.Name, req.Src, lim)
	if err != nil {
		w.reply(&response{ID: req.ID, Err: toWire(err)})
		return
	}
	w.prog = p
	info := p.Info()
	w.reply(&response{ID: req.ID, Info: &info})
}

func (w *workerState) cancel(id uint64) {
	w.mu.Lock()
	c := w.cancels[id]
	w.mu.Unlock()
	if c != nil {
		c()
	}
}

func (w *workerState) handle(req *request) {
	resp := &response{ID: req.ID}
	defer w.reply(resp)
	if w.prog == nil {
		resp.Err = toWire(errors.New("no program loaded"))
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.mu.Lock()
	w.cancels[req.ID] = cancel
	ep := w.episodes[req.Episode]
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.cancels, req.ID)
		w.mu.Unlock()
		cancel()
	}()
	if req.Op != "reset" && ep == nil {
		resp.Err = toWire(fmt.Errorf("no episode %d", req.Episode))
		return
	}
	var err error
	switch req.Op {
	case "reset":
		var e *episode
		if e, err = w.prog.reset(ctx, req.Seed); err == nil {
			w.mu.Lock()
			w.episodes[req.Episode] = e
			w.mu.Unlock()
			start := e.Start()
			resp.Start = &start
		}
	case "step":
		if req.Action == nil {
			err = errors.New("step without an action")
			break
		}
		before := len(ep.msgs)
		var res StepResult
		res, err = ep.Step(ctx, *req.Action)
		resp.Step = &res
		if len(ep.msgs) > before {
			m := ep.msgs[before]
			resp.Assistant = &m
		}
		if err == nil && res.Done {
			r, rerr := ep.Reward(ctx)
			resp.Final, resp.FinalErr = &r, toWire(rerr)
		}
	case "reward":
		var r Reward
		r, err = ep.Reward(ctx)
		resp.Reward = &r
	case "hint":
		resp.Hint, err = ep.Hint(ctx)
	case "reference":
		resp.Reference, err = ep.Reference(ctx)
	default:
		err = fmt.Errorf("unknown op %q", req.Op)
	}
	resp.Err = toWire(err)
}
