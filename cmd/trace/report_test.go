package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
)

// TestReportOnTheTraceRelease stores the release's 10 labeling runs as
// labels and checks `trace report` decides like the authors did.
func TestReportOnTheTraceRelease(t *testing.T) {
	dir := shareddata.Dir(t, "trace-release/pipeline")
	ch := testenv.ClickHouse(t)
	st := ch.Store()
	ctx := context.Background()
	runs, err := analyzer.LoadRuns(filepath.Join(dir, "run_*.json"))
	if err != nil {
		t.Fatal(err)
	}
	scope := analyzer.ImportScope{Environment: "tau2-bench", AgentVersion: "qwen3", DictionaryVersion: 1}
	var rows []sink.LabelRow
	for _, ev := range analyzer.RunFileEvents(scope, runs) {
		rows = append(rows, sink.LabelRowFrom(&ev))
	}
	if err := st.InsertLabels(ctx, rows); err != nil {
		t.Fatal(err)
	}
	// The synthesize role made an environment for the top capability.
	envID := schemas.EnvironmentID("trig-report")
	if err := (synthesizer.SinkStore{Rows: st}).SaveEnvironment(ctx, &synthesizer.Environment{ID: envID, TriggerID: "trig-report",
		Environment: "tau2-bench", AgentVersion: "qwen3", DictionaryVersion: 1, Capability: "multi_step_transaction_completion",
		Status: synthesizer.StatusWaitingForLLM, Reason: "no generation model is configured and no template family matches the capability",
		CreatedAt: time.Now(), UpdatedAt: time.Now(), Version: 1}); err != nil {
		t.Fatal(err)
	}
	sets := []string{"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database, "--set", "analyzer.labeler=none"}
	out, err := runCLI(t, ctx, append([]string{"report", "--format", "json"}, sets...)...)
	if err != nil {
		t.Fatal(err)
	}
	var rep []reportRow
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	selected := map[string]bool{}
	for _, r := range rep {
		if r.Decision == "selected" {
			selected[r.Capability] = true
		}
		if r.Capability == "conditional_instruction_following" && (r.Decision != "rejected" || r.RunsPassed != 7 || len(r.Reasons) == 0) {
			t.Errorf("conditional_instruction_following: %+v", r)
		}
		if (r.Synthesis != nil) != (r.Capability == "multi_step_transaction_completion") ||
			(r.Synthesis != nil && (r.Synthesis.ID != envID || r.Synthesis.Status != "WAITING_FOR_LLM")) {
			t.Errorf("%s: synthesis %+v", r.Capability, r.Synthesis)
		}
	}
	if len(rep) != 9 || len(selected) != 6 || !selected["multi_step_transaction_completion"] || selected["information_gathering_before_action"] {
		t.Fatalf("report: %d rows, selected %v", len(rep), selected)
	}
	csv, err := runCLI(t, ctx, append([]string{"report", "--format", "csv", "--env", "tau2-bench"}, sets...)...)
	if err != nil || strings.Count(csv, "\n") != 10 || !strings.HasPrefix(csv, "environment,agent_version") {
		t.Fatalf("csv (%v):\n%s", err, csv)
	}
	if !strings.Contains(csv, envID+",WAITING_FOR_LLM\n") {
		t.Errorf("csv lacks the environment status:\n%s", csv)
	}
	table, err := runCLI(t, ctx, append([]string{"report"}, sets...)...)
	if err != nil || !strings.Contains(table, "environments (trace env show ID for one):") || !strings.Contains(table, envID+"  tau2-bench/qwen3 multi_step_transaction_completion  WAITING_FOR_LLM") {
		t.Fatalf("table (%v):\n%s", err, table)
	}
	table, err = runCLI(t, ctx, append([]string{"report", "--env", "nothing-here"}, sets...)...)
	if err != nil || !strings.Contains(table, "no labeled rollouts") {
		t.Fatalf("empty report (%v): %s", err, table)
	}
}
