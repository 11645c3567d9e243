package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// TestDictAndLabelsImportCommands drives `trace dict apply/show` and
// `trace labels import` against real servers.
func TestDictAndLabelsImportCommands(t *testing.T) {
	dir := shareddata.Dir(t, "trace-release/pipeline")
	brokers := testenv.Kafka(t)
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	topic := testenv.UniqueTopic(t, "labels")
	testenv.CreateTopic(t, brokers, topic, 1)
	sets := []string{"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database,
		"--set", "nats.url=" + ns.URL(), "--set", "kafka.brokers=" + brokers[0]}
	ctx := context.Background()

	out, err := runCLI(t, ctx, append([]string{"dict", "apply", "../../analyzer/dictionaries/tau-tools.yaml"}, sets...)...)
	if err != nil || !strings.Contains(out, "*/*: version 1 (5 capabilities)") {
		t.Fatalf("dict apply (%v):\n%s", err, out)
	}
	// Applying the same content again stores nothing new.
	out, err = runCLI(t, ctx, append([]string{"dict", "apply", "../../analyzer/dictionaries/tau-tools.yaml"}, sets...)...)
	if err != nil || !strings.Contains(out, "version 1 ") {
		t.Fatalf("re-apply (%v):\n%s", err, out)
	}
	out, err = runCLI(t, ctx, append([]string{"labels", "import", "--runs", filepath.Join(dir, "run_*.json"),
		"--candidates", filepath.Join(dir, "candidate_capabilities.json"), "--environment", "tau2-bench",
		"--agent-version", "qwen3", "--topic", topic}, sets...)...)
	if err != nil || !strings.Contains(out, "published 14760 label events (10 runs)") {
		t.Fatalf("labels import (%v):\n%s", err, out)
	}
	conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	last, err := conn.ReadLastOffset()
	conn.Close()
	if err != nil || last != 14760 {
		t.Fatalf("topic holds %d events (%v), want 14760", last, err)
	}
	// Other candidates under the version already stored: refused, nothing
	// published; a capability labeled but not a candidate too.
	raw, err := os.ReadFile(filepath.Join(dir, "candidate_capabilities.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Candidates []map[string]any `json:"candidates"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	doc.Candidates[0]["description"] = "A revised definition of the first capability. It differs from the stored one."
	revised := filepath.Join(t.TempDir(), "revised.json")
	b, _ := json.Marshal(doc)
	if err := os.WriteFile(revised, b, 0o644); err != nil {
		t.Fatal(err)
	}
	doc.Candidates = doc.Candidates[1:]
	fewer := filepath.Join(t.TempDir(), "fewer.json")
	b, _ = json.Marshal(doc)
	if err := os.WriteFile(fewer, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, want string }{
		{revised, "dictionary version 1 is already stored (tau2-bench/qwen3, source import) with other capabilities or definitions than " + revised + ": its labels and these would share one cohort; import under another version, e.g. --dictionary-version 2"},
		{fewer, `capability "policy_constraint_enforcement" is labeled but is not a candidate of ` + fewer},
	} {
		out, err = runCLI(t, ctx, append([]string{"labels", "import", "--runs", filepath.Join(dir, "run_*.json"),
			"--candidates", tc.file, "--environment", "tau2-bench", "--agent-version", "qwen3", "--topic", topic}, sets...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("labels import --candidates %s: %v, want %q\n%s", filepath.Base(tc.file), err, tc.want, out)
		}
	}
	// The same candidates again: the same version, published again.
	out, err = runCLI(t, ctx, append([]string{"labels", "import", "--runs", filepath.Join(dir, "run_*.json"),
		"--candidates", filepath.Join(dir, "candidate_capabilities.json"), "--environment", "tau2-bench",
		"--agent-version", "qwen3", "--topic", topic}, sets...)...)
	if err != nil || !strings.Contains(out, "published 14760 label events (10 runs) for tau2-bench/qwen3 dictionary v1") {
		t.Fatalf("labels import again (%v):\n%s", err, out)
	}
	conn, err = kafka.DialLeader(ctx, "tcp", brokers[0], topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	last, err = conn.ReadLastOffset()
	conn.Close()
	if err != nil || last != 2*14760 {
		t.Fatalf("topic holds %d events (%v), want %d: the refused imports published nothing", last, err, 2*14760)
	}
	out, err = runCLI(t, ctx, append([]string{"dict", "show"}, sets...)...)
	for _, want := range []string{"* / agent * — version 1", "tau2-bench / agent qwen3 — version 1 (import", "multi_step_transaction_completion"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("dict show lacks %q (%v):\n%s", want, err, out)
		}
	}
	_, err = runCLI(t, ctx, append([]string{"labels", "import", "--runs", filepath.Join(dir, "run_*.json"), "--agent-version", "x"}, sets...)...)
	if err == nil || !strings.Contains(err.Error(), "--environment") {
		t.Fatalf("missing --environment: %v", err)
	}
}

// TestLabelsImportIntoACohortTheDefaultLabels: labels imported under the
// version of the default dictionary (*/* v1, always there with the default
// configuration) for a scope whose rollouts the default already labeled
// would join that cohort under other capabilities: refused, naming a free
// version, and nothing is stored or published; a scope the default has not
// labeled takes the version.
func TestLabelsImportIntoACohortTheDefaultLabels(t *testing.T) {
	brokers := testenv.Kafka(t)
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	topic := testenv.UniqueTopic(t, "labels")
	testenv.CreateTopic(t, brokers, topic, 1)
	sets := []string{"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database,
		"--set", "nats.url=" + ns.URL(), "--set", "kafka.brokers=" + brokers[0], "--topic", topic}
	ctx := context.Background()
	if out, err := runCLI(t, ctx, "dict", "apply", "../../analyzer/dictionaries/tau-tools.yaml", "--set", "clickhouse.addr="+ch.Addr,
		"--set", "clickhouse.database="+ch.Database, "--set", "nats.url="+ns.URL()); err != nil || !strings.Contains(out, "*/*: version 1") {
		t.Fatalf("dict apply (%v):\n%s", err, out)
	}
	// The default dictionary labeled a rollout of airline/v1.
	if err := ch.Store().InsertLabels(ctx, []sink.LabelRow{{LabelEvent: schemas.LabelEvent{RolloutID: "r0", Environment: "airline", AgentVersion: "v1",
		DictionaryVersion: 1, Capability: "tool_selection", Run: 0, Label: "PRESENT", Source: "rules", TS: time.Now().Add(-time.Hour)}}}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	run := `{"attempt": 1, "totals": {"total_failed": 1, "total_passed": 1}, "labels": {"refund_policy": {"lacking_failed": ["t1"], "present_failed": [], "na_failed": [], "lacking_passed": [], "present_passed": ["t2"], "na_passed": []}}}`
	cands := `{"candidates": [{"name": "refund_policy", "description": "Applies the refund policy before refunding."}]}`
	os.WriteFile(filepath.Join(dir, "run_01.json"), []byte(run), 0o644)
	os.WriteFile(filepath.Join(dir, "candidates.json"), []byte(cands), 0o644)
	imp := func(agentVersion string) (string, error) {
		return runCLI(t, ctx, append([]string{"labels", "import", "--runs", filepath.Join(dir, "run_*.json"), "--candidates", filepath.Join(dir, "candidates.json"),
			"--environment", "airline", "--agent-version", agentVersion}, sets...)...)
	}
	out, err := imp("v1")
	if err == nil || !strings.Contains(err.Error(), "airline/v1 dictionary version 1 is already stored (*/*, source") || !strings.Contains(err.Error(), "--dictionary-version 2") {
		t.Errorf("import into the default's cohort: %v\n%s", err, out)
	}
	if d, _ := runCLI(t, ctx, "dict", "show", "--all", "--set", "clickhouse.addr="+ch.Addr, "--set", "clickhouse.database="+ch.Database, "--set", "nats.url="+ns.URL()); strings.Contains(d, "airline / agent v1") {
		t.Errorf("the refused import stored a dictionary:\n%s", d)
	}
	// Another agent version, which the default has not labeled: imported as v1.
	if out, err := imp("v2"); err != nil || !strings.Contains(out, "published 2 label events (1 runs) for airline/v2 dictionary v1") {
		t.Errorf("import into an unlabeled scope: %v\n%s", err, out)
	}
	conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if last, err := conn.ReadLastOffset(); err != nil || last != 2 {
		t.Errorf("topic holds %d events (%v), want the 2 of the accepted import", last, err)
	}
}
