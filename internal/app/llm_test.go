package app_test

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

var rolloutIDRe = regexp.MustCompile(`rollout_id: (\S+)`)

// labeledOnceKeyRight waits until the analyze stage has committed the n
// rollouts of a single-run labeling, then checks that no run failed and
// each rollout was labeled once.
func labeledOnceKeyRight(t *testing.T, a *app.App, cfg config.Config, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for committed(t, cfg, cfg.Kafka.AnalyzeGroup) < int64(n) {
		if time.Now().After(deadline) {
			t.Fatal("the analyze stage did not get through the topic once the key was right")
		}
		time.Sleep(100 * time.Millisecond)
	}
	var f, l uint64
	conn := testenv.StoreConn(t, a.Store)
	if err := conn.QueryRow(context.Background(), "SELECT count() FROM label_runs WHERE status = 'failed'").Scan(&f); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(context.Background(), "SELECT uniqExact(rollout_id, run) FROM capability_labels").Scan(&l); err != nil {
		t.Fatal(err)
	}
	if f != 0 || l != uint64(n) {
		t.Fatalf("after the outage: %d runs failed, %d (rollout, run) labeled; want 0 and %d", f, l, n)
	}
}

// labelingOnly is a scripted server's handler for labeling requests:
// discovery is refused, and h gets the id of the rollout in the prompt (a
// prompt without one is refused).
func labelingOnly(h func(req llmtest.Request, id string) llmtest.Reply) func(llmtest.Request) llmtest.Reply {
	return func(req llmtest.Request) llmtest.Reply {
		if _, err := llmtest.SchemaCapabilities(req); err != nil { // discovery
			return llmtest.Status(400, "no discovery in this test")
		}
		m := rolloutIDRe.FindStringSubmatch(req.Chat.Prompt())
		if m == nil {
			return llmtest.Status(400, "no rollout id in the prompt")
		}
		return h(req, m[1])
	}
}

// TestLLMLabelingPipeline runs trace with the llm labeler against a local
// OpenAI-protocol server that answers with the simulator's planted ground
// truth and injects faults: 429, 500, malformed JSON, a missing capability,
// an unknown capability name. Runs that never get a valid answer are
// recorded as failed; the statistics come only from valid answers, and
// every HTTP attempt is audited in llm_calls.
func TestLLMLabelingPipeline(t *testing.T) {
	if testing.Short() {
		t.Skip("pipeline test")
	}
	const n, runs = 120, 3
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, n)
	byID := map[string]*schemas.Rollout{}
	for _, r := range w.rollouts {
		byID[r.RolloutID] = r
	}
	// Rollouts whose every answer is invalid: their runs must fail, unlabeled.
	poisoned := map[string]bool{w.rollouts[5].RolloutID: true, w.rollouts[17].RolloutID: true}

	srv := llmtest.New(t)
	var mu sync.Mutex
	seq := 0
	truthLabel := func(req llmtest.Request, capability string) string {
		m := rolloutIDRe.FindStringSubmatch(req.Chat.Prompt())
		if m == nil {
			return "NA"
		}
		tr, _ := simulate.TruthOf(byID[m[1]])
		if l, ok := tr.Labels[capability]; ok {
			return l
		}
		return "NA"
	}
	auto := llmtest.AutoLabels(truthLabel)
	srv.Handle(func(req llmtest.Request) llmtest.Reply {
		m := rolloutIDRe.FindStringSubmatch(req.Chat.Prompt())
		if m != nil && poisoned[m[1]] {
			return llmtest.Labels(llmtest.Label{Capability: "invented_capability_name", Label: "LACKING"})
		}
		mu.Lock()
		seq++
		k := seq
		mu.Unlock()
		switch k % 11 {
		case 1:
			return llmtest.RateLimitedMS(20)
		case 3:
			return llmtest.ServerError()
		case 5:
			return llmtest.Malformed()
		case 7: // a capability missing
			caps, _ := llmtest.SchemaCapabilities(req)
			if len(caps) == 0 { // not a labeling request (discovery, asked while the default dictionary labels)
				return auto(req)
			}
			var pairs []llmtest.Label
			for _, c := range caps[1:] {
				pairs = append(pairs, llmtest.Label{Capability: c, Label: truthLabel(req, c)})
			}
			return llmtest.Labels(pairs...)
		case 9: // an unknown capability name
			return llmtest.Labels(llmtest.Label{Capability: "Precondition Verification", Label: "LACKING"})
		}
		return auto(req)
	})
	cfg := w.cfg
	cfg.Analyzer.Labeler = "llm"
	cfg.Analyzer.N, cfg.Analyzer.K = runs, 2
	cfg.LLM = config.LLM{BaseURL: srv.URL, Model: "scripted", Timeout: 5 * time.Second, Concurrency: 4, Runs: runs, Structured: "json_schema"}
	a, stop := w.start(t, cfg)

	w.publish(t, 0, n)
	deadline := time.Now().Add(3 * time.Minute)
	for committed(t, cfg, cfg.Kafka.AnalyzeGroup) < int64(n) {
		if time.Now().After(deadline) {
			t.Fatal("the analyze stage did not get through the topic")
		}
		time.Sleep(300 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // the audit writer flushes every second
	ctx := context.Background()
	var poisonLabels uint64
	testenv.StoreConn(t, a.Store).QueryRow(ctx, "SELECT count() FROM capability_labels WHERE rollout_id IN (?, ?)", w.rollouts[5].RolloutID, w.rollouts[17].RolloutID).Scan(&poisonLabels)
	if poisonLabels != 0 {
		t.Fatalf("%d labels invented for rollouts that never got a valid answer", poisonLabels)
	}
	// Every stored label is the planted truth; every run of every rollout
	// that got valid answers is complete.
	var wrong, total uint64
	rows, err := testenv.StoreConn(t, a.Store).Query(ctx, "SELECT rollout_id, capability, run, label FROM capability_labels FINAL")
	if err != nil {
		t.Fatal(err)
	}
	perRollout := map[string]map[uint16]int{}
	for rows.Next() {
		var id, capName, label string
		var run uint16
		if err := rows.Scan(&id, &capName, &run, &label); err != nil {
			t.Fatal(err)
		}
		total++
		tr, _ := simulate.TruthOf(byID[id])
		if tr.Labels[capName] != label {
			wrong++
		}
		if perRollout[id] == nil {
			perRollout[id] = map[uint16]int{}
		}
		perRollout[id][run]++
	}
	rows.Close()
	validRuns := 0
	for id, byRun := range perRollout {
		for run, c := range byRun {
			if c != 5 {
				t.Errorf("rollout %s run %d has %d labels, want all 5 capabilities or none", id, run, c)
			}
			validRuns++
		}
	}
	failedRuns := (n-len(poisoned))*runs - validRuns
	if wrong != 0 || total != uint64(validRuns*5) || failedRuns < 0 || failedRuns > (n-len(poisoned))*runs/5 {
		t.Fatalf("%d of %d labels differ from the truth; %d valid runs, %d failed runs", wrong, total, validRuns, failedRuns)
	}
	t.Logf("%d valid runs, %d runs failed after exhausting their attempts (recorded, not labeled)", validRuns, failedRuns)
	var recordedFailed, recordedOK uint64
	testenv.StoreConn(t, a.Store).QueryRow(ctx, "SELECT countIf(status = 'failed'), countIf(status = 'ok') FROM label_runs FINAL").Scan(&recordedFailed, &recordedOK)
	if recordedFailed != uint64(failedRuns+len(poisoned)*runs) || recordedOK != uint64(validRuns) {
		t.Fatalf("label_runs: %d failed and %d ok recorded, want %d and %d", recordedFailed, recordedOK, failedRuns+len(poisoned)*runs, validRuns)
	}
	// The audit has one row per HTTP attempt with the fault outcomes.
	outcomes := map[string]uint64{}
	r2, err := testenv.StoreConn(t, a.Store).Query(ctx, "SELECT outcome, count() FROM llm_calls GROUP BY outcome")
	if err != nil {
		t.Fatal(err)
	}
	for r2.Next() {
		var o string
		var c uint64
		r2.Scan(&o, &c)
		outcomes[o] = c
	}
	r2.Close()
	var attempts uint64
	for _, c := range outcomes {
		attempts += c
	}
	if attempts != uint64(len(srv.Requests())) {
		t.Fatalf("llm_calls has %d rows for %d HTTP attempts: %v", attempts, len(srv.Requests()), outcomes)
	}
	for _, o := range []string{"ok", "http_429", "http_5xx", "invalid_json", "schema"} {
		if outcomes[o] == 0 {
			t.Errorf("no %s attempt audited: %v", o, outcomes)
		}
	}
	var tokens uint64
	testenv.StoreConn(t, a.Store).QueryRow(ctx, "SELECT sum(prompt_tokens + completion_tokens) FROM llm_calls WHERE outcome = 'ok'").Scan(&tokens)
	if tokens == 0 {
		t.Error("no tokens accounted")
	}
	keys := make([]string, 0, len(outcomes))
	for k := range outcomes {
		keys = append(keys, fmt.Sprintf("%s=%d", k, outcomes[k]))
	}
	sort.Strings(keys)
	t.Logf("%d labels from %d HTTP attempts %v", total, attempts, keys)

	// Redelivery with an LLM whose answers would now differ: nothing is asked
	// again and no statistic changes.
	before := observed(t, a.Store)
	// Labeling requests only: the cohorts are labeled with the default
	// dictionary, so discovery asks the model for dictionaries of their own
	// again after a restart (its requests carry no label schema).
	labelRequests := func() int {
		k := 0
		for _, r := range srv.Requests() {
			if _, err := llmtest.SchemaCapabilities(r); err == nil {
				k++
			}
		}
		return k
	}
	reqs := labelRequests()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	srv.Handle(llmtest.AutoLabels(func(llmtest.Request, string) string { return "LACKING" }))
	cfg2 := cfg
	cfg2.Kafka.AnalyzeGroup += "-again"
	a2, stop2 := w.start(t, cfg2)
	defer stop2()
	deadline = time.Now().Add(time.Minute)
	for committed(t, cfg2, cfg2.Kafka.AnalyzeGroup) < int64(n) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if got := labelRequests() - reqs; got != 0 { // failed runs are recorded too: nothing is asked again
		t.Fatalf("%d requests on redelivery: labeled rollouts must not be labeled again", got)
	}
	if after := observed(t, a2.Store); after != before {
		t.Fatalf("redelivery changed the statistics:\n%s\n%s", before, after)
	}
}

// TestLabelingCallsInFlightAtShutdownAudited: the LLM labeler's calls of
// the batch the analyze stage drains at shutdown are audited in llm_calls:
// the audit writer's last flush comes after the roles that call the LLM
// have stopped.
func TestLabelingCallsInFlightAtShutdownAudited(t *testing.T) {
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	srv := llmtest.New(t)
	asked := make(chan struct{}, 1)
	auto := llmtest.AutoLabels(func(llmtest.Request, string) string { return "NA" })
	srv.Handle(func(req llmtest.Request) llmtest.Reply {
		select {
		case asked <- struct{}{}:
		default:
		}
		return llmtest.Slow(time.Second, auto(req))
	})
	cfg := withRoles(w.cfg, "analyze")
	cfg.Analyzer.Labeler = "llm"
	cfg.Analyzer.N, cfg.Analyzer.K = 1, 1
	cfg.LLM = config.LLM{BaseURL: srv.URL, Model: "scripted", Timeout: 5 * time.Second, Concurrency: 4, Runs: 1, Structured: "json_schema"}
	a, stop := w.start(t, cfg)
	<-a.Ready()
	w.publish(t, 0, 1)
	<-asked // SIGTERM while the rollout is being labeled
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	if got := committed(t, cfg, cfg.Kafka.AnalyzeGroup); got != 1 {
		t.Fatalf("the batch in flight was not drained: %d committed", got)
	}
	if n, calls := llmCalls(t, cfg), len(srv.Requests()); n != uint64(calls) {
		t.Fatalf("llm_calls has %d rows for the labeler's %d calls, the last in flight at shutdown", n, calls)
	}
}

// llmCalls counts the rows of llm_calls in cfg's ClickHouse database.
func llmCalls(t *testing.T, cfg config.Config) uint64 {
	t.Helper()
	st, err := sink.Open(context.Background(), cfg.ClickHouse, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var n uint64
	if err := testenv.StoreConn(t, st).QueryRow(context.Background(), "SELECT count() FROM llm_calls").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLLMCallsOnMetrics: the analyze stage's LLM attempts are counted on
// /metrics by purpose, model and outcome, with their tokens, as they are in
// llm_calls: a 429 that a retry got past and a request refused (400) show
// without a ClickHouse query. Before, /metrics had only label_runs_failed_total,
// so retries (the bill) and their causes were invisible there.
func TestLLMCallsOnMetrics(t *testing.T) {
	const n = 4
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, n)
	srv := llmtest.New(t)
	auto := llmtest.AutoLabels(func(llmtest.Request, string) string { return "NA" })
	refused := w.rollouts[2].RolloutID
	var mu sync.Mutex
	limited := false
	srv.Handle(func(req llmtest.Request) llmtest.Reply {
		if _, err := llmtest.SchemaCapabilities(req); err != nil { // discovery: not counted here
			return llmtest.Status(400, "no discovery in this test")
		}
		if m := rolloutIDRe.FindStringSubmatch(req.Chat.Prompt()); m != nil && m[1] == refused {
			return llmtest.Status(400, "This model's maximum context length is 8192 tokens")
		}
		mu.Lock()
		defer mu.Unlock()
		if !limited {
			limited = true
			return llmtest.RateLimitedMS(1)
		}
		return llmtest.Reply{Content: auto(req).Content, PromptTokens: 1000, CompletionTokens: 50}
	})
	cfg := withRoles(w.cfg, "analyze")
	cfg.Analyzer.Labeler = "llm"
	cfg.Analyzer.N, cfg.Analyzer.K = 1, 1
	cfg.LLM = config.LLM{BaseURL: srv.URL, Model: "scripted", Timeout: 5 * time.Second, Concurrency: 2, Runs: 1, Structured: "json_schema"}
	a, _ := w.start(t, cfg)
	<-a.Ready()
	w.publish(t, 0, n)
	deadline := time.Now().Add(time.Minute)
	for committed(t, cfg, cfg.Kafka.AnalyzeGroup) < n {
		if time.Now().After(deadline) {
			t.Fatal("the analyze stage did not get through the topic")
		}
		time.Sleep(100 * time.Millisecond)
	}
	got := map[string]float64{}
	mfs, err := a.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "trace_llm_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["purpose"] != "label" || l["model"] != "scripted" {
				continue
			}
			got[mf.GetName()+"/"+l["outcome"]+l["kind"]] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"trace_llm_requests_total/ok": n - 1, "trace_llm_requests_total/http_429": 1, "trace_llm_requests_total/http_4xx": 1,
		"trace_llm_tokens_total/prompt": 1000 * (n - 1), "trace_llm_tokens_total/completion": 50 * (n - 1),
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

// TestLLMLabelingFitsSmallContext: a long rollout's labeling prompt that
// exceeds the model's context fails every run with the server's 400
// (context_length_exceeded: not retried, recorded with its reason); with
// llm.max_transcript_chars lowered, its conversation is shortened to fit
// and it is labeled. Before, the 24,000-character transcript budget could
// not be changed, so on a model served with a small context (vLLM's
// --max-model-len 8192) such rollouts could never be labeled.
func TestLLMLabelingFitsSmallContext(t *testing.T) {
	const n, contextChars = 2, 14000
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, n)
	long := w.rollouts[0]
	for i := range 120 {
		long.Messages = append(long.Messages, schemas.Message{Role: "user", Content: fmt.Sprintf("message %d %s", i, strings.Repeat("x", 250))},
			schemas.Message{Role: "assistant", Content: fmt.Sprintf("reply %d %s", i, strings.Repeat("y", 250))})
	}
	srv := llmtest.New(t)
	auto := llmtest.AutoLabels(func(llmtest.Request, string) string { return "NA" })
	srv.Handle(func(req llmtest.Request) llmtest.Reply {
		if _, err := llmtest.SchemaCapabilities(req); err != nil { // discovery
			return llmtest.Status(400, "no discovery in this test")
		}
		if p := req.Chat.Prompt(); len(p) > contextChars {
			return llmtest.Reply{Status: 400, Body: fmt.Sprintf(`{"error":{"message":"This model's maximum context length is 3500 tokens. However, you requested %d tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`, len(p)/4)}
		}
		return auto(req)
	})
	cfg := withRoles(w.cfg, "analyze")
	cfg.Analyzer.Labeler = "llm"
	cfg.Analyzer.N, cfg.Analyzer.K = 2, 1
	cfg.LLM = config.LLM{BaseURL: srv.URL, Model: "scripted", Timeout: 5 * time.Second, Concurrency: 2, Runs: 2, Structured: "json_schema"}
	runs := func(st *sink.Store) (ok, failed uint64, reason string) {
		t.Helper()
		if err := testenv.StoreConn(t, st).QueryRow(context.Background(),
			"SELECT countIf(status = 'ok'), countIf(status = 'failed'), any(reason) FROM label_runs FINAL WHERE rollout_id = ?", long.RolloutID).Scan(&ok, &failed, &reason); err != nil {
			t.Fatal(err)
		}
		return
	}
	through := func(cfg config.Config) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for committed(t, cfg, cfg.Kafka.AnalyzeGroup) < n {
			if time.Now().After(deadline) {
				t.Fatal("the analyze stage did not get through the topic")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	a, stop := w.start(t, cfg) // the default budget: over the context
	<-a.Ready()
	w.publish(t, 0, n)
	through(cfg)
	if ok, failed, reason := runs(a.Store); ok != 0 || failed != 2 || !strings.Contains(reason, "context_length") && !strings.Contains(reason, "maximum context length") {
		t.Fatalf("default budget: %d ok and %d failed runs (reason %q), want 0 and 2 failed with the server's message", ok, failed, reason)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// llm.max_transcript_chars lowered (a database of its own: the failed
	// runs above are recorded, and only trace relabel asks for them again).
	cfg2 := cfg
	cfg2.Kafka.AnalyzeGroup += "-small"
	cfg2.ClickHouse.Database += "_small"
	cfg2.LLM.MaxTranscriptChars = 8000
	a2, _ := w.start(t, cfg2)
	<-a2.Ready()
	through(cfg2)
	if ok, failed, reason := runs(a2.Store); ok != 2 || failed != 0 {
		t.Fatalf("llm.max_transcript_chars 8000: %d ok and %d failed runs (%q), want 2 ok", ok, failed, reason)
	}
	var labels uint64
	if err := testenv.StoreConn(t, a2.Store).QueryRow(context.Background(), "SELECT count() FROM capability_labels WHERE rollout_id = ?", long.RolloutID).Scan(&labels); err != nil || labels == 0 {
		t.Fatalf("no labels for the long rollout (%v)", err)
	}
}

// TestLLMLabelsOfABatchInFlightKept: the llm labeler's answers are written
// while their batch is still being labeled, not only when all of it is: a
// batch of thousands of rollouts takes an LLM hours, and a restart used to
// lose every answer of the batch in flight (nothing was stored, so the
// redelivered batch asked the model again for all of it). Here one rollout
// of the batch never gets an answer; the others' labels are stored all the
// same, and after a restart the model is asked only for the one left.
func TestLLMLabelsOfABatchInFlightKept(t *testing.T) {
	const n = 6
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, n)
	w.oneKey()
	stuck := w.rollouts[n-1].RolloutID
	srv := llmtest.New(t)
	auto := llmtest.AutoLabels(func(llmtest.Request, string) string { return "NA" })
	var mu sync.Mutex
	asked := map[string]int{}
	hang := true
	srv.Handle(labelingOnly(func(req llmtest.Request, id string) llmtest.Reply {
		mu.Lock()
		asked[id]++
		h := hang && id == stuck
		mu.Unlock()
		if h {
			return llmtest.Slow(time.Hour, auto(req)) // until the client goes away
		}
		return auto(req)
	}))
	cfg := withRoles(w.cfg, "analyze")
	cfg.Analyzer.Labeler = "llm"
	cfg.Analyzer.N, cfg.Analyzer.K = 1, 1
	cfg.LLM = config.LLM{BaseURL: srv.URL, Model: "scripted", Timeout: 10 * time.Minute, Concurrency: 4, Runs: 1, Structured: "json_schema"}
	a, stop := w.start(t, cfg)
	<-a.Ready()
	w.publish(t, 0, n)
	labeled := func() uint64 {
		var k uint64
		if err := testenv.StoreConn(t, a.Store).QueryRow(context.Background(), "SELECT uniqExact(rollout_id) FROM capability_labels").Scan(&k); err != nil {
			t.Fatal(err)
		}
		return k
	}
	deadline := time.Now().Add(time.Minute)
	for labeled() < n-1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the %d answered rollouts labeled while their batch waits for the last one", labeled(), n-1)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := stop(); err != nil { // the last rollout is still being labeled
		t.Fatal(err)
	}

	mu.Lock()
	hang = false
	before := maps.Clone(asked)
	mu.Unlock()
	_, stop2 := w.start(t, cfg)
	defer stop2()
	deadline = time.Now().Add(time.Minute)
	for committed(t, cfg, cfg.Kafka.AnalyzeGroup) < n {
		if time.Now().After(deadline) {
			t.Fatal("the analyze stage did not get through the topic after the restart")
		}
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, k := range asked {
		if id != stuck && k != before[id] {
			t.Errorf("rollout %s asked %d times after the restart, though its answer was stored before", id, k-before[id])
		}
	}
	if asked[stuck] <= before[stuck] {
		t.Errorf("the rollout left unanswered was not asked again")
	}
}

// TestLLMLabelingCommitsAsItGoes: under the llm labeler the analyze stage
// takes its backlog a few rounds of analyzer.concurrency rollouts at a
// time, so its offsets move while an LLM works through a long backlog.
// One batch used to hold up to 10,000 rollouts: hours of LLM calls with
// nothing committed (the lag stood still), every one of them decoded in
// memory, all read again after a restart. Here the last rollout of one
// partition never gets an answer; the batches before its own are committed.
func TestLLMLabelingCommitsAsItGoes(t *testing.T) {
	const n = 40
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, n)
	w.oneKey()
	stuck := w.rollouts[n-1].RolloutID
	srv := llmtest.New(t)
	auto := llmtest.AutoLabels(func(llmtest.Request, string) string { return "NA" })
	srv.Handle(func(req llmtest.Request) llmtest.Reply {
		if _, err := llmtest.SchemaCapabilities(req); err != nil { // discovery
			return llmtest.Status(400, "no discovery in this test")
		}
		if m := rolloutIDRe.FindStringSubmatch(req.Chat.Prompt()); m != nil && m[1] == stuck {
			return llmtest.Slow(time.Hour, auto(req)) // until the client goes away
		}
		return auto(req)
	})
	cfg := withRoles(w.cfg, "analyze")
	cfg.Analyzer.Labeler = "llm"
	cfg.Analyzer.N, cfg.Analyzer.K = 1, 1
	cfg.Analyzer.Concurrency = 1 // batches of at most 16
	cfg.LLM = config.LLM{BaseURL: srv.URL, Model: "scripted", Timeout: 10 * time.Minute, Concurrency: 2, Runs: 1, Structured: "json_schema"}
	a, _ := w.start(t, cfg)
	<-a.Ready()
	w.publish(t, 0, n)
	deadline := time.Now().Add(time.Minute)
	for committed(t, cfg, cfg.Kafka.AnalyzeGroup) < n-16 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rollouts committed while the last one waits for its answer, want at least %d", committed(t, cfg, cfg.Kafka.AnalyzeGroup), n, n-16)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestLLMOutageHoldsTheStream: an endpoint that refuses the key (401) can
// answer no rollout, so the analyze stage holds its batch — no run recorded
// as failed, nothing committed — and retries it with backoff; once the key
// is right every rollout is labeled. Before, every rollout of the backlog
// was recorded with all its runs failed (and never asked again but by
// trace relabel) for as long as the key was wrong.
func TestLLMOutageHoldsTheStream(t *testing.T) {
	const n = 6
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, n)
	srv := llmtest.New(t)
	auto := llmtest.AutoLabels(func(llmtest.Request, string) string { return "NA" })
	var refused atomic.Int64
	var wrongKey atomic.Bool
	wrongKey.Store(true)
	srv.Handle(func(req llmtest.Request) llmtest.Reply {
		if _, err := llmtest.SchemaCapabilities(req); err != nil { // discovery
			return llmtest.Status(400, "no discovery in this test")
		}
		if wrongKey.Load() {
			refused.Add(1)
			return llmtest.Status(401, "Incorrect API key provided")
		}
		return auto(req)
	})
	cfg := withRoles(w.cfg, "analyze")
	cfg.Analyzer.Labeler = "llm"
	cfg.Analyzer.N, cfg.Analyzer.K = 2, 2
	cfg.LLM = config.LLM{BaseURL: srv.URL, Model: "scripted", Timeout: 5 * time.Second, Concurrency: 2, Runs: 2, Structured: "json_schema"}
	a, _ := w.start(t, cfg)
	<-a.Ready()
	w.publish(t, 0, n)
	count := func(q string) uint64 {
		var k uint64
		if err := testenv.StoreConn(t, a.Store).QueryRow(context.Background(), q).Scan(&k); err != nil {
			t.Fatal(err)
		}
		return k
	}
	deadline := time.Now().Add(time.Minute)
	for refused.Load() < 3 { // the batch tried and retried
		if time.Now().After(deadline) {
			t.Fatal("the analyze stage did not call the endpoint")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if f, c := count("SELECT count() FROM label_runs WHERE status = 'failed'"), committed(t, cfg, cfg.Kafka.AnalyzeGroup); f != 0 || c != 0 {
		t.Fatalf("with the key refused: %d runs recorded as failed, %d rollouts committed; want 0 and 0", f, c)
	}
	wrongKey.Store(false)
	deadline = time.Now().Add(2 * time.Minute)
	for committed(t, cfg, cfg.Kafka.AnalyzeGroup) < n {
		if time.Now().After(deadline) {
			t.Fatal("the analyze stage did not get through the topic once the key was right")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if f, l := count("SELECT count() FROM label_runs WHERE status = 'failed'"), count("SELECT uniqExact(rollout_id, run) FROM capability_labels"); f != 0 || l != 2*n {
		t.Fatalf("after the outage: %d runs failed, %d (rollout, run) labeled; want 0 and %d", f, l, 2*n)
	}
}

// TestLLMOutageKeepsTheAnswersInFlight: when one rollout's request is
// refused (401) while another rollout of the same batch is waiting for its
// answer, that answer is kept — its labels stored, its run recorded — and
// no further rollout of the batch is started (it would be refused too);
// nothing is committed and no run is recorded as failed. Once the endpoint
// answers, only the runs not stored are asked: the slow rollout never
// again. Before, the refusal was the errgroup's error, which cancelled the
// other rollouts' calls in flight, so answers already paid for were lost
// and asked again, and the batch's next rollout was still sent.
func TestLLMOutageKeepsTheAnswersInFlight(t *testing.T) {
	const n = 3
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, n)
	w.oneKey()
	slow, refusedID, later := w.rollouts[0].RolloutID, w.rollouts[1].RolloutID, w.rollouts[2].RolloutID
	srv := llmtest.New(t)
	auto := llmtest.AutoLabels(func(llmtest.Request, string) string { return "NA" })
	var (
		mu         sync.Mutex
		asked      = map[string]int{}
		laterFirst = -1 // requests for `later` before the slow rollout was answered
		wrongKey   atomic.Bool
		refusals   atomic.Int64
	)
	wrongKey.Store(true)
	slowAsked, refused := make(chan struct{}), make(chan struct{})
	var slowOnce, refusedOnce sync.Once
	srv.Handle(labelingOnly(func(req llmtest.Request, id string) llmtest.Reply {
		mu.Lock()
		asked[id]++
		mu.Unlock()
		switch {
		case id == slow:
			// In flight when the other rollout is refused; answered a
			// second after that.
			slowOnce.Do(func() { close(slowAsked) })
			select {
			case <-refused:
			case <-time.After(20 * time.Second):
			}
			time.Sleep(time.Second)
			mu.Lock()
			if laterFirst < 0 {
				laterFirst = asked[later]
			}
			mu.Unlock()
			return auto(req)
		case wrongKey.Load():
			if id == refusedID {
				select { // refused while the slow rollout's request is in flight
				case <-slowAsked:
				case <-time.After(20 * time.Second):
				}
			}
			refusals.Add(1)
			defer refusedOnce.Do(func() { close(refused) })
			return llmtest.Status(401, "Incorrect API key provided")
		}
		return auto(req)
	}))
	cfg := withRoles(w.cfg, "analyze")
	cfg.Analyzer.Labeler = "llm"
	cfg.Analyzer.N, cfg.Analyzer.K = 1, 1
	cfg.Analyzer.Concurrency = 2 // the slow and the refused rollout at once; the third waits for a slot
	cfg.LLM = config.LLM{BaseURL: srv.URL, Model: "scripted", Timeout: 30 * time.Second, Concurrency: 4, Runs: 1, Structured: "json_schema"}
	a, _ := w.start(t, cfg)
	<-a.Ready()
	w.publish(t, 0, n)
	count := func(q string, args ...any) uint64 {
		t.Helper()
		var k uint64
		if err := testenv.StoreConn(t, a.Store).QueryRow(context.Background(), q, args...).Scan(&k); err != nil {
			t.Fatal(err)
		}
		return k
	}
	deadline := time.Now().Add(time.Minute)
	for count("SELECT count() FROM capability_labels WHERE rollout_id = ?", slow) == 0 || refusals.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("with the key refused: the slow rollout's answer stored: %v, %d refusals; want its labels and the batch retried",
				count("SELECT count() FROM capability_labels WHERE rollout_id = ?", slow) > 0, refusals.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if f, c := count("SELECT count() FROM label_runs WHERE status = 'failed'"), committed(t, cfg, cfg.Kafka.AnalyzeGroup); f != 0 || c != 0 {
		t.Fatalf("with the key refused: %d runs recorded as failed, %d rollouts committed; want 0 and 0", f, c)
	}
	if ok := count("SELECT count() FROM label_runs FINAL WHERE status = 'ok' AND rollout_id = ?", slow); ok != 1 {
		t.Fatalf("the slow rollout's run recorded %d times, want once", ok)
	}
	mu.Lock()
	if laterFirst != 0 {
		t.Errorf("the batch's third rollout was asked %d times before the slow one was answered, though the endpoint had refused the key", laterFirst)
	}
	mu.Unlock()

	wrongKey.Store(false)
	labeledOnceKeyRight(t, a, cfg, n, 2*time.Minute)
	mu.Lock()
	defer mu.Unlock()
	if asked[slow] != 1 {
		t.Errorf("the slow rollout was asked %d times, want once: its answer in flight at the refusal was lost", asked[slow])
	}
}

// TestLLMOutageEndsTheBatchsRetryWaits: once one rollout's request is
// refused (401), the batch's other calls start no further attempt — a
// rollout waiting out a 429's Retry-After (60 s) stops waiting, its run
// neither failed nor given up for a shutdown — so the batch is held and
// retried at once, not a minute later for an attempt that would be
// refused the same way.
func TestLLMOutageEndsTheBatchsRetryWaits(t *testing.T) {
	const n = 2
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, n)
	w.oneKey()
	waiting := w.rollouts[0].RolloutID
	srv := llmtest.New(t)
	auto := llmtest.AutoLabels(func(llmtest.Request, string) string { return "NA" })
	var wrongKey atomic.Bool
	var refusals atomic.Int64
	wrongKey.Store(true)
	limited := make(chan struct{})
	var limitedOnce sync.Once
	srv.Handle(labelingOnly(func(req llmtest.Request, id string) llmtest.Reply {
		if !wrongKey.Load() {
			return auto(req)
		}
		if id == waiting {
			limitedOnce.Do(func() { close(limited) })
			return llmtest.RateLimited("60")
		}
		select { // refused while the other rollout waits out its Retry-After
		case <-limited:
			time.Sleep(200 * time.Millisecond)
		case <-time.After(20 * time.Second):
		}
		refusals.Add(1)
		return llmtest.Status(401, "Incorrect API key provided")
	}))
	cfg := withRoles(w.cfg, "analyze")
	cfg.Analyzer.Labeler = "llm"
	cfg.Analyzer.N, cfg.Analyzer.K = 1, 1
	cfg.Analyzer.Concurrency = 2
	cfg.LLM = config.LLM{BaseURL: srv.URL, Model: "scripted", Timeout: 30 * time.Second, Concurrency: 4, Runs: 1, Structured: "json_schema"}
	a, _ := w.start(t, cfg)
	<-a.Ready()
	w.publish(t, 0, n)
	count := func(q string) uint64 {
		t.Helper()
		var k uint64
		if err := testenv.StoreConn(t, a.Store).QueryRow(context.Background(), q).Scan(&k); err != nil {
			t.Fatal(err)
		}
		return k
	}
	deadline := time.Now().Add(20 * time.Second) // well within the 60 s Retry-After
	for refusals.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d refusals in 20 s: the held batch waited out the other rollout's Retry-After before it was retried", refusals.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if f, c := count("SELECT count() FROM label_runs"), committed(t, cfg, cfg.Kafka.AnalyzeGroup); f != 0 || c != 0 {
		t.Fatalf("with the key refused: %d runs recorded, %d rollouts committed; want 0 and 0", f, c)
	}
	wrongKey.Store(false)
	labeledOnceKeyRight(t, a, cfg, n, time.Minute)
}

// TestLLMClientSendsExtraBody: llm.extra_body reaches the requests of the
// client every llm.* user is made with (app.LLMClient).
func TestLLMClientSendsExtraBody(t *testing.T) {
	srv := llmtest.New(t)
	var body atomic.Value
	srv.Handle(func(req llmtest.Request) llmtest.Reply {
		body.Store(string(req.Body))
		return llmtest.Text(`{"ok": true}`)
	})
	cfg, err := config.Load("", []string{"llm.base_url=" + srv.URL, "llm.model=m", `llm.extra_body={"chat_template_kwargs": {"enable_thinking": false}}`})
	if err != nil {
		t.Fatal(err)
	}
	client, err := app.LLMClient(cfg.LLM, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Chat(context.Background(), llm.Request{Purpose: "test", Messages: []llm.Message{{Role: "user", Content: "hi"}}}); err != nil {
		t.Fatal(err)
	}
	if b, _ := body.Load().(string); !strings.Contains(b, `"chat_template_kwargs":{"enable_thinking":false}`) {
		t.Fatalf("sent %s", b)
	}
}

// TestShutdownDuringRetryAfterIsPrompt: SIGTERM while the LLM labeler waits
// out a 429's Retry-After (60 s) ends the wait: the process stops well
// within the consumers' 8 s drain, the run that was answered is kept, the
// one that was waiting is not recorded as failed, nothing is committed,
// and after a restart only that run is asked again and the rollout is
// labeled and committed. Before, the wait ran on the drained batch's
// context, which ends only at the drain deadline: every such shutdown took
// the whole 8 s.
func TestShutdownDuringRetryAfterIsPrompt(t *testing.T) {
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	srv := llmtest.New(t)
	auto := llmtest.AutoLabels(func(llmtest.Request, string) string { return "NA" })
	var (
		labelReqs atomic.Int64
		limit     atomic.Bool // phase 1: every labeling request after the first is rate limited
	)
	limit.Store(true)
	limited := make(chan struct{}, 1)
	srv.Handle(func(req llmtest.Request) llmtest.Reply {
		if _, err := llmtest.SchemaCapabilities(req); err != nil { // discovery
			return llmtest.Status(400, "no discovery in this test")
		}
		if labelReqs.Add(1) > 1 && limit.Load() {
			select {
			case limited <- struct{}{}:
			default:
			}
			return llmtest.RateLimited("60")
		}
		return auto(req)
	})
	cfg := withRoles(w.cfg, "analyze")
	cfg.Analyzer.Labeler = "llm"
	cfg.Analyzer.N, cfg.Analyzer.K = 2, 2
	cfg.LLM = config.LLM{BaseURL: srv.URL, Model: "scripted", Timeout: 5 * time.Second, Concurrency: 2, Runs: 2, Structured: "json_schema"}
	a, stop := w.start(t, cfg)
	<-a.Ready()
	w.publish(t, 0, 1)
	select {
	case <-limited:
	case <-time.After(time.Minute):
		t.Fatal("the labeler did not call the endpoint")
	}
	time.Sleep(300 * time.Millisecond) // into the 60 s wait
	t0 := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	took := time.Since(t0)
	t.Logf("shutdown during a 60 s Retry-After took %v", took)
	if took > 4*time.Second { // the drain deadline is 8 s; a prompt stop takes well under a second
		t.Fatalf("shutdown took %v: the Retry-After wait held it", took)
	}
	count := func(q string) uint64 {
		t.Helper()
		st, err := sink.Open(context.Background(), cfg.ClickHouse, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		var k uint64
		if err := testenv.StoreConn(t, st).QueryRow(context.Background(), q).Scan(&k); err != nil {
			t.Fatal(err)
		}
		return k
	}
	if c := committed(t, cfg, cfg.Kafka.AnalyzeGroup); c != 0 {
		t.Fatalf("%d committed: the rollout's labeling was not finished", c)
	}
	if f, ok := count("SELECT countIf(status = 'failed') FROM label_runs FINAL"), count("SELECT countIf(status = 'ok') FROM label_runs FINAL"); f != 0 || ok != 1 {
		t.Fatalf("label_runs after the shutdown: %d failed, %d ok; want 0 (the run stopped waiting is not a failure) and 1 (the answer kept)", f, ok)
	}
	if n, calls := llmCalls(t, cfg), len(srv.Requests()); n != uint64(calls) {
		t.Fatalf("llm_calls has %d rows for %d requests", n, calls)
	}

	// After a restart the rollout is labeled: only the run not answered is asked.
	limit.Store(false)
	before := labelReqs.Load()
	a2, stop2 := w.start(t, cfg)
	<-a2.Ready()
	deadline := time.Now().Add(time.Minute)
	for committed(t, cfg, cfg.Kafka.AnalyzeGroup) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the restarted analyze stage did not label the rollout")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
	if f, ok := count("SELECT countIf(status = 'failed') FROM label_runs FINAL"), count("SELECT countIf(status = 'ok') FROM label_runs FINAL"); f != 0 || ok != 2 {
		t.Fatalf("label_runs after the restart: %d failed, %d ok; want 0 and 2", f, ok)
	}
	if asked := labelReqs.Load() - before; asked != 1 {
		t.Fatalf("the restart asked %d labeling requests, want 1 (the run not answered before)", asked)
	}
}
