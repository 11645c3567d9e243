package envprog_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/envprog"
)

// airlineTools are the simulated airline environment's tools, as a
// synthesis request carries them.
func airlineTools(t testing.TB) []schemas.Tool {
	t.Helper()
	tools := simulate.Tools(simulate.Airline)
	if len(tools) == 0 {
		t.Fatal("no simulated airline tools")
	}
	return tools
}

// lookup is a small valid program: answer a reservation's status after
// looking it up. Validation table cases edit it.
const lookup = `"""Status lookup. Agents answer from memory instead of looking records up. Here they must look up first."""
STATUSES = ["active", "cancelled", "pending"]
def tools():
    return [{"type": "function", "function": {"name": "get_reservation_details", "description": "Get the details of a reservation.",
             "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}}, "required": ["reservation_id"]}}}]
def reset(seed):
    r = rand(seed)
    rid = "".join([r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(6)])
    return {"system": "You are an airline agent.", "user": "What is the status of reservation %s?" % rid,
            "state": {"rid": rid, "status": r.choice(STATUSES), "looked": False, "final": ""}}
def step(state, call):
    if call["type"] == "final":
        state["final"] = call["content"]
        return {"state": state}
    if call["arguments"].get("reservation_id") == state["rid"]:
        state["looked"] = True
        return {"result": {"reservation_id": state["rid"], "status": state["status"]}, "state": state}
    return {"result": "Error: reservation not found", "state": state}
def reward(state, transcript):
    a = 1.0 if state["looked"] else 0.0
    c = 1.0 if state["status"] in state["final"] else 0.0
    return {"reward": 0.5 * a + 0.5 * c, "components": {"action": a, "communication": c}}
def hint(state):
    return "Answer from the record, not from memory."
def reference(state):
    return [{"name": "get_reservation_details", "arguments": {"reservation_id": state["rid"]}},
            {"type": "final", "content": "Reservation %s is %s." % (state["rid"], state["status"])}]
`

func edit(src string, pairs ...string) string {
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(src, pairs[i]) {
			panic("edit: no " + pairs[i])
		}
		src = strings.Replace(src, pairs[i], pairs[i+1], 1)
	}
	return src
}

const lookupTool = `{"type": "function", "function": {"name": "get_reservation_details", "description": "Get the details of a reservation.",
             "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}}, "required": ["reservation_id"]}}}`

func TestValidateChecks(t *testing.T) {
	target := airlineTools(t)
	var extraTools string
	for i := 1; i <= 5; i++ {
		extraTools += fmt.Sprintf(`, {"type": "function", "function": {"name": "t%d"}}`, i)
	}
	cases := []struct {
		name    string
		src     string
		wrap    func(envprog.Env) envprog.Env
		check   string
		verdict string
		msg     []string // substrings of the check's message
		also    []string // checks that fail as a consequence
	}{
		{name: "good program", src: lookup, check: "", verdict: envprog.Pass},
		{name: "syntax error", src: edit(lookup, "def reward(state, transcript):", "def reward(state, transcript)"),
			check: envprog.CheckLoad, verdict: envprog.Fail, msg: []string{"does not load", "want ':'"}},
		{name: "empty user message", src: edit(lookup, `"What is the status of reservation %s?" % rid`, `""`),
			check: envprog.CheckContract, verdict: envprog.Fail, msg: []string{"seed 0", "empty system prompt or user message"}},
		{name: "step crashes on seed 0", src: edit(lookup, `        state["final"] = call["content"]`, `        state["final"] = call["content"] + 1`),
			check: envprog.CheckContract, verdict: envprog.Fail, msg: []string{"seed 0", "step()", "unknown binary op: string + int"}},
		{name: "reward changing the state", src: edit(lookup, `    a = 1.0 if state["looked"] else 0.0`, `    a = 1.0 if state["looked"] else 0.0
    state["looked"] = True`),
			check: envprog.CheckContract, verdict: envprog.Fail, msg: []string{"seed 0: reward changed the state", "gave 0 (action=0, communication=0) then 0.5 (action=1, communication=0)"}},
		{name: "no docstring", src: edit(lookup, `"""Status lookup. Agents answer from memory instead of looking records up. Here they must look up first."""`, ""),
			check: envprog.CheckDocstring, verdict: envprog.Fail, msg: []string{"no module docstring"}},
		{name: "one-sentence docstring", src: edit(lookup, `Agents answer from memory instead of looking records up. Here they must look up first.`, ""),
			check: envprog.CheckDocstring, verdict: envprog.Fail, msg: []string{"has 1 sentences, want 3–5"}},
		{name: "tool not in the target", src: edit(lookup, `"name": "get_reservation_details"`, `"name": "get_booking"`),
			check: envprog.CheckTools, verdict: envprog.Fail, msg: []string{"tool get_booking is not a tool of the target"},
			also: []string{envprog.CheckReference}}, // the reference calls get_reservation_details, now unknown
		{name: "parameter of another type", src: edit(lookup, `"reservation_id": {"type": "string"}`, `"reservation_id": {"type": "integer"}`),
			check: envprog.CheckTools, verdict: envprog.Fail, msg: []string{"parameter reservation_id has type integer, the target's has string"}},
		{name: "parameter of another name", src: edit(lookup, `"properties": {"reservation_id": {"type": "string"}}`, `"properties": {"id": {"type": "string"}}`),
			check: envprog.CheckTools, verdict: envprog.Fail, msg: []string{"parameter id is not a parameter of the target's get_reservation_details", "the target's parameter reservation_id (string) is missing"}},
		{name: "tool schema with an external $ref", src: edit(lookup, `"properties": {"reservation_id": {"type": "string"}}`, `"properties": {"reservation_id": {"$ref": "https://example.com/rid.json"}}`),
			check: envprog.CheckLoad, verdict: envprog.Fail, msg: []string{"does not load", "tools()", "tool get_reservation_details", `$ref "https://example.com/rid.json" at #/properties/reservation_id is not local`}},
		{name: "six tools", src: edit(lookup, lookupTool, lookupTool+extraTools),
			check: envprog.CheckToolCount, verdict: envprog.Fail, msg: []string{"6 tools (get_reservation_details, t1, t2, t3, t4, t5); at most 5"},
			also: []string{envprog.CheckTools}},
		{name: "reset ignores its seed", src: edit(lookup, "r = rand(seed)", "r = rand(7)"),
			check: envprog.CheckDistinct, verdict: envprog.Fail, msg: []string{"1 of 100 seeds (1%) gave distinct instances", "want at least 90%"}},
		{name: "reset not deterministic", src: lookup, wrap: flakyStart,
			check: envprog.CheckResetDeterministic, verdict: envprog.Fail, msg: []string{"100 of 100 seeds gave a different start", "seed 0 gave"},
			also: []string{envprog.CheckStepDeterministic}}, // the transcript holds the start
		{name: "step not deterministic", src: lookup, wrap: flakyResults,
			check: envprog.CheckStepDeterministic, verdict: envprog.Fail, msg: []string{"seeds played twice with the same calls differed", "seed 0"}},
		{name: "step fails on random calls", src: edit(lookup, `    return {"result": "Error: reservation not found", "state": state}`, `    return {"result": 1 // 0, "state": state}`),
			check: envprog.CheckRandomPlay, verdict: envprog.Fail, msg: []string{"the program failed on", "seed 2: step(): lookup.star:18:25: in step: floored division by zero"}},
		{name: "reward above 1", src: edit(lookup, `"reward": 0.5 * a + 0.5 * c`, `"reward": 0.5 * a + 0.5 * c + (0.7 if a else 0)`),
			check: envprog.CheckRewardRange, verdict: envprog.Fail, msg: []string{"random-play rewards are outside [0, 1]", "reward 1.2"},
			also: []string{envprog.CheckReference}},
		{name: "doing nothing pays", src: edit(lookup, `"reward": 0.5 * a + 0.5 * c`, `"reward": 0.3 + 0.35 * a + 0.35 * c`),
			check: envprog.CheckDoNothing, verdict: envprog.Fail, msg: []string{"scores a mean 0.300 over 100 seeds, want below 0.20"}},
		{name: "wrong reference", src: edit(lookup, `"Reservation %s is %s." % (state["rid"], state["status"])`, `"Reservation %s is fine." % state["rid"]`),
			check: envprog.CheckReference, verdict: envprog.Fail, msg: []string{"scored below 1.0 on 100 of 100 seeds", "seed 0: reward 0.5 (action=1, communication=0)"}},
		{name: "no reference", src: edit(lookup, "def reference(state):", "def _reference(state):"),
			check: envprog.CheckReference, verdict: envprog.Skip, msg: []string{"no reference()"}},
		{name: "hint spelling out the call", src: edit(lookup, `"Answer from the record, not from memory."`, `"Call get_reservation_details(reservation_id=%s)." % state["rid"]`),
			check: envprog.CheckHint, verdict: envprog.Fail, msg: []string{"seed 0: the hint spells out a call of get_reservation_details"}},
		{name: "empty hint", src: edit(lookup, `"Answer from the record, not from memory."`, `""`),
			check: envprog.CheckHint, verdict: envprog.Fail, msg: []string{"seed 0: the hint is empty"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			var r envprog.Report
			if tc.wrap == nil {
				var env envprog.Env
				var err error
				r, env, err = envprog.ValidateSource(ctx, "lookup.star", []byte(tc.src), target, envprog.Limits{}, envprog.ValidateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if env != nil {
					env.Close()
				}
			} else {
				env, err := envprog.Load(ctx, "lookup.star", []byte(tc.src), envprog.Limits{})
				if err != nil {
					t.Fatal(err)
				}
				if r, err = envprog.Validate(ctx, tc.wrap(env), target, envprog.ValidateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range r.Checks {
				switch {
				case slices.Contains(tc.also, c.Name):
					if c.Verdict != envprog.Fail {
						t.Errorf("%s: %s, want it to fail too", c.Name, c.Verdict)
					}
				case c.Name == tc.check:
					if c.Verdict != tc.verdict {
						t.Errorf("%s: %s (%s), want %s", c.Name, c.Verdict, c.Msg, tc.verdict)
					}
					for _, m := range tc.msg {
						if !strings.Contains(c.Msg, m) {
							t.Errorf("%s: message %q lacks %q", c.Name, c.Msg, m)
						}
					}
				case c.Verdict == envprog.Fail && tc.check != envprog.CheckContract:
					t.Errorf("%s failed too: %s", c.Name, c.Msg)
				case c.Verdict == envprog.Skip && tc.check == envprog.CheckContract:
				case c.Verdict != envprog.Pass && tc.check != envprog.CheckReference && tc.check != envprog.CheckLoad:
					t.Errorf("%s: %s: %s", c.Name, c.Verdict, c.Msg)
				}
			}
			if ok := tc.verdict == envprog.Pass || tc.verdict == envprog.Skip; r.OK() != ok {
				t.Errorf("OK() = %v:\n%s", r.OK(), r)
			}
			if tc.check == "" && len(r.Checks) != 13 {
				t.Errorf("%d checks:\n%s", len(r.Checks), r)
			}
		})
	}
}

// TestValidateExample: the shipped example passes every check against the
// simulated airline environment's tools, in-process and sandboxed.
func TestValidateExample(t *testing.T) {
	target := airlineTools(t)
	for _, ld := range loaders {
		env := loadExample(t)
		if ld.name == "sandboxed" {
			var err error
			env, err = envprog.LoadSandboxed(context.Background(), "precondition_airline.star", exampleSrc(), envprog.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			defer env.Close()
		}
		r, err := envprog.Validate(context.Background(), env, target, envprog.ValidateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range r.Checks {
			if c.Verdict != envprog.Pass {
				t.Errorf("%s: %s %s: %s", ld.name, c.Verdict, c.Name, c.Msg)
			}
		}
		t.Logf("%s:\n%s", ld.name, r)
	}
}

// flakyStart changes the start of every second reset of a seed.
func flakyStart(env envprog.Env) envprog.Env { return &flakyEnv{Env: env, start: true} }

// flakyResults changes the tool results of every second play.
func flakyResults(env envprog.Env) envprog.Env { return &flakyEnv{Env: env} }

type flakyEnv struct {
	envprog.Env
	start bool
	n     atomic.Int64
}

func (f *flakyEnv) Reset(ctx context.Context, seed int64) (envprog.Episode, error) {
	ep, err := f.Env.Reset(ctx, seed)
	if err != nil {
		return nil, err
	}
	return &flakyEpisode{Episode: ep, f: f, n: f.n.Add(1)}, nil
}

type flakyEpisode struct {
	envprog.Episode
	f *flakyEnv
	n int64
}

func (e *flakyEpisode) Start() envprog.Start {
	s := e.Episode.Start()
	if e.f.start {
		s.User += fmt.Sprint(" #", e.n)
	}
	return s
}

func (e *flakyEpisode) Messages() []envprog.Message {
	m := e.Episode.Messages()
	if !e.f.start && len(m) > 0 {
		m[len(m)-1].Content += fmt.Sprint(" #", e.n)
	}
	return m
}

// TestValidateTellsEachCheck: ValidateOptions.OnCheck gets every check of
// the report, in its order, as it gets its verdict (trace env validate's
// progress), also of a program that does not load or whose contract fails.
func TestValidateTellsEachCheck(t *testing.T) {
	for name, src := range map[string][]byte{
		"example":     exampleSrc(),
		"no load":     []byte("def tools(:\n"),
		"no contract": []byte(strings.Replace(string(exampleSrc()), "def reset(seed):", "def reset(seed):\n    return []", 1)),
	} {
		var told []envprog.Check
		r, env, err := envprog.ValidateSource(context.Background(), name, src, nil, envprog.Limits{},
			envprog.ValidateOptions{Seeds: 5, InProcess: true, OnCheck: func(c envprog.Check) { told = append(told, c) }})
		if env != nil {
			env.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(told, r.Checks) {
			t.Errorf("%s: told %v, the report has %v", name, told, r.Checks)
		}
		if name != "no load" && len(r.Checks) != envprog.NumChecks {
			t.Errorf("%s: %d checks, NumChecks is %d", name, len(r.Checks), envprog.NumChecks)
		}
	}
}
