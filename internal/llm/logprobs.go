package llm

import (
	"cmp"
	"encoding/json"
	"math"
	"slices"
)

// readLogprobs reads the answer's token logprobs from a chat completion:
// choice is choices[0].logprobs, completionProbs the answer's top-level
// "completion_probabilities" (either may be empty). Real OpenAI-protocol
// servers send one of three layouts from /v1/chat/completions:
//
//   - the chat layout, {"content": [{"token", "logprob", "top_logprobs":
//     [{"token", "logprob"}]}]}: OpenAI, vLLM, Ollama,
//     text-generation-inference, llama.cpp's server since
//     ggml-org/llama.cpp#10783 (Dec 2024), llama-cpp-python since 0.3.3;
//   - the Completions API's layout, {"tokens": [...], "token_logprobs":
//     [...], "top_logprobs": [{token: logprob}, ...]}: vLLM's first chat
//     logprobs (vllm-project/vllm#2918, early 2024; reported as
//     vllm-project/vllm#3179) and llama-cpp-python's server before 0.3.3
//     (abetlen/llama-cpp-python#1787, fixed by #1788);
//   - no choices[0].logprobs, but llama.cpp's own top-level
//     "completion_probabilities": [{"content": token, "probs": [{"tok_str",
//     "prob"}]}], with probabilities rather than their logs: llama.cpp's
//     server before ggml-org/llama.cpp#10783. At temperature 0 it reports
//     1 for the chosen token and 0 for the others, so the distribution is
//     the chosen token alone.
//
// A layout that does not decode reads as no logprobs: they are optional,
// and their absence is for the caller to handle, not a failed answer.
func readLogprobs(choice, completionProbs json.RawMessage) []TokenLogprob {
	if len(choice) > 0 && string(choice) != "null" {
		var chat struct {
			Content []TokenLogprob `json:"content"`
		}
		if json.Unmarshal(choice, &chat) == nil && len(chat.Content) > 0 {
			return chat.Content
		}
		var old struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []*float64           `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		}
		if json.Unmarshal(choice, &old) == nil && len(old.Tokens) > 0 {
			out := make([]TokenLogprob, len(old.Tokens))
			for i, tok := range old.Tokens {
				out[i] = TokenLogprob{Token: tok, Logprob: math.NaN()}
				if i < len(old.TokenLogprobs) && old.TokenLogprobs[i] != nil {
					out[i].Logprob = *old.TokenLogprobs[i]
				}
				if i < len(old.TopLogprobs) {
					for t, lp := range old.TopLogprobs[i] {
						out[i].TopLogprobs = append(out[i].TopLogprobs, TopLogprob{Token: t, Logprob: lp})
					}
					// A JSON object has no order: most probable first, as
					// the chat layout lists them.
					slices.SortFunc(out[i].TopLogprobs, func(a, b TopLogprob) int {
						return cmp.Or(cmp.Compare(b.Logprob, a.Logprob), cmp.Compare(a.Token, b.Token))
					})
				}
			}
			return out
		}
	}
	if len(completionProbs) > 0 {
		var probs []struct {
			Content string `json:"content"`
			Probs   []struct {
				TokStr string  `json:"tok_str"`
				Prob   float64 `json:"prob"`
			} `json:"probs"`
		}
		if json.Unmarshal(completionProbs, &probs) != nil || len(probs) == 0 {
			return nil
		}
		out := make([]TokenLogprob, len(probs))
		for i, p := range probs {
			out[i] = TokenLogprob{Token: p.Content, Logprob: math.NaN()}
			for _, a := range p.Probs {
				lp := math.Log(a.Prob) // 0 → -Inf: no mass
				if a.TokStr == p.Content && math.IsNaN(out[i].Logprob) {
					out[i].Logprob = lp
				}
				out[i].TopLogprobs = append(out[i].TopLogprobs, TopLogprob{Token: a.TokStr, Logprob: lp})
			}
		}
		return out
	}
	return nil
}
