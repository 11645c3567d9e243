package calibrate

import (
	"context"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/examples"
)

// The real local model (scripts/llm-server.sh, Gemma 3 270M base) plays the
// example environment over the protocol with tools: a base model's play is
// not meaningful, so the test checks the protocol (every turn answered and
// played, the reward in range, audit rows recorded, the summary not labeled
// simulated), not the verdict. Two turns at most, short answers.
func TestOpenAIPolicyRealModel(t *testing.T) {
	url, model := llmtest.RealServer(t)
	env, err := envprog.Load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{MaxTurns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	rec := &llm.BufferRecorder{}
	client, err := llm.New(llm.Config{BaseURL: url, Model: model, Recorder: rec, MaxTokens: 24, Timeout: 3 * time.Minute, MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Seeds, cfg.Rollouts, cfg.Concurrency = 1, 1, 1
	res, err := Run(context.Background(), env, NewOpenAIPolicy(client, "real"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := res.Summary
	t.Logf("%s; %d turns; audit %+v", s, res.Rollouts[0][0].Turns, rec.Drain())
	if s.Simulated || s.Rollouts != 1 || res.Rollouts[0][0].Turns < 1 || s.Mean < 0 || s.Mean > 1 {
		t.Errorf("summary %s", s)
	}
}
