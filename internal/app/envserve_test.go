package app_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer"
	"github.com/traceops/trace/synthesizer/examples"
)

// TestServeRoleServesEnvironments: the serve role's HTTP server lists the
// registry's DONE environments at /v1/environments (OpenEnv) behind the
// bearer token, plays one from a seed to its reward (sandboxed), and
// records the episode in env_episodes; a FAILED environment is not served.
// Its programs run under the programs: limits (here two turns).
func TestServeRoleServesEnvironments(t *testing.T) {
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	cfg := withRoles(w.cfg, "serve")
	cfg.HTTP.BearerToken = "s3cret-token"
	cfg.Programs.MaxTurns = 2
	a, stop := w.start(t, cfg)
	defer stop()
	<-a.Ready()
	ctx := context.Background()
	store := synthesizer.SinkStore{Rows: a.Store}
	prog := string(examples.PreconditionAirline)
	now := time.Now().UTC().Truncate(time.Second)
	done := &synthesizer.Environment{ID: "env-served", TriggerID: "t-served", Environment: "sim-airline", AgentVersion: "1.4.0",
		DictionaryVersion: 1, Capability: "precondition_verification", Status: synthesizer.StatusDone, Program: prog,
		ProgramHash: synthesizer.ProgramHash(prog), Tools: []string{"get_reservation_details"},
		Calibration: &synthesizer.Calibration{Accepted: true, Verdict: "accepted", Policy: "simulated", Simulated: true, MeanReward: 0.5},
		Request:     &schemas.SynthesisRequest{TriggerID: "t-served"}, CreatedAt: now, UpdatedAt: now, Version: 1}
	failed := *done
	failed.ID, failed.Status = "env-failed", synthesizer.StatusFailed
	for _, e := range []*synthesizer.Environment{done, &failed} {
		if err := store.SaveEnvironment(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	base := "http://" + a.HTTPAddr()
	call := func(method, path, token, body string) (int, string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, _ := call("GET", "/v1/environments", "", ""); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/environments without the token = %d, want 401", code)
	}
	if code, _ := call("GET", "/v1/environments/env-served/health", "", ""); code != http.StatusOK {
		t.Errorf("health without the token = %d, want 200", code)
	}
	code, body := call("GET", "/v1/environments", "s3cret-token", "")
	if code != 200 || !strings.Contains(body, `"env-served"`) || strings.Contains(body, "env-failed") {
		t.Fatalf("GET /v1/environments = %d %s", code, body)
	}
	if code, body := call("POST", "/v1/environments/env-failed/reset", "s3cret-token", `{"seed": 1}`); code != http.StatusNotFound {
		t.Errorf("reset of a FAILED environment = %d %s, want 404", code, body)
	}
	// One stateful session over HTTP: reset, a final answer at once (a
	// do-nothing episode), its reward.
	code, body = call("POST", "/v1/environments/env-served/mcp", "s3cret-token", `{"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}`)
	var created struct {
		Result struct {
			SessionID string `json:"session_id"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(body), &created); code != 200 || err != nil || created.Result.SessionID == "" {
		t.Fatalf("session/create = %d %s (%v)", code, body, err)
	}
	sid := created.Result.SessionID
	// programs.max_turns: the second tool call ends the episode.
	code, body = call("POST", "/v1/environments/env-served/reset", "s3cret-token", `{"seed": 6, "session_id": "`+sid+`"}`)
	if code != 200 || !strings.Contains(body, `"done":false`) {
		t.Fatalf("reset = %d %s", code, body)
	}
	lookup := `{"session_id": "` + sid + `", "action": {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
		"function": {"name": "get_user_details", "arguments": "{\"user_id\": \"nobody\"}"}}]}}`
	for turn, want := range []string{`"done":false`, `"done_reason":"max_turns"`} {
		if code, body = call("POST", "/v1/environments/env-served/step", "s3cret-token", lookup); code != 200 || !strings.Contains(body, want) {
			t.Fatalf("turn %d of programs.max_turns 2 = %d %.400s, want %s", turn+1, code, body, want)
		}
	}
	code, body = call("POST", "/v1/environments/env-served/reset", "s3cret-token", `{"seed": 4, "session_id": "`+sid+`"}`)
	if code != 200 || !strings.Contains(body, `"done":false`) {
		t.Fatalf("reset = %d %s", code, body)
	}
	code, body = call("POST", "/v1/environments/env-served/step", "s3cret-token",
		`{"session_id": "`+sid+`", "action": {"role": "assistant", "content": "I cannot help with that."}}`)
	var step struct {
		Reward *float64 `json:"reward"`
		Done   bool     `json:"done"`
	}
	if err := json.Unmarshal([]byte(body), &step); code != 200 || err != nil || !step.Done || step.Reward == nil || *step.Reward >= 1 {
		t.Fatalf("final answer = %d %s (%v)", code, body, err)
	}
	// The episode reaches env_episodes (written in batches, off the step path).
	deadline := time.Now().Add(15 * time.Second)
	for {
		var n uint64
		var reward float64
		err := testenv.StoreConn(t, a.Store).QueryRow(ctx, "SELECT count(), any(reward) FROM env_episodes WHERE environment_id = 'env-served' AND seed = 4").Scan(&n, &reward)
		if err == nil && n == 1 {
			if reward != *step.Reward {
				t.Errorf("recorded reward %v, the step said %v", reward, *step.Reward)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("episode not recorded: %d rows (%v)", n, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestServeRoleShutdownKeepsEpisodes: at shutdown the serve role stops the
// dedicated env.addr listener before it ends the environment sessions, and
// an episode still queued (env.record_flush far away) reaches env_episodes
// before the store is closed, although a WebSocket peer on env.addr never
// answers the close handshake.
func TestServeRoleShutdownKeepsEpisodes(t *testing.T) {
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	cfg := withRoles(w.cfg, "serve")
	cfg.Env.Addr = "127.0.0.1:0"
	cfg.Env.RecordFlush = time.Hour
	a, stop := w.start(t, cfg)
	defer stop()
	<-a.Ready()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prog := string(examples.PreconditionAirline)
	now := time.Now().UTC().Truncate(time.Second)
	env := &synthesizer.Environment{ID: "env-shutdown", TriggerID: "t-shutdown", Environment: "sim-airline", AgentVersion: "1.4.0",
		DictionaryVersion: 1, Capability: "precondition_verification", Status: synthesizer.StatusDone, Program: prog,
		ProgramHash: synthesizer.ProgramHash(prog), Tools: []string{"get_reservation_details"},
		Request: &schemas.SynthesisRequest{TriggerID: "t-shutdown"}, CreatedAt: now, UpdatedAt: now, Version: 1}
	if err := (synthesizer.SinkStore{Rows: a.Store}).SaveEnvironment(ctx, env); err != nil {
		t.Fatal(err)
	}
	conn := testenv.StoreConn(t, a.Store) // outlives the app's store
	base := "http://" + a.EnvAddr() + "/v1/environments/env-shutdown"
	res, err := http.Post(base+"/step", "application/json",
		strings.NewReader(`{"seed": 5, "action": {"role": "assistant", "content": "I cannot help with that."}}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), `"done":true`) {
		t.Fatalf("final answer = %d %s", res.StatusCode, body)
	}
	// A WebSocket session (a state frame answered: it exists), then a peer
	// that reads once more, at shutdown, and never answers.
	deaf, _, err := websocket.Dial(ctx, "ws://"+a.EnvAddr()+"/v1/environments/env-shutdown/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer deaf.CloseNow()
	if err := deaf.Write(ctx, websocket.MessageText, []byte(`{"type": "state"}`)); err != nil {
		t.Fatal(err)
	}
	if _, b, err := deaf.Read(ctx); err != nil || !strings.Contains(string(b), `"state"`) {
		t.Fatalf("state frame: %s %v", b, err)
	}

	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// The server's SESSION_ERROR says the sessions are ending: env.addr
	// must take no connection by then.
	_, b, err := deaf.Read(ctx)
	if err != nil || !strings.Contains(string(b), "SESSION_ERROR") || !strings.Contains(string(b), "shutting down") {
		t.Fatalf("at shutdown the WebSocket got %s %v, want SESSION_ERROR", b, err)
	}
	if c, err := net.DialTimeout("tcp", a.EnvAddr(), 5*time.Second); err == nil {
		c.Close()
		t.Fatal("env.addr still accepted a connection while the sessions were ending")
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("stop: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the app did not stop")
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM env_episodes WHERE environment_id = 'env-shutdown' AND seed = 5").Scan(&n); err != nil || n != 1 {
		t.Fatalf("env_episodes rows of the queued episode: %d (%v), want 1", n, err)
	}
}
