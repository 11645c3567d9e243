package envprog_test

import (
	"context"
	"testing"

	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/examples"
)

func exampleSrc() []byte { return examples.PreconditionAirline }

func loadExample(t testing.TB) envprog.Env {
	t.Helper()
	env, err := envprog.Load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		t.Fatalf("load example: %v", err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}

// play runs the actions on a fresh episode of seed and returns its reward.
func play(t testing.TB, env envprog.Env, seed int64, acts func(envprog.Episode) []envprog.Action) envprog.Reward {
	t.Helper()
	ctx := context.Background()
	ep, err := env.Reset(ctx, seed)
	if err != nil {
		t.Fatalf("seed %d: reset: %v", seed, err)
	}
	defer ep.Close()
	for _, a := range acts(ep) {
		res, err := ep.Step(ctx, a)
		if err != nil {
			t.Fatalf("seed %d: step: %v", seed, err)
		}
		if res.Done {
			break
		}
	}
	r, err := ep.Reward(ctx)
	if err != nil {
		t.Fatalf("seed %d: reward: %v", seed, err)
	}
	return r
}

func TestExampleReferenceScoresOne(t *testing.T) {
	env := loadExample(t)
	info := env.Info()
	if len(info.Tools) != 4 || !info.HasHint || !info.HasReference || info.Doc == "" {
		t.Fatalf("info: %+v", info)
	}
	kinds := map[string]int{}
	for seed := int64(0); seed < 200; seed++ {
		r := play(t, env, seed, func(ep envprog.Episode) []envprog.Action {
			acts, err := ep.Reference(context.Background())
			if err != nil {
				t.Fatalf("seed %d: reference: %v", seed, err)
			}
			kinds[acts[len(acts)-2].ToolCalls[0].Name]++
			return acts
		})
		if r.Value != 1 {
			t.Errorf("seed %d: reference scored %v %v", seed, r.Value, r.Components)
		}
	}
	t.Logf("last reference call before the answer: %v", kinds)
}
