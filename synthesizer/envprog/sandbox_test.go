package envprog_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/traceops/trace/synthesizer/envprog"
)

// slowReset is a valid program whose reset loops n times; step answers
// "ok" to "ping", spins on "spin" and allocates 500 MB on "bomb".
func slowReset(n int) []byte {
	return []byte(fmt.Sprintf(`"""A test program."""
def tools():
    return [{"type": "function", "function": {"name": t, "parameters": {"type": "object", "properties": {}}}} for t in ["ping", "spin", "bomb"]]
def reset(seed):
    x = 0
    for i in range(%d):
        x += i
    return {"system": "s", "user": "u", "state": {"x": x}}
def step(state, call):
    if call["type"] == "tool" and call["name"] == "spin":
        for i in range(1000000000000):
            pass
    if call["type"] == "tool" and call["name"] == "bomb":
        s = "a" * 500000000
        state["x"] = len(s)
    return {"result": "ok", "state": state}
def reward(state, transcript):
    return {"reward": 0.0}
`, n))
}

func stats(t *testing.T, env envprog.Env) envprog.WorkerStats {
	t.Helper()
	st, _, err := envprog.SandboxStats(context.Background(), env)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitStats polls the worker's counts until ok holds (10 s at most).
func waitStats(t *testing.T, env envprog.Env, ok func(envprog.WorkerStats) bool) envprog.WorkerStats {
	t.Helper()
	var st envprog.WorkerStats
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if st = stats(t, env); ok(st) {
			return st
		}
	}
	t.Fatalf("the worker's counts stayed at %+v", st)
	return st
}

// TestSandboxSlowResetsKeepGoroutinesBounded plays one reset after another,
// each running past the 2 ms after which another goroutine takes over the
// worker's reading: the goroutine that handled it must not stay behind
// for good (it did, one per reset, with its grown stack).
func TestSandboxSlowResetsKeepGoroutinesBounded(t *testing.T) {
	ctx := context.Background()
	env, err := envprog.LoadSandboxed(ctx, "slow.star", slowReset(100_000), envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	const resets = 150
	var slowest, fastest time.Duration
	for i := range resets {
		start := time.Now()
		ep, err := env.Reset(ctx, int64(i))
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		ep.Close()
		slowest = max(slowest, took)
		if i == 0 || took < fastest {
			fastest = took
		}
	}
	st := stats(t, env)
	t.Logf("after %d resets of %v to %v: %+v", resets, fastest, slowest, st)
	if st.Goroutines > 20 {
		t.Errorf("the worker has %d goroutines after %d sequential resets", st.Goroutines, resets)
	}
	if st.Episodes != 0 {
		t.Errorf("the worker keeps %d episodes, all closed", st.Episodes)
	}
}

// TestSandboxCanceledResetsLeaveNoEpisodes gives up on resets at various
// points (before sending, while the worker runs them, as they answer):
// the worker must not keep the episodes of the resets it completed anyway
// for a parent that no longer waits for them.
func TestSandboxCanceledResetsLeaveNoEpisodes(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		loops int // reset's
	}{{"fast reset", 0}, {"slow reset", 30_000}} {
		t.Run(tc.name, func(t *testing.T) {
			env, err := envprog.LoadSandboxed(ctx, "slow.star", slowReset(tc.loops), envprog.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			defer env.Close()
			waits := []time.Duration{0, time.Microsecond, 10 * time.Microsecond, 30 * time.Microsecond, 60 * time.Microsecond,
				100 * time.Microsecond, 200 * time.Microsecond, 500 * time.Microsecond, time.Millisecond, 3 * time.Millisecond}
			canceled, played := 0, 0
			for i := range 400 {
				cctx, cancel := context.WithTimeout(ctx, waits[i%len(waits)])
				ep, err := env.Reset(cctx, int64(i))
				cancel()
				switch {
				case err == nil:
					played++
					ep.Close()
				case errors.Is(err, context.DeadlineExceeded):
					canceled++
				default:
					t.Fatal(err)
				}
			}
			st := waitStats(t, env, func(st envprog.WorkerStats) bool { return st.Calls == 0 })
			t.Logf("%d resets given up, %d played and closed: %+v", canceled, played, st)
			if canceled == 0 {
				t.Fatal("no reset was given up")
			}
			if st.Episodes != 0 || st.Resets != 0 {
				t.Errorf("the worker keeps %d episodes (%d resets) with all closed or given up", st.Episodes, st.Resets)
			}
		})
	}
}

// TestSandboxBystanderOfAWorkerDeath runs a memory bomb in one episode
// while another episode's call is in flight in the same worker: the
// bystander is told its episode is lost with the shared worker, and is not
// charged with the memory limit.
func TestSandboxBystanderOfAWorkerDeath(t *testing.T) {
	ctx := context.Background()
	env, err := envprog.LoadSandboxed(ctx, "slow.star", slowReset(0), envprog.Limits{MaxSteps: 1 << 40, CallTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	bystander, err := env.Reset(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	bomber, err := env.Reset(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	spun := make(chan error, 1)
	go func() {
		_, err := bystander.Step(ctx, envprog.Action{ToolCalls: []envprog.ToolCall{{Name: "spin", Arguments: []byte(`{}`)}}})
		spun <- err
	}()
	waitStats(t, env, func(st envprog.WorkerStats) bool { return st.Calls == 1 }) // the spin runs
	_, err = bomber.Step(ctx, envprog.Action{ToolCalls: []envprog.ToolCall{{Name: "bomb", Arguments: []byte(`{}`)}}})
	var pe *envprog.ProgramError
	if !errors.As(err, &pe) || !strings.Contains(pe.Msg, "ran out of memory") {
		t.Fatalf("the bomb: %v", err)
	}
	t.Logf("the bomb, with another call in flight: %v", firstLine(err.Error()))
	err = <-spun
	if !errors.As(err, &pe) {
		t.Fatalf("the bystander's call: %v, want a *ProgramError", err)
	}
	t.Logf("the bystander: %v", firstLine(err.Error()))
	if pe.Func != "step" || pe.Seed != 1 || pe.Limit != "" || !strings.Contains(pe.Msg, "this episode is lost with the worker process the program's episodes share: ") ||
		!strings.Contains(pe.Msg, "ran out of memory") {
		t.Errorf("the bystander's call got Func %q Seed %d Limit %q Msg %q", pe.Func, pe.Seed, pe.Limit, firstLine(pe.Msg))
	}
}

// workerProcFile starts a sandboxed program's worker and reads its
// /proc/<pid>/<file>; the worker is closed when the test ends.
func workerProcFile(t *testing.T, file string) []byte {
	t.Helper()
	ctx := context.Background()
	env, err := envprog.LoadSandboxed(ctx, "slow.star", slowReset(0), envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	_, pid, err := envprog.SandboxStats(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSandboxWorkerEnvironment: the worker, which runs untrusted programs,
// does not see the parent's environment (tokens, database credentials).
func TestSandboxWorkerEnvironment(t *testing.T) {
	t.Setenv("TRACE_SECRET_X", "s3cret")
	b := workerProcFile(t, "environ")
	vars := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	t.Logf("the worker's environment: %q", vars)
	if !slices.Contains(vars, "TRACE_ENVPROG_WORKER=1") {
		t.Fatalf("not the worker's environment: %q", vars)
	}
	for _, v := range vars {
		if strings.HasPrefix(v, "TRACE_SECRET_X=") {
			t.Errorf("the worker sees %s", v)
		}
	}
}

// stuckProgram's tool "stuck" parses a decimal number of 4 million
// digits: one built-in call (int()) that takes seconds (math/big's
// decimal parsing is quadratic) and does not see a cancel (the
// interpreter checks between instructions).
var stuckProgram = []byte(`"""A program with a long built-in call."""
def tools():
    return [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}} for n in ("stuck", "ping")]
def reset(seed):
    return {"system": "s", "user": "u", "state": {"n": 0}}
def step(state, call):
    if call["type"] == "tool" and call["name"] == "stuck":
        state["n"] = int("9" * 4000000) % 7
    return {"result": "ok", "state": state}
def reward(state, transcript):
    return {"reward": 0.0}
`)

// TestSandboxAbandonedStuckCallKillsWorker: a call whose caller gives up
// (its context ends) while the call is stuck inside one long built-in is
// still bounded: the worker is killed at the call's bound (2 × CallTimeout
// + 1 s), as if the caller had waited, instead of running the built-in to
// its end; the other episodes are told they were lost with it.
func TestSandboxAbandonedStuckCallKillsWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("plays a built-in call of several seconds")
	}
	ctx := context.Background()
	lim := envprog.Limits{MaxSteps: 1 << 40, CallTimeout: 2 * time.Second, MaxMemory: 512 << 20}
	env, err := envprog.LoadSandboxed(ctx, "stuck.star", stuckProgram, lim)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	tool := func(name string) envprog.Action {
		return envprog.Action{ToolCalls: []envprog.ToolCall{{Name: name, Arguments: []byte(`{}`)}}}
	}
	ep, err := env.Reset(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	bystander, err := env.Reset(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	_, pid, err := envprog.SandboxStats(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	gone, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := ep.Step(gone, tool("stuck")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the abandoned call: %v", err)
	}
	// The worker is killed at the stuck call's bound (without the bound it
	// would live on); the bystander's next call says its episode went with it.
	for end := start.Add(60 * time.Second); !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the worker (pid %d) still runs a minute after a call stuck past its bound was abandoned", pid)
		}
	}
	t.Logf("worker gone %.1fs after the stuck call began", time.Since(start).Seconds())
	_, err = bystander.Step(ctx, tool("ping"))
	var pe *envprog.ProgramError
	if !errors.As(err, &pe) || pe.Limit != "" || !strings.Contains(pe.Msg, "this episode is lost with the worker process") ||
		!strings.Contains(pe.Msg, "a call ran past 5s") {
		t.Fatalf("the bystander's call: %v", err)
	}
	t.Logf("the bystander: %s", firstLine(pe.Msg))
}

// TestSandboxOversizedResultIsAProgramError: a call whose result is too
// large for one frame of the worker's protocol (64 MiB) is the program's
// failure, named with its function, seed and limit "output"; it used to
// come back as an error of the runtime, which stopped `trace env
// validate` and any caller that tells the program's errors from its own.
// (Resets, steps and hints meet the smaller MaxTranscriptText first:
// TestTranscriptTextIsBounded.)
func TestSandboxOversizedResultIsAProgramError(t *testing.T) {
	src := []byte(`"""A test program."""
def tools():
    return [{"type": "function", "function": {"name": "big", "parameters": {"type": "object", "properties": {}}}}]
def reset(seed):
    return {"system": "s", "user": "u", "state": {}}
def step(state, call):
    return {"result": "r", "state": state}
def reward(state, transcript):
    return {"reward": 0.0}
def reference(state):
    return [{"type": "final", "content": "h" * 70000000}]
`)
	ctx := context.Background()
	env, err := envprog.LoadSandboxed(ctx, "big.star", src, envprog.Limits{MaxMemory: 2 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	check := func(err error, fn string, seed int64) {
		t.Helper()
		var pe *envprog.ProgramError
		if !errors.As(err, &pe) {
			t.Fatalf("got %v, want a *ProgramError", err)
		}
		if pe.Func != fn || pe.Seed != seed || pe.Limit != "output" || !strings.Contains(pe.Msg, "more than the 67108864") {
			t.Errorf("got Func %q Seed %d Limit %q Msg %q; want %s(), seed %d, limit output", pe.Func, pe.Seed, pe.Limit, pe.Msg, fn, seed)
		}
	}
	ep, err := env.Reset(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ep.Reference(ctx)
	check(err, "reference", 3)
	// the worker lives on: the next episode plays
	if _, err := env.Reset(ctx, 4); err != nil {
		t.Fatalf("after an oversized result: %v", err)
	}
}

// TestTranscriptTextIsBounded: the text a program puts in an episode's
// transcript is bounded (MaxTranscriptText), in-process and sandboxed. A
// sandboxed program returning one shared 1 MiB global from every call
// used to make the parent hold a copy per call (72 MiB over 24 turns of
// 3 calls here, 1.5 GiB with a 64 MiB global), all within the worker's
// memory limit.
func TestTranscriptTextIsBounded(t *testing.T) {
	src := []byte(`"""A test program."""
BIG = "r" * (1 << 20)
def tools():
    return [{"type": "function", "function": {"name": "big", "parameters": {"type": "object", "properties": {}}}}]
def reset(seed):
    return {"system": "s", "user": "u" * (17 << 20 if seed == 7 else 1), "state": {}}
def step(state, call):
    return {"result": BIG, "state": state}
def reward(state, transcript):
    return {"reward": 0.0}
def hint(state):
    return "h" * (16 << 20)
`)
	ctx := context.Background()
	for _, sandboxed := range []bool{false, true} {
		t.Run(fmt.Sprint("sandboxed=", sandboxed), func(t *testing.T) {
			load := envprog.Load
			if sandboxed {
				load = envprog.LoadSandboxed
			}
			env, err := load(ctx, "big.star", src, envprog.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			defer env.Close()
			check := func(err error, fn string, seed int64) {
				t.Helper()
				var pe *envprog.ProgramError
				if !errors.As(err, &pe) || pe.Func != fn || pe.Seed != seed || pe.Limit != "output" || !strings.Contains(pe.Msg, "more than the 16777216") {
					t.Fatalf("got %v, want a *ProgramError of %s(), seed %d, limit output", err, fn, seed)
				}
			}
			_, err = env.Reset(ctx, 7)
			check(err, "reset", 7)
			ep, err := env.Reset(ctx, 3)
			if err != nil {
				t.Fatal(err)
			}
			// with a hint, the system prompt would pass the bound
			_, err = ep.Hint(ctx)
			check(err, "hint", 3)
			call := tool("big", "{}")
			var stepErr error
			for turn := 0; turn < 24 && stepErr == nil; turn++ {
				_, stepErr = ep.Step(ctx, envprog.Action{ToolCalls: []envprog.ToolCall{call, call, call}})
			}
			check(stepErr, "step", 3)
			text := 0
			for _, m := range ep.Messages() {
				text += len(m.Content)
			}
			if text > envprog.MaxTranscriptText {
				t.Errorf("the transcript holds %d bytes, more than %d", text, envprog.MaxTranscriptText)
			}
		})
	}
}

// TestRewardComponentsAreBounded: a reward's components are bounded in
// number (MaxComponents) and name length (MaxComponentName), in-process and
// sandboxed; a sandboxed program returning a shared 1 MiB global as a
// name used to hand the parent (and each recorded episode) a copy per
// reward.
func TestRewardComponentsAreBounded(t *testing.T) {
	src := []byte(`"""A test program."""
BIG = "c" * (1 << 20)
def tools():
    return [{"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}]
def reset(seed):
    return {"system": "s", "user": "u", "state": {"seed": seed}}
def step(state, call):
    return {"result": "ok", "state": state}
def reward(state, transcript):
    if state["seed"] == 1:
        return {"reward": 0.5, "components": {BIG: 1.0}}
    if state["seed"] == 2:
        return {"reward": 0.5, "components": {"c%d" % i: 1.0 for i in range(65)}}
    return {"reward": 0.5, "components": {"c%d" % i: 1.0 for i in range(64)}}
`)
	ctx := context.Background()
	for _, sandboxed := range []bool{false, true} {
		t.Run(fmt.Sprint("sandboxed=", sandboxed), func(t *testing.T) {
			load := envprog.Load
			if sandboxed {
				load = envprog.LoadSandboxed
			}
			env, err := load(ctx, "components.star", src, envprog.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			defer env.Close()
			for _, tt := range []struct {
				seed int64
				msg  string // "" for a reward
			}{{1, "more than the 128 a name may have"}, {2, "65 components, more than the 64"}, {3, ""}} {
				ep, err := env.Reset(ctx, tt.seed)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := ep.Step(ctx, envprog.Action{Content: "done"}); err != nil {
					t.Fatal(err)
				}
				r, err := ep.Reward(ctx)
				var pe *envprog.ProgramError
				switch {
				case tt.msg == "" && (err != nil || len(r.Components) != 64):
					t.Errorf("seed %d: %d components, %v; want 64", tt.seed, len(r.Components), err)
				case tt.msg != "" && (!errors.As(err, &pe) || pe.Func != "reward" || pe.Limit != "output" || !strings.Contains(pe.Msg, tt.msg) || len(pe.Msg) > 200):
					t.Errorf("seed %d: got %d components, %.200v; want a *ProgramError of reward(), limit output, %q", tt.seed, len(r.Components), err, tt.msg)
				}
				ep.Close()
			}
		})
	}
}
