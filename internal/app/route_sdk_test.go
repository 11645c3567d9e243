package app_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/router"
	"github.com/traceops/trace/sink"
)

// sdkStep is what the script observed in one call.
type sdkStep struct {
	Name         string   `json:"name"`
	Sent         []string `json:"sent"`
	Content      *string  `json:"content"`
	FinishReason string   `json:"finish_reason"`
	Usage        struct{ Prompt, Completion, Total int }
	Deltas       []string `json:"deltas"`
	Chunks       int      `json:"chunks"`
	LastChoices  int      `json:"last_choices"`
	UsageChunks  int      `json:"usage_chunks"`
	ToolCalls    []struct {
		ID, Type, Name string
		Arguments      map[string]any
	} `json:"tool_calls"`
	Models       []string `json:"models"`
	Model        string   `json:"model"`
	Dims         int      `json:"dims"`
	Status       int      `json:"status"`
	Adapter      string   `json:"adapter"`
	Decision     string   `json:"decision"`
	ModelHeader  string   `json:"model_header"`
	Conversation string   `json:"conversation"`
	Error        *struct {
		Class   string         `json:"class"`
		Status  int            `json:"status"`
		Message string         `json:"message"`
		Body    map[string]any `json:"body"`
		Adapter string         `json:"adapter"`
	} `json:"error"`
}

// TestRouteRoleOpenAIPythonSDK: the route role's proxy, driven by the
// OpenAI Python SDK (openai 3.63.0) as agents drive it: api_key is the
// upstream's key, the router's token and the environment come in
// default_headers. The SDK parses a completion with its usage, a stream
// chunk by chunk, a stream with stream_options include_usage (its last
// chunk without choices, with the usage; recorded as an ordinary ok
// stream), a tool call, the proxy's headers through
// with_raw_response, and the upstream's 429 and 400 as RateLimitError and
// BadRequestError with the upstream's message; the proxy's own 401 is an
// AuthenticationError; a conversation named by extra_headers beats
// metadata.conversation_id, which names one alone; and a conversation
// routed to an adapter the upstream answers 404 for gets the base model's
// answer as a normal completion. The upstream received each of the SDK's
// bodies with only model changed (to the adapter), and its Authorization;
// route_decisions holds one row per routed request, the cached decision's
// id repeated.
func TestRouteRoleOpenAIPythonSDK(t *testing.T) {
	py := testenv.OpenAIVenv.Require(t)
	const (
		token       = "router-secret"
		upstreamKey = "sk-upstream-key"
		rateMsg     = "Rate limit reached for lora-1 on requests per min (RPM): Limit 3, Used 3, Requested 1."
		badMsg      = "'temperature' must be at most 2"
	)
	rateBody := `{"error":{"message":"` + rateMsg + `","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
	a, stop, cfg, up := startRoute(t, func(req llmtest.Request) llmtest.Reply {
		prompt := req.Chat.Prompt()
		if req.Chat.Logprobs {
			// Labels by capability: A = lora-1, B = lora-gone, C = no adapter.
			if strings.Contains(prompt, "fallback please") {
				return llmtest.Classification(map[string]float64{"B": 0.9, "A": 0.05, "C": 0.05})
			}
			return llmtest.Classification(map[string]float64{"A": 0.9, "B": 0.05, "C": 0.05})
		}
		if req.Chat.Model == "lora-gone" {
			return llmtest.Status(http.StatusNotFound, "The model `lora-gone` does not exist.")
		}
		last := req.Chat.Messages[len(req.Chat.Messages)-1].Content
		switch last {
		case "change my flight":
			return llmtest.Reply{Content: "Your flight is changed.", PromptTokens: 21, CompletionTokens: 6}
		case "stream it":
			return llmtest.StreamText("Your ", "flight ", "is ", "changed.")
		case "look up booking ABC123":
			return llmtest.ToolCalls("", llmtest.Call{ID: "call_1", Name: "lookup_booking", Arguments: map[string]any{"booking_id": "ABC123"}})
		case "rate limit me":
			return llmtest.Reply{Status: http.StatusTooManyRequests, Body: rateBody}
		case "bad request":
			return llmtest.Status(http.StatusBadRequest, badMsg)
		case "fallback please":
			return llmtest.Text("the base model answers")
		case "stream with usage":
			return llmtest.Reply{Stream: &llmtest.Stream{Chunks: []string{"Your ", "seat ", "is ", "12A."}}, PromptTokens: 30, CompletionTokens: 4}
		}
		return llmtest.Text("ok: " + last)
	}, func(cfg *config.Config) {
		// The environment comes from the SDK's default_headers alone.
		cfg.Router.BearerToken, cfg.Router.DefaultEnvironment = token, ""
	})
	if err := a.Store.SaveAdapter(context.Background(), sink.AdapterRow{Name: "lora-gone", Capability: "tool_error_recovery",
		Environment: "sim-airline", Status: "active", Version: 1}); err != nil {
		t.Fatal(err)
	}

	in := map[string]string{"base_url": "http://" + a.RouterAddr() + "/v1", "router_token": token, "upstream_key": upstreamKey,
		"environment": "sim-airline"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var env []string
	for _, kv := range os.Environ() { // the SDK reads OPENAI_*, httpx the proxy variables
		if k, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(k, "OPENAI_") && !strings.HasSuffix(strings.ToUpper(k), "_PROXY") {
			env = append(env, kv)
		}
	}
	var out struct {
		Version string    `json:"version"`
		Steps   []sdkStep `json:"steps"`
	}
	testenv.RunPythonJSON(ctx, t, py, "testdata/openai_sdk_interop.py", in, &out, env)
	t.Logf("openai %s", out.Version)
	steps := map[string]sdkStep{}
	var order []string
	for _, s := range out.Steps {
		if len(s.Sent) != 1 {
			t.Fatalf("step %s: the SDK sent %d requests, want 1", s.Name, len(s.Sent))
		}
		steps[s.Name] = s
		order = append(order, s.Name)
	}
	if want := "plain stream tool raw header_and_metadata metadata rate_limited bad_request no_token fallback stream_usage models embeddings"; strings.Join(order, " ") != want {
		t.Fatalf("steps %v, want %s", order, want)
	}
	text := func(p *string) string {
		if p == nil {
			return "<null>"
		}
		return *p
	}

	// What the SDK parsed.
	if s := steps["plain"]; s.Error != nil || text(s.Content) != "Your flight is changed." || s.FinishReason != "stop" ||
		s.Usage.Prompt != 21 || s.Usage.Completion != 6 || s.Usage.Total != 27 {
		t.Errorf("plain: %+v", s)
	}
	if s := steps["stream"]; s.Error != nil || !reflect.DeepEqual(s.Deltas, []string{"Your ", "flight ", "is ", "changed."}) ||
		text(s.Content) != "Your flight is changed." || s.FinishReason != "stop" {
		t.Errorf("stream: %+v", s)
	}
	// With stream_options include_usage: the upstream's usage chunk (no
	// choices, after the finish_reason) reaches the SDK as the last chunk.
	if s := steps["stream_usage"]; s.Error != nil || !reflect.DeepEqual(s.Deltas, []string{"Your ", "seat ", "is ", "12A."}) ||
		text(s.Content) != "Your seat is 12A." || s.FinishReason != "stop" || s.Chunks != 6 || s.LastChoices != 0 || s.UsageChunks != 1 ||
		s.Usage.Prompt != 30 || s.Usage.Completion != 4 || s.Usage.Total != 34 {
		t.Errorf("stream_usage: %+v", s)
	}
	if s := steps["tool"]; s.Error != nil || s.Content != nil || s.FinishReason != "tool_calls" || len(s.ToolCalls) != 1 ||
		s.ToolCalls[0].ID != "call_1" || s.ToolCalls[0].Type != "function" || s.ToolCalls[0].Name != "lookup_booking" ||
		!reflect.DeepEqual(s.ToolCalls[0].Arguments, map[string]any{"booking_id": "ABC123"}) {
		t.Errorf("tool: %+v", s)
	}
	raw := steps["raw"]
	if raw.Error != nil || raw.Status != 200 || raw.Adapter != "lora-1" || raw.ModelHeader != "lora-1" || raw.Conversation != "sdk-1" ||
		raw.Decision == "" || text(raw.Content) != "ok: raw please" {
		t.Errorf("raw: %+v", raw)
	}
	if s := steps["header_and_metadata"]; s.Error != nil || s.Conversation != "sdk-1" || text(s.Content) != "ok: which id" {
		t.Errorf("header and metadata: %+v (the header names the conversation)", s)
	}
	if s := steps["metadata"]; s.Error != nil || s.Conversation != "sdk-meta" || s.Adapter != "lora-1" || text(s.Content) != "ok: metadata only" {
		t.Errorf("metadata: %+v", s)
	}
	for name, want := range map[string]struct {
		class  string
		status int
		msg    string
	}{
		"rate_limited": {"RateLimitError", 429, rateMsg},
		"bad_request":  {"BadRequestError", 400, badMsg},
		"no_token":     {"AuthenticationError", 401, "missing or wrong " + router.HeaderToken},
	} {
		s := steps[name]
		if s.Error == nil || s.Error.Class != want.class || s.Error.Status != want.status || !strings.Contains(s.Error.Message, want.msg) ||
			!strings.Contains(s.Error.Body["message"].(string), want.msg) {
			t.Errorf("%s: %+v, error %+v; want %s %d with %q", name, s, s.Error, want.class, want.status, want.msg)
		}
	}
	if e := steps["rate_limited"].Error; e == nil || e.Body["code"] != "rate_limit_exceeded" || e.Adapter != "lora-1" {
		t.Errorf("rate_limited: the upstream's error object and the adapter header: %+v", e)
	}
	// Not chat: passed through, nothing routed.
	if s := steps["models"]; s.Error != nil || !reflect.DeepEqual(s.Models, []string{up.Model}) {
		t.Errorf("models: %+v, want the upstream's list [%s]", s, up.Model)
	}
	if s := steps["embeddings"]; s.Error != nil || s.Model != "embed-1" || s.Dims == 0 || up.EmbeddingRequests() != 1 {
		t.Errorf("embeddings: %+v (the upstream served %d), want embed-1's embedding", s, up.EmbeddingRequests())
	}
	if s := steps["fallback"]; s.Error != nil || s.Status != 200 || s.Adapter != "none" || s.ModelHeader != "base" || text(s.Content) != "the base model answers" {
		t.Errorf("fallback: %+v", s)
	}

	// What the upstream received: each body the SDK sent, with only the
	// model's value changed, and the SDK's Authorization; nothing of the
	// request without the router's token.
	var chats []llmtest.Request
	classifications := 0
	for _, r := range up.Requests() {
		if r.Chat.Logprobs {
			classifications++
		} else {
			chats = append(chats, r)
		}
	}
	if classifications != 3 {
		t.Errorf("%d classifications, want 3 (sdk-1, sdk-meta, sdk-fb; the rest cached)", classifications)
	}
	type forwarded struct{ step, model string }
	var want []forwarded
	for _, name := range order {
		switch name {
		case "no_token", "models", "embeddings":
		case "fallback":
			want = append(want, forwarded{name, "lora-gone"}, forwarded{name, "base"})
		default:
			want = append(want, forwarded{name, "lora-1"})
		}
	}
	if len(chats) != len(want) {
		t.Fatalf("the upstream received %d chat requests, want %d", len(chats), len(want))
	}
	for i, w := range want {
		sent := steps[w.step].Sent[0]
		if !strings.Contains(sent, `"gpt-4o-mini"`) {
			t.Fatalf("%s: the SDK's body has no model gpt-4o-mini: %s", w.step, sent)
		}
		if exp := strings.Replace(sent, `"gpt-4o-mini"`, `"`+w.model+`"`, 1); string(chats[i].Body) != exp {
			t.Errorf("upstream request %d (%s)\n%s\nwant the SDK's body with model %s\n%s", i, w.step, chats[i].Body, w.model, exp)
		}
		h := chats[i].Header
		if h.Get("Authorization") != "Bearer "+upstreamKey || h.Get(router.HeaderToken) != "" || h.Get(router.HeaderConversation) != "" || h.Get(router.HeaderEnvironment) != "" ||
			!strings.HasPrefix(h.Get("User-Agent"), "OpenAI/Python") {
			t.Errorf("upstream request %d (%s) headers %v", i, w.step, h)
		}
	}
	var sentStream map[string]any
	if err := json.Unmarshal([]byte(steps["stream"].Sent[0]), &sentStream); err != nil || sentStream["stream"] != true {
		t.Errorf("the SDK's streamed body %s", steps["stream"].Sent[0])
	}
	var sentUsage struct {
		Stream        bool
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal([]byte(steps["stream_usage"].Sent[0]), &sentUsage); err != nil || !sentUsage.Stream || !sentUsage.StreamOptions.IncludeUsage {
		t.Errorf("the SDK's streamed body with include_usage %s", steps["stream_usage"].Sent[0])
	}

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rows := routeDecisions(t, cfg)
	if len(rows) != 10 {
		t.Fatalf("%d route_decisions rows, want 10 (every request but the one without the token): %+v", len(rows), rows)
	}
	first := rows[0]
	if first.Cached || first.ConversationID != "sdk-1" || first.ConversationSource != router.SourceHeader || first.Adapter != "lora-1" ||
		first.Model != "lora-1" || first.Label != "A" || first.Reason != router.ReasonClassified || first.Outcome != router.OutcomeOK ||
		first.UpstreamStatus != 200 || first.Stream || first.DecisionID != raw.Decision {
		t.Errorf("row 0 (plain) %+v", first)
	}
	for i, w := range []struct {
		stream  bool
		status  int
		outcome string
	}{{true, 200, router.OutcomeOK}, {false, 200, router.OutcomeOK}, {false, 200, router.OutcomeOK}, {false, 200, router.OutcomeOK}} {
		r := rows[1+i]
		if !r.Cached || r.DecisionID != first.DecisionID || r.ConversationID != "sdk-1" || r.ConversationSource != router.SourceHeader ||
			r.Adapter != "lora-1" || r.Stream != w.stream || r.UpstreamStatus != uint16(w.status) || r.Outcome != w.outcome {
			t.Errorf("row %d (%s) %+v", 1+i, order[1+i], r)
		}
	}
	if r := rows[5]; r.Cached || r.ConversationID != "sdk-meta" || r.ConversationSource != router.SourceMetadata || r.Adapter != "lora-1" ||
		r.DecisionID == first.DecisionID || r.Outcome != router.OutcomeOK {
		t.Errorf("row 5 (metadata) %+v", r)
	}
	for i, status := range []uint16{429, 400} {
		if r := rows[6+i]; !r.Cached || r.DecisionID != first.DecisionID || r.Adapter != "lora-1" || r.UpstreamStatus != status ||
			r.Outcome != router.OutcomeUpstreamError {
			t.Errorf("row %d (%s) %+v", 6+i, order[6+i], r)
		}
	}
	if r := rows[8]; r.Cached || r.ConversationID != "sdk-fb" || r.Adapter != "" || r.Model != "base" || r.Label != "B" ||
		r.Reason != router.ReasonAdapterUnavailable || !strings.Contains(r.Error, "lora-gone") || r.Outcome != router.OutcomeOK || r.UpstreamStatus != 200 {
		t.Errorf("row 8 (fallback) %+v", r)
	}
	// The stream with the usage chunk is an ordinary streamed success.
	if r := rows[9]; !r.Cached || r.DecisionID != first.DecisionID || r.ConversationID != "sdk-1" || r.Adapter != "lora-1" || !r.Stream ||
		r.UpstreamStatus != 200 || r.Outcome != router.OutcomeOK || r.Error != "" {
		t.Errorf("row 9 (stream_usage) %+v", r)
	}
	// The usage the SDK parsed is the usage recorded: of the completion, and
	// of the stream that asked for it; the stream that did not has none.
	for _, c := range []struct {
		row  int
		step string
	}{{0, "plain"}, {9, "stream_usage"}} {
		r, u := rows[c.row], steps[c.step].Usage
		if u.Prompt == 0 || !r.Usage || int(r.PromptTokens) != u.Prompt || int(r.CompletionTokens) != u.Completion {
			t.Errorf("row %d (%s): usage %v %d/%d recorded, the SDK parsed %+v", c.row, c.step, r.Usage, r.PromptTokens, r.CompletionTokens, u)
		}
	}
	if r := rows[1]; r.Usage {
		t.Errorf("row 1 (stream without include_usage): usage recorded")
	}
}
