package calibrate

import (
	"context"
	"testing"

	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/examples"
)

func loadExample(t *testing.T) envprog.Env {
	t.Helper()
	env, err := envprog.Load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}

// The calibration checks of issue 13 on the shipped example environment
// (precondition verification over a seeded reservation store), played by
// the Starlark runtime with the release's 100 seeds × 16 rollouts.
func TestCalibrationOfExampleEnvironment(t *testing.T) {
	env := loadExample(t)
	tests := []struct {
		policy  Policy
		verdict string
	}{
		{OraclePolicy{}, TooEasy},
		{RandomPolicy{}, TooHard},
		{SkillPolicy{Skill: 0.4}, Accepted},
	}
	for _, tt := range tests {
		t.Run(policyName(tt.policy), func(t *testing.T) {
			res, err := Run(context.Background(), env, tt.policy, DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			s := res.Summary
			t.Log(s)
			if s.Verdict != tt.verdict {
				t.Fatalf("verdict %s, want %s: %s", s.Verdict, tt.verdict, s.Diagnosis)
			}
			if !s.Simulated {
				t.Error("not labeled simulated")
			}
		})
	}
}
