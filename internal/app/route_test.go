package app_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/router"
	"github.com/traceops/trace/sink"
)

// TestRouteRoleDrainsAndRecords: trace run's route role serves the proxy
// on router.addr; a stream in flight at shutdown completes (drained), and
// its decision reaches route_decisions after it, before Run returns.
func TestRouteRoleDrainsAndRecords(t *testing.T) {
	_, stop, cfg, resp := startStreamingRoute(t, []string{"one", "two", "three"}, 300*time.Millisecond, 0)
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }() // SIGTERM while the stream is in flight
	body, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(body), `"three"`) || !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("stream cut by shutdown: %q, %v", body, err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("run: %v", err)
	}
	rows := routeDecisions(t, cfg)
	if len(rows) != 1 || rows[0].Adapter != "lora-1" || rows[0].Outcome != router.OutcomeOK || !rows[0].Stream {
		t.Fatalf("rows %+v", rows)
	}
}

// TestRouteRoleMaxBodyBytes: router.max_body_bytes is the proxy's body
// limit, and the 413 names it.
func TestRouteRoleMaxBodyBytes(t *testing.T) {
	a, stop, _, _ := startRoute(t, func(llmtest.Request) llmtest.Reply { return llmtest.Text("ok") }, func(cfg *config.Config) {
		cfg.Router.MaxBodyBytes = 64 << 10
	})
	defer stop()
	for _, tc := range []struct {
		size int
		want int
	}{{60 << 10, http.StatusOK}, {70 << 10, http.StatusRequestEntityTooLarge}} {
		body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", tc.size) + `"}]}`
		resp, err := http.Post("http://"+a.RouterAddr()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || (tc.want == http.StatusRequestEntityTooLarge && !strings.Contains(string(b), "router.max_body_bytes")) {
			t.Errorf("a %d-byte body: %d %s, want %d (a 413 naming router.max_body_bytes)", len(body), resp.StatusCode, b, tc.want)
		}
	}
}

// startStreamingRoute starts the route role in front of an upstream that
// classifies A (lora-1) and streams chunks at interval, with lora-1 active
// for sim-airline; it returns the app, its stop, the configuration and
// the response of one streaming request, whose adapter header it checks.
func startStreamingRoute(t *testing.T, chunks []string, interval, drain time.Duration) (*app.App, func() error, config.Config, *http.Response) {
	t.Helper()
	a, stop, cfg, _ := startRoute(t, func(req llmtest.Request) llmtest.Reply {
		if req.Chat.Logprobs {
			return llmtest.Classification(map[string]float64{"A": 0.8, "B": 0.2})
		}
		return llmtest.Reply{Stream: &llmtest.Stream{Chunks: chunks, Interval: interval}}
	}, func(cfg *config.Config) {
		if drain > 0 {
			cfg.Router.DrainTimeout = drain
		}
	})
	resp, err := http.Post("http://"+a.RouterAddr()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"check the fare rules first"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.Header.Get(router.HeaderAdapter) != "lora-1" {
		t.Fatalf("adapter header %q", resp.Header.Get(router.HeaderAdapter))
	}
	return a, stop, cfg, resp
}

// startRoute starts the route role in front of an upstream answering
// handle (edit, when set, adjusts the configuration), with lora-1 active
// for sim-airline's precondition_verification (label A); it returns the
// app, its stop, the configuration and the upstream.
func startRoute(t *testing.T, handle llmtest.Handler, edit func(*config.Config)) (*app.App, func() error, config.Config, *llmtest.Server) {
	t.Helper()
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	up := llmtest.New(t)
	up.Handle(handle)
	cfg := withRoles(w.cfg, "route")
	cfg.Router.Addr, cfg.Router.UpstreamURL, cfg.Router.BaseModel, cfg.Router.DefaultEnvironment = "127.0.0.1:0", up.URL, "base", "sim-airline"
	if edit != nil {
		edit(&cfg)
	}
	a, stop := w.start(t, cfg)
	<-a.Ready()
	if err := a.Store.SaveAdapter(context.Background(), sink.AdapterRow{Name: "lora-1", Capability: "precondition_verification",
		Environment: "sim-airline", Status: "active", Version: 1}); err != nil {
		t.Fatal(err)
	}
	return a, stop, cfg, up
}

// routeDecisions reads sim-airline's route_decisions through a new store
// (the app's is closed once Run has returned).
func routeDecisions(t *testing.T, cfg config.Config) []sink.RouteDecisionRow {
	t.Helper()
	st, err := sink.Open(context.Background(), cfg.ClickHouse, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows, err := st.RouteDecisions(context.Background(), sink.RouteDecisionFilter{Environment: "sim-airline"})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestRouteLogURL: the upstream URL is logged without its user information.
func TestRouteLogURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://user:secret@vllm:8000/v1": "http://vllm:8000/v1",
		"https://token@vllm/v1":           "https://vllm/v1",
		"http://127.0.0.1:8000/v1":        "http://127.0.0.1:8000/v1",
	} {
		if got := app.LogURL(in); got != want {
			t.Errorf("%s logged as %s, want %s", in, got, want)
		}
	}
}

// TestRouteDecisionTimeout: the whole decision is bounded by the
// classifier's attempts, the waits between them (at most 1.5 s each) and,
// with retrieval, the embedder's two attempts.
func TestRouteDecisionTimeout(t *testing.T) {
	for _, tc := range []struct {
		timeout   time.Duration
		attempts  int
		retrieval bool
		want      time.Duration
	}{
		{10 * time.Second, 2, false, 21500 * time.Millisecond}, // the defaults
		{10 * time.Second, 1, false, 10 * time.Second},
		{2 * time.Second, 3, false, 9 * time.Second},
		{10 * time.Second, 2, true, 43 * time.Second},
	} {
		rc := config.DefaultRouter()
		rc.ClassifierTimeout, rc.ClassifierAttempts = tc.timeout, tc.attempts
		if tc.retrieval {
			rc.Retrieval.EmbeddingsURL, rc.Retrieval.EmbeddingsModel = "http://127.0.0.1:1/v1", "e"
		}
		if got := app.DecisionTimeout(rc); got != tc.want {
			t.Errorf("classifier_timeout %s × %d, retrieval %v: %s, want %s", tc.timeout, tc.attempts, tc.retrieval, got, tc.want)
		}
	}
}

// TestRouteRoleDropsRolledBackAdapter: a conversation cached on an adapter
// that is then rolled back in the registry (and unloaded: the upstream
// answers 404 for it) is not sent to it again once router.adapters_refresh
// has passed: its next request gets a new decision, recorded as such.
func TestRouteRoleDropsRolledBackAdapter(t *testing.T) {
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	up := llmtest.New(t)
	var unloaded atomic.Bool
	up.Handle(func(req llmtest.Request) llmtest.Reply {
		if req.Chat.Logprobs {
			return llmtest.Classification(map[string]float64{"A": 0.8, "B": 0.15, "C": 0.05})
		}
		if unloaded.Load() && req.Chat.Model == "lora-1" {
			return llmtest.Status(http.StatusNotFound, "The model `lora-1` does not exist.")
		}
		return llmtest.Text("ok")
	})
	const refresh = 300 * time.Millisecond
	cfg := withRoles(w.cfg, "route")
	cfg.Router.Addr, cfg.Router.UpstreamURL, cfg.Router.BaseModel, cfg.Router.DefaultEnvironment = "127.0.0.1:0", up.URL, "base", "sim-airline"
	cfg.Router.AdaptersRefresh = refresh
	a, stop := w.start(t, cfg)
	<-a.Ready()
	ctx := context.Background()
	// Labels by capability: A = lora-1, B = lora-2, C = no adapter.
	for _, r := range []sink.AdapterRow{
		{Name: "lora-1", Capability: "argument_grounding", Environment: "sim-airline", Status: "active", Version: 1},
		{Name: "lora-2", Capability: "precondition_verification", Environment: "sim-airline", Status: "active", Version: 1},
	} {
		if err := a.Store.SaveAdapter(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	post := func() (status int, adapter, decision string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+a.RouterAddr()+"/v1/chat/completions",
			strings.NewReader(`{"messages":[{"role":"user","content":"book the cheapest fare"}]}`))
		req.Header.Set(router.HeaderConversation, "conv-r")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get(router.HeaderAdapter), resp.Header.Get(router.HeaderDecision)
	}
	status, adapter, first := post()
	if status != http.StatusOK || adapter != "lora-1" {
		t.Fatalf("first request: %d, adapter %q", status, adapter)
	}
	row, err := a.Store.Adapter(ctx, "lora-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Store.MarkAdapterRolledBack(ctx, *row, "{}", time.Now()); err != nil {
		t.Fatal(err)
	}
	unloaded.Store(true)
	time.Sleep(refresh) // the registry's list and the router's check of it are due
	status, adapter, second := post()
	if status != http.StatusOK || adapter != "lora-2" || second == first {
		t.Fatalf("after the rollback: %d, adapter %q, decision %s (first %s)", status, adapter, second, first)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rows := routeDecisions(t, cfg)
	if len(rows) != 2 || rows[1].DecisionID != second || rows[1].Cached || rows[1].Adapter != "lora-2" || rows[1].Outcome != router.OutcomeOK ||
		rows[1].ConversationID != "conv-r" || strings.Join(rows[1].LabelAdapters, ",") != "lora-2," {
		t.Fatalf("rows %+v", rows)
	}
}

// TestRouteRoleRecordsRequestsCutAtShutdown: a stream still in flight when
// router.drain_timeout runs out is closed, and its decision row, which its
// handler records as it returns, is still written before Run returns.
func TestRouteRoleRecordsRequestsCutAtShutdown(t *testing.T) {
	chunks := make([]string, 100)
	for i := range chunks {
		chunks[i] = "tick"
	}
	_, stop, cfg, resp := startStreamingRoute(t, chunks, 200*time.Millisecond, 100*time.Millisecond) // a 20 s stream
	buf := make([]byte, 256)
	if n, err := resp.Body.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "tick") { // the stream is under way
		t.Fatalf("first read %q %v", buf[:n], err)
	}
	if err := stop(); err != nil { // SIGTERM; the stream outlasts router.drain_timeout
		t.Fatalf("run: %v", err)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("the stream was not cut at router.drain_timeout")
	}
	rows := routeDecisions(t, cfg)
	if len(rows) != 1 || rows[0].Adapter != "lora-1" || !rows[0].Stream ||
		(rows[0].Outcome != router.OutcomeCanceled && rows[0].Outcome != router.OutcomeStreamError) {
		t.Fatalf("rows %+v", rows)
	}
}

// TestRouteRoleAuditsCallsInFlightAtShutdown: a classifier call still in
// flight when trace is stopped (its request drains) is audited in
// llm_calls: the audit writer's last flush comes after the roles that
// call the LLM have stopped.
func TestRouteRoleAuditsCallsInFlightAtShutdown(t *testing.T) {
	classifying := make(chan struct{}, 1)
	a, stop, cfg, _ := startRoute(t, func(req llmtest.Request) llmtest.Reply {
		if req.Chat.Logprobs {
			select {
			case classifying <- struct{}{}:
			default:
			}
			return llmtest.Slow(time.Second, llmtest.Classification(map[string]float64{"A": 0.8, "B": 0.2}))
		}
		return llmtest.Text("ok")
	}, nil)
	answered := make(chan error, 1)
	go func() {
		resp, err := http.Post("http://"+a.RouterAddr()+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"messages":[{"role":"user","content":"check the fare rules first"}]}`))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		answered <- err
	}()
	<-classifying // SIGTERM while the classifier is being asked
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	if err := <-answered; err != nil {
		t.Fatalf("request in flight at shutdown: %v", err)
	}
	if n := llmCalls(t, cfg); n != 1 {
		t.Fatalf("llm_calls has %d rows for the classifier call in flight at shutdown, want 1", n)
	}
}

// TestRouteRoleClassifierExtraBody: router.classifier_extra_body reaches
// every classifier request of the route role, so a reasoning classifier
// (scripted Qwen3: "<think>" first unless chat_template_kwargs disables
// thinking) classifies and the conversation goes to its adapter; the
// answer's own request gets none of it.
func TestRouteRoleClassifierExtraBody(t *testing.T) {
	a, stop, _, up := startRoute(t, func(req llmtest.Request) llmtest.Reply {
		if !req.Chat.Logprobs {
			return llmtest.Text("ok")
		}
		if !strings.Contains(string(req.Body), `"chat_template_kwargs":{"enable_thinking":false}`) {
			return llmtest.Reply{Content: "<think>", FinishReason: "length", Logprobs: []llmtest.Logprob{{Token: "<think>", Logprob: -0.001}}}
		}
		return llmtest.Classification(map[string]float64{"A": 0.8, "B": 0.2})
	}, func(cfg *config.Config) {
		cfg.Router.ClassifierExtraBody = `{"chat_template_kwargs": {"enable_thinking": false}}` // as from --set or the environment
	})
	resp, err := http.Post("http://"+a.RouterAddr()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"check the fare rules first"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get(router.HeaderAdapter) != "lora-1" {
		t.Fatalf("%d, adapter %q", resp.StatusCode, resp.Header.Get(router.HeaderAdapter))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	reqs := up.Requests()
	if len(reqs) != 2 || !reqs[0].Chat.Logprobs || reqs[1].Chat.Model != "lora-1" || strings.Contains(string(reqs[1].Body), "chat_template_kwargs") {
		t.Fatalf("upstream requests: %d; the answer's %s", len(reqs), reqs[len(reqs)-1].Body)
	}
}
