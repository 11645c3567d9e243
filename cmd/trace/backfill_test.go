package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
)

// testApp is one in-process `trace run` (ingest + analyze) on test servers.
type testApp struct {
	a    *app.App
	cli  []string // --set flags for CLI commands against it
	stop func()
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func startTestApp(t *testing.T, sets []string) *testApp {
	t.Helper()
	cfg, err := config.Load("", sets)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.Start(ctx, cfg, slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case <-a.Ready():
	case err := <-done:
		cancel()
		a.Close()
		t.Fatalf("app stopped at start: %v", err)
	}
	ta := &testApp{a: a}
	ta.stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("app run: %v", err)
		}
		a.Close()
	}
	t.Cleanup(func() {
		if ta.stop != nil {
			ta.stop()
		}
	})
	natsURL := a.NATSURL
	if natsURL == "" { // an ingest-only app connects no NATS
		natsURL = cfg.NATS.URL
	}
	ta.cli = []string{"--set", "clickhouse.addr=" + a.ClickHouseAddr(), "--set", "clickhouse.database=" + cfg.ClickHouse.Database,
		"--set", "nats.url=" + natsURL, "--set", "kafka.brokers=" + strings.Join(a.Brokers, ","),
		"--set", "kafka.rollouts_topic=" + cfg.Kafka.RolloutsTopic}
	return ta
}

// appSets is the configuration of a test app on the test servers, with its
// own topics and database.
func appSets(t *testing.T, brokers []string, chAddr, natsURL, name string, more ...string) (sets []string, topic string) {
	topic = testenv.UniqueTopic(t, name)
	for _, tp := range []string{topic, topic + ".dlq", topic + ".labels", topic + ".labels.dlq"} {
		testenv.CreateTopic(t, brokers, tp, 4)
	}
	db := strings.NewReplacer(".", "_", "-", "_").Replace(topic)
	return append([]string{
		"data_dir=" + t.TempDir(), "roles=ingest,analyze", "http.addr=127.0.0.1:0", "kafka.brokers=" + brokers[0],
		"kafka.rollouts_topic=" + topic, "kafka.labels_topic=" + topic + ".labels", "kafka.dlq_topic=" + topic + ".dlq",
		"kafka.ingest_group=ingest-" + topic, "kafka.analyze_group=analyze-" + topic, "kafka.labels_group=labels-" + topic,
		"kafka.batch_rows=300", "kafka.batch_timeout=100ms", "clickhouse.addr=" + chAddr, "clickhouse.database=" + db,
		"nats.url=" + natsURL, "analyzer.interval=500ms",
	}, more...), topic
}

// writeFleet writes rollouts as rollout JSONL for trace replay.
func writeFleet(t *testing.T, n int, start time.Time) string {
	t.Helper()
	g := simulate.New(simulate.Config{Seed: 11, Rollouts: n, Start: start, Interval: 30 * time.Second})
	var b strings.Builder
	for r := range g.All() {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	f := filepath.Join(t.TempDir(), "fleet.jsonl")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// simDictionary writes the built-in dictionary's capabilities scoped to the
// two simulated environments: a user's own dictionary.
func simDictionary(t *testing.T) string {
	t.Helper()
	raw, err := analyzer.BuiltinDictionaryYAML("dictionaries/tau-tools.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	if !strings.Contains(doc, `environment: "*"`) {
		t.Fatal("the built-in dictionary is no longer scoped to every environment")
	}
	body := doc[strings.Index(doc, "---"):]
	out := strings.Replace(body, `environment: "*"`, "environment: sim-airline", 1) + "\n" + strings.Replace(body, `environment: "*"`, "environment: sim-retail", 1)
	f := filepath.Join(t.TempDir(), "sim.yaml")
	if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func storedRollouts(t *testing.T, st *sink.Store) uint64 {
	n, _, err := st.CountDistinctRollouts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// groupCaughtUp reports whether a consumer group has committed every
// partition of topic up to its end.
func groupCaughtUp(t *testing.T, brokers []string, group, topic string) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(brokers...)}
	parts := []int{0, 1, 2, 3}
	committed, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return false, err.Error()
	}
	var reqs []kafka.OffsetRequest
	for _, p := range parts {
		reqs = append(reqs, kafka.LastOffsetOf(p))
	}
	ends, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return false, err.Error()
	}
	end := map[int]int64{}
	for _, po := range ends.Topics[topic] {
		end[po.Partition] = po.LastOffset
	}
	for _, po := range committed.Topics[topic] {
		if e := end[po.Partition]; e > 0 && po.CommittedOffset < e {
			return false, fmt.Sprintf("partition %d committed %d of %d", po.Partition, po.CommittedOffset, end[po.Partition])
		}
	}
	return true, ""
}

func reportJSON(t *testing.T, ctx context.Context, cli []string) []reportRow {
	t.Helper()
	out, err := runCLI(t, ctx, append([]string{"report", "--format", "json"}, cli...)...)
	if err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	var rows []reportRow
	if err := json.Unmarshal([]byte(lastJSONArray(out)), &rows); err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	return rows
}

// lastJSONArray returns the JSON array the report printed after any log lines.
func lastJSONArray(s string) string {
	if i := strings.Index(s, "\n[\n"); i >= 0 {
		return s[i+1:]
	}
	if strings.HasPrefix(s, "[") {
		return s
	}
	return s
}

func firedTriggers(t *testing.T, st *sink.Store) []string {
	t.Helper()
	hist, err := st.TriggerHistory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, h := range hist {
		if h.Event == string(analyzer.ActFire) {
			out = append(out, fmt.Sprintf("%s/%s/v%d %s epoch %d", h.Environment, h.AgentVersion, h.DictionaryVersion, h.Capability, h.Epoch))
		}
	}
	sort.Strings(out)
	return out
}

// TestBackfillDecidesAsTheStream replays a fleet (2025 timestamps) into a
// trace with no dictionary, applies one with --backfill (interrupted once
// and resumed), and compares the report and the triggers with a trace that
// had the dictionary from the start.
func TestBackfillDecidesAsTheStream(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end: skipped with -short")
	}
	const n = 1200
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	brokers := testenv.Kafka(t)
	chA, chB := testenv.ClickHouse(t), testenv.ClickHouse(t)
	fleet := writeFleet(t, n, time.Date(2025, 6, 2, 9, 0, 0, 0, time.UTC))
	dict := simDictionary(t)

	// A: no dictionary at all (the default turned off), no LLM.
	setsA, topicA := appSets(t, brokers, chA.Addr, testenv.NATS(t).URL(), "backfill-a", "analyzer.default_dictionary=false")
	setsA = append(setsA, "clickhouse.database="+chA.Database)
	a := startTestApp(t, setsA)
	if out, err := runCLI(t, ctx, "replay", "--brokers", brokers[0], "--topic", topicA, fleet); err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	stA := chA.Store()
	waitFor(t, "ingest of every rollout", time.Minute, func() (bool, string) {
		got := storedRollouts(t, stA)
		return got == n, fmt.Sprintf("%d of %d stored", got, n)
	})
	waitFor(t, "the analyze stage", time.Minute, func() (bool, string) {
		return groupCaughtUp(t, brokers, "analyze-"+topicA, topicA)
	})
	// Nothing labeled, and the report says why and what to change.
	before := reportJSON(t, ctx, a.cli)
	if len(before) != 3 {
		t.Fatalf("report before the dictionary: %+v", before)
	}
	for _, r := range before {
		if r.Decision != "no labels" || len(r.Reasons) != 1 || !strings.Contains(r.Reasons[0], "no dictionary") ||
			!strings.Contains(r.Reasons[0], "llm.base_url") || !strings.Contains(r.Reasons[0], "--backfill") {
			t.Errorf("report row without labels: %+v", r)
		}
	}

	// The dictionary, stored without a backfill first, then a backfill that
	// is interrupted after its first batch.
	if out, err := runCLI(t, ctx, append([]string{"dict", "apply", dict}, a.cli...)...); err != nil {
		t.Fatalf("dict apply: %v\n%s", err, out)
	}
	reg := analyzer.NewRegistry()
	if err := reg.Load(ctx, stA); err != nil {
		t.Fatal(err)
	}
	bf := &analyzer.Backfill{Store: stA, Registry: reg, Labeler: analyzer.NewRulesLabeler(analyzer.RulesOptions{}), Batch: 100,
		Originals: &ingest.Originals{Brokers: brokers}, Decode: ingest.DecodeRollout(4 << 20)}
	targets, err := bf.Plan(ctx, analyzer.BackfillFilter{Environment: "sim-airline", AgentVersion: "1.4.0"})
	if err != nil || len(targets) != 1 || len(targets[0].Todo) < 200 {
		t.Fatalf("plan: %v %+v", err, targets)
	}
	ictx, interrupt := context.WithCancel(ctx)
	res, err := bf.Run(ictx, targets, func(done int) { interrupt() })
	if !errors.Is(err, context.Canceled) || res.Labeled != 100 || res.Compacted != 0 {
		t.Fatalf("interrupted backfill: %+v, %v", res, err)
	}
	// Its stderr is not a terminal: progress lines, not a bar (it wrote
	// nothing at all, however long the backfill took).
	defer func(d time.Duration) { backfillProgressEvery = d }(backfillProgressEvery)
	backfillProgressEvery = 0
	out, err := runCLI(t, ctx, append([]string{"dict", "apply", dict, "--backfill"}, a.cli...)...)
	if err != nil {
		t.Fatalf("dict apply --backfill: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^backfill: \d+ of \d+ rollouts labeled \(\d+%\), \d+s$`).MatchString(out) {
		t.Errorf("dict apply --backfill wrote no progress line:\n%s", out)
	}
	t.Logf("dict apply --backfill:\n%s", out)
	// Resumed: the 100 rollouts of the first batch are not labeled again.
	labeled := 0
	for _, m := range regexp.MustCompile(`backfill: labeled (\d+) of (\d+) rollouts\n`).FindAllStringSubmatch(out, -1) {
		if m[1] != m[2] {
			t.Errorf("backfill labeled %s of %s", m[1], m[2])
		}
		var k int
		fmt.Sscan(m[1], &k)
		labeled += k
	}
	if !regexp.MustCompile(`backfill sim-airline/1\.4\.0 with dictionary sim-airline/\* v1 \(rules labeler\): \d+ stored, 100 already labeled`).MatchString(out) ||
		labeled != n-100 {
		t.Fatalf("dict apply --backfill did not resume where it stopped (labeled %d, want %d):\n%s", labeled, n-100, out)
	}
	var labelRows uint64
	if err := chA.Conn().QueryRow(ctx, "SELECT count() FROM capability_labels").Scan(&labelRows); err != nil {
		t.Fatal(err)
	}
	if labelRows != 5*n {
		t.Errorf("capability_labels holds %d rows, want %d: one per (rollout, capability), none twice", labelRows, 5*n)
	}
	repA := reportJSON(t, ctx, a.cli)
	firedA := firedTriggers(t, stA)

	// B: the same dictionary from the start, labeled as it streams in.
	setsB, topicB := appSets(t, brokers, chB.Addr, testenv.NATS(t).URL(), "backfill-b", "analyzer.default_dictionary=false", "dictionaries="+dict)
	setsB = append(setsB, "clickhouse.database="+chB.Database)
	b := startTestApp(t, setsB)
	if out, err := runCLI(t, ctx, "replay", "--brokers", brokers[0], "--topic", topicB, fleet); err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	stB := chB.Store()
	var repB []reportRow
	var firedB []string
	waitFor(t, "the streamed run to decide as the backfilled one", 2*time.Minute, func() (bool, string) {
		repB, firedB = reportJSON(t, ctx, b.cli), firedTriggers(t, stB)
		return reflect.DeepEqual(repA, repB) && reflect.DeepEqual(firedA, firedB),
			fmt.Sprintf("\nbackfilled: %+v %v\nstreamed:   %+v %v", repA, firedA, repB, firedB)
	})
	if len(firedA) != 3 {
		t.Errorf("fired %v, want the fleet's 3 planted deficits", firedA)
	}
	for _, r := range repA {
		if r.Decision == "no labels" || r.Watermark.Year() != 2025 {
			t.Errorf("backfilled report row %+v", r)
		}
	}
	t.Logf("fired: %v", firedA)
}

// TestRelabelLLMPricesFirst: with the llm labeler, relabel prints the
// calls and tokens it would spend and makes none without --yes; with --yes
// it makes exactly the calls it announced, and a second run makes none.
func TestRelabelLLMPricesFirst(t *testing.T) {
	const n = 40
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	brokers := testenv.Kafka(t)
	ch := testenv.ClickHouse(t)
	sets, topic := appSets(t, brokers, ch.Addr, testenv.NATS(t).URL(), "relabel-llm", "roles=ingest", "clickhouse.database="+ch.Database)
	a := startTestApp(t, sets)
	if out, err := runCLI(t, ctx, "replay", "--brokers", brokers[0], "--topic", topic, writeFleet(t, n, time.Date(2025, 6, 2, 9, 0, 0, 0, time.UTC))); err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	st := ch.Store()
	waitFor(t, "ingest", time.Minute, func() (bool, string) { got := storedRollouts(t, st); return got == n, fmt.Sprint(got) })
	if out, err := runCLI(t, ctx, append([]string{"dict", "apply", simDictionary(t)}, a.cli...)...); err != nil {
		t.Fatalf("dict apply: %v\n%s", err, out)
	}
	srv := llmtestServer(t)
	llm := append([]string{"--set", "analyzer.labeler=llm", "--set", "llm.base_url=" + srv.URL, "--set", "llm.model=test-model", "--set", "llm.runs=2"}, a.cli...)
	out, err := runCLI(t, ctx, append([]string{"relabel", "--env", "sim-retail"}, llm...)...)
	if !errors.Is(err, errNeedsYes) || len(srv.Requests()) != 0 {
		t.Fatalf("relabel without --yes: err %v, %d model calls\n%s", err, len(srv.Requests()), out)
	}
	m := regexp.MustCompile(`llm labeler \(test-model at \S+\): (\d+) rollouts × up to 2 runs = (\d+) model calls \(retries not counted\), about (\d+) prompt tokens and at most (\d+) completion tokens`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no price printed:\n%s", out)
	}
	var rollouts, calls, prompt int
	fmt.Sscan(m[1], &rollouts)
	fmt.Sscan(m[2], &calls)
	fmt.Sscan(m[3], &prompt)
	if rollouts == 0 || calls != 2*rollouts || prompt < 100*calls {
		t.Fatalf("price: %d rollouts, %d calls, %d prompt tokens", rollouts, calls, prompt)
	}
	out, err = runCLI(t, ctx, append([]string{"relabel", "--env", "sim-retail", "--yes"}, llm...)...)
	if err != nil {
		t.Fatalf("relabel --yes: %v\n%s", err, out)
	}
	if got := len(srv.Requests()); got != calls {
		t.Fatalf("relabel --yes made %d model calls, announced %d\n%s", got, calls, out)
	}
	var labeled uint64
	if err := ch.Conn().QueryRow(ctx, "SELECT uniqExact(rollout_id, run) FROM capability_labels WHERE environment = 'sim-retail' AND source = 'llm'").Scan(&labeled); err != nil {
		t.Fatal(err)
	}
	if int(labeled) != calls {
		t.Fatalf("%d (rollout, run) labeled, want %d", labeled, calls)
	}
	out, err = runCLI(t, ctx, append([]string{"relabel", "--env", "sim-retail", "--yes"}, llm...)...)
	if err != nil || len(srv.Requests()) != calls || !strings.Contains(out, "nothing to label") {
		t.Fatalf("second relabel: err %v, %d model calls in all\n%s", err, len(srv.Requests()), out)
	}
}

func llmtestServer(t *testing.T) *llmtest.Server {
	srv := llmtest.New(t)
	srv.Handle(llmtest.AutoLabels(func(_ llmtest.Request, capability string) string {
		if capability == "argument_grounding" {
			return "LACKING"
		}
		return "PRESENT"
	}))
	return srv
}

// TestRelabelRetriesFailedRuns: runs that failed (here the endpoint refuses
// the model, HTTP 400, as with a wrong llm.model) are recorded and give no
// label; once the endpoint answers, relabel — what trace report tells the
// user to run — labels exactly those runs, and the report no longer counts
// them as failed.
func TestRelabelRetriesFailedRuns(t *testing.T) {
	const n = 12
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	brokers := testenv.Kafka(t)
	ch := testenv.ClickHouse(t)
	sets, topic := appSets(t, brokers, ch.Addr, testenv.NATS(t).URL(), "relabel-failed", "roles=ingest", "clickhouse.database="+ch.Database)
	a := startTestApp(t, sets)
	if out, err := runCLI(t, ctx, "replay", "--brokers", brokers[0], "--topic", topic, writeFleet(t, n, time.Date(2025, 6, 2, 9, 0, 0, 0, time.UTC))); err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	st := ch.Store()
	waitFor(t, "ingest", time.Minute, func() (bool, string) { got := storedRollouts(t, st); return got == n, fmt.Sprint(got) })
	// A dictionary without detectors: the rules labeler would fail every
	// run, and relabel says so before recording any.
	bare := filepath.Join(t.TempDir(), "bare.yaml")
	if err := os.WriteFile(bare, []byte("environment: sim-retail\nagent_version: \"*\"\nversion: 1\ncapabilities:\n"+
		"  - name: policy_constraint_enforcement\n    definition: Refuses the actions the policy forbids, and says why.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, ctx, append([]string{"dict", "apply", bare}, a.cli...)...); err != nil {
		t.Fatalf("dict apply: %v\n%s", err, out)
	}
	out, err := runCLI(t, ctx, append([]string{"relabel", "--env", "sim-retail"}, a.cli...)...)
	if err == nil || !strings.Contains(err.Error(), "no detector") || !strings.Contains(err.Error(), "analyzer.labeler: llm") {
		t.Fatalf("relabel with the rules labeler and no detectors: %v\n%s", err, out)
	}
	if out, err := runCLI(t, ctx, append([]string{"dict", "apply", simDictionary(t)}, a.cli...)...); err != nil {
		t.Fatalf("dict apply: %v\n%s", err, out)
	}
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply {
		return llmtest.Status(400, "The model `wrong-model` does not exist")
	})
	llm := append([]string{"--set", "analyzer.labeler=llm", "--set", "llm.base_url=" + srv.URL, "--set", "llm.model=test-model", "--set", "llm.runs=2"}, a.cli...)
	out, err = runCLI(t, ctx, append([]string{"relabel", "--env", "sim-retail", "--yes"}, llm...)...)
	if err != nil {
		t.Fatalf("relabel against a refusing endpoint: %v\n%s", err, out)
	}
	failedCalls := len(srv.Requests())
	failed := func() int {
		t.Helper()
		frs, err := st.FailedLabelRuns(ctx)
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for _, fr := range frs {
			k += fr.Runs
		}
		return k
	}
	if failedCalls == 0 || failed() != failedCalls {
		t.Fatalf("%d model calls, %d failed runs recorded, want as many (and some)\n%s", failedCalls, failed(), out)
	}

	// The endpoint answers now: relabel tries exactly the failed runs again.
	srv.Handle(llmtest.AutoLabels(func(llmtest.Request, string) string { return "PRESENT" }))
	out, err = runCLI(t, ctx, append([]string{"relabel", "--env", "sim-retail", "--yes"}, llm...)...)
	if err != nil {
		t.Fatalf("relabel after the fix: %v\n%s", err, out)
	}
	if got := len(srv.Requests()) - failedCalls; got != failedCalls {
		t.Fatalf("relabel after the fix made %d model calls, want the %d failed runs again\n%s", got, failedCalls, out)
	}
	var labeled uint64
	if err := ch.Conn().QueryRow(ctx, "SELECT uniqExact(rollout_id, run) FROM capability_labels WHERE environment = 'sim-retail' AND source = 'llm'").Scan(&labeled); err != nil {
		t.Fatal(err)
	}
	if int(labeled) != failedCalls {
		t.Fatalf("%d (rollout, run) labeled, want %d", labeled, failedCalls)
	}
	if k := failed(); k != 0 {
		t.Errorf("%d runs still reported as failed after they were labeled", k)
	}
	calls := len(srv.Requests())
	out, err = runCLI(t, ctx, append([]string{"relabel", "--env", "sim-retail", "--yes"}, llm...)...)
	if err != nil || len(srv.Requests()) != calls || !strings.Contains(out, "nothing to label") {
		t.Fatalf("third relabel: err %v, %d new model calls\n%s", err, len(srv.Requests())-calls, out)
	}
}
