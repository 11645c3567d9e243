package dashboard

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/sink"
)

// seedTraining stores a SUCCEEDED job of the simulated trainer with a
// five-point reward curve and its registered adapter, and a FAILED job
// with one progress point and its reason.
func seedTraining(t *testing.T, st *sink.Store) (ok, failed string) {
	t.Helper()
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	ok, failed = "job-00000000000000aa", "job-00000000000000bb"
	job := func(id, status, reason string, it uint32, r float64, sim bool, created time.Time) sink.TrainingJobRow {
		return sink.TrainingJobRow{JobID: id, EnvironmentID: "env-" + id[4:], PlanRevision: 1, Environment: "sim-airline", AgentVersion: "1.4.0",
			Capability: "precondition_verification", BaseModel: "Qwen/Qwen3-8B", Backend: "nats", Status: status, Reason: reason,
			AdapterName: "precondition-verification-" + id[12:], Iteration: it, Iterations: 5, MeanReward: r, Simulated: sim,
			Planner: `{"source":"defaults"}`, Spec: `{}`, DispatchedAt: created, LastEventAt: created, DeadlineAt: created.Add(time.Hour),
			CreatedAt: created, UpdatedAt: created.Add(time.Minute), Version: 2}
	}
	for _, r := range []sink.TrainingJobRow{job(ok, "SUCCEEDED", "", 5, 0.81, true, at), job(failed, "FAILED", "CUDA out of memory", 1, 0.2, false, at.Add(time.Hour))} {
		if err := st.SaveTrainingJob(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	var evs []sink.TrainingEventRow
	for i, r := range []float64{0.42, 0.55, 0.66, 0.74, 0.81} {
		evs = append(evs, sink.TrainingEventRow{JobID: ok, Key: "seq:" + string(rune('1'+i)), Type: "progress", At: at.Add(time.Duration(i) * time.Second),
			Iteration: int32(i + 1), MeanReward: r, RewardStd: 0.3, KL: 0.002 * float64(i+1), HasKL: true, Payload: "{}"})
	}
	evs = append(evs, sink.TrainingEventRow{JobID: ok, Key: "seq:9", Type: "succeeded", At: at.Add(time.Minute), Iteration: -1, Payload: "{}"},
		sink.TrainingEventRow{JobID: failed, Key: "seq:1", Type: "progress", At: at.Add(time.Hour), Iteration: 1, MeanReward: 0.2, RewardStd: 0.1, Payload: "{}"})
	if err := st.InsertTrainingEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	if err := st.SaveAdapter(ctx, sink.AdapterRow{Name: "sim-precondition-verification-00aa", JobID: ok, EnvironmentID: "env-" + ok[4:],
		Capability: "precondition_verification", Environment: "sim-airline", AgentVersion: "1.4.0", BaseModel: "Qwen/Qwen3-8B",
		URI: "sim://simtrainer/sim-precondition-verification-00aa", Eval: `{}`, EvalMeanReward: 0.81, EvalSuccessRate: 0.77, Status: "candidate",
		Simulated: true, Metadata: `{"trainer":"simulated (no model was trained)","simulated":true}`, CreatedAt: at.Add(time.Minute),
		UpdatedAt: at.Add(time.Minute), Version: 1}); err != nil {
		t.Fatal(err)
	}
	return ok, failed
}

func TestTrainingPageAndAPI(t *testing.T) {
	st := openStore(t)
	ok, failed := seedTraining(t, st)
	h := New(Deps{Training: st})

	var resp TrainingResponse
	getJSON(t, h, "/api/training", &resp)
	if len(resp.Jobs) != 2 || resp.Jobs[0].JobID != failed || resp.Jobs[1].JobID != ok || resp.Counts["SUCCEEDED"] != 1 || resp.Counts["FAILED"] != 1 {
		t.Fatalf("jobs %+v", resp)
	}
	j := resp.Jobs[1]
	if len(j.Curve) != 5 || j.Curve[0].MeanReward != 0.42 || j.Curve[4].Iteration != 5 || !j.Curve[4].HasKL || !j.Simulated || j.PlanSource != "defaults" {
		t.Fatalf("job %+v", j)
	}
	if f := resp.Jobs[0]; f.Reason != "CUDA out of memory" || len(f.Curve) != 1 {
		t.Fatalf("failed job %+v", f)
	}
	if len(resp.Adapters) != 1 || resp.Adapters[0].JobID != ok || !resp.Adapters[0].Simulated || !strings.Contains(resp.Adapters[0].Trainer, "simulated") {
		t.Fatalf("adapters %+v", resp.Adapters)
	}
	getJSON(t, h, "/api/training?limit=1", &resp)
	if len(resp.Jobs) != 1 || resp.Jobs[0].JobID != failed || len(resp.Adapters) != 1 {
		t.Fatalf("limit 1: %+v", resp)
	}

	code, body := getStatus(h, "/training")
	if code != http.StatusOK {
		t.Fatalf("/training: %d %s", code, body)
	}
	for _, want := range []string{`data-job="` + ok + `"`, `id="chart-curve-1"`, `data-points="5"`, "CUDA out of memory", "sim://simtrainer/",
		"SIMULATED trainer (no model trained)", `class="adapter-row" data-adapter="sim-precondition-verification-00aa" data-status="candidate"`,
		"iteration 5: mean reward 0.810 ± 0.300, KL 0.0100", "precondition-verification-000000bb (not registered)"} {
		if !strings.Contains(body, want) {
			t.Errorf("/training lacks %q", want)
		}
	}
	if code, _ := getStatus(h, "/api/training?limit=0"); code != http.StatusBadRequest {
		t.Errorf("limit=0: %d, want 400", code)
	}
	if code, _ := getStatus(New(Deps{}), "/api/training"); code != http.StatusServiceUnavailable {
		t.Errorf("no training store: %d, want 503", code)
	}
	empty := New(Deps{Training: openStore(t)})
	if code, body := getStatus(empty, "/training"); code != http.StatusOK || !strings.Contains(body, "No training jobs yet") || !strings.Contains(body, "No adapters registered yet") {
		t.Errorf("empty /training: %d %s", code, body)
	}
}

// TestTrainingCountsCoverEveryJob: with more jobs than the listing's limit
// (100), the counts by status are those of every job, each counted once in
// its newest version (a job that went from RUNNING to SUCCEEDED is not
// also RUNNING), and the page says that the listing is cut ("showing 100
// of 107").
func TestTrainingCountsCoverEveryJob(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	save := func(i int, status string, version uint64) {
		t.Helper()
		created := at.Add(time.Duration(i) * time.Second)
		if err := st.SaveTrainingJob(ctx, sink.TrainingJobRow{JobID: fmt.Sprintf("job-many-%03d", i), EnvironmentID: "env-many", PlanRevision: 1,
			Environment: "sim-airline", AgentVersion: "1.4.0", Capability: "precondition_verification", BaseModel: "m", Backend: "nats",
			Status: status, Iterations: 5, Planner: `{}`, Spec: `{}`, DispatchedAt: created, LastEventAt: created, DeadlineAt: created.Add(time.Hour),
			CreatedAt: created, UpdatedAt: created, Version: version}); err != nil {
			t.Fatal(err)
		}
	}
	// 80 SUCCEEDED (the first 20 were RUNNING before), 20 FAILED, 7 RUNNING.
	for i := range 107 {
		status := "SUCCEEDED"
		switch {
		case i >= 100:
			status = "RUNNING"
		case i >= 80:
			status = "FAILED"
		}
		if i < 20 {
			save(i, "RUNNING", 1)
		}
		save(i, status, 2)
	}
	h := New(Deps{Training: st})
	want := map[string]int{"SUCCEEDED": 80, "FAILED": 20, "RUNNING": 7}
	for _, tt := range []struct {
		query string
		shown int
	}{{"", 100}, {"?limit=5", 5}, {"?limit=500", 107}} {
		var resp TrainingResponse
		getJSON(t, h, "/api/training"+tt.query, &resp)
		if len(resp.Jobs) != tt.shown || !maps.Equal(resp.Counts, want) || resp.Total != 107 {
			t.Errorf("%s: %d listed, counts %v, total %d; want %d listed, counts %v, total 107", tt.query, len(resp.Jobs), resp.Counts, resp.Total, tt.shown, want)
		}
		_, body := getStatus(h, "/training"+tt.query)
		for k, n := range want {
			if s := fmt.Sprintf(`<span class="key status-%s">%s %d</span>`, k, k, n); !strings.Contains(body, s) {
				t.Errorf("/training%s lacks %s", tt.query, s)
			}
		}
		note := fmt.Sprintf("showing %d of 107", tt.shown)
		if got := strings.Contains(body, note); got != (tt.shown < 107) {
			t.Errorf("/training%s: %q shown: %v", tt.query, note, got)
		}
	}
}

// TestTrainingUnreadableJSON: a job whose planner does not decode, or an
// adapter whose metadata does not (written by another version, or
// damaged), is listed with a marker naming the field that could not be
// read, in the page and in /api/training, and logged once as a warning
// naming it; the other rows are as always and the page is not a 500.
func TestTrainingUnreadableJSON(t *testing.T) {
	st := openStore(t)
	ok, failed := seedTraining(t, st)
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	bad := "job-00000000000000cc"
	if err := st.SaveTrainingJob(ctx, sink.TrainingJobRow{JobID: bad, EnvironmentID: "env-cc", PlanRevision: 1, Environment: "sim-airline",
		AgentVersion: "1.4.0", Capability: "precondition_verification", BaseModel: "m", Backend: "nats", Status: "SUCCEEDED",
		AdapterName: "adapter-cc", Iterations: 5, Planner: `{"source":`, Spec: `{}`, DispatchedAt: at, LastEventAt: at,
		DeadlineAt: at.Add(time.Hour), CreatedAt: at, UpdatedAt: at, Version: 3}); err != nil {
		t.Fatal(err)
	}
	if err := st.SaveAdapter(ctx, sink.AdapterRow{Name: "adapter-cc", JobID: bad, EnvironmentID: "env-cc", Capability: "precondition_verification",
		Environment: "sim-airline", AgentVersion: "1.4.0", BaseModel: "m", URI: "file:///a/adapter-cc", Eval: `{}`, Status: "candidate",
		Metadata: `not json`, CreatedAt: at, UpdatedAt: at, Version: 1}); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	h := New(Deps{Training: st, Log: slog.New(slog.NewTextHandler(&logs, nil))})

	var resp TrainingResponse
	getJSON(t, h, "/api/training", &resp)
	byID := map[string]TrainingJob{}
	for _, j := range resp.Jobs {
		byID[j.JobID] = j
	}
	if j := byID[bad]; len(j.Unreadable) != 1 || j.Unreadable["planner"] == "" || j.PlanSource != "" {
		t.Errorf("job with a bad planner: %+v", j)
	}
	for _, id := range []string{ok, failed} {
		if j := byID[id]; len(j.Unreadable) != 0 || j.PlanSource != "defaults" {
			t.Errorf("job %s: %+v", id, j)
		}
	}
	for _, a := range resp.Adapters {
		if want := a.Name == "adapter-cc"; (a.Unreadable["metadata"] != "") != want || (len(a.Unreadable) == 0) == want {
			t.Errorf("adapter %s: unreadable %v", a.Name, a.Unreadable)
		}
	}
	code, body := getStatus(h, "/training")
	if code != http.StatusOK {
		t.Fatalf("/training: %d %s", code, body)
	}
	for _, want := range []string{`class="unreadable" data-field="planner" data-job="` + bad + `"`, "planner unreadable",
		`class="unreadable" data-field="metadata" data-adapter="adapter-cc"`, "metadata unreadable", "plan defaults"} {
		if !strings.Contains(body, want) {
			t.Errorf("/training lacks %q", want)
		}
	}
	// Two requests above: one warning per row.
	if n := strings.Count(logs.String(), "job_id="+bad); n != 1 {
		t.Errorf("%d warnings naming %s, want 1:\n%s", n, bad, logs.String())
	}
	if n := strings.Count(logs.String(), "adapter=adapter-cc"); n != 1 {
		t.Errorf("%d warnings naming adapter-cc, want 1:\n%s", n, logs.String())
	}
}

// TestTrainingAdaptersAreBounded: with thousands of adapters, the
// Training page lists every active adapter and the newest others (100,
// ?adapters= up to 1000), counts all of them by status and says the list
// is cut ("showing 102 of 1202"); a listed job's adapter is shown with its
// status though it is not among the adapters listed.
func TestTrainingAdaptersAreBounded(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	save := func(name, job, status string, created time.Time) {
		t.Helper()
		if err := st.SaveAdapter(ctx, sink.AdapterRow{Name: name, JobID: job, EnvironmentID: "env-" + job, Capability: "precondition_verification",
			Environment: "sim-airline", AgentVersion: "1.4.0", BaseModel: "m", URI: "file:///a/" + name, Eval: `{}`, Status: status,
			Metadata: `{}`, CreatedAt: created, UpdatedAt: created, Version: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// The two active adapters and the listed job's are the oldest.
	save("active-1", "job-a1", "active", at)
	save("active-2", "job-a2", "active", at.Add(time.Second))
	save("old-of-listed-job", "job-listed", "rolled_back", at.Add(2*time.Second))
	if err := st.SaveTrainingJob(ctx, sink.TrainingJobRow{JobID: "job-listed", EnvironmentID: "env-job-listed", PlanRevision: 1,
		Environment: "sim-airline", AgentVersion: "1.4.0", Capability: "precondition_verification", BaseModel: "m", Backend: "nats",
		Status: "SUCCEEDED", AdapterName: "old-of-listed-job", Iterations: 5, Planner: `{}`, Spec: `{}`, DispatchedAt: at, LastEventAt: at,
		DeadlineAt: at.Add(time.Hour), CreatedAt: at, UpdatedAt: at, Version: 2}); err != nil {
		t.Fatal(err)
	}
	for i := range 1199 {
		status := "candidate"
		if i%2 == 0 {
			status = "retired"
		}
		save(fmt.Sprintf("other-%04d", i), fmt.Sprintf("job-other-%04d", i), status, at.Add(time.Hour+time.Duration(i)*time.Second))
	}
	h := New(Deps{Training: st})
	want := map[string]int{"active": 2, "rolled_back": 1, "candidate": 599, "retired": 600}
	for _, tt := range []struct {
		query string
		shown int
	}{{"", 102}, {"?adapters=5", 7}, {"?adapters=1000&limit=3", 1002}} {
		var resp TrainingResponse
		getJSON(t, h, "/api/training"+tt.query, &resp)
		names := map[string]bool{}
		for _, a := range resp.Adapters {
			names[a.Name] = true
		}
		if len(resp.Adapters) != tt.shown || !names["active-1"] || !names["active-2"] || !names["other-1198"] || names["old-of-listed-job"] ||
			!maps.Equal(resp.AdapterCounts, want) || resp.AdapterTotal != 1202 {
			t.Errorf("%s: %d adapters listed (actives %v %v), counts %v, total %d; want %d, counts %v, total 1202", tt.query,
				len(resp.Adapters), names["active-1"], names["active-2"], resp.AdapterCounts, resp.AdapterTotal, tt.shown, want)
		}
		if len(resp.Jobs) != 1 || resp.Jobs[0].Adapter == nil || resp.Jobs[0].Adapter.Name != "old-of-listed-job" || resp.Jobs[0].Adapter.Status != "rolled_back" {
			t.Errorf("%s: the listed job's adapter: %+v", tt.query, resp.Jobs)
		}
		_, body := getStatus(h, "/training"+tt.query)
		for _, s := range []string{fmt.Sprintf("showing %d of 1202 adapters", tt.shown), `<span class="adapter-name">old-of-listed-job</span> <span class="status status-rolled_back">`,
			`<span class="key status-retired">retired 600</span>`} {
			if !strings.Contains(body, s) {
				t.Errorf("/training%s lacks %q", tt.query, s)
			}
		}
	}
	if code, _ := getStatus(h, "/api/training?adapters=1001"); code != http.StatusBadRequest {
		t.Errorf("adapters=1001: %d, want 400", code)
	}
}
