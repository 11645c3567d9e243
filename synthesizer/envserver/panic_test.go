package envserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/openenv"
)

// panicEnv is an Env with a Go bug: Reset panics for seed 666, Step on a
// call of the tool "boom", an episode's Messages once a step said
// "garble" (the observation's encoding, under the session's lock), and
// the Close of an episode of seed 13. bounded
// makes it a deadlineBound Env, which the server calls on the request's
// goroutine instead of the session's worker.
type panicEnv struct{ bounded bool }

func (panicEnv) Info() envprog.Info {
	return envprog.Info{Name: "panicky", Tools: []schemas.Tool{{Type: "function",
		Function: schemas.FunctionDef{Name: "boom", Parameters: json.RawMessage(`{"type":"object"}`)}}}}
}

func (panicEnv) Reset(_ context.Context, seed int64) (envprog.Episode, error) {
	if seed == 666 {
		panic("reset bug")
	}
	return &panicEpisode{seed: seed, msgs: []envprog.Message{{Role: "system", Content: "s"}, {Role: "user", Content: "u"}}}, nil
}

func (panicEnv) Close() error              { return nil }
func (e panicEnv) ReturnsByDeadline() bool { return e.bounded }

type panicEpisode struct {
	seed    int64
	msgs    []envprog.Message
	garbled bool
}

func (p *panicEpisode) Seed() int64          { return p.seed }
func (p *panicEpisode) Start() envprog.Start { return envprog.Start{System: "s", User: "u"} }
func (p *panicEpisode) Step(_ context.Context, a envprog.Action) (envprog.StepResult, error) {
	if len(a.ToolCalls) > 0 && a.ToolCalls[0].Name == "boom" {
		panic("step bug")
	}
	p.garbled = a.Content == "garble"
	p.msgs = append(p.msgs, envprog.Message{Role: "assistant", Content: a.Content})
	return envprog.StepResult{}, nil
}

func (p *panicEpisode) Messages() []envprog.Message {
	if p.garbled {
		panic("messages bug")
	}
	return p.msgs
}

func (p *panicEpisode) Reward(context.Context) (envprog.Reward, error) {
	return envprog.Reward{Value: 1}, nil
}
func (p *panicEpisode) Hint(context.Context) (string, error)                { return "", nil }
func (p *panicEpisode) Reference(context.Context) ([]envprog.Action, error) { return nil, nil }
func (p *panicEpisode) Close() error {
	if p.seed == 13 {
		panic("close bug")
	}
	return nil
}

var boom = openenv.ChatMessage{ToolCalls: []openenv.ChatToolCall{{ID: "c1", Function: openenv.ChatFunction{Name: "boom", Arguments: "{}"}}}}

// TestPanickingEnv: a panic in an Env's Reset or Step (on the session's
// worker, or on the request's goroutine for a deadline-bound Env) or in
// encoding the observation is answered EXECUTION_ERROR on every transport,
// that episode is over, and the session, its next frame and its close, and
// the other sessions are served as before.
func TestPanickingEnv(t *testing.T) {
	for _, bounded := range []bool{false, true} {
		name := "worker"
		if bounded {
			name = "bounded"
		}
		t.Run(name, func(t *testing.T) {
			f := start(t, testConfig(), nil, map[string]envprog.Env{"panicky": panicEnv{bounded: bounded}})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c := f.client("")
			c.BaseURL = f.http.URL + "/v1/environments/panicky"
			wantPanic := func(how string, err error, what string) {
				t.Helper()
				if !isCode(err, openenv.CodeExecution) || !strings.Contains(err.Error(), what) {
					t.Fatalf("%s: %v, want EXECUTION_ERROR naming %q", how, err, what)
				}
			}
			s, err := c.Dial(ctx)
			if err != nil {
				t.Fatal(err)
			}
			seed := int64(666)
			_, err = s.Reset(ctx, openenv.ResetRequest{Seed: &seed})
			wantPanic("WebSocket reset", err, "reset bug")
			for _, tc := range []struct {
				action openenv.ChatMessage
				what   string
			}{{boom, "step bug"}, {openenv.ChatMessage{Content: "garble"}, "messages bug"}} {
				if _, err := s.Reset(ctx, openenv.ResetRequest{}); err != nil {
					t.Fatalf("reset after a panic: %v", err)
				}
				_, err = s.Step(ctx, tc.action)
				wantPanic("WebSocket step", err, tc.what)
				st, err := s.State(ctx)
				if err != nil || !st.Done {
					t.Fatalf("state after the panic: %+v, %v; want the episode over", st, err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatalf("close after a panic: %v", err)
			}

			// WebSocket /mcp: the panicking tools/call is a JSON-RPC
			// internal error, the next request is answered.
			mcp, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(c.BaseURL, "http")+"/mcp", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer mcp.CloseNow()
			for _, req := range []string{
				`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"boom","arguments":{}}}`,
				`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
			} {
				if err := mcp.Write(ctx, websocket.MessageText, []byte(req)); err != nil {
					t.Fatal(err)
				}
				_, b, err := mcp.Read(ctx)
				if err != nil {
					t.Fatalf("/mcp %s: %v", req, err)
				}
				var r openenv.RPCResponse
				if err := json.Unmarshal(b, &r); err != nil {
					t.Fatalf("/mcp answer %s: %v", b, err)
				}
				if strings.Contains(req, "boom") {
					if r.Error == nil || r.Error.Code != openenv.RPCInternalError || !strings.Contains(r.Error.Message, "step bug") {
						t.Fatalf("/mcp tools/call: %s, want an internal error naming the panic", b)
					}
				} else if r.Error != nil {
					t.Fatalf("/mcp tools/list after the panic: %s", b)
				}
			}
			mcp.Close(websocket.StatusNormalClosure, "")

			// HTTP: stateless and in a session.
			_, err = c.Step(ctx, "", nil, boom)
			wantPanic("HTTP step", err, "step bug")
			_, err = c.Reset(ctx, openenv.ResetRequest{Seed: &seed})
			wantPanic("HTTP reset", err, "reset bug")
			sid, err := c.CreateSession(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Reset(ctx, openenv.ResetRequest{SessionID: sid}); err != nil {
				t.Fatal(err)
			}
			_, err = c.Step(ctx, sid, nil, openenv.ChatMessage{Content: "garble"})
			wantPanic("HTTP session step", err, "messages bug")
			if _, err := c.Reset(ctx, openenv.ResetRequest{SessionID: sid}); err != nil {
				t.Fatalf("the HTTP session after the panic: %v", err)
			}
			_, err = c.CallTool(ctx, sid, "boom", nil)
			var rpcErr *openenv.RPCError
			if !errors.As(err, &rpcErr) || rpcErr.Code != openenv.RPCInternalError || !strings.Contains(rpcErr.Message, "step bug") {
				t.Fatalf("tools/call in the session: %v, want an internal error naming the panic", err)
			}
			if _, err := c.Reset(ctx, openenv.ResetRequest{SessionID: sid}); err != nil {
				t.Fatalf("the HTTP session after the panic: %v", err)
			}
			if err := c.CloseSession(ctx, sid); err != nil {
				t.Fatal(err)
			}

			// The other environment is served as before.
			if _, err := f.client("").Reset(ctx, openenv.ResetRequest{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "no session open", func() bool { return counter(t, f, "trace_env_sessions_open", nil) == 0 })
		})
	}
}

// TestPanickingEpisodeClose: an episode whose Close panics is let go of
// wherever that happens (a reset replacing it, the idle reaper, the end
// of a connection, a stateless request), and the server goes on.
func TestPanickingEpisodeClose(t *testing.T) {
	cfg := testConfig()
	cfg.IdleTimeout = 300 * time.Millisecond
	f := start(t, cfg, nil, map[string]envprog.Env{"panicky": panicEnv{}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := f.client("")
	c.BaseURL = f.http.URL + "/v1/environments/panicky"
	seed := int64(13)
	// Evicted by the reaper.
	s, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Conn().Read(ctx); err != nil {
		t.Fatalf("eviction frame: %v", err)
	}
	waitFor(t, "the eviction", func() bool { return counter(t, f, "trace_env_sessions_evicted_total", nil) == 1 })
	// Replaced by a reset, then ended with the connection.
	s, err = c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
			t.Fatalf("reset after an episode's Close panicked: %v", err)
		}
	}
	s.Close()
	waitFor(t, "no session open", func() bool { return counter(t, f, "trace_env_sessions_open", nil) == 0 })
	// Stateless.
	for range 2 {
		if _, err := c.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
			t.Fatalf("stateless reset: %v", err)
		}
	}
	if _, err := f.client("").Reset(ctx, openenv.ResetRequest{}); err != nil {
		t.Fatal(err)
	}
}
