package envprog

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// LoadSandboxed loads an untrusted (generated) program into a worker
// process: the current binary (os.Executable) started again in worker
// mode (see RunWorkerIfRequested), with its address space bounded to its
// start-up size plus lim.MaxMemory (RLIMIT_AS). Steps and time are bounded
// inside the worker as in Load; in addition the parent kills a worker that
// does not answer a call within twice CallTimeout plus a second (a program
// stuck inside one long built-in operation).
//
// When the worker dies (out of memory, a crash, killed for time) the call
// that caused it returns a *ProgramError with Limit "memory" or "timeout"
// (or "" and the exit status for other deaths): the call the parent killed
// the worker for, or the one call in flight when it died (with several in
// flight, which one ran out of memory is not known). Every other call and
// episode of that worker fails with a *ProgramError (Limit "") saying that
// the episode is lost with the shared worker, and why; the next Reset
// starts a new worker. Nothing a program does stops, kills or slows the
// caller.
//
// The worker gets a minimal environment (workerEnviron), not the
// caller's, which may hold credentials.
//
// Episodes of one Env share its worker; calls of different episodes run
// concurrently in it.
func LoadSandboxed(ctx context.Context, name string, src []byte, lim Limits) (Env, error) {
	if !sandboxSupported {
		return nil, errors.New("envprog: LoadSandboxed needs Linux (RLIMIT_AS)")
	}
	lim = lim.withDefaults()
	if name == "" {
		name = "program.star"
	}
	s := &sandbox{name: name, src: slices.Clone(src), lim: lim}
	w, err := s.worker(ctx)
	if err != nil {
		return nil, err
	}
	s.info = w.info
	return s, nil
}

type sandbox struct {
	name string
	src  []byte
	lim  Limits
	info Info

	mu     sync.Mutex
	cur    *worker
	closed bool
	nextEp atomic.Uint64
}

// worker returns the live worker, starting one (and loading the program
// into it) when there is none or the last one died.
func (s *sandbox) worker(ctx context.Context) (*worker, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if s.cur != nil && !s.cur.isDead() {
		return s.cur, nil
	}
	w, err := startWorker(s.lim)
	if err != nil {
		return nil, err
	}
	resp, err := w.call(ctx, &request{Op: "load", Name: s.name, Src: s.src, Limits: &s.lim}, "", 0)
	if err == nil {
		err = resp.Err.err()
	}
	if err != nil {
		w.stop()
		return nil, err
	}
	w.info = *resp.Info
	s.cur = w
	return w, nil
}

// ReturnsByDeadline reports that a sandboxed program's calls return by
// their context's deadline whatever the program does: the parent stops
// waiting then and cancels the call in the worker (and kills a worker that
// does not answer within twice CallTimeout plus a second). The one wait
// not bounded by the context is handing a request to a worker whose input
// pipe is full, which that kill also ends.
func (s *sandbox) ReturnsByDeadline() bool { return true }

func (s *sandbox) Info() Info {
	info := s.info
	info.Tools = slices.Clone(s.info.Tools)
	return info
}

func (s *sandbox) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.cur != nil {
		s.cur.stop()
		s.cur = nil
	}
	return nil
}

func (s *sandbox) Reset(ctx context.Context, seed int64) (Episode, error) {
	w, err := s.worker(ctx)
	if err != nil {
		return nil, err
	}
	id := s.nextEp.Add(1)
	resp, err := w.call(ctx, &request{Op: "reset", Episode: id, Seed: seed}, "reset", seed)
	if err != nil {
		if ctx.Err() != nil {
			// The reset may complete in the worker all the same (the
			// cancel came too late, or the answer was on its way): the
			// close makes the worker drop the episode it would keep.
			w.notify(&request{Op: "close", Episode: id})
		}
		return nil, err
	}
	if err := resp.Err.err(); err != nil {
		return nil, err
	}
	e := &sandboxEpisode{w: w, id: id, seed: seed, start: *resp.Start, cached: resp.Cached}
	e.msgs = []Message{{Role: "system", Content: e.start.System}, {Role: "user", Content: e.start.User}}
	return e, nil
}

// stats asks the current worker for its counts (tests' introspection; see
// protocol.go).
func (s *sandbox) stats(ctx context.Context) (workerStats, int, error) {
	w, err := s.worker(ctx)
	if err != nil {
		return workerStats{}, 0, err
	}
	resp, err := w.call(ctx, &request{Op: "stats"}, "", 0)
	if err == nil && resp.Stats == nil {
		err = errors.New("envprog: the worker answered stats without them")
	}
	if err != nil {
		return workerStats{}, 0, err
	}
	return *resp.Stats, w.cmd.Process.Pid, nil
}

// worker is one worker process and the calls in flight to it.
type worker struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	fw      *frameWriter
	timeout time.Duration // the parent's bound on one call
	info    Info
	stderr  tailBuffer

	mu       sync.Mutex
	pending  map[uint64]pendingCall
	nextID   uint64
	killed   string      // the limit the parent killed the worker for
	killedBy pendingCall // the call it killed the worker for

	dead chan struct{} // closed once the process is gone
	// Set before dead closes: why the worker died, as the message of the
	// call that caused it (culprit), which also gets the limit.
	death   string
	limit   string      // "memory", "timeout" or ""
	culprit pendingCall // zero when not known
}

// pendingCall is a call in flight: where its response goes, and what the
// death messages need of it.
type pendingCall struct {
	ch      chan *response
	id, ep  uint64 // the request and its episode
	fn      string
	timeout bool // it ran past the parent's bound (see kill)
}

// workerPassEnv are the parent's environment variables a worker gets: the
// Go runtime's and the race detector's settings, where coverage data goes
// (GOCOVERDIR, for binaries built with -cover: without it such a worker
// warns at exit; with it, it writes nothing either, since its seccomp
// filter refuses to open files) and the dynamic loader's
// path (the same binary has to start again). Nothing else: the worker runs
// untrusted programs, and the parent's environment holds tokens and
// database credentials.
var workerPassEnv = []string{"GOMAXPROCS", "GOTRACEBACK", "GORACE", "GOCOVERDIR", "LD_LIBRARY_PATH", workerProfileEnv}

// workerEnviron is a worker's environment, given the parent's.
func workerEnviron(parent []string, maxMemory int64) []string {
	env := []string{workerEnv + "=1", workerMemEnv + "=" + strconv.FormatInt(maxMemory, 10)}
	// The worker's goroutines run the interpreter deep in their stacks;
	// the collector would shrink the stacks of those waiting for work and
	// the next call grow them again, copying at every doubling (2 % of the
	// worker's CPU in a profile at 16 sessions). Handlers exit after
	// handlerIdle, which frees their stacks.
	godebug := "gcshrinkstackoff=1"
	for _, kv := range parent {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "GODEBUG":
			if v != "" {
				godebug = v + "," + godebug
			}
		case slices.Contains(workerPassEnv, k):
			env = append(env, kv)
		}
	}
	return append(env, "GODEBUG="+godebug)
}

func startWorker(lim Limits) (*worker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("envprog: the sandbox re-executes this binary: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = workerEnviron(os.Environ(), lim.MaxMemory)
	sandboxAttr(cmd)
	w := &worker{
		cmd:     cmd,
		timeout: 2*lim.CallTimeout + time.Second,
		pending: map[uint64]pendingCall{},
		dead:    make(chan struct{}),
	}
	cmd.Stderr = &w.stderr
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("envprog: starting the sandbox worker: %w", err)
	}
	w.fw = newFrameWriter(w.stdin)
	go w.read(bufio.NewReaderSize(stdout, 64<<10))
	return w, nil
}

// read delivers responses until the worker's stdout ends, then records
// how the worker died and fails what is pending.
func (w *worker) read(r *bufio.Reader) {
	var readErr error
	var scratch []byte
	for {
		resp := new(response)
		if readErr = readFrame(r, resp, &scratch); readErr != nil {
			break
		}
		w.mu.Lock()
		pc := w.pending[resp.ID]
		delete(w.pending, resp.ID)
		w.mu.Unlock()
		if pc.ch != nil {
			pc.ch <- resp
		}
	}
	// The calls in flight as the worker died: when there is one, it is
	// the one that was running then.
	w.mu.Lock()
	var only pendingCall
	if len(w.pending) == 1 {
		for _, pc := range w.pending {
			only = pc
		}
	}
	w.mu.Unlock()
	if !errors.Is(readErr, io.EOF) && !errors.Is(readErr, io.ErrUnexpectedEOF) {
		// A protocol error: the worker is unusable.
		_ = w.cmd.Process.Kill()
	}
	waitErr := w.cmd.Wait()
	w.mu.Lock()
	killed, killedBy := w.killed, w.killedBy
	w.mu.Unlock()
	tail := strings.TrimSpace(w.stderr.String())
	w.culprit = only
	switch {
	case killed != "":
		w.culprit = killedBy
		w.limit = killed
		w.death = "the worker process was killed: a call ran past " + w.timeout.String()
	case isOOM(tail):
		w.limit = "memory"
		w.death = "the worker process ran out of memory: " + firstLines(tail, 3)
	default:
		w.death = fmt.Sprintf("the worker process exited (%v)", waitErr)
		if tail != "" {
			w.death += ": " + firstLines(tail, 5)
		}
		if readErr != nil && !errors.Is(readErr, io.EOF) {
			w.death += " (" + readErr.Error() + ")"
		}
	}
	close(w.dead)
}

func isOOM(stderr string) bool {
	// The Go runtime's messages, and those of -race builds (ThreadSanitizer's
	// allocator and the race runtime's mmap placement).
	for _, s := range []string{"out of memory", "cannot allocate memory", "failed to create new OS thread", "mmap errno 12",
		"failed to allocate", "address space collisions"} {
		if strings.Contains(stderr, s) {
			return true
		}
	}
	return false
}

// firstLines is the first n non-blank lines of a worker's stderr, on one
// line: they say what happened; goroutine dumps follow.
func firstLines(s string, n int) string {
	var lines []string
	for line := range strings.Lines(s) {
		if line = strings.TrimSpace(line); line != "" {
			if lines = append(lines, line); len(lines) == n {
				break
			}
		}
	}
	return strings.Join(lines, " | ")
}

func (w *worker) isDead() bool {
	select {
	case <-w.dead:
		return true
	default:
		return false
	}
}

// deathError is what a call of fn on seed gets once the worker is gone:
// pc is the call (zero for one made after the death). The call the death
// is attributed to gets the limit and the cause; every other call is told
// that its episode is lost with the worker it shared, and why.
func (w *worker) deathError(fn string, seed int64, pc pendingCall) error {
	if pc.id != 0 && (pc.id == w.culprit.id || pc.timeout && w.limit == "timeout") {
		return &ProgramError{Func: fn, Seed: seed, Limit: w.limit, Msg: w.death}
	}
	return &ProgramError{Func: fn, Seed: seed, Msg: w.lostMessage(pc.ep)}
}

// lostMessage is the message of an episode (ep) lost with the worker.
func (w *worker) lostMessage(ep uint64) string {
	msg := "this episode is lost with the worker process the program's episodes share"
	switch {
	case w.culprit.id == 0:
	case w.culprit.ep == ep && ep != 0:
		msg += ", which this episode's " + w.culprit.fn + "() call ended"
	default:
		msg += ", which another episode's call ended"
	}
	return msg + ": " + w.death
}

// kill kills the worker because of the call pc, for limit.
func (w *worker) kill(limit string, pc pendingCall) {
	w.mu.Lock()
	if w.killed == "" {
		w.killed, w.killedBy = limit, pc
	}
	w.mu.Unlock()
	_ = w.cmd.Process.Kill()
}

// stop ends the worker: closing its stdin makes it exit; a worker that
// does not within a second is killed.
func (w *worker) stop() {
	_ = w.stdin.Close()
	select {
	case <-w.dead:
	case <-time.After(time.Second):
		_ = w.cmd.Process.Kill()
		<-w.dead
	}
}

// call sends req and waits for its response. A worker that dies or does
// not answer in time yields a *ProgramError for fn; ctx ending cancels the
// call in the worker and returns ctx's error.
func (w *worker) call(ctx context.Context, req *request, fn string, seed int64) (*response, error) {
	if w.isDead() {
		return nil, w.deathError(fn, seed, pendingCall{ep: req.Episode})
	}
	ch := make(chan *response, 1)
	w.mu.Lock()
	w.nextID++
	req.ID = w.nextID
	pc := pendingCall{ch: ch, id: req.ID, ep: req.Episode, fn: fn}
	w.pending[req.ID] = pc
	w.mu.Unlock()
	f, err := appendFrame(nil, req)
	if err != nil {
		w.forget(req.ID)
		return nil, fmt.Errorf("envprog: encoding a request: %w", err)
	}
	if !w.fw.send(f) {
		<-w.dead // the pipe broke: the worker is gone or going
		return nil, w.deathError(fn, seed, pc)
	}
	timer := time.NewTimer(w.timeout)
	select {
	case resp := <-ch:
		timer.Stop()
		return resp, nil
	case <-w.dead:
		timer.Stop()
		select {
		case resp := <-ch: // answered just before it died
			return resp, nil
		default:
		}
		return nil, w.deathError(fn, seed, pc)
	case <-ctx.Done():
		if f, err := appendFrame(nil, &request{Op: "cancel", Target: req.ID}); err == nil {
			w.fw.send(f)
		}
		// The caller goes, the call's bound stays: a cancelled call
		// answers at once unless it is stuck inside one long built-in,
		// which does not see the cancel; then the worker is killed at
		// the bound, as if the caller had waited.
		go w.watch(pc, timer)
		return nil, ctx.Err()
	case <-timer.C:
		pc.timeout = true
		w.kill("timeout", pc)
		<-w.dead
		return nil, w.deathError(fn, seed, pc)
	}
}

// watch waits, for a call its caller gave up on, for the worker's answer
// (which read discards with the call) until the call's bound (timer), and
// kills the worker for the call when it has not answered by then.
func (w *worker) watch(pc pendingCall, timer *time.Timer) {
	defer timer.Stop()
	select {
	case <-pc.ch:
	case <-w.dead:
	case <-timer.C:
		w.mu.Lock()
		_, running := w.pending[pc.id]
		w.mu.Unlock()
		if running {
			pc.timeout = true
			w.kill("timeout", pc)
		}
	}
	w.forget(pc.id)
}

func (w *worker) forget(id uint64) {
	w.mu.Lock()
	delete(w.pending, id)
	w.mu.Unlock()
}

// notify sends a request that has no response.
func (w *worker) notify(req *request) {
	if w.isDead() {
		return
	}
	if f, err := appendFrame(nil, req); err == nil {
		w.fw.send(f)
	}
}

// tailBuffer keeps the first 4 KiB written to it (a Go runtime's fatal
// error comes first, then its goroutine dump).
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if room := 4096 - len(t.b); room > 0 {
		t.b = append(t.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// sandboxEpisode is an episode living in a worker. Its transcript is kept
// on this side too, so Messages costs no round trip.
type sandboxEpisode struct {
	w      *worker
	id     uint64
	seed   int64
	start  Start
	cached bool // Reset was answered from the worker's reset cache
	turns  int
	msgs   []Message
	done   bool
	closed bool
	final  *response // the reward the worker computed on the final step
}

func (e *sandboxEpisode) Seed() int64         { return e.seed }
func (e *sandboxEpisode) FromCache() bool     { return e.cached }
func (e *sandboxEpisode) Start() Start        { return e.start }
func (e *sandboxEpisode) Messages() []Message { return slices.Clone(e.msgs) }

// MessagesFrom is the transcript from message i on, as a read-only view
// (no copy); see episode.MessagesFrom.
func (e *sandboxEpisode) MessagesFrom(i int) []Message {
	return e.msgs[min(i, len(e.msgs)):len(e.msgs):len(e.msgs)]
}

func (e *sandboxEpisode) Close() error {
	if !e.closed {
		e.closed = true
		e.w.notify(&request{Op: "close", Episode: e.id})
	}
	return nil
}

func (e *sandboxEpisode) call(ctx context.Context, req *request, fn string) (*response, error) {
	if e.closed {
		return nil, errors.New("envprog: episode is closed")
	}
	req.Episode = e.id
	resp, err := e.w.call(ctx, req, fn, e.seed)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (e *sandboxEpisode) Step(ctx context.Context, a Action) (StepResult, error) {
	if e.done {
		return StepResult{Done: true}, ErrDone
	}
	e.turns++
	a = normalizeAction(a, e.turns) // as the worker will: the same ids
	resp, err := e.call(ctx, &request{Op: "step", Action: &a}, "step")
	if err != nil {
		var pe *ProgramError
		if errors.As(err, &pe) {
			e.done = true
		}
		return StepResult{Done: e.done}, err
	}
	if resp.Assistant != nil {
		e.msgs = append(e.msgs, *resp.Assistant)
	}
	var res StepResult
	if resp.Step != nil {
		res = *resp.Step
		e.msgs = append(e.msgs, res.ToolResults...)
	}
	e.final = nil
	if resp.Final != nil {
		e.final = resp
	}
	if err := resp.Err.err(); err != nil {
		e.done = true
		res.Done = true
		return res, err
	}
	e.done = res.Done
	return res, nil
}

func (e *sandboxEpisode) Reward(ctx context.Context) (Reward, error) {
	if f := e.final; f != nil {
		e.final = nil // once: a second call asks the worker again
		return *f.Final, f.FinalErr.err()
	}
	resp, err := e.call(ctx, &request{Op: "reward"}, "reward")
	if err != nil {
		return Reward{}, err
	}
	var r Reward
	if resp.Reward != nil {
		r = *resp.Reward
	}
	return r, resp.Err.err()
}

func (e *sandboxEpisode) Hint(ctx context.Context) (string, error) {
	resp, err := e.call(ctx, &request{Op: "hint"}, "hint")
	if err != nil {
		return "", err
	}
	return resp.Hint, resp.Err.err()
}

func (e *sandboxEpisode) Reference(ctx context.Context) ([]Action, error) {
	resp, err := e.call(ctx, &request{Op: "reference"}, "reference")
	if err != nil {
		return nil, err
	}
	return resp.Reference, resp.Err.err()
}
