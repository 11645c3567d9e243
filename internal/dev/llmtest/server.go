// Package llmtest is a scriptable OpenAI-protocol server for tests: an
// httptest server on 127.0.0.1 serving POST /v1/chat/completions and
// GET /v1/models. A test queues replies (faults or answers) or installs a
// handler, and afterwards inspects every request the server received —
// headers, body, response_format — to assert what the client sent.
//
// ServeLoRA, in lora.go, adds vLLM's runtime LoRA routes.
// RealServer, in real.go, is the fixture for tests against a real model
// (scripts/llm-server.sh).
package llmtest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// DefaultModel is the model name the server reports.
const DefaultModel = "llmtest-model"

// ChatMessage is one message of a received request.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatRequest is the decoded body of a received chat completion request.
type ChatRequest struct {
	Model       string        `json:"model"`
	Messages    []ChatMessage `json:"messages"`
	Temperature *float64      `json:"temperature"`
	MaxTokens   int           `json:"max_tokens"`
	// MaxCompletionTokens is OpenAI's newer cap, which its reasoning models
	// require instead of max_tokens (see RefuseMaxTokens).
	MaxCompletionTokens int             `json:"max_completion_tokens"`
	Logprobs            bool            `json:"logprobs"`
	TopLogprobs         int             `json:"top_logprobs"`
	ResponseFormat      json.RawMessage `json:"response_format"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// IncludeUsage is stream_options.include_usage.
func (c ChatRequest) IncludeUsage() bool {
	return c.StreamOptions != nil && c.StreamOptions.IncludeUsage
}

// ResponseFormatType is response_format.type ("" when none was sent).
func (c ChatRequest) ResponseFormatType() string {
	var rf struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(c.ResponseFormat, &rf)
	return rf.Type
}

// Schema is the JSON Schema sent in response_format, in either the OpenAI
// form (json_schema.schema) or the llama-cpp-python form (schema); nil if none.
func (c ChatRequest) Schema() json.RawMessage {
	var rf struct {
		Schema     json.RawMessage `json:"schema"`
		JSONSchema struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if json.Unmarshal(c.ResponseFormat, &rf) != nil {
		return nil
	}
	if len(rf.JSONSchema.Schema) > 0 {
		return rf.JSONSchema.Schema
	}
	if len(rf.Schema) > 0 {
		return rf.Schema
	}
	return nil
}

// Prompt concatenates the contents of all messages.
func (c ChatRequest) Prompt() string {
	var b strings.Builder
	for _, m := range c.Messages {
		b.WriteString(m.Content)
		b.WriteByte('\n')
	}
	return b.String()
}

// Request is one request the server received.
type Request struct {
	Seq    int // 0-based arrival order
	Time   time.Time
	Header http.Header
	Body   []byte
	Chat   ChatRequest
}

// Logprob is one token's log probability in a scripted reply.
type Logprob struct {
	Token       string    `json:"token"`
	Logprob     float64   `json:"logprob"`
	TopLogprobs []Logprob `json:"top_logprobs,omitempty"`
}

// Reply scripts one answer. The zero value is a 200 with empty content.
type Reply struct {
	Status int               // default 200
	Header map[string]string // extra response headers (Retry-After, …)
	// Delay is waited before answering; it ends early when the client goes
	// away (a client time-out), and nothing is answered then.
	Delay time.Duration
	// Content is choices[0].message.content; NullContent sends null instead.
	Content     string
	NullContent bool
	// Body, when non-empty, is sent verbatim instead of the OpenAI envelope.
	Body string
	// Usage tokens; 0 means an estimate (about 4 characters per token).
	PromptTokens, CompletionTokens int
	// NoUsage leaves "usage" out of the answer.
	NoUsage      bool
	FinishReason string // default "stop"
	Logprobs     []Logprob
	// Stream, when set, answers as server-sent events (stream.go).
	Stream *Stream
}

// Handler answers a request when no scripted reply is queued.
type Handler func(req Request) Reply

// Server is a scriptable OpenAI-compatible server.
type Server struct {
	// URL is the API base URL, ending in /v1 (Config.BaseURL of a client).
	URL   string
	Model string

	srv *httptest.Server

	mu          sync.Mutex
	queue       []Reply
	handler     Handler
	reqs        []Request
	inflight    int
	maxInflight int
	lora        *loraState   // ServeLoRA (lora.go)
	down        bool         // SetDown: every connection closed unanswered
	embeds      atomic.Int64 // POST /v1/embeddings served (embeddings.go)
}

// New starts a server on 127.0.0.1; it is closed when the test ends.
// Without queued replies or a handler, every request gets a 500 saying that
// nothing was scripted.
func New(t testing.TB) *Server {
	t.Helper()
	s := &Server{Model: DefaultModel}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL + "/v1"
	t.Cleanup(s.Close)
	return s
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Enqueue appends scripted replies; each request takes the next one, in
// arrival order, before the handler is consulted.
func (s *Server) Enqueue(replies ...Reply) {
	s.mu.Lock()
	s.queue = append(s.queue, replies...)
	s.mu.Unlock()
}

// Handle installs the handler used when the queue is empty.
func (s *Server) Handle(h Handler) {
	s.mu.Lock()
	s.handler = h
	s.mu.Unlock()
}

// Pending is the number of queued replies not yet used.
func (s *Server) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// Requests returns the chat requests received so far, in arrival order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// MaxInFlight is the largest number of chat requests that were being
// served at the same time.
func (s *Server) MaxInFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxInflight
}

// SetDown makes the server act as a process that is gone (down) or back
// (!down): while down, every request's connection is closed without an
// answer, so clients see a network error; the server's state is kept.
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				_ = c.Close()
				return
			}
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if s.serveLoRA(w, r) {
		return
	}
	switch {
	case r.URL.Path == "/v1/models" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{
			map[string]any{"id": s.Model, "object": "model", "owned_by": "llmtest"}}})
	case r.URL.Path == "/v1/chat/completions" && r.Method == http.MethodPost:
		s.chat(w, r)
	case r.URL.Path == "/v1/embeddings" && r.Method == http.MethodPost:
		s.embeddings(w, r) // embeddings.go
	default:
		writeJSON(w, http.StatusNotFound, errorBody("no route "+r.Method+" "+r.URL.Path, "invalid_request_error"))
	}
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody("reading body: "+err.Error(), "invalid_request_error"))
		return
	}
	var cr ChatRequest
	if err := json.Unmarshal(body, &cr); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody("body is not JSON: "+err.Error(), "invalid_request_error"))
		return
	}
	if s.rejectModel(w, cr.Model) {
		return
	}
	s.mu.Lock()
	req := Request{Seq: len(s.reqs), Time: time.Now(), Header: r.Header.Clone(), Body: body, Chat: cr}
	s.reqs = append(s.reqs, req)
	s.inflight++
	s.maxInflight = max(s.maxInflight, s.inflight)
	var rep Reply
	switch {
	case len(s.queue) > 0:
		rep = s.queue[0]
		s.queue = s.queue[1:]
	case s.handler != nil:
		h := s.handler
		s.mu.Unlock()
		rep = h(req)
		s.mu.Lock()
	default:
		rep = Reply{Status: http.StatusInternalServerError, Body: mustJSON(errorBody("llmtest: nothing scripted for this request", "server_error"))}
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight--
		s.mu.Unlock()
	}()

	if rep.Delay > 0 {
		t := time.NewTimer(rep.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	for k, v := range rep.Header {
		w.Header().Set(k, v)
	}
	status := rep.Status
	status = cmp.Or(status, http.StatusOK)
	if rep.Stream != nil && status == http.StatusOK {
		s.stream(w, r, cr, rep)
		return
	}
	if rep.Body != "" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(rep.Body))
		return
	}
	if status != http.StatusOK {
		writeJSON(w, status, errorBody(http.StatusText(status), "server_error"))
		return
	}
	writeJSON(w, status, s.envelope(cr, rep))
}

func (s *Server) envelope(cr ChatRequest, rep Reply) map[string]any {
	var content any = rep.Content
	if rep.NullContent {
		content = nil
	}
	finish := rep.FinishReason
	finish = cmp.Or(finish, "stop")
	choice := map[string]any{
		"index":         0,
		"message":       map[string]any{"role": "assistant", "content": content},
		"finish_reason": finish,
	}
	if len(rep.Logprobs) > 0 {
		choice["logprobs"] = map[string]any{"content": rep.Logprobs}
	}
	out := map[string]any{
		"id": "chatcmpl-llmtest", "object": "chat.completion", "created": time.Now().Unix(),
		"model": s.Model, "choices": []any{choice},
	}
	if !rep.NoUsage {
		out["usage"] = usage(cr, rep, rep.Content)
	}
	return out
}

// usage is the usage object of rep's answer, content being its text:
// the scripted token counts, or estimates (about 4 characters per token).
func usage(cr ChatRequest, rep Reply, content string) map[string]any {
	pt, ct := rep.PromptTokens, rep.CompletionTokens
	pt = cmp.Or(pt, len(cr.Prompt())/4+1)
	ct = cmp.Or(ct, len(content)/4+1)
	return map[string]any{"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
}

func errorBody(msg, typ string) map[string]any {
	return map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": nil}}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("llmtest: %v", err))
	}
	return string(b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
