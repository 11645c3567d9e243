package adapter_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/plan"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// plannerStage is a stage whose planning agent talks to srv through a
// real llm.Client (retries, audit rows in rec).
func plannerStage(t *testing.T, srv *llmtest.Server, rec llm.Recorder, st *sink.Store, b *bus.Bus) *adapter.Stage {
	t.Helper()
	client, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "planner-model", Recorder: rec, MaxAttempts: 3,
		BackoffInitial: time.Millisecond, BackoffMax: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p, err := adapter.NewLLMPlanner(client, adapter.LLMPlannerConfig{Environments: st})
	if err != nil {
		t.Fatal(err)
	}
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, Planner: p,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func plannerFixture(t *testing.T) (*sink.Store, *bus.Bus) {
	t.Helper()
	st := testenv.ClickHouse(t).Store()
	b, err := bus.Connect(context.Background(), bus.Config{URL: testenv.NATS(t).URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return st, b
}

// TestPlannerAcceptsPlanInBounds: the agent's adjustment is applied, its
// reason recorded on the stored job, and the prompt showed the
// environment, its calibration and the default plan.
func TestPlannerAcceptsPlanInBounds(t *testing.T) {
	st, b := plannerFixture(t)
	srv := llmtest.New(t)
	rec := &llm.BufferRecorder{}
	s := plannerStage(t, srv, rec, st, b)
	srv.Enqueue(llmtest.JSON(map[string]any{"reason": "Hard environment: more hints and iterations.",
		"adjust": map[string]any{"iterations": 32, "hint_ratio": 0.4, "kl_coef": 0}}))
	r := readyFor("t-plan-ok", "precondition_verification")
	res, err := s.HandleReady(context.Background(), r)
	if err != nil || !res.Planned {
		t.Fatalf("%+v %v", res, err)
	}
	row, err := st.TrainingJob(context.Background(), res.JobID)
	if err != nil || row == nil {
		t.Fatalf("job not stored: %v", err)
	}
	job, err := schemas.DecodeTrainingJob([]byte(row.Spec))
	if err != nil {
		t.Fatal(err)
	}
	if job.GRPO.Iterations != 32 || job.GRPO.HintRatio != 0.4 || job.GRPO.KLCoef != 0 || row.Iterations != 32 {
		t.Errorf("adjusted plan not applied: %+v", job.GRPO)
	}
	p := job.Planner
	if p.Source != schemas.PlanAgent || p.Agent != schemas.AgentAccepted || p.Reason != "Hard environment: more hints and iterations." ||
		p.Model != "planner-model" || strings.Join(p.Overrides, ",") != "/hint_ratio,/iterations,/kl_coef" || p.Error != "" {
		t.Errorf("planner record %+v", p)
	}
	var stored schemas.PlannerRecord
	if err := json.Unmarshal([]byte(row.Planner), &stored); err != nil || stored.Reason != p.Reason || stored.Agent != schemas.AgentAccepted {
		t.Errorf("training_jobs.planner %s (%v)", row.Planner, err)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	prompt := reqs[0].Chat.Prompt()
	for _, want := range []string{"capability: precondition_verification", "tools of the training environment: get_reservation_details",
		"mean reward: 0.45 (std 0.4), success rate: 0.38", "pass@k: pass@1=0.38", `"iterations": 20`, "iterations: integer in [1, 200]",
		"a simulated policy, not a model"} {
		if !strings.Contains(prompt, want) {
			t.Errorf("prompt lacks %q:\n%s", want, prompt)
		}
	}
	if strings.Contains(prompt, "base_model\"") {
		t.Errorf("the prompt offers the base model:\n%s", prompt)
	}
	if reqs[0].Chat.Schema() == nil {
		t.Error("no schema sent")
	}
	calls := rec.Drain()
	if len(calls) != 1 || calls[0].Purpose != adapter.PurposePlan || calls[0].Outcome != llm.OutcomeOK || calls[0].RolloutID != res.JobID {
		t.Errorf("audit rows %+v", calls)
	}
	// A redelivered ready event is a duplicate before any planning call.
	if res, err := s.HandleReady(context.Background(), r); err != nil || !res.Duplicate {
		t.Fatalf("redelivery: %+v %v", res, err)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("a redelivered ready event asked the planning agent again (%d requests)", n)
	}
}

// TestPlannerRejectsPlanOutOfBounds: a valid answer out of bounds is not
// retried; the configured plan stands and the rejection names the fields,
// with the agent's reason kept.
func TestPlannerRejectsPlanOutOfBounds(t *testing.T) {
	st, b := plannerFixture(t)
	srv := llmtest.New(t)
	s := plannerStage(t, srv, nil, st, b)
	def, err := fastPlan().Build(plan.Input{Ready: readyFor("t-plan-oob", "precondition_verification"), Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		adjust map[string]any
		fields string
	}{
		{"too many iterations and a hint ratio over 0.5", map[string]any{"iterations": 500, "hint_ratio": 0.9}, "iterations,hint_ratio"},
		{"zero group size (not 'unset')", map[string]any{"group_size": 0}, "group_size"},
		{"an unknown target module", map[string]any{"target_modules": []string{"q_proj", "lm_head"}}, "target_modules"},
	} {
		srv.Enqueue(llmtest.JSON(map[string]any{"reason": "Go big.", "adjust": tc.adjust}))
		job, err := s.Plan(context.Background(), readyFor("t-plan-oob", "precondition_verification"), 1)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		p := job.Planner
		if p.Agent != schemas.AgentRejected || strings.Join(p.RejectedFields, ",") != tc.fields || p.Reason != "Go big." || p.Source != schemas.PlanDefaults {
			t.Errorf("%s: planner record %+v", tc.name, p)
		}
		for _, f := range strings.Split(tc.fields, ",") {
			if !strings.Contains(p.Error, f+": ") {
				t.Errorf("%s: error %q does not name %s", tc.name, p.Error, f)
			}
		}
		if job.GRPO != def.GRPO || job.LoRA.Rank != def.LoRA.Rank || strings.Join(job.LoRA.TargetModules, ",") != strings.Join(def.LoRA.TargetModules, ",") {
			t.Errorf("%s: the configured plan did not stand: %+v", tc.name, job.GRPO)
		}
	}
	if n := len(srv.Requests()); n != 3 {
		t.Errorf("%d requests for 3 plans: an answer out of bounds must not be retried", n)
	}
}

// TestPlannerSchemaBreakRetriedThenFailed: answers that break the schema
// are retried; when every attempt fails the failure is recorded and the
// configured plan stands. A good answer after bad ones is accepted.
func TestPlannerSchemaBreakRetriedThenFailed(t *testing.T) {
	st, b := plannerFixture(t)
	srv := llmtest.New(t)
	rec := &llm.BufferRecorder{}
	s := plannerStage(t, srv, rec, st, b)
	r := readyFor("t-plan-bad", "precondition_verification")
	srv.Enqueue(llmtest.Malformed(),
		llmtest.JSON(map[string]any{"reason": "x", "adjust": map[string]any{"base_model": "gpt-9"}}),
		llmtest.JSON(map[string]any{"reason": "x", "adjust": map[string]any{"iterations": "thirty"}}))
	job, err := s.Plan(context.Background(), r, 1)
	if err != nil {
		t.Fatal(err)
	}
	p := job.Planner
	if p.Agent != schemas.AgentFailed || p.Source != schemas.PlanDefaults || !strings.Contains(p.Error, "gave up after 3 attempts (invalid_json, schema, schema)") ||
		p.Model != "planner-model" || len(p.Overrides) != 0 {
		t.Errorf("planner record %+v", p)
	}
	if job.GRPO.Iterations != 20 {
		t.Errorf("plan changed: %+v", job.GRPO)
	}
	var outcomes []string
	for _, c := range rec.Drain() {
		outcomes = append(outcomes, c.Outcome)
	}
	if strings.Join(outcomes, ",") != "invalid_json,schema,schema" {
		t.Errorf("audit outcomes %v", outcomes)
	}
	// A broken answer, then a valid one: retried and accepted.
	srv.Enqueue(llmtest.Text(`{"reason": "fine", "adjust": {}, "extra": 1}`), llmtest.JSON(map[string]any{"reason": "The defaults fit.", "adjust": map[string]any{}}))
	job, err = s.Plan(context.Background(), r, 1)
	if err != nil || job.Planner.Agent != schemas.AgentUnchanged || job.Planner.Reason != "The defaults fit." || job.Planner.Source != schemas.PlanDefaults {
		t.Errorf("%+v %v", job.Planner, err)
	}
	// The planner's own parse, as a table.
	for _, c := range []struct {
		in      string
		invalid bool
	}{
		{`{"reason": "r", "adjust": {}}`, false},
		{`{"reason": "", "adjust": {}}`, true},
		{`{"reason": "...", "adjust": {}}`, true},
		{`{"reason": "r"}`, true},
		{`{"reason": "r", "adjust": {"lora_rank": 8, "lora_rank": 16}}`, true},
		{`{"reason": "r", "adjust": {"lora_rank": 8.5}}`, true},
		{`[1]`, true},
	} {
		_, err := adapter.ParsePlanAnswer(c.in)
		if (err != nil) != c.invalid || (err != nil && !errors.Is(err, llm.ErrSchema) && !errors.Is(err, llm.ErrInvalidJSON)) {
			t.Errorf("ParsePlanAnswer(%s) = %v", c.in, err)
		}
	}
}

// TestPlannerRealModel runs the planning agent against the real local
// model (scripts/llm-server.sh: Gemma 3 270M, a base model, constrained to
// the answer's schema). Its advice is not meant to be good; what is tested
// is the protocol: the stage always ends with a plan, the agent's outcome
// is one of accepted, unchanged, rejected or failed and agrees with the
// plan (only an accepted adjustment changes it, and it stays in bounds),
// and every HTTP attempt has an audit row with tokens.
func TestPlannerRealModel(t *testing.T) {
	url, model := llmtest.RealServer(t)
	rec := &llm.BufferRecorder{}
	client, err := llm.New(llm.Config{BaseURL: url, Model: model, Recorder: rec, Timeout: 5 * time.Minute, MaxAttempts: 2,
		StructuredOutput: llm.StructuredJSONObjectSchema})
	if err != nil {
		t.Fatal(err)
	}
	p, err := adapter.NewLLMPlanner(client, adapter.LLMPlannerConfig{MaxTokens: 96})
	if err != nil {
		t.Fatal(err)
	}
	st, b := plannerFixture(t)
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, Planner: p})
	if err != nil {
		t.Fatal(err)
	}
	r := readyFor("t-plan-real", "precondition_verification")
	def, _ := fastPlan().Build(plan.Input{Ready: r, Now: time.Now()})
	start := time.Now()
	job, err := s.Plan(context.Background(), r, 1)
	if err != nil {
		t.Fatalf("planning failed instead of recording the agent's outcome: %v", err)
	}
	pr := job.Planner
	t.Logf("agent %s in %v: reason %q, error %q, overrides %v", pr.Agent, time.Since(start).Round(time.Second), pr.Reason, pr.Error, pr.Overrides)
	switch pr.Agent {
	case schemas.AgentAccepted:
		if pr.Source != schemas.PlanAgent || len(pr.Overrides) == 0 || pr.Reason == "" {
			t.Errorf("accepted: %+v", pr)
		}
		if err := adapter.SettingsOf(job).Validate(""); err != nil {
			t.Errorf("an accepted plan out of bounds: %v", err)
		}
	case schemas.AgentUnchanged, schemas.AgentRejected, schemas.AgentFailed:
		if job.GRPO != def.GRPO || pr.Source != schemas.PlanDefaults {
			t.Errorf("%s but the plan changed: %+v", pr.Agent, job.GRPO)
		}
		if pr.Agent != schemas.AgentUnchanged && pr.Error == "" {
			t.Errorf("%s without its error", pr.Agent)
		}
	default:
		t.Fatalf("agent outcome %q", pr.Agent)
	}
	if pr.Model != model {
		t.Errorf("model %q", pr.Model)
	}
	calls := rec.Drain()
	if len(calls) == 0 {
		t.Fatal("no audit rows")
	}
	for _, c := range calls {
		answered := c.Outcome == llm.OutcomeOK || c.Outcome == llm.OutcomeSchema || c.Outcome == llm.OutcomeInvalidJSON
		if c.Purpose != adapter.PurposePlan || c.RolloutID != job.JobID || (answered && c.PromptTokens == 0) {
			t.Errorf("audit row %+v", c)
		}
	}
}

// TestPlanAnswerSchemaIsGrammarFriendly: llama-cpp-python compiles the
// schema into a grammar, and a string length bound becomes one nested
// rule per character — maxLength 2000 made a grammar it failed to parse
// and the server died. The answer's lengths are checked by
// ParsePlanAnswer instead.
func TestPlanAnswerSchemaIsGrammarFriendly(t *testing.T) {
	for _, k := range []string{"minLength", "maxLength", "minItems", "maxItems", "pattern"} {
		if strings.Contains(string(adapter.PlanAnswerSchema), k) {
			t.Errorf("PlanAnswerSchema uses %s", k)
		}
	}
	if !json.Valid(adapter.PlanAnswerSchema) {
		t.Fatal("invalid JSON")
	}
}
