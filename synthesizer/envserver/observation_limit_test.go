package envserver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/envserver"
	"github.com/traceops/trace/synthesizer/openenv"
)

// bigProg's tool returns n control characters, each of which the
// observation escapes to 6 bytes (\u0001), three times over (messages,
// tool_results, last_tool_result); seed 7340 makes the user message 2 MiB
// long.
const bigProg = `"""A test program whose tool returns as much text as it is asked for.

It exists to test the environment server's bound on an observation. It
trains nothing and transfers to nothing.
"""

def tools():
    return [{"type": "function", "function": {"name": "echo", "description": "Returns n bytes.",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}]

def reset(seed):
    return {"system": "s", "user": "x" * (2 << 20) if seed == 7340 else "u", "state": {}}

def step(state, call):
    if call["type"] == "final":
        return {"state": state, "done": True}
    return {"result": "\x01" * call["arguments"]["n"], "state": state}

def reward(state, transcript):
    return {"reward": 1.0}
`

func echo(n int) openenv.ChatMessage {
	return openenv.ChatMessage{ToolCalls: []openenv.ChatToolCall{{ID: "c1", Function: openenv.ChatFunction{Name: "echo", Arguments: fmt.Sprintf(`{"n": %d}`, n)}}}}
}

// TestObservationLimit: an observation over env.max_observation_bytes is
// not sent. The step is answered EXECUTION_ERROR saying the observation's
// size and the limit, on every transport; the episode is over (recorded
// as an error), a reset's episode is not started, and the session and the
// server go on: the next reset and a small step are answered as always.
func TestObservationLimit(t *testing.T) {
	for _, ld := range []struct {
		name string
		load func(context.Context, string, []byte, envprog.Limits) (envprog.Env, error)
	}{{"in-process", envprog.Load}, {"sandboxed", envprog.LoadSandboxed}} {
		t.Run(ld.name, func(t *testing.T) { testObservationLimit(t, ld.load) })
	}
}

func testObservationLimit(t *testing.T, load func(context.Context, string, []byte, envprog.Limits) (envprog.Env, error)) {
	env, err := load(context.Background(), "big.star", []byte(bigProg), envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	cfg := testConfig()
	cfg.MaxObservationBytes = 1 << 20
	f := start(t, cfg, nil, map[string]envprog.Env{"big": env})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := f.client("")
	c.BaseURL = f.http.URL + "/v1/environments/big"

	const (
		// 100,000 × 6 bytes: the transcript fits (600 kB), the
		// observation (1.8 MB) does not.
		over = 100_000
		// 200,000 × 6 bytes: the transcript alone does not fit.
		transcriptOver = 200_000
		bigSeed        = 7340 // a user message of 2 MiB
	)
	want := func(how string, err error, msg ...string) {
		t.Helper()
		if !isCode(err, openenv.CodeExecution) {
			t.Fatalf("%s: %v, want EXECUTION_ERROR", how, err)
		}
		for _, m := range append(msg, "over the 1048576-byte limit (env.max_observation_bytes)") {
			if !strings.Contains(err.Error(), m) {
				t.Fatalf("%s: %v, want it to say %q", how, err, m)
			}
		}
	}
	seed := int64(1)

	// WebSocket.
	s, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Step(ctx, echo(over))
	want("WebSocket step", err, "step: the observation is 18", "the episode is over, send reset")
	if st, err := s.State(ctx); err != nil || !st.Done || st.StepCount != 1 {
		t.Fatalf("state after the oversized observation: %+v %v, want done after 1 step", st, err)
	}
	_, err = s.Step(ctx, echo(1))
	if !isCode(err, openenv.CodeExecution) || !strings.Contains(err.Error(), "the episode is done (error)") {
		t.Fatalf("a step after the oversized observation: %v, want EXECUTION_ERROR: the episode is done", err)
	}
	if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatalf("a reset after the oversized observation: %v", err)
	}
	_, err = s.Step(ctx, echo(transcriptOver))
	want("WebSocket step, transcript over", err, "step: the observation's transcript alone is 12")
	bs := int64(bigSeed)
	_, err = s.Reset(ctx, openenv.ResetRequest{Seed: &bs})
	want("WebSocket reset", err, fmt.Sprintf("reset (seed %d): the observation's transcript alone is 2097", bs), "; send reset")
	if st, err := s.State(ctx); err != nil || st.EpisodeID != nil {
		t.Fatalf("state after the oversized reset: %+v %v, want no episode", st, err)
	}
	if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatalf("a reset after the oversized reset: %v", err)
	}
	r, err := s.Step(ctx, echo(10))
	if err != nil || r.Observation.LastToolResult == nil || *r.Observation.LastToolResult != strings.Repeat("\x01", 10) {
		t.Fatalf("a small step after: %+v %v", r, err)
	}

	// HTTP: stateless, then a session.
	_, err = c.Step(ctx, "", &seed, echo(over))
	want("stateless HTTP step", err, "step: the observation is 18")
	if !strings.Contains(err.Error(), "HTTP 500") {
		t.Fatalf("stateless HTTP step: %v, want HTTP 500", err)
	}
	sid, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reset(ctx, openenv.ResetRequest{Seed: &seed, SessionID: sid}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Step(ctx, sid, nil, echo(over))
	want("HTTP step", err, "step: the observation is 18", "send reset (POST …/reset with this session id)")
	if st, err := c.State(ctx, sid); err != nil || !st.Done {
		t.Fatalf("HTTP state after the oversized observation: %+v %v, want done", st, err)
	}
	if _, err := c.Reset(ctx, openenv.ResetRequest{Seed: &seed, SessionID: sid}); err != nil {
		t.Fatalf("an HTTP reset after the oversized observation: %v", err)
	}
	if _, err := c.Step(ctx, sid, nil, echo(10)); err != nil {
		t.Fatalf("a small HTTP step after: %v", err)
	}

	// MCP's tools/call: its answer is not sent either.
	_, err = c.CallTool(ctx, "", "echo", map[string]int{"n": over})
	var rpcErr *openenv.RPCError
	if !errors.As(err, &rpcErr) || rpcErr.Code != openenv.RPCInternalError || !strings.Contains(rpcErr.Message, "env.max_observation_bytes") {
		t.Fatalf("tools/call: %v, want an internal error naming env.max_observation_bytes", err)
	}

	// The server is well: the other environment plays as always.
	c.BaseURL = f.base
	if _, err := c.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatalf("the example after: %v", err)
	}
	// Episodes ended by an oversized step (WebSocket 2, HTTP 2, tools/call
	// 1); the oversized reset started none.
	if got := counter(t, f, "trace_env_episodes_total", map[string]string{"environment": "big", "done_reason": "error"}); got != 5 {
		t.Fatalf("episodes ended on the limit: %v, want 5", got)
	}
}

// TestObservationLimitConfig: env.max_observation_bytes is checked at
// start, naming the field; the default is twice the transcript's bound.
func TestObservationLimitConfig(t *testing.T) {
	if got, want := envserver.DefaultConfig().MaxObservationBytes, 2*envprog.MaxTranscriptText; got != want {
		t.Errorf("default env.max_observation_bytes %d, want %d", got, want)
	}
	for _, tc := range []struct {
		n  int
		ok bool
	}{{0, false}, {-1, false}, {64<<10 - 1, false}, {64 << 10, true}, {1 << 30, true}} {
		cfg := testConfig()
		cfg.MaxObservationBytes = tc.n
		srv, err := envserver.New(cfg, envserver.Options{Catalog: envserver.NewStaticCatalog()})
		if err == nil {
			srv.Close(context.Background())
		}
		if tc.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), fmt.Sprintf("env.max_observation_bytes: %d, must be at least 65536", tc.n))) {
			t.Errorf("env.max_observation_bytes %d: %v, want ok %v (an error naming the field)", tc.n, err, tc.ok)
		}
	}
}
