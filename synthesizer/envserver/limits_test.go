package envserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/envserver"
	"github.com/traceops/trace/synthesizer/openenv"
)

func loadSpin(t testing.TB) envprog.Env { return loadSpinWith(t, envprog.Load) }

func loadSpinWith(t testing.TB, load func(context.Context, string, []byte, envprog.Limits) (envprog.Env, error)) envprog.Env {
	t.Helper()
	src, err := os.ReadFile("testdata/spin.star")
	if err != nil {
		t.Fatal(err)
	}
	// The program's own limits are far away: the server's step timeout
	// is what stops it.
	env, err := load(context.Background(), "spin.star", src, envprog.Limits{MaxSteps: 1 << 62, CallTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}

// waitFor polls cond (the server releases sessions asynchronously, after
// the connection ends).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCapacity: the session after the last allowed one is answered
// CAPACITY_REACHED (WebSocket) or a JSON-RPC server error with the counts
// (openenv/session/create); a freed slot is usable again.
func TestCapacity(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSessions = 2
	f := start(t, cfg, nil, nil)
	ctx := ctxT(t)
	c := f.client("")
	seed := int64(1)
	a, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatal(err)
	}
	sid, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	third, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = third.Reset(ctx, openenv.ResetRequest{Seed: &seed})
	if !isCode(err, openenv.CodeCapacityReached) || !strings.Contains(err.Error(), "2/2") {
		t.Fatalf("third session: %v, want CAPACITY_REACHED 2/2", err)
	}
	if _, _, err := third.Conn().Read(ctx); websocket.CloseStatus(err) != websocket.StatusTryAgainLater {
		t.Fatalf("after CAPACITY_REACHED the connection should close with 1013: %v", err)
	}
	_, err = c.CreateSession(ctx)
	var rpcErr *openenv.RPCError
	if !errors.As(err, &rpcErr) || rpcErr.Code != openenv.RPCServerError || !strings.Contains(rpcErr.Message, "capacity") {
		t.Fatalf("session/create at capacity: %v", err)
	}
	data, _ := json.Marshal(rpcErr.Data)
	if string(data) != `{"active_sessions":2,"max_sessions":2}` {
		t.Fatalf("capacity data %s", data)
	}
	if got := counter(t, f, "trace_env_sessions_open", nil); got != 2 {
		t.Fatalf("trace_env_sessions_open = %v, want 2", got)
	}
	if err := c.CloseSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
	a.Close()
	waitFor(t, "both slots free", func() bool { return counter(t, f, "trace_env_sessions_open", nil) == 0 })
	b, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatalf("a freed slot: %v", err)
	}
	if got := counter(t, f, "trace_env_errors_total", map[string]string{"code": openenv.CodeCapacityReached}); got != 2 {
		t.Fatalf("CAPACITY_REACHED counted %v times, want 2", got)
	}
}

// TestIdleEviction: a session without frames for longer than the idle
// timeout gets SESSION_ERROR (on the WebSocket /mcp, a JSON-RPC error with
// that code) and its connection closes; an idle HTTP session is gone;
// every slot is freed.
func TestIdleEviction(t *testing.T) {
	cfg := testConfig()
	cfg.IdleTimeout = 300 * time.Millisecond
	f := start(t, cfg, nil, nil)
	ctx := ctxT(t)
	c := f.client("")
	s, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seed := int64(2)
	if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatal(err)
	}
	sid, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mcp, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(f.base, "http")+"/mcp", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mcp.CloseNow()
	// Nothing is sent: the eviction frame arrives by itself.
	_, b, err := s.Conn().Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var fr struct {
		Type string            `json:"type"`
		Data openenv.ErrorData `json:"data"`
	}
	if json.Unmarshal(b, &fr) != nil || fr.Type != "error" || fr.Data.Code != openenv.CodeSession || !strings.Contains(fr.Data.Message, "idle") {
		t.Fatalf("eviction frame %s", b)
	}
	if _, _, err := s.Conn().Read(ctx); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("after eviction: %v, want close 1008", err)
	}
	// The WebSocket /mcp says so too, as a JSON-RPC error, then closes.
	_, b, err = mcp.Read(ctx)
	var rpc struct {
		ID    json.RawMessage `json:"id"`
		Error struct {
			Code    int               `json:"code"`
			Message string            `json:"message"`
			Data    map[string]string `json:"data"`
		} `json:"error"`
	}
	if err != nil || json.Unmarshal(b, &rpc) != nil || string(rpc.ID) != "null" || rpc.Error.Code != openenv.RPCServerError ||
		!strings.Contains(rpc.Error.Message, "idle") || rpc.Error.Data["code"] != openenv.CodeSession {
		t.Fatalf("/mcp eviction message %s, %v", b, err)
	}
	if _, _, err := mcp.Read(ctx); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("/mcp after eviction: %v, want close 1008", err)
	}
	waitFor(t, "the HTTP session's eviction", func() bool {
		_, err := c.State(ctx, sid)
		return err != nil && strings.Contains(err.Error(), "404")
	})
	waitFor(t, "no session open", func() bool { return counter(t, f, "trace_env_sessions_open", nil) == 0 })
	if got := counter(t, f, "trace_env_sessions_evicted_total", nil); got != 3 {
		t.Fatalf("evicted %v, want 3", got)
	}
	// A session in use is not evicted: steps every 100 ms for 1 s.
	s2, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for range 10 {
		if _, err := s2.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
			t.Fatalf("an active session was evicted: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestStepTimeout: a step that runs past env.step_timeout is answered
// EXECUTION_ERROR at the deadline (the program does not stop on its own:
// its limits are an hour away); the episode is over, the session goes on.
// In process, the call is abandoned on the session's worker goroutine; in
// the sandbox, which the session calls directly (ReturnsByDeadline), the
// parent stops waiting and cancels the call in the worker.
func TestStepTimeout(t *testing.T) {
	for _, c := range []struct {
		name string
		load func(context.Context, string, []byte, envprog.Limits) (envprog.Env, error)
	}{{"in-process", envprog.Load}, {"sandboxed", envprog.LoadSandboxed}} {
		t.Run(c.name, func(t *testing.T) { testStepTimeout(t, loadSpinWith(t, c.load)) })
	}
}

func testStepTimeout(t *testing.T, env envprog.Env) {
	cfg := testConfig()
	cfg.StepTimeout = 300 * time.Millisecond
	f := start(t, cfg, nil, map[string]envprog.Env{"spin": env})
	ctx := ctxT(t)
	c := f.client("")
	c.BaseURL = f.http.URL + "/v1/environments/spin"
	s, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	seed := int64(10)
	if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatal(err)
	}
	spin := func(n int64) openenv.ChatMessage {
		return openenv.ChatMessage{Role: "assistant", ToolCalls: []openenv.ChatToolCall{{ID: "s", Type: "function",
			Function: openenv.ChatFunction{Name: "spin", Arguments: `{"n": ` + jsonInt(n) + `}`}}}}
	}
	_, err = s.Step(ctx, spin(1<<50))
	if !isCode(err, openenv.CodeExecution) || !strings.Contains(err.Error(), "timed out after 300ms") {
		t.Fatalf("long step: %v, want EXECUTION_ERROR timed out", err)
	}
	if _, err := s.Step(ctx, spin(1)); !isCode(err, openenv.CodeExecution) || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("step after a timeout: %v, want the episode over", err)
	}
	if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatal(err)
	}
	obs, err := s.Step(ctx, spin(10))
	if err != nil || *obs.Observation.LastToolResult != "10" {
		t.Fatalf("after the timeout: %+v, %v", obs, err)
	}
	obs, err = s.Step(ctx, openenv.ChatMessage{Role: "assistant", Content: "counted"})
	if err != nil || !obs.Done || *obs.Reward != 1 {
		t.Fatalf("final: %+v, %v", obs, err)
	}
	// The HTTP timeout_s of a step lowers the deadline further.
	sid, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Reset(ctx, openenv.ResetRequest{Seed: &seed, SessionID: sid})
	_, err = c.Step(ctx, sid, nil, spin(1<<50))
	if err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("HTTP long step: %v", err)
	}
}

func jsonInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestHugeFrameCloses: a frame over the size limit is answered
// VALIDATION_ERROR and the session goes on (TestProtocolErrors) up to 64
// times the limit; a larger one closes the connection with 1009.
func TestHugeFrameCloses(t *testing.T) {
	cfg := testConfig()
	cfg.MaxMessageBytes = 4096
	f := start(t, cfg, nil, nil)
	ctx := ctxT(t)
	s, err := f.client("").Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A frame of n bytes in all.
	big := func(n int) []byte {
		const frame = `{"type":"step","data":{"content":""}}`
		return []byte(`{"type":"step","data":{"content":"` + strings.Repeat("x", n-len(frame)) + `"}}`)
	}
	fr, err := s.Send(ctx, big(64*4096))
	if err != nil || fr.Type != "error" || !strings.Contains(string(fr.Data), openenv.CodeValidation) {
		t.Fatalf("a frame of 64 × the limit: %+v, %v, want VALIDATION_ERROR", fr, err)
	}
	if err := s.Conn().Write(ctx, websocket.MessageText, big(64*4096+1)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Conn().Read(ctx); websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		t.Fatalf("after a frame over 64 × the limit: %v, want close 1009", err)
	}
}

// nonFiniteProg ends its episode on the first turn with a reward whose
// component is infinite (float("inf"), or an overflow such as 1e308 * 10,
// or math's log(0)): JSON has no such number.
const nonFiniteProg = `
def tools():
    return [{"type": "function", "function": {"name": "noop", "description": "Does nothing.", "parameters": {"type": "object", "properties": {}}}}]

def reset(seed):
    return {"system": "s", "user": "u", "state": {}}

def step(state, call):
    return {"result": "ok", "state": state, "done": True}

def reward(state, transcript):
    return {"reward": 0.5, "components": {"ratio": float("inf")}}
`

// TestNonFiniteRewardComponent: a reward component that is not a finite
// number is the program's error (EXECUTION_ERROR naming it, the episode
// over), on every transport: the observation cannot encode it, and the
// step must be answered, not left hanging.
func TestNonFiniteRewardComponent(t *testing.T) {
	env, err := envprog.Load(context.Background(), "nonfinite.star", []byte(nonFiniteProg), envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	f := start(t, testConfig(), nil, map[string]envprog.Env{"nonfinite": env})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := f.client("")
	c.BaseURL = f.http.URL + "/v1/environments/nonfinite"
	want := func(how string, err error) {
		t.Helper()
		if !isCode(err, openenv.CodeExecution) || !strings.Contains(err.Error(), "ratio") {
			t.Fatalf("%s: %v, want EXECUTION_ERROR naming the component", how, err)
		}
	}
	s, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, call := range []openenv.ChatMessage{
		{Content: "done"},
		{ToolCalls: []openenv.ChatToolCall{{ID: "c1", Function: openenv.ChatFunction{Name: "noop", Arguments: "{}"}}}},
	} {
		if _, err := s.Reset(ctx, openenv.ResetRequest{}); err != nil {
			t.Fatal(err)
		}
		_, err = s.Step(ctx, call)
		want("WebSocket step", err)
		st, err := s.State(ctx)
		if err != nil || !st.Done {
			t.Fatalf("state after the failed reward: %+v %v, want done", st, err)
		}
	}
	_, err = c.Step(ctx, "", nil, openenv.ChatMessage{Content: "done"})
	want("HTTP step", err)
	_, err = c.CallTool(ctx, "", "noop", nil)
	var rpcErr *openenv.RPCError
	if !errors.As(err, &rpcErr) || rpcErr.Code != openenv.RPCInternalError || !strings.Contains(rpcErr.Message, "ratio") {
		t.Fatalf("tools/call: %v, want an internal error naming the component", err)
	}
	if got := counter(t, f, "trace_env_episodes_total", map[string]string{"environment": "nonfinite", "done_reason": "error"}); got != 4 {
		t.Fatalf("episodes ended on the error: %v, want 4", got)
	}
}

// TestSettingName: the limits a client hits, and a bad Config, are named
// by Options.SettingName (trace env serve names its flags), else as the
// configuration spells them.
func TestSettingName(t *testing.T) {
	flag := func(key string) string { return "--" + strings.ReplaceAll(key, "_", "-") }
	bad := envserver.DefaultConfig()
	bad.MaxSessions = 0
	if _, err := envserver.New(bad, envserver.Options{Catalog: envserver.NewStaticCatalog(), SettingName: flag}); err == nil || !strings.Contains(err.Error(), "--max-sessions: 0") {
		t.Fatalf("New with max_sessions 0 and flag names: %v", err)
	}
	if _, err := envserver.New(bad, envserver.Options{Catalog: envserver.NewStaticCatalog()}); err == nil || !strings.Contains(err.Error(), "env.max_sessions: 0") {
		t.Fatalf("New with max_sessions 0: %v", err)
	}
	cfg := testConfig()
	cfg.MaxMessageBytes = 1024
	cat := envserver.NewStaticCatalog()
	if err := cat.Add(exampleID, loadExample(t), envserver.Entry{}); err != nil {
		t.Fatal(err)
	}
	srv, err := envserver.New(cfg, envserver.Options{Catalog: cat, SettingName: flag})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer func() {
		hs.Close()
		srv.Close(context.Background())
	}()
	resp, err := http.Post(hs.URL+"/v1/environments/"+exampleID+"/reset", "application/json", strings.NewReader(`{"pad": "`+strings.Repeat("p", 2048)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "(--max-message-bytes)") {
		t.Fatalf("an oversized body: %d %s, want 413 naming --max-message-bytes", resp.StatusCode, b)
	}
}
