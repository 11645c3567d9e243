package llmtest

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"
)

// Stream scripts a streaming answer (stream: true): one SSE event per
// chunk, in the chat.completion.chunk shape, then a final event with the
// finish_reason and "data: [DONE]". When the request has
// stream_options.include_usage true (and the Reply not NoUsage), a chunk
// with "choices": [] and the usage (Reply's token counts, or estimates)
// comes after the finish_reason and before [DONE], and the chunks before
// it carry "usage": null, as OpenAI documents it (vLLM leaves the field
// out of those); a stream that fails sends no usage. NoUsage scripts an
// upstream that ignores the option (llama-cpp-python's server, see
// test/infra/llm/NOTES.md).
type Stream struct {
	// Chunks are the content deltas, one event each.
	Chunks []string
	// Interval is waited before each chunk after the first.
	Interval time.Duration
	// FailAfter > 0 ends the stream after that many chunks: with
	// ErrorMessage set, an error event (data: {"error": {...}}, vLLM's and
	// OpenAI's shape) and no [DONE]; without it the connection is cut
	// (the response is aborted mid-body).
	FailAfter    int
	ErrorMessage string
}

// StreamText is a streaming reply of the given chunks.
func StreamText(chunks ...string) Reply { return Reply{Stream: &Stream{Chunks: chunks}} }

func (s *Server) stream(w http.ResponseWriter, r *http.Request, cr ChatRequest, rep Reply) {
	st := rep.Stream
	withUsage := cr.IncludeUsage() && !rep.NoUsage
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		_ = rc.Flush()
	}
	created := time.Now().Unix()
	envelope := func(choices []any) map[string]any {
		c := map[string]any{"id": "chatcmpl-llmtest", "object": "chat.completion.chunk", "created": created, "model": s.Model, "choices": choices}
		if withUsage {
			c["usage"] = nil
		}
		return c
	}
	chunk := func(delta map[string]any, finish any) map[string]any {
		return envelope([]any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}})
	}
	for i, c := range st.Chunks {
		if st.FailAfter > 0 && i == st.FailAfter {
			if st.ErrorMessage != "" {
				send(errorBody(st.ErrorMessage, "server_error"))
				return
			}
			panic(http.ErrAbortHandler) // cut the connection mid-body
		}
		if i > 0 && st.Interval > 0 {
			t := time.NewTimer(st.Interval)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		delta := map[string]any{"content": c}
		if i == 0 {
			delta["role"] = "assistant"
		}
		send(chunk(delta, nil))
	}
	finish := rep.FinishReason
	if finish == "" {
		finish = "stop"
	}
	send(chunk(map[string]any{}, finish))
	if withUsage {
		last := envelope([]any{})
		last["usage"] = usage(cr, rep, strings.Join(st.Chunks, ""))
		send(last)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}

// LabelLogprobs scripts a one-token classification: the sampled token is
// the most probable of probs, and top_logprobs list every token of probs
// (highest first) with log(p).
func LabelLogprobs(probs map[string]float64) []Logprob {
	toks := make([]string, 0, len(probs))
	for t := range probs {
		toks = append(toks, t)
	}
	sort.Slice(toks, func(i, j int) bool {
		if probs[toks[i]] != probs[toks[j]] {
			return probs[toks[i]] > probs[toks[j]]
		}
		return toks[i] < toks[j]
	})
	top := make([]Logprob, len(toks))
	for i, t := range toks {
		top[i] = Logprob{Token: t, Logprob: math.Log(probs[t])}
	}
	if len(top) == 0 {
		return nil
	}
	return []Logprob{{Token: top[0].Token, Logprob: top[0].Logprob, TopLogprobs: top}}
}

// Classification is a reply of one label token with LabelLogprobs(probs).
func Classification(probs map[string]float64) Reply {
	lps := LabelLogprobs(probs)
	content := ""
	if len(lps) > 0 {
		content = lps[0].Token
	}
	return Reply{Content: content, Logprobs: lps, FinishReason: "length"}
}
