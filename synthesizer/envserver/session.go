package envserver

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	mrand "math/rand/v2"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/openenv"
)

// served is one environment the server serves: its program, its tools'
// argument validators and its sessions.
type served struct {
	id      string
	entry   Entry
	env     envprog.Env
	info    envprog.Info
	tools   []openenv.Tool
	mcp     []openenv.MCPTool
	names   []string
	params  map[string]*jsonschema.Schema // tool name → compiled parameters schema
	schemas openenv.SchemaResponse
	openapi []byte // GET openapi.json
	srv     *Server
	// toolsJSON is the tools' encoding, sent in every observation.
	toolsJSON []byte
	// maxTurns is the turn limit the program was loaded with (Entry's).
	maxTurns int
	// bounded: env's calls return by their context's deadline whatever
	// the program does (see deadlineBound), so sessions call it directly.
	bounded bool

	mu       sync.Mutex
	sessions map[string]*session
}

// deadlineBound is an Env whose calls return by their context's deadline
// whatever the program does: a sandboxed program, whose parent stops
// waiting at the deadline and cancels or kills the worker. Other Envs (a
// trusted in-process program may be inside one long built-in operation)
// are called on a session's worker goroutine, which within abandons at the
// deadline.
type deadlineBound interface {
	ReturnsByDeadline() bool
}

func newServed(srv *Server, e Entry, env envprog.Env) (*served, error) {
	info := env.Info()
	s := &served{id: e.ID, entry: e, env: env, info: info, tools: info.Tools, srv: srv,
		maxTurns: cmp.Or(e.MaxTurns, envprog.DefaultLimits.MaxTurns),
		params:   map[string]*jsonschema.Schema{}, sessions: map[string]*session{}}
	if b, ok := env.(deadlineBound); ok && b.ReturnsByDeadline() {
		s.bounded = true
	}
	for _, t := range info.Tools {
		name := t.Function.Name
		s.names = append(s.names, name)
		params := t.Function.Parameters
		if len(params) == 0 || string(params) == "null" {
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		s.mcp = append(s.mcp, openenv.MCPTool{Name: name, Description: t.Function.Description, InputSchema: params})
		// The check a program's load makes (validation fails a program
		// the server would refuse here); an Env that is not a loaded
		// program (a Go one) meets it here.
		sch, err := envprog.CompileParameters(name, params)
		if err != nil {
			return nil, fmt.Errorf("environment %s: %w", e.ID, err)
		}
		s.params[name] = sch
	}
	s.schemas = openenv.Schemas(s.names)
	s.openapi = openenv.OpenAPI(cmp.Or(info.Name, e.ID), info.Doc, SessionHeader, s.schemas, srv.cfg.BearerToken != "")
	if s.tools == nil {
		s.tools = []openenv.Tool{}
	}
	tj, err := json.Marshal(s.tools)
	if err != nil {
		return nil, fmt.Errorf("environment %s: tools: %w", e.ID, err)
	}
	s.toolsJSON = tj
	return s, nil
}

// session is one client's environment session: a WebSocket connection, or
// a stateful HTTP/MCP session named by its id. It plays one episode at a
// time; mu serializes its use.
type session struct {
	id        string
	env       *served
	transport string // ws | http
	// mcpOnly: the WebSocket /mcp's session, which has no reset (see
	// newEpisode); stateless: an ephemeral session (see ephemeral).
	mcpOnly, stateless bool

	mu   sync.Mutex
	play *play   // the current episode, nil before the first reset
	w    *worker // runs the program's calls; nil until the first
	// frameBuf holds a WebSocket session's last observation frame, reused
	// for the next (see observation).
	frameBuf []byte

	lastActive atomic.Int64 // unix nanoseconds
	busy       atomic.Int32 // requests in progress (never evicted while > 0); below 0 once the reaper evicted it (see gone)
	evictOnce  sync.Once
	evicted    chan struct{}                            // closed when evicted or closed
	onEvict    func(ctx context.Context, reason string) // WebSocket: send SESSION_ERROR with reason and close, within ctx
}

// play is one episode in a session.
type play struct {
	id       string
	seed     int64
	hinted   bool
	hint     string
	ep       envprog.Episode
	started  time.Time
	steps    int
	results  []openenv.ChatMessage
	done     bool
	reason   string // why it ended, see openenv.Observation.DoneReason
	err      string
	reward   *envprog.Reward
	msgJSON  []byte // the transcript's messages encoded so far, comma-separated
	encoded  int    // how many
	msgStart []int  // where each begins in msgJSON
	// lastContent is where the last message's content is encoded in
	// msgJSON.
	lastContent [2]int
	// tail is the transcript's last messages as of the last encoding, as
	// many as there are results (see resultsEncoded).
	tail []envprog.Message

	sess      *session // whose server logs a panic in the episode's Close
	mu        sync.Mutex
	inFlight  bool // a timed-out call still runs in the background
	abandoned bool // the session let go of the episode
	closeOnce sync.Once
}

// close lets go of the episode: it is closed now, or by the timed-out call
// still running when that returns.
func (p *play) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.abandoned = true
	busy := p.inFlight
	p.mu.Unlock()
	if !busy {
		p.closeOnce.Do(func() { p.sess.closeEpisode(p.ep) })
	}
}

// begin marks a program call in progress; the call's goroutine calls
// returned when it ends, in time or after its deadline.
func (p *play) begin() {
	p.mu.Lock()
	p.inFlight = true
	p.mu.Unlock()
}

// returned ends a call: an episode let go of meanwhile is closed now.
func (p *play) returned() {
	p.mu.Lock()
	p.inFlight = false
	abandoned := p.abandoned
	p.mu.Unlock()
	if abandoned {
		p.closeOnce.Do(func() { p.sess.closeEpisode(p.ep) })
	}
}

// closeEpisode closes ep. A panic in its Close (a Go bug in an in-process
// Env) is logged: it would otherwise end the process (on the reaper or a
// timed-out call's goroutine) or leave the session's lock held (release).
func (s *session) closeEpisode(ep envprog.Episode) {
	defer func() {
		if r := recover(); r != nil {
			s.env.srv.logPanic(s, r)
		}
	}()
	ep.Close()
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *session) touch() { s.lastActive.Store(time.Now().UnixNano()) }

// acquire creates a session, or answers CAPACITY_REACHED.
func (e *served) acquire(transport string, onEvict func(ctx context.Context, reason string)) (*session, *openenv.Error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if n := len(e.sessions); n >= e.srv.cfg.MaxSessions {
		return nil, &openenv.Error{Code: openenv.CodeCapacityReached, Fatal: true, Active: n, Max: e.srv.cfg.MaxSessions,
			Message: fmt.Sprintf("Server at capacity: %d/%d sessions active. Cannot accept new connections.", n, e.srv.cfg.MaxSessions)}
	}
	s := &session{id: newID(), env: e, transport: transport, evicted: make(chan struct{}), onEvict: onEvict}
	s.touch()
	e.sessions[s.id] = s
	e.srv.m.sessions.WithLabelValues(e.id).Set(float64(len(e.sessions)))
	return s, nil
}

// lookup returns the HTTP session id held busy (the caller calls leave
// when done), or nil. It enters the session under e.mu, where the reaper
// decides: a session is either found and busy, and so not evicted until
// the caller leaves, or already gone.
func (e *served) lookup(id string) *session {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.sessions[id]
	if s == nil || s.transport != "http" || !s.enter() {
		return nil
	}
	return s
}

// gone is busy's value when the reaper evicts an idle session: a request
// that enters afterwards sees a count below 1 and finds the session gone
// (far below 0, and subtracting it back still fits an int32).
const gone = -1 << 30

// enter marks a request in progress on the session (never evicted while
// one is); false when the reaper evicted it first.
func (s *session) enter() bool {
	if s.busy.Add(1) < 1 {
		s.busy.Add(-1)
		return false
	}
	s.touch()
	return true
}

// leave ends a request that entered.
func (s *session) leave() {
	s.touch()
	s.busy.Add(-1)
}

// release ends a session: its episode is closed (an unfinished one is not
// recorded) and its slot freed.
func (e *served) release(s *session) {
	e.mu.Lock()
	if e.sessions[s.id] == s {
		delete(e.sessions, s.id)
		e.srv.m.sessions.WithLabelValues(e.id).Set(float64(len(e.sessions)))
	}
	e.mu.Unlock()
	s.evictOnce.Do(func() { close(s.evicted) })
	s.mu.Lock()
	s.play.close()
	s.play = nil
	if s.w != nil {
		s.w.stop()
		s.w = nil
	}
	s.mu.Unlock()
}

// reap evicts the sessions idle for longer than the idle timeout. The
// decision is one step on the session's busy count, under e.mu: an idle
// session without a request in progress has gone added to its count (a
// request that enters later finds it gone) and leaves the map at once (a
// lookup later finds nothing); one with a request in progress stays.
func (e *served) reap(now time.Time) {
	limit := now.Add(-e.srv.cfg.IdleTimeout).UnixNano()
	e.mu.Lock()
	var stale []*session
	for id, s := range e.sessions {
		if s.lastActive.Load() >= limit || !s.busy.CompareAndSwap(0, gone) {
			continue
		}
		// A request that ended between the two loads has touched the
		// session before its count fell to 0: it was not idle after all.
		if s.lastActive.Load() >= limit {
			s.busy.Add(-gone)
			continue
		}
		delete(e.sessions, id)
		stale = append(stale, s)
	}
	if len(stale) > 0 {
		e.srv.m.sessions.WithLabelValues(e.id).Set(float64(len(e.sessions)))
	}
	e.mu.Unlock()
	for _, s := range stale {
		e.srv.m.evicted.WithLabelValues(e.id).Inc()
		e.srv.log.Info("env session evicted after idle timeout", "environment", e.id, "session", s.id,
			"transport", s.transport, "idle_timeout", e.srv.cfg.IdleTimeout)
		if s.onEvict != nil {
			go s.onEvict(context.Background(), fmt.Sprintf("session evicted: idle for longer than %s (%s)", e.srv.cfg.IdleTimeout, e.srv.name("idle_timeout"))) // it writes to the client: never hold the reaper up
		}
		e.release(s)
	}
}

// sessionCount is the number of open sessions.
func (e *served) sessionCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.sessions)
}

// errTimeout marks a call cut off by the step timeout.
var errTimeout = errors.New("timeout")

// worker runs a session's program calls on one long-lived goroutine, whose
// stack has grown to what the interpreter needs, instead of a new goroutine
// (and its stack growth) per call.
type worker struct {
	calls chan func()
}

func newWorker() *worker {
	w := &worker{calls: make(chan func())}
	go func() {
		for f := range w.calls {
			f()
		}
	}()
	return w
}

// stop ends the worker once its current call, if any, returns.
func (w *worker) stop() { close(w.calls) }

// within runs f on the session's worker with a deadline and returns at the
// deadline even when f does not: f then goes on in the background (its
// worker is let go, and the session takes a new one) and late receives its
// result. A panic in f is its error (see call). The caller holds s.mu.
func within[T any](s *session, ctx context.Context, d time.Duration, f func(context.Context) (T, error), late func(T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	if s.env.bounded {
		// The Env returns by the deadline itself: call it right here,
		// sparing the two goroutine hand-offs of the worker.
		defer cancel()
		v, err := call(s, ctx, f)
		if err != nil && ctx.Err() != nil {
			if late != nil {
				late(v, err)
			}
			var zero T
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return zero, errTimeout
			}
			return zero, ctx.Err()
		}
		return v, err
	}
	type res struct {
		v   T
		err error
	}
	ch := make(chan res, 1)
	if s.w == nil {
		s.w = newWorker()
	}
	w := s.w
	w.calls <- func() {
		v, err := call(s, ctx, f)
		ch <- res{v, err}
	}
	select {
	case r := <-ch:
		cancel()
		return r.v, r.err
	case <-ctx.Done():
		s.w = nil
		w.stop()
		go func() {
			r := <-ch
			cancel()
			if late != nil {
				late(r.v, r.err)
			}
		}()
		var zero T
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return zero, errTimeout
		}
		return zero, ctx.Err()
	}
}

// panicError is a program call's panic, recovered (a Go bug in an
// in-process Env).
type panicError struct{ v any }

func (e panicError) Error() string { return fmt.Sprintf("panic: %v", e.v) }

// call runs a program call f, a panic turned into its panicError, logged
// with the stack: it would otherwise end the whole process (on the
// session's worker) or leave the session's lock held (on the request's
// goroutine).
func call[T any](s *session, ctx context.Context, f func(context.Context) (T, error)) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.env.srv.logPanic(s, r)
			err = panicError{r}
		}
	}()
	return f(ctx)
}

// logPanic logs a recovered panic with its stack.
func (srv *Server) logPanic(s *session, r any) {
	srv.log.Error("env server: panic recovered", "environment", s.env.id, "session", s.id, "transport", s.transport,
		"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
}

// guard recovers a panic in a session's request outside a program call
// (encoding the observation, a server bug) while the caller holds s.mu:
// it is logged with its stack, the episode ends as an error, and *perr
// becomes the EXECUTION_ERROR the client is answered. Deferred first
// thing after taking s.mu, before the deferred unlock runs.
func (s *session) guard(perr **openenv.Error) {
	r := recover()
	if r == nil {
		return
	}
	s.env.srv.logPanic(s, r)
	if p := s.play; p != nil && !p.done {
		s.failed(p, "step", 0, panicError{r})
	}
	*perr = openenv.Execution("internal error: panic: %v (logged); the episode is over, %s", r, s.newEpisode(s.play != nil))
}

// fromCache is what episodes of envprog's programs tell of their reset
// (envprog.Episode).
type fromCache interface{ FromCache() bool }

// reset starts a new episode in the session (closing the current one).
func (s *session) reset(ctx context.Context, r openenv.ResetRequest) (json.RawMessage, *openenv.Error) {
	srv := s.env.srv
	// The new episode encodes its transcript into the last one's buffers:
	// nothing else holds them (observations are copies), and they have
	// grown to an episode's transcript already.
	var msgJSON []byte
	var msgStart []int
	if s.play != nil {
		msgJSON, msgStart = s.play.msgJSON[:0], s.play.msgStart[:0]
		s.play.close()
		s.play = nil
	}
	seed := mrand.Int64N(1 << 31)
	if r.Seed != nil {
		seed = *r.Seed
	}
	id := newID()
	if r.EpisodeID != nil && *r.EpisodeID != "" {
		id = *r.EpisodeID
	}
	ep, err := within(s, ctx, srv.cfg.StepTimeout, func(ctx context.Context) (envprog.Episode, error) {
		return s.env.env.Reset(ctx, seed)
	}, func(ep envprog.Episode, err error) {
		if err == nil {
			s.closeEpisode(ep)
		}
	})
	if err != nil {
		return nil, s.programError("reset", srv.cfg.StepTimeout, err)
	}
	cache := "miss"
	if c, ok := ep.(fromCache); ok && c.FromCache() {
		cache = "hit"
	}
	srv.m.resets.WithLabelValues(s.env.id, cache).Inc()
	p := &play{sess: s, id: id, seed: seed, ep: ep, started: time.Now(), msgJSON: msgJSON, msgStart: msgStart}
	if r.Hint && s.env.info.HasHint {
		p.begin()
		h, err := within(s, ctx, srv.cfg.StepTimeout, func(ctx context.Context) (string, error) {
			defer p.returned()
			return ep.Hint(ctx)
		}, nil)
		if err != nil {
			p.close()
			return nil, s.programError("hint", srv.cfg.StepTimeout, err)
		}
		p.hint, p.hinted = h, h != ""
	}
	s.play = p
	return s.observation()
}

// programError turns an error of a program call into EXECUTION_ERROR.
func (s *session) programError(fn string, timeout time.Duration, err error) *openenv.Error {
	if errors.Is(err, errTimeout) {
		return openenv.Execution("%s timed out after %s (%s); the episode is over, %s", fn, timeout, s.env.srv.name("step_timeout"), s.newEpisode(fn != "reset" && fn != "hint"))
	}
	var pe *envprog.ProgramError
	if errors.As(err, &pe) {
		return openenv.Execution("%s", pe.Error())
	}
	return openenv.Execution("%s: %v", fn, err)
}

// validate checks an action's tool calls against the environment's tools
// before anything runs: an unknown tool or arguments that do not fit the
// tool's parameters schema is VALIDATION_ERROR, and the episode is
// unchanged.
func (e *served) validate(a openenv.Action) *openenv.Error {
	for i, c := range a.ToolCalls {
		sch, ok := e.params[c.Name]
		if !ok {
			loc, what := callLoc(a.Kind, i, "name")
			return openenv.Validation(loc, "unknown_tool", "%s: unknown tool %q (tools: %s)", what, c.Name, strings.Join(e.names, ", "))
		}
		v, ok := openenv.SchemaValue(c.Arguments)
		if !ok {
			var err error
			if v, err = jsonschema.UnmarshalJSON(strings.NewReader(string(c.Arguments))); err != nil {
				loc, what := callLoc(a.Kind, i, "arguments")
				return openenv.Validation(loc, "json_invalid", "%s arguments: %v", what, err)
			}
		}
		if err := sch.Validate(v); err != nil {
			loc, what := callLoc(a.Kind, i, "arguments")
			return openenv.Validation(loc, "arguments_schema", "%s %s: arguments do not fit the tool's parameters: %s", what, c.Name, schemaMessage(err))
		}
	}
	return nil
}

// callLoc is where tool call i's field ("name" or "arguments") is in an
// action of kind, and what the messages call the call: made only for an
// error, off the path of a valid step.
func callLoc(kind string, i int, field string) ([]any, string) {
	if kind == openenv.ActionCallTool { // {"type": "call_tool", "tool_name", "arguments"}
		if field == "name" {
			field = "tool_name"
		}
		return []any{"data", field}, "call_tool"
	}
	return []any{"data", "tool_calls", i, "function", field}, fmt.Sprintf("tool_calls[%d]", i)
}

var englishPrinter = message.NewPrinter(language.English)

// schemaMessage flattens a jsonschema validation error to its leaves.
func schemaMessage(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	var leaves []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			at := "/" + strings.Join(e.InstanceLocation, "/")
			leaves = append(leaves, at+": "+e.ErrorKind.LocalizedString(englishPrinter))
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	sort.Strings(leaves)
	return strings.Join(leaves, "; ")
}

// step plays one action in the session's episode.
func (s *session) step(ctx context.Context, a openenv.Action, timeout time.Duration) (json.RawMessage, *openenv.Error) {
	srv := s.env.srv
	if e := s.env.validate(a); e != nil { // a bad action is told first
		return nil, e
	}
	p := s.play
	if p == nil {
		return nil, openenv.Execution("no episode: send reset first")
	}
	if p.done {
		return nil, openenv.Execution("the episode is done (%s): %s", p.reason, s.newEpisode(true))
	}
	act := envprog.Action{Content: a.Content}
	for i, c := range a.ToolCalls {
		id := c.ID
		if id == "" {
			id = fmt.Sprintf("call_%d_%d", p.steps+1, i)
		}
		act.ToolCalls = append(act.ToolCalls, envprog.ToolCall{ID: id, Name: c.Name, Arguments: json.RawMessage(c.Arguments)})
	}
	t0 := time.Now()
	p.begin()
	res, err := within(s, ctx, timeout, func(ctx context.Context) (envprog.StepResult, error) {
		defer p.returned()
		return p.ep.Step(ctx, act)
	}, nil)
	srv.m.stepTime.WithLabelValues(s.env.id).Observe(time.Since(t0).Seconds())
	srv.m.steps.WithLabelValues(s.env.id).Inc()
	if err != nil {
		return nil, s.failed(p, "step", timeout, err)
	}
	p.steps++
	p.results = chatMessages(res.ToolResults)
	if !res.Done {
		return s.observation()
	}
	p.done = true
	switch {
	case len(a.ToolCalls) == 0:
		p.reason = "final"
	case p.steps >= s.env.maxTurns:
		// The runtime ends an episode at its turn limit; a program that
		// ended it itself on that very turn cannot be told apart.
		p.reason = "max_turns"
	default:
		p.reason = "environment"
	}
	p.begin()
	rw, err := within(s, ctx, timeout, func(ctx context.Context) (envprog.Reward, error) {
		defer p.returned()
		return p.ep.Reward(ctx)
	}, nil)
	if err == nil {
		err = finiteReward(rw, p.seed)
	}
	if err != nil {
		return nil, s.failed(p, "reward", timeout, err)
	}
	p.reward = &rw
	srv.m.reward.WithLabelValues(s.env.id).Observe(rw.Value)
	srv.m.episodes.WithLabelValues(s.env.id, p.reason).Inc()
	srv.record(s, p)
	return s.observation()
}

// finiteReward refuses a reward component that is not a finite number
// (float("inf"), an overflow, log(0)): JSON has no such number, and the
// observation, the tools/call result and the recorded row could not carry
// it. The value itself is checked by the runtime (within [0, 1]).
func finiteReward(rw envprog.Reward, seed int64) error {
	for _, k := range slices.Sorted(maps.Keys(rw.Components)) {
		if x := rw.Components[k]; math.IsNaN(x) || math.IsInf(x, 0) {
			return &envprog.ProgramError{Func: "reward", Seed: seed, Msg: fmt.Sprintf("component %q is %v, want a finite number", k, x)}
		}
	}
	return nil
}

// failed ends the episode on the error of a program call (fn): "timeout"
// for the step timeout or the program's own call timeout, else "error".
// The episode is finished, counted and recorded as any other (without a
// reward); a call cut off because its request went away (a cancelled
// context) leaves it abandoned, and unrecorded, instead.
func (s *session) failed(p *play, fn string, timeout time.Duration, err error) *openenv.Error {
	s.end(p, err)
	return s.programError(fn, timeout, err)
}

// end ends the episode on err (see failed).
func (s *session) end(p *play, err error) {
	p.done, p.err = true, err.Error()
	p.reason = "error"
	var pe *envprog.ProgramError
	if errors.Is(err, errTimeout) || (errors.As(err, &pe) && pe.Limit == "timeout") {
		p.reason = "timeout"
	}
	if !errors.Is(err, context.Canceled) {
		srv := s.env.srv
		srv.m.episodes.WithLabelValues(s.env.id, p.reason).Inc()
		srv.record(s, p)
	}
}

// oversized answers, with EXECUTION_ERROR, an observation of n bytes over
// env.max_observation_bytes, which is not sent (transcript: n is its
// transcript's encoding alone, and it was not built).
//
// The session survives, as it survives a program's error: the limit is
// about one answer, the connection and the server are fine, and what made
// the answer large (the encoded transcript, the frame buffer) is let go
// here, so the session holds none of it. The episode does not: every
// later observation holds the whole transcript, which only grows, and the
// client never saw this step's results. A reset's episode is let go (no
// episode, as after a reset that failed); a step's ends as an error
// (done_reason "error", recorded), unless it had ended already, whose
// reward is recorded and in its state.
func (s *session) oversized(n int, transcript bool) *openenv.Error {
	srv := s.env.srv
	p := s.play
	what := "the observation is"
	if transcript {
		what = "the observation's transcript alone is"
	}
	msg := fmt.Sprintf("%s %d bytes, over the %d-byte limit (%s)", what, n, srv.cfg.MaxObservationBytes, srv.name("max_observation_bytes"))
	srv.log.Warn("env server: observation over env.max_observation_bytes, not sent", "environment", s.env.id, "session", s.id,
		"episode", p.id, "seed", p.seed, "step_count", p.steps, "bytes", n, "transcript_only", transcript, "limit", srv.cfg.MaxObservationBytes)
	s.frameBuf = nil
	p.msgJSON, p.msgStart, p.tail = nil, nil, nil
	if p.steps == 0 { // the reset's observation
		p.close()
		s.play = nil
		return openenv.Execution("reset (seed %d): %s; %s", p.seed, msg, s.newEpisode(false))
	}
	if !p.done {
		s.end(p, errors.New(msg))
	}
	return openenv.Execution("step: %s; the episode is over, %s", msg, s.newEpisode(true))
}

// newEpisode tells the client how to play a new episode on the endpoint
// it uses, once its episode is over (started) or a reset failed (not
// started, the session has no episode).
func (s *session) newEpisode(started bool) string {
	switch {
	case s.stateless:
		return "each stateless request plays a fresh episode"
	case s.mcpOnly && started:
		// Its tools/call starts an episode only in a session without
		// one, and it cannot reset or close its own session.
		return "reconnect for a new episode (WS …/mcp has no reset: a new connection is a new session, whose first tools/call starts one)"
	case s.mcpOnly:
		return "the next tools/call starts a new episode"
	case s.transport == "http":
		return "send reset (POST …/reset with this session id)"
	}
	return "send reset"
}

// state is the session's state frame / GET /state body.
func (s *session) state() openenv.State {
	st := openenv.State{Environment: s.env.id}
	if s.transport == "http" {
		st.SessionID = s.id
	}
	p := s.play
	if p == nil {
		return st
	}
	id, seed := p.id, p.seed
	st.EpisodeID, st.Seed, st.StepCount, st.Done = &id, &seed, p.steps, p.done
	if p.reward != nil {
		v := p.reward.Value
		st.Reward, st.Components = &v, p.reward.Components
	}
	return st
}

func chatMessages(ms []envprog.Message) []openenv.ChatMessage {
	if ms == nil {
		return nil
	}
	out := make([]openenv.ChatMessage, len(ms))
	for i, m := range ms {
		c := openenv.ChatMessage{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, Name: m.Name}
		for _, tc := range m.ToolCalls {
			args := string(tc.Arguments)
			if args == "" {
				args = "{}"
			}
			c.ToolCalls = append(c.ToolCalls, openenv.ChatToolCall{ID: tc.ID, Type: "function",
				Function: openenv.ChatFunction{Name: tc.Name, Arguments: args}})
		}
		out[i] = c
	}
	return out
}

// record offers a finished episode to the recorder (sampled).
func (s *Server) record(sess *session, p *play) {
	if s.rec == nil || !Sampled(p.id, s.cfg.RecordSample) {
		return
	}
	// An episode that ended on a timeout or an error has no reward: 0
	// and no components.
	reward, comps := 0.0, []byte("{}")
	if p.reward != nil {
		reward = p.reward.Value
		if p.reward.Components != nil {
			comps, _ = json.Marshal(p.reward.Components)
		}
	}
	s.rec.offer(sink.EnvEpisodeRow{EnvironmentID: sess.env.id, ProgramHash: sess.env.info.Hash, SessionID: sess.id,
		EpisodeID: p.id, Transport: sess.transport, Seed: p.seed, Hinted: p.hinted, Steps: uint32(p.steps),
		DoneReason: p.reason, Reward: reward, Components: string(comps), StartedAt: p.started, EndedAt: time.Now()})
}
