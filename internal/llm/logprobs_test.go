package llm_test

import (
	"context"
	"math"
	"testing"

	"github.com/traceops/trace/internal/dev/llmtest"
)

// TestLogprobLayouts: the answer's logprobs are read in each layout that a
// real OpenAI-protocol server sends from /v1/chat/completions (the answer
// bodies below are shaped as each server sends them), as token, probability
// and alternatives.
func TestLogprobLayouts(t *testing.T) {
	type alt struct {
		tok string
		p   float64
	}
	type first struct {
		tok  string
		p    float64 // NaN: the server did not give the sampled token's own
		alts []alt
	}
	envelope := func(choiceLogprobs, extra string) string {
		return `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":" A"},` +
			`"logprobs":` + choiceLogprobs + `,"finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":1}` + extra + `}`
	}
	for _, tc := range []struct {
		name string
		body string
		want *first // nil: no logprobs
	}{
		{"OpenAI chat layout", envelope(`{"content":[{"token":" A","logprob":-0.2231435513,"bytes":[32,65],`+
			`"top_logprobs":[{"token":" A","logprob":-0.2231435513,"bytes":[32,65]},{"token":" B","logprob":-1.6094379124,"bytes":[32,66]}]}],"refusal":null}`, ""),
			&first{" A", 0.8, []alt{{" A", 0.8}, {" B", 0.2}}}},
		{"vLLM chat layout, vocabulary strings", envelope(`{"content":[{"token":"ĠA","logprob":-0.2231435513,"bytes":[196,160,65],`+
			`"top_logprobs":[{"token":"ĠA","logprob":-0.2231435513},{"token":"ĠB","logprob":-1.6094379124}]}]}`, ""),
			&first{"ĠA", 0.8, []alt{{"ĠA", 0.8}, {"ĠB", 0.2}}}},
		{"llama.cpp server chat layout (since ggml-org/llama.cpp#10783)", envelope(`{"content":[{"id":362,"token":" A","logprob":-0.2231435513,"bytes":[32,65],`+
			`"top_logprobs":[{"id":362,"token":" A","bytes":[32,65],"logprob":-0.2231435513},{"id":425,"token":" B","bytes":[32,66],"logprob":-1.6094379124}]}]}`, ""),
			&first{" A", 0.8, []alt{{" A", 0.8}, {" B", 0.2}}}},
		// vllm-project/vllm#3179: the chat logprobs vLLM first sent
		// (vllm-project/vllm#2918) are the Completions API's layout.
		{"vLLM early 2024: completions layout", envelope(`{"text_offset":[0],"token_logprobs":[-0.2231435513],"tokens":["▁A"],`+
			`"top_logprobs":[{"▁B":-1.6094379124,"▁A":-0.2231435513}]}`, ""),
			&first{"▁A", 0.8, []alt{{"▁A", 0.8}, {"▁B", 0.2}}}},
		// abetlen/llama-cpp-python#1787, fixed in 0.3.3 (#1788).
		{"llama-cpp-python before 0.3.3: completions layout", envelope(`{"text_offset":[231],"token_logprobs":[-0.2231435513],"tokens":[" A"],`+
			`"top_logprobs":[{" A":-0.2231435513," B":-1.6094379124," C":-4.6051701860}]}`, ""),
			&first{" A", 0.8, []alt{{" A", 0.8}, {" B", 0.2}, {" C", 0.01}}}},
		{"completions layout, the sampled token's logprob null", envelope(`{"text_offset":[0],"token_logprobs":[null],"tokens":["A"],"top_logprobs":[{"A":-0.2231435513}]}`, ""),
			&first{"A", math.NaN(), []alt{{"A", 0.8}}}},
		// llama.cpp server before ggml-org/llama.cpp#10783 (Dec 2024): no
		// choices[0].logprobs, the top-level completion_probabilities of its
		// /completion with probabilities; at temperature 0 it reports 1 for
		// the chosen token and 0 for the others.
		{"llama.cpp server before #10783: completion_probabilities, temperature 0", envelope(`null`,
			`,"completion_probabilities":[{"content":" A","probs":[{"tok_str":" A","prob":1.0},{"tok_str":" B","prob":0.0}]}]`),
			&first{" A", 1, []alt{{" A", 1}, {" B", 0}}}},
		{"llama.cpp server before #10783: completion_probabilities, sampled", envelope(`null`,
			`,"completion_probabilities":[{"content":" B","probs":[{"tok_str":" A","prob":0.7},{"tok_str":" B","prob":0.3}]}]`),
			&first{" B", 0.3, []alt{{" A", 0.7}, {" B", 0.3}}}},
		{"no logprobs", envelope(`null`, ""), nil},
		{"logprobs without tokens", envelope(`{"content":null}`, ""), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Enqueue(llmtest.Reply{Body: tc.body})
			c, _ := newClient(t, srv, nil)
			req := ask(nil)
			req.Logprobs, req.TopLogprobs, req.MaxTokens = true, 20, 1
			resp, err := c.Chat(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if len(resp.Logprobs) != 0 {
					t.Fatalf("logprobs %+v, want none", resp.Logprobs)
				}
				return
			}
			if len(resp.Logprobs) != 1 {
				t.Fatalf("logprobs %+v, want one token", resp.Logprobs)
			}
			got := resp.Logprobs[0]
			near := func(lp, p float64) bool {
				if math.IsNaN(p) {
					return math.IsNaN(lp)
				}
				return math.Abs(math.Exp(lp)-p) < 1e-6
			}
			if got.Token != tc.want.tok || !near(got.Logprob, tc.want.p) || len(got.TopLogprobs) != len(tc.want.alts) {
				t.Fatalf("got %+v, want %+v", got, *tc.want)
			}
			for i, a := range tc.want.alts {
				if g := got.TopLogprobs[i]; g.Token != a.tok || !near(g.Logprob, a.p) {
					t.Fatalf("alternative %d: %+v, want %s with p %v (all %+v)", i, g, a.tok, a.p, got.TopLogprobs)
				}
			}
		})
	}
}
