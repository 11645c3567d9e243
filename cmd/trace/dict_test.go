package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/internal/dev/testenv"
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
		{revised, "dictionary version 1 is already stored (source import) with other capabilities or definitions than " + revised + ": import under another version, e.g. --dictionary-version 2"},
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
