package envprog_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/synthesizer/envprog"
)

// echo is a program that shows what the runtime hands it: step answers
// with the call it got, reward reports the transcript's shape, and the
// state is a module global (frozen) that the episode mutates.
const echo = `"""Echo: shows the runtime's values to tests."""
START = {"calls": [], "final": None}
def tools():
    return [{"type": "function", "function": {"name": "echo", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
            {"type": "function", "function": {"name": "stop", "parameters": {"type": "object", "properties": {}}}},
            {"type": "function", "function": {"name": "draw", "parameters": {"type": "object", "properties": {}}}}]
def reset(seed):
    state = {"calls": START["calls"], "final": START["final"], "rng": rand(seed)}
    return {"system": "sys %d" % seed, "user": "hello", "state": state}
def step(state, call):
    if call["type"] == "final":
        state["final"] = call["content"]
        return {"state": state}
    state["calls"].append(call["name"])
    if call["name"] == "stop":
        return {"result": "stopped", "state": state, "done": True}
    if call["name"] == "draw":
        return {"result": state["rng"].randint(1, 1000000), "state": state}
    return {"result": call, "state": state}
def reward(state, transcript):
    roles = [m["role"] for m in transcript]
    args = [c["arguments"] for m in transcript if m["role"] == "assistant" for c in m["tool_calls"]]
    return {"reward": 0.5, "components": {"calls": len(state["calls"]), "messages": len(transcript),
            "tools": len([r for r in roles if r == "tool"]), "args_dicts": len([a for a in args if type(a) == "dict"])}}
`

func tool(name, args string) envprog.ToolCall {
	return envprog.ToolCall{Name: name, Arguments: json.RawMessage(args)}
}

func TestRuntimeSteps(t *testing.T) {
	for _, ld := range loaders {
		t.Run(ld.name, func(t *testing.T) {
			ctx := context.Background()
			env, err := ld.load(ctx, "echo.star", []byte(echo), envprog.Limits{MaxTurns: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer env.Close()
			if info := env.Info(); info.Doc != "Echo: shows the runtime's values to tests." || len(info.Tools) != 3 || info.HasHint || info.HasReference || len(info.Hash) != 64 {
				t.Fatalf("info %+v", info)
			}
			ep, err := env.Reset(ctx, 7)
			if err != nil {
				t.Fatal(err)
			}
			if ep.Start() != (envprog.Start{System: "sys 7", User: "hello"}) {
				t.Fatalf("start %+v", ep.Start())
			}
			// One turn, five calls: a JSON string, an object, a malformed
			// string, a non-object and an unknown tool.
			res, err := ep.Step(ctx, envprog.Action{Content: "thinking", ToolCalls: []envprog.ToolCall{
				tool("echo", `"{\"x\": 1}"`), tool("echo", `{"x": 2, "y": [1.5, "é\n"]}`), tool("echo", `"{\"x\": "`),
				tool("echo", `[1]`), tool("nope", `{}`)}})
			if err != nil {
				t.Fatal(err)
			}
			want := []string{
				`{"type":"tool","id":"call_1_0","name":"echo","arguments":{"x":1}}`,
				`{"type":"tool","id":"call_1_1","name":"echo","arguments":{"x":2,"y":[1.5,"é\n"]}}`,
				"Error: the arguments of echo are not a JSON object: invalid JSON at offset 5: unexpected end",
				"Error: the arguments of echo are not a JSON object: got a JSON array",
				`Error: unknown tool "nope"; the tools are echo, stop, draw.`,
			}
			if len(res.ToolResults) != len(want) || res.Done {
				t.Fatalf("results %+v", res)
			}
			for i, m := range res.ToolResults {
				if m.Role != "tool" || m.Content != want[i] || m.ToolCallID != "call_1_"+string(rune('0'+i)) {
					t.Errorf("result %d: %+v, want content %s", i, m, want[i])
				}
			}
			// A turn ending the episode: the call after "stop" is not run.
			res, err = ep.Step(ctx, envprog.Action{ToolCalls: []envprog.ToolCall{tool("stop", `{}`), tool("echo", `{}`)}})
			if err != nil || !res.Done || !strings.HasPrefix(res.ToolResults[1].Content, "Error: not executed") {
				t.Fatalf("stop: %+v %v", res, err)
			}
			if _, err := ep.Step(ctx, envprog.Action{Content: "bye"}); !errors.Is(err, envprog.ErrDone) {
				t.Fatalf("step after done: %v", err)
			}
			r, err := ep.Reward(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// 3 calls reached step (two echo, stop); 2 system/user + 2 assistant + 7 tool messages.
			wantC := map[string]float64{"calls": 3, "messages": 11, "tools": 7, "args_dicts": 5}
			if r.Value != 0.5 || len(r.Components) != len(wantC) {
				t.Fatalf("reward %+v", r)
			}
			for k, v := range wantC {
				if r.Components[k] != v {
					t.Errorf("component %s = %v, want %v", k, r.Components[k], v)
				}
			}
			if msgs := ep.Messages(); len(msgs) != 11 || msgs[2].Role != "assistant" || msgs[2].Content != "thinking" || msgs[2].ToolCalls[0].ID != "call_1_0" {
				t.Errorf("messages %+v", msgs)
			}

			// Episodes never share state, though reset returned a frozen
			// global: a new episode starts with no calls.
			ep2, err := env.Reset(ctx, 7)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ep2.Step(ctx, envprog.Action{Content: "done"}); err != nil {
				t.Fatal(err)
			}
			if r, _ := ep2.Reward(ctx); r.Components["calls"] != 0 {
				t.Errorf("the second episode saw %v calls of the first", r.Components["calls"])
			}

			// MaxTurns (4) ends the episode.
			ep3, _ := env.Reset(ctx, 8)
			for turn := 1; turn <= 4; turn++ {
				res, err := ep3.Step(ctx, envprog.Action{ToolCalls: []envprog.ToolCall{tool("echo", `{}`)}})
				if err != nil || res.Done != (turn == 4) {
					t.Fatalf("turn %d: %+v %v", turn, res, err)
				}
			}
		})
	}
}

// TestRandIsDeterministic pins rand(seed)'s draws: the algorithm is PCG-DXSM
// plus this package's own bounded draws, so these values never change.
func TestRandIsDeterministic(t *testing.T) {
	ctx := context.Background()
	draws := func(ld loader, seed int64) []string {
		env, err := ld.load(ctx, "echo.star", []byte(echo), envprog.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		defer env.Close()
		ep, err := env.Reset(ctx, seed)
		if err != nil {
			t.Fatal(err)
		}
		res, err := ep.Step(ctx, envprog.Action{ToolCalls: []envprog.ToolCall{tool("draw", ``), tool("draw", ``), tool("draw", ``)}})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range res.ToolResults {
			out = append(out, m.Content)
		}
		return out
	}
	for _, ld := range loaders {
		a, b := draws(ld, 42), draws(ld, 42)
		if strings.Join(a, ",") != strings.Join(b, ",") {
			t.Errorf("%s: seed 42 drew %v then %v", ld.name, a, b)
		}
		if got, want := strings.Join(a, ","), goldenDraws; got != want {
			t.Errorf("%s: seed 42 drew %s, want %s", ld.name, got, want)
		}
		if c := draws(ld, 43); strings.Join(c, ",") == strings.Join(a, ",") {
			t.Errorf("%s: seeds 42 and 43 drew the same %v", ld.name, c)
		}
	}
}

const goldenDraws = "335836,877901,86592"

func TestRandMethods(t *testing.T) {
	src := `"""Rand methods."""
TOP = rand(1)
def tools():
    return []
def reset(seed):
    r = rand(seed)
    seen = {}
    for _ in range(2000):
        seen[r.randint(1, 6)] = True
    l = [1, 2, 3, 4, 5, 6, 7, 8]
    s = r.shuffle(l)
    smp = r.sample(l, 5)
    f = [r.random() for _ in range(1000)]
    ok = (sorted(seen.keys()) == [1, 2, 3, 4, 5, 6] and l == [1, 2, 3, 4, 5, 6, 7, 8] and sorted(s) == l and s != l
          and len(smp) == 5 and len(set(smp)) == 5 and min(f) >= 0.0 and max(f) < 1.0 and r.choice("abc") in "abc"
          and r.randint(5, 5) == 5)
    return {"system": "ok" if ok else "broken", "user": "", "state": None}
def step(state, call):
    return {"state": state, "result": TOP.random()}
def reward(state, transcript):
    return {"reward": 0}
`
	ctx := context.Background()
	env, err := envprog.Load(ctx, "rand.star", []byte(src), envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for seed := int64(0); seed < 20; seed++ {
		ep, err := env.Reset(ctx, seed)
		if err != nil {
			t.Fatal(err)
		}
		if ep.Start().System != "ok" {
			t.Fatalf("seed %d: a rand method misbehaved", seed)
		}
	}
	ep, _ := env.Reset(ctx, 0)
	_, err = ep.Step(ctx, envprog.Action{Content: "x"})
	var pe *envprog.ProgramError
	if !errors.As(err, &pe) || !strings.Contains(pe.Msg, "made at top level and is frozen") {
		t.Errorf("drawing from a module-level rand: %v", err)
	}
}

// TestProgramErrors lists malformed programs and the error each gets.
func TestProgramErrors(t *testing.T) {
	base := map[string]string{
		"tools":  "def tools():\n    return [{\"type\": \"function\", \"function\": {\"name\": \"t\"}}]\n",
		"reset":  "def reset(seed):\n    return {\"system\": \"s\", \"user\": \"u\", \"state\": {}}\n",
		"step":   "def step(state, call):\n    return {\"result\": \"r\", \"state\": state}\n",
		"reward": "def reward(state, transcript):\n    return {\"reward\": 1.0}\n",
	}
	prog := func(repl map[string]string) []byte {
		var b strings.Builder
		b.WriteString("\"\"\"doc\"\"\"\n")
		for _, k := range []string{"tools", "reset", "step", "reward", "extra"} {
			if v, ok := repl[k]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(base[k])
			}
		}
		return []byte(b.String())
	}
	cases := []struct {
		name  string
		repl  map[string]string
		phase string // load, reset, step, reward
		fn    string
		limit string
		msg   string
	}{
		{"syntax error", map[string]string{"extra": "def broken(:\n"}, "load", "", "", "want ')'"},
		{"missing step", map[string]string{"step": ""}, "load", "", "", "the contract function step() is not defined"},
		{"step not a function", map[string]string{"step": "step = 3\n"}, "load", "", "", "step is a int, want a function"},
		{"reset without its parameter", map[string]string{"reset": "def reset():\n    return {}\n"}, "load", "reset", "", "takes 0 required positional parameters (of 0), want 1"},
		{"top-level infinite loop", map[string]string{"extra": "while True:\n    pass\n"}, "load", "", "steps", "execution steps"},
		{"load statement", map[string]string{"extra": "load(\"x.star\", \"y\")\n"}, "load", "", "", "load() is not available"},
		{"tools not a list", map[string]string{"tools": "def tools():\n    return {}\n"}, "load", "tools", "", "returned a dict, want a list"},
		{"tool without name", map[string]string{"tools": "def tools():\n    return [{\"type\": \"function\", \"function\": {}}]\n"}, "load", "tools", "", "function.name is missing"},
		{"reset not a dict", map[string]string{"reset": "def reset(seed):\n    return [seed]\n"}, "reset", "reset", "", "returned a list, want a dict"},
		{"reset without user", map[string]string{"reset": "def reset(seed):\n    return {\"system\": \"s\", \"state\": 1}\n"}, "reset", "reset", "", `without key "user"`},
		{"step without state", map[string]string{"step": "def step(state, call):\n    return {\"result\": \"r\"}\n"}, "step", "step", "", `without key "state"`},
		{"step with a typo", map[string]string{"step": "def step(state, call):\n    return {\"result\": \"r\", \"state\": state, \"don\": True}\n"}, "step", "step", "", `key "don"`},
		{"result not JSON", map[string]string{"step": "def step(state, call):\n    return {\"result\": {1: 2}, \"state\": state}\n"}, "step", "step", "", "int key"},
		{"reward above 1", map[string]string{"reward": "def reward(state, transcript):\n    return {\"reward\": 1.5}\n"}, "reward", "reward", "", "reward 1.5 is outside [0, 1]"},
		{"reset mutating a global", map[string]string{"extra": "G = {}\n", "reset": "def reset(seed):\n    G[\"x\"] = seed\n    return {}\n"}, "reset", "reset", "", "module-level values are frozen"},
		{"reward not a number", map[string]string{"reward": "def reward(state, transcript):\n    return {\"reward\": \"high\"}\n"}, "reward", "reward", "", "reward is a string"},
		{"reward component infinite", map[string]string{"reward": "def reward(state, transcript):\n    return {\"reward\": 1, \"components\": {\"cost\": 1e308 * 10}}\n"}, "reward", "reward", "", "component \"cost\" is +Inf, want a finite number"},
	}
	for _, ld := range loaders {
		for _, tc := range cases {
			t.Run(ld.name+"/"+tc.name, func(t *testing.T) {
				ctx := context.Background()
				var err error
				env, lerr := ld.load(ctx, "p.star", prog(tc.repl), envprog.Limits{MaxSteps: 100_000})
				switch {
				case tc.phase == "load":
					err = lerr
				case lerr != nil:
					t.Fatalf("load: %v", lerr)
				default:
					defer env.Close()
					var ep envprog.Episode
					ep, err = env.Reset(ctx, 5)
					if err == nil {
						_, err = ep.Step(ctx, envprog.Action{ToolCalls: []envprog.ToolCall{tool("t", "{}")}})
						if tc.phase == "step" && err == nil {
							t.Fatal("the step that should fail did not")
						}
						if tc.phase != "step" {
							ep2, _ := env.Reset(ctx, 5)
							_, err = ep2.Step(ctx, envprog.Action{Content: "final"})
							if err == nil {
								_, err = ep2.Reward(ctx)
							}
						}
					}
				}
				var pe *envprog.ProgramError
				if !errors.As(err, &pe) {
					t.Fatalf("got %v, want a *ProgramError", err)
				}
				if pe.Func != tc.fn || pe.Limit != tc.limit || !strings.Contains(pe.Msg, tc.msg) {
					t.Errorf("got Func %q Limit %q Msg %q; want %q %q containing %q", pe.Func, pe.Limit, pe.Msg, tc.fn, tc.limit, tc.msg)
				}
				if tc.phase != "load" && pe.Seed != 5 {
					t.Errorf("seed %d, want 5", pe.Seed)
				}
			})
		}
	}
}

// TestContextCancel: the caller's cancellation is the caller's error, not
// the program's.
func TestContextCancel(t *testing.T) {
	for _, ld := range loaders {
		env, err := ld.load(context.Background(), "h.star", hostile("while True:\n    pass"), envprog.Limits{MaxSteps: 1 << 60, CallTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ep, _ := env.Reset(context.Background(), 1)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err = boom(ctx, ep)
		cancel()
		var pe *envprog.ProgramError
		if !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &pe) {
			t.Errorf("%s: got %v, want context.DeadlineExceeded", ld.name, err)
		}
		env.Close()
	}
}
