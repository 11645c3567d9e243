package sink_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/sink"
)

func envRow(id, status string, version uint64, at time.Time) sink.EnvironmentRow {
	return sink.EnvironmentRow{EnvironmentID: id, TriggerID: "t-" + id, Environment: "sim-airline", AgentVersion: "1.4.0", DictionaryVersion: 1,
		Capability: "precondition_verification", Family: "precondition_verification", Status: status, Attempts: uint8(version),
		Program: "def reset(seed):\n    pass\n", ProgramHash: "ab", Tools: `["get_reservation_details"]`, MeanReward: 0.4, SuccessRate: 0.35,
		Simulated: true, PassAtK: `{"1":0.35}`, Request: `{"trigger_id":"t-` + id + `"}`, AttemptsJSON: `[{"n":1}]`, Calibration: `{"accepted":true}`,
		Details: `{"rank":1}`, CreatedAt: at, UpdatedAt: at.Add(time.Duration(version) * time.Second), Version: version}
}

// TestEnvironmentsNewestVersionWins: status updates are new versions of one
// row; a version saved twice (a redelivery) and an older version saved late
// change nothing; lists see only newest versions, and filters apply to them.
func TestEnvironmentsNewestVersionWins(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, r := range []sink.EnvironmentRow{
		envRow("env-a", "PENDING", 1, at), envRow("env-a", "GENERATING", 2, at), envRow("env-a", "DONE", 4, at),
		envRow("env-a", "DONE", 4, at),        // the same version again
		envRow("env-a", "CALIBRATING", 3, at), // an older version, late
		envRow("env-b", "GENERATING", 1, at.Add(time.Minute)),
		envRow("env-c", "FAILED", 7, at.Add(-time.Minute)),
	} {
		if err := s.SaveEnvironment(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Environment(ctx, "env-a")
	if err != nil {
		t.Fatal(err)
	}
	want := envRow("env-a", "DONE", 4, at)
	if got == nil || *got != want {
		t.Fatalf("Environment = %+v\nwant        %+v", got, want)
	}
	if missing, err := s.Environment(ctx, "env-zzz"); err != nil || missing != nil {
		t.Fatalf("missing environment: %+v %v", missing, err)
	}
	all, err := s.Environments(ctx, sink.EnvironmentFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || all[0].EnvironmentID != "env-b" || all[1].EnvironmentID != "env-a" || all[2].EnvironmentID != "env-c" {
		t.Fatalf("list %+v", all)
	}
	if a := all[1]; a.Status != "DONE" || a.Program != "" || a.AttemptsJSON != "" || a.Request == "" || !a.Simulated || a.PassAtK != `{"1":0.35}` {
		t.Fatalf("listed env-a %+v", a)
	}
	// An old version never matches a filter on what it was.
	for _, tt := range []struct {
		f    sink.EnvironmentFilter
		want int
	}{
		{sink.EnvironmentFilter{Status: "CALIBRATING"}, 0},
		{sink.EnvironmentFilter{Status: "GENERATING"}, 1},
		{sink.EnvironmentFilter{Status: "DONE", Full: true}, 1},
		{sink.EnvironmentFilter{Environment: "sim-airline", AgentVersion: "1.4.0"}, 3},
		{sink.EnvironmentFilter{Environment: "sim-retail"}, 0},
		{sink.EnvironmentFilter{Limit: 2}, 2},
	} {
		rs, err := s.Environments(ctx, tt.f)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != tt.want {
			t.Errorf("filter %+v: %d rows, want %d", tt.f, len(rs), tt.want)
		}
		if tt.f.Full && len(rs) == 1 && (rs[0].Program == "" || rs[0].AttemptsJSON == "") {
			t.Errorf("a full list lacks the program: %+v", rs[0])
		}
	}
}

// TestRolloutsByID: the example rollouts of a synthesis request, in the
// request's order, one each although stored twice, unknown ids left out.
func TestRolloutsByID(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	var rows []sink.RolloutRow
	for i := 0; i < 10; i++ {
		rows = append(rows, sink.RolloutRowFrom(rollout(fmt.Sprint("r", i), i%3 == 0), sink.Coord{Topic: "t", Offset: int64(i)}))
	}
	for range 2 {
		if err := s.InsertRollouts(ctx, rows); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.RolloutsByID(ctx, "env", "v1", []string{"r7", "nope", "r3", "r'; DROP TABLE rollouts; --"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].RolloutID != "r7" || got[1].RolloutID != "r3" || got[0].Succeeded() || !got[1].Succeeded() {
		t.Fatalf("%+v", got)
	}
	if r := got[0]; len(r.Messages) != 3 || r.Messages[0].Content != strings.Repeat("é", 299)+"…" || r.Messages[1].ToolCalls[0].Name != "f" || r.Environment != "env" {
		t.Fatalf("rebuilt %+v", r)
	}
	if none, err := s.RolloutsByID(ctx, "env", "v2", []string{"r7"}); err != nil || len(none) != 0 {
		t.Fatalf("another cohort's rollout: %v %v", none, err)
	}
}
