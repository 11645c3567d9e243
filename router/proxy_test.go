package router_test

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/router"
	"github.com/traceops/trace/sink"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	baseModel = "base-model"
	env       = "sim-airline"
	token     = "proxy-secret"
)

// fixture is a router and proxy over a real ClickHouse store (registry and
// route_decisions) and one scriptable upstream that is both the classifier
// (requests with logprobs) and the engine serving the base model and the
// adapters, as one vLLM would be.
type fixture struct {
	t     *testing.T
	st    *sink.Store
	up    *llmtest.Server
	rec   *router.Recorder
	srv   *httptest.Server
	route *router.Router
}

func newFixture(t *testing.T, adapters ...sink.AdapterRow) *fixture {
	t.Helper()
	return newFixtureWith(t, nil, adapters...)
}

// newFixtureWith is newFixture with the proxy's configuration changed by
// set (nil: as newFixture).
func newFixtureWith(t *testing.T, set func(*router.ProxyConfig), adapters ...sink.AdapterRow) *fixture {
	t.Helper()
	st := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	for _, a := range adapters {
		if err := st.SaveAdapter(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	up := llmtest.New(t)
	cls, err := llm.New(llm.Config{BaseURL: up.URL, Model: baseModel, Timeout: 5 * time.Second, BackoffInitial: time.Millisecond, BackoffMax: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{BaseModel: baseModel}, cls, &router.Registry{Rows: st,
		Describe: func(_, _, c string) string { return "description of " + c }})
	if err != nil {
		t.Fatal(err)
	}
	rec := &router.Recorder{W: st, FlushEvery: 20 * time.Millisecond}
	pc := router.ProxyConfig{UpstreamURL: up.URL, BearerToken: token, DefaultEnvironment: env}
	if set != nil {
		set(&pc)
	}
	p, err := router.NewProxy(pc, r, rec)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = rec.Run(rctx); close(done) }()
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return &fixture{t: t, st: st, up: up, rec: rec, srv: srv, route: r}
}

func adapterRow(name, capability string) sink.AdapterRow {
	return sink.AdapterRow{Name: name, Capability: capability, Environment: env, AgentVersion: "1.0", BaseModel: baseModel, Status: "active", Version: 1}
}

// script makes the upstream answer classifications with probs and chat
// requests with reply.
func (f *fixture) script(probs map[string]float64, reply llmtest.Reply) {
	f.up.Handle(func(req llmtest.Request) llmtest.Reply {
		if req.Chat.Logprobs {
			if probs == nil {
				return llmtest.Reply{Content: "B"} // a server that returns no logprobs
			}
			return llmtest.Classification(probs)
		}
		return reply
	})
}

func (f *fixture) post(path, body string, hdr map[string]string) *http.Response {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(router.HeaderToken, token)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// decisions waits for n recorded rows of the environment.
func (f *fixture) decisions(n int) []sink.RouteDecisionRow {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rows, err := f.st.RouteDecisions(context.Background(), sink.RouteDecisionFilter{Environment: env})
		if err != nil {
			f.t.Fatal(err)
		}
		if len(rows) >= n || time.Now().After(deadline) {
			if len(rows) != n {
				f.t.Fatalf("%d route_decisions rows, want %d: %+v", len(rows), n, rows)
			}
			return rows
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// upstreamChats are the forwarded (non-classifier) requests.
func (f *fixture) upstreamChats() []llmtest.Request {
	var out []llmtest.Request
	for _, r := range f.up.Requests() {
		if !r.Chat.Logprobs {
			out = append(out, r)
		}
	}
	return out
}

const chatBody = `{"model":"whatever","messages":[{"role":"system","content":"You are an airline agent."},{"role":"user","content":"I need to change my flight"}],"temperature":0.3,"seed":7,"metadata":{"conversation_id":"conv-1"}}`

// TestProxyNoAdapterWins: "no adapter" has the highest probability, so the
// request goes upstream with the base model and everything else unchanged;
// the second request of the conversation uses the cached decision (one
// classification in all); both are recorded with the decision's id.
func TestProxyNoAdapterWins(t *testing.T) {
	f := newFixture(t, adapterRow("lora-ids", "id_verification"), adapterRow("lora-policy", "policy_lookup"))
	// A = id_verification, B = policy_lookup, C = no adapter.
	f.script(map[string]float64{"C": 0.6, "A": 0.3, "B": 0.1}, llmtest.Text("Sure, which flight?"))
	resp := f.post("/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer upstream-key"})
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "Sure, which flight?") {
		t.Fatalf("%s: %s", resp.Status, body)
	}
	if a := resp.Header.Get(router.HeaderAdapter); a != "none" {
		t.Fatalf("%s = %q, want none", router.HeaderAdapter, a)
	}
	decision := resp.Header.Get(router.HeaderDecision)
	if decision == "" {
		t.Fatal("no decision id header")
	}
	chats := f.upstreamChats()
	if len(chats) != 1 {
		t.Fatalf("%d forwarded requests", len(chats))
	}
	var sent map[string]any
	_ = json.Unmarshal(chats[0].Body, &sent)
	var orig map[string]any
	_ = json.Unmarshal([]byte(chatBody), &orig)
	orig["model"] = baseModel
	if a, b := mustJSON(t, sent), mustJSON(t, orig); a != b {
		t.Fatalf("forwarded body\n%s\nwant (only model changed)\n%s", a, b)
	}
	// Byte for byte: the caller's body with only the model's value spliced.
	if want := strings.Replace(chatBody, `"model":"whatever"`, `"model":"`+baseModel+`"`, 1); string(chats[0].Body) != want {
		t.Fatalf("forwarded bytes\n%s\nwant\n%s", chats[0].Body, want)
	}
	if got := chats[0].Header.Get("Authorization"); got != "Bearer upstream-key" {
		t.Fatalf("upstream Authorization %q", got)
	}
	if got := chats[0].Header.Get(router.HeaderToken); got != "" {
		t.Fatalf("the router's token leaked upstream: %q", got)
	}
	// The classifier saw the labels and the first user turn.
	var cls *llmtest.Request
	for _, r := range f.up.Requests() {
		if r.Chat.Logprobs {
			cls = &r
		}
	}
	if cls == nil || cls.Chat.MaxTokens != 1 || cls.Chat.Temperature == nil || *cls.Chat.Temperature != 0 || cls.Chat.TopLogprobs != 20 ||
		!strings.Contains(cls.Chat.Prompt(), "A: id_verification — description of id_verification") || !strings.Contains(cls.Chat.Prompt(), "I need to change my flight") {
		t.Fatalf("classifier request %+v", cls)
	}

	resp2 := f.post("/v1/chat/completions", chatBody, nil)
	io.Copy(io.Discard, resp2.Body)
	if resp2.Header.Get(router.HeaderDecision) != decision {
		t.Fatalf("second request: decision %q, want the cached %q", resp2.Header.Get(router.HeaderDecision), decision)
	}
	nCls := len(f.up.Requests()) - len(f.upstreamChats())
	if nCls != 1 {
		t.Fatalf("%d classifications for one conversation, want 1", nCls)
	}
	rows := f.decisions(2)
	if r := rows[0]; r.DecisionID != decision || r.Cached || r.Adapter != "" || r.Model != baseModel || r.Label != "C" || r.Reason != router.ReasonClassified ||
		r.ConversationID != "conv-1" || r.ConversationSource != router.SourceMetadata || r.Outcome != router.OutcomeOK || r.UpstreamStatus != 200 ||
		len(r.Probabilities) != 3 || math.Abs(r.Probabilities[2]-0.6) > 1e-9 {
		t.Fatalf("first row %+v", r)
	}
	if !rows[1].Cached || rows[1].DecisionID != decision {
		t.Fatalf("second row %+v", rows[1])
	}
}

// TestProxyRequestIDs: a caller's X-Request-Id is recorded with the
// request's row, passed upstream unchanged and echoed back; without one,
// the router's request id goes upstream and back instead. One that is not
// a plain token passes and is echoed but is not recorded. POST /v1/route
// records and answers the ids too.
func TestProxyRequestIDs(t *testing.T) {
	f := newFixture(t, adapterRow("lora-ids", "id_verification"))
	f.script(map[string]float64{"A": 0.1, "B": 0.9}, llmtest.Text("ok"))
	long := strings.Repeat("x", 129)
	for i, tc := range []struct {
		sent, recorded string
	}{
		{"caller-0001", "caller-0001"},
		{"", ""},
		{"has a space", ""},
		{long, ""},
	} {
		hdr := map[string]string{router.HeaderConversation: fmt.Sprint("rid-", i)}
		if tc.sent != "" {
			hdr[router.HeaderRequestID] = tc.sent
		}
		resp := f.post("/v1/chat/completions", chatBody, hdr)
		io.Copy(io.Discard, resp.Body)
		rows := f.decisions(i + 1)
		row := rows[len(rows)-1]
		chats := f.upstreamChats()
		up := chats[len(chats)-1].Header.Get(router.HeaderRequestID)
		want := cmp.Or(tc.sent, row.RequestID)
		if resp.StatusCode != 200 || row.ClientRequestID != tc.recorded || row.RequestID == "" ||
			resp.Header.Get(router.HeaderRequestID) != want || up != want {
			t.Errorf("X-Request-Id %.20q: %d, recorded %q (request_id %q); answered X-Request-Id %.20q; upstream got %.20q; want %.20q recorded",
				tc.sent, resp.StatusCode, row.ClientRequestID, row.RequestID, resp.Header.Get(router.HeaderRequestID), up, tc.recorded)
		}
	}
	// Found by the caller's id.
	got, err := f.st.RouteDecisions(context.Background(), sink.RouteDecisionFilter{ClientRequestID: "caller-0001"})
	if err != nil || len(got) != 1 || got[0].ConversationID != "rid-0" {
		t.Fatalf("rows by client_request_id: %+v %v", got, err)
	}
	resp := f.post("/v1/route", `{"environment":"`+env+`","messages":[{"role":"user","content":"hi"}]}`, map[string]string{router.HeaderRequestID: "route-7"})
	io.Copy(io.Discard, resp.Body)
	rows := f.decisions(5)
	if r := rows[len(rows)-1]; resp.StatusCode != 200 || r.Endpoint != "route" || r.ClientRequestID != "route-7" ||
		resp.Header.Get(router.HeaderRequestID) != "route-7" {
		t.Fatalf("/v1/route: %d %+v; headers %v", resp.StatusCode, r, resp.Header)
	}
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRouteTopPKeepsTwoAdapters: two adapters together reach p = 0.95, so
// both are recorded with renormalised weights; the top one is served.
func TestRouteTopPKeepsTwoAdapters(t *testing.T) {
	f := newFixture(t, adapterRow("lora-ids", "id_verification"), adapterRow("lora-policy", "policy_lookup"), adapterRow("lora-pay", "payment"))
	// A = id_verification, B = payment, C = policy_lookup, D = none.
	f.script(map[string]float64{"C": 0.55, " A": 0.42, "D": 0.02, "Hello": 0.01}, llmtest.Text("ok"))
	resp := f.post("/v1/route", `{"environment":"`+env+`","conversation_id":"c-7","messages":[{"role":"user","content":[{"type":"text","text":"what is the baggage policy?"}]}]}`, nil)
	var got router.RouteResponse
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%s %v", resp.Status, err)
	}
	if got.Adapter == nil || *got.Adapter != "lora-policy" || got.Cached || got.Reason != router.ReasonClassified {
		t.Fatalf("route %+v", got)
	}
	sum := 0.0
	for _, p := range got.Probabilities {
		sum += p
	}
	if math.Abs(sum-1) > 1e-9 || len(got.Probabilities) != 4 || got.Labels["C"] != "policy_lookup" || got.Labels["D"] != router.NoAdapterCapability {
		t.Fatalf("probabilities %v (sum %v), labels %v", got.Probabilities, sum, got.Labels)
	}
	if len(got.Weights) != 2 || got.Weights[0].Adapter != "lora-policy" || got.Weights[1].Adapter != "lora-ids" ||
		math.Abs(got.Weights[0].Weight-0.55/0.97) > 1e-9 || math.Abs(got.Weights[0].Weight+got.Weights[1].Weight-1) > 1e-9 {
		t.Fatalf("weights %+v", got.Weights)
	}
	// The proxy serves the top adapter for the same conversation (header id).
	resp = f.post("/v1/chat/completions", `{"messages":[{"role":"user","content":"what is the baggage policy?"}]}`, map[string]string{router.HeaderConversation: "c-7"})
	io.Copy(io.Discard, resp.Body)
	if resp.Header.Get(router.HeaderAdapter) != "lora-policy" || resp.Header.Get(router.HeaderDecision) != got.DecisionID {
		t.Fatalf("proxy headers %v", resp.Header)
	}
	if chats := f.upstreamChats(); len(chats) != 1 || chats[0].Chat.Model != "lora-policy" {
		t.Fatalf("forwarded %+v", chats)
	}
	rows := f.decisions(2)
	if r := rows[0]; r.Endpoint != "route" || r.Outcome != router.OutcomeRouted || strings.Join(r.WeightAdapters, ",") != "lora-policy,lora-ids" || r.ConversationSource != router.SourceRequest {
		t.Fatalf("route row %+v", r)
	}
	if r := rows[1]; r.Endpoint != "proxy" || !r.Cached || r.Adapter != "lora-policy" || r.Capability != "policy_lookup" {
		t.Fatalf("proxy row %+v", r)
	}
	// Without the router's token: 401, nothing forwarded.
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+token) // Authorization is the upstream's, not the router's
	r401, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r401.Body.Close()
	if r401.StatusCode != http.StatusUnauthorized || len(f.upstreamChats()) != 1 {
		t.Fatalf("without %s: %s", router.HeaderToken, r401.Status)
	}
	// The token with its scheme, in any case (RFC 7235): accepted.
	for _, v := range []string{"Bearer " + token, "bearer " + token} {
		resp := f.post("/v1/chat/completions", chatBody, map[string]string{router.HeaderToken: v})
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %q: %s", router.HeaderToken, v, resp.Status)
		}
	}
}

// TestProxyNoLogprobs: a classifier that returns no logprobs routes to the
// base model with the reason recorded; the caller gets its answer.
func TestProxyNoLogprobs(t *testing.T) {
	f := newFixture(t, adapterRow("lora-ids", "id_verification"))
	f.script(nil, llmtest.Text("hello"))
	resp := f.post("/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, nil)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "hello") || resp.Header.Get(router.HeaderAdapter) != "none" {
		t.Fatalf("%s %v %s", resp.Status, resp.Header, body)
	}
	if chats := f.upstreamChats(); len(chats) != 1 || chats[0].Chat.Model != baseModel {
		t.Fatalf("forwarded %+v", chats)
	}
	rows := f.decisions(1)
	if r := rows[0]; r.Reason != router.ReasonNoLogprobs || r.Adapter != "" || len(r.Probabilities) != 0 || r.ConversationSource != router.SourceHash ||
		!strings.HasPrefix(r.ConversationID, "sha256:") || r.Outcome != router.OutcomeOK {
		t.Fatalf("row %+v", r)
	}
}

// TestProxyUpstreamFailsMidStream: the upstream streams two chunks and then
// an error event; the caller receives the chunks as they come and the
// upstream's error, and the decision is recorded with outcome
// stream_error. A stream cut without an error event reaches the caller as
// a broken stream, recorded the same way.
func TestProxyUpstreamFailsMidStream(t *testing.T) {
	f := newFixture(t, adapterRow("lora-ids", "id_verification"))
	f.script(map[string]float64{"A": 0.9, "B": 0.1}, llmtest.Reply{Stream: &llmtest.Stream{Chunks: []string{"Hel", "lo", " there"},
		Interval: 150 * time.Millisecond, FailAfter: 2, ErrorMessage: "engine crashed: CUDA out of memory"}})
	start := time.Now()
	resp := f.post("/v1/chat/completions", `{"stream":true,"messages":[{"role":"user","content":"verify me"}]}`, map[string]string{router.HeaderConversation: "s-1"})
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || resp.Header.Get(router.HeaderAdapter) != "lora-ids" {
		t.Fatalf("%s %v", resp.Status, resp.Header)
	}
	sc := bufio.NewScanner(resp.Body)
	var events []string
	var firstAt time.Duration
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") {
			if len(events) == 0 {
				firstAt = time.Since(start)
			}
			events = append(events, line)
		}
	}
	if len(events) != 3 || !strings.Contains(events[0], `"Hel"`) || !strings.Contains(events[1], `"lo"`) ||
		!strings.Contains(events[2], `"error"`) || !strings.Contains(events[2], "CUDA out of memory") {
		t.Fatalf("events %q", events)
	}
	// The first chunk arrived before the upstream sent the second (150ms
	// later): it was not buffered.
	if total := time.Since(start); firstAt >= total-100*time.Millisecond {
		t.Fatalf("first event after %v of %v: the stream was buffered", firstAt, total)
	}
	rows := f.decisions(1)
	if r := rows[0]; r.Outcome != router.OutcomeStreamError || !r.Stream || r.Adapter != "lora-ids" || r.UpstreamStatus != 200 {
		t.Fatalf("row %+v", r)
	}

	// Cut without an error event.
	f.script(map[string]float64{"A": 0.9, "B": 0.1}, llmtest.Reply{Stream: &llmtest.Stream{Chunks: []string{"a", "b", "c"}, FailAfter: 1}})
	resp = f.post("/v1/chat/completions", `{"stream":true,"messages":[{"role":"user","content":"verify me"}]}`, map[string]string{router.HeaderConversation: "s-2"})
	data, err := io.ReadAll(resp.Body)
	if err == nil || !bytes.Contains(data, []byte(`"a"`)) || bytes.Contains(data, []byte("[DONE]")) {
		t.Fatalf("cut stream: read %q, err %v; want the first chunk and then an error", data, err)
	}
	rows = f.decisions(2)
	if r := rows[1]; r.Outcome != router.OutcomeStreamError || r.ConversationID != "s-2" {
		t.Fatalf("row %+v", r)
	}
}

// TestProxyUpstreamErrorPassesThrough: an upstream error status and body
// reach the caller unchanged, and an unreachable upstream is a 502 in the
// OpenAI error shape; both are recorded.
func TestProxyUpstreamErrorPassesThrough(t *testing.T) {
	f := newFixture(t) // no adapters: nothing to classify
	const errBody = `{"error":{"message":"The model lora-x does not exist.","type":"NotFoundError","code":404}}`
	f.script(nil, llmtest.Reply{Status: 404, Body: errBody, Header: map[string]string{"X-Upstream": "yes"}})
	resp := f.post("/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, nil)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || string(body) != errBody || resp.Header.Get("X-Upstream") != "yes" {
		t.Fatalf("%s %q", resp.Status, body)
	}
	f.up.Close()
	resp = f.post("/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, nil)
	body, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), `"upstream_error"`) || !strings.Contains(string(body), `"param":null`) || strings.Contains(string(body), "127.0.0.1") {
		t.Fatalf("%s %q (the upstream's address is the operator's, not the caller's)", resp.Status, body)
	}
	rows := f.decisions(2)
	if !strings.Contains(string(body), "request_id "+rows[1].RequestID) || !strings.Contains(rows[1].Error, "connect") {
		t.Fatalf("502 %q, row %+v: want the row's request id in the answer and the cause in the row", body, rows[1])
	}
	if rows[0].Outcome != router.OutcomeUpstreamError || rows[0].UpstreamStatus != 404 || rows[0].Reason != router.ReasonNoAdapters ||
		rows[1].Outcome != router.OutcomeUnreachable {
		t.Fatalf("rows %+v", rows)
	}
}

// TestProxyRedirectPassesThrough: an upstream's redirect reaches the caller
// as it is (the proxy does not follow it: where to go is the caller's call).
func TestProxyRedirectPassesThrough(t *testing.T) {
	f := newFixture(t)
	f.script(nil, llmtest.Reply{Status: http.StatusTemporaryRedirect, Body: `{}`, Header: map[string]string{"Location": "/v1/elsewhere"}})
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set(router.HeaderToken, token)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusTemporaryRedirect || resp.Header.Get("Location") != "/v1/elsewhere" {
		t.Fatalf("%s, Location %q", resp.Status, resp.Header.Get("Location"))
	}
	if n := len(f.upstreamChats()); n != 1 {
		t.Fatalf("%d upstream requests, want 1 (the redirect not followed)", n)
	}
}

// TestProxyRecordsTokenUsage: the upstream's usage of a completion, and of
// a stream that asked for it (stream_options.include_usage), is recorded
// with the request; a stream that did not ask, an answer without usage and
// an upstream error record none (NULL).
func TestProxyRecordsTokenUsage(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := newFixtureWith(t, func(pc *router.ProxyConfig) { pc.Registerer = reg }, adapterRow("lora-ids", "id_verification"))
	probs := map[string]float64{"A": 0.9, "B": 0.1}
	for i, tc := range []struct {
		name, body string
		reply      llmtest.Reply
		prompt     uint32 // 0: none recorded
		completion uint32
	}{
		{"completion", `{"messages":[{"role":"user","content":"verify me"}]}`,
			llmtest.Reply{Content: "Verified.", PromptTokens: 321, CompletionTokens: 45}, 321, 45},
		{"stream with include_usage", `{"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"verify me"}]}`,
			llmtest.Reply{Stream: &llmtest.Stream{Chunks: []string{"Veri", "fied."}}, PromptTokens: 77, CompletionTokens: 2}, 77, 2},
		{"stream without include_usage", `{"stream":true,"messages":[{"role":"user","content":"verify me"}]}`,
			llmtest.Reply{Stream: &llmtest.Stream{Chunks: []string{"Veri", "fied."}}, PromptTokens: 77, CompletionTokens: 2}, 0, 0},
		{"completion without usage", `{"messages":[{"role":"user","content":"verify me"}]}`,
			llmtest.Reply{Content: "Verified.", NoUsage: true}, 0, 0},
		{"upstream error", `{"messages":[{"role":"user","content":"verify me"}]}`,
			llmtest.Reply{Status: 400, Body: `{"error":{"message":"bad"},"usage":{"prompt_tokens":5,"completion_tokens":0}}`}, 0, 0},
	} {
		f.script(probs, tc.reply)
		resp := f.post("/v1/chat/completions", tc.body, map[string]string{router.HeaderConversation: "u-" + strconv.Itoa(i)})
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		r := f.decisions(i + 1)[i]
		if tc.prompt == 0 {
			if r.Usage || r.PromptTokens != 0 || r.CompletionTokens != 0 {
				t.Errorf("%s: usage %d/%d recorded, want none", tc.name, r.PromptTokens, r.CompletionTokens)
			}
			continue
		}
		if !r.Usage || r.PromptTokens != tc.prompt || r.CompletionTokens != tc.completion || r.Outcome != router.OutcomeOK {
			t.Errorf("%s: row %+v, want usage %d/%d", tc.name, r, tc.prompt, tc.completion)
		}
	}
	// The same in the metrics: requests by outcome, the reported tokens,
	// the proxy's own time of each request.
	for _, m := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"trace_router_requests_total", map[string]string{"endpoint": "proxy", "adapter": "lora-ids", "outcome": "ok"}, 4},
		{"trace_router_requests_total", map[string]string{"endpoint": "proxy", "adapter": "lora-ids", "outcome": "upstream_error"}, 1},
		{"trace_router_tokens_total", map[string]string{"adapter": "lora-ids", "kind": "prompt"}, 321 + 77},
		{"trace_router_tokens_total", map[string]string{"adapter": "lora-ids", "kind": "completion"}, 45 + 2},
		{"trace_router_overhead_seconds", nil, 5},
	} {
		if got := metricValue(t, reg, m.name, m.labels); got != m.want {
			t.Errorf("%s%v = %v, want %v", m.name, m.labels, got, m.want)
		}
	}
}

// TestProxyForwarding: the caller's query string reaches the upstream;
// headers its Connection header names do not; nor does its Accept-Encoding
// (the OpenAI SDK asks for gzip): an upstream that would compress answers
// plain, so its usage is recorded, and the caller gets the answer plain.
func TestProxyForwarding(t *testing.T) {
	var mu sync.Mutex
	var query, hop, acceptEnc string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet { // the model list, passed through
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"object":"list","data":[{"id":"base-model","object":"model"},{"id":"lora-ids","object":"model","path":"`+r.URL.Path+`"}]}`)
			return
		}
		mu.Lock()
		query, hop, acceptEnc = r.URL.RawQuery, r.Header.Get("X-Hop-Secret"), r.Header.Get("Accept-Encoding")
		mu.Unlock()
		body := `{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}`
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			io.WriteString(zw, body)
			zw.Close()
			return
		}
		io.WriteString(w, body)
	}))
	t.Cleanup(up.Close)
	f := newFixtureWith(t, func(pc *router.ProxyConfig) { pc.UpstreamURL, pc.Passthrough = up.URL, router.DefaultPassthrough }, adapterRow("lora-ids", "id_verification"))
	f.script(map[string]float64{"A": 0.9, "B": 0.1}, llmtest.Reply{})
	resp := f.post("/v1/chat/completions?api-version=2024-02-01", `{"messages":[{"role":"user","content":"verify me"}]}`,
		map[string]string{"Accept-Encoding": "gzip", "Connection": "keep-alive, X-Hop-Secret", "X-Hop-Secret": "zzz", router.HeaderConversation: "fwd-1"})
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "" || !strings.Contains(string(b), `"prompt_tokens":11`) {
		t.Fatalf("answer %d %q (Content-Encoding %q), %v; want it plain", resp.StatusCode, b, resp.Header.Get("Content-Encoding"), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if query != "api-version=2024-02-01" || hop != "" || acceptEnc != "" {
		t.Fatalf("the upstream saw query %q, X-Hop-Secret %q, Accept-Encoding %q", query, hop, acceptEnc)
	}
	if r := f.decisions(1)[0]; !r.Usage || r.PromptTokens != 11 || r.CompletionTokens != 3 {
		t.Fatalf("row %+v, want usage 11/3", r)
	}
	// GET /v1/models is the upstream's list (OpenAI clients' models.list(),
	// health checks), nothing routed or recorded.
	req, _ := http.NewRequest(http.MethodGet, f.srv.URL+"/v1/models", nil)
	req.Header.Set(router.HeaderToken, token)
	mresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if mresp.StatusCode != 200 || !strings.Contains(string(mb), `"id":"lora-ids"`) || !strings.Contains(string(mb), `"path":"/models"`) {
		t.Fatalf("GET /v1/models: %d %s", mresp.StatusCode, mb)
	}
	if n := len(f.decisions(1)); n != 1 {
		t.Fatalf("%d rows after GET /v1/models, want the chat request's only", n)
	}
}

// TestProxyPassthrough: router.passthrough's endpoints (embeddings, the
// legacy completions streamed, the Responses API) pass through with the
// caller's method, path, query, headers and body unchanged (its model
// too), the answer streamed back as the upstream sent it; nothing is
// routed or recorded, and each is counted by endpoint and outcome. The
// routed paths answer other methods 405; a body over the limit is a 413;
// the router's token still guards them; the engine's administration
// (vLLM's adapter loads) is not passed, nor is another method.
func TestProxyPassthrough(t *testing.T) {
	type seen struct{ method, path, query, body, auth string }
	var mu sync.Mutex
	var got []seen
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return // a body broken off: no request to serve
		}
		mu.Lock()
		got = append(got, seen{r.Method, r.URL.Path, r.URL.RawQuery, string(b), r.Header.Get("Authorization")})
		mu.Unlock()
		switch r.URL.Path {
		case "/v1/completions":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				io.WriteString(w, `data: {"choices":[{"text":"t`+strconv.Itoa(i)+`"}]}`+"\n\n")
				w.(http.Flusher).Flush()
			}
			io.WriteString(w, "data: [DONE]\n\n")
		case "/v1/responses":
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"model not found","type":"invalid_request_error"}}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Upstream", "yes")
			io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}]}`)
		}
	}))
	t.Cleanup(up.Close)
	reg := prometheus.NewRegistry()
	f := newFixtureWith(t, func(pc *router.ProxyConfig) {
		pc.UpstreamURL, pc.Registerer, pc.MaxBodyBytes, pc.Passthrough = up.URL+"/v1", reg, 4096, router.DefaultPassthrough
	}, adapterRow("lora-ids", "id_verification"))

	embed := `{"model":"text-embed-1","input":["a",  "b"]}`
	resp := f.post("/v1/embeddings?api-version=x", embed, map[string]string{"Authorization": "Bearer sk-caller"})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("X-Upstream") != "yes" || !strings.Contains(string(b), `"embedding":[0.5]`) {
		t.Fatalf("POST /v1/embeddings: %d %s", resp.StatusCode, b)
	}
	resp = f.post("/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, nil)
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || strings.Count(string(b), "data: ") != 4 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("POST /v1/completions (stream): %d %q", resp.StatusCode, b)
	}
	resp = f.post("/v1/responses", `{"model":"nope","input":"hi"}`, nil)
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "model not found") {
		t.Fatalf("POST /v1/responses: %d %s, want the upstream's 400", resp.StatusCode, b)
	}
	mu.Lock()
	want := []seen{
		{"POST", "/v1/embeddings", "api-version=x", embed, "Bearer sk-caller"},
		{"POST", "/v1/completions", "", `{"model":"m","prompt":"hi","stream":true}`, ""},
		{"POST", "/v1/responses", "", `{"model":"nope","input":"hi"}`, ""},
	}
	if len(got) != len(want) {
		t.Fatalf("the upstream saw %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("upstream request %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	mu.Unlock()

	// Refused before the upstream: another method on a routed path, a
	// body over the limit, no token, a path outside /v1/.
	for _, c := range []struct {
		method, path, body string
		token              bool
		status             int
	}{
		{http.MethodGet, "/v1/chat/completions", "", true, http.StatusMethodNotAllowed},
		{http.MethodPut, "/v1/route", "{}", true, http.StatusMethodNotAllowed},
		{http.MethodPost, "/v1/embeddings", strings.Repeat("x", 5000), true, http.StatusRequestEntityTooLarge},
		{http.MethodPost, "/v1/embeddings", embed, false, http.StatusUnauthorized},
		{http.MethodGet, "/v2/models", "", true, http.StatusNotFound},
		// Not an inference endpoint of router.passthrough: the engine's
		// administration never gets the router's upstream key.
		{http.MethodPost, "/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/etc"}`, true, http.StatusNotFound},
		{http.MethodPost, "/v1/unload_lora_adapter", `{"lora_name":"lora-ids"}`, true, http.StatusNotFound},
		{http.MethodGet, "/v1/embeddings", "", true, http.StatusNotFound},
	} {
		req, _ := http.NewRequest(c.method, f.srv.URL+c.path, strings.NewReader(c.body))
		if c.token {
			req.Header.Set(router.HeaderToken, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct{ Message, Type string }
		}
		if resp.StatusCode != c.status || json.Unmarshal(b, &e) != nil || e.Error.Message == "" {
			t.Fatalf("%s %s: %d %s, want %d with an OpenAI error", c.method, c.path, resp.StatusCode, b, c.status)
		}
		if c.status == http.StatusMethodNotAllowed && resp.Header.Get("Allow") != http.MethodPost {
			t.Fatalf("%s %s: Allow %q", c.method, c.path, resp.Header.Get("Allow"))
		}
	}
	// A body of unknown length (chunked) over the limit: refused as it
	// streams, the upstream's request broken off.
	pr, pw := io.Pipe()
	go func() { pw.Write([]byte(strings.Repeat("x", 10000))); pw.Close() }()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/embeddings", pr)
	req.Header.Set(router.HeaderToken, token)
	cresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := io.ReadAll(cresp.Body)
	cresp.Body.Close()
	if cresp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked body over the limit: %d %s, want 413", cresp.StatusCode, cb)
	}
	mu.Lock()
	if len(got) != len(want) {
		t.Fatalf("the upstream saw %d requests, want %d: refused ones reached it", len(got), len(want))
	}
	mu.Unlock()
	for _, c := range []struct {
		endpoint, outcome string
		n                 float64
	}{{"POST /v1/embeddings", "ok", 1}, {"POST /v1/completions", "ok", 1}, {"POST /v1/responses", "upstream_error", 1}, {"POST /v1/embeddings", "refused", 2}} {
		if v := metricValue(t, reg, "trace_router_passthrough_total", map[string]string{"endpoint": c.endpoint, "outcome": c.outcome}); v != c.n {
			t.Fatalf("trace_router_passthrough_total{%s,%s} = %v, want %v", c.endpoint, c.outcome, v, c.n)
		}
	}
	time.Sleep(100 * time.Millisecond) // five flush periods of the recorder
	rows, err := f.st.RouteDecisions(context.Background(), sink.RouteDecisionFilter{Environment: env})
	if err != nil || len(rows) != 0 {
		t.Fatalf("%d route_decisions rows (%v), want none for passed-through requests", len(rows), err)
	}
}

// TestCheckPassthrough: router.passthrough's patterns are checked at start.
func TestCheckPassthrough(t *testing.T) {
	for _, tc := range []struct {
		patterns []string
		err      string
	}{
		{router.DefaultPassthrough, ""},
		{nil, ""},
		{[]string{"POST /v1/audio/transcriptions", "GET /v1/files/{id}"}, ""},
		{[]string{"/v1/embeddings"}, "is not \"METHOD /v1/path\""},
		{[]string{"post /v1/embeddings"}, "is not \"METHOD /v1/path\""},
		{[]string{"POST /embeddings"}, "is not \"METHOD /v1/path\""},
		{[]string{"POST /v1/"}, "is not \"METHOD /v1/path\""},
		{[]string{"POST /v1/chat/completions"}, "conflicts"},
		{[]string{"POST /v1/embeddings", "POST /v1/embeddings"}, "conflicts"},
		{[]string{"POST /v1/{bad"}, "router.passthrough"},
	} {
		err := router.CheckPassthrough(tc.patterns)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("CheckPassthrough(%q) = %v, want %q", tc.patterns, err, tc.err)
		}
	}
}

// TestProxyStreamEndsAtDone: a caller that hangs up once it has read a
// stream's [DONE] (as SDKs do), while the upstream has not yet ended the
// body, got a whole stream: its row records the usage of the last chunk
// and outcome ok, not canceled without usage (the upstream read failing
// with the caller's context was taken for a broken stream).
func TestProxyStreamEndsAtDone(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}`+"\n\n")
		io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}`+"\n\n")
		io.WriteString(w, "data: [DONE]\n\n")
		w.(http.Flusher).Flush()
		select { // the body's end comes late: after the caller has gone
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release); up.Close() })
	f := newFixtureWith(t, func(pc *router.ProxyConfig) { pc.UpstreamURL = up.URL }, adapterRow("lora-ids", "id_verification"))
	f.script(map[string]float64{"A": 0.9, "B": 0.1}, llmtest.Reply{})
	resp := f.post("/v1/chat/completions", `{"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"verify me"}]}`,
		map[string]string{router.HeaderConversation: "done-1"})
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && sc.Text() != "data: [DONE]" {
	}
	resp.Body.Close() // hangs up, as a client done with the stream
	r := f.decisions(1)[0]
	if r.Outcome != router.OutcomeOK || !r.Usage || r.PromptTokens != 12 || r.CompletionTokens != 1 {
		t.Fatalf("row outcome %s usage %v %d/%d (%s), want ok with 12/1", r.Outcome, r.Usage, r.PromptTokens, r.CompletionTokens, r.Error)
	}
}

// TestProxyConversationIDHeaderIsValid: a conversation id named in the
// body's metadata, which may hold any JSON string, goes back in
// X-Trace-Conversation-Id as a valid header value: its control characters
// percent-encoded (written raw, they made Go's, Node's and the OpenAI
// Python SDK's clients drop the whole answer as a malformed response,
// after the upstream had generated it, and the SDK retried it twice).
// route_decisions and /v1/route's conversation_id keep the id as sent.
func TestProxyConversationIDHeaderIsValid(t *testing.T) {
	f := newFixture(t, adapterRow("lora-ids", "id_verification"))
	f.script(map[string]float64{"A": 0.9, "B": 0.1}, llmtest.Text("ok"))
	for i, tc := range []struct{ id, header string }{
		{"nul\x00x", "nul%00x"},
		{"a\x01b\x7fc\r\nd", "a%01b%7Fc%0D%0Ad"},
		{"tab\tand 50% café", "tab\tand 50% café"}, // valid: as it is
	} {
		body := `{"model":"m","metadata":{"conversation_id":` + mustJSON(t, tc.id) + `},"messages":[{"role":"user","content":"hello ` + strconv.Itoa(i) + `"}]}`
		for _, path := range []string{"/v1/chat/completions", "/v1/route"} {
			if path == "/v1/route" {
				body = `{"environment":"` + env + `","conversation_id":` + mustJSON(t, tc.id) + `,"messages":[{"role":"user","content":"hello"}]}`
			}
			req, _ := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(body))
			req.Header.Set(router.HeaderToken, token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s with conversation id %q: %v", path, tc.id, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got := resp.Header.Get(router.HeaderConversation); resp.StatusCode != 200 || got != tc.header {
				t.Errorf("%s with conversation id %q: %d, %s %q, want %q", path, tc.id, resp.StatusCode, router.HeaderConversation, got, tc.header)
			}
			if path == "/v1/route" && !strings.Contains(string(b), `"conversation_id":`+mustJSON(t, tc.id)) {
				t.Errorf("/v1/route with conversation id %q answered %s", tc.id, b)
			}
		}
	}
	for _, r := range f.decisions(6) {
		if strings.Contains(r.ConversationID, "%") && !strings.Contains(r.ConversationID, "50%") {
			t.Errorf("row's conversation_id %q: want the id as sent", r.ConversationID)
		}
	}
}

// TestProxyRetriesAConnectionTheUpstreamClosedIdle: an upstream closes a
// kept-alive connection just as the proxy sends the next request on it
// (vLLM's and llama.cpp's servers close connections idle for 5 s, the
// proxy keeps them for 90 s): the upstream has read the request and
// answers nothing, as when its keep-alive timer fired. The request is
// sent again on a new connection, as Go's transport does for an idempotent
// request, and the caller gets its answer, not a 502.
func TestProxyRetriesAConnectionTheUpstreamClosedIdle(t *testing.T) {
	type connKey struct{}
	var served, dropped, marked atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if _, ok := r.Header["X-Idempotency-Key"]; ok {
			marked.Add(1) // the mark is the transport's, never sent
		}
		if n := r.Context().Value(connKey{}).(*atomic.Int64); n.Add(1) == 2 {
			// The second request on a connection: closed unanswered.
			dropped.Add(1)
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	up.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, new(atomic.Int64))
	}
	up.Start()
	t.Cleanup(up.Close)
	f := newFixtureWith(t, func(pc *router.ProxyConfig) { pc.UpstreamURL, pc.Passthrough = up.URL, router.DefaultPassthrough })
	const n = 24 // the proxy's 8 connection pools used in turn: each reuses connections
	for i := range n {
		path := "/v1/chat/completions"
		if i%2 == 1 {
			path = "/v1/embeddings" // passed through: its body is read whole, and sent again too
		}
		resp := f.post(path, `{"messages":[{"role":"user","content":"hi `+strconv.Itoa(i)+`"}]}`, nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d (%s): %d %s", i, path, resp.StatusCode, b)
		}
	}
	if dropped.Load() == 0 || served.Load() != n || marked.Load() != 0 {
		t.Fatalf("the upstream dropped %d requests and answered %d (%d with X-Idempotency-Key), want some dropped, all %d answered, none with it",
			dropped.Load(), served.Load(), marked.Load(), n)
	}
}

// TestRouteRefusesABodyThatIsNoObject: POST /v1/route with a body that is
// not a JSON object (null decodes into an empty request without an error)
// is a 400 in OpenAI's error shape, not a decision for no messages.
func TestRouteRefusesABodyThatIsNoObject(t *testing.T) {
	f := newFixture(t, adapterRow("lora-ids", "id_verification"))
	f.script(map[string]float64{"A": 0.9, "B": 0.1}, llmtest.Text("ok"))
	for _, body := range []string{"null", " null\n", "", "[]", `"x"`} {
		resp := f.post("/v1/route", body, map[string]string{router.HeaderEnvironment: env})
		b, _ := io.ReadAll(resp.Body)
		var e struct {
			Error struct {
				Message, Type string
			} `json:"error"`
		}
		if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error.Message, "route request") {
			t.Errorf("POST /v1/route %q: %d %s, want 400 with OpenAI's error naming the route request", body, resp.StatusCode, b)
		}
	}
}
