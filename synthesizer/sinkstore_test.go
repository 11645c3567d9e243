package synthesizer

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

func chStore(t *testing.T) SinkStore {
	return SinkStore{Rows: testenv.ClickHouse(t).Store()}
}

func sampleEnvironment() *Environment {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	req := testRequest("trig-roundtrip")
	cal := &Calibration{Accepted: true, Verdict: "accepted", Policy: "simulated sim-airline/1.4.0", Simulated: true, Seeds: 100, RolloutsPerSeed: 16,
		Temperature: 0.7, MeanReward: 0.45, StdReward: 0.41, SuccessRate: 0.38, AllSuccessGroups: 0.1, AllZeroGroups: 0.12, ConstantGroups: 0.22,
		InformativeGroups: 0.78, PassAtK: map[string]float64{"1": 0.38, "4": 0.8, "8": 0.9, "16": 0.95}, Histogram: []int{300, 0, 0, 0, 0, 200, 0, 0, 0, 1100}}
	return &Environment{ID: schemas.EnvironmentID(req.TriggerID), TriggerID: req.TriggerID, Environment: req.Environment, AgentVersion: req.AgentVersion,
		DictionaryVersion: 1, Capability: req.Capability.Skill, Definition: "Look first.", Rank: 2, MeanDelta: 0.41, Family: "precondition_verification",
		FamilySource: FamilyMatched, FamilyWhy: "named after it", Request: req, Status: StatusDone, Path: PathTemplate, Attempt: 2,
		Diagnoses: []string{"attempt 1: calibration: too_easy"}, Program: goodProgram, ProgramHash: ProgramHash(goodProgram),
		Tools: []string{"get_reservation_details", "cancel_reservation"}, Rationale: "Why.",
		Attempts: []Attempt{
			{N: 1, Origin: schemas.OriginTemplate, Family: "precondition_verification", Knobs: json.RawMessage(`{"records":3}`), Program: goodProgram,
				ProgramHash: ProgramHash(goodProgram), Stage: StageCalibrate, Diagnosis: "calibration: too_easy",
				Validation: &Validation{OK: true, Checks: []Check{{Name: "load", Verdict: Pass}}}, Calibration: &Calibration{Verdict: "too_easy"}, StartedAt: at, EndedAt: at},
			{N: 2, Origin: schemas.OriginTemplate, Stage: StageCalibrate, Accepted: true, Calibration: cal, StartedAt: at, EndedAt: at,
				LLM: &LLMUsage{Calls: 1, PromptTokens: 10, CompletionTokens: 5}},
		},
		Calibration: cal, CreatedAt: at, UpdatedAt: at.Add(time.Minute), Version: 42}
}

// TestSinkStoreRoundTrip: a record saved to ClickHouse reads back equal;
// a list row carries what a list shows.
func TestSinkStoreRoundTrip(t *testing.T) {
	st := chStore(t)
	ctx := context.Background()
	e := sampleEnvironment()
	if err := st.SaveEnvironment(ctx, e); err != nil {
		t.Fatal(err)
	}
	got, err := st.LoadEnvironment(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, e) {
		a, _ := json.Marshal(got)
		b, _ := json.Marshal(e)
		t.Fatalf("read back\n%s\nwant\n%s", a, b)
	}
	list, err := st.List(ctx, sink.EnvironmentFilter{})
	if err != nil || len(list) != 1 {
		t.Fatalf("%v %v", list, err)
	}
	if l := list[0]; l.Program != "" || len(l.Attempts) != 0 || l.Calibration == nil || l.Calibration.PassAtK["16"] != 0.95 || !l.Calibration.Simulated ||
		l.Status != StatusDone || len(l.Tools) != 2 || l.Request == nil || l.Request.TriggerID != e.TriggerID {
		t.Fatalf("listed %+v", l)
	}
	if w, err := st.WaitingEnvironments(ctx); err != nil || len(w) != 0 {
		t.Fatalf("waiting %v %v", w, err)
	}
	if none, err := st.LoadEnvironment(ctx, "env-0000000000000000"); none != nil || err != nil {
		t.Fatalf("%v %v", none, err)
	}
}
