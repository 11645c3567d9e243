package router

import (
	"math"
	"strings"
	"unicode"

	"github.com/traceops/trace/internal/llm"
)

// Reasons a decision records. ReasonClassified is a decision from label
// probabilities; the others route to the base model without them.
const (
	ReasonClassified      = "classified"
	ReasonNoAdapters      = "no_adapters"      // the environment has no active adapter: nothing to classify
	ReasonNoLogprobs      = "no_logprobs"      // the classifier returned no logprobs
	ReasonNoLabel         = "no_label"         // none of its tokens is a label
	ReasonClassifierError = "classifier_error" // the classifier call failed (after its retries)
	ReasonNoMessages      = "no_user_message"  // nothing to classify in the request
	ReasonRegistryError   = "registry_error"   // the adapter registry could not be read
	// ReasonAdapterUnavailable is a request's, not a decision's: the
	// upstream answered 404 for the decision's adapter (it does not serve
	// it: vLLM restarted and forgot its runtime-loaded adapters, a failed
	// load) and the base model served the request (ProxyConfig.NoAdapterFallback).
	ReasonAdapterUnavailable = "adapter_unavailable"
)

// isSpaceOrMarker is whitespace, or a tokenizer's vocabulary mark for it:
// byte-level BPE (GPT-2, Llama 3, Qwen) writes a space "Ġ", a newline "Ċ",
// a tab "ĉ" and a carriage return "č"; SentencePiece (Llama 2, Gemma,
// Mistral) a space "▁". Some servers name logprob tokens by these
// vocabulary strings instead of their text (vLLM has: the chat logprobs
// shown in vllm-project/vllm#2918 read "▁Hello"), so " A" can come as "ĠA".
func isSpaceOrMarker(r rune) bool {
	switch r {
	case 'Ġ', 'Ċ', 'ĉ', 'č', '▁':
		return true
	}
	return unicode.IsSpace(r)
}

// Probabilities turns the first answer token's logprobs into a distribution
// over the labels: the sampled token and its top_logprobs are merged (the
// sampled token usually repeats among them; each distinct token counts
// once), whitespace (and a tokenizer's mark for it, isSpaceOrMarker) is
// stripped, tokens that are not a label are dropped, tokens that become
// the same label (" A", "ĠA" and "A") add their probabilities, and the result is renormalised over the labels with
// temperature t: p_i ∝ exp(log q_i / t), t > 0 (t = 1 keeps the model's
// ratios; larger flattens, smaller sharpens).
//
// The reason is ReasonClassified, or ReasonNoLogprobs / ReasonNoLabel with
// a nil map.
func Probabilities(lps []llm.TokenLogprob, labels []string, t float64) (map[string]float64, string) {
	if len(lps) == 0 {
		return nil, ReasonNoLogprobs
	}
	if t <= 0 || math.IsNaN(t) {
		t = 1
	}
	known := make(map[string]bool, len(labels))
	for _, l := range labels {
		known[l] = true
	}
	first := lps[0]
	seen := map[string]bool{}
	mass := map[string]float64{} // label → summed probability
	add := func(tok string, lp float64) {
		if seen[tok] || math.IsNaN(lp) || lp > 0 {
			return
		}
		seen[tok] = true
		l := strings.TrimFunc(tok, isSpaceOrMarker)
		if !known[l] {
			return
		}
		mass[l] += math.Exp(lp)
	}
	add(first.Token, first.Logprob)
	for _, a := range first.TopLogprobs {
		add(a.Token, a.Logprob)
	}
	if len(mass) == 0 {
		return nil, ReasonNoLabel
	}
	// Tempered softmax over log mass, shifted by the maximum for stability.
	maxLog := math.Inf(-1)
	logs := make(map[string]float64, len(mass))
	for l, m := range mass {
		if m <= 0 { // underflow: exp of a very negative logprob
			continue
		}
		logs[l] = math.Log(m) / t
		maxLog = max(maxLog, logs[l])
	}
	if len(logs) == 0 {
		return nil, ReasonNoLabel
	}
	sum := 0.0
	out := make(map[string]float64, len(labels))
	for l, v := range logs {
		out[l] = math.Exp(v - maxLog)
		sum += out[l]
	}
	for _, l := range labels {
		out[l] /= sum // labels the model gave no mass are 0
	}
	return out, ReasonClassified
}
