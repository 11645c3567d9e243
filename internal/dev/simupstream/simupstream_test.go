package simupstream

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// system is prompts/route.md rendered for two candidates.
const system = `You are a routing classifier. Read the user's request to an agent in the environment "sim-airline" and decide which specialised skill, if any, the agent needs to handle it well.

Candidates:
A: multi_step_completion — finish every step
B: precondition_verification — read before writing
C: none — no specialised skill is needed, or none of the above fits.

Only output the label: one of A, B, C.`

func post(t *testing.T, url string, body any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("HTTP %d %s", resp.StatusCode, raw)
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return map[string]any{"sse": string(raw)}
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func label(out map[string]any) (string, []any) {
	c := out["choices"].([]any)[0].(map[string]any)
	lp := c["logprobs"].(map[string]any)["content"].([]any)[0].(map[string]any)
	return lp["token"].(string), lp["top_logprobs"].([]any)
}

func TestClassifierFollowsTheGroundTruth(t *testing.T) {
	s := New()
	s.Register("sim-airline", "cancel my trip EHGLP3", []string{"multi_step_completion", "precondition_verification"})
	s.Register("sim-airline", "what is my balance", []string{"user_confirmation"})
	s.Register("sim-airline", "change two flights", []string{"multi_step_completion"})
	srv := httptest.NewServer(s)
	defer srv.Close()
	for _, tc := range []struct{ first, want string }{
		{"change two flights", "A"},
		{"what is my balance", "C"}, // no candidate's capability: no adapter
		{"never registered", "C"},
	} {
		out := post(t, srv.URL, map[string]any{"model": "base", "max_tokens": 1, "logprobs": true, "top_logprobs": 20,
			"messages": []any{map[string]any{"role": "system", "content": system},
				map[string]any{"role": "user", "content": "<conversation>\nuser: " + tc.first + "\n</conversation>\nLabel:"}}})
		got, top := label(out)
		if got != tc.want || len(top) == 0 {
			t.Errorf("%q: label %q (%v), want %q", tc.first, got, top, tc.want)
		}
	}
	ans := post(t, srv.URL, map[string]any{"model": "pv-adapter", "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	msg := ans["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
	if msg != Answer("pv-adapter") || !strings.Contains(msg, "simulated") {
		t.Fatalf("answer %q", msg)
	}
	sse := post(t, srv.URL, map[string]any{"model": "base", "stream": true, "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	if s := sse["sse"].(string); strings.Count(s, "data: ") != 3 || !strings.HasSuffix(s, "data: [DONE]\n\n") {
		t.Fatalf("stream %q", s)
	}
	// A conversation exercising both capabilities goes to one of them, by
	// a hash of its first turn: over many, both get some.
	seen := map[string]int{}
	for i := range 40 {
		first := "cancel my trip " + string(rune('a'+i%26)) + string(rune('a'+i/26))
		s.Register("sim-airline", first, []string{"multi_step_completion", "precondition_verification"})
		got, _ := label(post(t, srv.URL, map[string]any{"model": "base", "max_tokens": 1, "logprobs": true,
			"messages": []any{map[string]any{"role": "system", "content": system},
				map[string]any{"role": "user", "content": "<conversation>\nuser: " + first + "\n</conversation>\nLabel:"}}}))
		seen[got]++
	}
	if seen["A"] < 5 || seen["B"] < 5 || seen["A"]+seen["B"] != 40 {
		t.Fatalf("split over the two candidates: %v", seen)
	}
	if s.Classified.Load() != 43 || s.Answered.Load() != 2 {
		t.Fatalf("counters %d %d", s.Classified.Load(), s.Answered.Load())
	}
}
