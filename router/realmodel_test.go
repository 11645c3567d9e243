package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/router"
	"github.com/traceops/trace/sink"
)

// TestRealModelRouterAndProxy: the real local model (Gemma 3 270M on
// llama.cpp, scripts/llm-server.sh) is the classifier. Its one-token
// answer's top_logprobs give probabilities over the labels that sum to 1,
// and the decision is the rule's on them. Then the proxy forwards a
// streaming request of the same conversation to the same server with the
// decision's model (llama-cpp-python serves its one model under any name,
// so the adapter's served name reaches it) and the answer streams back as
// SSE events. Gemma 3 270M is a base model: which label it picks is not
// meaningful, only that the probabilities and the rule hold.
func TestRealModelRouterAndProxy(t *testing.T) {
	baseURL, model := llmtest.RealServer(t)
	cls, err := llm.New(llm.Config{BaseURL: baseURL, Model: model, Timeout: 8 * time.Minute, MaxAttempts: 1, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	cands := staticAdapters{
		{Adapter: "lora-id-verification", Capability: "id_verification", Description: "verify the customer's identity before changing a booking"},
		{Adapter: "lora-baggage", Capability: "baggage_policy", Description: "look up the baggage allowance and fees of a fare"},
	}
	r, err := router.New(router.Config{BaseModel: model, ClassifierAttempts: 1}, cls, cands)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in := router.Input{ConversationID: "real-1", ConversationSource: router.SourceMetadata, Environment: "sim-airline",
		Turns: []router.Turn{{Role: "user", Text: "How many bags can I check on my economy ticket, and what does a second bag cost?"}}}
	start := time.Now()
	d, cached := r.Route(ctx, in)
	t.Logf("decision after %s: reason %s, label %q, adapter %q, probabilities %v, weights %+v, error %q",
		time.Since(start).Round(time.Millisecond), d.Reason, d.Label, d.Adapter, d.Probabilities, d.Weights, d.Error)
	if cached {
		t.Fatal("the first decision of a conversation came from the cache")
	}
	if d.Reason != router.ReasonClassified {
		t.Fatalf("no classification from the real model: %s (%s)", d.Reason, d.Error)
	}
	names := router.LabelNames(d.Labels)
	if !slices.Equal(names, []string{"A", "B", "C"}) {
		t.Fatalf("labels %v", names)
	}
	sum := 0.0
	for _, l := range names {
		p, ok := d.Probabilities[l]
		if !ok || p < 0 || p > 1 {
			t.Fatalf("p(%s) = %v (present %v)", l, p, ok)
		}
		sum += p
	}
	if math.Abs(sum-1) > 1e-9 || len(d.Probabilities) != len(names) {
		t.Fatalf("probabilities %v sum to %v", d.Probabilities, sum)
	}
	want := router.Decide(d.Labels, d.Probabilities, 0.95)
	if d.Adapter != want.Adapter || d.Label != want.Label || len(d.Weights) != len(want.Weights) {
		t.Fatalf("decision %q/%q weights %v, the rule gives %q/%q %v", d.Label, d.Adapter, d.Weights, want.Label, want.Adapter, want.Weights)
	}
	wantModel := model
	if d.Adapter != "" {
		wantModel = d.Adapter
	}

	rec := &rowsRecorder{}
	p, err := router.NewProxy(router.ProxyConfig{UpstreamURL: baseURL, DefaultEnvironment: "sim-airline"}, r, rec)
	if err != nil {
		t.Fatal(err)
	}
	px := httptest.NewServer(p.Handler())
	defer px.Close()
	body := `{"model":"x","stream":true,"max_tokens":8,"temperature":0,"metadata":{"conversation_id":"real-1"},
		"messages":[{"role":"user","content":"How many bags can I check on my economy ticket, and what does a second bag cost?"}]}`
	// llama-cpp-python's server interrupts a streaming completion when
	// another request arrives (interrupt_requests, on by default), and the
	// server here is shared: an interrupted stream ends at once with an
	// empty answer and [DONE]. That passes through the proxy as sent; try
	// again, up to 4 times, for one the server completes.
	var events int
	var text strings.Builder
	done := false
	for attempt := 1; attempt <= 4; attempt++ {
		events, done = 0, false
		text.Reset()
		stream(t, ctx, px.URL, body, d.ID, wantModel, &events, &text, &done)
		t.Logf("attempt %d: streamed %d events: %q", attempt, events, text.String())
		if !done {
			t.Fatalf("stream without [DONE]")
		}
		if events >= 3 && strings.TrimSpace(text.String()) != "" {
			break
		}
	}
	if !done || events < 3 || strings.TrimSpace(text.String()) == "" {
		t.Fatalf("stream: %d events, [DONE] %v, text %q", events, done, text.String())
	}

	// A completion not streamed: the server's usage is recorded with it.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, px.URL+"/v1/chat/completions", strings.NewReader(`{"model":"x","max_tokens":4,"temperature":0,
		"metadata":{"conversation_id":"real-1"},"messages":[{"role":"user","content":"How many bags can I check on my economy ticket, and what does a second bag cost?"}]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var completion struct {
		Usage struct {
			PromptTokens     uint32 `json:"prompt_tokens"`
			CompletionTokens uint32 `json:"completion_tokens"`
		} `json:"usage"`
	}
	err = json.NewDecoder(resp.Body).Decode(&completion)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || completion.Usage.PromptTokens == 0 {
		t.Fatalf("completion: %s, usage %+v, %v", resp.Status, completion.Usage, err)
	}
	var last sink.RouteDecisionRow
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) { // recorded as the handler returns
		if rows := rec.rows(); len(rows) > 0 && !rows[len(rows)-1].Stream {
			last = rows[len(rows)-1]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no row for the completion: %+v", rec.rows())
		}
	}
	if !last.Usage || last.PromptTokens != completion.Usage.PromptTokens || last.CompletionTokens != completion.Usage.CompletionTokens {
		t.Fatalf("the completion's row %+v, want the usage the server sent, %+v", last, completion.Usage)
	}
	t.Logf("recorded usage: %d prompt, %d completion tokens", last.PromptTokens, last.CompletionTokens)
}

// rowsRecorder keeps the proxy's rows in memory (the store's writes are
// tested against ClickHouse in sink and by the proxy's other tests).
type rowsRecorder struct {
	mu sync.Mutex
	rs []sink.RouteDecisionRow
}

func (r *rowsRecorder) Record(row sink.RouteDecisionRow) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rs = append(r.rs, row)
}

func (r *rowsRecorder) rows() []sink.RouteDecisionRow {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rs)
}

// stream posts body to the proxy and reads its SSE answer, checking the
// decision headers and that every event names the model the proxy set.
func stream(t *testing.T, ctx context.Context, base, body, decision, wantModel string, events *int, text *strings.Builder, done *bool) {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("%s %v", resp.Status, resp.Header)
	}
	if resp.Header.Get(router.HeaderDecision) != decision || resp.Header.Get(router.HeaderModel) != wantModel {
		t.Fatalf("proxy headers %v, want the cached decision %s and model %s", resp.Header, decision, wantModel)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			*done = true
			return
		}
		var ch struct {
			Model   string `json:"model"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if ch.Model != wantModel {
			t.Fatalf("the upstream answered as model %q, want %q (the model the proxy set)", ch.Model, wantModel)
		}
		for _, c := range ch.Choices {
			text.WriteString(c.Delta.Content)
		}
		*events++
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
}
