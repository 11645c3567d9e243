package envprog

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	starjson "go.starlark.net/lib/json"
	starmath "go.starlark.net/lib/math"
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/traceops/trace/schemas"
)

// fileOptions are the dialect of environment programs: Python's while,
// set, top-level control flow and global reassignment are allowed, so code
// written in the style of the authors' Python environments runs as
// written. Recursion is not (Starlark's default): a recursive call fails at
// once with "function f called recursively". With recursion allowed the
// interpreter's only bound is 100,000 frames, which take ~140 MB of Go
// stack and seconds to reach: too much for a trusted in-process program to
// do by mistake, and an out-of-memory death for a sandboxed one.
var fileOptions = &syntax.FileOptions{
	Set:             true,
	While:           true,
	TopLevelControl: true,
	GlobalReassign:  true,
}

// predeclared are the names a program sees besides Starlark's universe.
var predeclared = starlark.StringDict{
	"json": starjson.Module,
	"math": starmath.Module,
	"rand": starlark.NewBuiltin("rand", newRand),
}

// contract lists the top-level functions of the contract with their number
// of positional parameters.
var contract = []struct {
	name     string
	params   int
	optional bool
}{
	{"tools", 0, false},
	{"reset", 1, false},
	{"step", 2, false},
	{"reward", 2, false},
	{"hint", 1, true},
	{"reference", 1, true},
}

// program is a loaded, frozen module. It is immutable, so episodes on
// many goroutines share it; each episode has its own thread and state.
type program struct {
	info  Info
	lim   Limits
	fns   map[string]*starlark.Function
	tools map[string]starlark.Value // tool name -> the name as a Starlark string
	// closed is set by Close; Reset then fails.
	closed atomic.Bool
	// resets is the per-seed reset cache (nil: none).
	resets *resetCache
}

// Load compiles and initialises an environment program in this process.
// Use it for trusted programs (the shipped example and templates):
// execution steps and wall-clock time are bounded, memory is not. A
// generated program must go through LoadSandboxed.
//
// A program that does not parse, fails at top level, lacks a contract
// function or whose tools() is malformed yields a *ProgramError with Func
// "" (or "tools").
func Load(ctx context.Context, name string, src []byte, lim Limits) (Env, error) {
	return load(ctx, name, src, lim.withDefaults())
}

func load(ctx context.Context, name string, src []byte, lim Limits) (*program, error) {
	if name == "" {
		name = "program.star"
	}
	f, err := fileOptions.Parse(name, src, syntax.RetainComments)
	if err != nil {
		return nil, &ProgramError{Msg: err.Error()}
	}
	prog, err := starlark.FileProgram(f, predeclared.Has)
	if err != nil {
		return nil, &ProgramError{Msg: err.Error()}
	}
	sum := sha256.Sum256(src)
	p := &program{
		info:   Info{Name: name, Doc: moduleDoc(f), Hash: hex.EncodeToString(sum[:])},
		lim:    lim,
		fns:    map[string]*starlark.Function{},
		resets: newResetCache(lim.ResetCache),
	}
	th := newThread(name)
	g := newGuard(th, lim)
	defer g.release()
	var globals starlark.StringDict
	if err := g.run(ctx, "", 0, func() (err error) {
		globals, err = prog.Init(th, predeclared)
		return err
	}); err != nil {
		return nil, err
	}
	// Freeze the module: every episode shares it, so no episode may change
	// what another sees (state lives in the value reset returns).
	globals.Freeze()
	for _, c := range contract {
		v, ok := globals[c.name]
		if !ok {
			if c.optional {
				continue
			}
			return nil, &ProgramError{Msg: fmt.Sprintf("the contract function %s() is not defined", c.name)}
		}
		fn, ok := v.(*starlark.Function)
		if !ok {
			return nil, &ProgramError{Msg: fmt.Sprintf("%s is a %s, want a function (def %s(...))", c.name, v.Type(), c.name)}
		}
		if err := checkArity(fn, c.params); err != nil {
			return nil, &ProgramError{Func: c.name, Msg: err.Error()}
		}
		p.fns[c.name] = fn
	}
	p.info.HasHint = p.fns["hint"] != nil
	p.info.HasReference = p.fns["reference"] != nil
	v, err := p.call(ctx, g, "tools", 0)
	if err != nil {
		return nil, err
	}
	tools, err := toolsOf(v)
	if err != nil {
		return nil, &ProgramError{Func: "tools", Msg: err.Error()}
	}
	p.info.Tools = tools
	p.tools = make(map[string]starlark.Value, len(tools))
	for _, t := range tools {
		p.tools[t.Function.Name] = starlark.String(t.Function.Name)
	}
	return p, nil
}

// moduleDoc is the module docstring: a string literal as first statement.
func moduleDoc(f *syntax.File) string {
	if len(f.Stmts) == 0 {
		return ""
	}
	es, ok := f.Stmts[0].(*syntax.ExprStmt)
	if !ok {
		return ""
	}
	lit, ok := es.X.(*syntax.Literal)
	if !ok || lit.Token != syntax.STRING {
		return ""
	}
	s, _ := lit.Value.(string)
	return strings.TrimSpace(s)
}

// checkArity reports whether fn can be called with n positional arguments.
func checkArity(fn *starlark.Function, n int) error {
	npos := fn.NumParams() - fn.NumKwonlyParams()
	if fn.HasVarargs() {
		npos-- // the *args parameter is counted among the parameters
	}
	if fn.HasKwargs() {
		npos--
	}
	required := 0
	for i := 0; i < npos; i++ {
		if fn.ParamDefault(i) == nil {
			required++
		}
	}
	for i := npos; i < npos+fn.NumKwonlyParams(); i++ {
		if fn.ParamDefault(i) == nil {
			name, _ := fn.Param(i)
			return fmt.Errorf("keyword-only parameter %s has no default", name)
		}
	}
	if required > n || (n > npos && !fn.HasVarargs()) {
		return fmt.Errorf("%s takes %d required positional parameters (of %d), want %d", fn.Name(), required, npos, n)
	}
	return nil
}

// toolsOf converts the value of tools() into OpenAI function schemas.
func toolsOf(v starlark.Value) ([]schemas.Tool, error) {
	list, ok := v.(*starlark.List)
	if !ok {
		return nil, fmt.Errorf("returned a %s, want a list of OpenAI function schemas", v.Type())
	}
	tools := make([]schemas.Tool, 0, list.Len())
	seen := map[string]bool{}
	for i := 0; i < list.Len(); i++ {
		b, err := toJSON(list.Index(i))
		if err != nil {
			return nil, fmt.Errorf("tool %d: %v", i, err)
		}
		var t schemas.Tool
		if err := json.Unmarshal(b, &t); err != nil {
			return nil, fmt.Errorf("tool %d: %v", i, err)
		}
		if t.Type != "function" {
			return nil, fmt.Errorf("tool %d: type is %q, want \"function\"", i, t.Type)
		}
		if t.Function.Name == "" {
			return nil, fmt.Errorf("tool %d: function.name is missing", i)
		}
		if seen[t.Function.Name] {
			return nil, fmt.Errorf("tool %d: %s is defined twice", i, t.Function.Name)
		}
		seen[t.Function.Name] = true
		if len(t.Function.Parameters) > 0 {
			var params struct {
				Type       string                     `json:"type"`
				Properties map[string]json.RawMessage `json:"properties"`
			}
			if err := json.Unmarshal(t.Function.Parameters, &params); err != nil || params.Type != "object" {
				return nil, fmt.Errorf("tool %s: parameters must be a JSON schema of type \"object\"", t.Function.Name)
			}
		}
		// The environment server compiles the schema the same way to
		// validate arguments: one it would refuse fails here.
		if _, err := CompileParameters(t.Function.Name, t.Function.Parameters); err != nil {
			return nil, err
		}
		tools = append(tools, t)
	}
	return tools, nil
}

func newThread(name string) *starlark.Thread {
	return &starlark.Thread{
		Name:  name,
		Print: func(*starlark.Thread, string) {}, // no I/O: print goes nowhere
		Load: func(*starlark.Thread, string) (starlark.StringDict, error) {
			return nil, errors.New("load() is not available to environment programs")
		},
	}
}

// guard bounds the contract calls of one thread (a program's load, or an
// episode): the step limit, a timer for the call timeout and ctx. It is
// made once per thread; each call arms it and disarms it, and a timer that
// fires late finds it disarmed and leaves the thread's next call alone.
type guard struct {
	th    *starlark.Thread
	lim   Limits
	timer *time.Timer

	mu    sync.Mutex
	armed bool
	limit string // what cancelled the armed call
}

func newGuard(th *starlark.Thread, lim Limits) *guard {
	g := &guard{th: th, lim: lim}
	th.OnMaxSteps = func(*starlark.Thread) { g.cancel("steps") }
	g.timer = time.AfterFunc(time.Hour, func() { g.cancel("timeout") })
	g.timer.Stop()
	return g
}

func (g *guard) cancel(limit string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.armed && g.limit == "" {
		g.limit = limit
		g.th.Cancel(limit)
	}
}

// run runs f (Starlark code on the guard's thread) under the limits and
// turns what went wrong into a *ProgramError (or ctx's error when the
// caller cancelled).
func (g *guard) run(ctx context.Context, fn string, seed int64, f func() error) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	th := g.th
	th.Uncancel()
	th.Steps = 0
	th.SetMaxExecutionSteps(g.lim.MaxSteps)
	g.mu.Lock()
	g.armed, g.limit = true, ""
	g.mu.Unlock()
	g.timer.Reset(g.lim.CallTimeout)
	stop := func() bool { return false }
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() { g.cancel("context") })
	}
	defer func() {
		if r := recover(); r != nil {
			err = &ProgramError{Func: fn, Seed: seed, Msg: fmt.Sprintf("runtime panic: %v\n%s", r, debug.Stack())}
		}
	}()
	err = f()
	g.timer.Stop()
	stop()
	g.mu.Lock()
	g.armed = false
	limit := g.limit
	g.mu.Unlock()
	if err == nil {
		return nil
	}
	if limit == "context" {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
	}
	msg := err.Error()
	var ee *starlark.EvalError
	if errors.As(err, &ee) {
		msg = ee.Backtrace()
	}
	if strings.Contains(msg, "frozen") {
		msg += "\n(module-level values are frozen: every episode shares them. Copy what an episode changes, e.g. dict(X) or list(X), into the state reset returns.)"
	}
	switch limit {
	case "steps":
		msg = fmt.Sprintf("more than %d execution steps\n%s", g.lim.MaxSteps, msg)
	case "timeout":
		msg = fmt.Sprintf("ran longer than %v\n%s", g.lim.CallTimeout, msg)
	}
	return &ProgramError{Func: fn, Seed: seed, Limit: limit, Msg: msg}
}

// release stops the guard's timer for good.
func (g *guard) release() { g.timer.Stop() }

// call calls the contract function fn under the limits.
func (p *program) call(ctx context.Context, g *guard, fn string, seed int64, args ...starlark.Value) (starlark.Value, error) {
	var v starlark.Value
	err := g.run(ctx, fn, seed, func() (err error) {
		v, err = starlark.Call(g.th, p.fns[fn], args, nil)
		return err
	})
	return v, err
}

func (p *program) Info() Info {
	info := p.info
	info.Tools = slices.Clone(p.info.Tools)
	return info
}

func (p *program) Close() error {
	p.closed.Store(true)
	return nil
}

var errClosed = errors.New("envprog: environment is closed")

func (p *program) Reset(ctx context.Context, seed int64) (Episode, error) {
	return p.reset(ctx, seed)
}

func (p *program) reset(ctx context.Context, seed int64) (*episode, error) {
	if p.closed.Load() {
		return nil, errClosed
	}
	if e, ok, err := p.cachedReset(ctx, seed); ok || err != nil {
		return e, err
	}
	g := newGuard(newThread(p.info.Name), p.lim)
	v, err := p.call(ctx, g, "reset", seed, starlark.MakeInt64(seed))
	if err != nil {
		g.release()
		return nil, err
	}
	e := &episode{p: p, g: g, seed: seed}
	fields, err := dictFields(v, []string{"system", "user", "state"}, nil)
	if err != nil {
		return nil, e.shapeError("reset", err)
	}
	system, ok1 := fields["system"].(starlark.String)
	user, ok2 := fields["user"].(starlark.String)
	if !ok1 || !ok2 {
		return nil, e.shapeError("reset", fmt.Errorf("system and user must be strings, got %s and %s", fields["system"].Type(), fields["user"].Type()))
	}
	if e.state, err = privateState(fields["state"]); err != nil {
		return nil, e.shapeError("reset", err)
	}
	if e.text = len(system) + len(user); e.text > MaxTranscriptText {
		g.release()
		return nil, e.outputError("reset", e.text)
	}
	e.start = Start{System: string(system), User: string(user)}
	e.begin()
	if p.resets != nil {
		// The state's copy may take what the start leaves of the largest
		// entry; it stops there (errCopyLimit), uncached.
		if room := p.resets.maxEntry() - int64(e.text); room > 0 && p.resets.again(seed) {
			c := copier{seen: map[starlark.Value]starlark.Value{}, limit: room}
			if tmpl, err := c.copy(e.state, 0); err == nil && !c.shared {
				tmpl.Freeze()
				p.resets.put(seed, e.start, tmpl, c.bytes+int64(e.text))
			}
		}
	}
	return e, nil
}

// cachedReset is reset from the cache: a new episode with a copy of the
// cached state; ok is false when seed is not cached.
func (p *program) cachedReset(ctx context.Context, seed int64) (e *episode, ok bool, err error) {
	if p.resets == nil {
		return nil, false, nil
	}
	start, tmpl, ok := p.resets.get(seed)
	if !ok {
		return nil, false, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, true, err
	}
	state, err := deepCopy(tmpl)
	if err != nil { // it was copied once already: cannot happen
		return nil, true, &ProgramError{Func: "reset", Seed: seed, Msg: "copying the cached state: " + err.Error()}
	}
	e = &episode{p: p, g: newGuard(newThread(p.info.Name), p.lim), seed: seed, start: start, state: state,
		text: len(start.System) + len(start.User), cached: true}
	e.begin()
	return e, true, nil
}

// begin starts the transcript with the system and user messages.
func (e *episode) begin() {
	e.msgs = make([]Message, 2, 16)
	e.msgs[0] = Message{Role: "system", Content: e.start.System}
	e.msgs[1] = Message{Role: "user", Content: e.start.User}
}

// ResetCacheOf returns the counts of env's reset cache (zero when it
// has none), asking a sandboxed env's worker for its own.
func ResetCacheOf(ctx context.Context, env Env) (ResetCacheStats, error) {
	switch x := env.(type) {
	case *program:
		return x.resetStats(), nil
	case *sandbox:
		st, _, err := x.stats(ctx)
		return st.ResetCache, err
	}
	return ResetCacheStats{}, fmt.Errorf("envprog: %T has no reset cache", env)
}

func (p *program) resetStats() ResetCacheStats {
	if p.resets == nil {
		return ResetCacheStats{}
	}
	return p.resets.counts()
}

// dictFields checks that v is a dict with string keys, all of required and
// none beyond required and optional, and returns its entries.
func dictFields(v starlark.Value, required, optional []string) (map[string]starlark.Value, error) {
	d, ok := v.(*starlark.Dict)
	if !ok {
		return nil, fmt.Errorf("returned a %s, want a dict with keys %s", v.Type(), keyList(required, optional))
	}
	out := make(map[string]starlark.Value, d.Len())
	for key, val := range d.Entries() {
		k, ok := key.(starlark.String)
		if !ok || (!slices.Contains(required, string(k)) && !slices.Contains(optional, string(k))) {
			return nil, fmt.Errorf("returned a dict with key %s; the keys are %s", key.String(), keyList(required, optional))
		}
		out[string(k)] = val
	}
	for _, k := range required {
		if _, ok := out[k]; !ok {
			return nil, fmt.Errorf("returned a dict without key %q; the keys are %s", k, keyList(required, optional))
		}
	}
	return out, nil
}

func keyList(required, optional []string) string {
	s := `"` + strings.Join(required, `", "`) + `"`
	if len(optional) > 0 {
		s += ` (and optionally "` + strings.Join(optional, `", "`) + `")`
	}
	return s
}

// Keys and values the runtime hands programs, converted to Starlark once.
var (
	kType      starlark.Value = starlark.String("type")
	kID        starlark.Value = starlark.String("id")
	kName      starlark.Value = starlark.String("name")
	kArguments starlark.Value = starlark.String("arguments")
	kContent   starlark.Value = starlark.String("content")
	kRole      starlark.Value = starlark.String("role")
	kToolCalls starlark.Value = starlark.String("tool_calls")
	kToolCall  starlark.Value = starlark.String("tool_call_id")
	vTool      starlark.Value = starlark.String("tool")
	vFinal     starlark.Value = starlark.String("final")
)

// episode is one in-process play. It is used by one goroutine at a time.
type episode struct {
	p     *program
	g     *guard
	seed  int64
	buf   []byte // reused for JSON results
	start Start
	state starlark.Value
	msgs  []Message
	text  int // the bytes of the program's text in msgs (see MaxTranscriptText)
	turns int
	done  bool
	// cached is set when Reset was answered from the reset cache.
	cached bool
}

// MaxTranscriptText bounds the text a program puts in one episode's
// transcript: its system and user prompts and its tool results, in bytes;
// with its hint too, which joins the system prompt of a hinted episode.
// A sandboxed episode's transcript is kept in the parent as well, where a
// string the worker returns again and again (a global, shared in the
// worker) is a copy each time: without this bound a program within its
// worker's memory made the parent hold 64 MiB per turn per episode, and
// every observation encode it again.
const MaxTranscriptText = 16 << 20

// outputError is the *ProgramError of fn whose text would take the
// episode's transcript past MaxTranscriptText.
func (e *episode) outputError(fn string, n int) error {
	return &ProgramError{Func: fn, Seed: e.seed, Limit: "output",
		Msg: fmt.Sprintf("the episode's transcript would hold %d bytes of the program's text, more than the %d an episode may", n, MaxTranscriptText)}
}

func (e *episode) shapeError(fn string, err error) error {
	return &ProgramError{Func: fn, Seed: e.seed, Msg: err.Error()}
}

func (e *episode) Seed() int64     { return e.seed }
func (e *episode) FromCache() bool { return e.cached }
func (e *episode) Start() Start    { return e.start }
func (e *episode) Close() error {
	e.done = true
	e.g.release()
	return nil
}

func (e *episode) Messages() []Message { return slices.Clone(e.msgs) }

// MessagesFrom is the transcript from message i on as a read-only view:
// no copy, and still valid after later steps (the transcript only grows,
// and a message is never changed once added). A server that sends the
// transcript on every step takes only what is new this way.
func (e *episode) MessagesFrom(i int) []Message {
	return e.msgs[min(i, len(e.msgs)):len(e.msgs):len(e.msgs)]
}

// Step executes one assistant turn; see Episode.
func (e *episode) Step(ctx context.Context, a Action) (StepResult, error) {
	if e.done {
		return StepResult{Done: true}, ErrDone
	}
	e.turns++
	a = normalizeAction(a, e.turns)
	e.msgs = append(e.msgs, Message{Role: "assistant", Content: a.Content, ToolCalls: a.ToolCalls})
	var res StepResult
	if len(a.ToolCalls) == 0 {
		call := starlark.NewDict(2)
		_ = call.SetKey(kType, vFinal)
		_ = call.SetKey(kContent, starlark.String(a.Content))
		if _, _, err := e.step(ctx, call, false); err != nil {
			e.done = true
			return StepResult{Done: true}, err
		}
		e.done = true
		return StepResult{Done: true}, nil
	}
	first := len(e.msgs) // the tool results are the transcript's last messages
	for _, tc := range a.ToolCalls {
		var content string
		switch {
		case e.done:
			content = "Error: not executed: the episode ended with an earlier call of this turn."
		case e.p.tools[tc.Name] == nil:
			content = fmt.Sprintf("Error: unknown tool %q; the tools are %s.", tc.Name, strings.Join(e.p.toolNames(), ", "))
		default:
			args, err := parseArguments(tc.Arguments)
			if err != nil {
				content = fmt.Sprintf("Error: the arguments of %s are not a JSON object: %v", tc.Name, err)
				break
			}
			call := starlark.NewDict(4)
			_ = call.SetKey(kType, vTool)
			_ = call.SetKey(kID, starlark.String(tc.ID))
			_ = call.SetKey(kName, e.p.tools[tc.Name])
			_ = call.SetKey(kArguments, args)
			text, done, err := e.step(ctx, call, true)
			if err != nil {
				e.done = true
				return StepResult{ToolResults: e.msgs[first:len(e.msgs):len(e.msgs)], Done: true}, err
			}
			if e.text += len(text); e.text > MaxTranscriptText {
				e.done = true
				return StepResult{ToolResults: e.msgs[first:len(e.msgs):len(e.msgs)], Done: true}, e.outputError("step", e.text)
			}
			content = text
			if done {
				e.done = true
			}
		}
		e.msgs = append(e.msgs, Message{Role: "tool", Content: content, ToolCallID: tc.ID, Name: tc.Name})
	}
	// A view of the transcript, capped so that appending to it copies.
	res.ToolResults = e.msgs[first:len(e.msgs):len(e.msgs)]
	if e.turns >= e.p.lim.MaxTurns {
		e.done = true
	}
	res.Done = e.done
	return res, nil
}

// normalizeAction gives every tool call an id ("call_<turn>_<i>") and
// arguments that are JSON text: none become {}, text that is not JSON
// becomes a JSON string holding it (so the policy is told its arguments
// are malformed, and the transcript keeps what it sent).
func normalizeAction(a Action, turn int) Action {
	cloned := false
	for i := range a.ToolCalls {
		tc := a.ToolCalls[i]
		raw := bytes.TrimSpace(tc.Arguments)
		fix := tc.ID == "" || len(raw) == 0 || !json.Valid(raw)
		if !fix {
			continue
		}
		if !cloned { // never change the caller's slice
			a.ToolCalls = slices.Clone(a.ToolCalls)
			cloned = true
		}
		if tc.ID == "" {
			tc.ID = "call_" + strconv.Itoa(turn) + "_" + strconv.Itoa(i)
		}
		switch {
		case len(raw) == 0:
			tc.Arguments = json.RawMessage("{}")
		case !json.Valid(raw):
			b, _ := json.Marshal(string(raw))
			tc.Arguments = b
		}
		a.ToolCalls[i] = tc
	}
	return a
}

// step calls step(state, call) and takes its new state.
func (e *episode) step(ctx context.Context, call *starlark.Dict, tool bool) (string, bool, error) {
	v, err := e.p.call(ctx, e.g, "step", e.seed, e.state, call)
	if err != nil {
		return "", false, err
	}
	var result, state, done starlark.Value
	d, ok := v.(*starlark.Dict)
	if !ok {
		return "", false, e.shapeError("step", stepShape(v, tool))
	}
	for _, kv := range d.Items() {
		k, _ := kv[0].(starlark.String)
		switch k {
		case "result":
			result = kv[1]
		case "state":
			state = kv[1]
		case "done":
			done = kv[1]
		default:
			return "", false, e.shapeError("step", stepShape(v, tool))
		}
	}
	if state == nil || (tool && result == nil) {
		return "", false, e.shapeError("step", stepShape(v, tool))
	}
	isDone := false
	if done != nil {
		b, ok := done.(starlark.Bool)
		if !ok {
			return "", false, e.shapeError("step", fmt.Errorf("done is a %s, want a bool", done.Type()))
		}
		isDone = bool(b)
	}
	e.state = state
	if !tool {
		return "", isDone, nil
	}
	if s, ok := result.(starlark.String); ok {
		return string(s), isDone, nil
	}
	if e.buf, err = appendJSON(e.buf[:0], result); err != nil {
		return "", false, e.shapeError("step", fmt.Errorf("result: %v", err))
	}
	return string(e.buf), isDone, nil
}

// stepShape words what is wrong with the value step returned.
func stepShape(v starlark.Value, tool bool) error {
	required, optional := []string{"state"}, []string{"result", "done"}
	if tool {
		required, optional = []string{"result", "state"}, []string{"done"}
	}
	if _, err := dictFields(v, required, optional); err != nil {
		return err
	}
	return fmt.Errorf("returned %s", v.String())
}

func (p *program) toolNames() []string {
	names := make([]string, 0, len(p.info.Tools))
	for _, t := range p.info.Tools {
		names = append(names, t.Function.Name)
	}
	return names
}

// parseArguments converts a tool call's arguments into a dict. OpenAI
// sends them as a JSON string holding the object's text; an object is
// accepted too, and no arguments at all are an empty object.
func parseArguments(raw json.RawMessage) (*starlark.Dict, error) {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 || string(b) == "null" {
		return starlark.NewDict(0), nil
	}
	if b[0] == '"' {
		if len(b) < 2 || b[len(b)-1] != '"' {
			return nil, fmt.Errorf("an unterminated JSON string")
		}
		body, ok := unescapeBytes(b[1 : len(b)-1])
		if !ok {
			return nil, fmt.Errorf("an invalid JSON string")
		}
		b = bytes.TrimSpace(body)
		if len(b) == 0 {
			return starlark.NewDict(0), nil
		}
	}
	v, err := fromJSON(b)
	if err != nil {
		return nil, err
	}
	d, ok := v.(*starlark.Dict)
	if !ok {
		return nil, fmt.Errorf("got a JSON %s", jsonKind(v))
	}
	return d, nil
}

func jsonKind(v starlark.Value) string {
	switch v.(type) {
	case *starlark.List:
		return "array"
	case starlark.String:
		return "string"
	case starlark.NoneType:
		return "null"
	case starlark.Bool:
		return "boolean"
	default:
		return "number"
	}
}

// transcript is the episode's messages as reward() sees them; see
// transcriptValue.
func (e *episode) transcript() starlark.Value {
	return &transcriptValue{msgs: e.msgs[:len(e.msgs):len(e.msgs)], cache: make([]starlark.Value, len(e.msgs))}
}

// Reward calls reward(state, transcript). Like hint and reference it gets
// the episode's state itself, not a copy (a copy per call would cost as
// much as the reset): the contract says these functions read the state
// and never change it, and validation checks that two calls agree.
func (e *episode) Reward(ctx context.Context) (Reward, error) {
	v, err := e.p.call(ctx, e.g, "reward", e.seed, e.state, e.transcript())
	if err != nil {
		return Reward{}, err
	}
	return rewardOf(v, e.seed)
}

// MaxComponents and MaxComponentName bound a reward's components, which
// every observation ending an episode and every recorded episode
// (env_episodes.components, through a queue of up to env.record_queue
// episodes) carry: without them a sandboxed program could return a
// shared 64 MiB name in every reward, a copy of it per episode outside
// the worker.
const (
	MaxComponents    = 64
	MaxComponentName = 128
)

func rewardOf(v starlark.Value, seed int64) (Reward, error) {
	fail := func(format string, args ...any) (Reward, error) {
		return Reward{}, &ProgramError{Func: "reward", Seed: seed, Msg: fmt.Sprintf(format, args...)}
	}
	fields, err := dictFields(v, []string{"reward"}, []string{"components"})
	if err != nil {
		return fail("%v", err)
	}
	r, ok := starlark.AsFloat(fields["reward"])
	if !ok {
		return fail("reward is a %s, want a number in [0, 1]", fields["reward"].Type())
	}
	r = roundReward(r)
	out := Reward{Value: r}
	if c, ok := fields["components"]; ok && c != starlark.None {
		d, ok := c.(*starlark.Dict)
		if !ok {
			return fail("components is a %s, want a dict of name to number", c.Type())
		}
		if d.Len() > MaxComponents {
			return Reward{}, &ProgramError{Func: "reward", Seed: seed, Limit: "output",
				Msg: fmt.Sprintf("%d components, more than the %d a reward may have", d.Len(), MaxComponents)}
		}
		out.Components = make(map[string]float64, d.Len())
		for key, val := range d.Entries() {
			if k, ok := key.(starlark.String); ok && len(k) > MaxComponentName {
				return Reward{}, &ProgramError{Func: "reward", Seed: seed, Limit: "output",
					Msg: fmt.Sprintf("a component's name of %d bytes (%.40q…), more than the %d a name may have", len(k), string(k), MaxComponentName)}
			}
			k, ok1 := key.(starlark.String)
			x, ok2 := starlark.AsFloat(val)
			if !ok1 || !ok2 {
				return fail("component %s: %s, want a number under a string name", key, val.Type())
			}
			if math.IsNaN(x) || math.IsInf(x, 0) { // JSON has no such number: no observation or row could carry it
				return fail("component %s is %v, want a finite number", key, x)
			}
			out.Components[string(k)] = roundReward(x)
		}
	}
	if !(r >= 0 && r <= 1) {
		return out, &ProgramError{Func: "reward", Seed: seed, Msg: fmt.Sprintf("reward %v is outside [0, 1]", r)}
	}
	return out, nil
}

// roundReward rounds to 12 decimal places, so float noise of a weighted
// sum (0.3 + 0.35 + 0.35 = 0.9999999999999999) neither fails a
// success test (reward >= 1.0) nor leaves [0, 1].
func roundReward(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	return math.Round(x*1e12) / 1e12
}

// Hint calls hint(state).
func (e *episode) Hint(ctx context.Context) (string, error) {
	if e.p.fns["hint"] == nil {
		return "", nil
	}
	v, err := e.p.call(ctx, e.g, "hint", e.seed, e.state)
	if err != nil {
		return "", err
	}
	s, ok := v.(starlark.String)
	if !ok {
		return "", e.shapeError("hint", fmt.Errorf("returned a %s, want a string", v.Type()))
	}
	if n := e.text + len(s); n > MaxTranscriptText { // a hint joins the system prompt
		return "", e.outputError("hint", n)
	}
	return string(s), nil
}

// Reference calls reference(state). Each entry of
// the list it returns is one turn: a call dict ({"name", "arguments"} or
// {"type": "final", "content"}) or a list of tool-call dicts.
func (e *episode) Reference(ctx context.Context) ([]Action, error) {
	if e.p.fns["reference"] == nil {
		return nil, nil
	}
	v, err := e.p.call(ctx, e.g, "reference", e.seed, e.state)
	if err != nil {
		return nil, err
	}
	acts, err := actionsOf(v)
	if err != nil {
		return nil, e.shapeError("reference", err)
	}
	return acts, nil
}

func actionsOf(v starlark.Value) ([]Action, error) {
	list, ok := v.(*starlark.List)
	if !ok {
		return nil, fmt.Errorf("returned a %s, want a list of calls", v.Type())
	}
	acts := make([]Action, 0, list.Len())
	for i := 0; i < list.Len(); i++ {
		entry := list.Index(i)
		var calls []starlark.Value
		if l, ok := entry.(*starlark.List); ok {
			for j := 0; j < l.Len(); j++ {
				calls = append(calls, l.Index(j))
			}
			if len(calls) == 0 {
				return nil, fmt.Errorf("entry %d is an empty list", i)
			}
		} else {
			calls = []starlark.Value{entry}
		}
		var a Action
		for j, c := range calls {
			fields, err := dictFields(c, nil, []string{"type", "id", "name", "arguments", "content"})
			if err != nil {
				return nil, fmt.Errorf("entry %d: %v", i, err)
			}
			typ, _ := fields["type"].(starlark.String)
			if typ == "" {
				typ = "tool"
				if _, ok := fields["name"]; !ok {
					typ = "final"
				}
			}
			switch typ {
			case "final":
				content, ok := fields["content"].(starlark.String)
				if !ok || len(calls) > 1 {
					return nil, fmt.Errorf("entry %d: a final answer is a dict {\"type\": \"final\", \"content\": str} on its own", i)
				}
				a.Content = string(content)
			case "tool":
				name, ok := fields["name"].(starlark.String)
				if !ok || name == "" {
					return nil, fmt.Errorf("entry %d: a tool call needs a string name", i)
				}
				args := fields["arguments"]
				if args == nil {
					args = starlark.NewDict(0)
				}
				if _, ok := args.(*starlark.Dict); !ok {
					return nil, fmt.Errorf("entry %d: arguments of %s is a %s, want a dict", i, name, args.Type())
				}
				b, err := toJSON(args)
				if err != nil {
					return nil, fmt.Errorf("entry %d: arguments of %s: %v", i, name, err)
				}
				id, _ := fields["id"].(starlark.String)
				if id == "" {
					id = starlark.String(fmt.Sprintf("ref_%d_%d", i, j))
				}
				a.ToolCalls = append(a.ToolCalls, ToolCall{ID: string(id), Name: string(name), Arguments: b})
			default:
				return nil, fmt.Errorf("entry %d: type %q, want \"tool\" or \"final\"", i, typ)
			}
		}
		acts = append(acts, a)
	}
	return acts, nil
}
