package synthesizer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/synthesizer/calibrate"
)

// TestGenerationRealModel runs the generation path against the real local
// model (scripts/llm-server.sh: Gemma 3 270M, a base model). Its programs
// are not meant to be valid; what is tested is the protocol and that the
// failure is recorded cleanly: every attempt is a failed attempt with a
// reason (no program, or a named validation check), the environment ends
// FAILED (never DONE) after its attempts, nothing is announced, and every
// HTTP attempt has an llm_calls audit row with tokens.
func TestGenerationRealModel(t *testing.T) {
	url, model := llmtest.RealServer(t)
	rec := &llm.BufferRecorder{}
	client, err := llm.New(llm.Config{BaseURL: url, Model: model, Recorder: rec, Timeout: 5 * time.Minute, MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	// Short answers and a short prompt (two tools, no example rollouts):
	// the model reads a prompt at about 15 tokens/s and writes about 3
	// tokens/s on 2 shared cores.
	gen, err := NewGenerator(client, GeneratorConfig{MaxTokens: 48})
	if err != nil {
		t.Fatal(err)
	}
	store, pub := newMemStore(), &memPublisher{}
	stage, err := NewStage(Config{MaxAttempts: 2, LLM: gen, Validator: EnvValidator{}, Store: store, Publisher: pub,
		Calibrators: func(*Job) (Calibrator, error) {
			return PolicyCalibrator{Policy: calibrate.SkillPolicy{Skill: 0.4}, Config: calibrate.DefaultConfig()}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e, err := stage.Synthesize(context.Background(), testRequest("trig-real-model"))
	if err != nil {
		t.Fatalf("the run failed instead of recording the failure: %v", err)
	}
	t.Logf("%s after %d attempts in %v: %s", e.Status, len(e.Attempts), time.Since(start).Round(time.Second), e.Reason)
	if e.Status != StatusFailed || len(e.Attempts) != 2 || !strings.Contains(e.Reason, "2 attempts, none accepted") {
		t.Fatalf("status %s, %d attempts, reason %q", e.Status, len(e.Attempts), e.Reason)
	}
	for _, a := range e.Attempts {
		t.Logf("attempt %d (%s, finish %s, %d+%d tokens): %s", a.N, a.Stage, a.LLM.FinishReason, a.LLM.PromptTokens, a.LLM.CompletionTokens, cut(a.Diagnosis, 300))
		if a.Accepted || a.Diagnosis == "" || (a.Stage != StageGenerate && a.Stage != StageValidate) || a.Model != model {
			t.Errorf("attempt %d: %+v", a.N, a)
		}
		if a.LLM == nil || a.LLM.PromptTokens == 0 || a.LLM.CompletionTokens == 0 {
			t.Errorf("attempt %d: token accounting %+v", a.N, a.LLM)
		}
		if a.Stage == StageValidate && (a.Validation == nil || a.Validation.OK || a.Program == "") {
			t.Errorf("attempt %d: validation %+v", a.N, a.Validation)
		}
	}
	if len(pub.msgs) != 0 {
		t.Fatal("a failed environment was announced")
	}
	stored, _ := store.LoadEnvironment(context.Background(), e.ID)
	if stored == nil || stored.Status != StatusFailed || len(stored.Attempts) != 2 {
		t.Fatalf("stored %+v", stored)
	}
	calls := rec.Drain()
	if len(calls) < 2 {
		t.Fatalf("%d audit rows for 2 generations", len(calls))
	}
	for _, c := range calls {
		if c.Purpose != PurposeGenerate || c.Model != model || c.RolloutID != e.ID {
			t.Errorf("audit row %+v", c)
		}
	}
}
