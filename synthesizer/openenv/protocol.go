// Package openenv is the wire protocol of OpenEnv (openenv-core 0.3.0's
// reference server, openenv/core/env_server/http_server.py and types.py) as
// trace's environment server and client speak it: WebSocket frames, the HTTP
// request and response bodies, error codes, JSON-RPC 2.0 for MCP, and the
// observation and action of a chat environment (OpenAI messages and tool
// calls). It has no I/O: the server (synthesizer/envserver) and the client
// (synthesizer/envclient) share it, and its decoders are fuzzed.
package openenv

import (
	"encoding/json"
)

// WebSocket frame types, client to server (FrameReset … FrameMCP) and server
// to client (FrameObservation, FrameState, FrameError, FrameMCP).
const (
	FrameReset       = "reset"
	FrameStep        = "step"
	FrameState       = "state"
	FrameClose       = "close"
	FrameMCP         = "mcp"
	FrameObservation = "observation"
	FrameError       = "error"
)

// Error codes of error frames (openenv's WSErrorCode), used for HTTP errors
// too (as the body's "code").
const (
	CodeInvalidJSON     = "INVALID_JSON"
	CodeUnknownType     = "UNKNOWN_TYPE"
	CodeValidation      = "VALIDATION_ERROR"
	CodeExecution       = "EXECUTION_ERROR"
	CodeCapacityReached = "CAPACITY_REACHED"
	CodeFactory         = "FACTORY_ERROR"
	CodeSession         = "SESSION_ERROR"
)

// Codes lists every error code (for metrics and tests).
var Codes = []string{CodeInvalidJSON, CodeUnknownType, CodeValidation, CodeExecution, CodeCapacityReached, CodeFactory, CodeSession}

// Frame is one WebSocket message: {"type": ..., "data": {...}}.
type Frame struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data,omitempty"`
}

// ErrorData is the data of an error frame: message and code, plus the
// validation errors (VALIDATION_ERROR) or the capacity (CAPACITY_REACHED).
type ErrorData struct {
	Message        string       `json:"message"`
	Code           string       `json:"code"`
	Errors         []FieldError `json:"errors,omitempty"`
	ActiveSessions *int         `json:"active_sessions,omitempty"`
	MaxSessions    *int         `json:"max_sessions,omitempty"`
}

// FieldError is one validation error, shaped like pydantic's
// ValidationError.errors() items that openenv sends: {type, loc, msg}.
type FieldError struct {
	Type string `json:"type"`
	Loc  []any  `json:"loc"`
	Msg  string `json:"msg"`
}

// Error is a protocol error: it becomes an error frame on /ws, a JSON-RPC
// error on /mcp and an HTTP status with {"detail", "code"} on HTTP.
type Error struct {
	Code    string
	Message string
	Fields  []FieldError
	// Active and Max are set for CAPACITY_REACHED.
	Active, Max int
	// Fatal errors end the WebSocket session after the error frame
	// (capacity, eviction); the others leave it usable.
	Fatal bool
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Data is the error frame's data.
func (e *Error) Data() ErrorData {
	d := ErrorData{Message: e.Message, Code: e.Code, Errors: e.Fields}
	if e.Code == CodeCapacityReached {
		a, m := e.Active, e.Max
		d.ActiveSessions, d.MaxSessions = &a, &m
	}
	return d
}

// Validation returns a VALIDATION_ERROR with one field error.
func Validation(loc []any, typ, format string, args ...any) *Error {
	msg := sprintf(format, args...)
	return &Error{Code: CodeValidation, Message: "Invalid message: " + msg, Fields: []FieldError{{Type: typ, Loc: loc, Msg: msg}}}
}

// Execution returns an EXECUTION_ERROR.
func Execution(format string, args ...any) *Error {
	return &Error{Code: CodeExecution, Message: sprintf(format, args...)}
}

// ResetRequest is the data of a reset frame and the body of POST /reset
// (openenv's ResetRequest: extra fields allowed). Hint asks for the
// program's expert guidance in the system prompt (trace's extension; the
// default is none). SessionID selects a stateful HTTP session (trace's
// extension; see the server's documentation).
type ResetRequest struct {
	Seed      *int64  `json:"seed,omitempty"`
	EpisodeID *string `json:"episode_id,omitempty"`
	Hint      bool    `json:"hint,omitempty"`
	SessionID string  `json:"session_id,omitempty"`
}

// StepRequest is the body of POST /step (openenv's StepRequest). Seed is the
// seed of the fresh episode a stateless step plays (trace's extension,
// random when absent); SessionID selects a stateful HTTP session.
type StepRequest struct {
	Action    json.RawMessage `json:"action"`
	TimeoutS  *float64        `json:"timeout_s,omitempty"`
	RequestID *string         `json:"request_id,omitempty"`
	Seed      *int64          `json:"seed,omitempty"`
	SessionID string          `json:"session_id,omitempty"`
}

// StepResponse is the data of an observation frame and the body of the
// HTTP reset and step responses: {"observation", "reward", "done"}.
type StepResponse struct {
	Observation Observation `json:"observation"`
	Reward      *float64    `json:"reward"`
	Done        bool        `json:"done"`
}

// Observation is what a chat trainer needs after each reset and step.
type Observation struct {
	EpisodeID string `json:"episode_id"`
	Seed      int64  `json:"seed"`
	// StepCount counts the assistant turns played.
	StepCount int `json:"step_count"`
	// Messages is the transcript so far in OpenAI format: system, user,
	// then each assistant turn and its tool results.
	Messages []ChatMessage `json:"messages"`
	// Tools are the environment's tools as OpenAI function schemas.
	Tools []Tool `json:"tools"`
	// ToolResults are the role "tool" messages the last action produced.
	ToolResults []ChatMessage `json:"tool_results"`
	// LastToolResult is the content of the last of them, null if none.
	LastToolResult *string `json:"last_tool_result"`
	// RewardComponents are the reward's named components, once done.
	RewardComponents map[string]float64 `json:"reward_components,omitempty"`
	// DoneReason says why the episode ended: "final" (an answer without
	// tool calls), "environment" (the program ended it), "max_turns",
	// "timeout" (a step timed out) or "error" (the program failed, or the
	// observation was over the server's size limit).
	DoneReason string `json:"done_reason,omitempty"`
	// Error is the program's error when DoneReason is "error" or "timeout".
	Error string `json:"error,omitempty"`
}

// State is the body of GET /state and the data of a state frame (openenv's
// State: episode_id and step_count, extra fields allowed).
type State struct {
	EpisodeID   *string            `json:"episode_id"`
	StepCount   int                `json:"step_count"`
	Environment string             `json:"environment,omitempty"`
	SessionID   string             `json:"session_id,omitempty"`
	Seed        *int64             `json:"seed,omitempty"`
	Done        bool               `json:"done"`
	Reward      *float64           `json:"reward,omitempty"`
	Components  map[string]float64 `json:"reward_components,omitempty"`
}

// Metadata is the body of GET /metadata (openenv's EnvironmentMetadata;
// extra fields forbidden).
type Metadata struct {
	Name             string  `json:"name"`
	Description      string  `json:"description"`
	ReadmeContent    *string `json:"readme_content"`
	Version          *string `json:"version"`
	Author           *string `json:"author"`
	DocumentationURL *string `json:"documentation_url"`
}

// Health is the body of GET /health.
type Health struct {
	Status string `json:"status"`
}

// SchemaResponse is the body of GET /schema: JSON Schemas of the action, the
// observation and the state.
type SchemaResponse struct {
	Action      json.RawMessage `json:"action"`
	Observation json.RawMessage `json:"observation"`
	State       json.RawMessage `json:"state"`
}

// HTTPError is the body of an HTTP error. FastAPI sends {"detail": ...}
// (a string, or a list of validation errors for 422); trace adds the code.
type HTTPError struct {
	Detail any    `json:"detail"`
	Code   string `json:"code,omitempty"`
}
