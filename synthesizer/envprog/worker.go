package envprog

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
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
	// Nothing reads a worker's heap profile (it has no endpoint, and its
	// memory is bounded above), and at the worker's allocation rate the
	// sampling's stack walks through the interpreter cost ~1.7 % of its
	// CPU in a profile at 16 sessions.
	runtime.MemProfileRate = 0
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
	// Last, once nothing more is opened: from here on the process can
	// reach nothing outside itself but the pipes it was given.
	if err := restrictSyscalls(); err != nil {
		fmt.Fprintf(os.Stderr, "envprog worker: %v\n", err)
		return 3
	}
	w := &workerState{
		r:        bufio.NewReaderSize(in, 64<<10),
		fw:       newFrameWriter(out),
		idle:     make(chan *call),
		exit:     make(chan int, 1),
		episodes: map[uint64]*episode{},
		cancels:  map[uint64]context.CancelFunc{},
		resets:   map[uint64]bool{},
	}
	go w.run(readerTurn)
	return <-w.exit
}

// call is a request as the worker handles it.
type call struct {
	req    request
	ctx    context.Context
	cancel context.CancelFunc
	ep     *episode // the request's episode; nil for a reset
}

// readerTurn, received by a goroutine in run, makes it the one that reads
// the requests (see inline).
var readerTurn = new(call)

// run is the body of the worker's goroutines. It handles c (or, for
// readerTurn, reads and dispatches requests until another goroutine takes
// over the reading), then waits for the next call handed to it (see hand
// and inline) and exits after handlerIdle without one.
func (w *workerState) run(c *call) {
	var t *time.Timer
	for {
		if c == readerTurn {
			if status, done := w.serve(); done {
				w.exit <- status
				return
			}
		} else {
			w.handle(c)
		}
		if t == nil {
			t = time.NewTimer(handlerIdle)
			defer t.Stop()
		} else {
			t.Reset(handlerIdle)
		}
		select {
		case c = <-w.idle:
		case <-t.C:
			return
		}
	}
}

// serve reads requests and dispatches them. It returns the worker's exit
// status and true when the reading ends (the parent closed the pipe, or
// a frame was bad), and false when, a request it handled having run past
// readerTakeover, another goroutine has taken over the reading.
func (w *workerState) serve() (int, bool) {
	var scratch []byte
	for {
		c := new(call)
		if err := readFrame(w.r, &c.req, &scratch); err != nil {
			if errors.Is(err, io.EOF) {
				pprof.StopCPUProfile()
				return 0, true // the parent closed the program
			}
			fmt.Fprintf(os.Stderr, "envprog worker: reading a request: %v\n", err)
			return 4, true
		}
		switch c.req.Op {
		case "load":
			w.load(&c.req)
		case "cancel":
			w.cancel(c.req.Target)
		case "close":
			w.close(c.req.Episode)
		case "stats":
			w.stats(&c.req)
		default:
			// Registered here, in the order the parent sent them, so that
			// a cancel or a close read later finds the call.
			w.register(c)
			// A lone request is handled right here: handing it to
			// another goroutine costs a wake-up, which is most of a
			// round trip. When more requests are already waiting
			// (concurrent episodes), this one goes to a handler
			// goroutine so that they run in parallel.
			if w.r.Buffered() > 0 {
				w.hand(c)
			} else if !w.inline(c) {
				return 0, false // this goroutine stays on as a handler
			}
		}
	}
}

// readerTakeover is how long a request handled on the reading goroutine
// runs before another goroutine takes over the reading, so that what the
// parent sends meanwhile (a cancel at its deadline, other episodes'
// requests) is read and acted on.
const readerTakeover = 2 * time.Millisecond

// inline handles c on the reading goroutine; it returns false when, c
// having run past readerTakeover, another goroutine took over the reading.
// That is a goroutine waiting for work if there is one, else a new one:
// so a series of slow lone requests alternates between two goroutines
// (the one demoted waits in run like any handler) instead of starting a
// goroutine each.
func (w *workerState) inline(c *call) bool {
	var state atomic.Int32 // 0 running, 1 finished on time, 2 taken over
	t := time.AfterFunc(readerTakeover, func() {
		if state.CompareAndSwap(0, 2) {
			select {
			case w.idle <- readerTurn:
			default:
				go w.run(readerTurn)
			}
		}
	})
	w.handle(c)
	t.Stop()
	return state.CompareAndSwap(0, 1)
}

type workerState struct {
	r    *bufio.Reader // read by one goroutine at a time (see serve)
	fw   *frameWriter
	prog *program
	// idle hands calls to goroutines waiting for one in run (see hand
	// and inline).
	idle chan *call
	exit chan int // the exit status, once the reading ended

	mu       sync.Mutex
	episodes map[uint64]*episode
	cancels  map[uint64]context.CancelFunc // by request id, while it runs
	// resets are the episodes whose reset is running, true once the
	// parent closed the episode (it gave up waiting): the reset's episode
	// is dropped when it completes. An entry lives as long as its call,
	// so this stays as small as the calls in flight.
	resets map[uint64]bool
}

// handlerIdle is how long a handler goroutine waits for another request
// before it exits.
const handlerIdle = 10 * time.Second

// hand runs c on a handler goroutine: one waiting for work if there is
// one, else a new one, which then stays for handlerIdle. A goroutine per
// request would grow a fresh stack to the interpreter's depth each time
// (copying it at every doubling); a waiting handler has grown it already.
func (w *workerState) hand(c *call) {
	select {
	case w.idle <- c:
	default:
		go w.run(c)
	}
}

func (w *workerState) reply(resp *response) {
	w.replyFor(resp, "", 0)
}

// replyFor sends resp, the answer of the contract function fn on the
// episode of seed. An answer too large for a frame is the program's
// fault (it returned more than a call may), so it becomes a
// *ProgramError with Limit "output" naming fn and seed, not an error of
// the runtime.
func (w *workerState) replyFor(resp *response, fn string, seed int64) {
	f, err := appendFrame(nil, resp)
	if err != nil {
		var big *frameTooLarge
		werr := toWire(fmt.Errorf("encoding the response: %w", err))
		if errors.As(err, &big) {
			werr = toWire(&ProgramError{Func: fn, Seed: seed, Limit: "output",
				Msg: fmt.Sprintf("the call returned %d bytes (encoded), more than the %d a call may return", big.n, maxFrame)})
		}
		f, _ = appendFrame(nil, &response{ID: resp.ID, Err: werr})
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

// close drops an episode, or, if its reset is still running, the episode
// that reset makes.
func (w *workerState) close(id uint64) {
	w.mu.Lock()
	delete(w.episodes, id)
	if _, ok := w.resets[id]; ok {
		w.resets[id] = true
	}
	w.mu.Unlock()
}

// stats answers the parent's "stats" request (tests' introspection).
func (w *workerState) stats(req *request) {
	w.mu.Lock()
	st := workerStats{Goroutines: runtime.NumGoroutine(), Episodes: len(w.episodes), Calls: len(w.cancels), Resets: len(w.resets)}
	if w.prog != nil {
		st.ResetCache = w.prog.resetStats()
	}
	w.mu.Unlock()
	w.reply(&response{ID: req.ID, Stats: &st})
}

// register makes c cancelable and looks up its episode; a reset is
// recorded as running.
func (w *workerState) register(c *call) {
	c.ctx, c.cancel = context.WithCancel(context.Background())
	w.mu.Lock()
	w.cancels[c.req.ID] = c.cancel
	if c.req.Op == "reset" {
		w.resets[c.req.Episode] = false
	} else {
		c.ep = w.episodes[c.req.Episode]
	}
	w.mu.Unlock()
}

func (w *workerState) handle(c *call) {
	req, ctx, ep := &c.req, c.ctx, c.ep
	resp := &response{ID: req.ID}
	fn, seed := req.Op, req.Seed
	if ep != nil {
		seed = ep.seed
	}
	defer func() { w.replyFor(resp, fn, seed) }()
	var made *episode // by a reset
	defer func() {
		w.mu.Lock()
		delete(w.cancels, req.ID)
		if req.Op == "reset" {
			if made != nil && !w.resets[req.Episode] {
				w.episodes[req.Episode] = made
			}
			delete(w.resets, req.Episode)
		}
		w.mu.Unlock()
		c.cancel()
	}()
	if w.prog == nil {
		resp.Err = toWire(errors.New("no program loaded"))
		return
	}
	if req.Op != "reset" && ep == nil {
		resp.Err = toWire(fmt.Errorf("no episode %d", req.Episode))
		return
	}
	var err error
	switch req.Op {
	case "reset":
		if made, err = w.prog.reset(ctx, req.Seed); err == nil {
			start := made.Start()
			resp.Start, resp.Cached = &start, made.cached
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
