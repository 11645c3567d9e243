package ingest

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/schemas"
)

const (
	tau2AirlineFile = "azure-gpt-4o_airline_1trial.json"
	tau2RetailFile  = "toolorchestra_nemotron-orchestrator-8b_retail_1trial.json"
)

// tau2Revalidate marshals a rollout and decodes it through the schema, as every
// consumer of the rollout topic will.
func tau2Revalidate(t testing.TB, ro *schemas.Rollout) *schemas.Rollout {
	t.Helper()
	b, err := json.Marshal(ro)
	if err != nil {
		t.Fatalf("marshal rollout %s: %v", ro.RolloutID, err)
	}
	got, err := schemas.DecodeRollout(b, schemas.DecodeOptions{})
	if err != nil {
		t.Fatalf("rollout %s (task %s) does not validate: %v", ro.RolloutID, ro.TaskID, err)
	}
	return got
}

// tau2CheckToolPairing asserts every tool result answers a tool call made earlier
// in the same rollout, and returns the number of tool calls and results.
func tau2CheckToolPairing(t testing.TB, ro *schemas.Rollout) (calls, results int) {
	t.Helper()
	seen := map[string]bool{}
	for i, m := range ro.Messages {
		for _, tc := range m.ToolCalls {
			if tc.ID == "" || tc.Name == "" || tc.Arguments == nil {
				t.Errorf("rollout %s message %d: incomplete tool call %+v", ro.RolloutID, i, tc)
			}
			seen[tc.ID] = true
			calls++
		}
		if m.Role == "tool" {
			results++
			if !seen[m.ToolCallID] {
				t.Errorf("rollout %s message %d: tool result %q answers no preceding tool call", ro.RolloutID, i, m.ToolCallID)
			}
		}
	}
	return calls, results
}

func TestConvertTau2SharedData(t *testing.T) {
	dir := shareddata.Dir(t, "tau2")
	cases := []struct {
		file             string
		env              string
		agentName        string
		sims, successes  int
		messages         int // in the file, without the system message we add
		toolCalls        int
		knownRollout     string
		knownCallID      string
		knownCallName    string
		knownArgKey      string
		knownArgValue    string
		knownStart       time.Time
		wantToolErrors   bool
		wantCostMetadata bool
	}{
		{
			file: tau2AirlineFile, env: "tau2-airline", agentName: "azure/gpt-4o-2024-11-20",
			sims: 50, successes: 23, messages: 1068, toolCalls: 277,
			knownRollout: "7ad146cf-324c-46e5-93c9-8fb281c7ab01", knownCallID: "call_hlIdcTydrscdTJN9kdRPDwkN",
			knownCallName: "get_reservation_details", knownArgKey: "reservation_id", knownArgValue: "EHGLP3",
			knownStart:     time.Date(2025, 12, 2, 14, 4, 2, 726730000, time.UTC),
			wantToolErrors: true, wantCostMetadata: true,
		},
		{
			file: tau2RetailFile, env: "tau2-retail", agentName: "gpt-4.1-mini-2025-04-14",
			sims: 114, successes: 96, messages: 2534, toolCalls: 873,
			knownRollout: "74232053-3f8b-4765-9b86-35a3ec668a64", knownCallID: "477e7626-2ee5-4305-8096-f8762fba01ea",
			knownCallName: "find_user_id_by_name_zip", knownArgKey: "zip", knownArgValue: "98157",
			knownStart: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC),
		},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			ros, err := ConvertTau2File(filepath.Join(dir, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if len(ros) != tc.sims {
				t.Fatalf("got %d rollouts, want %d (one per simulation)", len(ros), tc.sims)
			}
			var successes, reward1, messages, calls, results, toolErrors int
			ids := map[string]bool{}
			foundKnown := false
			for _, ro := range ros {
				got := tau2Revalidate(t, ro)
				if got.Succeeded() {
					successes++
				}
				if got.Outcome.Reward == 1.0 {
					reward1++
				}
				if got.Outcome.Success != nil {
					t.Errorf("rollout %s: outcome.success set; it must default to reward == 1.0", got.RolloutID)
				}
				if ids[got.RolloutID] {
					t.Errorf("duplicate rollout_id %s", got.RolloutID)
				}
				ids[got.RolloutID] = true
				if got.Environment != tc.env || got.Agent.Name != tc.agentName {
					t.Errorf("rollout %s: environment/agent = %s/%s", got.RolloutID, got.Environment, got.Agent.Name)
				}
				if got.Key() != tc.env+"/"+Tau2AgentVersion("llm_agent", tc.agentName, map[string]any{"temperature": json.Number("0.0")}) {
					t.Errorf("rollout %s: key %q", got.RolloutID, got.Key())
				}
				if got.Messages[0].Role != "system" || !strings.Contains(strings.ToLower(got.Messages[0].Content), "agent policy") {
					t.Errorf("rollout %s: first message is not the policy: %.60q", got.RolloutID, got.Messages[0].Content)
				}
				if got.StartTime.IsZero() || got.EndTime.Before(got.StartTime) {
					t.Errorf("rollout %s: times %v .. %v", got.RolloutID, got.StartTime, got.EndTime)
				}
				if got.Grader == nil || len(got.Grader.Breakdown) == 0 {
					t.Errorf("rollout %s: no grader breakdown", got.RolloutID)
				} else if !got.Succeeded() && len(got.Grader.Reasons) == 0 {
					t.Errorf("rollout %s failed without grader reasons", got.RolloutID)
				}
				if got.Metadata["termination_reason"] != "user_stop" || got.Metadata["source_file"] != tc.file ||
					got.Metadata["task_ref"] != strings.TrimPrefix(tc.env, "tau2-")+":"+got.TaskID {
					t.Errorf("rollout %s: metadata %v", got.RolloutID, got.Metadata)
				}
				if _, ok := got.Metadata["agent_cost"]; ok != tc.wantCostMetadata {
					t.Errorf("rollout %s: agent_cost present = %v", got.RolloutID, ok)
				}
				if len(got.Tools) == 0 {
					t.Errorf("rollout %s: no tools", got.RolloutID)
				}
				tools := map[string]bool{}
				for _, tl := range got.Tools {
					tools[tl.Function.Name] = true
				}
				messages += len(got.Messages) - 1
				c, r := tau2CheckToolPairing(t, got)
				calls += c
				results += r
				for _, m := range got.Messages {
					if m.Role == "tool" && m.Error {
						toolErrors++
					}
					if m.Role != "system" && m.TurnIdx == nil {
						t.Errorf("rollout %s: %s message without turn_idx", got.RolloutID, m.Role)
					}
					for _, call := range m.ToolCalls {
						if !tools[call.Name] {
							t.Errorf("rollout %s: called tool %s missing from tools", got.RolloutID, call.Name)
						}
						if call.Requestor != "assistant" {
							t.Errorf("rollout %s: call %s requestor %q", got.RolloutID, call.ID, call.Requestor)
						}
						if call.ID == tc.knownCallID {
							foundKnown = true
							if got.RolloutID != tc.knownRollout || call.Name != tc.knownCallName || call.Arguments[tc.knownArgKey] != tc.knownArgValue {
								t.Errorf("known call %s: rollout %s, %s(%v)", call.ID, got.RolloutID, call.Name, call.Arguments)
							}
							if !got.StartTime.Equal(tc.knownStart) {
								t.Errorf("rollout %s start_time %v, want %v", got.RolloutID, got.StartTime, tc.knownStart)
							}
						}
					}
				}
			}
			if share, want := float64(successes)/float64(len(ros)), float64(reward1)/float64(len(ros)); share != want {
				t.Errorf("success share %.4f != reward==1.0 share %.4f", share, want)
			}
			if successes != tc.successes || reward1 != tc.successes {
				t.Errorf("successes = %d, reward==1.0 = %d, want %d", successes, reward1, tc.successes)
			}
			if messages != tc.messages {
				t.Errorf("messages = %d, want %d", messages, tc.messages)
			}
			if calls != tc.toolCalls || results != tc.toolCalls {
				t.Errorf("tool calls = %d, tool results = %d, want %d each", calls, results, tc.toolCalls)
			}
			if !foundKnown {
				t.Errorf("tool call %s did not survive", tc.knownCallID)
			}
			if (toolErrors > 0) != tc.wantToolErrors {
				t.Errorf("tool results flagged as errors: %d", toolErrors)
			}
			t.Logf("%s: %d rollouts, %d successes (%.3f), %d messages, %d tool calls, %d tool errors",
				tc.file, len(ros), successes, float64(successes)/float64(len(ros)), messages, calls, toolErrors)
		})
	}
}

// tau2Telecom is a tiny τ² result file in the telecom shape: tool_defs given,
// a user-side tool call (requestor "user") answered by a user-side tool
// result, a failed env assertion and naive timestamps.
const tau2Telecom = `{
  "timestamp": "2025-07-01T10:00:00.000000",
  "info": {
    "git_commit": "abc", "num_trials": 1, "seed": 7,
    "agent_info": {"implementation": "llm_agent", "llm": "gpt-4.1", "llm_args": {"temperature": 0.0, "api_key": "sk-secret"}},
    "user_info": {"implementation": "user_simulator", "llm": "gpt-4.1", "llm_args": {}},
    "environment_info": {
      "domain_name": "telecom",
      "policy": "# Telecom Agent Policy\nBe nice.",
      "tool_defs": {
        "get_customer_by_phone": {"name": "get_customer_by_phone", "doc": "Find a customer.", "params": {"type": "object", "properties": {"phone_number": {"type": "string"}}, "required": ["phone_number"]}, "returns": null},
        "enable_roaming": {"name": "enable_roaming", "doc": "Enable roaming.", "params": null}
      }
    }
  },
  "tasks": [{"id": "[mobile_data_issue]roaming", "description": null}],
  "simulations": [{
    "id": "sim-1", "task_id": "[mobile_data_issue]roaming", "trial": 0, "seed": 42,
    "start_time": "2025-07-01T10:00:01.500000", "end_time": "2025-07-01T10:02:03", "duration": 121.5,
    "termination_reason": "user_stop",
    "reward_info": {
      "reward": 0.0, "reward_basis": ["ENV_ASSERTION"], "reward_breakdown": {"ENV_ASSERTION": 0.0},
      "db_check": null, "action_checks": null, "communicate_checks": null, "nl_assertions": null,
      "env_assertions": [{"env_assertion": {"env_type": "user", "func_name": "assert_mobile_data_status", "arguments": {"expected_status": true}, "assert_value": true, "message": null}, "met": false, "reward": 0.0}]
    },
    "messages": [
      {"role": "assistant", "content": "Hi! How can I help you today?", "tool_calls": null, "turn_idx": 0},
      {"role": "user", "content": null, "tool_calls": [{"id": "u-1", "name": "check_status_bar", "arguments": {}, "requestor": "user"}], "turn_idx": 1},
      {"role": "tool", "id": "u-1", "content": "Status bar: no data", "requestor": "user", "error": false, "turn_idx": 2},
      {"role": "user", "content": "My data does not work abroad.", "tool_calls": null, "turn_idx": 3},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "a-1", "name": "get_customer_by_phone", "arguments": {"phone_number": "555-0100"}, "requestor": "assistant"}, {"id": "a-2", "name": "enable_roaming", "arguments": null, "requestor": "assistant"}], "turn_idx": 4},
      {"role": "tool", "id": "a-1", "content": "{\"customer_id\": \"C1\"}", "requestor": "assistant", "error": false, "turn_idx": 5},
      {"role": "tool", "id": "a-2", "content": "Error: line not found", "requestor": "assistant", "error": true, "turn_idx": 6},
      {"role": "user", "content": "###STOP###", "tool_calls": null, "turn_idx": 7}
    ]
  }]
}`

func TestConvertTau2Synthetic(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		wantErr error
		check   func(t *testing.T, ros []*schemas.Rollout)
	}{
		{
			name: "telecom user-side tool call keeps its requestor",
			in:   tau2Telecom,
			check: func(t *testing.T, ros []*schemas.Rollout) {
				if len(ros) != 1 {
					t.Fatalf("got %d rollouts", len(ros))
				}
				ro := tau2Revalidate(t, ros[0])
				if ro.Environment != "tau2-telecom" || ro.TaskID != "[mobile_data_issue]roaming" || ro.RolloutID != "sim-1" {
					t.Errorf("identity: %s %s %s", ro.Environment, ro.TaskID, ro.RolloutID)
				}
				msgs := ro.Messages
				if len(msgs) != 9 || msgs[0].Role != "system" || msgs[0].Content != "# Telecom Agent Policy\nBe nice." {
					t.Fatalf("messages: %+v", msgs)
				}
				user := msgs[2]
				if user.Role != "user" || user.Content != "" || len(user.ToolCalls) != 1 ||
					user.ToolCalls[0].Requestor != "user" || user.ToolCalls[0].ID != "u-1" || user.ToolCalls[0].Arguments == nil {
					t.Errorf("user-side tool call: %+v", user)
				}
				res := msgs[3]
				if res.Role != "tool" || res.ToolCallID != "u-1" || res.Requestor != "user" || res.Content != "Status bar: no data" || res.Error {
					t.Errorf("user-side tool result: %+v", res)
				}
				if msgs[5].ToolCalls[1].Requestor != "assistant" || len(msgs[5].ToolCalls[1].Arguments) != 0 {
					t.Errorf("null arguments: %+v", msgs[5].ToolCalls[1])
				}
				if !msgs[7].Error || msgs[7].ToolCallID != "a-2" {
					t.Errorf("tool error flag lost: %+v", msgs[7])
				}
				if *msgs[8].TurnIdx != 7 || msgs[8].Content != "###STOP###" {
					t.Errorf("last message: %+v", msgs[8])
				}
				if c, r := tau2CheckToolPairing(t, ro); c != 3 || r != 3 {
					t.Errorf("calls/results = %d/%d", c, r)
				}
				if ro.Succeeded() || ro.Grader == nil || len(ro.Grader.Reasons) != 1 ||
					!strings.Contains(ro.Grader.Reasons[0], "assert_mobile_data_status") || ro.Grader.Breakdown["ENV_ASSERTION"] != 0 {
					t.Errorf("grader: %+v", ro.Grader)
				}
				if want := time.Date(2025, 7, 1, 10, 0, 1, 500000000, time.UTC); !ro.StartTime.Equal(want) {
					t.Errorf("start_time %v, want %v", ro.StartTime, want)
				}
				// tool_defs given: mapped to OpenAI schemas, sorted, user tools not included.
				if len(ro.Tools) != 2 || ro.Tools[0].Function.Name != "enable_roaming" || ro.Tools[1].Function.Description != "Find a customer." ||
					!strings.Contains(string(ro.Tools[1].Function.Parameters), `"phone_number"`) || string(ro.Tools[0].Function.Parameters) != `{"type":"object"}` {
					t.Errorf("tools: %+v", ro.Tools)
				}
				if _, derived := ro.Metadata["tools_derived"]; derived {
					t.Error("tools_derived set although tool_defs were given")
				}
				if ut, _ := ro.Metadata["user_tools"].([]any); len(ut) != 1 || ut[0] != "check_status_bar" {
					t.Errorf("user_tools metadata: %v", ro.Metadata["user_tools"])
				}
				// llm_args is hashed into the version, never copied.
				b, _ := json.Marshal(ro)
				if strings.Contains(string(b), "sk-secret") {
					t.Error("llm_args leaked into the rollout")
				}
				if !strings.HasPrefix(ro.Agent.Version, "llm_agent@gpt-4.1#") || ro.Agent.Name != "gpt-4.1" {
					t.Errorf("agent: %+v", ro.Agent)
				}
			},
		},
		{
			name: "null tool_defs derive tools from agent calls, no policy, no reward_info",
			in: `{"info": {"agent_info": {"implementation": "x", "llm": ""}, "environment_info": {"domain_name": "mock", "policy": null, "tool_defs": null}},
			      "simulations": [
			        {"id": 7, "task_id": 3, "messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "zeta", "arguments": "{\"a\": 1}"}], "turn_idx": 0},
			                                           {"role": "tool", "id": "c", "content": "ok", "turn_idx": 1}]},
			        {"id": "s2", "task_id": "4", "reward_info": {"reward": 1.0}, "messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "u", "name": "user_only", "arguments": {}, "requestor": "user"}]}, {"role": "assistant", "content": "y", "tool_calls": [{"id": "d", "name": "alpha", "arguments": {}}]}]}
			      ]}`,
			check: func(t *testing.T, ros []*schemas.Rollout) {
				if len(ros) != 2 {
					t.Fatalf("got %d rollouts", len(ros))
				}
				a, b := tau2Revalidate(t, ros[0]), tau2Revalidate(t, ros[1])
				if a.RolloutID != "7" || a.TaskID != "3" || a.Agent.Name != "x" || a.Agent.Version != "x" {
					t.Errorf("loose ids / agent fallback: %s %s %+v", a.RolloutID, a.TaskID, a.Agent)
				}
				if a.Messages[0].Role != "assistant" || a.Metadata["reward_missing"] != true || a.Outcome.Reward != 0 {
					t.Errorf("no policy / no reward: %+v %v", a.Messages[0], a.Metadata)
				}
				if a.Messages[0].ToolCalls[0].Arguments["a"] != json.Number("1") && a.Messages[0].ToolCalls[0].Arguments["a"] != float64(1) {
					t.Errorf("string arguments not decoded: %v", a.Messages[0].ToolCalls[0].Arguments)
				}
				if !b.Succeeded() {
					t.Error("reward 1.0 is not a success")
				}
				var names []string
				for _, tl := range b.Tools {
					names = append(names, tl.Function.Name)
				}
				if strings.Join(names, ",") != "alpha,zeta" || b.Metadata["tools_derived"] != true {
					t.Errorf("derived tools = %v (user-side tools must be left out)", names)
				}
			},
		},
		{name: "not a tau2 file", in: `{"rollout_id": "r"}`, wantErr: ErrNotTau2},
		{name: "not JSON", in: `{"simulations": [`, wantErr: errors.New("any")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ros, err := ConvertTau2With(strings.NewReader(tc.in), Tau2Options{Source: "/tmp/in/x.json"})
			if tc.wantErr != nil {
				if err == nil || (errors.Is(tc.wantErr, ErrNotTau2) && !errors.Is(err, ErrNotTau2)) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, ro := range ros {
				if ro.Metadata["source_file"] != "x.json" {
					t.Errorf("source_file = %v", ro.Metadata["source_file"])
				}
			}
			tc.check(t, ros)
		})
	}
}

func TestTau2AgentVersion(t *testing.T) {
	args := map[string]any{"temperature": json.Number("0.0"), "top_p": json.Number("1")}
	v1 := Tau2AgentVersion("llm_agent", "gpt-4o", args)
	v2 := Tau2AgentVersion("llm_agent", "gpt-4o", map[string]any{"top_p": json.Number("1"), "temperature": json.Number("0.0")})
	if v1 != v2 || !strings.HasPrefix(v1, "llm_agent@gpt-4o#") || len(v1) != len("llm_agent@gpt-4o#")+8 {
		t.Errorf("not stable: %q %q", v1, v2)
	}
	if v := Tau2AgentVersion("llm_agent", "gpt-4o", map[string]any{"temperature": json.Number("0.7")}); v == v1 {
		t.Error("different llm_args must give a different version")
	}
	if v := Tau2AgentVersion("llm_agent", "gpt-4o", nil); v != "llm_agent@gpt-4o" {
		t.Errorf("no args: %q", v)
	}
	if v := Tau2AgentVersion("impl", strings.Repeat("m", 300), args); len(v) > 128 {
		t.Errorf("version too long: %d", len(v))
	}
}

// Some agents' result files carry a message's "reasoning" text and an
// "errors" value (a string, a list of strings or objects, or an object);
// the conversion keeps the reasoning and turns errors into the message's
// error flag and text, through the schema (and no errors, no flag).
func TestConvertTau2ReasoningAndErrors(t *testing.T) {
	in := strings.Replace(tau2Telecom, `{"role": "assistant", "content": "Hi! How can I help you today?", "tool_calls": null, "turn_idx": 0},`,
		`{"role": "assistant", "content": "Hi! How can I help you today?", "reasoning": "Greet first.\nThen ask.", "errors": null, "tool_calls": null, "turn_idx": 0},`, 1)
	in = strings.Replace(in, `{"role": "user", "content": "My data does not work abroad.", "tool_calls": null, "turn_idx": 3},`,
		`{"role": "user", "content": "My data does not work abroad.", "reasoning": {"summary": "roaming"}, "errors": [], "tool_calls": null, "turn_idx": 3},`, 1)
	in = strings.Replace(in, `{"role": "tool", "id": "a-1", "content": "{\"customer_id\": \"C1\"}", "requestor": "assistant", "error": false, "turn_idx": 5},`,
		`{"role": "tool", "id": "a-1", "content": "{\"customer_id\": \"C1\"}", "requestor": "assistant", "error": false, "errors": ["timeout", {"code": 504}], "turn_idx": 5},`, 1)
	in = strings.Replace(in, `{"role": "user", "content": "###STOP###", "tool_calls": null, "turn_idx": 7}`,
		`{"role": "user", "content": "###STOP###", "tool_calls": null, "errors": "user simulator: rate limited", "turn_idx": 7}`, 1)
	if strings.Count(in, `"errors"`) != 4 {
		t.Fatal("fixture not rewritten")
	}
	ros, err := ConvertTau2(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	msgs := tau2Revalidate(t, ros[0]).Messages
	if m := msgs[1]; m.Reasoning != "Greet first.\nThen ask." || m.Error || m.ErrorText != "" {
		t.Errorf("reasoning as a string: %+v", m)
	}
	if m := msgs[4]; m.Reasoning != `{"summary":"roaming"}` || m.Error {
		t.Errorf("reasoning as an object, errors empty: %+v", m)
	}
	if m := msgs[6]; !m.Error || m.ErrorText != `timeout; {"code":504}` || m.Role != "tool" {
		t.Errorf("errors as a list: %+v", m)
	}
	if m := msgs[8]; !m.Error || m.ErrorText != "user simulator: rate limited" {
		t.Errorf("errors as a string: %+v", m)
	}
	if m := msgs[7]; !m.Error || m.ErrorText != "" {
		t.Errorf("the error flag alone: %+v", m)
	}
}
