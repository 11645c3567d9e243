package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer"
)

// seedEnvironments stores a DONE environment (calibrated by the simulated
// policy, after a rejected attempt) and a FAILED one in ClickHouse.
func seedEnvironments(t *testing.T, st synthesizer.SinkStore) (done, failed *synthesizer.Environment) {
	t.Helper()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	prog := "\"\"\"Why it transfers.\"\"\"\ndef reset(seed):\n    return {\"system\": \"<b>policy</b>\", \"user\": \"u\", \"state\": {}}\n"
	cal := &synthesizer.Calibration{Accepted: true, Verdict: "accepted", Policy: "simulated sim-airline/1.4.0", Simulated: true, Seeds: 100,
		RolloutsPerSeed: 16, Temperature: 0.7, MeanReward: 0.45, StdReward: 0.41, SuccessRate: 0.38, InformativeGroups: 0.8,
		PassAtK: map[string]float64{"1": 0.38, "4": 0.8, "16": 0.97}, Histogram: []int{600, 0, 0, 0, 0, 390, 0, 0, 0, 610}}
	done = &synthesizer.Environment{ID: schemas.EnvironmentID("t-done"), TriggerID: "t-done", Environment: "sim-airline", AgentVersion: "1.4.0",
		DictionaryVersion: 1, Capability: "precondition_verification", Definition: "Look before you write.", MeanDelta: 0.41, Rank: 2,
		Family: "precondition_verification", FamilySource: synthesizer.FamilyFromDictionary, FamilyWhy: "the dictionary declares family precondition_verification",
		Status: synthesizer.StatusDone, Path: synthesizer.PathTemplate, Attempt: 2, Program: prog, ProgramHash: synthesizer.ProgramHash(prog),
		Tools: []string{"get_reservation_details", "cancel_reservation"}, Rationale: "Why it transfers.",
		Request: &schemas.SynthesisRequest{TriggerID: "t-done", Environment: "sim-airline", AgentVersion: "1.4.0"},
		Attempts: []synthesizer.Attempt{
			{N: 1, Origin: schemas.OriginTemplate, Family: "precondition_verification", Knobs: json.RawMessage(`{"records":3}`), Stage: synthesizer.StageCalibrate,
				Diagnosis: "calibration: too easy (mean reward 0.9 > 0.6)", StartedAt: at, EndedAt: at.Add(time.Second),
				Validation:  &synthesizer.Validation{OK: true, Checks: []synthesizer.Check{{Name: "reward_range", Verdict: synthesizer.Pass, Message: "rewards in [0, 1]"}}},
				Calibration: &synthesizer.Calibration{Verdict: "too_easy", Simulated: true, MeanReward: 0.9, Histogram: []int{10, 0, 0, 0, 0, 0, 0, 0, 0, 90}}},
			{N: 2, Origin: schemas.OriginTemplate, Stage: synthesizer.StageCalibrate, Accepted: true, Calibration: cal, StartedAt: at, EndedAt: at.Add(2 * time.Second)},
		},
		Calibration: cal, CreatedAt: at, UpdatedAt: at.Add(time.Minute), Version: 5}
	failed = &synthesizer.Environment{ID: schemas.EnvironmentID("t-failed"), TriggerID: "t-failed", Environment: "sim-retail", AgentVersion: "1.5.0",
		DictionaryVersion: 1, Capability: "argument_grounding", Status: synthesizer.StatusFailed, Path: synthesizer.PathLLM, Attempt: 5,
		Reason: "5 attempts, none accepted; last: validation: reward_range: seed 3: reward 1.5",
		Attempts: []synthesizer.Attempt{{N: 1, Origin: schemas.OriginLLM, Model: "gen", Stage: synthesizer.StageValidate, Diagnosis: "validation: load: syntax error",
			Validation: &synthesizer.Validation{Checks: []synthesizer.Check{{Name: "load", Verdict: synthesizer.Fail, Message: "program.star:3:5: got '!'"}}}}},
		CreatedAt: at.Add(time.Hour), UpdatedAt: at.Add(time.Hour), Version: 9}
	for _, e := range []*synthesizer.Environment{done, failed} {
		if err := st.SaveEnvironment(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	return done, failed
}

func TestEnvironmentsPagesAndAPI(t *testing.T) {
	st := synthesizer.SinkStore{Rows: openStore(t)}
	done, failed := seedEnvironments(t, st)
	h := New(Deps{Environments: st})

	var list EnvironmentsResponse
	getJSON(t, h, "/api/environments", &list)
	if len(list.Environments) != 2 || list.Environments[0].ID != failed.ID || list.Counts["DONE"] != 1 || list.Counts["FAILED"] != 1 {
		t.Fatalf("%+v", list)
	}
	d := list.Environments[1]
	if d.Status != "DONE" || *d.MeanReward != 0.45 || d.PassAtK["16"] != 0.97 || !d.Simulated || len(d.Tools) != 2 {
		t.Fatalf("%+v", d)
	}
	if f := list.Environments[0]; f.MeanReward != nil || f.Reason == "" {
		t.Fatalf("failed row %+v", f)
	}
	getJSON(t, h, "/api/environments?status=failed", &list)
	if len(list.Environments) != 1 || list.Environments[0].ID != failed.ID {
		t.Fatalf("status filter: %+v", list)
	}
	var one synthesizer.Environment
	getJSON(t, h, "/api/environments/"+done.ID, &one)
	if one.ID != done.ID || len(one.Attempts) != 2 || one.Program != done.Program || one.Calibration.Histogram[9] != 610 {
		t.Fatalf("%+v", one)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, schemas.EnvironmentProgramPath(done.ID), nil))
	if rec.Code != 200 || rec.Body.String() != done.Program || rec.Header().Get("X-Trace-Program-Sha256") != done.ProgramHash ||
		!strings.HasPrefix(rec.Header().Get("Content-Type"), "text/x-starlark") || rec.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("program: %d %q %v", rec.Code, rec.Body.String(), rec.Header())
	}
	// A program (and the other text the dashboard serves: rollouts,
	// model answers) is someone else's text: no browser may sniff it
	// into HTML or a script, whatever the answer.
	for _, path := range []string{schemas.EnvironmentProgramPath(done.ID), schemas.EnvironmentProgramPath(failed.ID), "/api/environments/" + done.ID,
		"/api/environments", "/environment?id=" + done.ID, "/environments", "/api/environments/env-0000000000000000", "/assets/style.css"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if got := rec.Header().Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("GET %s: %d, X-Content-Type-Options %q, want nosniff", path, rec.Code, got)
		}
	}
	for path, want := range map[string]int{
		"/api/environments/env-0000000000000000":         404,
		schemas.EnvironmentProgramPath(failed.ID):        404, // no program yet
		"/api/environments?status=SOMETIMES":             400,
		"/environment?id=env-0000000000000000":           404,
		"/environment":                                   400,
		"/api/environments?limit=0":                      400,
		"/api/environments/" + done.ID + "/program/more": 404,
	} {
		if code, body := getStatus(h, path); code != want {
			t.Errorf("GET %s: %d, want %d: %s", path, code, want, body)
		}
	}

	code, body := getStatus(h, "/environments")
	if code != 200 {
		t.Fatalf("list page: %d %s", code, body)
	}
	if !regexp.MustCompile(`@1 0.38</span> <span class="pass">@4 0.80</span> <span class="pass">@16 0.97`).MatchString(body) {
		t.Errorf("list page's pass@k not in the order of k")
	}
	for _, want := range []string{`href="/environment?id=` + done.ID + `"`, `data-status="FAILED"`, "5 attempts, none accepted", "@16 0.97",
		`class="simulated"`, "get_reservation_details, cancel_reservation", `class="active">Environments</a>`} {
		if !strings.Contains(body, want) {
			t.Errorf("list page lacks %q", want)
		}
	}
	code, body = getStatus(h, "/environment?id="+done.ID)
	if code != 200 {
		t.Fatalf("environment page: %d %s", code, body)
	}
	for _, want := range []string{`id="chart-calibration"`, `data-bin="9" data-count="610"`, "SIMULATED policy", "pass@16 0.97",
		`data-attempt="1" data-stage="calibrate"`, "too easy (mean reward 0.9 &gt; 0.6)", `id="chart-attempt-1"`, "knobs <code>{&#34;records&#34;:3}</code>",
		"&lt;b&gt;policy&lt;/b&gt;", "the dictionary declares family", `href="/api/environments/` + done.ID + `/program"`} {
		if !strings.Contains(body, want) {
			t.Errorf("environment page lacks %q", want)
		}
	}
	if strings.Contains(body, "<b>policy</b>") {
		t.Error("the program is not escaped")
	}
	_, body = getStatus(h, "/environment?id="+failed.ID)
	for _, want := range []string{`class="check-fail"`, "program.star:3:5", "status-FAILED"} {
		if !strings.Contains(body, want) {
			t.Errorf("failed environment page lacks %q", want)
		}
	}
	if code, _ := getStatus(New(Deps{}), "/api/environments"); code != http.StatusServiceUnavailable {
		t.Errorf("without a store: %d", code)
	}
}

// TestEnvironmentsUnreadableRow: a row of environments that does not
// decode (written by another version, or damaged) is shown as unreadable
// on the list page and in /api/environments, the others as always; only
// its own page fails.
func TestEnvironmentsUnreadableRow(t *testing.T) {
	st := synthesizer.SinkStore{Rows: openStore(t), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	done, failed := seedEnvironments(t, st)
	bad := *done
	bad.ID, bad.TriggerID = fmt.Sprintf("env-bad-%d", time.Now().UnixNano()), "t-bad"
	r, err := synthesizer.Row(&bad)
	if err != nil {
		t.Fatal(err)
	}
	r.Calibration = `{"mean_reward": "high"}`
	if err := st.Rows.SaveEnvironment(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	h := New(Deps{Environments: st})

	var list EnvironmentsResponse
	getJSON(t, h, "/api/environments", &list)
	if len(list.Environments) != 2 || list.Environments[0].ID != failed.ID || list.Environments[1].ID != done.ID ||
		len(list.Unreadable) != 1 || list.Unreadable[0].ID != bad.ID || list.Unreadable[0].Status != "DONE" ||
		!strings.Contains(list.Unreadable[0].Error, "stored calibration") {
		t.Fatalf("/api/environments with an unreadable row: %+v", list)
	}
	code, body := getStatus(h, "/environments")
	if code != 200 || !strings.Contains(body, `href="/environment?id=`+done.ID+`"`) || !strings.Contains(body, `data-status="FAILED"`) ||
		!strings.Contains(body, `class="warn card env-unreadable" data-id="`+bad.ID+`"`) || !strings.Contains(body, "stored calibration") {
		t.Fatalf("list page with an unreadable row: %d %s", code, body)
	}
	if code, body := getStatus(h, "/api/environments/"+bad.ID); code != http.StatusInternalServerError || !strings.Contains(body, "stored calibration") {
		t.Errorf("the unreadable environment's record: %d %s, want 500 naming the column", code, body)
	}
	if code, _ := getStatus(h, "/environment?id="+done.ID); code != 200 {
		t.Errorf("a readable environment's page: %d", code)
	}
}

func TestHistogramChart(t *testing.T) {
	svg := string(histogramChart{ID: "h", Title: "t <x>", Counts: []int{1, 0, 3}, Simulated: true}.render())
	for _, want := range []string{`<svg class="chart histogram" id="h"`, `aria-label="t &lt;x&gt;"`, `data-bin="0" data-count="1"`, `data-bin="2" data-count="3"`,
		"reward [0.7, 1.0]: 3 rollouts (75.0%)", "reward (4 rollouts) · SIMULATED policy"} {
		if !strings.Contains(svg, want) {
			t.Errorf("svg lacks %q:\n%s", want, svg)
		}
	}
	if svg := string(histogramChart{Counts: make([]int, 10)}.render()); !strings.Contains(svg, "reward (0 rollouts)") || strings.Contains(svg, "NaN") {
		t.Errorf("empty histogram: %s", svg)
	}
}

// TestEnvironmentCountsCoverTheWholeTable: with more environments than the
// listing's limit (200), the counts by status are those of every
// environment matching the filters, each counted once in its newest
// version (an environment re-saved as DONE is not also PENDING), and the
// page says that the listing is cut ("showing 200 of 213").
func TestEnvironmentCountsCoverTheWholeTable(t *testing.T) {
	st := synthesizer.SinkStore{Rows: openStore(t)}
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	save := func(i int, env string, status synthesizer.Status, version uint64) {
		t.Helper()
		id := schemas.EnvironmentID(fmt.Sprintf("t-many-%03d", i))
		e := &synthesizer.Environment{ID: id, TriggerID: id, Environment: env, AgentVersion: "1.4.0", DictionaryVersion: 1,
			Capability: "precondition_verification", Status: status, CreatedAt: at.Add(time.Duration(i) * time.Second),
			UpdatedAt: at.Add(time.Duration(i) * time.Second), Version: version}
		if err := st.SaveEnvironment(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// 150 DONE and 40 FAILED in sim-airline, 23 DONE in sim-retail; the
	// first 30 were PENDING before (an older version).
	for i := range 213 {
		env, status := "sim-airline", synthesizer.StatusDone
		switch {
		case i >= 190:
			env = "sim-retail"
		case i >= 150:
			status = synthesizer.StatusFailed
		}
		if i < 30 {
			save(i, env, synthesizer.StatusPending, 1)
		}
		save(i, env, status, 2)
	}
	h := New(Deps{Environments: st})
	for _, tt := range []struct {
		query  string
		shown  int
		counts map[string]int
	}{
		{"", 200, map[string]int{"DONE": 173, "FAILED": 40}},
		{"?env=sim-airline", 190, map[string]int{"DONE": 150, "FAILED": 40}},
		{"?status=done", 173, map[string]int{"DONE": 173}},
		{"?env=sim-airline&limit=10", 10, map[string]int{"DONE": 150, "FAILED": 40}},
	} {
		var list EnvironmentsResponse
		getJSON(t, h, "/api/environments"+tt.query, &list)
		total := 0
		for _, n := range tt.counts {
			total += n
		}
		if len(list.Environments) != tt.shown || !maps.Equal(list.Counts, tt.counts) || list.Total != total {
			t.Errorf("%s: %d listed, counts %v, total %d; want %d listed, counts %v, total %d",
				tt.query, len(list.Environments), list.Counts, list.Total, tt.shown, tt.counts, total)
		}
		_, body := getStatus(h, "/environments"+tt.query)
		for k, n := range tt.counts {
			if want := fmt.Sprintf(`<span class="key status-%s">%s %d</span>`, k, k, n); !strings.Contains(body, want) {
				t.Errorf("/environments%s lacks %s", tt.query, want)
			}
		}
		note := fmt.Sprintf("showing %d of %d", tt.shown, total)
		if got := strings.Contains(body, note); got != (tt.shown < total) {
			t.Errorf("/environments%s: %q shown: %v", tt.query, note, got)
		}
	}
}

// TestEnvironmentsShowCalibrationProgress: an environment being calibrated
// shows how far its calibration got (its record's progress) on the
// Environments page, on its own page and in the JSON, not only
// CALIBRATING.
func TestEnvironmentsShowCalibrationProgress(t *testing.T) {
	st := synthesizer.SinkStore{Rows: openStore(t)}
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	e := &synthesizer.Environment{ID: schemas.EnvironmentID("t-cal"), TriggerID: "t-cal", Environment: "sim-airline", AgentVersion: "1.4.0",
		DictionaryVersion: 1, Capability: "precondition_verification", Status: synthesizer.StatusCalibrating, Path: synthesizer.PathTemplate, Attempt: 1,
		Progress:  &synthesizer.CalibrationProgress{Path: synthesizer.PathTemplate, Attempt: 1, Done: 400, Total: 1600, StartedAt: at, At: at.Add(time.Hour)},
		CreatedAt: at, UpdatedAt: at.Add(time.Hour), Version: 3}
	if err := st.SaveEnvironment(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	h := New(Deps{Environments: st})
	var list EnvironmentsResponse
	getJSON(t, h, "/api/environments", &list)
	if len(list.Environments) != 1 || list.Environments[0].Progress == nil || *list.Environments[0].Progress != *e.Progress {
		t.Fatalf("%+v", list)
	}
	var one synthesizer.Environment
	getJSON(t, h, "/api/environments/"+e.ID, &one)
	if one.Progress == nil || *one.Progress != *e.Progress {
		t.Fatalf("%+v", one.Progress)
	}
	_, body := getStatus(h, "/environments")
	if !strings.Contains(body, `status-CALIBRATING">CALIBRATING</span> <span class="progress">400/1600 (25 %)</span>`) {
		t.Errorf("list page lacks the progress:\n%s", body)
	}
	_, body = getStatus(h, "/environment?id="+e.ID)
	for _, want := range []string{`<span class="progress" id="calibration-progress">400/1600 (25 %)</span>`,
		`id="calibration-progress-detail">400 of 1600 rollouts played (25 %) at ` + fmtTS(at.Add(time.Hour))} {
		if !strings.Contains(body, want) {
			t.Errorf("environment page lacks %q:\n%s", want, body)
		}
	}
}
