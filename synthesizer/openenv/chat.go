package openenv

import (
	"github.com/traceops/trace/schemas"
)

// Tool is an OpenAI function tool schema: {"type": "function", "function":
// {"name", "description", "parameters"}}.
type Tool = schemas.Tool

// ChatMessage is one chat message in OpenAI format. An assistant message's
// tool calls carry their arguments as a JSON string, as OpenAI sends them;
// a tool result carries the id of the call it answers.
type ChatMessage struct {
	Role       string         `json:"role"`
	Content    string         `json:"content"`
	ToolCalls  []ChatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
	Name       string         `json:"name,omitempty"`
}

// ChatToolCall is one tool call of an assistant message.
type ChatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function ChatFunction `json:"function"`
}

// ChatFunction is the function part of a tool call; Arguments is the
// arguments object as JSON text.
type ChatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Action kinds: the policy's assistant message, and openenv's MCP actions
// (MCPToolClient sends them as step data: {"type": "list_tools"} and
// {"type": "call_tool", "tool_name", "arguments"}).
const (
	ActionMessage   = "message"
	ActionListTools = "list_tools"
	ActionCallTool  = "call_tool"
)

// Action is a decoded step action.
type Action struct {
	Kind string
	// Content is the assistant message's text (the final answer when it
	// has no tool calls).
	Content string
	// ToolCalls are the calls to execute in order; a call_tool action has
	// exactly one.
	ToolCalls []Call
}

// Call is one tool call with its arguments as a compact JSON object text.
// ID is "" when the policy gave none (the server assigns one).
type Call struct {
	ID        string
	Name      string
	Arguments []byte
}
