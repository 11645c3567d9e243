package analyzer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type goldenEnv struct {
	brokers []string
	topic   string
	store   *sink.Store
	bus     *bus.Bus
	reg     *analyzer.Registry
	events  []schemas.LabelEvent
	want    []schemas.SelectedCapability
	scope   analyzer.ImportScope
	nats    *testenv.NATSServer
	met     *analyzer.Metrics // the replicas' metrics (nil: none)
}

func setupGolden(t *testing.T) *goldenEnv {
	dir := shareddata.Dir(t, "trace-release/pipeline")
	ctx := context.Background()
	g := &goldenEnv{brokers: testenv.Kafka(t), scope: analyzer.ImportScope{Environment: "tau2-bench", AgentVersion: "qwen3-30b-a3b", DictionaryVersion: 1}}
	g.topic = testenv.UniqueTopic(t, "trace.labels")
	testenv.CreateTopic(t, g.brokers, g.topic, 4)
	ch := testenv.ClickHouse(t)
	g.store = ch.Store()
	var err error
	ns := testenv.NATS(t)
	g.nats = ns
	if g.bus, err = bus.Connect(ctx, bus.Config{URL: ns.URL()}, "test"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.bus.Close)

	raw, _ := os.ReadFile(filepath.Join(dir, "candidate_capabilities.json"))
	cands, err := analyzer.ParseCandidates("candidates", raw)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := analyzer.LoadRuns(filepath.Join(dir, "run_*.json"))
	if err != nil {
		t.Fatal(err)
	}
	g.reg = analyzer.NewRegistry()
	g.reg.Put(analyzer.DictionaryFromCandidates(g.scope, cands))
	g.events = analyzer.RunFileEvents(g.scope, runs)
	raw, _ = os.ReadFile(filepath.Join(dir, "selected_capabilities.json"))
	if err := json.Unmarshal(raw, &g.want); err != nil {
		t.Fatal(err)
	}
	return g
}

func (g *goldenEnv) publish(t *testing.T) {
	w := &kafka.Writer{Addr: kafka.TCP(g.brokers...), Transport: &kafka.Transport{}, Topic: g.topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: 5 * time.Millisecond}
	defer w.Close()
	msgs := make([]kafka.Message, len(g.events))
	for i := range g.events {
		b, _ := json.Marshal(g.events[i])
		msgs[i] = kafka.Message{Key: []byte(g.events[i].Key()), Value: b}
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

// replica is one analyzer process: a label consumer and an evaluator.
func (g *goldenEnv) replica(t *testing.T, ctx context.Context, wg *sync.WaitGroup, group string) *analyzer.Evaluator {
	return g.replicaWith(t, ctx, wg, group, analyzer.EvalConfig{Interval: 500 * time.Millisecond})
}

// replicaWith is replica with the evaluator's configuration.
func (g *goldenEnv) replicaWith(t *testing.T, ctx context.Context, wg *sync.WaitGroup, group string, cfg analyzer.EvalConfig) *analyzer.Evaluator {
	ev := analyzer.NewEvaluator(cfg, g.store, app.BusPublisher{Bus: g.bus}, g.reg, nil, g.met)
	if err := ev.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := stream.NewConsumer(stream.Config{Brokers: g.brokers, Topic: g.topic, GroupID: group, Stage: "analyze",
		BatchRows: 20000, BatchTimeout: 2 * time.Second}, ingest.DecodeLabel,
		&analyzer.LabelEventSink{Store: g.store, Evaluator: ev}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(2)
	go func() { defer wg.Done(); _ = c.Run(ctx) }()
	go func() { defer wg.Done(); _ = ev.Run(ctx) }()
	return ev
}

func (g *goldenEnv) requests(t *testing.T, want int) []*schemas.SynthesisRequest {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := g.bus.JS.Stream(ctx, bus.StreamSynthesis)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if int(info.State.Msgs) >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Let any extra (wrong) publication arrive before reading.
	time.Sleep(1500 * time.Millisecond)
	cons, err := g.bus.JS.OrderedConsumer(ctx, bus.StreamSynthesis, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []*schemas.SynthesisRequest
	for {
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			req, err := schemas.DecodeSynthesisRequest(m.Data())
			if err != nil {
				t.Fatalf("synthesis request does not validate: %v\n%s", err, m.Data())
			}
			if m.Subject() != bus.SynthesisSubject(req.Environment, req.Capability.Skill) {
				t.Errorf("subject %s for %s", m.Subject(), req.Capability.Skill)
			}
			out = append(out, req)
		}
		if n == 0 {
			break
		}
	}
	return out
}

func (g *goldenEnv) check(t *testing.T, reqs []*schemas.SynthesisRequest) {
	t.Helper()
	if len(reqs) != len(g.want) {
		var names []string
		for _, r := range reqs {
			names = append(names, r.Capability.Skill)
		}
		t.Fatalf("%d synthesis requests %v, want %d", len(reqs), names, len(g.want))
	}
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].Capability.MeanDelta > reqs[j].Capability.MeanDelta })
	for i, w := range g.want {
		got := reqs[i].Capability
		if got.Skill != w.Skill || got.NRunsPassed != w.NRunsPassed || fmt.Sprint(got.ExampleFailedCases) != fmt.Sprint(w.ExampleFailedCases) {
			t.Errorf("request %d: %+v\nwant %+v", i, got, w)
		}
		if math.Abs(got.MeanCov-w.MeanCov) > 1e-9 || math.Abs(got.MeanDelta-w.MeanDelta) > 1e-9 {
			t.Errorf("%s: mean cov %.17g delta %.17g, want %.17g %.17g", w.Skill, got.MeanCov, got.MeanDelta, w.MeanCov, w.MeanDelta)
		}
		if reqs[i].Window.Failures != 110 || reqs[i].Window.Rollouts != 164 || reqs[i].Epoch != 1 {
			t.Errorf("%s: window %+v epoch %d", w.Skill, reqs[i].Window, reqs[i].Epoch)
		}
	}
}

func (g *goldenEnv) counts(t *testing.T) string {
	c, err := g.store.WindowCounts(context.Background(), sink.WindowSpec{Cohort: sink.Cohort{Environment: g.scope.Environment, AgentVersion: g.scope.AgentVersion, DictionaryVersion: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(c)
}

// TestGoldenStream streams the TRACE release's 10 labeling runs as label
// events and expects exactly the 6 published selections as synthesis
// requests, then republishes everything and expects nothing new.
func TestGoldenStream(t *testing.T) {
	g := setupGolden(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	g.publish(t) // the stream is in Kafka before the analyzer starts, like a backlog
	g.replica(t, ctx, &wg, "analyzer")
	g.check(t, g.requests(t, 6))
	before := g.counts(t)

	g.publish(t) // at-least-once: the same events again
	time.Sleep(3 * time.Second)
	if after := g.counts(t); after != before {
		t.Fatalf("republishing changed the statistics:\n%s\n%s", before, after)
	}
	g.check(t, g.requests(t, 6))

	// A restarted analyzer recovers its trigger state and fires nothing new.
	cancel()
	wg.Wait()
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	var wg2 sync.WaitGroup
	ev := g.replica(t, ctx2, &wg2, "analyzer")
	ev.Touch(sink.Cohort{Environment: g.scope.Environment, AgentVersion: g.scope.AgentVersion, DictionaryVersion: 1})
	time.Sleep(2 * time.Second)
	g.check(t, g.requests(t, 6))
	cancel2()
	wg2.Wait()
}

// TestGoldenStreamDefaultConfig: the release's runs as external label
// events under the default configuration (the rules labeler, analyzer.k and
// analyzer.n unset) are decided 8 of 10 like the offline selection (`trace
// select`) over the same files: its 6 of 9, not all 9 by the rules
// labeler's 1 of 1.
func TestGoldenStreamDefaultConfig(t *testing.T) {
	g := setupGolden(t)
	cfg, err := config.Load("", []string{"analyzer.interval=500ms"})
	if err != nil {
		t.Fatal(err)
	}
	if an := cfg.Analyzer; an.Labeler != "rules" || an.K != 0 || an.N != 0 {
		t.Fatalf("analyzer.labeler %q, k %d, n %d: the test needs the defaults", an.Labeler, an.K, an.N)
	}
	// The offline selection, as `trace select` makes it.
	dir := shareddata.Dir(t, "trace-release/pipeline")
	raw, err := os.ReadFile(filepath.Join(dir, "candidate_capabilities.json"))
	if err != nil {
		t.Fatal(err)
	}
	cands, err := analyzer.ParseCandidates("candidates", raw)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := analyzer.LoadRuns(filepath.Join(dir, "run_*.json"))
	if err != nil {
		t.Fatal(err)
	}
	inputs, err := analyzer.RunsToInputs(cands, runs)
	if err != nil {
		t.Fatal(err)
	}
	var offline []string
	for _, r := range analyzer.Select(inputs, analyzer.DefaultThresholds) {
		if r.Selected {
			offline = append(offline, r.Name)
		}
	}
	sort.Strings(offline)
	if len(offline) != 6 {
		t.Fatalf("offline selection %v, want 6", offline)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	g.publish(t)
	ev := g.replicaWith(t, ctx, &wg, "analyzer", cfg.Analyzer.EvalConfig)
	reqs := g.requests(t, 6)
	var fired []string
	for _, r := range reqs {
		fired = append(fired, r.Capability.Skill)
	}
	sort.Strings(fired)
	if fmt.Sprint(fired) != fmt.Sprint(offline) {
		t.Fatalf("synthesis requests for %v, the offline selection %v", fired, offline)
	}
	g.check(t, reqs)
	var online []string
	for _, r := range ev.Snapshot()[sink.Cohort{Environment: g.scope.Environment, AgentVersion: g.scope.AgentVersion, DictionaryVersion: 1}] {
		if r.Selected {
			online = append(online, r.Name)
		}
	}
	sort.Strings(online)
	if fmt.Sprint(online) != fmt.Sprint(offline) {
		t.Errorf("the evaluator selects %v, the offline selection %v", online, offline)
	}
	stored, err := g.store.LatestEvaluations(context.Background(), []sink.Cohort{{Environment: g.scope.Environment, AgentVersion: g.scope.AgentVersion, DictionaryVersion: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stored {
		e, err := analyzer.ParseEvaluation(s.Payload)
		if err != nil || e.K != 8 || e.N != 10 || !e.Decided || e.Runs != 10 {
			t.Errorf("stored evaluation (%v): k %d n %d decided %v runs %d, want 8 of 10, decided on 10 runs", err, e.K, e.N, e.Decided, e.Runs)
		}
	}
	if len(stored) != 1 {
		t.Errorf("%d stored evaluations, want 1", len(stored))
	}
}

// TestGoldenStreamTwoReplicas runs two analyzers in one consumer group.
func TestGoldenStreamTwoReplicas(t *testing.T) {
	g := setupGolden(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	g.publish(t)
	g.replica(t, ctx, &wg, "analyzer")
	g.replica(t, ctx, &wg, "analyzer")
	g.check(t, g.requests(t, 6))
}

// TestTriggerSurvivesNATSOutage stops NATS before the capabilities cross
// and starts it again later: the triggers are retried until delivered, none
// is lost and none is duplicated.
func TestTriggerSurvivesNATSOutage(t *testing.T) {
	g := setupGolden(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	reg := prometheus.NewRegistry()
	g.met = analyzer.NewMetrics(reg)
	g.nats.Shutdown()
	g.replica(t, ctx, &wg, "analyzer")
	g.publish(t)
	// Every label is in ClickHouse while NATS is down; nothing could fire.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n uint64
		testenv.StoreConn(t, g.store).QueryRow(context.Background(), "SELECT count() FROM capability_labels").Scan(&n)
		if n >= uint64(len(g.events)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("labels not stored: %d", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // evaluations fail and back off meanwhile
	var fired uint64
	testenv.StoreConn(t, g.store).QueryRow(context.Background(), "SELECT count() FROM trigger_events WHERE event = 'fired'").Scan(&fired)
	if fired != 0 {
		t.Fatalf("%d triggers recorded as fired while NATS was down", fired)
	}
	// The outage shows in the metrics, not only in the log (a request to
	// NATS while it reconnects fails after JetStream's 5 s timeout).
	for deadline := time.Now().Add(30 * time.Second); counterSum(t, reg, "trace_analyzer_evaluation_failures_total") == 0; {
		if time.Now().After(deadline) {
			t.Fatal("trace_analyzer_evaluation_failures_total is still 0 while every evaluation fails")
		}
		time.Sleep(200 * time.Millisecond)
	}
	g.nats.Restart()
	g.check(t, g.requests(t, 6))
	testenv.StoreConn(t, g.store).QueryRow(context.Background(), "SELECT count() FROM trigger_events FINAL WHERE event = 'fired'").Scan(&fired)
	if fired != 6 {
		t.Fatalf("trigger_events has %d fired events, want 6", fired)
	}
}

// failFirstRecord is the real store whose first InsertTriggerEvents fails
// (ClickHouse going away between the publication and its record).
type failFirstRecord struct {
	*sink.Store
	failed atomic.Bool
}

func (s *failFirstRecord) InsertTriggerEvents(ctx context.Context, evs []sink.TriggerEvent) error {
	if len(evs) > 0 && s.failed.CompareAndSwap(false, true) {
		return errors.New("insert trigger_events: connection refused (injected)")
	}
	return s.Store.InsertTriggerEvents(ctx, evs)
}

// TestTriggerCountedOnceWhenItsRecordIsRetried: the requests are published,
// recording them fails, and the retry publishes them again (JetStream drops
// the duplicates). trace_analyzer_triggers_fired_total counts the 6
// requests in the stream, not 12 (it counted every attempt, so a ClickHouse
// blip, or a second replica racing the first, doubled it).
func TestTriggerCountedOnceWhenItsRecordIsRetried(t *testing.T) {
	g := setupGolden(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	reg := prometheus.NewRegistry()
	st := &failFirstRecord{Store: g.store}
	ev := analyzer.NewEvaluator(analyzer.EvalConfig{Interval: 500 * time.Millisecond}, st, app.BusPublisher{Bus: g.bus}, g.reg, nil, analyzer.NewMetrics(reg))
	if err := ev.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := stream.NewConsumer(stream.Config{Brokers: g.brokers, Topic: g.topic, GroupID: "analyzer", Stage: "analyze",
		BatchRows: 20000, BatchTimeout: 2 * time.Second}, ingest.DecodeLabel,
		&analyzer.LabelEventSink{Store: g.store, Evaluator: ev}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(2)
	go func() { defer wg.Done(); _ = c.Run(ctx) }()
	go func() { defer wg.Done(); _ = ev.Run(ctx) }()
	g.publish(t)
	reqs := g.requests(t, 6)
	g.check(t, reqs)
	// Wait for the retried record of the firings.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var fired uint64
		testenv.StoreConn(t, g.store).QueryRow(context.Background(), "SELECT count() FROM trigger_events FINAL WHERE event = 'fired'").Scan(&fired)
		if fired == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("trigger_events has %d fired events, want 6", fired)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !st.failed.Load() {
		t.Fatal("the injected failure did not happen")
	}
	if counted := counterSum(t, reg, "trace_analyzer_triggers_fired_total"); counted != 6 {
		t.Fatalf("trace_analyzer_triggers_fired_total sums to %v, want 6 (one per request in the stream)", counted)
	}
	// The retried records say what the stream holds — the request of the
	// first attempt, fired then — not the retry's recomputation.
	rows, err := testenv.StoreConn(t, g.store).Query(context.Background(), "SELECT trigger_id, at, payload FROM trigger_events FINAL WHERE event = 'fired'")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	sent := map[string]*schemas.SynthesisRequest{}
	for _, r := range reqs {
		sent[r.TriggerID] = r
	}
	for rows.Next() {
		var (
			id, payload string
			at          time.Time
		)
		if err := rows.Scan(&id, &at, &payload); err != nil {
			t.Fatal(err)
		}
		var rec schemas.SynthesisRequest
		if err := json.Unmarshal([]byte(payload), &rec); err != nil {
			t.Fatal(err)
		}
		s := sent[id]
		if s == nil || !rec.FiredAt.Equal(s.FiredAt) || at.Unix() != s.FiredAt.Unix() || rec.Capability.MeanCov != s.Capability.MeanCov { // at: DateTime, seconds
			t.Errorf("trigger %s recorded fired at %s (payload %s, mean_cov %v); the stream's request: %+v", id, at, rec.FiredAt, rec.Capability.MeanCov, s)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// counterSum is the sum of a counter's series in reg.
func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// labelTopic is a labels topic with a LabelEventSink consuming it into a
// ClickHouse store (the labels stage of trace run).
type labelTopic struct {
	ch      *testenv.CH
	st      *sink.Store
	w       *kafka.Writer
	reg     *prometheus.Registry
	written int
}

// newLabelTopic starts the sink on the store, or on what wrap makes of it.
func newLabelTopic(t *testing.T, wrap func(*sink.Store) analyzer.LabelEventStore) *labelTopic {
	t.Helper()
	brokers := testenv.Kafka(t)
	topic := testenv.UniqueTopic(t, "trace.labels")
	testenv.CreateTopic(t, brokers, topic, 1)
	ch := testenv.ClickHouse(t)
	lt := &labelTopic{ch: ch, st: ch.Store(), reg: prometheus.NewRegistry(),
		w: &kafka.Writer{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{}, Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}}
	t.Cleanup(func() { lt.w.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	var store analyzer.LabelEventStore = lt.st
	if wrap != nil {
		store = wrap(lt.st)
	}
	c, err := stream.NewConsumer(stream.Config{Brokers: brokers, Topic: topic, GroupID: "labels", Stage: "labels",
		BatchRows: 100, BatchTimeout: 200 * time.Millisecond}, ingest.DecodeLabel,
		&analyzer.LabelEventSink{Store: store, Metrics: analyzer.NewMetrics(lt.reg)}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { _ = c.Run(ctx) })
	return lt
}

// storeRollout stores a rollout that ended at end, as the ingest stage does.
func (lt *labelTopic) storeRollout(t *testing.T, env, agentVersion, id string, end time.Time) {
	t.Helper()
	ok := false
	r := &schemas.Rollout{RolloutID: id, Environment: env, Agent: schemas.Agent{Name: "a", Version: agentVersion}, TaskID: "t",
		StartTime: end.Add(-time.Minute), EndTime: end, Outcome: schemas.Outcome{Success: &ok}}
	if err := lt.st.InsertRollouts(context.Background(), []sink.RolloutRow{sink.RolloutRowFrom(r, sink.Coord{Topic: "trace.rollouts"})}); err != nil {
		t.Fatal(err)
	}
}

// send publishes label events in messages of time at (one message each)
// and waits until the sink wrote them.
func (lt *labelTopic) send(t *testing.T, at time.Time, evs ...schemas.LabelEvent) {
	t.Helper()
	msgs := make([]kafka.Message, len(evs))
	for i := range evs {
		b, _ := json.Marshal(&evs[i])
		msgs[i] = kafka.Message{Key: []byte(evs[i].Key()), Value: b, Time: at}
	}
	if err := lt.w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	lt.written += len(evs)
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := counterSum(t, lt.reg, "trace_analyzer_labels_written_total")
		if int(n) >= lt.written {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v of %d labels written after 30s", n, lt.written)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// times are the times a rollout's labels were stored at, every delivery's
// (labels_by_time keeps a label placed at two times as two rows), in order.
func (lt *labelTopic) times(t *testing.T, env, id string) []time.Time {
	t.Helper()
	rows, err := lt.ch.Conn().Query(context.Background(), "SELECT DISTINCT ts FROM labels_by_time WHERE environment = ? AND rollout_id = ? ORDER BY ts", env, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []time.Time
	for rows.Next() {
		var ts time.Time
		if err := rows.Scan(&ts); err != nil {
			t.Fatal(err)
		}
		out = append(out, ts.UTC())
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// externalLabel is an external label event of a rollout, without ts.
func externalLabel(env, agentVersion, id, capability string) schemas.LabelEvent {
	return schemas.LabelEvent{Schema: "label/v1", RolloutID: id, Environment: env, AgentVersion: agentVersion, DictionaryVersion: 1,
		Capability: capability, Label: schemas.LabelLacking, Source: schemas.SourceExternal}
}

// TestLabelWithoutTSTakesItsRolloutTime: a label event without ts (as
// `trace labels import` publishes them) of a stored rollout is placed at
// the rollout's stored time, its end time, as the built-in labelers' labels
// are: the same labels published again later (the import run again) stay
// in the rollout's hour and window. They took their message's timestamp,
// each publication its own hour: the hourly rollup counted a label in
// both, and the labels of old rollouts joined the current window.
func TestLabelWithoutTSTakesItsRolloutTime(t *testing.T) {
	lt := newLabelTopic(t, nil)
	ctx := context.Background()
	end := time.Date(2025, 5, 1, 10, 20, 30, 0, time.UTC)
	lt.storeRollout(t, "rollout-time", "v1", "r1", end)
	evs := []schemas.LabelEvent{externalLabel("rollout-time", "v1", "r1", "cap"), externalLabel("rollout-time", "v1", "r1", "cap2")}
	lt.send(t, time.Date(2025, 5, 3, 7, 0, 0, 0, time.UTC), evs...)
	if got := lt.times(t, "rollout-time", "r1"); len(got) != 1 || !got[0].Equal(end) {
		t.Fatalf("labels stored at %v, want their rollout's end time %s", got, end)
	}
	// Imported again two days later: the same identities, another message
	// time.
	lt.send(t, time.Date(2025, 5, 5, 15, 30, 0, 0, time.UTC), evs...)
	if got := lt.times(t, "rollout-time", "r1"); len(got) != 1 || !got[0].Equal(end) {
		t.Fatalf("labels delivered twice stored at %v, want their rollout's end time %s only", got, end)
	}
	if _, err := lt.st.RollupAll(ctx, time.Now().Add(sink.RollupGrace+time.Second)); err != nil {
		t.Fatal(err)
	}
	rows, err := lt.ch.Conn().Query(ctx, `SELECT hour, capability, sum(lf + pf + nf + lp + pp + np) FROM label_hourly FINAL
		WHERE environment = 'rollout-time' AND dicts = 0 GROUP BY hour, capability ORDER BY hour, capability`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var (
			hour time.Time
			c    string
			n    uint64
		)
		if err := rows.Scan(&hour, &c, &n); err != nil {
			t.Fatal(err)
		}
		if end.Before(hour) || !end.Before(hour.Add(time.Hour)) {
			t.Errorf("label_hourly counts %s in the hour of %s; its rollout ended at %s", c, hour.UTC(), end)
		}
		got = append(got, fmt.Sprintf("%s=%d", c, n))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := "[cap=1 cap2=1]"; fmt.Sprint(got) != want {
		t.Fatalf("label_hourly counts %v, want %s (each label once, in its rollout's hour)", got, want)
	}
}

// TestLabelWithoutTSTakesItsMessageTime: a label event without ts whose
// rollout is not stored (labels that arrive before their rollouts) is
// placed at its Kafka message's timestamp, as a rollout without times is,
// so a redelivered event (a crash between the insert and the commit) stays
// in its hour. It took the insert's wall clock: each delivery its own hour,
// and the hourly rollup counted the label in both. A rollout of the same
// id in another cohort is not its rollout.
func TestLabelWithoutTSTakesItsMessageTime(t *testing.T) {
	lt := newLabelTopic(t, nil)
	at := time.Date(2025, 5, 1, 10, 20, 30, 0, time.UTC)
	lt.storeRollout(t, "no-ts", "v2", "no-ts-0", at.Add(-48*time.Hour))
	lt.storeRollout(t, "other", "v1", "no-ts-1", at.Add(-48*time.Hour))
	var evs []schemas.LabelEvent
	for i := range 3 {
		evs = append(evs, externalLabel("no-ts", "v1", fmt.Sprintf("no-ts-%d", i), "cap"))
	}
	lt.send(t, at, evs...)
	for i := range 3 {
		if got := lt.times(t, "no-ts", fmt.Sprintf("no-ts-%d", i)); len(got) != 1 || !got[0].Equal(at) {
			t.Errorf("label of no-ts-%d stored at %v, want its message's time %s", i, got, at)
		}
	}
}

// TestLabelWithTSKeepsIt: a label event with ts is stored at its ts, even
// when its rollout is stored with another time.
func TestLabelWithTSKeepsIt(t *testing.T) {
	lt := newLabelTopic(t, nil)
	end := time.Date(2025, 5, 1, 10, 20, 30, 0, time.UTC)
	lt.storeRollout(t, "with-ts", "v1", "r1", end)
	ev := externalLabel("with-ts", "v1", "r1", "cap")
	ev.TS = end.Add(5 * time.Hour)
	lt.send(t, end.Add(48*time.Hour), ev)
	if got := lt.times(t, "with-ts", "r1"); len(got) != 1 || !got[0].Equal(ev.TS) {
		t.Fatalf("label stored at %v, want its ts %s", got, ev.TS)
	}
}

// failFirstLookup is the store whose first lookup of rollout times fails
// as a connection lost does.
type failFirstLookup struct {
	*sink.Store
	failed atomic.Bool
}

func (s *failFirstLookup) RolloutEndTimes(ctx context.Context, keys []sink.RolloutKey) (map[sink.RolloutKey]time.Time, error) {
	if s.failed.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("rollout end times: %w", io.ErrUnexpectedEOF)
	}
	return s.Store.RolloutEndTimes(ctx, keys)
}

// TestLabelTimeLookupFailureIsRetried: a lookup of the rollouts' times
// that fails loses no label and misplaces none: the batch is retried, as
// when its insert fails, and its labels stored at their rollout's time.
func TestLabelTimeLookupFailureIsRetried(t *testing.T) {
	st := &failFirstLookup{}
	lt := newLabelTopic(t, func(s *sink.Store) analyzer.LabelEventStore { st.Store = s; return st })
	end := time.Date(2025, 5, 1, 10, 20, 30, 0, time.UTC)
	lt.storeRollout(t, "lookup-fails", "v1", "r1", end)
	lt.send(t, end.Add(48*time.Hour), externalLabel("lookup-fails", "v1", "r1", "cap"))
	if !st.failed.Load() {
		t.Fatal("the injected failure did not happen")
	}
	if got := lt.times(t, "lookup-fails", "r1"); len(got) != 1 || !got[0].Equal(end) {
		t.Fatalf("label stored at %v, want its rollout's end time %s", got, end)
	}
}
