package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/traceops/trace/internal/dev/shareddata"
)

func TestSelectCommandGolden(t *testing.T) {
	dir := shareddata.Dir(t, "trace-release/pipeline")
	args := []string{"select", "--runs", filepath.Join(dir, "run_*.json"), "--candidates", filepath.Join(dir, "candidate_capabilities.json")}
	out, err := runCLI(t, context.Background(), append(args, "--format", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	var got, want []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "selected_capabilities.json"))
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d selected, want %d", len(got), len(want))
	}
	fields := []string{"skill", "description", "mean_cov", "std_cov", "mean_delta", "std_delta", "n_runs_passed", "n_runs_total", "passes_consistency", "example_failed_cases", "status"}
	for i := range got {
		if len(got[i]) != len(fields) {
			t.Errorf("record %d has fields %v, want exactly %v", i, keys(got[i]), fields)
		}
		for _, f := range fields {
			if _, ok := got[i][f]; !ok {
				t.Errorf("record %d lacks %s", i, f)
			}
		}
		if got[i]["skill"] != want[i]["skill"] || got[i]["status"] != "PENDING" {
			t.Errorf("record %d: %v %v, want %v PENDING", i, got[i]["skill"], got[i]["status"], want[i]["skill"])
		}
	}

	table, err := runCLI(t, context.Background(), append(args, "--format", "table")...)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"multi_step_transaction_completion", "SELECTED", "rejected:", "conditional_instruction_following: passed 7 of 10 runs, needs 8"} {
		if !strings.Contains(table, s) {
			t.Errorf("table lacks %q:\n%s", s, table)
		}
	}
}

func TestSelectCommandErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "run_01.json")
	os.WriteFile(bad, []byte(`{"totals":{"total_failed":1,"total_passed":0},"labels":{"cap_x":{"lacking_failed":[]}}}`), 0o644)
	cands := filepath.Join(dir, "c.json")
	os.WriteFile(cands, []byte(`{"candidates":[{"name":"cap_x","description":"d"}]}`), 0o644)
	_, err := runCLI(t, context.Background(), "select", "--runs", filepath.Join(dir, "run_*.json"), "--candidates", cands, "--k", "1", "--format", "table")
	if err == nil || !strings.Contains(err.Error(), "run_01.json") || !strings.Contains(err.Error(), `"cap_x"`) {
		t.Fatalf("err = %v, want it to name the file and the capability", err)
	}
	_, err = runCLI(t, context.Background(), "select", "--runs", filepath.Join(dir, "nothing_*.json"), "--candidates", cands)
	if err == nil || !strings.Contains(err.Error(), "matches no file") {
		t.Fatalf("err = %v", err)
	}
	// An unquoted glob, expanded by the shell: the files after the first
	// are arguments.
	_, err = runCLI(t, context.Background(), "select", "--runs", bad, filepath.Join(dir, "run_02.json"), "--candidates", cands)
	if err == nil || !strings.Contains(err.Error(), "quote the --runs pattern") {
		t.Fatalf("unquoted glob: err = %v", err)
	}
}

func keys(m map[string]any) []string {
	var k []string
	for s := range m {
		k = append(k, s)
	}
	return k
}
