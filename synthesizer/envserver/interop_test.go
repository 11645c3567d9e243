package envserver_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/synthesizer/openenv"
)

func jsonValue(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("tool result %q is not JSON: %v", s, err)
	}
	return v
}

// TestOpenEnvInterop drives the server with openenv-core's own clients
// (testdata/openenv_interop.py): GenericEnvClient over WebSocket (reset
// with a seed, tool steps, protocol errors the session survives, the final
// answer, the reward), MCPToolClient over WebSocket and over HTTP (session
// create, tools/list, tools/call), the stateless HTTP endpoints validated by
// openenv's response models, the token in the URL. The Go side checks what
// the clients saw against the in-process play and what ClickHouse recorded.
func TestOpenEnvInterop(t *testing.T) {
	py := testenv.OpenEnvVenv.Require(t)
	st := testenv.ClickHouse(t).Store()
	cfg := testConfig()
	cfg.BearerToken = "interop-token"
	f := start(t, cfg, st, nil)
	wsPlay, httpPlay := playLocal(t, 21), playLocal(t, 22)
	userinfo := "trace:" + cfg.BearerToken
	in := map[string]any{
		"base_url": strings.Replace(f.base, "http://", "http://"+userinfo+"@", 1),
		"userinfo": userinfo,
		"ws_seed":  21, "ws_actions": wsPlay.actions,
		"http_seed": 22, "http_actions": httpPlay.actions,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out struct {
		WS struct {
			ResetMessages []struct{ Role, Content string } `json:"reset_messages"`
			ResetDone     bool                             `json:"reset_done"`
			Tools         []string                         `json:"tools"`
			ToolResults   [][]string                       `json:"tool_results"`
			Errors        []string                         `json:"errors"`
			Done          bool                             `json:"done"`
			Reward        *float64                         `json:"reward"`
			Components    map[string]float64               `json:"components"`
			EpisodeID     string                           `json:"episode_id"`
			State         map[string]any                   `json:"state"`
		} `json:"ws"`
		MCPWS struct {
			Tools   []string         `json:"tools"`
			Schemas []map[string]any `json:"schemas"`
			Result  any              `json:"result"`
		} `json:"mcp_ws"`
		HTTP struct {
			Health         string             `json:"health"`
			SchemaHasTools bool               `json:"schema_has_tools"`
			MetadataName   string             `json:"metadata_name"`
			StatelessUser  string             `json:"stateless_reset_user"`
			StatelessEp    *string            `json:"stateless_state_episode"`
			SessionID      string             `json:"session_id"`
			ResetUser      string             `json:"reset_user"`
			Tools          []string           `json:"tools"`
			CallResults    []any              `json:"call_results"`
			Done           bool               `json:"done"`
			Reward         *float64           `json:"reward"`
			Components     map[string]float64 `json:"components"`
			EpisodeID      string             `json:"episode_id"`
			StateReward    *float64           `json:"state_reward"`
			UnknownTool    string             `json:"unknown_tool"`
			BadStepStatus  int                `json:"bad_step_status"`
			BadStepCode    string             `json:"bad_step_code"`
		} `json:"http"`
		NoToken string `json:"no_token"`
	}
	testenv.RunPythonJSON(ctx, t, py, "testdata/openenv_interop.py", in, &out, nil)
	tools := []string{"get_user_details", "get_reservation_details", "cancel_reservation", "update_reservation_baggages"}

	// GenericEnvClient over WebSocket.
	ws := out.WS
	if len(ws.ResetMessages) != 2 || ws.ResetMessages[0].Content != wsPlay.start.System || ws.ResetMessages[1].Content != wsPlay.start.User || ws.ResetDone {
		t.Errorf("ws reset: %+v", ws.ResetMessages)
	}
	if !reflect.DeepEqual(ws.Tools, tools) {
		t.Errorf("ws tools %v", ws.Tools)
	}
	if len(ws.ToolResults) != len(wsPlay.results) {
		t.Fatalf("ws: %d steps seen, want %d", len(ws.ToolResults), len(wsPlay.results))
	}
	for i, rs := range wsPlay.results {
		for j, r := range rs {
			if ws.ToolResults[i][j] != r.Content {
				t.Errorf("ws step %d result %d: %q, want %q", i, j, ws.ToolResults[i][j], r.Content)
			}
		}
	}
	if len(ws.Errors) != 2 || !strings.Contains(ws.Errors[0], "VALIDATION_ERROR") || !strings.Contains(ws.Errors[0], "book_flight") ||
		!strings.Contains(ws.Errors[1], "VALIDATION_ERROR") || !strings.Contains(ws.Errors[1], "/user_id") {
		t.Errorf("ws protocol errors as openenv's client raised them: %q", ws.Errors)
	}
	if !ws.Done || ws.Reward == nil || *ws.Reward != wsPlay.reward.Value || !reflect.DeepEqual(ws.Components, wsPlay.reward.Components) {
		t.Errorf("ws end: done %v reward %v components %v, want %+v", ws.Done, ws.Reward, ws.Components, wsPlay.reward)
	}
	if ws.State["episode_id"] != ws.EpisodeID || ws.State["step_count"] != float64(len(wsPlay.actions)) {
		t.Errorf("ws state %v", ws.State)
	}

	// MCPToolClient over WebSocket.
	if !reflect.DeepEqual(out.MCPWS.Tools, tools) || len(out.MCPWS.Schemas) != 4 || out.MCPWS.Schemas[0]["type"] != "object" {
		t.Errorf("MCPToolClient list_tools over ws: %v %v", out.MCPWS.Tools, out.MCPWS.Schemas)
	}
	if want := jsonValue(t, wsPlay.results[0][0].Content); !reflect.DeepEqual(out.MCPWS.Result, want) {
		t.Errorf("MCPToolClient call_tool over ws: %v, want %v", out.MCPWS.Result, want)
	}

	// The HTTP path.
	h := out.HTTP
	if h.Health != "healthy" || !h.SchemaHasTools || h.MetadataName == "" || h.StatelessUser != httpPlay.start.User || h.StatelessEp != nil {
		t.Errorf("stateless HTTP: %+v", h)
	}
	if h.SessionID == "" || h.ResetUser != httpPlay.start.User || !reflect.DeepEqual(h.Tools, tools) {
		t.Errorf("HTTP session: %+v", h)
	}
	var wantCalls []any
	for _, rs := range httpPlay.results[:len(httpPlay.results)-1] {
		for _, r := range rs {
			wantCalls = append(wantCalls, jsonValue(t, r.Content))
		}
	}
	if !reflect.DeepEqual(h.CallResults, wantCalls) {
		t.Errorf("MCPToolClient call_tool over HTTP:\n got %v\nwant %v", h.CallResults, wantCalls)
	}
	if !h.Done || h.Reward == nil || *h.Reward != httpPlay.reward.Value || !reflect.DeepEqual(h.Components, httpPlay.reward.Components) ||
		h.StateReward == nil || *h.StateReward != httpPlay.reward.Value {
		t.Errorf("HTTP end: %+v, want %+v", h, httpPlay.reward)
	}
	if !strings.Contains(h.UnknownTool, "Tool not found: book_flight") {
		t.Errorf("MCPToolClient unknown tool: %q", h.UnknownTool)
	}
	if h.BadStepStatus != 422 || h.BadStepCode != "VALIDATION_ERROR" {
		t.Errorf("bad HTTP step: %d %s", h.BadStepStatus, h.BadStepCode)
	}
	if !strings.Contains(out.NoToken, "401") {
		t.Errorf("without the token: %q, want an HTTP 401 refusal", out.NoToken)
	}

	// What the Go side recorded: the two finished episodes, nothing else.
	rows := readEpisodes(t, st, 2)
	time.Sleep(300 * time.Millisecond) // a late third row would show up now
	rows = readEpisodes(t, st, 2)
	if len(rows) != 2 {
		t.Fatalf("env_episodes: %+v, want the 2 finished episodes", rows)
	}
	for _, r := range rows {
		want, transport, id := wsPlay, "ws", ws.EpisodeID
		if r.Seed == 22 {
			want, transport, id = httpPlay, "http", h.EpisodeID
		}
		var comps map[string]float64
		json.Unmarshal([]byte(r.Components), &comps)
		if r.Episode != id || r.Transport != transport || r.Reward != want.reward.Value || !reflect.DeepEqual(comps, want.reward.Components) ||
			r.Steps != uint32(len(want.actions)) || r.Reason != "final" {
			t.Errorf("recorded %+v, want episode %s (%s) reward %v components %v", r, id, transport, want.reward.Value, want.reward.Components)
		}
	}
	if h.SessionID != "" && rows[1].Session != h.SessionID && rows[0].Session != h.SessionID {
		t.Errorf("the HTTP episode's session %s is not recorded: %+v", h.SessionID, rows)
	}
}

// TestOpenEnvCapacityInterop: openenv-core's GenericEnvClient, connecting
// to an environment at capacity, gets CAPACITY_REACHED (a RuntimeError
// naming the code and the counts), whether it sends its reset at once or a
// while after connecting. Its client sends before it reads: closed at once
// after the error frame, the connection made that send fail
// (ConnectionClosedError, 1013) and the code never reached the client.
func TestOpenEnvCapacityInterop(t *testing.T) {
	py := testenv.OpenEnvVenv.Require(t)
	cfg := testConfig()
	cfg.MaxSessions = 1
	f := start(t, cfg, nil, nil)
	ctx := ctxT(t)
	held, err := f.client("").Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	seed := int64(1)
	if _, err := held.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, py, "testdata/openenv_capacity.py", f.base).CombinedOutput()
	if err != nil {
		t.Fatalf("openenv_capacity.py: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var got map[string]string
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	for _, delay := range []string{"0", "0.3"} {
		if r := got[delay]; !strings.HasPrefix(r, "RuntimeError") || !strings.Contains(r, "CAPACITY_REACHED") || !strings.Contains(r, "1/1") {
			t.Errorf("reset %ss after connecting at capacity raised %q, want a RuntimeError with CAPACITY_REACHED 1/1", delay, r)
		}
	}
}

// TestOpenEnvValidate runs openenv-core's own conformance check of a
// running server, `openenv validate --url` (its CLI, from the same venv),
// against an environment behind a token (the URL's password, which the
// check's requests send as Basic authentication): every criterion passes,
// and it finds the OpenEnv 1.x profile and the simulation mode (reset,
// step and state served).
func TestOpenEnvValidate(t *testing.T) {
	py := testenv.OpenEnvVenv.Require(t)
	cli := filepath.Join(filepath.Dir(py), "openenv")
	if _, err := os.Stat(cli); err != nil {
		t.Fatalf("openenv-core's CLI is not beside its python: %v", err)
	}
	cfg := testConfig()
	cfg.BearerToken = "validate-token"
	f := start(t, cfg, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := strings.Replace(f.base, "http://", "http://trace:"+cfg.BearerToken+"@", 1)
	out, err := exec.CommandContext(ctx, cli, "validate", "--url", url).Output()
	var report struct {
		Passed   bool   `json:"passed"`
		Profile  string `json:"standard_profile"`
		Version  string `json:"standard_version"`
		Mode     string `json:"mode"`
		Criteria []struct {
			ID     string `json:"id"`
			Passed bool   `json:"passed"`
		} `json:"criteria"`
	}
	if jerr := json.Unmarshal(out, &report); jerr != nil {
		t.Fatalf("openenv validate --url: %v, %v\n%s", err, jerr, out)
	}
	if !report.Passed || err != nil || report.Profile != "openenv-http/1.x" || report.Version != openenv.APIVersion || report.Mode != "simulation" || len(report.Criteria) < 6 {
		t.Errorf("openenv validate --url (exit %v):\n%s", err, out)
	}
	for _, c := range report.Criteria {
		if !c.Passed {
			t.Errorf("criterion %s failed", c.ID)
		}
	}
}

// TestVerifiersInterop plays the example through verifiers 0.4.0's OpenEnv
// integration (OpenEnvTaskset, OpenEnvEnv.run) with a scripted player
// (testdata/verifiers_interop.py; no model): its schema fetch, reset with
// the task's seed, the step loop and the reward it records.
func TestVerifiersInterop(t *testing.T) {
	py := testenv.VerifiersVenv.Require(t)
	st := testenv.ClickHouse(t).Store()
	cfg := testConfig()
	cfg.BearerToken = "verifiers-token"
	f := start(t, cfg, st, nil)
	lp := playLocal(t, 31)
	in := map[string]any{"base_url": strings.Replace(f.base, "http://", "http://trace:"+cfg.BearerToken+"@", 1),
		"seed": 31, "actions": lp.actions}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out struct {
		Patched     bool               `json:"patched_base_url"`
		Tasks       int                `json:"tasks"`
		Turns       int                `json:"turns"`
		FirstUser   string             `json:"first_user"`
		SchemaTitle string             `json:"action_schema_title"`
		LastResults []*string          `json:"last_tool_results"`
		Rewards     map[string]float64 `json:"rewards"`
		Stopped     *string            `json:"stopped"`
	}
	testenv.RunPythonJSON(ctx, t, py, "testdata/verifiers_interop.py", in, &out, nil)
	t.Logf("verifiers 0.4.0 needed GenericEnvClient._base_url added: %v", out.Patched)
	// The final answer ends the episode without another turn: one payload
	// per action but the last.
	if out.Tasks != 1 || out.Turns != len(lp.actions) || out.FirstUser != lp.start.User || out.SchemaTitle != "ChatAction" || out.Stopped != nil {
		t.Fatalf("verifiers run: %+v", out)
	}
	for i, r := range out.LastResults {
		if want := lp.results[i][len(lp.results[i])-1].Content; r == nil || *r != want {
			t.Errorf("turn %d: last tool result %v, want %s", i+1, r, want)
		}
	}
	if got, ok := out.Rewards["openenv_reward"]; !ok || got != lp.reward.Value {
		t.Fatalf("verifiers recorded openenv_reward %v, want %v", out.Rewards, lp.reward.Value)
	}
	rows := readEpisodes(t, st, 1)
	if len(rows) != 1 || rows[0].Seed != 31 || rows[0].Reward != lp.reward.Value || rows[0].Steps != uint32(len(lp.actions)) {
		t.Fatalf("env_episodes %+v", rows)
	}
}
