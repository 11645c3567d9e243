// Package envprog runs environment programs: verifiable training environments
// written in Starlark (go.starlark.net) against the contract of
// docs/environments.md. It is the runtime under TRACE step 2 (the
// synthesizer validates and calibrates programs with it), the environment
// server (trainers play programs through it) and `trace env`.
//
// An environment program defines, at top level:
//
//	tools()                    -> list of OpenAI function schemas
//	reset(seed)                -> {"system": str, "user": str, "state": any}
//	step(state, call)          -> {"result": str | any, "state": any, "done": bool}
//	reward(state, transcript)  -> {"reward": float in [0,1], "components": {str: float}}
//	hint(state)                -> str               (optional)
//	reference(state)           -> list of calls     (optional; must score 1.0)
//
// and a module docstring of 3–5 sentences explaining why practising it
// transfers to the target environment. A call passed to step is
// {"type": "tool", "id": str, "name": str, "arguments": dict} or
// {"type": "final", "content": str} (an assistant message without tool
// calls: the final answer). A reference entry has the same shape.
// The predeclared names are json, math and rand(seed) (a deterministic
// PRNG with randint(lo, hi) inclusive, random(), choice(seq), sample(seq,
// k), shuffle(list) returning a new list); there is no I/O, no time and no
// other randomness, so a program is a pure function of its seed and the calls.
//
// This file is the API shared by the runtime and its consumers; the
// implementation is in the other files of the package.
package envprog

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/traceops/trace/schemas"
)

// Limits bound one program. Zero fields take the defaults of DefaultLimits.
// The koanf keys are those of trace's programs: configuration section.
type Limits struct {
	// MaxSteps bounds the Starlark execution steps of one contract call
	// (Thread.SetMaxExecutionSteps).
	MaxSteps uint64 `koanf:"max_steps"`
	// MaxMemory bounds the memory of a sandboxed program's worker process
	// (its address space); in-process programs are trusted and not bounded.
	MaxMemory int64 `koanf:"max_memory"`
	// CallTimeout bounds the wall-clock time of one contract call.
	CallTimeout time.Duration `koanf:"call_timeout"`
	// MaxTurns bounds the assistant turns of one episode (the release uses 24);
	// the episode is done, unrewarded for what it did not do, after it.
	MaxTurns int `koanf:"max_turns"`
	// ResetCache bounds the bytes (estimated) of the per-seed reset cache:
	// a seed reset a second time keeps a frozen copy of what reset
	// returned, and later resets of it copy that instead of running reset
	// again (see resetcache.go). Negative: no cache.
	ResetCache int64 `koanf:"reset_cache"`
}

// ToolCall is one function call of an assistant message, OpenAI style.
// Arguments is the arguments object's JSON text.
type ToolCall struct {
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// Message is one chat message in OpenAI format (system, user, assistant with
// optional tool calls, or a tool result carrying ToolCallID).
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	Name       string     `json:"name,omitempty"`
}

// Start is what an episode shows the policy before its first turn.
type Start struct {
	System string `json:"system"`
	User   string `json:"user"`
}

// Action is one assistant turn: its tool calls are executed in order; a turn
// without tool calls is the final answer and ends the episode.
type Action struct {
	Content   string     `json:"content,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// StepResult is what one Action produced.
type StepResult struct {
	// ToolResults holds one role "tool" message per tool call, in order.
	ToolResults []Message `json:"tool_results,omitempty"`
	// Done is true once the program said so, the action was a final
	// answer, or MaxTurns was reached.
	Done bool `json:"done"`
}

// Reward is an episode's reward in [0, 1] with its named components
// (e.g. action and communication scores).
type Reward struct {
	Value      float64            `json:"reward"`
	Components map[string]float64 `json:"components,omitempty"`
}

// Info describes a loaded program.
type Info struct {
	Name         string         `json:"name"`
	Doc          string         `json:"doc"`   // the module docstring (rationale)
	Hash         string         `json:"hash"`  // sha256 of the program text, hex
	Tools        []schemas.Tool `json:"tools"` // from tools()
	HasHint      bool           `json:"has_hint"`
	HasReference bool           `json:"has_reference"`
}

// Env is a loaded environment program. Its methods are safe for concurrent
// use; each Episode is used by one goroutine at a time.
type Env interface {
	Info() Info
	// Reset starts an episode for seed. The same seed always yields the
	// same instance.
	Reset(ctx context.Context, seed int64) (Episode, error)
	// Close releases the program (and its worker process, if sandboxed).
	Close() error
}

// Episode is one play of an environment from one seed.
type Episode interface {
	Seed() int64
	Start() Start
	// Step executes one assistant turn. After Done, Step returns ErrDone.
	Step(ctx context.Context, a Action) (StepResult, error)
	// Messages is the transcript so far: system, user, then each assistant
	// turn and its tool results (the system prompt without any hint block).
	Messages() []Message
	// Reward scores the episode as it stands (normally once Done).
	Reward(ctx context.Context) (Reward, error)
	// Hint is the program's expert guidance for this instance, "" without hint().
	Hint(ctx context.Context) (string, error)
	// Reference is the program's scripted solution, nil without reference().
	Reference(ctx context.Context) ([]Action, error)
	Close() error
}

// The episodes of Load and LoadSandboxed also have
//
//	FromCache() bool
//
// true when Reset was answered from the reset cache (Limits.ResetCache)
// instead of running reset: the environment server counts it.

// ErrDone is returned by Step after the episode ended.
var ErrDone = errors.New("envprog: episode is done")

// ProgramError is an error of the program itself (syntax, a contract
// function's shape, a runtime error, a limit hit), as opposed to an error of
// the caller or the runtime. Validation and calibration record it as the
// program's failure.
type ProgramError struct {
	Func  string // contract function, e.g. "step"; "" while loading
	Seed  int64
	Limit string // "steps", "memory", "timeout", "output" (an episode's transcript text above MaxTranscriptText; sandboxed: an answer above 64 MiB) when a limit stopped it, else ""
	Msg   string
}

func (e *ProgramError) Error() string {
	s := "environment program"
	if e.Func != "" {
		s += ": " + e.Func + "()"
	}
	if e.Limit != "" {
		s += ": " + e.Limit + " limit"
	}
	return s + ": " + e.Msg
}

// Hint blocks are appended to the system prompt on a share of rollouts and
// removed before training (TRACE-METHOD.md step 2).
const (
	HintOpen  = "<expert_guidance>"
	HintClose = "</expert_guidance>"
)
