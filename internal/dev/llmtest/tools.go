package llmtest

import (
	"encoding/json"
	"fmt"
	"time"
)

// Tool calling: scripted answers with tool_calls, and the decoded form of a
// request that carries tools and a conversation with tool calls.

// Call is one scripted tool call. Arguments is encoded as JSON and sent,
// as OpenAI does, as a string holding that text; RawArguments, when set,
// is sent verbatim as the "arguments" value instead (a JSON string with
// broken JSON inside, an object, …) to script a server's quirks.
type Call struct {
	ID           string
	Name         string
	Arguments    any
	RawArguments string
}

// ToolCalls is a 200 whose assistant message has content (null when
// empty) and the given tool calls, with finish_reason "tool_calls".
func ToolCalls(content string, calls ...Call) Reply {
	wc := make([]map[string]any, len(calls))
	for i, c := range calls {
		var args json.RawMessage
		if c.RawArguments != "" {
			args = json.RawMessage(c.RawArguments)
		} else {
			b, err := json.Marshal(c.Arguments)
			if err != nil {
				panic(fmt.Sprintf("llmtest: arguments of %s: %v", c.Name, err))
			}
			s, _ := json.Marshal(string(b))
			args = s
		}
		call := map[string]any{"type": "function", "function": map[string]any{"name": c.Name, "arguments": args}}
		if c.ID != "" {
			call["id"] = c.ID
		}
		wc[i] = call
	}
	var msgContent any
	if content != "" {
		msgContent = content
	}
	return Reply{Body: mustJSON(map[string]any{
		"id": "chatcmpl-llmtest", "object": "chat.completion", "created": time.Now().Unix(), "model": DefaultModel,
		"choices": []any{map[string]any{
			"index":         0,
			"message":       map[string]any{"role": "assistant", "content": msgContent, "tool_calls": wc},
			"finish_reason": "tool_calls",
		}},
		"usage": map[string]any{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
	})}
}

// WireToolCall is a tool call as a request carries it.
type WireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
		// Arguments is the wire value: normally a JSON string.
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// ArgumentsText is the arguments' JSON text (the string's contents).
func (c WireToolCall) ArgumentsText() string {
	var s string
	if json.Unmarshal(c.Function.Arguments, &s) == nil {
		return s
	}
	return string(c.Function.Arguments)
}

// ToolsMessage is one message of a request with tools.
type ToolsMessage struct {
	Role       string         `json:"role"`
	Content    *string        `json:"content"`
	ToolCalls  []WireToolCall `json:"tool_calls"`
	ToolCallID string         `json:"tool_call_id"`
	Name       string         `json:"name"`
}

// ToolsChatRequest is the decoded body of a chat request with tools.
type ToolsChatRequest struct {
	Model       string            `json:"model"`
	Messages    []ToolsMessage    `json:"messages"`
	Tools       []json.RawMessage `json:"tools"`
	ToolChoice  json.RawMessage   `json:"tool_choice"`
	Temperature *float64          `json:"temperature"`
	MaxTokens   int               `json:"max_tokens"`
}

// ToolsChat decodes the request's body with its tools and tool calls.
func (r Request) ToolsChat() (ToolsChatRequest, error) {
	var c ToolsChatRequest
	err := json.Unmarshal(r.Body, &c)
	return c, err
}
