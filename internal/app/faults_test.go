package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer/envprog"
)

// TestMain also lets the test binary serve as envprog's sandbox worker (the
// serve role's environment server runs stored programs sandboxed).
func TestMain(m *testing.M) {
	envprog.RunWorkerIfRequested()
	testenv.Main(m)
}

// world is one trace process (ingest + analyze roles) on test servers.
type world struct {
	cfg      config.Config
	rollouts []*schemas.Rollout
	truth    string // expected window counts of every cohort
}

func newWorld(t *testing.T, chAddr string, n int) *world {
	t.Helper()
	brokers := testenv.Kafka(t)
	ns := testenv.NATS(t)
	topic := testenv.UniqueTopic(t, "rollouts")
	testenv.CreateTopic(t, brokers, topic, 4)
	testenv.CreateTopic(t, brokers, topic+".dlq", 1)
	labels := testenv.UniqueTopic(t, "labels")
	testenv.CreateTopic(t, brokers, labels, 1)
	testenv.CreateTopic(t, brokers, labels+".dlq", 1)
	cfg, err := config.Load("", []string{
		"data_dir=" + t.TempDir(), "roles=ingest,analyze", "http.addr=127.0.0.1:0", "kafka.brokers=" + brokers[0],
		"kafka.rollouts_topic=" + topic, "kafka.labels_topic=" + labels, "kafka.dlq_topic=" + topic + ".dlq",
		"kafka.ingest_group=ingest-" + topic, "kafka.analyze_group=analyze-" + topic, "kafka.labels_group=labels-" + topic,
		"kafka.batch_rows=500", "kafka.batch_timeout=100ms",
		"clickhouse.addr=" + chAddr, "clickhouse.database=" + sanitize(topic), "nats.url=" + ns.URL(),
		"analyzer.k=1", "analyzer.n=1", "analyzer.interval=500ms", "analyzer.window=8760h",
	})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{cfg: cfg}
	gen := simulate.New(simulate.Config{Seed: 7, Rollouts: n, Start: time.Now().Add(-time.Duration(n) * time.Second), Interval: time.Second})
	for r := gen.Next(); r != nil; r = gen.Next() {
		w.rollouts = append(w.rollouts, r)
	}
	w.truth = groundTruth(t, w.rollouts)
	return w
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	return "t_" + string(b)
}

// groundTruth labels every rollout in-process with the rules labeler and
// counts like the window query does.
func groundTruth(t *testing.T, rs []*schemas.Rollout) string {
	dicts, err := analyzer.BuiltinDictionaries()
	if err != nil {
		t.Fatal(err)
	}
	reg := analyzer.NewRegistry()
	for _, d := range dicts {
		reg.Put(d)
	}
	lab := analyzer.NewRulesLabeler(analyzer.RulesOptions{})
	type key struct{ c sink.Cohort }
	counts := map[sink.Cohort]map[string]*sink.RunCounts{}
	ids := map[sink.Cohort]map[string][]string{}
	for _, r := range rs {
		d := reg.Resolve(r.Environment, r.Agent.Version)
		runs, err := lab.Label(context.Background(), d, r)
		if err != nil {
			t.Fatal(err)
		}
		c := sink.Cohort{Environment: r.Environment, AgentVersion: r.Agent.Version, DictionaryVersion: d.Version}
		if counts[c] == nil {
			counts[c], ids[c] = map[string]*sink.RunCounts{}, map[string][]string{}
		}
		for _, ev := range analyzer.Events(d, r, "rules", runs) {
			rc := counts[c][ev.Capability]
			if rc == nil {
				rc = &sink.RunCounts{Capability: ev.Capability}
				counts[c][ev.Capability] = rc
			}
			switch {
			case !ev.Success && ev.Label == schemas.LabelLacking:
				rc.LackingFailed++
				ids[c][ev.Capability] = append(ids[c][ev.Capability], ev.RolloutID)
			case !ev.Success && ev.Label == schemas.LabelPresent:
				rc.PresentFailed++
			case !ev.Success:
				rc.NAFailed++
			case ev.Label == schemas.LabelLacking:
				rc.LackingPassed++
			case ev.Label == schemas.LabelPresent:
				rc.PresentPassed++
			default:
				rc.NAPassed++
			}
		}
	}
	var out []string
	for c, m := range counts {
		var caps []string
		for name := range m {
			caps = append(caps, name)
		}
		sort.Strings(caps)
		var rcs []sink.RunCounts
		for _, name := range caps {
			rc := *m[name]
			ex := ids[c][name]
			sort.Strings(ex)
			if len(ex) > sink.MaxExampleIDs {
				ex = ex[:sink.MaxExampleIDs]
			}
			rc.LackingFailedFirst = ex
			if rc.LackingFailedFirst == nil {
				rc.LackingFailedFirst = []string{}
			}
			rcs = append(rcs, rc)
		}
		out = append(out, fmt.Sprintf("%s %v", c, rcs))
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}

// observed reads the same from ClickHouse.
func observed(t *testing.T, st *sink.Store) string {
	ctx := context.Background()
	cohorts, err := st.Cohorts(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range cohorts {
		rcs, err := st.WindowCounts(ctx, sink.WindowSpec{Cohort: c})
		if err != nil {
			t.Fatal(err)
		}
		for i := range rcs {
			if rcs[i].LackingFailedFirst == nil {
				rcs[i].LackingFailedFirst = []string{}
			}
		}
		out = append(out, fmt.Sprintf("%s %v", c, rcs))
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}

// oneKey gives every rollout the first one's cohort, so that all go to
// one partition, in order, and are fetched in one batch when few.
func (w *world) oneKey() {
	for _, r := range w.rollouts {
		r.Environment, r.Agent.Version = w.rollouts[0].Environment, w.rollouts[0].Agent.Version
	}
}

func (w *world) publish(t *testing.T, from, to int) {
	t.Helper()
	kw := &kafka.Writer{Addr: kafka.TCP(w.cfg.Kafka.Brokers...), Transport: &kafka.Transport{}, Topic: w.cfg.Kafka.RolloutsTopic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 200}
	defer kw.Close()
	var msgs []kafka.Message
	for _, r := range w.rollouts[from:to] {
		b, _ := json.Marshal(r)
		msgs = append(msgs, kafka.Message{Key: []byte(r.Key()), Value: b})
	}
	if err := kw.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

// start runs an app until the returned stop function is called.
func (w *world) start(t *testing.T, cfg config.Config) (*app.App, func() error) {
	t.Helper()
	return w.startLogged(t, cfg, nil)
}

// startLogged is start with the app's log (warnings and errors) also
// written to logs.
func (w *world) startLogged(t *testing.T, cfg config.Config, logs io.Writer) (*app.App, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out io.Writer = testLog{t}
	if logs != nil {
		out = io.MultiWriter(out, logs)
	}
	a, err := app.Start(ctx, cfg, slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
			a.Close()
		})
		return runErr
	}
	t.Cleanup(func() { stop() })
	return a, stop
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) { l.t.Log(string(p)); return len(p), nil }

func (w *world) waitComplete(t *testing.T, st *sink.Store, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var rollouts, labeled uint64
		errA := testenv.StoreConn(t, st).QueryRow(context.Background(), "SELECT uniqExact(rollout_id) FROM rollouts").Scan(&rollouts)
		errB := testenv.StoreConn(t, st).QueryRow(context.Background(), "SELECT uniqExact(rollout_id) FROM capability_labels").Scan(&labeled)
		if errA == nil && errB == nil && rollouts == uint64(len(w.rollouts)) && labeled == uint64(len(w.rollouts)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %d rollouts and %d labeled rollouts stored, want %d (%v %v)", timeout, rollouts, labeled, len(w.rollouts), errA, errB)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// exactlyOnce checks every rollout is present once (logically) and the
// statistics equal the ground truth.
func (w *world) exactlyOnce(t *testing.T, st *sink.Store) {
	t.Helper()
	ctx := context.Background()
	var final, distinct, successes uint64
	if err := testenv.StoreConn(t, st).QueryRow(ctx, "SELECT count(), uniqExact(rollout_id), sum(success) FROM rollouts FINAL").Scan(&final, &distinct, &successes); err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, r := range w.rollouts {
		if r.Succeeded() {
			want++
		}
	}
	if final != uint64(len(w.rollouts)) || distinct != final || successes != uint64(want) {
		t.Fatalf("rollouts FINAL: %d rows, %d distinct, %d successes; want %d, %d", final, distinct, successes, len(w.rollouts), want)
	}
	// The materialized view's block lands just after the source table's.
	var mvTotal, mvSucc uint64
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err := testenv.StoreConn(t, st).QueryRow(ctx, "SELECT uniqExactMerge(rollouts), uniqExactIfMerge(successes) FROM rollout_counts").Scan(&mvTotal, &mvSucc); err != nil {
			t.Fatal(err)
		}
		if mvTotal == uint64(len(w.rollouts)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if mvTotal != uint64(len(w.rollouts)) || mvSucc != uint64(want) {
		t.Fatalf("rollout_counts: %d rollouts %d successes, want %d %d", mvTotal, mvSucc, len(w.rollouts), want)
	}
	// The window statistics read labels_by_time, a materialized view whose
	// block also lands just after its source's (capability_labels, which
	// waitComplete counted): they may lag for a moment, never converge to
	// the truth when a label was lost or counted twice.
	got := observed(t, st)
	for deadline := time.Now().Add(10 * time.Second); got != w.truth && time.Now().Before(deadline); got = observed(t, st) {
		time.Sleep(100 * time.Millisecond)
	}
	if got != w.truth {
		t.Fatalf("window statistics differ from the ground truth:\n got %s\nwant %s", got, w.truth)
	}
}

// TestClickHouseKilledMidStream kills the ClickHouse server while rollouts
// stream in and restarts it 5 s later: consumers back off without
// committing, then every rollout is present once and the statistics equal
// the ground truth.
func TestClickHouseKilledMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	ch := testenv.OwnClickHouse(t)
	w := newWorld(t, ch.Addr(), 3000)
	a, stop := w.start(t, w.cfg)
	w.publish(t, 0, 1000)
	time.Sleep(500 * time.Millisecond)
	if err := ch.Kill(); err != nil {
		t.Fatal(err)
	}
	w.publish(t, 1000, 3000) // keeps streaming while ClickHouse is down
	time.Sleep(5 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ch.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	w.waitComplete(t, a.Store, 2*time.Minute)
	w.exactlyOnce(t, a.Store)
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestCancelBetweenInsertAndCommit stops the ingest and analyze consumers
// after their first batch is in ClickHouse but before its offsets are
// committed, then restarts trace: the redelivered batch duplicates nothing
// in any statistic.
func TestCancelBetweenInsertAndCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 2000)
	w.publish(t, 0, 2000)
	// The same infrastructure as trace, but consumers whose sinks cancel the
	// run right after a durable write and outlive the drain deadline, so no
	// commit happens.
	a, stop := w.start(t, withRoles(w.cfg, "serve"))
	dicts := a.Dicts
	wrote := 0
	for _, stage := range []string{"ingest", "analyze"} {
		ctx, cancel := context.WithCancel(context.Background())
		cc := stream.Config{Brokers: w.cfg.Kafka.Brokers, Topic: w.cfg.Kafka.RolloutsTopic, DLQTopic: w.cfg.Kafka.DLQTopic,
			GroupID: w.cfg.Kafka.IngestGroup, Stage: stage, BatchRows: 300, BatchTimeout: 100 * time.Millisecond, DrainTimeout: 300 * time.Millisecond}
		var run func(context.Context) error
		var err error
		if stage == "ingest" {
			// The ingest stage as trace runs it: rows streamed by RowSink.
			var c *stream.Consumer[*sink.RolloutRow]
			c, err = stream.NewConsumer(cc, ingest.DecodeRolloutRow(0),
				stream.Sink[*sink.RolloutRow](&cancelAfterCommit{RowSink: &ingest.RowSink{Store: a.Store}, cancel: cancel, wrote: &wrote}), nil, nil)
			if c != nil {
				run = c.Run
			}
		} else {
			cc.GroupID = w.cfg.Kafka.AnalyzeGroup
			inner := &analyzer.LabelingSink{Labeler: analyzer.NewRulesLabeler(analyzer.RulesOptions{}), Registry: dicts, Store: a.Store}
			var c *stream.Consumer[*schemas.Rollout]
			c, err = stream.NewConsumer(cc, ingest.DecodeRollout(0), stream.SinkFunc[*schemas.Rollout](func(wctx context.Context, batch []stream.Record[*schemas.Rollout]) error {
				if err := inner.Write(wctx, batch); err != nil {
					return err
				}
				wrote += len(batch)
				cancel()
				<-wctx.Done() // the drain deadline passes: no commit
				return wctx.Err()
			}), nil, nil)
			if c != nil {
				run = c.Run
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := run(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Logf("%s consumer: %v", stage, err)
		}
		cancel()
	}
	if wrote == 0 {
		t.Fatal("no batch was written before the cancellation")
	}
	stop()
	// Restart trace with the same groups: the uncommitted batches come again.
	a2, stop2 := w.start(t, w.cfg)
	w.waitComplete(t, a2.Store, 2*time.Minute)
	var rows uint64
	testenv.StoreConn(t, a2.Store).QueryRow(context.Background(), "SELECT count() FROM rollouts").Scan(&rows)
	t.Logf("%d rollouts written before the cancel; %d rows in rollouts for %d rollouts", wrote, rows, len(w.rollouts))
	w.exactlyOnce(t, a2.Store)
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
}

// cancelAfterCommit is RowSink whose first durable INSERT cancels the run;
// the commit then outlives the drain deadline, so no offset is committed.
type cancelAfterCommit struct {
	*ingest.RowSink
	cancel func()
	wrote  *int
}

func (s *cancelAfterCommit) Begin(ctx context.Context) (stream.Stream[*sink.RolloutRow], error) {
	st, err := s.RowSink.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &cancelStream{Stream: st, ctx: ctx, s: s}, nil
}

type cancelStream struct {
	stream.Stream[*sink.RolloutRow]
	ctx  context.Context
	s    *cancelAfterCommit
	rows int
}

func (st *cancelStream) Add(recs []stream.Record[*sink.RolloutRow]) error {
	st.rows += len(recs)
	return st.Stream.Add(recs)
}

func (st *cancelStream) Commit() error {
	if err := st.Stream.Commit(); err != nil {
		return err
	}
	*st.s.wrote += st.rows
	st.s.cancel()
	<-st.ctx.Done() // the drain deadline passes: no commit
	return st.ctx.Err()
}

func withRoles(c config.Config, roles ...string) config.Config {
	c.Roles = roles
	c.HTTP.Addr = "127.0.0.1:0"
	return c
}

// TestReplayFromZeroChangesNothing replays the whole topic from offset 0
// with new consumer groups: the statistics are unchanged.
func TestReplayFromZeroChangesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 2000)
	a, stop := w.start(t, w.cfg)
	w.publish(t, 0, 2000)
	w.waitComplete(t, a.Store, 2*time.Minute)
	w.exactlyOnce(t, a.Store)
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	cfg2 := w.cfg
	cfg2.Kafka.IngestGroup += "-replay"
	cfg2.Kafka.AnalyzeGroup += "-replay"
	a2, stop2 := w.start(t, cfg2)
	// Wait until both new groups committed the whole topic: every rollout
	// and label was written a second time.
	deadline := time.Now().Add(2 * time.Minute)
	for committed(t, w.cfg, cfg2.Kafka.IngestGroup) < 2000 || committed(t, w.cfg, cfg2.Kafka.AnalyzeGroup) < 2000 {
		if time.Now().After(deadline) {
			t.Fatalf("the replay groups did not consume the topic")
		}
		time.Sleep(300 * time.Millisecond)
	}
	time.Sleep(time.Second) // let the evaluator see the rewritten labels
	w.exactlyOnce(t, a2.Store)
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
}

// committed sums a group's committed offsets on the rollouts topic.
func committed(t *testing.T, cfg config.Config, group string) int64 {
	t.Helper()
	c := &kafka.Client{Addr: kafka.TCP(cfg.Kafka.Brokers...), Timeout: 5 * time.Second}
	res, err := c.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: group,
		Topics: map[string][]int{cfg.Kafka.RolloutsTopic: {0, 1, 2, 3}}})
	if err != nil {
		return 0
	}
	var n int64
	for _, p := range res.Topics[cfg.Kafka.RolloutsTopic] {
		if p.CommittedOffset > 0 {
			n += p.CommittedOffset
		}
	}
	return n
}

// TestDictionaryHotReload: a dictionary applied from another process (as
// `trace dict apply` does) reaches a running analyzer through the NATS KV
// announcement, without a restart.
func TestDictionaryHotReload(t *testing.T) {
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	a, stop := w.start(t, withRoles(w.cfg, "analyze"))
	defer stop()
	before := a.Dicts.Resolve("sim-airline", "9.9.9")
	if before == nil {
		t.Fatal("the built-in dictionary is not loaded")
	}
	// Another process: its own store connection, bus and registry.
	st, err := sink.Open(context.Background(), sink.Config{Addr: []string{ch.Addr}, Database: w.cfg.ClickHouse.Database}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b, err := bus.Connect(context.Background(), bus.Config{URL: w.cfg.NATS.URL}, "other")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	reg := analyzer.NewRegistry()
	if err := reg.Load(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	d := *before
	d.Capabilities = append([]analyzer.Capability{}, before.Capabilities...)
	d.Capabilities[0].Definition += " Updated for the hot-reload test."
	d.Source, d.CreatedAt = "", time.Time{}
	stored, err := reg.Apply(context.Background(), st, b, &d)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Version != before.Version+1 {
		t.Fatalf("a changed dictionary must become version %d, got %d", before.Version+1, stored.Version)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.Dicts.Resolve("sim-airline", "9.9.9").Version != stored.Version {
		if time.Now().After(deadline) {
			t.Fatalf("running analyzer still on version %d", a.Dicts.Resolve("sim-airline", "9.9.9").Version)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
