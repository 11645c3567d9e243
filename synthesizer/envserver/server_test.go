package envserver_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/traceops/trace/synthesizer/envclient"
	"github.com/traceops/trace/synthesizer/envserver"
	"github.com/traceops/trace/synthesizer/openenv"
)

// TestWebSocketEpisode plays the example's reference solution through /ws
// and checks every observation against the same play in-process: the
// transcript, the tool results and, at the end, the reward and components.
func TestWebSocketEpisode(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	ctx := ctxT(t)
	for _, seed := range []int64{1, 2, 7} {
		lp := playLocal(t, seed)
		s, err := f.client("").Dial(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seedV := seed
		obs, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seedV})
		if err != nil {
			t.Fatal(err)
		}
		o := obs.Observation
		if obs.Done || obs.Reward != nil || o.Seed != seed || o.StepCount != 0 || len(o.Tools) != 4 || o.LastToolResult != nil {
			t.Fatalf("reset observation: %+v", obs)
		}
		if len(o.Messages) != 2 || o.Messages[0].Role != "system" || o.Messages[0].Content != lp.start.System ||
			o.Messages[1].Role != "user" || o.Messages[1].Content != lp.start.User {
			t.Fatalf("reset messages %+v, want the program's start %+v", o.Messages, lp.start)
		}
		if strings.Contains(o.Messages[0].Content, "<expert_guidance>") {
			t.Fatal("hint in the system prompt without hint: true")
		}
		for i, a := range lp.actions {
			obs, err = s.Step(ctx, a)
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, i, err)
			}
			o := obs.Observation
			if o.StepCount != i+1 || len(o.ToolResults) != len(lp.results[i]) {
				t.Fatalf("seed %d step %d: observation %+v, want %d tool results", seed, i, o, len(lp.results[i]))
			}
			for j, r := range lp.results[i] {
				if o.ToolResults[j].Content != r.Content || o.ToolResults[j].ToolCallID != r.ToolCallID || o.ToolResults[j].Role != "tool" {
					t.Fatalf("seed %d step %d: tool result %+v, want %+v", seed, i, o.ToolResults[j], r)
				}
			}
			if n := len(lp.results[i]); n > 0 && (o.LastToolResult == nil || *o.LastToolResult != lp.results[i][n-1].Content) {
				t.Fatalf("seed %d step %d: last_tool_result %v", seed, i, o.LastToolResult)
			}
			last := o.Messages[len(o.Messages)-1-len(lp.results[i])]
			if last.Role != "assistant" || !reflect.DeepEqual(last.ToolCalls, a.ToolCalls) {
				t.Fatalf("seed %d step %d: transcript's assistant turn %+v, want %+v", seed, i, last, a)
			}
		}
		if !obs.Done || obs.Reward == nil || *obs.Reward != lp.reward.Value || lp.reward.Value != 1 ||
			!reflect.DeepEqual(obs.Observation.RewardComponents, lp.reward.Components) || obs.Observation.DoneReason != "final" {
			t.Fatalf("seed %d: final %+v reward %v, want %+v (the reference scores 1)", seed, obs.Observation, obs.Reward, lp.reward)
		}
		st, err := s.State(ctx)
		if err != nil || *st.EpisodeID != obs.Observation.EpisodeID || st.StepCount != len(lp.actions) || !st.Done || *st.Reward != 1 {
			t.Fatalf("state %+v, %v", st, err)
		}
		// A step after the end is an error; the session survives it.
		if _, err := s.Step(ctx, openenv.ChatMessage{Role: "assistant", Content: "again"}); !isCode(err, openenv.CodeExecution) {
			t.Fatalf("step after done: %v, want EXECUTION_ERROR", err)
		}
		if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seedV, Hint: true}); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
}

func isCode(err error, code string) bool {
	var e *envclient.Error
	return errors.As(err, &e) && e.Code == code
}

// TestHintedReset: hint: true appends the program's guidance in its tags.
func TestHintedReset(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	ctx := ctxT(t)
	seed := int64(4)
	obs, err := f.client("").Reset(ctx, openenv.ResetRequest{Seed: &seed, Hint: true})
	if err != nil {
		t.Fatal(err)
	}
	sys := obs.Observation.Messages[0].Content
	if i := strings.Index(sys, "\n\n<expert_guidance>"); i < 0 || !strings.HasSuffix(sys, "</expert_guidance>") || !strings.Contains(sys[i:], "policy") {
		t.Fatalf("system prompt with hint: %q", sys)
	}
}

// TestProtocolErrors sends malformed frames and invalid actions on one
// WebSocket session: each is answered with its code and a message, and the
// session goes on to finish its episode.
func TestProtocolErrors(t *testing.T) {
	cfg := testConfig()
	cfg.MaxMessageBytes = 4096
	f := start(t, cfg, nil, nil)
	ctx := ctxT(t)
	s, err := f.client("").Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Step(ctx, openenv.ChatMessage{Role: "assistant", Content: "hi"}); !isCode(err, openenv.CodeExecution) || !strings.Contains(err.Error(), "reset") {
		t.Fatalf("step before reset: %v", err)
	}
	lp := playLocal(t, 5)
	seed := int64(5)
	if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatal(err)
	}
	step := func(data string) string { return `{"type":"step","data":` + data + `}` }
	call := func(name, args string) string {
		return step(`{"role":"assistant","tool_calls":[{"id":"x","type":"function","function":{"name":"` + name + `","arguments":` + args + `}}]}`)
	}
	for _, tc := range []struct{ frame, code, contains string }{
		{`{"type":"step","data":`, openenv.CodeInvalidJSON, "Invalid JSON"},
		{`not json at all`, openenv.CodeInvalidJSON, "Invalid JSON"},
		{`{"type":"fly"}`, openenv.CodeUnknownType, "Unknown message type: fly"},
		{`{"data":{}}`, openenv.CodeUnknownType, "Unknown message type"},
		{`[]`, openenv.CodeValidation, "JSON object"},
		{`{"type":"step"}`, openenv.CodeValidation, "Field required"},
		{`{"type":"reset","data":{"seed":-3}}`, openenv.CodeValidation, "greater than or equal to 0"},
		{step(`{"role":"user","content":"x"}`), openenv.CodeValidation, "assistant"},
		// Shapes that would otherwise be final answers, ending the episode.
		{step(`{}`), openenv.CodeValidation, "none of the three"},
		{step(`{"type":"call_tools","tool_name":"get_user_details","arguments":{"user_id":"x"}}`), openenv.CodeValidation, "not an action type"},
		{step(`{"role":"assistant","tool_call":[{"function":{"name":"get_user_details"}}]}`), openenv.CodeValidation, `tool_call: not read`},
		{step(`{"role":"assistant","content":null,"function_call":{"name":"get_user_details","arguments":"{}"}}`), openenv.CodeValidation, `function_call: not read`},
		{call("book_flight", `"{}"`), openenv.CodeValidation, `unknown tool "book_flight"`},
		{call("get_user_details", `"{\"user_id\": 42}"`), openenv.CodeValidation, "/user_id"},
		{call("get_user_details", `"{}"`), openenv.CodeValidation, "user_id"},
		{call("update_reservation_baggages", `{"reservation_id":"X","total_baggages":"two","nonfree_baggages":0,"payment_id":"p"}`), openenv.CodeValidation, "/total_baggages"},
		{call("get_user_details", `"{user_id: 1}"`), openenv.CodeValidation, "not valid JSON"},
		{step(`{"content":"` + strings.Repeat("x", 5000) + `"}`), openenv.CodeValidation, "exceeds the 4096-byte limit"},
		{`{"type":"mcp","data":{"jsonrpc":"2.0","method":"nope","id":3}}`, "", ""},
	} {
		fr, err := s.Send(ctx, []byte(tc.frame))
		if err != nil {
			t.Fatalf("%.60s: %v", tc.frame, err)
		}
		if tc.code == "" { // a JSON-RPC error inside an mcp frame
			var r struct {
				Error openenv.RPCError `json:"error"`
			}
			if fr.Type != "mcp" || json.Unmarshal(fr.Data, &r) != nil || r.Error.Code != openenv.RPCMethodNotFound {
				t.Fatalf("mcp frame answer %s %s", fr.Type, fr.Data)
			}
			continue
		}
		var d openenv.ErrorData
		if fr.Type != "error" || json.Unmarshal(fr.Data, &d) != nil || d.Code != tc.code || !strings.Contains(d.Message, tc.contains) {
			t.Fatalf("%.60s: answered %s %s, want %s containing %q", tc.frame, fr.Type, fr.Data, tc.code, tc.contains)
		}
		if d.Code == openenv.CodeValidation && len(d.Errors) == 0 {
			t.Fatalf("%.60s: validation error without errors: %s", tc.frame, fr.Data)
		}
	}
	// The episode was not touched by any of them: the reference still
	// scores what it scores in-process.
	var obs openenv.StepResponse
	for _, a := range lp.actions {
		if obs, err = s.Step(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if !obs.Done || *obs.Reward != lp.reward.Value || obs.Observation.StepCount != len(lp.actions) {
		t.Fatalf("after the errors: %+v", obs)
	}
	if got := counter(t, f, "trace_env_errors_total", map[string]string{"code": openenv.CodeValidation}); got < 9 {
		t.Fatalf("trace_env_errors_total{code=VALIDATION_ERROR} = %v, want >= 9", got)
	}
}

// TestArgumentsForms: arguments as a JSON string, as an object, absent.
func TestArgumentsForms(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	ctx := ctxT(t)
	lp := playLocal(t, 8)
	s, err := f.client("").Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	seed := int64(8)
	s.Reset(ctx, openenv.ResetRequest{Seed: &seed})
	first := lp.actions[0].ToolCalls[0]
	var args map[string]any
	json.Unmarshal([]byte(first.Function.Arguments), &args)
	raw, err := s.StepRaw(ctx, map[string]any{"role": "assistant", "content": nil, "reasoning_content": "thinking…",
		"tool_calls": []any{map[string]any{"id": "o1", "type": "function", "function": map[string]any{"name": first.Function.Name, "arguments": args}}}})
	if err != nil {
		t.Fatal(err)
	}
	var obs openenv.StepResponse
	json.Unmarshal(raw, &obs)
	if got := *obs.Observation.LastToolResult; got != lp.results[0][0].Content {
		t.Fatalf("object arguments: %s, want %s", got, lp.results[0][0].Content)
	}
	// The transcript carries them as OpenAI's JSON string.
	tc := obs.Observation.Messages[2].ToolCalls[0]
	var back map[string]any
	if json.Unmarshal([]byte(tc.Function.Arguments), &back) != nil || !reflect.DeepEqual(back, args) || tc.ID != "o1" {
		t.Fatalf("transcript tool call %+v", tc)
	}
	// A missing id gets one, unique within the episode.
	raw, err = s.StepRaw(ctx, map[string]any{"tool_calls": []any{map[string]any{"function": map[string]any{"name": first.Function.Name, "arguments": first.Function.Arguments}}}})
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(raw, &obs)
	if id := obs.Observation.ToolResults[0].ToolCallID; id == "" || id == "o1" {
		t.Fatalf("assigned call id %q", id)
	}
}

// TestStatelessHTTP: OpenEnv's HTTP reset and step play a fresh episode
// each; GET /state of no session is an empty state.
func TestStatelessHTTP(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	ctx := ctxT(t)
	c := f.client("")
	lp := playLocal(t, 3)
	seed := int64(3)
	obs, err := c.Reset(ctx, openenv.ResetRequest{Seed: &seed})
	if err != nil || obs.Observation.Messages[1].Content != lp.start.User || obs.Done {
		t.Fatalf("reset: %+v, %v", obs, err)
	}
	obs, err = c.Step(ctx, "", &seed, lp.actions[0])
	if err != nil || obs.Observation.StepCount != 1 || *obs.Observation.LastToolResult != lp.results[0][0].Content {
		t.Fatalf("stateless step: %+v, %v", obs, err)
	}
	// Twice the same: nothing was kept between the requests.
	obs2, err := c.Step(ctx, "", &seed, lp.actions[0])
	if err != nil || obs2.Observation.StepCount != 1 || obs2.Observation.EpisodeID == obs.Observation.EpisodeID {
		t.Fatalf("second stateless step: %+v, %v", obs2, err)
	}
	st, err := c.State(ctx, "")
	if err != nil || st.EpisodeID != nil || st.StepCount != 0 {
		t.Fatalf("stateless state %+v, %v", st, err)
	}
	for _, tc := range []struct {
		path, body string
		status     int
		code       string
	}{
		{"/step", `{"action": "x"}`, 422, openenv.CodeValidation},
		{"/step", `{}`, 422, openenv.CodeValidation},
		{"/step", `{"action": {"tool_calls": [{"function": {"name": "nope"}}]}}`, 422, openenv.CodeValidation},
		{"/reset", `{"seed": "x"}`, 422, openenv.CodeValidation},
		{"/reset", `{`, 422, openenv.CodeInvalidJSON},
		{"/step", `{"action": {"content": "x"}, "session_id": "missing"}`, 404, openenv.CodeSession},
		{"/reset", `{"pad": "` + strings.Repeat("p", 2<<20) + `"}`, 413, openenv.CodeValidation},
	} {
		resp, err := http.Post(f.base+tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var he struct {
			Detail json.RawMessage `json:"detail"`
			Code   string          `json:"code"`
		}
		if resp.StatusCode != tc.status || json.Unmarshal(b, &he) != nil || he.Code != tc.code || len(he.Detail) == 0 {
			t.Errorf("POST %s %.40s: %d %s, want %d %s", tc.path, tc.body, resp.StatusCode, b, tc.status, tc.code)
		}
	}
	resp, err := http.Get(f.http.URL + "/v1/environments/nope/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /v1/environments/nope/health: %d, want 404", resp.StatusCode)
	}
	for path, want := range map[string]string{"/schema": `"action"`, "/metadata": `"description"`, "/health": `"healthy"`} {
		resp, err := http.Get(f.base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte(want)) {
			t.Errorf("GET %s: %d %.200s", path, resp.StatusCode, b)
		}
	}
	md, err := c.Metadata(ctx)
	if err != nil || md.Name == "" || !strings.Contains(md.Description, "Precondition verification") || md.Version == nil {
		t.Fatalf("metadata %+v, %v", md, err)
	}
	sch, err := c.Schema(ctx)
	if err != nil || !bytes.Contains(sch.Action, []byte("get_reservation_details")) || !bytes.Contains(sch.Observation, []byte("last_tool_result")) {
		t.Fatalf("schema %+v, %v", sch, err)
	}
}

// TestOpenAPI: GET openapi.json describes the environment's HTTP API as
// openenv's servers do (OpenAPI 3.1, info.version the OpenEnv API version,
// the endpoints `openenv validate --url` looks for), with the schemas GET
// /schema serves, and declares the bearer token only when one is set.
// Each operation lists every status the handlers answer it with, each
// error with the HTTPError body: the errors provoked here (413, 422, 404
// for an unknown session, 500 EXECUTION_ERROR, 401 without the token) are
// all in the document, whose 500 was missing before though program errors
// and observations over env.max_observation_bytes answer it.
func TestOpenAPI(t *testing.T) {
	for _, token := range []string{"", "s3cret"} {
		cfg := testConfig()
		cfg.BearerToken = token
		f := start(t, cfg, nil, nil)
		get := func(path string, v any) {
			t.Helper()
			resp, err := http.Get(f.base + path + "?token=" + token)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("GET %s: %d %s %.200s", path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
			}
			if err := json.Unmarshal(b, v); err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
		}
		var doc struct {
			OpenAPI string `json:"openapi"`
			Info    struct {
				Title, Description, Version string
			} `json:"info"`
			Paths      map[string]map[string]json.RawMessage `json:"paths"`
			Components struct {
				Schemas         map[string]any `json:"schemas"`
				SecuritySchemes map[string]any `json:"securitySchemes"`
			} `json:"components"`
			Security []map[string]any `json:"security"`
		}
		get("/openapi.json", &doc)
		var sch map[string]any
		get("/schema", &sch)
		if doc.OpenAPI != "3.1.0" || doc.Info.Version != openenv.APIVersion || !strings.Contains(doc.Info.Title, "precondition_airline") ||
			!strings.Contains(doc.Info.Description, "Precondition verification") {
			t.Errorf("token %q: header %s %+v", token, doc.OpenAPI, doc.Info)
		}
		methods := map[string]string{}
		for p, ops := range doc.Paths {
			for m := range ops {
				methods[p] += m
			}
		}
		want := map[string]string{"/reset": "post", "/step": "post", "/state": "get", "/metadata": "get", "/health": "get", "/schema": "get", "/mcp": "post"}
		if !reflect.DeepEqual(methods, want) {
			t.Errorf("token %q: paths %v, want %v", token, methods, want)
		}
		for name, key := range map[string]string{"Action": "action", "Observation": "observation", "State": "state"} {
			if !reflect.DeepEqual(doc.Components.Schemas[name], sch[key]) {
				t.Errorf("token %q: components %s differs from GET /schema's %s", token, name, key)
			}
		}
		// Every $ref names a component.
		for _, ref := range regexp.MustCompile(`"#/components/schemas/([A-Za-z]+)"`).FindAllStringSubmatch(fmt.Sprint(mustJSON(t, doc.Paths), mustJSON(t, doc.Components.Schemas)), -1) {
			if doc.Components.Schemas[ref[1]] == nil {
				t.Errorf("token %q: $ref to a missing component %s", token, ref[1])
			}
		}
		if secured := doc.Security != nil && doc.Components.SecuritySchemes["bearer"] != nil; secured != (token != "") {
			t.Errorf("token %q: security %v %v", token, doc.Security, doc.Components.SecuritySchemes)
		}

		// The statuses of each operation, every error with the HTTPError body.
		type operation struct {
			Responses map[string]struct {
				Content map[string]struct {
					Schema map[string]any `json:"schema"`
				} `json:"content"`
			} `json:"responses"`
		}
		op := func(path, method string) operation {
			t.Helper()
			var o operation
			if err := json.Unmarshal(doc.Paths[path][method], &o); err != nil {
				t.Fatalf("token %q: %s %s: %v", token, method, path, err)
			}
			return o
		}
		auth := ""
		if token != "" {
			auth = " 401"
		}
		wantStatuses := map[string]string{
			"post /reset": "200 400" + auth + " 404 413 422 500 503", "post /step": "200 400" + auth + " 404 413 422 500 503",
			"get /state": "200" + auth + " 404 500 503", "get /metadata": "200" + auth + " 404 503", "get /schema": "200" + auth + " 404 503",
			"get /health": "200 404 503", "post /mcp": "200 400" + auth + " 404 503",
		}
		for key, want := range wantStatuses {
			method, path, _ := strings.Cut(key, " ")
			o := op(path, method)
			var got []string
			for status, r := range o.Responses {
				got = append(got, status)
				if status != "200" && r.Content["application/json"].Schema["$ref"] != "#/components/schemas/HTTPError" {
					t.Errorf("token %q: %s's %s has the body %v, want HTTPError", token, key, status, r.Content)
				}
			}
			slices.Sort(got)
			if g := strings.Join(got, " "); g != want {
				t.Errorf("token %q: %s answers %s, want %s", token, key, g, want)
			}
		}

		// The ways each operation takes a session: the header, and for GET
		// /state (no body) the query parameter the handler reads too.
		for key, want := range map[string]string{"post /reset": "header X-Session-Id", "post /step": "header X-Session-Id",
			"get /state": "header X-Session-Id, query session_id"} {
			method, path, _ := strings.Cut(key, " ")
			var o struct {
				Parameters []struct{ Name, In string } `json:"parameters"`
			}
			if err := json.Unmarshal(doc.Paths[path][method], &o); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range o.Parameters {
				got = append(got, p.In+" "+p.Name)
			}
			if g := strings.Join(got, ", "); g != want {
				t.Errorf("token %q: %s takes %s, want %s", token, key, g, want)
			}
		}

		// The errors the handlers answer are documented for their operation.
		call := func(method, path string, header http.Header, body string, withToken bool) (int, []byte) {
			t.Helper()
			u := f.base + path
			if withToken && token != "" {
				sep := "?"
				if strings.Contains(u, "?") {
					sep = "&"
				}
				u += sep + "token=" + token
			}
			req, err := http.NewRequest(method, u, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range header {
				req.Header[k] = v
			}
			if body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, b
		}
		sid, err := f.client(token).CreateSession(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		final := `{"action": {"role": "assistant", "content": "done"}}`
		unknown := http.Header{envserver.SessionHeader: {"no-such-session"}}
		type probe struct {
			method, path string
			header       http.Header
			body         string
			withToken    bool
			want         int
		}
		probes := []probe{
			{"POST", "/reset", nil, `{"seed": 1, "pad": "` + strings.Repeat("x", cfg.MaxMessageBytes) + `"}`, true, 413},
			{"POST", "/reset", nil, `{"seed": "one"}`, true, 422},
			{"POST", "/step", nil, `{}`, true, 422},
			{"POST", "/reset", unknown, `{}`, true, 404},
			{"POST", "/step", unknown, final, true, 404},
			{"GET", "/state", unknown, "", true, 404},
			// A session without an episode: EXECUTION_ERROR.
			{"POST", "/step", http.Header{envserver.SessionHeader: {sid}}, final, true, 500},
		}
		if token != "" {
			probes = append(probes, probe{"POST", "/step", nil, final, false, 401}, probe{"GET", "/schema", nil, "", false, 401})
		}
		for _, p := range probes {
			status, b := call(p.method, p.path, p.header, p.body, p.withToken)
			var e openenv.HTTPError
			if status != p.want || json.Unmarshal(b, &e) != nil || e.Detail == nil {
				t.Errorf("token %q: %s %s answered %d %.200s, want %d with an HTTPError body", token, p.method, p.path, status, b, p.want)
				continue
			}
			if _, ok := op(p.path, strings.ToLower(p.method)).Responses[fmt.Sprint(status)]; !ok {
				t.Errorf("token %q: %s %s answers %d (%.200s), which its OpenAPI document does not list", token, p.method, p.path, status, b)
			}
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSessionHTTPAndMCP: a stateful HTTP session from openenv/session/create,
// played with /reset, tools/call and /step, read with /state, closed.
func TestSessionHTTPAndMCP(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	ctx := ctxT(t)
	c := f.client("")
	lp := playLocal(t, 6)
	tools, err := c.ListTools(ctx)
	if err != nil || len(tools) != 4 || tools[0].Name != "get_user_details" || !bytes.Contains(tools[0].InputSchema, []byte("user_id")) {
		t.Fatalf("tools/list: %+v, %v", tools, err)
	}
	sid, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seed := int64(6)
	if _, err := c.Reset(ctx, openenv.ResetRequest{Seed: &seed, SessionID: sid}); err != nil {
		t.Fatal(err)
	}
	// All turns but the last as MCP tool calls, the final answer by /step.
	n := len(lp.actions)
	for i, a := range lp.actions[:n-1] {
		for j, tc := range a.ToolCalls {
			res, err := c.CallTool(ctx, sid, tc.Function.Name, json.RawMessage(tc.Function.Arguments))
			if err != nil {
				t.Fatal(err)
			}
			if res.Content[0].Text != lp.results[i][j].Content || res.IsError || res.Meta.Done {
				t.Fatalf("tools/call %s: %+v, want %s", tc.Function.Name, res, lp.results[i][j].Content)
			}
			var data any
			if json.Unmarshal(res.Data, &data) != nil {
				t.Fatalf("tools/call data %s", res.Data)
			}
		}
	}
	obs, err := c.Step(ctx, sid, nil, lp.actions[n-1])
	if err != nil || !obs.Done || *obs.Reward != lp.reward.Value {
		t.Fatalf("final step: %+v, %v (want reward %v)", obs, err, lp.reward.Value)
	}
	st, err := c.State(ctx, sid)
	if err != nil || st.SessionID != sid || !st.Done || *st.Reward != lp.reward.Value || !reflect.DeepEqual(st.Components, lp.reward.Components) {
		t.Fatalf("state %+v, %v", st, err)
	}
	if err := c.CloseSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
	if _, err := c.State(ctx, sid); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("state of a closed session: %v", err)
	}
	var rpcErr *openenv.RPCError
	if err := c.CloseSession(ctx, sid); !errors.As(err, &rpcErr) || rpcErr.Code != openenv.RPCInvalidParams {
		t.Fatalf("closing twice: %v", err)
	}
	// Sessionless tools/call plays a fresh episode of the given seed.
	raw, err := c.MCP(ctx, openenv.MethodToolsCall, map[string]any{"name": "get_reservation_details", "arguments": map[string]any{"reservation_id": "NOPE00"}, "seed": 1})
	if err != nil || !bytes.Contains(raw, []byte("reservation not found")) {
		t.Fatalf("sessionless tools/call: %s, %v", raw, err)
	}
	// Its seed is read as reset reads one: the same forms, the same messages.
	for _, seed := range []any{7, 7.0, "7", json.RawMessage(`7e0`)} {
		raw, err := c.MCP(ctx, openenv.MethodToolsCall, map[string]any{"name": "get_user_details", "arguments": map[string]any{"user_id": "nobody_1"}, "seed": seed})
		var r struct {
			Meta struct{ Seed int64 } `json:"_meta"`
		}
		if err != nil || json.Unmarshal(raw, &r) != nil || r.Meta.Seed != 7 {
			t.Fatalf("tools/call seed %v: %s, %v; want an episode of seed 7", seed, raw, err)
		}
	}
	for seed, want := range map[string]string{"-1": "greater than or equal to 0", "9223372036854775808": "less than or equal to 9223372036854775807", `"x"`: "valid integer", "7.5": "valid integer"} {
		_, err := c.MCP(ctx, openenv.MethodToolsCall, map[string]any{"name": "get_user_details", "arguments": map[string]any{"user_id": "x"}, "seed": json.RawMessage(seed)})
		if !errors.As(err, &rpcErr) || rpcErr.Code != openenv.RPCInvalidParams || !strings.Contains(rpcErr.Message, want) {
			t.Errorf("tools/call seed %s: %v, want %q", seed, err, want)
		}
	}
	for _, tc := range []struct {
		method string
		params any
		code   int
	}{
		{"tools/call", map[string]any{"name": "book_flight"}, openenv.RPCInvalidParams},
		{"tools/call", map[string]any{"arguments": map[string]any{}}, openenv.RPCInvalidParams},
		{"tools/call", map[string]any{"name": "get_user_details", "arguments": map[string]any{"user_id": 3}}, openenv.RPCInvalidParams},
		{"tools/call", map[string]any{"name": "get_user_details", "arguments": map[string]any{"user_id": "x"}, "session_id": "gone"}, openenv.RPCInvalidParams},
		{"initialize", nil, openenv.RPCMethodNotFound},
		{"tools/list", map[string]any{"session_id": "gone"}, openenv.RPCInvalidParams},
	} {
		if _, err := c.MCP(ctx, tc.method, tc.params); !errors.As(err, &rpcErr) || rpcErr.Code != tc.code {
			t.Errorf("%s %v: %v, want code %d", tc.method, tc.params, err, tc.code)
		}
	}
	resp, err := http.Post(f.base+"/mcp", "application/json", strings.NewReader(`{"jsonrpc": "2.0", "method"`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"code":-32700`)) {
		t.Fatalf("parse error: %d %s", resp.StatusCode, b)
	}
	// Answered in JSON-RPC, as WS /mcp answers an oversized frame.
	resp, err = http.Post(f.base+"/mcp", "application/json", strings.NewReader(`{"pad": "`+strings.Repeat("p", 2<<20)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"code":-32600`)) || !bytes.Contains(b, []byte("env.max_message_bytes")) {
		t.Fatalf("oversized /mcp body: %d %.300s", resp.StatusCode, b)
	}
	// session/create takes no session_id: one of another type is ignored.
	raw, err = c.MCP(ctx, openenv.MethodSessionCreate, map[string]any{"session_id": 5})
	if err != nil || !bytes.Contains(raw, []byte(`"session_id"`)) {
		t.Fatalf("session/create with a numeric session_id: %s, %v", raw, err)
	}
}

// TestToolsListKeepsSessionAlive: tools/list on a named session counts as
// its activity, so a session polled that way is not evicted.
func TestToolsListKeepsSessionAlive(t *testing.T) {
	cfg := testConfig()
	cfg.IdleTimeout = 400 * time.Millisecond
	f := start(t, cfg, nil, nil)
	ctx := ctxT(t)
	c := f.client("")
	sid, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 8 { // 800 ms: twice the idle timeout
		time.Sleep(100 * time.Millisecond)
		if _, err := c.MCP(ctx, openenv.MethodToolsList, map[string]any{"session_id": sid}); err != nil {
			t.Fatalf("tools/list on a polled session: %v", err)
		}
	}
	if _, err := c.State(ctx, sid); err != nil {
		t.Fatalf("state of a session kept alive by tools/list: %v", err)
	}
}

// TestMCPActionsOverWS: openenv's MCPToolClient (simulation mode) sends
// list_tools and call_tool as step actions; their answers have the shapes
// it parses.
func TestMCPActionsOverWS(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	ctx := ctxT(t)
	s, err := f.client("").Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A call_tool before any reset starts an episode, as tools/call does
	// (MCPToolClient calls tools without a reset); an unknown tool is a
	// validation error, not "no episode".
	if _, err := s.StepRaw(ctx, map[string]any{"type": "call_tool", "tool_name": "book_flight", "arguments": map[string]any{}}); err == nil || !strings.Contains(err.Error(), openenv.CodeValidation) {
		t.Fatalf("call_tool of an unknown tool before a reset: %v, want %s", err, openenv.CodeValidation)
	}
	raw, err := s.StepRaw(ctx, map[string]any{"type": "call_tool", "tool_name": "get_reservation_details", "arguments": map[string]any{"reservation_id": "NOPE00"}})
	if err != nil || !bytes.Contains(raw, []byte("reservation not found")) {
		t.Fatalf("call_tool before a reset: %s, %v", raw, err)
	}
	seed := int64(2)
	s.Reset(ctx, openenv.ResetRequest{Seed: &seed})
	raw, err = s.StepRaw(ctx, map[string]any{"type": "list_tools"})
	if err != nil || !bytes.Contains(raw, []byte(`"input_schema"`)) {
		t.Fatalf("list_tools: %s, %v", raw, err)
	}
	raw, err = s.StepRaw(ctx, map[string]any{"type": "call_tool", "tool_name": "get_reservation_details", "arguments": map[string]any{"reservation_id": "NOPE00"}})
	var obs struct {
		Observation struct {
			ToolName string                  `json:"tool_name"`
			Result   openenv.ToolsCallResult `json:"result"`
		} `json:"observation"`
		Done bool `json:"done"`
	}
	if err != nil || json.Unmarshal(raw, &obs) != nil || obs.Observation.ToolName != "get_reservation_details" ||
		!strings.Contains(string(obs.Observation.Result.Data), "reservation not found") || obs.Done {
		t.Fatalf("call_tool: %s, %v", raw, err)
	}
	r, err := s.MCP(ctx, "tools/list", nil)
	if err != nil || r.Error != nil {
		t.Fatalf("mcp frame tools/list: %+v, %v", r, err)
	}
}

// TestAuth: with a token, everything but health needs it, as a bearer
// header, a Basic password (the URL form openenv's clients use) or ?token=.
func TestAuth(t *testing.T) {
	cfg := testConfig()
	cfg.BearerToken = "s3cret"
	f := start(t, cfg, nil, nil)
	ctx := ctxT(t)
	get := func(url string, h http.Header) int {
		req, _ := http.NewRequest("GET", url, nil)
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		url    string
		h      http.Header
		status int
	}{
		{f.http.URL + "/health", nil, 200},
		{f.base + "/health", nil, 200},
		{f.base + "/schema", nil, 401},
		{f.base + "/openapi.json", nil, 401},
		{f.base + "/openapi.json?token=s3cret", nil, 200},
		{f.http.URL + "/v1/environments", nil, 401},
		{f.base + "/schema", http.Header{"Authorization": {"Bearer wrong"}}, 401},
		{f.base + "/schema", http.Header{"Authorization": {"Bearer s3cret"}}, 200},
		{f.base + "/schema", http.Header{"Authorization": {"bearer s3cret"}}, 200}, // RFC 7235: the scheme in any case
		{f.base + "/schema", http.Header{"Authorization": {"basic dHJhY2U6czNjcmV0"}}, 200},
		// A reverse proxy's own Basic credentials, passed on, do not hide ?token=.
		{f.base + "/schema?token=s3cret", http.Header{"Authorization": {"Basic cHJveHk6cGFzcw=="}}, 200},
		{f.base + "/schema", http.Header{"Authorization": {"Basic cHJveHk6cGFzcw=="}}, 401},
		{f.base + "/schema?token=s3cret", nil, 200},
		{strings.Replace(f.base, "http://", "http://trace:s3cret@", 1) + "/schema", nil, 200},
		{strings.Replace(f.base, "http://", "http://trace:nope@", 1) + "/schema", nil, 401},
	} {
		if got := get(tc.url, tc.h); got != tc.status {
			t.Errorf("GET %s %v: %d, want %d", tc.url, tc.h, got, tc.status)
		}
	}
	if _, err := f.client("").Dial(ctx); err == nil {
		t.Fatal("WebSocket without the token was accepted")
	}
	s, err := f.client("s3cret").Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	envs, err := envclient.ListEnvironments(ctx, f.http.URL, "s3cret")
	if err != nil || len(envs) != 1 || envs[0].ID != exampleID || len(envs[0].Tools) != 4 || envs[0].Source != "file" ||
		envs[0].URL != "/v1/environments/"+exampleID || envs[0].ProgramHash == "" {
		t.Fatalf("environments %+v, %v", envs, err)
	}
	resp, err := http.Get(f.http.URL + "/v1/environments/nope/schema?token=s3cret")
	if err != nil || resp.StatusCode != 404 {
		t.Fatalf("unknown environment: %v %v", resp.StatusCode, err)
	}
}

// TestObservationShape: the hand-encoded observation has exactly the
// members of openenv.StepResponse and openenv.Observation, no others.
func TestObservationShape(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	ctx := ctxT(t)
	lp := playLocal(t, 9)
	s, err := f.client("").Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	raws := []json.RawMessage{}
	fr, err := s.Send(ctx, []byte(`{"type":"reset","data":{"seed":9,"hint":true}}`))
	if err != nil || fr.Type != "observation" {
		t.Fatalf("%+v %v", fr, err)
	}
	raws = append(raws, fr.Data)
	for _, a := range lp.actions {
		raw, err := s.StepRaw(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		raws = append(raws, raw)
	}
	for i, raw := range raws {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		var r openenv.StepResponse
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("observation %d does not decode strictly: %v\n%s", i, err, raw)
		}
		again, _ := json.Marshal(r)
		var a, b map[string]any
		json.Unmarshal(raw, &a)
		json.Unmarshal(again, &b)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("observation %d: hand encoding\n%s\nstruct encoding\n%s", i, raw, again)
		}
	}
}

// TestHugeStepTimeout: a stateless step with a timeout_s far beyond what a
// Duration holds plays normally under the server's step timeout (it used
// to overflow into a negative deadline and time out at once).
func TestHugeStepTimeout(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	lp := playLocal(t, 3)
	action, _ := json.Marshal(lp.actions[0])
	for _, ts := range []string{"1e10", "1e300"} {
		resp, err := http.Post(f.base+"/step", "application/json",
			strings.NewReader(`{"seed": 3, "timeout_s": `+ts+`, "action": `+string(action)+`}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var obs openenv.StepResponse
		if resp.StatusCode != 200 || json.Unmarshal(b, &obs) != nil || obs.Observation.StepCount != 1 {
			t.Errorf("timeout_s %s: %d %.300s", ts, resp.StatusCode, b)
		}
	}
}

// TestClientStepUnsetRoleAndType: the Go client's Step (HTTP and
// WebSocket) with a ChatMessage whose role and tool-call types are unset
// plays it as the server plays a message without them: an assistant
// message with function calls. The client sent them as "" (the struct's
// zero values), which the server refuses (role must be "assistant").
func TestClientStepUnsetRoleAndType(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	ctx := ctxT(t)
	lp := playLocal(t, 4)
	first := lp.actions[0]
	if len(first.ToolCalls) == 0 {
		t.Fatal("the reference's first turn has no tool calls")
	}
	bare := openenv.ChatMessage{Content: first.Content}
	for _, tc := range first.ToolCalls {
		bare.ToolCalls = append(bare.ToolCalls, openenv.ChatToolCall{Function: tc.Function})
	}
	want := lp.results[0][len(lp.results[0])-1].Content
	seed := int64(4)
	c := f.client("")
	obs, err := c.Step(ctx, "", &seed, bare)
	if err != nil || obs.Observation.StepCount != 1 || obs.Observation.LastToolResult == nil || *obs.Observation.LastToolResult != want {
		t.Fatalf("HTTP step without role and types: %+v, %v", obs.Observation.LastToolResult, err)
	}
	s, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatal(err)
	}
	if obs, err = s.Step(ctx, bare); err != nil || obs.Observation.LastToolResult == nil || *obs.Observation.LastToolResult != want {
		t.Fatalf("WebSocket step without role and types: %+v, %v", obs.Observation.LastToolResult, err)
	}
	if obs, err = s.Step(ctx, openenv.ChatMessage{Content: "done"}); err != nil || !obs.Done || obs.Observation.DoneReason != "final" {
		t.Fatalf("final answer without role: %+v, %v", obs, err)
	}
	if bare.Role != "" || bare.ToolCalls[0].Type != "" {
		t.Fatalf("the caller's message was changed: %+v", bare)
	}
}

// TestWSOrigins: a WebSocket from a page of another site (an Origin header
// naming another host) is refused unless env.ws_origins allows it; a
// client that sends no Origin (trainers' clients) always connects.
func TestWSOrigins(t *testing.T) {
	for _, tc := range []struct {
		origins []string
		origin  string
		ok      bool
	}{
		{nil, "", true},
		{nil, "http://example.com", false},
		{[]string{"example.com"}, "http://example.com", true},
		{[]string{"*.example.com"}, "https://lab.example.com", true},
		{[]string{"*.example.com"}, "https://example.org", false},
		{[]string{"*"}, "http://anything.test:8080", true},
	} {
		cfg := testConfig()
		cfg.WSOrigins = tc.origins
		f := start(t, cfg, nil, nil)
		opts := &websocket.DialOptions{HTTPHeader: http.Header{}}
		if tc.origin != "" {
			opts.HTTPHeader.Set("Origin", tc.origin)
		}
		c, resp, err := websocket.Dial(ctxT(t), "ws"+strings.TrimPrefix(f.base, "http")+"/ws", opts)
		if (err == nil) != tc.ok {
			t.Errorf("origins %v, Origin %q: dial error %v, want connected %v", tc.origins, tc.origin, err, tc.ok)
		}
		if err == nil {
			c.CloseNow()
		} else if resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("origins %v, Origin %q: refused with %v, want 403", tc.origins, tc.origin, resp)
		}
	}
	cfg := testConfig()
	cfg.WSOrigins = []string{"example.com", "[bad"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "env.ws_origins[1]") {
		t.Fatalf("a bad origin pattern: %v, want an error naming env.ws_origins[1]", err)
	}
}

// TestValidationLocations: a validation error is located where the request
// put it: in POST /step's and POST /reset's body (["body", "action", …],
// ["body", "seed"], as FastAPI locates them), in a step frame's data, and
// for a call_tool action at its tool_name and arguments.
func TestValidationLocations(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	post := func(path, body string) []any {
		t.Helper()
		resp, err := http.Post(f.base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var he struct {
			Detail []struct {
				Loc []any `json:"loc"`
			} `json:"detail"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&he); err != nil || resp.StatusCode != 422 || len(he.Detail) == 0 {
			t.Fatalf("POST %s %s: %d %+v %v", path, body, resp.StatusCode, he, err)
		}
		return he.Detail[0].Loc
	}
	for body, want := range map[string]string{
		`{"seed": -1}`:      `["body","seed"]`,
		`{"seed": "x"}`:     `["body","seed"]`,
		`{"episode_id": 3}`: `["body","episode_id"]`,
		`[1]`:               `["body"]`,
	} {
		got, _ := json.Marshal(post("/reset", body))
		if string(got) != want {
			t.Errorf("POST /reset %s: loc %s, want %s", body, got, want)
		}
	}
	for body, want := range map[string]string{
		`{"action": {"role": "assistant", "content": "x"}, "seed": -1}`:                                         `["body","seed"]`,
		`{"action": {"tool_calls": [{"function": {"name": "nope"}}]}}`:                                          `["body","action","tool_calls",0,"function","name"]`,
		`{"action": {"tool_calls": [{"function": {"name": "get_user_details", "arguments": {"user_id": 3}}}]}}`: `["body","action","tool_calls",0,"function","arguments"]`,
		`{"action": {"type": "call_tool", "tool_name": "nope", "arguments": {}}}`:                               `["body","action","tool_name"]`,
		`{"action": {"type": "call_tool", "tool_name": "get_user_details", "arguments": {"user_id": 3}}}`:       `["body","action","arguments"]`,
	} {
		got, _ := json.Marshal(post("/step", body))
		if string(got) != want {
			t.Errorf("POST /step %s: loc %s, want %s", body, got, want)
		}
	}
	s, err := f.client("").Dial(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.StepRaw(ctxT(t), map[string]any{"type": "call_tool", "tool_name": "nope", "arguments": map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), `call_tool: unknown tool "nope"`) {
		t.Fatalf("WS call_tool of an unknown tool: %v", err)
	}
}

// TestAnswersAreNotSniffed: every HTTP answer, which may carry a
// program's text (its docstring, tool results, the transcript), says
// X-Content-Type-Options: nosniff, errors and refusals too.
func TestAnswersAreNotSniffed(t *testing.T) {
	cfg := testConfig()
	cfg.BearerToken = "s3cret"
	f := start(t, cfg, nil, nil)
	for _, tc := range []struct {
		method, path, body string
		status             int
	}{
		{"GET", "/v1/environments?token=s3cret", "", 200},
		{"GET", "/v1/environments/" + exampleID + "/metadata?token=s3cret", "", 200},
		{"GET", "/v1/environments/" + exampleID + "/openapi.json?token=s3cret", "", 200},
		{"POST", "/v1/environments/" + exampleID + "/reset?token=s3cret", `{"seed": 1}`, 200},
		{"POST", "/v1/environments/" + exampleID + "/step?token=s3cret", `{"action": {"role": "assistant", "content": "Done."}}`, 200},
		{"POST", "/v1/environments/" + exampleID + "/mcp?token=s3cret", `{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}`, 200},
		{"POST", "/v1/environments/" + exampleID + "/step?token=s3cret", `{"action": {"role": "assistant", "tool_calls": 1}}`, 422},
		{"GET", "/v1/environments/" + exampleID + "/metadata", "", 401},
		{"GET", "/v1/environments/nope/health", "", 404},
		{"GET", "/health", "", 200},
	} {
		req, _ := http.NewRequest(tc.method, f.http.URL+tc.path, strings.NewReader(tc.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s %s: %d, X-Content-Type-Options %q, want %d and nosniff", tc.method, tc.path, resp.StatusCode, resp.Header.Get("X-Content-Type-Options"), tc.status)
		}
	}
}

// TestNotFoundAndMethodJSON: an unknown path is a 404 and another method
// on a known path a 405 with Allow, both with a JSON detail as
// openenv-core's server (FastAPI) answers them, not net/http's text.
func TestNotFoundAndMethodJSON(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	for _, tc := range []struct {
		method, path string
		status       int
		detail       string
		allow        string
	}{
		{"GET", "/nope", 404, "Not Found", ""},
		{"GET", "/v1/environments/" + exampleID + "/nope", 404, "Not Found", ""},
		{"GET", "/v1/environments/" + exampleID + "/reset", 405, "Method Not Allowed", "POST"},
		{"DELETE", "/v1/environments/" + exampleID + "/mcp", 405, "Method Not Allowed", "POST, GET"},
		{"POST", "/v1/environments", 405, "Method Not Allowed", "GET"},
		{"POST", "/health", 405, "Method Not Allowed", "GET"},
		{"POST", "/v1/environments/" + exampleID + "/health", 405, "Method Not Allowed", "GET"},
	} {
		req, _ := http.NewRequest(tc.method, f.http.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Detail string }
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || err != nil || body.Detail != tc.detail || resp.Header.Get("Allow") != tc.allow ||
			resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %q (Allow %q, %s, %v), want %d %q (Allow %q)", tc.method, tc.path, resp.StatusCode, body.Detail,
				resp.Header.Get("Allow"), resp.Header.Get("Content-Type"), err, tc.status, tc.detail, tc.allow)
		}
	}
}

// TestPlainHTTPOnWebSocketPaths: a plain HTTP request to /ws or to the
// WebSocket /mcp is answered 426 in the JSON shape of the other errors,
// saying how to connect; a WebSocket client still connects.
func TestPlainHTTPOnWebSocketPaths(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	for _, path := range []string{"/ws", "/mcp"} {
		resp, err := http.Get(f.base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var he openenv.HTTPError
		if resp.StatusCode != http.StatusUpgradeRequired || resp.Header.Get("Content-Type") != "application/json" ||
			resp.Header.Get("Upgrade") != "websocket" || json.Unmarshal(b, &he) != nil || !strings.Contains(fmt.Sprint(he.Detail), "speaks WebSocket only") {
			t.Errorf("GET %s: %d %v %s", path, resp.StatusCode, resp.Header, b)
		}
	}
	s, err := f.client("").Dial(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

// TestStateSessionQuery: GET /state takes the session as ?session_id= (as
// openapi.json documents), as well as the header.
func TestStateSessionQuery(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	ctx := ctxT(t)
	c := f.client("")
	sid, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seed := int64(3)
	obs, err := c.Reset(ctx, openenv.ResetRequest{Seed: &seed, SessionID: sid})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(f.base + "/state?session_id=" + sid)
	if err != nil {
		t.Fatal(err)
	}
	var st openenv.State
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || st.EpisodeID == nil || *st.EpisodeID != obs.Observation.EpisodeID {
		t.Fatalf("GET /state?session_id=: %d %+v, %v; want episode %s", resp.StatusCode, st, err, obs.Observation.EpisodeID)
	}
	resp, err = http.Get(f.base + "/state?session_id=nope")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /state?session_id=nope: %d, want 404", resp.StatusCode)
	}
}

// TestObservationSchema: the observations a WebSocket session answers (an
// assistant message's, and those of openenv's list_tools and call_tool
// actions) validate against GET /schema's observation schema.
func TestObservationSchema(t *testing.T) {
	f := start(t, testConfig(), nil, nil)
	ctx := ctxT(t)
	sch, err := f.client("").Schema(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(sch.Observation))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource("observation.json", doc); err != nil {
		t.Fatal(err)
	}
	obsSchema, err := c.Compile("observation.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := f.client("").Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lp := playLocal(t, 4)
	for _, frame := range []string{
		`{"type":"reset","data":{"seed":4}}`,
		`{"type":"step","data":` + string(mustJSON(t, lp.actions[0])) + `}`,
		`{"type":"step","data":{"type":"list_tools"}}`,
		`{"type":"step","data":{"type":"call_tool","tool_name":"get_user_details","arguments":{"user_id":"nobody_1"}}}`,
		`{"type":"step","data":{"role":"assistant","content":"done"}}`,
	} {
		fr, err := s.Send(ctx, []byte(frame))
		if err != nil || fr.Type != "observation" {
			t.Fatalf("%s: %s %s, %v", frame, fr.Type, fr.Data, err)
		}
		var body struct {
			Observation json.RawMessage `json:"observation"`
		}
		if err := json.Unmarshal(fr.Data, &body); err != nil {
			t.Fatal(err)
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body.Observation))
		if err != nil {
			t.Fatal(err)
		}
		if err := obsSchema.Validate(v); err != nil {
			t.Errorf("%s: the observation %.300s does not fit GET /schema's: %v", frame, body.Observation, err)
		}
	}
}
