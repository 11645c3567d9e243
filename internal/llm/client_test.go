package llm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/llm"
)

const testKey = "sk-test-S3CRET-0123456789"

var objSchema = json.RawMessage(`{"type":"object","additionalProperties":false,"required":["answer"],"properties":{"answer":{"type":"string","enum":["yes","no"]}}}`)

// newClient returns a client of srv with fast backoff, the test key and a
// buffer recorder; mutate adjusts the config.
func newClient(t *testing.T, srv *llmtest.Server, mutate func(*llm.Config)) (*llm.Client, *llm.BufferRecorder) {
	t.Helper()
	rec := &llm.BufferRecorder{}
	cfg := llm.Config{
		BaseURL: srv.URL, Model: "test-model", APIKey: testKey,
		BackoffInitial: time.Millisecond, BackoffMax: 5 * time.Millisecond,
		Timeout: 5 * time.Second, Recorder: rec,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := llm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, rec
}

func ask(schema json.RawMessage) llm.Request {
	return llm.Request{Purpose: "test", RolloutID: "r-1", Run: 3, Schema: schema,
		Messages: []llm.Message{{Role: "user", Content: "Answer yes or no as JSON."}}}
}

func outcomes(calls []llm.AuditRecord) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i] = c.Outcome
	}
	return out
}

func equal(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

func TestChatOKTokensHeadersAndFormat(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.Reply{Content: `{"answer":"yes"}`, PromptTokens: 120, CompletionTokens: 7})
	c, rec := newClient(t, srv, nil)
	resp, err := c.Chat(context.Background(), ask(objSchema))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Content != `{"answer":"yes"}` || resp.Attempts != 1 || resp.PromptTokens != 120 || resp.CompletionTokens != 7 ||
		resp.TotalPromptTokens != 120 || resp.TotalCompletionTokens != 7 || resp.Model != llmtest.DefaultModel || resp.FinishReason != "stop" {
		t.Fatalf("response %+v", resp)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[0]
	if got := r.Header.Get("Authorization"); got != "Bearer "+testKey {
		t.Fatalf("Authorization %q", got)
	}
	if r.Chat.Model != "test-model" || r.Chat.Temperature == nil || *r.Chat.Temperature != 1.0 {
		t.Fatalf("model %q temperature %v", r.Chat.Model, r.Chat.Temperature)
	}
	var rf struct {
		Type       string `json:"type"`
		JSONSchema struct {
			Name   string          `json:"name"`
			Strict bool            `json:"strict"`
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(r.Chat.ResponseFormat, &rf); err != nil {
		t.Fatal(err)
	}
	if rf.Type != "json_schema" || rf.JSONSchema.Name != "response" || !rf.JSONSchema.Strict || !bytes.Equal(rf.JSONSchema.Schema, objSchema) {
		t.Fatalf("response_format %s", r.Chat.ResponseFormat)
	}
	calls := rec.Drain()
	if len(calls) != 1 {
		t.Fatalf("%d audit rows", len(calls))
	}
	a := calls[0]
	if a.Outcome != llm.OutcomeOK || a.PromptTokens != 120 || a.CompletionTokens != 7 || a.Attempt != 1 || a.Run != 3 ||
		a.RolloutID != "r-1" || a.Purpose != "test" || a.Model != "test-model" || a.Endpoint != srv.URL ||
		a.PromptHash != llm.PromptHash(ask(nil).Messages) || len(a.PromptHash) != 64 || a.TS.IsZero() {
		t.Fatalf("audit row %+v", a)
	}
	if rest := rec.Drain(); len(rest) != 0 {
		t.Fatalf("Drain did not forget: %d rows", len(rest))
	}
}

func TestRetriesThenSucceeds(t *testing.T) {
	for _, tt := range []struct {
		name    string
		script  []llmtest.Reply
		timeout time.Duration
		want    []string
	}{
		{"429 with retry-after-ms", []llmtest.Reply{llmtest.RateLimitedMS(20)}, 0, []string{"http_429", "ok"}},
		{"500", []llmtest.Reply{llmtest.ServerError()}, 0, []string{"http_5xx", "ok"}},
		{"503 then 429", []llmtest.Reply{llmtest.Status(503, "overloaded"), llmtest.RateLimited("")}, 0, []string{"http_5xx", "http_429", "ok"}},
		{"timeout", []llmtest.Reply{llmtest.Slow(3*time.Second, llmtest.Text(`{"answer":"no"}`))}, 150 * time.Millisecond, []string{"timeout", "ok"}},
		{"malformed JSON", []llmtest.Reply{llmtest.Malformed()}, 0, []string{"invalid_json", "ok"}},
		{"schema violation", []llmtest.Reply{llmtest.Text(`{"answer":"maybe"}`)}, 0, []string{"schema", "ok"}},
		{"extra key", []llmtest.Reply{llmtest.Text(`{"answer":"yes","why":"x"}`)}, 0, []string{"schema", "ok"}},
		{"duplicate key", []llmtest.Reply{llmtest.Text(`{"answer":"no","answer":"yes"}`)}, 0, []string{"schema", "ok"}},
		{"prose around JSON", []llmtest.Reply{llmtest.Text("Sure! {\"answer\":\"yes\"}")}, 0, []string{"invalid_json", "ok"}},
		{"null content", []llmtest.Reply{{NullContent: true}}, 0, []string{"schema", "ok"}},
		{"broken envelope", []llmtest.Reply{{Body: `{"choices": [`}}, 0, []string{"invalid_json", "ok"}},
		{"no choices", []llmtest.Reply{{Body: `{"choices": []}`}}, 0, []string{"invalid_json", "ok"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Enqueue(tt.script...)
			srv.Enqueue(llmtest.Reply{Content: `{"answer":"yes"}`, PromptTokens: 10, CompletionTokens: 3})
			c, rec := newClient(t, srv, func(cfg *llm.Config) {
				if tt.timeout > 0 {
					cfg.Timeout = tt.timeout
				}
			})
			resp, err := c.Chat(context.Background(), ask(objSchema))
			if err != nil {
				t.Fatal(err)
			}
			if resp.Attempts != len(tt.want) || resp.Content != `{"answer":"yes"}` {
				t.Fatalf("attempts %d content %q", resp.Attempts, resp.Content)
			}
			calls := rec.Drain()
			if got := outcomes(calls); !equal(got, tt.want) {
				t.Fatalf("audit outcomes %v, want %v", got, tt.want)
			}
			for i, c := range calls {
				if int(c.Attempt) != i+1 {
					t.Fatalf("row %d has attempt %d", i, c.Attempt)
				}
				if c.Outcome != "ok" && c.Error == "" {
					t.Fatalf("row %d (%s) has no error text", i, c.Outcome)
				}
			}
			if len(srv.Requests()) != len(tt.want) {
				t.Fatalf("%d requests, want %d", len(srv.Requests()), len(tt.want))
			}
			// Every attempt is the same, fresh request.
			for _, r := range srv.Requests() {
				if !bytes.Equal(r.Body, srv.Requests()[0].Body) {
					t.Fatal("retry sent a different body")
				}
			}
		})
	}
}

func TestTokensSummedOverAttempts(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.Reply{Content: `{"answer":"perhaps"}`, PromptTokens: 100, CompletionTokens: 9},
		llmtest.Reply{Content: `{"answer":"no"}`, PromptTokens: 100, CompletionTokens: 5})
	c, rec := newClient(t, srv, nil)
	resp, err := c.Chat(context.Background(), ask(objSchema))
	if err != nil {
		t.Fatal(err)
	}
	if resp.PromptTokens != 100 || resp.CompletionTokens != 5 || resp.TotalPromptTokens != 200 || resp.TotalCompletionTokens != 14 {
		t.Fatalf("%+v", resp)
	}
	calls := rec.Drain()
	if calls[0].CompletionTokens != 9 || calls[1].CompletionTokens != 5 || calls[0].Outcome != "schema" {
		t.Fatalf("%+v", calls)
	}
}

func TestRetryAfterSecondsHonoured(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.RateLimited("1"), llmtest.Text(`{"answer":"yes"}`))
	c, _ := newClient(t, srv, nil) // backoff would be ~1ms
	start := time.Now()
	if _, err := c.Chat(context.Background(), ask(objSchema)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 950*time.Millisecond {
		t.Fatalf("retried after %v, the server asked for 1s", d)
	}
}

func TestMaxRetryAfterCaps(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.RateLimited("3600"), llmtest.Text(`{"answer":"yes"}`))
	c, _ := newClient(t, srv, func(cfg *llm.Config) { cfg.MaxRetryAfter = 50 * time.Millisecond })
	start := time.Now()
	if _, err := c.Chat(context.Background(), ask(objSchema)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("waited %v despite MaxRetryAfter 50ms", d)
	}
}

func TestNoRetryOn4xx(t *testing.T) {
	for _, code := range []int{400, 401, 404, 422} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Enqueue(llmtest.Status(code, "bad things"), llmtest.Text(`{"answer":"yes"}`))
			c, rec := newClient(t, srv, nil)
			_, err := c.Chat(context.Background(), ask(objSchema))
			var le *llm.Error
			if !errors.As(err, &le) {
				t.Fatalf("error %v is not *llm.Error", err)
			}
			if le.Retryable || le.Attempts != 1 || le.Status != code || le.Outcome() != llm.OutcomeHTTP4xx {
				t.Fatalf("%+v", le)
			}
			var se *llm.StatusError
			if !errors.As(err, &se) || se.Status != code || se.Message != "bad things" {
				t.Fatalf("status error %v", se)
			}
			if !strings.Contains(err.Error(), "not retried") || !strings.Contains(err.Error(), "bad things") {
				t.Fatalf("error text %q", err)
			}
			if n := len(srv.Requests()); n != 1 {
				t.Fatalf("%d requests", n)
			}
			if got := outcomes(rec.Drain()); !equal(got, []string{"http_4xx"}) {
				t.Fatalf("audit %v", got)
			}
		})
	}
}

// TestRetriedOn408And409: a proxy's request time-out (408) and a conflict
// (409), which OpenAI's own SDKs retry, are retried like a 5xx (honouring a
// Retry-After), where they used to fail the call at once.
func TestRetriedOn408And409(t *testing.T) {
	for _, code := range []int{408, 409} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Enqueue(llmtest.Status(code, "try again"), llmtest.Text(`{"answer":"yes"}`))
			c, rec := newClient(t, srv, nil)
			resp, err := c.Chat(context.Background(), ask(objSchema))
			if err != nil {
				t.Fatal(err)
			}
			if resp.Attempts != 2 || resp.Content != `{"answer":"yes"}` {
				t.Fatalf("%+v", resp)
			}
			if got := outcomes(rec.Drain()); !equal(got, []string{"http_4xx", "ok"}) {
				t.Fatalf("audit %v", got)
			}
		})
	}
}

// TestMaxCompletionTokensWhenMaxTokensRefused: OpenAI's reasoning models
// (o1, o3, gpt-5, …) answer a request carrying max_tokens with a 400 that
// asks for max_completion_tokens; every labeling run failed on it. The
// client now retries at once with max_completion_tokens and keeps sending
// it; a server that takes max_tokens (vLLM, Ollama, llama.cpp) keeps
// getting max_tokens.
func TestMaxCompletionTokensWhenMaxTokensRefused(t *testing.T) {
	srv := llmtest.New(t)
	reasoning := func(req llmtest.Request) llmtest.Reply {
		if bytes.Contains(req.Body, []byte(`"max_tokens"`)) {
			return llmtest.RefuseMaxTokens()
		}
		return llmtest.Text(`{"answer":"yes"}`)
	}
	srv.Handle(reasoning)
	c, rec := newClient(t, srv, func(cfg *llm.Config) { cfg.MaxTokens = 300 })
	req := ask(objSchema)
	req.MaxTokens = 120
	resp, err := c.Chat(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomes(rec.Drain()); resp.Attempts != 2 || !equal(got, []string{"http_4xx", "ok"}) {
		t.Fatalf("attempts %d, audit %v", resp.Attempts, got)
	}
	if _, err := c.Chat(context.Background(), ask(objSchema)); err != nil { // the config's cap
		t.Fatal(err)
	}
	extra := ask(objSchema) // an extra max_tokens is not sent either
	extra.Extra = map[string]any{"max_tokens": 7}
	if _, err := c.Chat(context.Background(), extra); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ChatTools(context.Background(), llm.ToolsRequest{Purpose: "test", MaxTokens: 50,
		Messages: []llm.ToolMessage{{Role: "user", Content: "hi"}}}); err != nil {
		t.Fatal(err)
	}
	reqs := srv.Requests()
	if len(reqs) != 5 {
		t.Fatalf("%d requests, want 5 (one refused, then one per call)", len(reqs))
	}
	for i, want := range []int{120, 300, 300, 50} {
		r := reqs[i+1]
		if r.Chat.MaxCompletionTokens != want || bytes.Contains(r.Body, []byte(`"max_tokens"`)) {
			t.Errorf("request %d: max_completion_tokens %d (want %d), body %s", i+1, r.Chat.MaxCompletionTokens, want, r.Body)
		}
	}
	if got := outcomes(rec.Drain()); !equal(got, []string{"ok", "ok", "ok"}) {
		t.Fatalf("audit %v", got)
	}

	// Another 400 is still not retried, and a server that takes max_tokens
	// keeps getting it.
	other := llmtest.New(t)
	other.Enqueue(llmtest.Status(400, "max_tokens must be at most 4096"), llmtest.Text(`{"answer":"yes"}`))
	c2, _ := newClient(t, other, func(cfg *llm.Config) { cfg.MaxTokens = 300 })
	if _, err := c2.Chat(context.Background(), ask(objSchema)); err == nil {
		t.Fatal("a 400 about max_tokens' value was retried")
	}
	if _, err := c2.Chat(context.Background(), ask(objSchema)); err != nil {
		t.Fatal(err)
	}
	if r := other.Requests()[1]; r.Chat.MaxTokens != 300 || r.Chat.MaxCompletionTokens != 0 {
		t.Fatalf("max_tokens %d, max_completion_tokens %d", r.Chat.MaxTokens, r.Chat.MaxCompletionTokens)
	}
}

// TestErrorIn200Named: a 200 whose body is an OpenAI error object (no
// choices) is retried like any malformed answer, and its error names the
// server's message, which used to be dropped ("response has no choices").
func TestErrorIn200Named(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.Reply{Body: `{"error":{"message":"upstream model overloaded","type":"server_error"}}`},
		llmtest.Reply{Body: `{"object":"error","message":"upstream model overloaded","choices":[]}`})
	c, rec := newClient(t, srv, func(cfg *llm.Config) { cfg.MaxAttempts = 2 })
	_, err := c.Chat(context.Background(), ask(objSchema))
	if err == nil || !strings.Contains(err.Error(), "upstream model overloaded") {
		t.Fatalf("error %v does not name the server's message", err)
	}
	calls := rec.Drain()
	if got := outcomes(calls); !equal(got, []string{"invalid_json", "invalid_json"}) || !strings.Contains(calls[0].Error, "the server says: upstream model overloaded") {
		t.Fatalf("audit %v %q", got, calls[0].Error)
	}
}

func TestAttemptsExhausted(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.ServerError(), llmtest.RateLimited(""), llmtest.Malformed(), llmtest.Text(`{"answer":"perhaps"}`), llmtest.Text(`{"answer":"yes"}`))
	c, rec := newClient(t, srv, nil)
	resp, err := c.Chat(context.Background(), ask(objSchema))
	var le *llm.Error
	if !errors.As(err, &le) {
		t.Fatalf("error %v", err)
	}
	want := []string{"http_5xx", "http_429", "invalid_json", "schema"}
	if !le.Retryable || le.Attempts != 4 || !equal(le.Outcomes, want) || !errors.Is(err, llm.ErrSchema) {
		t.Fatalf("%+v", le)
	}
	for _, s := range []string{"gave up after 4 attempts", "http_5xx, http_429, invalid_json, schema", "perhaps"} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q lacks %q", err, s)
		}
	}
	if resp.Attempts != 4 || resp.Content != "" {
		t.Fatalf("%+v", resp)
	}
	if got := outcomes(rec.Drain()); !equal(got, want) {
		t.Fatalf("audit %v", got)
	}
	if srv.Pending() != 1 {
		t.Fatal("made a fifth attempt")
	}
}

func TestCallerValidateRetried(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.Text(`{"answer":"no"}`), llmtest.Text("not json at all"), llmtest.Text(`{"answer":"yes"}`))
	c, rec := newClient(t, srv, nil)
	req := ask(nil) // no schema: only the caller's check
	req.Validate = func(content string) error {
		var v struct{ Answer string }
		if err := json.Unmarshal([]byte(content), &v); err != nil {
			return fmt.Errorf("%w: %v", llm.ErrInvalidJSON, err)
		}
		if v.Answer != "yes" {
			return errors.New("want yes")
		}
		return nil
	}
	resp, err := c.Chat(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomes(rec.Drain()); !equal(got, []string{"schema", "invalid_json", "ok"}) || resp.Attempts != 3 {
		t.Fatalf("audit %v", got)
	}
	if srv.Requests()[0].Chat.ResponseFormat != nil {
		t.Fatal("response_format sent without a schema")
	}
}

func TestFencedAnswerAccepted(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.Text("```json\n{\"answer\":\"yes\"}\n```\n"))
	c, _ := newClient(t, srv, nil)
	resp, err := c.Chat(context.Background(), ask(objSchema))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Content != `{"answer":"yes"}` || !strings.HasPrefix(resp.Raw, "```json") {
		t.Fatalf("%q / %q", resp.Content, resp.Raw)
	}
}

func TestStripFences(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{`{"a":1}`, `{"a":1}`},
		{"  {\"a\":1}\n", `{"a":1}`},
		{"```json\n{\"a\":1}\n```", `{"a":1}`},
		{"```JSON\n{\"a\":1}\n```  \n", `{"a":1}`},
		{"```\n[1,2]\n```", `[1,2]`},
		{"```json\n{\"a\":1}", "```json\n{\"a\":1}"}, // unterminated: untouched
		{"Here you go:\n```json\n{\"a\":1}\n```", "Here you go:\n```json\n{\"a\":1}\n```"}, // prose: untouched
		{"```json\n{}\n```\n```json\n{}\n```", "```json\n{}\n```\n```json\n{}\n```"},       // two blocks: untouched
		{"```json {\"a\":1}```", "```json {\"a\":1}```"},
	} {
		if got := llm.StripFences(tt.in); got != tt.want {
			t.Errorf("StripFences(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCheckDuplicateKeys(t *testing.T) {
	for _, tt := range []struct {
		in  string
		bad bool
	}{
		{`{"a":1,"b":{"a":2}}`, false},
		{`[{"a":1},{"a":1}]`, false},
		{`{"a":1,"a":2}`, true},
		{`{"x":{"labels":{"c":1,"c":2}}}`, true},
		{`[1,{"k":[{"z":0,"z":0}]}]`, true},
	} {
		if err := llm.CheckDuplicateKeys([]byte(tt.in)); (err != nil) != tt.bad {
			t.Errorf("CheckDuplicateKeys(%s) = %v", tt.in, err)
		}
	}
}

func TestConcurrencyBoundShared(t *testing.T) {
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply {
		return llmtest.Slow(60*time.Millisecond, llmtest.Text(`{"answer":"yes"}`))
	})
	c, _ := newClient(t, srv, func(cfg *llm.Config) { cfg.Concurrency = 2 })
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Chat(context.Background(), ask(objSchema))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if m := srv.MaxInFlight(); m != 2 {
		t.Fatalf("max in flight %d, want 2", m)
	}
}

func TestRateLimitShared(t *testing.T) {
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(`{"answer":"yes"}`) })
	c, _ := newClient(t, srv, func(cfg *llm.Config) { cfg.RatePerSecond = 20; cfg.Concurrency = 8 })
	start := time.Now()
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Chat(context.Background(), ask(objSchema)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	// 6 requests at 20/s with burst 1: the last starts ≥ 5 × 50ms after the first.
	if d := time.Since(start); d < 240*time.Millisecond {
		t.Fatalf("6 requests at 20/s took %v", d)
	}
}

func TestAPIKeyNeverLeaks(t *testing.T) {
	srv := llmtest.New(t)
	// A server that echoes the key in its errors, twice, then times out.
	srv.Enqueue(llmtest.Status(401, "Incorrect API key provided: "+testKey),
		llmtest.Reply{Status: 500, Body: `{"error":{"message":"upstream said ` + testKey + `"}}`},
		llmtest.Slow(2*time.Second, llmtest.Text("{}")))
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := llm.Config{BaseURL: srv.URL, Model: "m", APIKey: testKey, Logger: logger,
		BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond, Timeout: 100 * time.Millisecond}
	rec := &llm.BufferRecorder{}
	cfg.Recorder = rec
	c, err := llm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err401 := c.Chat(context.Background(), ask(objSchema))
	_, err5xx := c.Chat(context.Background(), ask(objSchema))
	if err401 == nil || err5xx == nil {
		t.Fatal("expected errors")
	}
	if srv.Requests()[0].Header.Get("Authorization") != "Bearer "+testKey {
		t.Fatal("key not sent as a Bearer token")
	}
	logger.Info("config", "cfg", cfg, "key", cfg.APIKey)
	cfgJSON, _ := json.Marshal(struct{ Key llm.Secret }{cfg.APIKey})
	var rows []string
	for _, r := range rec.Drain() {
		rows = append(rows, fmt.Sprintf("%+v", r))
	}
	for what, s := range map[string]string{
		"401 error": err401.Error(), "5xx error": err5xx.Error(), "logs": logs.String(),
		"%v": fmt.Sprintf("%v", cfg), "%+v": fmt.Sprintf("%+v", cfg), "%#v": fmt.Sprintf("%#v", cfg), "%s key": fmt.Sprintf("%s", cfg.APIKey),
		"json": string(cfgJSON), "audit": strings.Join(rows, "\n"),
	} {
		if strings.Contains(s, testKey) || strings.Contains(s, "S3CRET") {
			t.Errorf("%s reveals the key: %s", what, s)
		}
	}
	if !strings.Contains(err401.Error(), "[REDACTED]") {
		t.Errorf("401 error %q: the echoed key should read [REDACTED]", err401)
	}
}

func TestEndpointWithoutCredentials(t *testing.T) {
	rec := &llm.BufferRecorder{}
	// Nothing listens on port 1 of 127.0.0.1: a connection error.
	c, err := llm.New(llm.Config{BaseURL: "http://alice:pw-hunter2@127.0.0.1:1/v1?api-key=qk-hunter3", Model: "m",
		MaxAttempts: 2, BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Chat(context.Background(), ask(nil))
	if err == nil {
		t.Fatal("expected a connection error")
	}
	calls := rec.Drain()
	if got := outcomes(calls); !equal(got, []string{"network", "network"}) {
		t.Fatalf("outcomes %v (%v)", got, err)
	}
	all := err.Error() + fmt.Sprintf("%+v", calls) + c.Endpoint()
	if strings.Contains(all, "hunter") || strings.Contains(all, "alice") {
		t.Fatalf("credentials leak: %s", all)
	}
	if calls[0].Endpoint != "http://127.0.0.1:1/v1" {
		t.Fatalf("endpoint %q", calls[0].Endpoint)
	}
}

// TestBaseURLForms: llm.base_url written without /v1, with a trailing
// slash, or as the whole chat-completions URL reaches the server's
// /v1/chat/completions; without /v1 every call used to be a 404, which is
// not retried, so every labeling run failed.
func TestBaseURLForms(t *testing.T) {
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(`{"answer":"yes"}`) })
	root := strings.TrimSuffix(srv.URL, "/v1")
	for _, base := range []string{root, root + "/", " " + root + "// ", srv.URL, srv.URL + "/", srv.URL + "/chat/completions", srv.URL + "/chat/completions/"} {
		c, err := llm.New(llm.Config{BaseURL: llm.NormalizeBaseURL(base), Model: "m", MaxAttempts: 1})
		if err != nil {
			t.Fatalf("%q: %v", base, err)
		}
		if c.Endpoint() != srv.URL {
			t.Errorf("%q: endpoint %q, want %q", base, c.Endpoint(), srv.URL)
		}
		if _, err := c.Chat(context.Background(), ask(objSchema)); err != nil {
			t.Errorf("%q: %v", base, err)
		}
	}
	// Another path is the caller's: kept as written.
	for base, want := range map[string]string{"http://gw.example/openai/v1/": "http://gw.example/openai/v1", "https://h.example/api": "https://h.example/api", "": ""} {
		if got := llm.NormalizeBaseURL(base); got != want {
			t.Errorf("%q: %q, want %q", base, got, want)
		}
	}
}

func TestEnvAPIKey(t *testing.T) {
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text("hi") })
	t.Setenv(llm.EnvOpenAIAPIKey, "sk-openai")
	t.Setenv(llm.EnvAPIKey, "")
	c, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Chat(context.Background(), ask(nil)); err != nil {
		t.Fatal(err)
	}
	t.Setenv(llm.EnvAPIKey, "sk-trace")
	c2, _ := llm.New(llm.Config{BaseURL: srv.URL, Model: "m"})
	if _, err := c2.Chat(context.Background(), ask(nil)); err != nil {
		t.Fatal(err)
	}
	t.Setenv(llm.EnvAPIKey, "")
	t.Setenv(llm.EnvOpenAIAPIKey, "")
	c3, _ := llm.New(llm.Config{BaseURL: srv.URL, Model: "m"})
	if _, err := c3.Chat(context.Background(), ask(nil)); err != nil {
		t.Fatal(err)
	}
	reqs := srv.Requests()
	if a := reqs[0].Header.Get("Authorization"); a != "Bearer sk-openai" {
		t.Fatalf("OPENAI_API_KEY: %q", a)
	}
	if a := reqs[1].Header.Get("Authorization"); a != "Bearer sk-trace" {
		t.Fatalf("TRACE_LLM_API_KEY: %q", a)
	}
	if _, ok := reqs[2].Header["Authorization"]; ok {
		t.Fatal("Authorization sent without a key")
	}
}

func TestStructuredOutputModes(t *testing.T) {
	for _, tt := range []struct {
		mode llm.StructuredOutput
		want string
	}{
		{llm.StructuredJSONSchema, `{"json_schema":{"name":"answer_v1","schema":` + string(objSchema) + `,"strict":true},"type":"json_schema"}`},
		{llm.StructuredJSONObject, `{"type":"json_object"}`},
		{llm.StructuredJSONObjectSchema, `{"schema":` + string(objSchema) + `,"type":"json_object"}`},
		{llm.StructuredNone, ``},
	} {
		t.Run(string(tt.mode), func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Enqueue(llmtest.Text(`{"answer":"yes"}`))
			c, _ := newClient(t, srv, func(cfg *llm.Config) { cfg.StructuredOutput = tt.mode })
			req := ask(objSchema)
			req.SchemaName = "answer_v1"
			if _, err := c.Chat(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			if got := string(srv.Requests()[0].Chat.ResponseFormat); got != tt.want {
				t.Fatalf("response_format\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestRequestOverridesAndLogprobs(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.Reply{Content: "A", Logprobs: []llmtest.Logprob{{Token: "A", Logprob: -0.1,
		TopLogprobs: []llmtest.Logprob{{Token: "A", Logprob: -0.1}, {Token: "B", Logprob: -2.4}}}}})
	c, _ := newClient(t, srv, func(cfg *llm.Config) { cfg.MaxTokens = 500 })
	req := ask(nil)
	req.Temperature, req.MaxTokens, req.Logprobs, req.TopLogprobs = llm.Float(0), 1, true, 5
	resp, err := c.Chat(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	got := srv.Requests()[0].Chat
	if got.Temperature == nil || *got.Temperature != 0 || got.MaxTokens != 1 || !got.Logprobs || got.TopLogprobs != 5 {
		t.Fatalf("sent %+v", got)
	}
	if len(resp.Logprobs) != 1 || resp.Logprobs[0].Token != "A" || len(resp.Logprobs[0].TopLogprobs) != 2 || resp.Logprobs[0].TopLogprobs[1].Logprob != -2.4 {
		t.Fatalf("logprobs %+v", resp.Logprobs)
	}
}

func TestExtraFieldsAndMaxAttempts(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.Reply{Status: 503}, llmtest.Reply{Status: 503}, llmtest.Reply{Content: "A"})
	c, _ := newClient(t, srv, nil)
	req := ask(nil)
	req.MaxTokens = 1
	req.Extra = map[string]any{"structured_outputs": map[string]any{"choice": []string{"A", "B"}}, "model": "not-this", "max_tokens": 99}
	req.MaxAttempts = 2
	if _, err := c.Chat(context.Background(), req); err == nil {
		t.Fatal("a call limited to 2 attempts succeeded on the third reply")
	}
	if n := len(srv.Requests()); n != 2 {
		t.Fatalf("%d attempts, want 2", n)
	}
	var body struct {
		Model             string `json:"model"`
		MaxTokens         int    `json:"max_tokens"`
		StructuredOutputs struct {
			Choice []string `json:"choice"`
		} `json:"structured_outputs"`
	}
	if err := json.Unmarshal(srv.Requests()[0].Body, &body); err != nil {
		t.Fatal(err)
	}
	if body.Model != "test-model" || body.MaxTokens != 1 || strings.Join(body.StructuredOutputs.Choice, ",") != "A,B" {
		t.Fatalf("sent %s", srv.Requests()[0].Body)
	}
}

func TestCancelStopsCall(t *testing.T) {
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Slow(5*time.Second, llmtest.Text("{}")) })
	c, rec := newClient(t, srv, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Chat(ctx, ask(nil))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("cancellation did not stop the call")
	}
	if got := outcomes(rec.Drain()); !equal(got, []string{"canceled"}) {
		t.Fatalf("audit %v", got)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := llm.Config{BaseURL: "http://127.0.0.1:8080/v1", Model: "m"}
	if err := ok.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	d := ok.WithDefaults()
	if d.Timeout != 60*time.Second || d.MaxAttempts != 4 || d.Concurrency != 4 || *d.Temperature != 1.0 ||
		d.StructuredOutput != llm.StructuredJSONSchema || d.RatePerSecond != 0 {
		t.Fatalf("defaults %+v", d)
	}
	for _, tt := range []struct {
		field  string
		mutate func(*llm.Config)
	}{
		{"BaseURL", func(c *llm.Config) { c.BaseURL = "" }},
		{"BaseURL", func(c *llm.Config) { c.BaseURL = "ftp://x/v1" }},
		{"BaseURL", func(c *llm.Config) { c.BaseURL = "http:///v1" }},
		{"Model", func(c *llm.Config) { c.Model = " " }},
		{"Timeout", func(c *llm.Config) { c.Timeout = -time.Second }},
		{"MaxAttempts", func(c *llm.Config) { c.MaxAttempts = -1 }},
		{"MaxAttempts", func(c *llm.Config) { c.MaxAttempts = 1000 }},
		{"BackoffMax", func(c *llm.Config) { c.BackoffInitial, c.BackoffMax = time.Second, time.Millisecond }},
		{"Concurrency", func(c *llm.Config) { c.Concurrency = -2 }},
		{"RatePerSecond", func(c *llm.Config) { c.RatePerSecond = -1 }},
		{"Temperature", func(c *llm.Config) { c.Temperature = llm.Float(3) }},
		{"MaxTokens", func(c *llm.Config) { c.MaxTokens = -1 }},
		{"StructuredOutput", func(c *llm.Config) { c.StructuredOutput = "grammar" }},
	} {
		c := ok
		tt.mutate(&c)
		err := c.WithDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: error %v does not name the field", tt.field, err)
		}
		if _, err := llm.New(c); err == nil {
			t.Errorf("%s: New accepted an invalid config", tt.field)
		}
	}
}

func TestNoMessages(t *testing.T) {
	srv := llmtest.New(t)
	c, _ := newClient(t, srv, nil)
	if _, err := c.Chat(context.Background(), llm.Request{Purpose: "x"}); err == nil {
		t.Fatal("accepted a request without messages")
	}
	if _, err := c.Chat(context.Background(), llm.Request{Messages: ask(nil).Messages, Schema: json.RawMessage(`{"type": 7}`)}); err == nil {
		t.Fatal("accepted an invalid schema")
	}
	if len(srv.Requests()) != 0 {
		t.Fatal("sent a request")
	}
}

// TestUnavailable: a failure that no other request would escape — a
// refused key, an unknown model or path, nothing listening — is the
// endpoint's (Unavailable), so that a backlog waits for it; one that a
// request can cause on its own (a 400, a 5xx or 429 that outlasts the
// retries, an answer that breaks the schema) is not.
func TestUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply llmtest.Reply
		want  bool
	}{
		{"401 wrong key", llmtest.Status(401, "Incorrect API key provided"), true},
		{"403 forbidden", llmtest.Status(403, "not allowed"), true},
		{"404 unknown model", llmtest.Status(404, "The model `x` does not exist"), true},
		{"400 context length", llmtest.Status(400, "maximum context length exceeded"), false},
		{"500 on every attempt", llmtest.ServerError(), false},
		{"429 on every attempt", llmtest.RateLimitedMS(1), false},
		{"an answer that breaks the schema", llmtest.Text(`{"answer":"maybe"}`), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Handle(func(llmtest.Request) llmtest.Reply { return tc.reply })
			c, _ := newClient(t, srv, func(cfg *llm.Config) { cfg.MaxAttempts = 2 })
			_, err := c.Chat(context.Background(), ask(objSchema))
			if err == nil || llm.Unavailable(err) != tc.want {
				t.Fatalf("Unavailable(%v) = %v, want %v", err, llm.Unavailable(err), tc.want)
			}
		})
	}
	t.Run("nothing listening", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		c, err := llm.New(llm.Config{BaseURL: "http://" + addr + "/v1", Model: "m", APIKey: testKey, MaxAttempts: 2,
			BackoffInitial: time.Millisecond, BackoffMax: 5 * time.Millisecond, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Chat(context.Background(), ask(objSchema))
		if !llm.Unavailable(err) {
			t.Fatalf("Unavailable(%v) = false", err)
		}
	})
	if llm.Unavailable(errors.New("HTTP 401")) || llm.Unavailable(nil) {
		t.Fatal("an error that is not the client's is not its verdict")
	}
}

// TestExtraBody: Config.ExtraBody's fields go with every request (vLLM's
// chat_template_kwargs to turn a reasoning model's thinking off); a
// request's own Extra wins for a key both set, and the client's own
// fields are never replaced; New refuses an ExtraBody that sets one.
func TestExtraBody(t *testing.T) {
	srv := llmtest.New(t)
	var mu sync.Mutex
	var bodies []map[string]any
	srv.Handle(func(req llmtest.Request) llmtest.Reply {
		var m map[string]any
		_ = json.Unmarshal(req.Body, &m)
		mu.Lock()
		bodies = append(bodies, m)
		mu.Unlock()
		return llmtest.Text(`{"answer":"yes"}`)
	})
	c, _ := newClient(t, srv, func(cfg *llm.Config) {
		cfg.ExtraBody = map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": false}, "top_k": 20, "seed": 7}
	})
	if _, err := c.Chat(context.Background(), ask(objSchema)); err != nil {
		t.Fatal(err)
	}
	req := ask(objSchema)
	req.Extra = map[string]any{"seed": 8}
	if _, err := c.Chat(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	got, _ := json.Marshal([]any{bodies[0]["chat_template_kwargs"], bodies[0]["top_k"], bodies[0]["seed"], bodies[1]["seed"], bodies[1]["model"]})
	if string(got) != `[{"enable_thinking":false},20,7,8,"test-model"]` {
		t.Fatalf("sent %s", got)
	}
	for _, f := range []string{"stream", "max_tokens", "response_format", "model"} {
		_, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "m", ExtraBody: map[string]any{f: 1}})
		if err == nil || !strings.Contains(err.Error(), "ExtraBody."+f) {
			t.Errorf("ExtraBody.%s accepted: %v", f, err)
		}
	}
}

// TestRetryAfterWaitEndsOnCancel: a call waiting out a 429's Retry-After
// (60 s) returns as soon as its context is cancelled, with
// context.Canceled, and audits the one attempt made.
func TestRetryAfterWaitEndsOnCancel(t *testing.T) {
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.RateLimited("60") })
	c, rec := newClient(t, srv, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, err := c.Chat(ctx, ask(objSchema))
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the call returned %v after its cancellation, in a 60 s Retry-After", took)
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if got := outcomes(rec.Drain()); !equal(got, []string{"http_429"}) {
		t.Fatalf("audit %v", got)
	}
}

// TestRetryStop: with WithRetryStop, closing the stop ends a call's wait
// between attempts (a 60 s Retry-After here) and its wait for a slot, while
// its context stays alive, and no attempt starts after it; an attempt in
// flight at the stop completes and its answer is returned. The error
// wraps ErrStopped and context.Canceled, is not an *llm.Error (the call
// did not fail), and nothing is audited for attempts not made.
func TestRetryStop(t *testing.T) {
	const answer = `{"answer":"yes"}`
	for _, tt := range []struct {
		name        string
		reply       llmtest.Reply
		concurrency int  // 1: another call holds the only slot
		stopFirst   bool // the stop is closed before the call
		wantAnswer  bool
		wantAudit   []string
		wantSent    int
	}{
		{"waiting out a Retry-After", llmtest.RateLimited("60"), 0, false, false, []string{"http_429"}, 1},
		{"waiting for a slot", llmtest.Slow(2*time.Second, llmtest.Text(answer)), 1, false, false, []string{"ok"}, 1}, // the other call's
		{"stopped before the call", llmtest.Text(answer), 0, true, false, nil, 0},
		{"attempt in flight", llmtest.Slow(time.Second, llmtest.Text(answer)), 0, false, true, []string{"ok"}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Handle(func(llmtest.Request) llmtest.Reply { return tt.reply })
			c, rec := newClient(t, srv, func(cfg *llm.Config) { cfg.Concurrency = tt.concurrency })
			var other sync.WaitGroup
			if tt.concurrency == 1 {
				other.Go(func() { _, _ = c.Chat(context.Background(), ask(objSchema)) })
				for len(srv.Requests()) == 0 {
					time.Sleep(10 * time.Millisecond)
				}
			}
			stop := make(chan struct{})
			if tt.stopFirst {
				close(stop)
			} else {
				time.AfterFunc(200*time.Millisecond, func() { close(stop) })
			}
			start := time.Now()
			resp, err := c.Chat(llm.WithRetryStop(context.Background(), stop), ask(objSchema))
			took := time.Since(start)
			other.Wait()
			if took > 10*time.Second {
				t.Fatalf("the call returned %v after the stop", took)
			}
			if tt.wantAnswer {
				if err != nil || resp.Content != answer {
					t.Fatalf("the attempt in flight at the stop: %q, %v; want its answer", resp.Content, err)
				}
			} else {
				var le *llm.Error
				if !errors.Is(err, llm.ErrStopped) || !errors.Is(err, context.Canceled) || errors.As(err, &le) {
					t.Fatalf("error %v, want one wrapping ErrStopped and context.Canceled, not an *llm.Error", err)
				}
			}
			if got := outcomes(rec.Drain()); !equal(got, tt.wantAudit) {
				t.Fatalf("audit %v, want %v", got, tt.wantAudit)
			}
			if n := len(srv.Requests()); n != tt.wantSent {
				t.Fatalf("%d requests sent, want %d", n, tt.wantSent)
			}
		})
	}
}

// TestCutAnswerRaisesTheCap: an answer cut at max_tokens (finish_reason
// length) that fails its checks is asked for again with twice the cap, up
// to MaxTokensGrowth times the first; a failure of another kind keeps the
// cap; the raised cap is sent as max_completion_tokens once the server
// refused max_tokens; without a cap nothing is raised.
func TestCutAnswerRaisesTheCap(t *testing.T) {
	cut := llmtest.Malformed() // `{"labels": {"`, finish_reason length
	noContent := llmtest.Reply{NullContent: true, FinishReason: "length"}
	caps := func(srv *llmtest.Server) []int {
		var out []int
		for _, r := range srv.Requests() {
			out = append(out, r.Chat.MaxTokens+r.Chat.MaxCompletionTokens)
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		configCap int
		reqCap    int
		replies   []llmtest.Reply
		want      []int
		ok        bool
	}{
		{"cut, cut, cut, ok", 0, 100, []llmtest.Reply{cut, cut, cut, llmtest.Text(`{"answer":"yes"}`)}, []int{100, 200, 400, 400}, true},
		{"the config's cap", 300, 0, []llmtest.Reply{cut, llmtest.Text(`{"answer":"yes"}`)}, []int{300, 600}, true},
		{"a reasoning model that thought up to the cap", 0, 50, []llmtest.Reply{noContent, llmtest.Text(`{"answer":"yes"}`)}, []int{50, 100}, true},
		{"not cut: the cap stays", 0, 100, []llmtest.Reply{llmtest.Text(`{"answer":"perhaps"}`), llmtest.ServerError(), llmtest.Text(`{"answer":"yes"}`)}, []int{100, 100, 100}, true},
		{"cut, then a wrong answer: the raised cap stays", 0, 100, []llmtest.Reply{cut, llmtest.Text(`{"answer":"perhaps"}`), llmtest.Text(`{"answer":"yes"}`)}, []int{100, 200, 200}, true},
		{"no cap: nothing to raise", 0, 0, []llmtest.Reply{cut, cut, cut, cut}, []int{0, 0, 0, 0}, false},
		{"max_completion_tokens", 0, 100, []llmtest.Reply{llmtest.RefuseMaxTokens(), cut, llmtest.Text(`{"answer":"yes"}`)}, []int{100, 100, 200}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Enqueue(tc.replies...)
			c, _ := newClient(t, srv, func(cfg *llm.Config) { cfg.MaxTokens = tc.configCap })
			req := ask(objSchema)
			req.MaxTokens = tc.reqCap
			_, err := c.Chat(context.Background(), req)
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
			if got := caps(srv); !slices.Equal(got, tc.want) {
				t.Fatalf("caps sent %v, want %v", got, tc.want)
			}
		})
	}
}
