package sink_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/traceops/trace/sink"
)

// TestTrainingJobsEventsAdapters: job versions (newest wins, filters on the
// newest), overdue jobs (open and past their deadline only), event history
// (a redelivered event is one), adapters (newest version wins).
func TestTrainingJobsEventsAdapters(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	job := func(id, status string, v uint64, deadline time.Time) sink.TrainingJobRow {
		return sink.TrainingJobRow{JobID: id, EnvironmentID: "env-" + id, PlanRevision: 1, Environment: "sim-airline", AgentVersion: "1.4.0",
			Capability: "precondition_verification", BaseModel: "m", Backend: "nats", Status: status, AdapterName: "a-" + id, Iterations: 20,
			Planner: `{"source":"defaults"}`, Spec: `{"job_id":"` + id + `"}`, DispatchedAt: at, LastEventAt: at, DeadlineAt: deadline,
			CreatedAt: at.Add(time.Duration(len(id)) * time.Second), UpdatedAt: at, Version: v}
	}
	for _, r := range []sink.TrainingJobRow{
		job("j1", "DISPATCHED", 1, at.Add(time.Hour)), job("j1", "RUNNING", 2, at.Add(2*time.Hour)),
		job("j1", "SUCCEEDED", 3, at.Add(2*time.Hour)), job("j1", "RUNNING", 2, at.Add(2*time.Hour)), // an old version again
		job("j22", "RUNNING", 1, at.Add(time.Minute)),
		job("j333", "DISPATCHED", 1, at.Add(3*time.Hour)),
	} {
		if err := s.SaveTrainingJob(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	j, err := s.TrainingJob(ctx, "j1")
	if err != nil || j == nil || j.Status != "SUCCEEDED" || j.Spec != `{"job_id":"j1"}` || !j.DeadlineAt.Equal(at.Add(2*time.Hour)) {
		t.Fatalf("TrainingJob(j1) = %+v, %v", j, err)
	}
	if j, err := s.TrainingJob(ctx, "nope"); j != nil || err != nil {
		t.Fatalf("missing job: %+v %v", j, err)
	}
	running, err := s.TrainingJobs(ctx, sink.TrainingJobFilter{Status: "RUNNING"})
	if err != nil || len(running) != 1 || running[0].JobID != "j22" {
		t.Fatalf("RUNNING: %+v %v", running, err)
	}
	all, _ := s.TrainingJobs(ctx, sink.TrainingJobFilter{})
	if len(all) != 3 || all[0].JobID != "j333" {
		t.Fatalf("all jobs newest first: %+v", all)
	}
	over, err := s.OverdueTrainingJobs(ctx, at.Add(2*time.Hour+time.Minute))
	if err != nil || len(over) != 1 || over[0].JobID != "j22" {
		t.Fatalf("overdue (j1 is done, j333 not yet due): %+v %v", over, err)
	}

	ev := func(key, typ string, it int32, r float64) sink.TrainingEventRow {
		return sink.TrainingEventRow{JobID: "j1", Key: key, Type: typ, At: at.Add(time.Duration(it+1) * time.Minute), Iteration: it, MeanReward: r, RewardStd: 0.1, Payload: "{}"}
	}
	if err := s.InsertTrainingEvents(ctx, []sink.TrainingEventRow{ev("s0", "started", -1, 0), ev("s1", "progress", 1, 0.4), ev("s2", "progress", 2, 0.5)}); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertTrainingEvents(ctx, []sink.TrainingEventRow{ev("s2", "progress", 2, 0.5)}); err != nil { // redelivered
		t.Fatal(err)
	}
	evs, err := s.TrainingEvents(ctx, "j1")
	if err != nil || len(evs) != 3 || evs[0].Type != "started" || evs[2].MeanReward != 0.5 || evs[2].Iteration != 2 {
		t.Fatalf("events: %+v %v", evs, err)
	}

	ad := func(name, status string, v uint64) sink.AdapterRow {
		return sink.AdapterRow{Name: name, JobID: "j1", EnvironmentID: "env-j1", Capability: "precondition_verification", Environment: "sim-airline",
			AgentVersion: "1.4.0", BaseModel: "m", URI: "file:///a/" + name, Eval: `{"mean_reward":0.7}`, EvalMeanReward: 0.7, Status: status,
			Simulated: true, Metadata: `{"trainer":"simulated"}`, CreatedAt: at, UpdatedAt: at, Version: v}
	}
	for _, r := range []sink.AdapterRow{ad("a1", "candidate", 1), ad("a1", "active", 2), ad("a2", "candidate", 1)} {
		if err := s.SaveAdapter(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	a, err := s.Adapter(ctx, "a1")
	if err != nil || a == nil || a.Status != "active" || !a.Simulated || a.EvalMeanReward != 0.7 {
		t.Fatalf("adapter a1: %+v %v", a, err)
	}
	cands, _ := s.Adapters(ctx, sink.AdapterFilter{Status: "candidate"})
	if len(cands) != 1 || cands[0].Name != "a2" {
		t.Fatalf("candidates: %+v", cands)
	}
	// The Training page's bounds: the adapters but the active ones, at
	// most Limit; those of some jobs; the counts of all by status.
	other := ad("a3", "retired", 1)
	other.JobID, other.CreatedAt = "j22", at.Add(time.Minute)
	if err := s.SaveAdapter(ctx, other); err != nil {
		t.Fatal(err)
	}
	if rs, err := s.Adapters(ctx, sink.AdapterFilter{NotStatus: "active", Limit: 1}); err != nil || len(rs) != 1 || rs[0].Name != "a3" {
		t.Fatalf("newest adapter not active: %+v %v", rs, err)
	}
	if rs, err := s.Adapters(ctx, sink.AdapterFilter{JobIDs: []string{"j22", "j-none"}}); err != nil || len(rs) != 1 || rs[0].Name != "a3" {
		t.Fatalf("adapters of j22: %+v %v", rs, err)
	}
	if rs, err := s.Adapters(ctx, sink.AdapterFilter{JobIDs: []string{"j1"}, NotStatus: "active"}); err != nil || len(rs) != 1 || rs[0].Name != "a2" {
		t.Fatalf("adapters of j1 not active: %+v %v", rs, err)
	}
	if n, err := s.AdapterStatusCounts(ctx, sink.AdapterFilter{Limit: 1}); err != nil || !maps.Equal(n, map[string]int{"active": 1, "candidate": 1, "retired": 1}) {
		t.Fatalf("adapter counts: %v %v", n, err)
	}

	// Reward curves: progress events only, in iteration order, one point
	// per iteration (a re-reported iteration keeps the later report), of
	// the newest jobs only.
	j22 := func(key string, it int32, r float64, at time.Time) sink.TrainingEventRow {
		return sink.TrainingEventRow{JobID: "j22", Key: key, Type: "progress", At: at, Iteration: it, MeanReward: r, RewardStd: 0.2, KL: 0.01, HasKL: true, Payload: "{}"}
	}
	if err := s.InsertTrainingEvents(ctx, []sink.TrainingEventRow{j22("s2", 2, 0.6, at.Add(2*time.Minute)), j22("s1", 1, 0.3, at.Add(time.Minute)),
		j22("s3", 2, 0.65, at.Add(3*time.Minute)), {JobID: "j22", Key: "s9", Type: "succeeded", At: at.Add(4 * time.Minute), Iteration: 2, MeanReward: 0.9, Payload: "{}"}}); err != nil {
		t.Fatal(err)
	}
	curves, err := s.TrainingCurves(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if c := curves["j1"]; len(c) != 2 || c[0].Iteration != 1 || c[0].MeanReward != 0.4 || c[1].Iteration != 2 || c[1].MeanReward != 0.5 || c[1].HasKL {
		t.Fatalf("curve j1: %+v", c)
	}
	if c := curves["j22"]; len(c) != 2 || c[0].MeanReward != 0.3 || c[1].MeanReward != 0.65 || !c[1].HasKL || c[1].KL != 0.01 || c[1].RewardStd != 0.2 {
		t.Fatalf("curve j22: %+v", c)
	}
	if len(curves) != 2 {
		t.Fatalf("curves of %d jobs: %v", len(curves), curves)
	}
	// The newest job is j333 (no events), then j22: a limit of 2 leaves j1 out.
	if curves, err := s.TrainingCurves(ctx, 2); err != nil || len(curves) != 1 || curves["j22"] == nil {
		t.Fatalf("limit 2: %v %v", curves, err)
	}
}

// TestPickJobAdapters: a job's adapter is the one registered to it under
// its planned name, else the newest one registered to it under another
// name (the demo's simulated trainer registers sim-<planned name>); an
// adapter of another job is never a job's.
func TestPickJobAdapters(t *testing.T) {
	jobs := []sink.TrainingJobRow{{JobID: "j1", AdapterName: "cap-1"}, {JobID: "j2", AdapterName: "cap-2"}, {JobID: "j3", AdapterName: "cap-3"}, {JobID: "j4", AdapterName: "cap-4"}}
	ads := []sink.AdapterRow{ // newest first
		{Name: "sim-cap-1", JobID: "j1"},
		{Name: "cap-2-retry", JobID: "j2"},
		{Name: "cap-2", JobID: "j2"},
		{Name: "cap-3", JobID: "other"},
		{Name: "cap-4-new", JobID: "j4"},
		{Name: "cap-4-old", JobID: "j4"},
	}
	got := map[string]string{}
	for id, a := range sink.PickJobAdapters(jobs, ads) {
		got[id] = a.Name
	}
	want := map[string]string{"j1": "sim-cap-1", "j2": "cap-2", "j4": "cap-4-new"}
	if !maps.Equal(got, want) {
		t.Errorf("PickJobAdapters = %v, want %v", got, want)
	}
}
