package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/config"
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
	// Into a broker that needs SASL: refused without kafka.sasl, published
	// with it (the command's writer takes kafka.tls and kafka.sasl).
	sc := testenv.KFake(t, kfake.EnableSASL(), kfake.Superuser("PLAIN", "importer", "s3cret"))
	saslTopic := testenv.UniqueTopic(t, "labels-sasl")
	d, err := app.KafkaDialer(config.Kafka{SASL: config.SASL{Mechanism: "plain", Username: "importer", Password: "s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	if conn, err = d.DialContext(ctx, "tcp", sc.ListenAddrs()[0]); err != nil {
		t.Fatal(err)
	}
	err = conn.CreateTopics(kafka.TopicConfig{Topic: saslTopic, NumPartitions: 1, ReplicationFactor: 1})
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	saslArgs := append([]string{"labels", "import", "--runs", filepath.Join(dir, "run_*.json"),
		"--candidates", filepath.Join(dir, "candidate_capabilities.json"), "--environment", "tau2-bench",
		"--agent-version", "qwen3", "--topic", saslTopic}, sets...)
	saslArgs = append(saslArgs, "--set", "kafka.brokers="+sc.ListenAddrs()[0])
	shortCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	out, err = runCLI(t, shortCtx, saslArgs...)
	cancel()
	if err == nil {
		t.Fatalf("labels import without SASL into a SASL broker succeeded:\n%s", out)
	}
	saslArgs = append(saslArgs, "--set", "kafka.sasl.mechanism=plain", "--set", "kafka.sasl.username=importer", "--set", "kafka.sasl.password=s3cret")
	if out, err = runCLI(t, ctx, saslArgs...); err != nil || !strings.Contains(out, "published 14760 label events") {
		t.Fatalf("labels import with kafka.sasl (%v):\n%s", err, out)
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

// TestDictApplyRefusesBrokenDictionaries: a file with an unknown key or a
// detector the rules labeler cannot use is refused before anything is
// stored — with --backfill too, and with a valid file beside it — with an
// error naming the capability; the version a file gives is stored when it
// is free, and apply says when it is not used.
func TestDictApplyRefusesBrokenDictionaries(t *testing.T) {
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	sets := []string{"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database, "--set", "nats.url=" + ns.URL()}
	ctx := context.Background()
	dir := t.TempDir()
	file := func(name, top, detector string, version int) string {
		doc := fmt.Sprintf("environment: tau2-airline\nagent_version: \"*\"\nversion: %d\n%scapabilities:\n"+
			"  - name: precondition_verification\n    definition: Before a write the agent reads the record it changes.\n    detector: %q\n", version, top, detector)
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	valid := file("valid.yaml", "", `calls.exists(c, c.name == 'get_reservation_details') ? 'PRESENT' : 'NA'`, 5)
	stored := func() int {
		rows, err := ch.Store().AllDictionaries(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(rows)
	}
	for _, tc := range []struct {
		name  string
		files []string
		want  []string
	}{
		{"the brief's file", []string{file("brief.yaml", "unknown_field: 1\n", `calls.exists(c, c.nme == 'x')`, 5)}, []string{"brief.yaml", `line 4: unknown key "unknown_field" (a dictionary's keys are environment, agent_version, version, source, created_at, capabilities)`}},
		{"a field that does not exist", []string{file("nme.yaml", "", `calls.exists(c, c.nme == 'x')`, 5)},
			[]string{"nme.yaml", `capability "precondition_verification"`, "undefined field 'nme'"}},
		{"a bool", []string{file("bool.yaml", "", `calls.exists(c, c.name == 'x')`, 5)},
			[]string{`capability "precondition_verification"`, "detector returns bool, want string"}},
		{"a valid file beside a broken one", []string{valid, file("bool2.yaml", "", `calls.exists(c, c.name == 'x')`, 5)},
			[]string{"bool2.yaml", "detector returns bool"}},
	} {
		for _, backfill := range []bool{false, true} {
			args := append([]string{"dict", "apply"}, tc.files...)
			if backfill {
				args = append(args, "--backfill")
			}
			out, err := runCLI(t, ctx, append(args, sets...)...)
			if err == nil {
				t.Fatalf("%s (backfill %v): applied:\n%s", tc.name, backfill, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s (backfill %v): error %q does not contain %q", tc.name, backfill, err, w)
				}
			}
			if n := stored(); n != 0 {
				t.Fatalf("%s (backfill %v): %d dictionaries stored, want none\n%s", tc.name, backfill, n, out)
			}
		}
	}
	// The file's version is honoured when it is free, and apply says when
	// it is not used.
	for _, tc := range []struct{ file, want string }{
		{valid, "tau2-airline/*: version 5 (1 capabilities)\n"},
		{file("same.yaml", "", `calls.exists(c, c.name == 'get_reservation_details') ? 'PRESENT' : 'NA'`, 7),
			"tau2-airline/*: version 5 (1 capabilities): unchanged, these capabilities are already stored as version 5; the file's version 7 is not used\n"},
		{file("lower.yaml", "", `calls.exists(c, c.name == 'get_order_details') ? 'PRESENT' : 'NA'`, 1),
			"tau2-airline/*: version 6 (1 capabilities): the file says version 1, but versions up to 5 are taken by tau2-airline/* or a broader dictionary that labels its cohorts\n"},
	} {
		out, err := runCLI(t, ctx, append([]string{"dict", "apply", tc.file}, sets...)...)
		if err != nil || out != tc.want {
			t.Errorf("dict apply %s: %v\n got %q\nwant %q", filepath.Base(tc.file), err, out, tc.want)
		}
	}
	if n := stored(); n != 2 {
		t.Errorf("%d dictionaries stored, want 2 (versions 5 and 6)", n)
	}
	// A dictionary without detectors is valid (the llm labeler's); with the
	// rules labeler apply warns that every run would fail.
	bare := filepath.Join(dir, "bare.yaml")
	if err := os.WriteFile(bare, []byte("environment: bare\nagent_version: \"*\"\nversion: 1\ncapabilities:\n"+
		"  - name: policy_constraint_enforcement\n    definition: Refuses the actions the policy forbids, and says why.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, ctx, append([]string{"dict", "apply", bare}, sets...)...)
	if err != nil || !strings.Contains(out, "warning: bare/*: no detector for policy_constraint_enforcement: the rules labeler") {
		t.Errorf("dict apply of a dictionary without detectors (%v):\n%s", err, out)
	}
	out, err = runCLI(t, ctx, append([]string{"dict", "apply", bare, "--set", "analyzer.labeler=llm", "--set", "llm.base_url=http://127.0.0.1:1/v1", "--set", "llm.model=m"}, sets...)...)
	if err != nil || strings.Contains(out, "warning") {
		t.Errorf("dict apply of a dictionary without detectors for the llm labeler (%v):\n%s", err, out)
	}
	// A dictionary stored before apply checked detectors: relabel refuses
	// it with the detector's error and the right hint.
	legacy := &analyzer.Dictionary{Environment: "legacy", AgentVersion: "*", Version: 1, Source: "file", CreatedAt: time.Now().UTC(),
		Capabilities: []analyzer.Capability{{Name: "precondition_verification", Definition: "Before a write the agent reads the record it changes.", Detector: `calls.exists(c, c.name == 'x')`}}}
	if err := ch.Store().SaveDictionary(ctx, analyzer.DictionaryRow(legacy)); err != nil {
		t.Fatal(err)
	}
	end := time.Now().UTC().Add(-time.Hour)
	if err := ch.Store().InsertRollouts(ctx, []sink.RolloutRow{sink.RolloutRowFrom(&schemas.Rollout{RolloutID: "r1", Environment: "legacy",
		Agent: schemas.Agent{Name: "a", Version: "v1"}, TaskID: "t", StartTime: end.Add(-time.Minute), EndTime: end}, sink.Coord{Topic: "t"})}); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, ctx, append([]string{"relabel", "--env", "legacy"}, sets...)...)
	if err == nil || !strings.Contains(err.Error(), "detector returns bool") || !strings.Contains(err.Error(), "fix the detector") || strings.Contains(err.Error(), "add detectors") {
		t.Errorf("relabel with a stored broken detector: %v\n%s", err, out)
	}
}
