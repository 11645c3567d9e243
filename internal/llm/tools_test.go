package llm_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/schemas"
)

var cancelTool = schemas.Tool{Type: "function", Function: schemas.FunctionDef{Name: "cancel_reservation", Description: "Cancel.",
	Parameters: json.RawMessage(`{"type":"object","properties":{"reservation_id":{"type":"string"}},"required":["reservation_id"]}`)}}

func toolsConversation() llm.ToolsRequest {
	return llm.ToolsRequest{
		Purpose: "calibrate", RolloutID: "env-1/7/3",
		Tools: []schemas.Tool{cancelTool},
		Messages: []llm.ToolMessage{
			{Role: "system", Content: "You are an agent."},
			{Role: "user", Content: "Cancel ABC123."},
			{Role: "assistant", ToolCalls: []llm.ToolCall{{ID: "call_1", Name: "cancel_reservation", Arguments: json.RawMessage(`{"reservation_id":"ABC123"}`)}}},
			{Role: "tool", ToolCallID: "call_1", Name: "cancel_reservation", Content: `{"status":"cancelled"}`},
		},
		Temperature: llm.Float(0.7),
	}
}

func TestChatToolsSendsConversationAndParsesCalls(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.ToolCalls("", llmtest.Call{ID: "call_9", Name: "cancel_reservation", Arguments: map[string]string{"reservation_id": "XYZ789"}}))
	c, rec := newClient(t, srv, nil)
	resp, err := c.ChatTools(context.Background(), toolsConversation())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Content != "" || len(resp.ToolCalls) != 1 || resp.FinishReason != "tool_calls" || resp.Attempts != 1 {
		t.Fatalf("response %+v", resp)
	}
	tc := resp.ToolCalls[0]
	if tc.ID != "call_9" || tc.Name != "cancel_reservation" || string(tc.Arguments) != `{"reservation_id":"XYZ789"}` {
		t.Errorf("tool call %+v (arguments %s)", tc, tc.Arguments)
	}

	req, err := srv.Requests()[0].ToolsChat()
	if err != nil {
		t.Fatal(err)
	}
	if req.Model != "test-model" || req.Temperature == nil || *req.Temperature != 0.7 || len(req.Tools) != 1 || req.ToolChoice != nil {
		t.Errorf("request %+v", req)
	}
	var sent schemas.Tool
	if json.Unmarshal(req.Tools[0], &sent) != nil || sent.Function.Name != "cancel_reservation" {
		t.Errorf("tools sent %s", req.Tools[0])
	}
	if len(req.Messages) != 4 {
		t.Fatalf("%d messages sent", len(req.Messages))
	}
	a := req.Messages[2]
	if a.Role != "assistant" || len(a.ToolCalls) != 1 || a.ToolCalls[0].Type != "function" || a.ToolCalls[0].ID != "call_1" {
		t.Errorf("assistant message %+v", a)
	}
	// OpenAI's wire form: the arguments as a string holding the JSON text.
	var s string
	if json.Unmarshal(a.ToolCalls[0].Function.Arguments, &s) != nil || s != `{"reservation_id":"ABC123"}` {
		t.Errorf("arguments on the wire %s", a.ToolCalls[0].Function.Arguments)
	}
	if m := req.Messages[3]; m.Role != "tool" || m.ToolCallID != "call_1" || m.Content == nil || *m.Content != `{"status":"cancelled"}` {
		t.Errorf("tool message %+v", m)
	}
	calls := rec.Drain()
	if len(calls) != 1 || calls[0].Purpose != "calibrate" || calls[0].RolloutID != "env-1/7/3" || calls[0].Outcome != llm.OutcomeOK || calls[0].PromptHash == "" {
		t.Errorf("audit rows %+v", calls)
	}
}

func TestChatToolsFinalAnswerAndQuirks(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(
		llmtest.Text("All done."),
		// Arguments as an object (some servers), and as a string holding
		// broken JSON (a weak model): both are answers, not failures.
		llmtest.ToolCalls("thinking", llmtest.Call{Name: "cancel_reservation", RawArguments: `{"reservation_id":"Q1"}`},
			llmtest.Call{ID: "b", Name: "cancel_reservation", RawArguments: `"{\"reservation_id\": \"Q2"`}),
	)
	c, _ := newClient(t, srv, nil)
	resp, err := c.ChatTools(context.Background(), toolsConversation())
	if err != nil || resp.Content != "All done." || len(resp.ToolCalls) != 0 {
		t.Fatalf("final answer: %+v, %v", resp, err)
	}
	resp, err = c.ChatTools(context.Background(), toolsConversation())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Content != "thinking" || len(resp.ToolCalls) != 2 {
		t.Fatalf("%+v", resp)
	}
	if resp.ToolCalls[0].ID != "call_0" || string(resp.ToolCalls[0].Arguments) != `{"reservation_id":"Q1"}` {
		t.Errorf("object arguments: %+v", resp.ToolCalls[0])
	}
	if got := string(resp.ToolCalls[1].Arguments); got != `"{\"reservation_id\": \"Q2"` {
		t.Errorf("broken arguments passed on as %s", got)
	}
}

func TestChatToolsRetries(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(
		llmtest.ServerError(),
		llmtest.ToolCalls("", llmtest.Call{Name: "", Arguments: map[string]string{}}), // no function name: malformed
		llmtest.ToolCalls("", llmtest.Call{ID: "c", Name: "cancel_reservation", Arguments: map[string]string{"reservation_id": "R"}}),
	)
	c, rec := newClient(t, srv, nil)
	resp, err := c.ChatTools(context.Background(), toolsConversation())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Attempts != 3 || len(resp.ToolCalls) != 1 {
		t.Errorf("response %+v", resp)
	}
	if got := outcomes(rec.Drain()); !equal(got, []string{llm.OutcomeHTTP5xx, llm.OutcomeInvalidJSON, llm.OutcomeOK}) {
		t.Errorf("audit outcomes %v", got)
	}
	// Every attempt sent the same body.
	reqs := srv.Requests()
	if string(reqs[0].Body) != string(reqs[2].Body) {
		t.Error("a retry sent another body")
	}
}

func TestChatToolsGivesUp(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.Status(http.StatusBadRequest, "tools are not supported by this model"))
	c, rec := newClient(t, srv, nil)
	_, err := c.ChatTools(context.Background(), toolsConversation())
	var le *llm.Error
	if !errors.As(err, &le) || le.Retryable || le.Attempts != 1 || !strings.Contains(err.Error(), "tools are not supported") {
		t.Fatalf("error %v", err)
	}
	rec.Drain()

	srv.Enqueue(llmtest.ServerError(), llmtest.ServerError())
	c, rec = newClient(t, srv, func(c *llm.Config) { c.MaxAttempts = 2 })
	_, err = c.ChatTools(context.Background(), toolsConversation())
	if !errors.As(err, &le) || le.Attempts != 2 || !le.Retryable {
		t.Fatalf("error %v", err)
	}
	if got := outcomes(rec.Drain()); !equal(got, []string{llm.OutcomeHTTP5xx, llm.OutcomeHTTP5xx}) {
		t.Errorf("audit outcomes %v", got)
	}
	if _, err := c.ChatTools(context.Background(), llm.ToolsRequest{Purpose: "x"}); err == nil {
		t.Error("a request without messages was sent")
	}
}
