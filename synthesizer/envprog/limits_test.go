package envprog_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/traceops/trace/synthesizer/envprog"
)

// hostile is a minimal valid program whose step(state, call) runs body
// when called with tool "boom" and answers "ok" otherwise.
func hostile(body string) []byte {
	return []byte(`"""A test program."""
def tools():
    return [{"type": "function", "function": {"name": "boom", "parameters": {"type": "object", "properties": {}}}},
            {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]
def reset(seed):
    return {"system": "s", "user": "u", "state": {"n": 0}}
def deep(n):
    return other(n + 1) + 1
def other(n):
    return deep(n + 1) + 1
def step(state, call):
    if call["type"] == "tool" and call["name"] == "boom":
` + indent(body, "        ") + `
    return {"result": "ok", "state": state}
def reward(state, transcript):
    return {"reward": 0.0}
`)
}

func indent(s, pre string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := range lines {
		lines[i] = pre + lines[i]
	}
	return strings.Join(lines, "\n")
}

type loader struct {
	name string
	load func(ctx context.Context, name string, src []byte, lim envprog.Limits) (envprog.Env, error)
}

var loaders = []loader{{"in-process", envprog.Load}, {"sandboxed", envprog.LoadSandboxed}}

func boom(ctx context.Context, ep envprog.Episode) error {
	_, err := ep.Step(ctx, envprog.Action{ToolCalls: []envprog.ToolCall{{Name: "boom", Arguments: []byte(`"{}"`)}}})
	return err
}

func ping(ctx context.Context, ep envprog.Episode) error {
	res, err := ep.Step(ctx, envprog.Action{ToolCalls: []envprog.ToolCall{{Name: "ping", Arguments: []byte(`{}`)}}})
	if err == nil && res.ToolResults[0].Content != "ok" {
		err = fmt.Errorf("ping answered %q", res.ToolResults[0].Content)
	}
	return err
}

// TestHostilePrograms runs each hostile program in-process (where the
// bound applies there) and sandboxed: each yields a *ProgramError naming
// the limit, within a bounded time, and the environment goes on serving
// other episodes afterwards.
func TestHostilePrograms(t *testing.T) {
	lim := envprog.Limits{MaxSteps: 2_000_000, CallTimeout: 2 * time.Second, MaxMemory: 256 << 20}
	cases := []struct {
		name      string
		body      string
		lim       envprog.Limits
		limit     string // the ProgramError's Limit
		msg       string // in its message
		inProcess bool   // whether the in-process runtime bounds it
	}{
		{name: "infinite loop", body: "while True:\n    state[\"n\"] += 1", lim: lim, limit: "steps", msg: "more than 2000000 execution steps", inProcess: true},
		{name: "infinite loop past the time limit", body: "while True:\n    state[\"n\"] += 1",
			lim: envprog.Limits{MaxSteps: 1 << 62, CallTimeout: 200 * time.Millisecond}, limit: "timeout", msg: "ran longer than 200ms", inProcess: true},
		{name: "deep (mutual) recursion", body: "deep(0)", lim: lim, limit: "", msg: "function deep called recursively", inProcess: true},
		{name: "runtime error", body: "x = {}[\"missing\"]", lim: lim, limit: "", msg: `key "missing" not in dict`, inProcess: true},
		{name: "memory bomb", body: `s = "a" * 500000000` + "\nstate[\"n\"] = len(s)", lim: lim, limit: "memory", msg: "ran out of memory"},
		{name: "growing memory bomb", body: "l = []\nfor i in range(100000000):\n    l.append(\"x\" * 1000)", lim: envprog.Limits{MaxSteps: 1 << 40, CallTimeout: 20 * time.Second, MaxMemory: 256 << 20}, limit: "memory", msg: "ran out of memory"},
	}
	for _, ld := range loaders {
		for _, tc := range cases {
			if ld.name == "in-process" && !tc.inProcess {
				continue // trusted programs only: memory is not bounded in-process
			}
			t.Run(ld.name+"/"+tc.name, func(t *testing.T) {
				ctx := context.Background()
				env, err := ld.load(ctx, "hostile.star", hostile(tc.body), tc.lim)
				if err != nil {
					t.Fatal(err)
				}
				defer env.Close()
				bystander, err := env.Reset(ctx, 2)
				if err != nil {
					t.Fatal(err)
				}
				ep, err := env.Reset(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				err = boom(ctx, ep)
				took := time.Since(start)
				var pe *envprog.ProgramError
				if !errors.As(err, &pe) {
					t.Fatalf("got %v (%T), want a *ProgramError", err, err)
				}
				t.Logf("after %v: %v", took, firstLine(pe.Error()))
				if pe.Func != "step" || pe.Seed != 1 || pe.Limit != tc.limit || !strings.Contains(pe.Msg, tc.msg) {
					t.Errorf("got Func %q Seed %d Limit %q Msg %q; want step, 1, %q, containing %q", pe.Func, pe.Seed, pe.Limit, firstLine(pe.Msg), tc.limit, tc.msg)
				}
				if _, err := ep.Step(ctx, envprog.Action{Content: "again"}); !errors.Is(err, envprog.ErrDone) {
					t.Errorf("a step after the program failed: %v, want ErrDone", err)
				}
				berr := ping(ctx, bystander)
				if tc.limit == "memory" {
					// The worker died: the other episodes it hosted fail
					// cleanly, and are not charged with the limit.
					if !errors.As(berr, &pe) || pe.Limit != "" || !strings.Contains(pe.Msg, "this episode is lost with the worker process the program's episodes share, which another episode's call ended: ") {
						t.Errorf("the bystander episode after the worker died: %v", berr)
					}
				} else if berr != nil {
					t.Errorf("the bystander episode: %v", berr)
				}
				// The environment goes on: a new episode plays normally.
				fresh, err := env.Reset(ctx, 3)
				if err != nil {
					t.Fatalf("reset after the failure: %v", err)
				}
				if err := ping(ctx, fresh); err != nil {
					t.Errorf("a new episode after the failure: %v", err)
				}
			})
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// TestHostileProgramDoesNotSlowOthers runs a sandboxed memory bomb and an
// infinite loop while the in-process example plays on: the example's
// episodes all complete and score as before.
func TestHostileProgramDoesNotSlowOthers(t *testing.T) {
	ctx := context.Background()
	good := loadExample(t)
	var wg sync.WaitGroup
	for _, body := range []string{`s = "a" * 500000000`, "while True:\n    pass"} {
		env, err := envprog.LoadSandboxed(ctx, "hostile.star", hostile(body), envprog.Limits{MaxSteps: 1 << 40, CallTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer env.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 3; i++ {
				ep, err := env.Reset(ctx, int64(i))
				if err != nil {
					t.Error(err)
					return
				}
				var pe *envprog.ProgramError
				if err := boom(ctx, ep); !errors.As(err, &pe) {
					t.Errorf("hostile program: %v", err)
				}
			}
		}()
	}
	for seed := int64(0); seed < 300; seed++ {
		r := play(t, good, seed, func(ep envprog.Episode) []envprog.Action {
			acts, _ := ep.Reference(ctx)
			return acts
		})
		if r.Value != 1 {
			t.Fatalf("seed %d: %v", seed, r)
		}
	}
	wg.Wait()
}

// TestLimitsCheck: Check refuses each negative limit and a reset cache
// above a quarter of a sandboxed program's memory, naming the key as the
// caller spells it (a flag, a setting); zero and the defaults pass.
func TestLimitsCheck(t *testing.T) {
	flag := func(key string) string { return "--" + strings.ReplaceAll(key, "_", "-") }
	for _, tt := range []struct {
		name      string
		lim       envprog.Limits
		sandboxed bool
		want      string // "" passes
	}{
		{"zero", envprog.Limits{}, true, ""},
		{"defaults", envprog.DefaultLimits, true, ""},
		{"no cache", envprog.Limits{ResetCache: -1}, true, ""},
		{"negative memory", envprog.Limits{MaxMemory: -1}, true, "--max-memory -1: want a positive byte count (0: the default, 268435456)"},
		{"negative timeout", envprog.Limits{CallTimeout: -time.Second}, false, "--call-timeout -1s"},
		{"negative turns", envprog.Limits{MaxTurns: -1}, false, "--max-turns -1"},
		{"cache below -1", envprog.Limits{ResetCache: -2}, true, "--reset-cache -2"},
		{"cache a quarter of memory", envprog.Limits{MaxMemory: 64 << 20, ResetCache: 16 << 20}, true, ""},
		{"cache above a quarter", envprog.Limits{MaxMemory: 64 << 20, ResetCache: 16<<20 + 1}, true, "--reset-cache 16777217: more than a quarter of --max-memory (67108864)"},
		{"default cache, small memory", envprog.Limits{MaxMemory: 16 << 20, ResetCache: 8 << 20}, true, "--reset-cache 8388608"},
		{"zero cache follows memory", envprog.Limits{MaxMemory: 16 << 20}, true, ""},
		{"in-process memory is not bounded", envprog.Limits{MaxMemory: 16 << 20, ResetCache: 8 << 20}, false, ""},
	} {
		err := tt.lim.Check(flag, tt.sandboxed)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v, want none", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
	// Every bad limit is named, not only the first.
	err := envprog.Limits{MaxMemory: -1, MaxTurns: -1}.Check(func(k string) string { return "programs." + k }, true)
	if err == nil || !strings.Contains(err.Error(), "programs.max_memory") || !strings.Contains(err.Error(), "programs.max_turns") {
		t.Errorf("two bad limits: %v", err)
	}
}
