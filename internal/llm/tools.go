package llm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/traceops/trace/schemas"
)

// Chat with tools: a multi-turn conversation in which the model may answer
// with tool calls (OpenAI "tools" / "tool_calls"), as a policy playing an
// environment does. It shares the client's retries, concurrency bound,
// rate limit and audit rows with Chat; only the message shapes differ.

// ToolCall is one function call of an assistant message. Arguments is the
// arguments' JSON text (OpenAI sends it as a string holding that text).
type ToolCall struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// ToolMessage is one message of a conversation with tools: system, user,
// assistant (with optional tool calls) or tool (a result answering
// ToolCallID).
type ToolMessage struct {
	Role       string
	Content    string
	ToolCalls  []ToolCall
	ToolCallID string
	Name       string
}

// ToolsRequest is one chat completion with tools.
type ToolsRequest struct {
	// Purpose, RolloutID and Run only label the audit rows.
	Purpose   string
	RolloutID string
	Run       int

	Messages []ToolMessage
	// Tools are the OpenAI function schemas the model may call.
	Tools []schemas.Tool
	// ToolChoice is sent as tool_choice when set ("auto", "none",
	// "required"); empty leaves it to the server (auto).
	ToolChoice string
	// Temperature overrides Config.Temperature; MaxTokens overrides
	// Config.MaxTokens when > 0.
	Temperature *float64
	MaxTokens   int
}

// ToolsResponse is the accepted answer of a ChatTools call: text, tool
// calls, or both. A turn without tool calls is the model's final answer.
type ToolsResponse struct {
	Content   string
	ToolCalls []ToolCall
	// Model is the model name the server reports; FinishReason its
	// finish_reason ("stop", "tool_calls", "length", …).
	Model        string
	FinishReason string
	// Token usage of the accepted attempt and summed over every attempt.
	PromptTokens, CompletionTokens           int
	TotalPromptTokens, TotalCompletionTokens int
	Attempts                                 int
	Latency                                  time.Duration
}

// ChatTools obtains one assistant turn for a conversation with tools, with
// the retries of Chat (429, 5xx, 408, 409, time-outs, connection errors
// and malformed answers are retried, other 4xx are not), one audit row per
// attempt and the client's concurrency bound and rate limit. An answer is
// malformed when it has no choices, or a tool call without a function name
// or whose arguments are neither a JSON string nor a JSON object. Arguments
// that are a string holding invalid JSON are passed on as that text: what
// the model called is the caller's to judge.
func (c *Client) ChatTools(ctx context.Context, req ToolsRequest) (ToolsResponse, error) {
	if len(req.Messages) == 0 {
		return ToolsResponse{}, fmt.Errorf("llm %s: request has no messages", req.Purpose)
	}
	body, err := c.newBody(func() ([]byte, error) { return c.toolsBody(req) })
	if err != nil {
		return ToolsResponse{}, fmt.Errorf("llm %s: %w", req.Purpose, err)
	}
	sum := sha256.Sum256(body.b) // the model name, messages and tools
	hash := hex.EncodeToString(sum[:])
	audit := Request{Purpose: req.Purpose, RolloutID: req.RolloutID, Run: req.Run}

	r, tally, err := retry(ctx, c, audit, func(attempt int) (attemptResult, ToolsResponse) {
		return c.toolsAttempt(ctx, audit, body.current(), hash, attempt)
	})
	r.Attempts, r.TotalPromptTokens, r.TotalCompletionTokens = tally.attempts, tally.promptTokens, tally.completionTokens
	return r, err
}

type wireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

type wireToolMessage struct {
	Role       string         `json:"role"`
	Content    string         `json:"content"`
	ToolCalls  []wireToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

func (c *Client) toolsBody(req ToolsRequest) ([]byte, error) {
	msgs := make([]wireToolMessage, len(req.Messages))
	for i, m := range req.Messages {
		// A tool message carries tool_call_id only: OpenAI's schema has no
		// name on it (ToolMessage.Name is for the caller's bookkeeping).
		w := wireToolMessage{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			var wc wireToolCall
			wc.ID, wc.Type, wc.Function.Name = tc.ID, "function", tc.Name
			// OpenAI's wire form: the arguments object's text as a string.
			args := strings.TrimSpace(string(tc.Arguments))
			if args == "" {
				args = "{}"
			}
			s, err := json.Marshal(args)
			if err != nil {
				return nil, err
			}
			wc.Function.Arguments = s
			w.ToolCalls = append(w.ToolCalls, wc)
		}
		msgs[i] = w
	}
	body := map[string]any{"model": c.cfg.Model, "messages": msgs}
	if len(req.Tools) > 0 {
		body["tools"] = req.Tools
	}
	if req.ToolChoice != "" {
		body["tool_choice"] = req.ToolChoice
	}
	temp := c.cfg.Temperature
	if req.Temperature != nil {
		temp = req.Temperature
	}
	if temp != nil {
		body["temperature"] = *temp
	}
	field := "max_tokens"
	if c.completionTokens.Load() {
		field = "max_completion_tokens"
	}
	if req.MaxTokens > 0 {
		body[field] = req.MaxTokens
	} else if c.cfg.MaxTokens > 0 {
		body[field] = c.cfg.MaxTokens
	}
	return json.Marshal(body)
}

type wireToolsResponse struct {
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content   *string        `json:"content"`
			ToolCalls []wireToolCall `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// toolsAttempt makes one HTTP attempt of ChatTools and records it.
func (c *Client) toolsAttempt(ctx context.Context, audit Request, body []byte, hash string, attempt int) (res attemptResult, resp ToolsResponse) {
	release, failed := c.acquire(ctx)
	if failed != nil {
		return *failed, resp
	}
	defer release()
	start := time.Now()
	defer func() { c.record(ctx, audit, hash, attempt, start, res) }()

	actx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(actx, http.MethodPost, c.chatURL, bytes.NewReader(body))
	if err != nil {
		return attemptResult{outcome: OutcomeNetwork, err: c.redactErr(err)}, resp
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	if c.cfg.APIKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.cfg.APIKey.Reveal())
	}
	hresp, err := c.http.Do(hreq)
	if err != nil {
		return c.transportFailure(ctx, actx, err, c.cfg.Timeout), resp
	}
	data, err := io.ReadAll(io.LimitReader(hresp.Body, maxResponseBytes+1))
	hresp.Body.Close()
	if err != nil {
		r := c.transportFailure(ctx, actx, err, c.cfg.Timeout)
		r.status = hresp.StatusCode
		return r, resp
	}
	latency := time.Since(start)
	if s := hresp.StatusCode; s < 200 || s > 299 {
		return c.statusFailure(s, hresp.Header, data, body), resp
	}
	res.status = hresp.StatusCode
	malformed := func(format string, args ...any) (attemptResult, ToolsResponse) {
		res.outcome, res.retryable = OutcomeInvalidJSON, true
		res.err = fmt.Errorf("%w: %s", ErrInvalidJSON, fmt.Sprintf(format, args...))
		return res, ToolsResponse{}
	}
	if len(data) > maxResponseBytes {
		return malformed("response body exceeds %d bytes", maxResponseBytes)
	}
	var wr wireToolsResponse
	if err := json.Unmarshal(data, &wr); err != nil {
		return malformed("response envelope: %v (body %q)", err, cut(string(data), 120))
	}
	if wr.Usage != nil {
		res.promptTokens, res.completionTokens = wr.Usage.PromptTokens, wr.Usage.CompletionTokens
	}
	if len(wr.Choices) == 0 {
		return malformed("response has no choices%s", c.bodyError(data))
	}
	ch := wr.Choices[0]
	resp = ToolsResponse{Model: wr.Model, FinishReason: ch.FinishReason,
		PromptTokens: res.promptTokens, CompletionTokens: res.completionTokens, Latency: latency}
	if ch.Message.Content != nil {
		resp.Content = *ch.Message.Content
	}
	for i, wc := range ch.Message.ToolCalls {
		if strings.TrimSpace(wc.Function.Name) == "" {
			return malformed("tool call %d has no function name", i)
		}
		args, err := callArguments(wc.Function.Arguments)
		if err != nil {
			return malformed("tool call %d (%s): %v", i, wc.Function.Name, err)
		}
		id := wc.ID
		if id == "" {
			id = fmt.Sprintf("call_%d", i) // some servers omit ids
		}
		resp.ToolCalls = append(resp.ToolCalls, ToolCall{ID: id, Name: wc.Function.Name, Arguments: args})
	}
	res.outcome = OutcomeOK
	return res, resp
}

// callArguments turns the wire arguments (a string holding JSON text, or,
// from some servers, the object itself) into the arguments' text.
func callArguments(raw json.RawMessage) (json.RawMessage, error) {
	t := bytes.TrimSpace(raw)
	switch {
	case len(t) == 0 || string(t) == "null":
		return json.RawMessage("{}"), nil
	case t[0] == '"':
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return nil, err
		}
		if strings.TrimSpace(s) == "" {
			return json.RawMessage("{}"), nil
		}
		if !json.Valid([]byte(s)) {
			// What the model wrote, as a JSON string: the environment
			// answers it with an error result.
			b, _ := json.Marshal(s)
			return b, nil
		}
		return json.RawMessage(s), nil
	case t[0] == '{':
		return json.RawMessage(t), nil
	}
	return nil, fmt.Errorf("arguments are %s, want a JSON string or object", cut(string(t), 40))
}
