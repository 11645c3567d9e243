package envserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/openenv"
)

// oneTurnProg ends its episode on its first tool call.
const oneTurnProg = `
def tools():
    return [{"type": "function", "function": {"name": "finish", "description": "Ends the episode.", "parameters": {"type": "object", "properties": {}}}}]

def reset(seed):
    return {"system": "s", "user": "u", "state": {}}

def step(state, call):
    return {"result": "finished", "state": state, "done": True}

def reward(state, transcript):
    return {"reward": 1.0}
`

// TestDoneEpisodeSaysHowToGoOn: a request on an episode that is over is
// told how that endpoint starts the next one (a reset where there is one;
// WS …/mcp has none, a new connection is a new session), and doing what
// it says works.
func TestDoneEpisodeSaysHowToGoOn(t *testing.T) {
	env, err := envprog.Load(context.Background(), "oneturn.star", []byte(oneTurnProg), envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	f := start(t, testConfig(), nil, map[string]envprog.Env{"oneturn": env})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := f.client("")
	c.BaseURL = f.http.URL + "/v1/environments/oneturn"
	finish := openenv.ChatMessage{ToolCalls: []openenv.ChatToolCall{{ID: "c1", Function: openenv.ChatFunction{Name: "finish", Arguments: "{}"}}}}
	says := func(how, msg, want, not string) {
		t.Helper()
		if !strings.Contains(msg, "the episode is done") || !strings.Contains(msg, want) || strings.Contains(msg, not) {
			t.Fatalf("%s: %q, want it to say the episode is done and %q (not %q)", how, msg, want, not)
		}
	}

	// /ws: a reset frame, also for its mcp frames.
	s, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 2 {
		if _, err := s.Reset(ctx, openenv.ResetRequest{}); err != nil {
			t.Fatal(err)
		}
		if obs, err := s.Step(ctx, finish); err != nil || !obs.Done {
			t.Fatalf("finish: %+v, %v", obs, err)
		}
		_, err = s.Step(ctx, finish)
		if !isCode(err, openenv.CodeExecution) {
			t.Fatalf("/ws step after done: %v", err)
		}
		says("/ws step", err.Error(), "send reset", "reconnect")
		r, err := s.MCP(ctx, openenv.MethodToolsCall, map[string]any{"name": "finish"})
		if err != nil || r.Error == nil {
			t.Fatalf("/ws mcp frame after done: %+v, %v", r, err)
		}
		says("/ws mcp frame", r.Error.Message, "send reset", "reconnect")
	}

	// WS …/mcp: no reset; a new connection plays a new episode.
	for range 2 {
		mcp, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(c.BaseURL, "http")+"/mcp", nil)
		if err != nil {
			t.Fatal(err)
		}
		var msgs []openenv.RPCResponse
		for range 2 {
			if err := mcp.Write(ctx, websocket.MessageText, []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"finish"}}`)); err != nil {
				t.Fatal(err)
			}
			_, b, err := mcp.Read(ctx)
			var r openenv.RPCResponse
			if err != nil || json.Unmarshal(b, &r) != nil {
				t.Fatalf("/mcp: %s, %v", b, err)
			}
			msgs = append(msgs, r)
		}
		mcp.Close(websocket.StatusNormalClosure, "")
		if msgs[0].Error != nil || msgs[1].Error == nil {
			t.Fatalf("/mcp tools/call, then again: %+v, want a result, then an error", msgs)
		}
		says("WS /mcp tools/call", msgs[1].Error.Message, "reconnect", "send reset")
	}

	// A stateful HTTP session: POST …/reset with its id.
	sid, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if res, err := c.CallTool(ctx, sid, "finish", nil); err != nil || !res.Meta.Done {
			t.Fatalf("HTTP session tools/call: %+v, %v", res, err)
		}
		_, err = c.CallTool(ctx, sid, "finish", nil)
		var rpcErr *openenv.RPCError
		if !errors.As(err, &rpcErr) {
			t.Fatalf("HTTP session tools/call after done: %v", err)
		}
		says("HTTP session tools/call", rpcErr.Message, "POST …/reset with this session id", "reconnect")
		_, err = c.Step(ctx, sid, nil, finish)
		if !isCode(err, openenv.CodeExecution) {
			t.Fatalf("HTTP session step after done: %v", err)
		}
		says("HTTP session step", err.Error(), "POST …/reset with this session id", "reconnect")
		if _, err := c.Reset(ctx, openenv.ResetRequest{SessionID: sid}); err != nil {
			t.Fatal(err)
		}
	}
}
