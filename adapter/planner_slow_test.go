package adapter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/schemas"
)

// TestSlowPlannerLeavesTheConfiguredPlan: a planning agent slower than the
// handling of a ready environment (the adapt role's bound is a minute; a
// model that takes longer, or a timeout and a retry, use it up) gets half
// of what is left of it; past that the configured plan stands, recorded
// as the agent's failure, and the job is made. The agent had the whole
// bound: the handling ran out with it, the ready message was retried, ran
// out again, and no job was ever made for the environment.
func TestSlowPlannerLeavesTheConfiguredPlan(t *testing.T) {
	st, b := plannerFixture(t)
	srv := llmtest.New(t)
	s := plannerStage(t, srv, &llm.BufferRecorder{}, st, b)
	r := readyFor("t-plan-slow", "precondition_verification")
	for range 3 {
		srv.Enqueue(llmtest.Slow(30*time.Second, llmtest.JSON(map[string]any{"reason": "late", "adjust": map[string]any{}})))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	res, err := s.HandleReady(ctx, r)
	if err != nil {
		t.Fatalf("a ready environment whose planner is slow: %v (retried, it never gets a job)", err)
	}
	if !res.Planned {
		t.Fatalf("%+v", res)
	}
	j, err := st.TrainingJob(context.Background(), res.JobID)
	if err != nil || j == nil {
		t.Fatal(j, err)
	}
	job, err := schemas.DecodeTrainingJob([]byte(j.Spec))
	if err != nil {
		t.Fatal(err)
	}
	if job.Planner.Agent != schemas.AgentFailed || job.Planner.Source != schemas.PlanDefaults || !strings.Contains(job.Planner.Error, "deadline") {
		t.Errorf("planner record %+v; want failed (deadline), the configured plan", job.Planner)
	}
}
