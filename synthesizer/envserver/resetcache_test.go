package envserver_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/traceops/trace/synthesizer/envclient"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/examples"
	"github.com/traceops/trace/synthesizer/openenv"
)

// TestResetCacheMetric: a seed reset three times over the protocol is
// answered by reset twice and by the program's reset cache once, in
// process and sandboxed (where the worker tells the parent), the third
// observation is the first's, and trace_env_resets_total counts each.
func TestResetCacheMetric(t *testing.T) {
	sb, err := envprog.LoadSandboxed(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	f := start(t, testConfig(), nil, map[string]envprog.Env{"sandboxed": sb})
	ctx := ctxT(t)
	for _, id := range []string{exampleID, "sandboxed"} {
		s, err := envclient.New(f.http.URL+"/v1/environments/"+id, "").Dial(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seed := int64(11)
		var first []byte
		for i := 0; i < 3; i++ {
			obs, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed})
			if err != nil {
				t.Fatalf("%s: reset %d: %v", id, i, err)
			}
			b, _ := json.Marshal(obs.Observation.Messages)
			if i == 0 {
				first = b
			} else if string(b) != string(first) {
				t.Fatalf("%s: reset %d shows %s, the first showed %s", id, i, b, first)
			}
		}
		s.Close()
		hit := counter(t, f, "trace_env_resets_total", map[string]string{"environment": id, "reset_cache": "hit"})
		miss := counter(t, f, "trace_env_resets_total", map[string]string{"environment": id, "reset_cache": "miss"})
		if hit != 1 || miss != 2 {
			t.Fatalf("%s: trace_env_resets_total hit %v, miss %v; want 1 and 2", id, hit, miss)
		}
	}
}
