package envprog_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/examples"
)

// transcriptOf plays acts on a fresh episode of seed and returns all it
// showed (start, step results, reward, messages) as JSON, to compare runs
// with and without the reset cache.
func transcriptOf(t testing.TB, env envprog.Env, seed int64, acts func(envprog.Episode) []envprog.Action) string {
	t.Helper()
	s, err := transcript(env, seed, acts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func transcript(env envprog.Env, seed int64, acts func(envprog.Episode) []envprog.Action) (string, error) {
	ctx := context.Background()
	ep, err := env.Reset(ctx, seed)
	if err != nil {
		return "", fmt.Errorf("seed %d: reset: %w", seed, err)
	}
	defer ep.Close()
	out := []any{ep.Start()}
	for _, a := range acts(ep) {
		res, err := ep.Step(ctx, a)
		if err != nil {
			return "", fmt.Errorf("seed %d: step: %w", seed, err)
		}
		out = append(out, res)
		if res.Done {
			break
		}
	}
	r, err := ep.Reward(ctx)
	if err != nil {
		return "", fmt.Errorf("seed %d: reward: %w", seed, err)
	}
	b, err := json.Marshal(append(out, r, ep.Messages()))
	return string(b), err
}

func toolCall(name, args string) envprog.Action {
	return envprog.Action{ToolCalls: []envprog.ToolCall{{ID: "c", Name: name, Arguments: json.RawMessage(args)}}}
}

// exampleActs cancels the episode's reservation first (a mutation a later
// episode of the seed must not see), then plays the reference solution
// (none when the reference fails, which the comparison then shows).
func exampleActs(ep envprog.Episode) []envprog.Action {
	ref, err := ep.Reference(context.Background())
	if err != nil {
		return nil
	}
	var rid string
	for _, a := range ref {
		for _, c := range a.ToolCalls {
			var args map[string]any
			_ = json.Unmarshal(c.Arguments, &args)
			if s, ok := args["reservation_id"].(string); ok {
				rid = s
			}
		}
	}
	return append([]envprog.Action{toolCall("cancel_reservation", `{"reservation_id": "`+rid+`"}`)}, ref...)
}

// examplePair loads the example twice: with a reset cache of budget bytes
// (0: the default), and without one.
func examplePair(t *testing.T, budget int64) (cached, plain envprog.Env) {
	t.Helper()
	for i, lim := range []envprog.Limits{{ResetCache: budget}, {ResetCache: -1}} {
		env, err := envprog.Load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, lim)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { env.Close() })
		if i == 0 {
			cached = env
		} else {
			plain = env
		}
	}
	return cached, plain
}

// TestResetCacheIsInvisible plays the example's seeds repeatedly, each
// episode mutating its state: seeds 0..3 four times (cached at the
// second, hit at the third and fourth), then 20 other seeds twice (which
// push 0..3 out of a 256 kB cache), then 0..3 four times again. Every episode must
// show exactly what it shows without the cache. It also asserts the cache
// was used and evicted: were it not, this would test nothing.
func TestResetCacheIsInvisible(t *testing.T) {
	ctx := context.Background()
	const budget = 256 << 10
	cached, plain := examplePair(t, budget)
	var seeds []int64
	for _, phase := range []struct{ from, to, times int64 }{{0, 4, 4}, {10, 30, 2}, {0, 4, 4}} {
		for s := phase.from; s < phase.to; s++ {
			for range phase.times {
				seeds = append(seeds, s)
			}
		}
	}
	for i, seed := range seeds {
		if got, want := transcriptOf(t, cached, seed, exampleActs), transcriptOf(t, plain, seed, exampleActs); got != want {
			t.Fatalf("episode %d (seed %d) differs with the cache:\n got %.600s\nwant %.600s", i, seed, got, want)
		}
	}
	st, err := envprog.ResetCacheOf(ctx, cached)
	if err != nil {
		t.Fatal(err)
	}
	// Up to 16 hits (seeds whose state is above an eighth of the budget are
	// not cached); at most 256 kB held, so not all 24 seeds.
	if st.Hits < 12 || st.Entries < 6 || st.Entries >= 24 || st.Bytes > budget {
		t.Fatalf("reset cache %+v: want at least 12 hits, and 6 to 23 entries within %d bytes", st, budget)
	}
	if none, _ := envprog.ResetCacheOf(ctx, plain); none != (envprog.ResetCacheStats{}) {
		t.Fatalf("the program without a cache counted %+v", none)
	}
	t.Logf("reset cache: %+v", st)
}

// cacheProbe keeps in its state what a copy could get wrong: a list
// reachable twice (aliasing), a rand object drawn from by step, and, when
// lambda is set, a closure over the state's list.
const cacheProbe = `
def tools():
    return [{"type": "function", "function": {"name": "draw", "parameters": {"type": "object", "properties": {}}}}]

def reset(seed):
    r = rand(seed)
    xs = [r.randint(0, 9)]
    state = {"r": r, "xs": xs, "again": {"xs": xs}}
    if LAMBDA:
        state["f"] = lambda: len(xs)
    return {"system": "s", "user": "u%d" % seed, "state": state}

def step(state, call):
    if call["type"] == "final":
        return {"state": state, "done": True}
    state["xs"].append(state["r"].randint(0, 1000))
    n = state["f"]() if LAMBDA else len(state["xs"])
    return {"result": {"xs": state["again"]["xs"], "n": n}, "state": state}

def reward(state, transcript):
    return {"reward": 1.0, "components": {}}
`

func TestResetCacheCopiesWhatTheStateHolds(t *testing.T) {
	ctx := context.Background()
	acts := func(envprog.Episode) []envprog.Action {
		return []envprog.Action{toolCall("draw", `{}`), toolCall("draw", `{}`), {Content: "done"}}
	}
	for _, lambda := range []bool{false, true} {
		t.Run(fmt.Sprintf("lambda=%v", lambda), func(t *testing.T) {
			src := []byte(fmt.Sprintf("LAMBDA = %v\n%s", map[bool]string{false: "False", true: "True"}[lambda], cacheProbe))
			for _, sandboxed := range []bool{false, true} {
				load := envprog.Load
				if sandboxed {
					load = envprog.LoadSandboxed
				}
				cached, err := load(ctx, "probe.star", src, envprog.Limits{})
				if err != nil {
					t.Fatal(err)
				}
				plain, err := load(ctx, "probe.star", src, envprog.Limits{ResetCache: -1})
				if err != nil {
					t.Fatal(err)
				}
				for i, seed := range []int64{1, 1, 1, 2, 1, 2, 2} {
					if got, want := transcriptOf(t, cached, seed, acts), transcriptOf(t, plain, seed, acts); got != want {
						t.Fatalf("sandboxed %v, episode %d (seed %d) differs with the cache:\n got %s\nwant %s", sandboxed, i, seed, got, want)
					}
				}
				st, err := envprog.ResetCacheOf(ctx, cached)
				if err != nil {
					t.Fatal(err)
				}
				// Seeds 1 and 2 are cached at their second reset and hit
				// at the third and fourth: 3 hits; never with a closure.
				if want := map[bool]uint64{false: 3, true: 0}[lambda]; st.Hits != want {
					t.Fatalf("sandboxed %v: reset cache %+v, want %d hits", sandboxed, st, want)
				}
				if none, err := envprog.ResetCacheOf(ctx, plain); err != nil || none != (envprog.ResetCacheStats{}) {
					t.Fatalf("sandboxed %v: the program loaded without a cache counted %+v (%v)", sandboxed, none, err)
				}
				cached.Close()
				plain.Close()
			}
		})
	}
}

// TestResetCacheConcurrent resets a few seeds from many goroutines at once
// (run it with -race): every episode is what the program without the
// cache shows.
func TestResetCacheConcurrent(t *testing.T) {
	ctx := context.Background()
	cached, plain := examplePair(t, 0)
	acts := exampleActs
	want := map[int64]string{}
	for seed := int64(0); seed < 3; seed++ {
		want[seed] = transcriptOf(t, plain, seed, acts)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 12; i++ {
				seed := int64((g + i) % 3)
				if got, err := transcript(cached, seed, acts); err != nil || got != want[seed] {
					errs <- fmt.Sprintf("goroutine %d, seed %d: differs with the cache (%v)", g, seed, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if st, _ := envprog.ResetCacheOf(ctx, cached); st.Hits == 0 {
		t.Fatalf("no hits: %+v", st)
	}
}

// TestValidationRunsEveryReset: ValidateSource loads without a reset
// cache, so its determinism checks compare real resets (seed 0 is reset
// by the contract check and twice by the determinism check: with a cache
// its third reset would be a copy of the second).
func TestValidationRunsEveryReset(t *testing.T) {
	ctx := context.Background()
	rep, env, err := envprog.ValidateSource(ctx, examples.PreconditionAirlineName, examples.PreconditionAirline, nil, envprog.Limits{}, envprog.ValidateOptions{Seeds: 10})
	if err != nil || env == nil {
		t.Fatalf("validate: %v (env %v)", err, env)
	}
	defer env.Close()
	if !rep.OK() {
		t.Fatalf("the example failed validation:\n%s", rep.Diagnosis())
	}
	st, err := envprog.ResetCacheOf(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	if st != (envprog.ResetCacheStats{}) {
		t.Fatalf("the validated program had a reset cache: %+v", st)
	}
}
