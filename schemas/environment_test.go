package schemas

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func sampleReady() *EnvironmentReady {
	id := EnvironmentID("trig-1")
	hash := strings.Repeat("ab", 32)
	return &EnvironmentReady{
		Schema: EnvironmentReadySchema, EnvironmentID: id, TriggerID: "trig-1",
		Environment: "sim-airline", AgentVersion: "1.4.0", DictionaryVersion: 1,
		Capability: ReadyCapability{Name: "precondition_verification", Definition: "Look before you write.", Family: "precondition_verification", MeanDelta: 0.41, Rank: 2},
		Program:    ReadyProgram{Hash: hash, Origin: OriginTemplate, Family: "precondition_verification", Tools: []string{"get_reservation_details", "cancel_reservation"}, Attempts: 2},
		Calibration: ReadyCalib{Policy: "simulated:sim-airline/1.4.0", Simulated: true, Seeds: 100, RolloutsPerSeed: 16, Temperature: 0.7,
			MeanReward: 0.45, StdReward: 0.4, SuccessRate: 0.38, AllSuccessGroups: 0.1, AllZeroGroups: 0.12, ConstantGroups: 0.22, InformativeGroups: 0.78,
			PassAtK: map[string]float64{"1": 0.38, "4": 0.8, "8": 0.9, "16": 0.95}},
		Fetch:   ReadyFetch{Path: EnvironmentProgramPath(id), ClickHouse: ClickHouseRef{Table: "environments", EnvironmentID: id, ProgramHash: hash}},
		ReadyAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
	}
}

func TestEnvironmentReadyRoundTrip(t *testing.T) {
	in := sampleReady()
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeEnvironmentReady(data)
	if err != nil {
		t.Fatalf("valid message rejected: %v\n%s", err, data)
	}
	if out.EnvironmentID != in.EnvironmentID || out.Calibration.PassAtK["16"] != 0.95 || !out.Calibration.Simulated ||
		out.Program.Tools[1] != "cancel_reservation" || !out.ReadyAt.Equal(in.ReadyAt) || out.Fetch.Path != "/api/environments/"+in.EnvironmentID+"/program" {
		t.Fatalf("decoded %+v", out)
	}
}

func TestEnvironmentIDIsDerivedFromTheTrigger(t *testing.T) {
	a, b := EnvironmentID("sim-airline/1.4.0/v1/precondition_verification/e1"), EnvironmentID("sim-airline/1.4.0/v1/precondition_verification/e2")
	if a != EnvironmentID("sim-airline/1.4.0/v1/precondition_verification/e1") {
		t.Fatal("not deterministic")
	}
	if a == b || len(a) != 20 || !strings.HasPrefix(a, "env-") {
		t.Fatalf("ids %q %q", a, b)
	}
}

func TestDecodeEnvironmentReadyRejects(t *testing.T) {
	tests := []struct {
		name     string
		mod      func(m map[string]any)
		path     string
		contains string
	}{
		{"unknown top-level field", func(m map[string]any) { m["extra"] = 1 }, "/", "extra"},
		{"unknown nested field", func(m map[string]any) { m["calibration"].(map[string]any)["mood"] = "good" }, "/calibration", "mood"},
		{"missing calibration", func(m map[string]any) { delete(m, "calibration") }, "/", "calibration"},
		{"wrong schema tag", func(m map[string]any) { m["schema"] = "environment_ready/v2" }, "/schema", ""},
		{"bad id", func(m map[string]any) { m["environment_id"] = "x" }, "/environment_id", ""},
		{"bad hash", func(m map[string]any) { m["program"].(map[string]any)["hash"] = "abc" }, "/program/hash", ""},
		{"bad origin", func(m map[string]any) { m["program"].(map[string]any)["origin"] = "human" }, "/program/origin", ""},
		{"six attempts", func(m map[string]any) { m["program"].(map[string]any)["attempts"] = 6 }, "/program/attempts", ""},
		{"no tools", func(m map[string]any) { m["program"].(map[string]any)["tools"] = []any{} }, "/program/tools", ""},
		{"mean above 1", func(m map[string]any) { m["calibration"].(map[string]any)["mean_reward"] = 1.5 }, "/calibration/mean_reward", ""},
		{"bad pass@k key", func(m map[string]any) { m["calibration"].(map[string]any)["pass_at_k"] = map[string]any{"k": 0.5} }, "/", "'k' does not match"}, // the library reports propertyNames at the root
		{"relative path", func(m map[string]any) { m["fetch"].(map[string]any)["path"] = "environments/x" }, "/fetch/path", ""},
		{"reference to another environment", func(m map[string]any) {
			m["fetch"].(map[string]any)["clickhouse"].(map[string]any)["environment_id"] = "env-0000000000000000"
		}, "/fetch/clickhouse/environment_id", "not the message's"},
		{"reference to another program", func(m map[string]any) {
			m["fetch"].(map[string]any)["clickhouse"].(map[string]any)["program_hash"] = strings.Repeat("cd", 32)
		}, "/fetch/clickhouse/program_hash", "not the program's"},
		{"bad time", func(m map[string]any) { m["ready_at"] = "yesterday" }, "/ready_at", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, _ := json.Marshal(sampleReady())
			var m map[string]any
			if err := json.Unmarshal(data, &m); err != nil {
				t.Fatal(err)
			}
			tt.mod(m)
			data, _ = json.Marshal(m)
			_, err := DecodeEnvironmentReady(data)
			var se *Error
			if !errors.As(err, &se) {
				t.Fatalf("accepted or wrong error type: %v", err)
			}
			if se.Reason != ReasonSchema || se.Path != tt.path || !strings.Contains(se.Error(), tt.contains) {
				t.Fatalf("error %q (path %q), want path %q containing %q", se.Error(), se.Path, tt.path, tt.contains)
			}
		})
	}
	if _, err := DecodeEnvironmentReady([]byte(`{"schema":`)); err == nil {
		t.Fatal("broken JSON accepted")
	}
}
