package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer"
)

func TestEnvCalibrateSimulated(t *testing.T) {
	out, err := runCLI(t, context.Background(), "env", "calibrate", "example:precondition_airline", "--in-process",
		"--policy", "simulated:sim-airline/1.4.0/precondition_verification", "--seeds", "40", "--rollouts", "8")
	t.Log(out)
	for _, want := range []string{"calibration [SIMULATED: played by a simulated policy, not a model]", "40 seeds × 8 rollouts", "pass@1 ", "@8 ", "reward histogram:", "[0.9, 1.0]"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	var ee *exitError
	if err != nil && (!errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), "not accepted")) {
		t.Fatalf("err %v", err)
	}
	if (err == nil) != strings.Contains(out, "ACCEPTED") {
		t.Fatalf("exit status disagrees with the verdict: %v", err)
	}
}

// TestEnvCalibrateModel: a policy model that always answers without a tool
// call does nothing, so the environment is too hard for it: exit status 1.
func TestEnvCalibrateModel(t *testing.T) {
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text("I cannot help with that.") })
	out, err := runCLI(t, context.Background(), "env", "calibrate", "example:precondition_airline", "--in-process",
		"--policy", srv.URL, "--model", "policy-model", "--seeds", "3", "--rollouts", "2", "--json")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), "too_hard") {
		t.Fatalf("err %v\n%s", err, out)
	}
	var c synthesizer.Calibration
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if c.Simulated || c.Accepted || c.Seeds != 3 || c.RolloutsPerSeed != 2 || c.SuccessRate != 0 || !strings.Contains(c.Policy, "policy-model") {
		t.Fatalf("%+v", c)
	}
	if n := len(srv.Requests()); n != 6 {
		t.Fatalf("%d policy calls, want one per rollout (6)", n)
	}
	if _, err := runCLI(t, context.Background(), "env", "calibrate", "example:precondition_airline", "--policy", srv.URL); err == nil || !strings.Contains(err.Error(), "--model is required") {
		t.Fatalf("without --model: %v", err)
	}
}

func TestEnvListAndShow(t *testing.T) {
	ch := testenv.ClickHouse(t)
	st := synthesizer.SinkStore{Rows: ch.Store()}
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	done := &synthesizer.Environment{ID: schemas.EnvironmentID("t1"), TriggerID: "t1", Environment: "sim-airline", AgentVersion: "1.4.0",
		DictionaryVersion: 1, Capability: "precondition_verification", Family: "precondition_verification", Status: synthesizer.StatusDone,
		Path: synthesizer.PathTemplate, Attempt: 2, Program: "def reset(seed):\n    pass\n", ProgramHash: "ab", Tools: []string{"get_reservation_details", "cancel_reservation"},
		Attempts: []synthesizer.Attempt{
			{N: 1, Origin: "template", Stage: synthesizer.StageCalibrate, Diagnosis: "calibration: too_easy: success rate 0.9 above 0.6", StartedAt: at, EndedAt: at.Add(time.Second)},
			{N: 2, Origin: "template", Stage: synthesizer.StageCalibrate, Accepted: true, StartedAt: at, EndedAt: at.Add(time.Second)}},
		Calibration: &synthesizer.Calibration{Accepted: true, Verdict: "accepted", Policy: "simulated sim-airline/1.4.0", Simulated: true, Seeds: 100, RolloutsPerSeed: 16,
			MeanReward: 0.44, SuccessRate: 0.31, PassAtK: map[string]float64{"1": 0.31, "16": 0.97}, Histogram: []int{800, 0, 0, 0, 0, 300, 0, 0, 0, 500}},
		CreatedAt: at, UpdatedAt: at, Version: 2}
	failed := &synthesizer.Environment{ID: schemas.EnvironmentID("t2"), TriggerID: "t2", Environment: "sim-retail", AgentVersion: "1.5.0", DictionaryVersion: 1,
		Capability: "argument_grounding", Status: synthesizer.StatusFailed, Reason: "5 attempts, none accepted; last: validation: reward_range", Attempt: 5,
		CreatedAt: at.Add(time.Minute), UpdatedAt: at.Add(time.Minute), Version: 9}
	for _, e := range []*synthesizer.Environment{done, failed} {
		if err := st.SaveEnvironment(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	sets := []string{"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database}
	out, err := runCLI(t, ctx, append([]string{"env", "list"}, sets...)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{done.ID, "DONE", "0.440", "@1 0.31 @16 0.97 SIMULATED", "get_reservation_details,cancel_reservation",
		failed.ID + " FAILED: 5 attempts, none accepted"} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, failed.ID) > strings.Index(out, done.ID) {
		t.Errorf("not newest first:\n%s", out)
	}
	out, err = runCLI(t, ctx, append([]string{"env", "list", "--status", "FAILED", "--format", "json"}, sets...)...)
	var rows []map[string]any
	if err != nil || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 1 || rows[0]["id"] != failed.ID {
		t.Fatalf("%v %s", err, out)
	}
	if _, err := runCLI(t, ctx, append([]string{"env", "list", "--status", "SOMETIMES"}, sets...)...); err == nil || !strings.Contains(err.Error(), "--status must be one of") {
		t.Fatalf("bad status: %v", err)
	}
	out, err = runCLI(t, ctx, append([]string{"env", "show", done.ID}, sets...)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"environment " + done.ID + ": DONE", "1. failed at calibrate — template", "calibration: too_easy: success rate 0.9",
		"2. ACCEPTED", "[SIMULATED", "[0.0, 0.1)   800 ", "program:\ndef reset(seed):"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	var ee *exitError
	if _, err := runCLI(t, ctx, append([]string{"env", "show", "env-0000000000000000"}, sets...)...); !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("missing id: %v", err)
	}
}

// TestEnvListAndShowCalibrationProgress: an environment being calibrated
// shows how far its calibration got (its record's progress), in the list,
// in show and in their JSON; a finished one does not.
func TestEnvListAndShowCalibrationProgress(t *testing.T) {
	ch := testenv.ClickHouse(t)
	st := synthesizer.SinkStore{Rows: ch.Store()}
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	e := &synthesizer.Environment{ID: schemas.EnvironmentID("t-cal"), TriggerID: "t-cal", Environment: "sim-airline", AgentVersion: "1.4.0",
		DictionaryVersion: 1, Capability: "precondition_verification", Status: synthesizer.StatusCalibrating, Path: synthesizer.PathLLM, Attempt: 2,
		Progress:  &synthesizer.CalibrationProgress{Path: synthesizer.PathLLM, Attempt: 2, Done: 400, Total: 1600, StartedAt: at, At: at.Add(time.Hour)},
		CreatedAt: at, UpdatedAt: at.Add(time.Hour), Version: 3}
	if err := st.SaveEnvironment(ctx, e); err != nil {
		t.Fatal(err)
	}
	sets := []string{"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database}
	out, err := runCLI(t, ctx, append([]string{"env", "list"}, sets...)...)
	if err != nil || !strings.Contains(out, "CALIBRATING 400/1600 (25 %)") {
		t.Fatalf("list: %v\n%s", err, out)
	}
	out, err = runCLI(t, ctx, append([]string{"env", "list", "--format", "json"}, sets...)...)
	var rows []struct {
		Status   string                           `json:"status"`
		Progress *synthesizer.CalibrationProgress `json:"calibration_progress"`
	}
	if err != nil || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 1 || rows[0].Status != "CALIBRATING" ||
		rows[0].Progress == nil || rows[0].Progress.Done != 400 || rows[0].Progress.Total != 1600 {
		t.Fatalf("list json: %v\n%s", err, out)
	}
	out, err = runCLI(t, ctx, append([]string{"env", "show", e.ID}, sets...)...)
	if err != nil || !strings.Contains(out, "environment "+e.ID+": CALIBRATING 400/1600 (25 %)") ||
		!strings.Contains(out, "calibrating attempt 2: 400 of 1600 rollouts played (25 %) at 2026-12-01T11:00:00Z, started 2026-12-01T10:00:00Z") {
		t.Fatalf("show: %v\n%s", err, out)
	}
	out, err = runCLI(t, ctx, append([]string{"env", "show", e.ID, "--json"}, sets...)...)
	var one synthesizer.Environment
	if err != nil || json.Unmarshal([]byte(out), &one) != nil || one.Progress == nil || *one.Progress != *e.Progress {
		t.Fatalf("show json: %v\n%s", err, out)
	}
	// Calibrated and on to the next attempt: no progress shown.
	e.Status, e.Attempt, e.Version = synthesizer.StatusGenerating, 3, 4
	if err := st.SaveEnvironment(ctx, e); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, ctx, append([]string{"env", "list"}, sets...)...)
	if err != nil || strings.Contains(out, "400/1600") || !strings.Contains(out, "GENERATING") {
		t.Fatalf("list after: %v\n%s", err, out)
	}
}
