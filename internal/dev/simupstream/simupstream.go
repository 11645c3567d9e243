// Package simupstream is the SIMULATED upstream of the closed-loop demo:
// an OpenAI-compatible /v1/chat/completions that plays both parts the
// routing proxy talks to — the base model as the routing classifier, and
// the model (or adapter) that answers the conversation. No model runs.
//
// As the classifier it answers the router's one-token request (max_tokens
// 1, logprobs) with label logprobs. It does not read the conversation the
// way a model would: it looks the conversation's first user turn up in
// the simulation's ground truth (which capabilities the simulated task
// exercises, Register) and puts 97 % on a candidate whose capability is
// among them — when several are, one chosen by a hash of the turn, so
// conversations spread over the adapters they could use — else on the
// "no adapter" label. As the answering model it returns one fixed
// assistant message naming the model it was asked for (streamed as SSE
// when the request asks for it). Everything it says is labeled simulated.
package simupstream

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Server is the simulated upstream. Register the ground truth before the
// traffic; safe for concurrent use.
type Server struct {
	mu    sync.RWMutex
	truth map[string][]string // environment + NUL + first user turn → capabilities exercised

	Classified, Answered atomic.Int64
}

// New returns a server with no ground truth yet.
func New() *Server { return &Server{truth: map[string][]string{}} }

// Register records that a conversation of the environment starting with
// firstUser exercises the capabilities.
func (s *Server) Register(environment, firstUser string, capabilities []string) {
	s.mu.Lock()
	s.truth[environment+"\x00"+strings.TrimSpace(firstUser)] = capabilities
	s.mu.Unlock()
}

type message struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

func (m message) text() string {
	switch c := m.Content.(type) {
	case string:
		return c
	case []any:
		var b strings.Builder
		for _, p := range c {
			if pm, ok := p.(map[string]any); ok {
				if t, ok := pm["text"].(string); ok {
					b.WriteString(t)
				}
			}
		}
		return b.String()
	}
	return ""
}

type request struct {
	Model     string    `json:"model"`
	Messages  []message `json:"messages"`
	MaxTokens int       `json:"max_tokens"`
	Logprobs  bool      `json:"logprobs"`
	Stream    bool      `json:"stream"`
}

// ServeHTTP implements POST /v1/chat/completions.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		http.Error(w, `{"error":{"message":"simulated upstream: only POST /v1/chat/completions"}}`, http.StatusNotFound)
		return
	}
	var req request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"message":%q,"type":"invalid_request_error"}}`, "simulated upstream: "+err.Error())
		return
	}
	if req.Logprobs && req.MaxTokens == 1 {
		s.classify(w, req)
		return
	}
	s.answer(w, req)
}

var (
	candidateLine = regexp.MustCompile(`(?m)^([A-Z]): (\S+) — `)
	noneLine      = regexp.MustCompile(`(?m)^([A-Z]): none — `)
	envName       = regexp.MustCompile(`in the environment "([^"]*)"`)
	conversation  = regexp.MustCompile(`(?s)<conversation>\s*(.*?)\s*</conversation>`)
)

// pick is the label the simulated classifier chooses: the preferred
// candidate among the capabilities the conversation exercises, or none.
func (s *Server) pick(system, user string) (label, none string) {
	if m := noneLine.FindStringSubmatch(system); m != nil {
		none = m[1]
	}
	env := ""
	if m := envName.FindStringSubmatch(system); m != nil {
		env = m[1]
	}
	first := ""
	if m := conversation.FindStringSubmatch(user); m != nil {
		first = m[1]
		if i := strings.Index(first, "\n"); i >= 0 {
			first = first[:i] // the first turn
		}
		first = strings.TrimPrefix(first, "user: ")
	}
	s.mu.RLock()
	needed := s.truth[env+"\x00"+strings.TrimSpace(first)]
	s.mu.RUnlock()
	var matching []string
	for _, m := range candidateLine.FindAllStringSubmatch(system, -1) {
		if m[2] != "none" && slices.Contains(needed, m[2]) {
			matching = append(matching, m[1])
		}
	}
	if len(matching) == 0 {
		return none, none
	}
	h := fnv.New32a()
	h.Write([]byte(first))
	return matching[h.Sum32()%uint32(len(matching))], none
}

func (s *Server) classify(w http.ResponseWriter, req request) {
	s.Classified.Add(1)
	var system, user string
	for _, m := range req.Messages {
		switch m.Role {
		case "system":
			system += m.text()
		case "user":
			user += m.text()
		}
	}
	label, none := s.pick(system, user)
	top := []map[string]any{{"token": label, "logprob": math.Log(0.97)}}
	if none != "" && none != label {
		top = append(top, map[string]any{"token": none, "logprob": math.Log(0.03)})
	}
	writeJSON(w, map[string]any{
		"id": "simcls", "object": "chat.completion", "model": req.Model,
		"choices": []any{map[string]any{"index": 0, "finish_reason": "length",
			"message":  map[string]any{"role": "assistant", "content": label},
			"logprobs": map[string]any{"content": []any{map[string]any{"token": label, "logprob": math.Log(0.97), "top_logprobs": top}}}}},
		"usage": map[string]int{"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
	})
}

// Answer is the simulated answering model's text for a model name.
func Answer(model string) string {
	return "[simulated upstream: no model ran] answered as " + model
}

func (s *Server) answer(w http.ResponseWriter, req request) {
	s.Answered.Add(1)
	text := Answer(req.Model)
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		fl, _ := w.(http.Flusher)
		for _, part := range []string{text[:len(text)/2], text[len(text)/2:]} {
			b, _ := json.Marshal(map[string]any{"id": "simans", "object": "chat.completion.chunk", "model": req.Model,
				"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": part}}}})
			fmt.Fprintf(w, "data: %s\n\n", b)
			if fl != nil {
				fl.Flush()
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	writeJSON(w, map[string]any{
		"id": "simans", "object": "chat.completion", "model": req.Model,
		// No usage: no model ran, so there are no tokens to report (the
		// router records none, and the closed loop shows none).
		"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "message": map[string]any{"role": "assistant", "content": text}}},
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
