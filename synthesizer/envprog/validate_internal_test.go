package envprog

import (
	"context"
	"runtime"
	"testing"
)

// measuredEnv is a loaded env that reads the live heap (after a
// collection) when seed measureAt is reset for the first time.
type measuredEnv struct {
	Env
	measureAt int64
	heap      uint64
}

func (m *measuredEnv) Reset(ctx context.Context, seed int64) (Episode, error) {
	if seed == m.measureAt && m.heap == 0 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		m.heap = ms.HeapAlloc
	}
	return m.Env.Reset(ctx, seed)
}

// TestResetsKeepNoInstances: the distinct-instances check keeps what tells
// seeds apart, not their instances. It kept each seed's start and
// reference solution as text, so a program whose worker makes 1 MiB per
// reset (64 MiB with a reference) and lets it go made the validating
// process hold that much per seed: 100 seeds by default.
func TestResetsKeepNoInstances(t *testing.T) {
	src := []byte(`"""A test program."""
def tools():
    return [{"type": "function", "function": {"name": "t", "parameters": {"type": "object", "properties": {}}}}]
def reset(seed):
    return {"system": "s", "user": str(seed) + "u" * (1 << 20), "state": {}}
def step(state, call):
    return {"result": "ok", "state": state}
def reward(state, transcript):
    return {"reward": 0.0}
`)
	ctx := context.Background()
	// Without the reset cache, which would keep the twice-reset seeds'
	// 1 MiB starts (up to its budget): this measures the validator's own.
	env, err := Load(ctx, "big.star", src, Limits{ResetCache: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	const seeds = 40
	m := &measuredEnv{Env: env, measureAt: seeds - 1}
	v := &validator{env: m, info: env.Info(), o: ValidateOptions{Seeds: seeds}.withDefaults()}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var r Report
	if err := v.resets(ctx, &r); err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		t.Fatalf("the checks failed:\n%s", r.Diagnosis())
	}
	if grown := int64(m.heap) - int64(before.HeapAlloc); grown > 8<<20 {
		t.Errorf("after %d seeds the live heap grew by %d MiB", seeds-1, grown>>20)
	}
}
