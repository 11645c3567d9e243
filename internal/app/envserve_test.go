package app_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer"
	"github.com/traceops/trace/synthesizer/examples"
)

// TestServeRoleServesEnvironments: the serve role's HTTP server lists the
// registry's DONE environments at /v1/environments (OpenEnv) behind the
// bearer token, plays one from a seed to its reward (sandboxed), and
// records the episode in env_episodes; a FAILED environment is not served.
func TestServeRoleServesEnvironments(t *testing.T) {
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	cfg := withRoles(w.cfg, "serve")
	cfg.HTTP.BearerToken = "s3cret-token"
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
