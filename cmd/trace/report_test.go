package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
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
	}
	if len(rep) != 9 || len(selected) != 6 || !selected["multi_step_transaction_completion"] || selected["information_gathering_before_action"] {
		t.Fatalf("report: %d rows, selected %v", len(rep), selected)
	}
	csv, err := runCLI(t, ctx, append([]string{"report", "--format", "csv", "--env", "tau2-bench"}, sets...)...)
	if err != nil || strings.Count(csv, "\n") != 10 || !strings.HasPrefix(csv, "environment,agent_version") {
		t.Fatalf("csv (%v):\n%s", err, csv)
	}
	table, err := runCLI(t, ctx, append([]string{"report", "--env", "nothing-here"}, sets...)...)
	if err != nil || !strings.Contains(table, "no rollouts stored yet") {
		t.Fatalf("empty report (%v): %s", err, table)
	}
}
