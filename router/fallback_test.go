package router_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/router"
)

// vllmNotFound is vLLM's answer to a chat request for a model it does not serve.
const vllmNotFound = `{"object":"error","message":"The model ` + "`lora-ids`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}`

// scriptMissing makes the upstream route to lora-ids (label A) and answer
// a chat request for the model lora-ids with adapterReply, any other with
// reply.
func (f *fixture) scriptMissing(probs map[string]float64, adapterReply, reply llmtest.Reply) {
	f.up.Handle(func(req llmtest.Request) llmtest.Reply {
		switch {
		case req.Chat.Logprobs:
			return llmtest.Classification(probs)
		case req.Chat.Model == "lora-ids":
			return adapterReply
		}
		return reply
	})
}

var toAdapter = map[string]float64{"A": 0.9, "B": 0.1} // A = lora-ids, B = no adapter

// TestProxyFallsBackWhenTheAdapterIsMissing: a conversation routed to an
// adapter the upstream does not serve (vLLM restarted and forgot its
// runtime-loaded LoRA adapters: 404) is answered by the base model,
// streaming or not: the same body sent again with model = the base model,
// the base model's answer passed through, X-Trace-Adapter none, and the
// request's row recording the base model (adapter "") with the reason
// adapter_unavailable and the missing adapter named in its error.
func TestProxyFallsBackWhenTheAdapterIsMissing(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs testenv.SyncBuffer
	f := newFixtureWith(t, func(pc *router.ProxyConfig) {
		pc.Registerer, pc.Logger = reg, slog.New(slog.NewTextHandler(&logs, nil))
	}, adapterRow("lora-ids", "id_verification"))
	f.scriptMissing(toAdapter, llmtest.Reply{Status: http.StatusNotFound, Body: vllmNotFound}, llmtest.Text("the base model answers"))
	const body = `{"model":"x","messages":[{"role":"user","content":"verify me"}],"seed":7}`
	resp := f.post("/v1/chat/completions", body, map[string]string{router.HeaderConversation: "fb-1", "Authorization": "Bearer upstream-key"})
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(got), "the base model answers") {
		t.Fatalf("%s %s", resp.Status, got)
	}
	if a, m := resp.Header.Get(router.HeaderAdapter), resp.Header.Get(router.HeaderModel); a != "none" || m != baseModel {
		t.Fatalf("%s %q, %s %q; want none and %s", router.HeaderAdapter, a, router.HeaderModel, m, baseModel)
	}
	chats := f.upstreamChats()
	if len(chats) != 2 || chats[0].Chat.Model != "lora-ids" || chats[1].Chat.Model != baseModel {
		t.Fatalf("upstream requests %+v, want lora-ids then %s", chats, baseModel)
	}
	// The same request again: the caller's bytes with only the model swapped, and its headers.
	if want := bytes.Replace(chats[0].Body, []byte(`"lora-ids"`), []byte(`"`+baseModel+`"`), 1); !bytes.Equal(chats[1].Body, want) {
		t.Fatalf("fallback body\n%s\nwant\n%s", chats[1].Body, want)
	}
	if a := chats[1].Header.Get("Authorization"); a != "Bearer upstream-key" {
		t.Fatalf("fallback Authorization %q", a)
	}

	// Streaming: the 404's status line comes before any event; the base model's stream passes through.
	f.scriptMissing(toAdapter, llmtest.Reply{Status: http.StatusNotFound, Body: vllmNotFound}, llmtest.StreamText("Hel", "lo"))
	resp = f.post("/v1/chat/completions", `{"stream":true,"messages":[{"role":"user","content":"verify me"}]}`, map[string]string{router.HeaderConversation: "fb-2"})
	got, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || resp.Header.Get(router.HeaderAdapter) != "none" ||
		!strings.Contains(string(got), `"Hel"`) || !strings.Contains(string(got), "[DONE]") {
		t.Fatalf("stream: %s %v %s", resp.Status, resp.Header, got)
	}
	if n := len(f.upstreamChats()); n != 4 {
		t.Fatalf("%d upstream chat requests, want 4 (each conversation: the adapter, then the base model)", n)
	}
	rows := f.decisions(2)
	for i, r := range rows {
		if r.Adapter != "" || r.Capability != "" || r.Model != baseModel || r.Reason != router.ReasonAdapterUnavailable ||
			!strings.Contains(r.Error, "lora-ids") || r.Outcome != router.OutcomeOK || r.UpstreamStatus != 200 || r.Label != "A" || r.Stream != (i == 1) {
			t.Fatalf("row %d %+v", i, r)
		}
	}
	// Counted per adapter; logged once (within the minute), without the caller's Authorization.
	if n := fallbacks(t, reg, "lora-ids"); n != 2 {
		t.Fatalf("trace_router_adapter_fallbacks_total{adapter=lora-ids} = %v, want 2", n)
	}
	if out := logs.String(); strings.Count(out, "does not serve the adapter") != 1 || !strings.Contains(out, "adapter=lora-ids") ||
		!strings.Contains(out, "does not exist") || strings.Contains(out, "upstream-key") {
		t.Fatalf("log:\n%s", out)
	}
}

// TestFallbackThatFailsKeepsTheMissingAdapter: when the base model's
// answer to a fallback fails too (its stream cut, or an error event), the
// row keeps the missing adapter in its error, followed by the failure.
func TestFallbackThatFailsKeepsTheMissingAdapter(t *testing.T) {
	f := newFixture(t, adapterRow("lora-ids", "id_verification"))
	for i, st := range []llmtest.Stream{
		{Chunks: []string{"a", "b", "c"}, FailAfter: 1},
		{Chunks: []string{"a", "b", "c"}, FailAfter: 1, ErrorMessage: "engine overloaded"},
	} {
		f.scriptMissing(toAdapter, llmtest.Reply{Status: http.StatusNotFound, Body: vllmNotFound}, llmtest.Reply{Stream: &st})
		resp := f.post("/v1/chat/completions", `{"stream":true,"messages":[{"role":"user","content":"verify me"}]}`,
			map[string]string{router.HeaderConversation: fmt.Sprintf("fbf-%d", i)})
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		r := f.decisions(i + 1)[i]
		if r.Reason != router.ReasonAdapterUnavailable || r.Outcome != router.OutcomeStreamError ||
			!strings.Contains(r.Error, "lora-ids") || !strings.Contains(r.Error, "; then: ") {
			t.Fatalf("case %d: row %+v; want the missing adapter and then the stream's failure in its error", i, r)
		}
	}
}

// fallbacks is trace_router_adapter_fallbacks_total{adapter} in reg (0 when absent).
func fallbacks(t *testing.T, reg *prometheus.Registry, adapter string) float64 {
	t.Helper()
	return metricValue(t, reg, "trace_router_adapter_fallbacks_total", map[string]string{"adapter": adapter})
}

// metricValue is the value of the series of metric name with exactly the
// labels want in reg: a counter's value, a histogram's count; 0 when absent.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		if fam.GetName() != name {
			continue
		}
	series:
		for _, m := range fam.GetMetric() {
			if len(m.GetLabel()) != len(want) {
				continue
			}
			for _, l := range m.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestProxyFallbackOff: with router.fallback_on_missing_adapter false
// (NoAdapterFallback), the upstream's 404 for the adapter reaches the
// caller as it was sent, after one upstream request, recorded as the
// adapter's upstream error.
func TestProxyFallbackOff(t *testing.T) {
	f := newFixtureWith(t, func(pc *router.ProxyConfig) { pc.NoAdapterFallback = true }, adapterRow("lora-ids", "id_verification"))
	f.scriptMissing(toAdapter, llmtest.Reply{Status: http.StatusNotFound, Body: vllmNotFound}, llmtest.Text("the base model answers"))
	resp := f.post("/v1/chat/completions", `{"messages":[{"role":"user","content":"verify me"}]}`, map[string]string{router.HeaderConversation: "off-1"})
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || string(got) != vllmNotFound || resp.Header.Get(router.HeaderAdapter) != "lora-ids" {
		t.Fatalf("%s %s", resp.Status, got)
	}
	if n := len(f.upstreamChats()); n != 1 {
		t.Fatalf("%d upstream chat requests, want 1", n)
	}
	if r := f.decisions(1)[0]; r.Adapter != "lora-ids" || r.Reason != router.ReasonClassified || r.Outcome != router.OutcomeUpstreamError || r.UpstreamStatus != 404 {
		t.Fatalf("row %+v", r)
	}
}

// TestProxyPassesOtherErrorsThrough: only a 404 for an adapter is
// answered by the base model: a 500 for the adapter, and a 404 for the
// base model itself, reach the caller as the upstream sent them, after
// one upstream request each.
func TestProxyPassesOtherErrorsThrough(t *testing.T) {
	f := newFixture(t, adapterRow("lora-ids", "id_verification"))
	const overloaded = `{"error":{"message":"engine overloaded","type":"InternalServerError","code":500}}`
	f.scriptMissing(toAdapter, llmtest.Reply{Status: http.StatusInternalServerError, Body: overloaded}, llmtest.Text("the base model answers"))
	resp := f.post("/v1/chat/completions", `{"messages":[{"role":"user","content":"verify me"}]}`, map[string]string{router.HeaderConversation: "e-1"})
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 500 || string(got) != overloaded || resp.Header.Get(router.HeaderAdapter) != "lora-ids" {
		t.Fatalf("%s %s", resp.Status, got)
	}
	if n := len(f.upstreamChats()); n != 1 {
		t.Fatalf("%d upstream chat requests for a 500, want 1", n)
	}

	const baseMissing = `{"error":{"message":"The model base-model does not exist.","type":"NotFoundError","code":404}}`
	f.scriptMissing(map[string]float64{"A": 0.1, "B": 0.9}, llmtest.Text("adapter"), llmtest.Reply{Status: http.StatusNotFound, Body: baseMissing})
	resp = f.post("/v1/chat/completions", `{"messages":[{"role":"user","content":"verify me"}]}`, map[string]string{router.HeaderConversation: "e-2"})
	got, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || string(got) != baseMissing || resp.Header.Get(router.HeaderAdapter) != "none" {
		t.Fatalf("%s %s", resp.Status, got)
	}
	if n := len(f.upstreamChats()); n != 2 {
		t.Fatalf("%d upstream chat requests in all, want 2 (the base model's 404 not retried)", n)
	}
	rows := f.decisions(2)
	if r := rows[0]; r.Adapter != "lora-ids" || r.Outcome != router.OutcomeUpstreamError || r.UpstreamStatus != 500 || r.Reason != router.ReasonClassified {
		t.Fatalf("row %+v", r)
	}
	if r := rows[1]; r.Adapter != "" || r.Outcome != router.OutcomeUpstreamError || r.UpstreamStatus != 404 || r.Reason != router.ReasonClassified {
		t.Fatalf("row %+v", r)
	}
}
