package stream_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
)

// ---------------------------------------------------------------------------
// Test sink: an in-memory implementation of stream.Sink (our own interface,
// not Kafka) that can fail retryably N times, fail fatally, block, or run a
// hook after recording a batch.

var errTransient = errors.New("sink temporarily unavailable")

type testSink[T any] struct {
	mu        sync.Mutex
	recs      []stream.Record[T] // every record of every successful write, in order
	writes    int                // successful writes
	calls     int                // all Write calls
	failN     int                // the next failN calls fail with errTransient
	fatal     error              // when set, every call fails with it
	block     chan struct{}      // when set, Write blocks until it is closed (ignoring ctx if ignoreCtx)
	ignoreCtx bool
	onFail    func(call int)                         // after a failed call
	after     func(ctx context.Context, n int) error // after a successful write was recorded; its error is returned
	batches   [][]int64                              // offsets of each Write call's batch (all calls)
}

func (s *testSink[T]) Write(ctx context.Context, batch []stream.Record[T]) error {
	s.mu.Lock()
	s.calls++
	call := s.calls
	offs := make([]int64, len(batch))
	for i, r := range batch {
		offs[i] = r.Offset
	}
	s.batches = append(s.batches, offs)
	block := s.block
	s.mu.Unlock()

	if block != nil {
		if s.ignoreCtx {
			<-block
		} else {
			select {
			case <-block:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}

	s.mu.Lock()
	var err error
	switch {
	case s.fatal != nil:
		err = s.fatal
	case s.failN > 0:
		s.failN--
		err = errTransient
	}
	if err != nil {
		onFail := s.onFail
		s.mu.Unlock()
		if onFail != nil {
			onFail(call)
		}
		return err
	}
	s.recs = append(s.recs, batch...)
	s.writes++
	n := len(s.recs)
	after := s.after
	s.mu.Unlock()
	if after != nil {
		return after(ctx, n)
	}
	return nil
}

func (s *testSink[T]) records() []stream.Record[T] {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.recs)
}

func (s *testSink[T]) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recs)
}

func (s *testSink[T]) stats() (writes, calls int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes, s.calls
}

// ---------------------------------------------------------------------------
// Helpers.

// strDecoder accepts any value that does not start with "bad".
func strDecoder(v []byte) (string, error) {
	if bytes.HasPrefix(v, []byte("bad")) {
		return "", fmt.Errorf("rejected %q", v)
	}
	return string(v), nil
}

func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("TRACE_TEST_VERBOSE") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

type env struct {
	brokers []string
	topic   string
	dlq     string
	group   string
}

// newEnv creates a source topic with parts partitions and a one-partition DLQ
// topic (kfake does not create topics on use).
func newEnv(t *testing.T, parts int) env {
	t.Helper()
	brokers := testenv.Kafka(t)
	e := env{brokers: brokers, topic: testenv.UniqueTopic(t, "src")}
	e.dlq = e.topic + ".dlq"
	e.group = "g-" + e.topic
	testenv.CreateTopic(t, brokers, e.topic, parts)
	testenv.CreateTopic(t, brokers, e.dlq, 1)
	return e
}

func (e env) config() stream.Config {
	return stream.Config{
		Brokers:        e.brokers,
		Topic:          e.topic,
		GroupID:        e.group,
		DLQTopic:       e.dlq,
		Stage:          "test",
		BatchRows:      100,
		BatchTimeout:   100 * time.Millisecond,
		BackoffInitial: 20 * time.Millisecond,
		BackoffMax:     200 * time.Millisecond,
		DrainTimeout:   3 * time.Second,
		LagInterval:    100 * time.Millisecond,
	}
}

// produce writes msgs to the source topic (acks=all).
func (e env) produce(t *testing.T, msgs ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{
		Addr:         kafka.TCP(e.brokers...),
		Topic:        e.topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
		BatchBytes:   16 << 20,
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err := w.WriteMessages(ctx, msgs...)
		if err == nil {
			return
		}
		// Apache Kafka's metadata can lag behind a just-created topic.
		if !errors.Is(err, kafka.UnknownTopicOrPartition) && !errors.Is(err, kafka.LeaderNotAvailable) || ctx.Err() != nil {
			t.Fatalf("produce: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// produceN writes values prefix-0 .. prefix-(n-1), keyed k<i%13>.
func (e env) produceN(t *testing.T, prefix string, n int) []string {
	t.Helper()
	vals := make([]string, n)
	msgs := make([]kafka.Message, n)
	for i := range n {
		vals[i] = fmt.Sprintf("%s-%d", prefix, i)
		msgs[i] = kafka.Message{Key: []byte("k" + strconv.Itoa(i%13)), Value: []byte(vals[i])}
	}
	e.produce(t, msgs...)
	return vals
}

// committed returns the group's committed offset per partition (-1: none).
func (e env) committed(t *testing.T) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(e.brokers...)}
	res, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: e.group, Topics: map[string][]int{e.topic: e.partitions(t)}})
	if err != nil {
		t.Fatalf("OffsetFetch: %v", err)
	}
	out := map[int]int64{}
	for _, p := range res.Topics[e.topic] {
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

func (e env) partitions(t *testing.T) []int {
	t.Helper()
	conn, err := kafka.Dial("tcp", e.brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ps, err := conn.ReadPartitions(e.topic)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int
	for _, p := range ps {
		ids = append(ids, p.ID)
	}
	return ids
}

// committedTotal is the sum of committed offsets: the number of messages
// committed when every partition starts at offset 0.
func (e env) committedTotal(t *testing.T) int64 {
	var n int64
	for _, o := range e.committed(t) {
		if o > 0 {
			n += o
		}
	}
	return n
}

// readDLQ reads every message of the one-partition DLQ topic until want
// messages were read or the timeout passes.
func (e env) readDLQ(t *testing.T, want int) []kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: e.brokers, Topic: e.dlq, Partition: 0, MaxBytes: 16 << 20, MaxWait: 200 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var out []kafka.Message
	for len(out) < want {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read DLQ after %d of %d messages: %v", len(out), want, err)
		}
		out = append(out, m)
	}
	return out
}

type running struct {
	cancel context.CancelFunc
	done   chan error
	ctx    context.Context
}

// start runs c until the returned cancel; the test's cleanup stops it.
func start[T any](t *testing.T, c *stream.Consumer[T]) *running {
	t.Helper()
	r := newRunning()
	launch(t, r, c)
	return r
}

// newRunning prepares the context of a Run, for sinks that cancel it.
func newRunning() *running {
	ctx, cancel := context.WithCancel(context.Background())
	return &running{cancel: cancel, done: make(chan error, 1), ctx: ctx}
}

// launch runs c under r.
func launch[T any](t *testing.T, r *running, c *stream.Consumer[T]) {
	t.Helper()
	go func() { r.done <- c.Run(r.ctx) }()
	t.Cleanup(func() {
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(15 * time.Second):
			t.Errorf("Run did not return 15s after cancel")
		}
	})
}

// stop cancels and returns Run's result and how long it took to return.
func (r *running) stop(t *testing.T) (time.Duration, error) {
	t.Helper()
	t0 := time.Now()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return time.Since(t0), err
	case <-time.After(15 * time.Second):
		t.Fatalf("Run did not return 15s after cancel")
		return 0, nil
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func newConsumer[T any](t *testing.T, cfg stream.Config, dec stream.Decoder[T], sink stream.Sink[T], m *stream.Metrics) *stream.Consumer[T] {
	t.Helper()
	c, err := stream.NewConsumer(cfg, dec, sink, testLogger(t), m)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func header(m kafka.Message, key string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// ---------------------------------------------------------------------------
// Tests.

func TestConsumerConfigValidate(t *testing.T) {
	good := stream.Config{Brokers: []string{"127.0.0.1:9092"}, Topic: "t", GroupID: "g"}.WithDefaults()
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	if good.DLQTopic != "t.dlq" || good.BatchRows != 10000 || good.BatchBytes != 64<<20 || good.BatchTimeout != time.Second ||
		good.DecodeWorkers < 1 || good.MaxMessageBytes <= 4<<20 || good.BackoffInitial != 200*time.Millisecond ||
		good.BackoffMax != 10*time.Second || good.DrainTimeout != 8*time.Second || good.StartOffset != kafka.FirstOffset ||
		good.Stage != "ingest" || good.IsRetryable == nil || good.DLQMaxValueBytes != 4<<20 {
		t.Fatalf("defaults: %+v", good)
	}
	tests := []struct {
		field string
		mod   func(*stream.Config)
	}{
		{"Brokers", func(c *stream.Config) { c.Brokers = nil }},
		{"Brokers[0]", func(c *stream.Config) { c.Brokers = []string{""} }},
		{"Topic", func(c *stream.Config) { c.Topic = "" }},
		{"GroupID", func(c *stream.Config) { c.GroupID = "" }},
		{"DLQTopic", func(c *stream.Config) { c.DLQTopic = c.Topic }},
		{"BatchRows", func(c *stream.Config) { c.BatchRows = -1 }},
		{"BatchBytes", func(c *stream.Config) { c.BatchBytes = -1 }},
		{"BatchTimeout", func(c *stream.Config) { c.BatchTimeout = -time.Second }},
		{"DecodeWorkers", func(c *stream.Config) { c.DecodeWorkers = -2 }},
		{"BackoffMax", func(c *stream.Config) { c.BackoffMax = time.Millisecond }},
		{"DrainTimeout", func(c *stream.Config) { c.DrainTimeout = -1 }},
		{"StartOffset", func(c *stream.Config) { c.StartOffset = 42 }},
		{"DLQMaxValueBytes", func(c *stream.Config) { c.DLQMaxValueBytes = -1 }},
	}
	for _, tt := range tests {
		c := good
		tt.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "Config."+tt.field) {
			t.Errorf("%s: Validate() = %v, want an error naming Config.%s", tt.field, err, tt.field)
		}
	}
	if _, err := stream.NewConsumer(stream.Config{Topic: "t", GroupID: "g"}, strDecoder, &testSink[string]{}, nil, nil); err == nil {
		t.Error("NewConsumer accepted a config without brokers")
	}
	if !stream.DefaultIsRetryable(errTransient) || stream.DefaultIsRetryable(fmt.Errorf("wrapped: %w", stream.Fatal(errTransient))) {
		t.Error("DefaultIsRetryable: want transient retryable and Fatal(...) not")
	}
}

// validRollout returns a valid rollout whose id is id.
func validRollout(id string) []byte {
	return []byte(strings.Replace(rolloutTemplate, `"rollout_id":"r1"`, `"rollout_id":"`+id+`"`, 1))
}

const rolloutTemplate = `{"rollout_id":"r1","environment":"tau2-airline","agent":{"name":"a","version":"v1"},"task_id":"7",` +
	`"start_time":"2026-01-01T00:00:00Z","end_time":"2026-01-01T00:01:00Z","outcome":{"reward":0.5},` +
	`"messages":[{"role":"system","content":"policy"},{"role":"user","content":"hi"},` +
	`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","name":"get_user","arguments":{"user_id":"u1"}}]},` +
	`{"role":"tool","tool_call_id":"c1","content":"{}","error":false},` +
	`{"role":"assistant","content":"done"}]}`

func TestConsumerDeadLettersMalformedRollouts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	const maxBytes = 16 << 10
	mod := func(old, new string) []byte {
		s := string(validRollout("bad"))
		if !strings.Contains(s, old) {
			t.Fatalf("fixture does not contain %q", old)
		}
		return []byte(strings.Replace(s, old, new, 1))
	}
	bad := []struct {
		name   string
		value  []byte
		reason string
	}{
		{"not json", []byte("this is not json"), schemas.ReasonNotJSON},
		{"truncated json", validRollout("x")[:120], schemas.ReasonNotJSON},
		{"empty", []byte{}, schemas.ReasonEmpty},
		{"whitespace only", []byte(" \n\t "), schemas.ReasonEmpty},
		{"invalid utf8", mod(`"hi"`, "\"h\xff\xfei\""), schemas.ReasonInvalidUTF8},
		{"NaN reward", mod(`"reward":0.5`, `"reward":NaN`), schemas.ReasonNonFiniteReward},
		{"Infinity reward", mod(`"reward":0.5`, `"reward":Infinity`), schemas.ReasonNonFiniteReward},
		{"-Infinity reward", mod(`"reward":0.5`, `"reward":-Infinity`), schemas.ReasonNonFiniteReward},
		{"1e999 reward", mod(`"reward":0.5`, `"reward":1e999`), schemas.ReasonNonFiniteReward},
		{"reward as string", mod(`"reward":0.5`, `"reward":"0.5"`), schemas.ReasonSchema},
		{"missing rollout_id", mod(`"rollout_id":"bad",`, ``), schemas.ReasonSchema},
		{"missing agent", mod(`"agent":{"name":"a","version":"v1"},`, ``), schemas.ReasonSchema},
		{"bad role", mod(`"role":"user"`, `"role":"robot"`), schemas.ReasonSchema},
		{"tool message without tool_call_id", mod(`"tool_call_id":"c1",`, ``), schemas.ReasonSchema},
		{"arguments not an object", mod(`"arguments":{"user_id":"u1"}`, `"arguments":["u1"]`), schemas.ReasonSchema},
		{"messages empty", mod(`"messages":[{"role":"system","content":"policy"},{"role":"user","content":"hi"},`+
			`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","name":"get_user","arguments":{"user_id":"u1"}}]},`+
			`{"role":"tool","tool_call_id":"c1","content":"{}","error":false},{"role":"assistant","content":"done"}]`, `"messages":[]`), schemas.ReasonSchema},
		{"null messages", mod(`"messages":[`, `"messages":null,"x":[`), schemas.ReasonSchema},
		{"too large", mod(`"content":"policy"`, `"content":"`+strings.Repeat("p", maxBytes)+`"`), schemas.ReasonTooLarge},
		{"top-level array", []byte(`[` + string(validRollout("arr")) + `]`), schemas.ReasonSchema},
		{"top-level string", []byte(`"rollout"`), schemas.ReasonSchema},
		{"bad date", mod(`"2026-01-01T00:00:00Z"`, `"2026-13-45 25:61"`), schemas.ReasonSchema},
		{"agent.version a number", mod(`"version":"v1"`, `"version":1`), schemas.ReasonSchema},
		{"trailing garbage", append(validRollout("trail"), []byte(" }garbage")...), schemas.ReasonNotJSON},
		{"two documents", append(validRollout("two"), validRollout("docs")...), schemas.ReasonNotJSON},
		{"BOM-prefixed", append([]byte("\xef\xbb\xbf"), validRollout("bom")...), schemas.ReasonNotJSON},
		{"environment with a slash", mod(`"environment":"tau2-airline"`, `"environment":"tau2/airline"`), schemas.ReasonSchema},
		{"single quotes", []byte(strings.ReplaceAll(string(validRollout("sq")), `"`, `'`)), schemas.ReasonNotJSON},
		{"null document", []byte("null"), schemas.ReasonSchema},
		// A repeated member name is ambiguous (which value is meant?),
		// wherever it is: dead-lettered with the JSON path of the repeat.
		{"repeated environment", mod(`"environment":"tau2-airline"`, `"environment":"tau2-airline","environment":"other"`), schemas.ReasonDuplicateKey},
		{"repeated rollout_id", mod(`"rollout_id":"bad"`, `"rollout_id":"bad","rollout_id":"bad"`), schemas.ReasonDuplicateKey},
		{"repeated key in arguments", mod(`"arguments":{"user_id":"u1"}`, `"arguments":{"user_id":"u1","user_\u0069d":"u2"}`), schemas.ReasonDuplicateKey},
		{"repeated key in metadata", mod(`"task_id":"7",`, `"task_id":"7","metadata":{"a":{"b":1,"b":2}},`), schemas.ReasonDuplicateKey},
	}
	duplicatePaths := map[string]string{"repeated environment": "/environment", "repeated rollout_id": "/rollout_id",
		"repeated key in arguments": "/messages/2/tool_calls/0/arguments/user_id", "repeated key in metadata": "/metadata/a/b"}
	if len(bad) < 20 {
		t.Fatalf("only %d malformed kinds", len(bad))
	}
	// Valid and invalid interleaved, across partitions; keys carry the case.
	var msgs []kafka.Message
	wantValid := map[string]bool{}
	for i := range 40 {
		id := fmt.Sprintf("ok-%d", i)
		wantValid[id] = true
		msgs = append(msgs, kafka.Message{Key: []byte("valid-" + id), Value: validRollout(id)})
		if i < len(bad) {
			msgs = append(msgs, kafka.Message{Key: []byte("bad-" + strconv.Itoa(i)), Value: bad[i].value,
				Headers: []kafka.Header{{Key: "producer", Value: []byte("test")}}})
		}
	}
	e.produce(t, msgs...)

	reg := prometheus.NewRegistry()
	met := stream.NewMetrics(reg)
	sink := &testSink[*schemas.Rollout]{}
	dec := func(v []byte) (*schemas.Rollout, error) {
		return schemas.DecodeRollout(v, schemas.DecodeOptions{MaxBytes: maxBytes})
	}
	cfg := e.config()
	cfg.BatchRows = 16 // several batches, each with valid and invalid messages
	c := newConsumer(t, cfg, dec, sink, met)
	run := start(t, c)

	waitFor(t, 20*time.Second, "every message committed", func() bool { return e.committedTotal(t) == int64(len(msgs)) })
	if took, err := run.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	} else {
		t.Logf("Run returned %v after cancel", took)
	}

	// Every valid rollout reached the sink, nothing else did.
	got := map[string]int{}
	for _, r := range sink.records() {
		got[r.Value.RolloutID]++
		if string(r.Key) != "valid-"+r.Value.RolloutID || r.Topic != e.topic || r.Size == 0 || r.Time.IsZero() {
			t.Errorf("record coordinates: %+v", r)
		}
	}
	for id := range wantValid {
		if got[id] == 0 {
			t.Errorf("valid rollout %s did not reach the sink", id)
		}
	}
	if len(got) != len(wantValid) {
		t.Errorf("sink got %d distinct rollouts, want %d", len(got), len(wantValid))
	}

	// Every invalid one is in the DLQ, bytes untouched, with its reason.
	dead := e.readDLQ(t, len(bad))
	byKey := map[string]kafka.Message{}
	for _, m := range dead {
		byKey[string(m.Key)] = m
	}
	source := map[string]kafka.Message{}
	for _, m := range msgs {
		source[string(m.Key)] = m
	}
	for i, b := range bad {
		key := "bad-" + strconv.Itoa(i)
		m, ok := byKey[key]
		if !ok {
			t.Errorf("%s: not in the DLQ", b.name)
			continue
		}
		if !bytes.Equal(m.Value, b.value) {
			t.Errorf("%s: DLQ value differs from the original (%d vs %d bytes)", b.name, len(m.Value), len(b.value))
		}
		if r, _ := header(m, stream.HeaderErrorReason); r != b.reason {
			errh, _ := header(m, stream.HeaderError)
			t.Errorf("%s: reason %q, want %q (error %q)", b.name, r, b.reason, errh)
		}
		if p, ok := duplicatePaths[b.name]; ok {
			if errh, _ := header(m, stream.HeaderError); !strings.Contains(errh, strconv.Quote(p)) {
				t.Errorf("%s: error %q does not name the path %s", b.name, errh, p)
			}
		}
		for _, h := range []string{stream.HeaderError, stream.HeaderStage, stream.HeaderSourceTopic,
			stream.HeaderSourcePartition, stream.HeaderSourceOffset, stream.HeaderFailedAt, "producer"} {
			if v, ok := header(m, h); !ok || v == "" {
				t.Errorf("%s: header %s missing", b.name, h)
			}
		}
		if v, _ := header(m, stream.HeaderStage); v != "test" {
			t.Errorf("%s: stage %q", b.name, v)
		}
		if v, _ := header(m, stream.HeaderSourceTopic); v != e.topic {
			t.Errorf("%s: source topic %q", b.name, v)
		}
		if v, _ := header(m, stream.HeaderFailedAt); v != "" {
			if _, err := time.Parse(time.RFC3339, v); err != nil {
				t.Errorf("%s: failed-at %q: %v", b.name, v, err)
			}
		}
		if _, ok := header(m, stream.HeaderOriginalSize); ok {
			t.Errorf("%s: value should not have been dropped", b.name)
		}
	}
	// The source coordinates point at the original message.
	for _, m := range dead {
		p, _ := header(m, stream.HeaderSourcePartition)
		o, _ := header(m, stream.HeaderSourceOffset)
		pi, _ := strconv.Atoi(p)
		oi, _ := strconv.ParseInt(o, 10, 64)
		orig := readAt(t, e.brokers, e.topic, pi, oi)
		if !bytes.Equal(orig.Key, m.Key) || !bytes.Equal(orig.Value, m.Value) {
			t.Errorf("DLQ message %q: source %s/%s holds key %q", m.Key, p, o, orig.Key)
		}
	}
	if n := metricValue(t, reg, "trace_consumer_dead_lettered_total", "reason", schemas.ReasonSchema); n == 0 {
		t.Error("dead_lettered_total{reason=schema} is 0")
	}
	if n := metricValue(t, reg, "trace_consumer_messages_consumed_total"); n != float64(len(msgs)) {
		t.Errorf("messages_consumed_total = %v, want %d", n, len(msgs))
	}
	if n := metricValue(t, reg, "trace_consumer_dead_lettered_total", "reason", schemas.ReasonDuplicateKey); n != 4 {
		t.Errorf("dead_lettered_total{reason=duplicate_key} = %v, want 4", n)
	}

	// A second consumer of the same group gets nothing old: all was
	// committed. (A sentinel produced after it started shows it is live.)
	sink2 := &testSink[*schemas.Rollout]{}
	c2 := newConsumer(t, cfg, dec, sink2, nil)
	run2 := start(t, c2)
	e.produce(t, kafka.Message{Key: []byte("valid-sentinel"), Value: validRollout("sentinel")})
	waitFor(t, 20*time.Second, "the sentinel", func() bool { return sink2.count() > 0 })
	if _, err := run2.stop(t); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	if recs := sink2.records(); len(recs) != 1 || recs[0].Value.RolloutID != "sentinel" {
		t.Fatalf("a second consumer of the group got %d records (want only the sentinel) after everything was committed", len(recs))
	}
}

// readAt reads the message at partition/offset of topic.
func readAt(t *testing.T, brokers []string, topic string, partition int, offset int64) kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: partition, MaxBytes: 16 << 20, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(offset); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := r.ReadMessage(ctx)
	if err != nil {
		t.Fatalf("read %s/%d@%d: %v", topic, partition, offset, err)
	}
	return m
}

func TestConsumerDeadLetterTooLargeForDLQTopic(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	e := env{brokers: brokers, topic: testenv.UniqueTopic(t, "src")}
	e.dlq, e.group = e.topic+".dlq", "g-"+e.topic
	testenv.CreateTopic(t, brokers, e.topic, 1)
	// A DLQ topic that accepts at most 8 KiB per record batch.
	createTopicWithConfig(t, brokers, e.dlq, 1, map[string]string{"max.message.bytes": "8192"})

	huge := make([]byte, 20000)
	if _, err := rand.Read(huge); err != nil { // incompressible, and not UTF-8
		t.Fatal(err)
	}
	huge[0] = 'x'
	e.produce(t,
		kafka.Message{Key: []byte("a"), Value: []byte("good-1")},
		kafka.Message{Key: []byte("big"), Value: huge},
		kafka.Message{Key: []byte("small"), Value: []byte("bad small")},
		kafka.Message{Key: []byte("p"), Value: []byte("PANIC")},
		kafka.Message{Key: []byte("b"), Value: []byte("good-2")},
	)
	dec := func(v []byte) (string, error) {
		if string(v) == "PANIC" {
			panic("decoder bug")
		}
		if len(v) > 1000 {
			return "", errors.New("value too long")
		}
		return strDecoder(v)
	}
	sink := &testSink[string]{}
	c := newConsumer(t, e.config(), dec, sink, nil)
	run := start(t, c)
	waitFor(t, 20*time.Second, "commit", func() bool { return e.committedTotal(t) == 5 })
	if _, err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := sink.records(); len(got) != 2 || got[0].Value != "good-1" || got[1].Value != "good-2" {
		t.Fatalf("sink got %+v", got)
	}
	dead := e.readDLQ(t, 3)
	for _, m := range dead {
		reason, _ := header(m, stream.HeaderErrorReason)
		switch string(m.Key) {
		case "big":
			size, _ := header(m, stream.HeaderOriginalSize)
			why, _ := header(m, stream.HeaderDLQError)
			if len(m.Value) != 0 || size != "20000" || why == "" || reason != stream.ReasonDecode {
				t.Errorf("oversized dead letter: %d value bytes, original size %q, dlq error %q, reason %q", len(m.Value), size, why, reason)
			}
		case "small":
			if string(m.Value) != "bad small" || reason != stream.ReasonDecode {
				t.Errorf("small dead letter: %q reason %q", m.Value, reason)
			}
		case "p":
			if string(m.Value) != "PANIC" || reason != stream.ReasonPanic {
				t.Errorf("panicking dead letter: %q reason %q", m.Value, reason)
			}
		default:
			t.Errorf("unexpected dead letter %q", m.Key)
		}
	}
}

func createTopicWithConfig(t *testing.T, brokers []string, topic string, parts int, cfg map[string]string) {
	t.Helper()
	var entries []kafka.ConfigEntry
	for k, v := range cfg {
		entries = append(entries, kafka.ConfigEntry{ConfigName: k, ConfigValue: v})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(brokers...)}
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: parts, ReplicationFactor: 1, ConfigEntries: entries}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Errors[topic]; err != nil {
		t.Fatal(err)
	}
	testenv.CreateTopic(t, brokers, topic, parts) // waits for the leaders; the topic exists already
}

func TestConsumerRetriesRetryableSinkErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	vals := e.produceN(t, "m", 20)
	reg := prometheus.NewRegistry()
	met := stream.NewMetrics(reg)
	var committedWhileFailing []int64
	sink := &testSink[string]{failN: 3}
	sink.onFail = func(int) { committedWhileFailing = append(committedWhileFailing, e.committedTotal(t)) }
	c := newConsumer(t, e.config(), strDecoder, sink, met)
	run := start(t, c)
	waitFor(t, 20*time.Second, "commit after the retries", func() bool { return e.committedTotal(t) == 20 })
	if _, err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	writes, calls := sink.stats()
	if calls != writes+3 {
		t.Fatalf("%d calls, %d successful writes: want 3 failed calls", calls, writes)
	}
	for i, n := range committedWhileFailing {
		if n != 0 {
			t.Errorf("failed attempt %d: %d messages committed while the sink was failing", i+1, n)
		}
	}
	// The failed batch was retried as is: the first successful write holds
	// the same offsets as the three failed calls.
	sink.mu.Lock()
	first := sink.batches[0]
	for i := 1; i <= 3; i++ {
		if !slices.Equal(sink.batches[i], first) {
			t.Errorf("retry %d wrote offsets %v, first attempt %v", i, sink.batches[i], first)
		}
	}
	sink.mu.Unlock()
	// Written once each.
	seen := map[string]int{}
	for _, r := range sink.records() {
		seen[r.Value]++
	}
	for _, v := range vals {
		if seen[v] != 1 {
			t.Errorf("%s written %d times", v, seen[v])
		}
	}
	if n := metricValue(t, reg, "trace_consumer_sink_retries_total"); n != 3 {
		t.Errorf("sink_retries_total = %v, want 3", n)
	}
	if n := metricValue(t, reg, "trace_consumer_records_inserted_total"); n != 20 {
		t.Errorf("records_inserted_total = %v, want 20", n)
	}
}

func TestConsumerFatalSinkErrorStopsWithoutCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produceN(t, "m", 10)
	errSchema := errors.New("column type mismatch")
	sink := &testSink[string]{fatal: errSchema}
	cfg := e.config()
	cfg.IsRetryable = func(err error) bool { return !errors.Is(err, errSchema) }
	c := newConsumer(t, cfg, strDecoder, sink, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t0 := time.Now()
	err := c.Run(ctx)
	if !errors.Is(err, errSchema) {
		t.Fatalf("Run = %v, want the sink's fatal error", err)
	}
	t.Logf("Run returned %v after %v", err, time.Since(t0))
	if _, calls := sink.stats(); calls != 1 {
		t.Errorf("sink called %d times; a fatal error must not be retried", calls)
	}
	if n := e.committedTotal(t); n != 0 {
		t.Fatalf("%d messages committed after a fatal sink error", n)
	}
	// Fatal() works with the default classification too.
	sink2 := &testSink[string]{fatal: stream.Fatal(errSchema)}
	c2 := newConsumer(t, e.config(), strDecoder, sink2, nil)
	if err := c2.Run(ctx); !errors.Is(err, errSchema) || !stream.IsFatal(err) {
		t.Fatalf("Run = %v, want Fatal(errSchema)", err)
	}
	if n := e.committedTotal(t); n != 0 {
		t.Fatalf("%d messages committed after a fatal sink error", n)
	}
}

// Cancelling Run while a batch is being written lets that batch finish,
// commit included (the drain): nothing is redelivered.
func TestConsumerDrainCommitsTheBatchInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produceN(t, "m", 10)
	sink := &testSink[string]{}
	run := newRunning()
	sink.after = func(ctx context.Context, n int) error {
		run.cancel() // the shutdown signal arrives while the sink is writing
		time.Sleep(200 * time.Millisecond)
		return nil
	}
	launch(t, run, newConsumer(t, e.config(), strDecoder, sink, nil))
	var err error
	select {
	case err = <-run.done:
		run.done <- err
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return")
	}
	if err != nil {
		t.Fatalf("Run = %v, want nil after a clean drain", err)
	}
	if n := e.committedTotal(t); n != 10 {
		t.Fatalf("committed %d, want the drained batch (10) committed", n)
	}
}

// When the commit cannot happen after a successful write (here: the drain
// deadline passes between the sink write and the commit), the batch is
// redelivered after a restart: at-least-once.
func TestConsumerRedeliversWhenCancelledBetweenWriteAndCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	vals := e.produceN(t, "m", 15)
	sink := &testSink[string]{}
	cfg := e.config()
	cfg.DrainTimeout = 500 * time.Millisecond
	run := newRunning()
	sink.after = func(ctx context.Context, n int) error {
		// Recorded (durable in the "sink"); now the process is told to stop,
		// and the commit does not make it within the drain deadline.
		run.cancel()
		<-ctx.Done()
		return nil
	}
	launch(t, run, newConsumer(t, cfg, strDecoder, sink, nil))
	if err := <-run.done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	run.done <- nil
	first := sink.records()
	if len(first) == 0 {
		t.Fatal("nothing written before the cancellation")
	}
	if n := e.committedTotal(t); n != 0 {
		t.Fatalf("committed %d; the commit should have missed the drain deadline", n)
	}

	// Restart in the same group: the same records come again.
	sink2 := &testSink[string]{}
	c2 := newConsumer(t, e.config(), strDecoder, sink2, nil)
	run2 := start(t, c2)
	waitFor(t, 20*time.Second, "all committed after the restart", func() bool { return e.committedTotal(t) == int64(len(vals)) })
	if _, err := run2.stop(t); err != nil {
		t.Fatal(err)
	}
	again := map[string]bool{}
	for _, r := range sink2.records() {
		again[r.Value] = true
	}
	for _, r := range first {
		if !again[r.Value] {
			t.Errorf("record %s (offset %d) was not redelivered", r.Value, r.Offset)
		}
	}
	for _, v := range vals {
		if !again[v] {
			t.Errorf("record %s missing after the restart", v)
		}
	}
}

func TestConsumerShutdownIdleReturnsQuickly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	e.produceN(t, "m", 5)
	sink := &testSink[string]{}
	cfg := e.config()
	cfg.DrainTimeout = stream.DefaultDrainTimeout // the production bound
	c := newConsumer(t, cfg, strDecoder, sink, nil)
	run := start(t, c)
	waitFor(t, 20*time.Second, "the topic drained", func() bool { return e.committedTotal(t) == 5 })
	time.Sleep(1500 * time.Millisecond) // idle on a drained topic: the reader sits in fetch long-polls
	took, err := run.stop(t)
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	t.Logf("idle shutdown took %v", took)
	if took > 10*time.Second {
		t.Fatalf("Run returned %v after cancel; must be < 10s", took)
	}
}

// A sink that ignores its context does not hold the process past the drain.
func TestConsumerShutdownWithStuckSink(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produceN(t, "m", 5)
	release := make(chan struct{})
	defer close(release)
	sink := &testSink[string]{block: release, ignoreCtx: true}
	cfg := e.config()
	cfg.DrainTimeout = time.Second
	c := newConsumer(t, cfg, strDecoder, sink, nil)
	run := start(t, c)
	waitFor(t, 20*time.Second, "the sink to be called", func() bool { _, calls := sink.stats(); return calls > 0 })
	took, err := run.stop(t)
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	t.Logf("shutdown with a stuck sink took %v (DrainTimeout %v)", took, cfg.DrainTimeout)
	if took > cfg.DrainTimeout+1500*time.Millisecond {
		t.Fatalf("Run returned %v after cancel, want about DrainTimeout + 1s", took)
	}
	if n := e.committedTotal(t); n != 0 {
		t.Fatalf("committed %d with the sink stuck", n)
	}
}

// While the sink blocks, the consumer stops fetching: it holds at most about
// three batches (writing, queued, filling), and the lag gauge shows the
// backlog. Released, it delivers everything.
func TestConsumerBackpressureBoundsFetching(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	const n = 3000
	vals := e.produceN(t, "m", n)
	reg := prometheus.NewRegistry()
	met := stream.NewMetrics(reg)
	release := make(chan struct{})
	sink := &testSink[string]{block: release}
	cfg := e.config()
	cfg.BatchRows = 100
	c := newConsumer(t, cfg, strDecoder, sink, met)
	run := start(t, c)
	waitFor(t, 20*time.Second, "the sink to be called", func() bool { _, calls := sink.stats(); return calls > 0 })
	waitFor(t, 5*time.Second, "a lag reading", func() bool { return lagTotal(t, reg) == n })
	time.Sleep(500 * time.Millisecond)
	consumed := metricValue(t, reg, "trace_consumer_messages_consumed_total")
	t.Logf("fetched %v of %d messages while the sink was blocked", consumed, n)
	if consumed > 3*float64(cfg.BatchRows) {
		t.Fatalf("fetched %v messages while the sink was blocked; want at most 3 batches (%d)", consumed, 3*cfg.BatchRows)
	}
	if n := e.committedTotal(t); n != 0 {
		t.Fatalf("committed %d while the sink was blocked", n)
	}
	close(release)
	waitFor(t, 30*time.Second, "everything committed", func() bool { return e.committedTotal(t) == n })
	waitFor(t, 5*time.Second, "lag 0", func() bool { return lagTotal(t, reg) == 0 })
	if _, err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range sink.records() {
		seen[r.Value] = true
	}
	for _, v := range vals {
		if !seen[v] {
			t.Fatalf("%s never reached the sink", v)
		}
	}
	// Order within a partition is kept.
	last := map[int]int64{}
	for _, r := range sink.records() {
		if o, ok := last[r.Partition]; ok && r.Offset <= o {
			t.Fatalf("partition %d: offset %d after %d", r.Partition, r.Offset, o)
		}
		last[r.Partition] = r.Offset
	}
}

// metricValue sums the counter or gauge samples of name whose labels match
// the label/value pairs.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labelPairs ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labelPairs); i += 2 {
				ok := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labelPairs[i] && lp.GetValue() == labelPairs[i+1] {
						ok = true
					}
				}
				if !ok {
					continue metrics
				}
			}
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}

// lagTotal sums trace_consumer_lag over partitions.
func lagTotal(t *testing.T, reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "trace_consumer_lag" {
			total = 0
			for _, m := range mf.GetMetric() {
				total += m.GetGauge().GetValue()
			}
		}
	}
	return total
}

func TestConsumerTwoMembersRebalance(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	sinkA, sinkB := &testSink[string]{}, &testSink[string]{}
	cfg := e.config()
	a := start(t, newConsumer(t, cfg, strDecoder, sinkA, nil))
	b := start(t, newConsumer(t, cfg, strDecoder, sinkB, nil))
	// Produce in rounds until both members got records (the group settles
	// on two members after a rebalance), then check that together they saw
	// everything.
	var all []string
	deadline := time.Now().Add(30 * time.Second)
	for round := 0; sinkA.count() == 0 || sinkB.count() == 0; round++ {
		if time.Now().After(deadline) {
			t.Fatalf("after %d rounds: member A got %d records, B %d", round, sinkA.count(), sinkB.count())
		}
		all = append(all, e.produceN(t, fmt.Sprintf("r%d", round), 40)...)
		time.Sleep(300 * time.Millisecond)
	}
	union := func() map[string]bool {
		u := map[string]bool{}
		for _, r := range append(sinkA.records(), sinkB.records()...) {
			u[r.Value] = true
		}
		return u
	}
	waitFor(t, 20*time.Second, "every record seen by one of the members", func() bool { return len(union()) == len(all) })
	waitFor(t, 20*time.Second, "everything committed", func() bool { return e.committedTotal(t) == int64(len(all)) })
	partsA, partsB := map[int]bool{}, map[int]bool{}
	for _, r := range sinkA.records() {
		partsA[r.Partition] = true
	}
	for _, r := range sinkB.records() {
		partsB[r.Partition] = true
	}
	t.Logf("%d records; member A %d records from partitions %v, member B %d from %v",
		len(all), sinkA.count(), partsA, sinkB.count(), partsB)
	for _, r := range []*running{a, b} {
		if _, err := r.stop(t); err != nil {
			t.Fatal(err)
		}
	}
}

func TestConsumerResumesFromCommittedOffsets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	first := e.produceN(t, "first", 30)
	sink1 := &testSink[string]{}
	run1 := start(t, newConsumer(t, e.config(), strDecoder, sink1, nil))
	waitFor(t, 20*time.Second, "first round committed", func() bool { return e.committedTotal(t) == 30 })
	if _, err := run1.stop(t); err != nil {
		t.Fatal(err)
	}
	if sink1.count() != len(first) {
		t.Fatalf("first run wrote %d records, want %d", sink1.count(), len(first))
	}
	before := e.committed(t)

	second := e.produceN(t, "second", 30)
	sink2 := &testSink[string]{}
	run2 := start(t, newConsumer(t, e.config(), strDecoder, sink2, nil))
	waitFor(t, 20*time.Second, "second round committed", func() bool { return e.committedTotal(t) == 60 })
	if _, err := run2.stop(t); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range sink2.records() {
		got[r.Value] = true
		if r.Offset < before[r.Partition] {
			t.Errorf("restart re-read %s at offset %d below the committed %d of partition %d", r.Value, r.Offset, before[r.Partition], r.Partition)
		}
	}
	for _, v := range second {
		if !got[v] {
			t.Errorf("%s missing after the restart", v)
		}
	}
	if len(got) != len(second) {
		t.Errorf("restart delivered %d records, want exactly the %d new ones", len(got), len(second))
	}
}

// DLQ write failures are retried, and the source offsets are not committed
// until the dead letter is written. kfake does not create topics on use, so
// a missing DLQ topic makes every DLQ write fail until the test creates it.
func TestConsumerRetriesDLQWritesBeforeCommitting(t *testing.T) {
	t.Parallel()
	if os.Getenv(testenv.EnvKafka) == "apache" {
		t.Skip("Apache Kafka creates the DLQ topic on first use: the write does not fail")
	}
	brokers := testenv.Kafka(t)
	e := env{brokers: brokers, topic: testenv.UniqueTopic(t, "src")}
	e.dlq, e.group = e.topic+".dlq", "g-"+e.topic
	testenv.CreateTopic(t, brokers, e.topic, 1)
	e.produce(t, kafka.Message{Value: []byte("ok-1")}, kafka.Message{Value: []byte("bad-1")}, kafka.Message{Value: []byte("ok-2")})
	reg := prometheus.NewRegistry()
	met := stream.NewMetrics(reg)
	sink := &testSink[string]{}
	run := start(t, newConsumer(t, e.config(), strDecoder, sink, met))
	waitFor(t, 20*time.Second, "failed DLQ writes", func() bool { return metricValue(t, reg, "trace_consumer_errors_total", "op", "dlq") >= 3 })
	if n := e.committedTotal(t); n != 0 {
		t.Fatalf("committed %d before the dead letter was written", n)
	}
	if sink.count() != 2 {
		t.Fatalf("sink has %d records, want the 2 valid ones written before the dead letter", sink.count())
	}
	testenv.CreateTopic(t, brokers, e.dlq, 1)
	waitFor(t, 20*time.Second, "commit after the DLQ topic appeared", func() bool { return e.committedTotal(t) == 3 })
	if _, err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	dead := e.readDLQ(t, 1)
	if string(dead[0].Value) != "bad-1" {
		t.Fatalf("dead letter %q", dead[0].Value)
	}
	if _, calls := sink.stats(); calls != 1 {
		t.Fatalf("sink called %d times; a DLQ retry must not rewrite the batch", calls)
	}
}

// TestConsumerSkipInvalid: a stage that reads a topic another stage already
// dead-letters counts and skips invalid messages, still commits past them,
// and writes nothing to the DLQ.
func TestConsumerSkipInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(t, kafka.Message{Value: validRollout("ok-1")}, kafka.Message{Value: []byte("not json")},
		kafka.Message{Value: validRollout("ok-2")})
	reg := prometheus.NewRegistry()
	cfg := e.config()
	cfg.SkipInvalid = true
	sink := &testSink[*schemas.Rollout]{}
	c := newConsumer(t, cfg, func(v []byte) (*schemas.Rollout, error) { return schemas.DecodeRollout(v, schemas.DecodeOptions{}) }, stream.Sink[*schemas.Rollout](sink), stream.NewMetrics(reg))
	r := start(t, c)
	waitFor(t, 20*time.Second, "two valid records and a commit", func() bool { return sink.count() == 2 && e.committedTotal(t) == 3 })
	if _, err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := metricValue(t, reg, "trace_consumer_invalid_skipped_total", "reason", schemas.ReasonNotJSON); got != 1 {
		t.Fatalf("invalid_skipped_total{not_json} = %v, want 1", got)
	}
	if got := metricValue(t, reg, "trace_consumer_dead_lettered_total"); got != 0 {
		t.Fatalf("dead_lettered_total = %v, want 0", got)
	}
	conn, err := kafka.DialLeader(context.Background(), "tcp", e.brokers[0], e.dlq, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if last, err := conn.ReadLastOffset(); err != nil || last != 0 {
		t.Fatalf("DLQ last offset %d (%v), want 0", last, err)
	}
}

// TestConsumerWaitsForAMissingTopic: a source topic that does not exist
// (not created yet, or a misspelled kafka.rollouts_topic on a cluster that
// does not create topics on use) is waited for with a warning naming it,
// and consumed once it is created. kafka-go's group reader, started on it,
// rejoined the group in a tight loop: about 1,400 "Problem getting
// partitions" warnings a second and most of a core, for as long as the
// topic was missing.
func TestConsumerWaitsForAMissingTopic(t *testing.T) {
	t.Parallel()
	// kfake whatever TRACE_TEST_KAFKA says: it does not create topics on
	// use (the Apache broker of CI does).
	brokers := testenv.KFake(t).ListenAddrs()
	e := env{brokers: brokers, topic: testenv.UniqueTopic(t, "late")}
	e.dlq, e.group = e.topic+".dlq", "g-"+e.topic
	testenv.CreateTopic(t, brokers, e.dlq, 1)
	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sink := &testSink[string]{}
	c, err := stream.NewConsumer(e.config(), strDecoder, stream.Sink[string](sink), log, nil)
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	waitFor(t, 20*time.Second, "a warning naming the missing topic", func() bool {
		return strings.Contains(logs.String(), "topic does not exist; waiting for it")
	})
	if n := strings.Count(logs.String(), "Problem getting partitions"); n > 0 {
		t.Fatalf("the group reader ran on the missing topic: %d kafka-go warnings", n)
	}
	waitFor(t, 20*time.Second, "Problem() naming the missing topic", func() bool {
		err := c.Problem()
		return err != nil && strings.Contains(err.Error(), "topic "+e.topic+" does not exist")
	})
	testenv.CreateTopic(t, brokers, e.topic, 2)
	vals := e.produceN(t, "v", 20)
	waitFor(t, 30*time.Second, "the records of the created topic", func() bool { return sink.count() == len(vals) })
	if err := c.Problem(); err != nil {
		t.Errorf("Problem() once consuming: %v", err)
	}
}

// TestConsumerProblemWhileTheSinkFails: while the sink fails and its batch
// is retried, Problem says so with the error (for /readyz: a full disk
// answers pings and refuses every insert); once a write succeeds it is nil.
func TestConsumerProblemWhileTheSinkFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produceN(t, "m", 10)
	sink := &testSink[string]{failN: 1 << 30}
	c := newConsumer(t, e.config(), strDecoder, sink, nil)
	start(t, c)
	waitFor(t, 20*time.Second, "a problem naming the sink's error", func() bool {
		err := c.Problem()
		return err != nil && strings.Contains(err.Error(), "sink failing") && strings.Contains(err.Error(), errTransient.Error())
	})
	sink.mu.Lock()
	sink.failN = 0
	sink.mu.Unlock()
	waitFor(t, 20*time.Second, "the batch committed", func() bool { return e.committedTotal(t) == 10 })
	if err := c.Problem(); err != nil {
		t.Errorf("Problem() after the write went through: %v", err)
	}
}

// TestConsumerLagGoesStaleDuringAnOutage: every successful lag read sets
// trace_consumer_lag_updated_timestamp_seconds; with the broker gone it
// stops advancing and the lag series are dropped after three intervals
// without a read. Before, the gauge kept its last value through the outage
// (a flat, healthy-looking lag) and only errors_total{op="lag"} rose.
func TestConsumerLagGoesStaleDuringAnOutage(t *testing.T) {
	t.Parallel()
	// kfake whatever TRACE_TEST_KAFKA says: the test stops the broker.
	cluster := testenv.KFake(t)
	brokers := cluster.ListenAddrs()
	e := env{brokers: brokers, topic: testenv.UniqueTopic(t, "lagout")}
	e.dlq, e.group = e.topic+".dlq", "g-"+e.topic
	testenv.CreateTopic(t, brokers, e.topic, 2)
	testenv.CreateTopic(t, brokers, e.dlq, 1)
	const n = 50
	e.produceN(t, "m", n)
	reg := prometheus.NewRegistry()
	met := stream.NewMetrics(reg)
	release := make(chan struct{})
	defer close(release)
	sink := &testSink[string]{block: release} // nothing committed: the lag stays n
	cfg := e.config()
	c := newConsumer(t, cfg, strDecoder, sink, met)
	run := start(t, c)

	const updated = "trace_consumer_lag_updated_timestamp_seconds"
	waitFor(t, 20*time.Second, "a lag reading", func() bool { return lagTotal(t, reg) == n })
	first := metricValue(t, reg, updated, "stage", "test", "topic", e.topic)
	if now := float64(time.Now().UnixNano()) / 1e9; first < now-10 || first > now+1 {
		t.Fatalf("%s = %v, want about now (%v)", updated, first, now)
	}
	waitFor(t, 5*time.Second, "the timestamp to advance with the next reads", func() bool {
		return metricValue(t, reg, updated, "stage", "test", "topic", e.topic) > first
	})

	cluster.Close()
	stopped := float64(time.Now().UnixNano()) / 1e9
	waitFor(t, 20*time.Second, "the lag series dropped", func() bool { return lagSeries(t, reg) == 0 })
	last := metricValue(t, reg, updated, "stage", "test", "topic", e.topic)
	if last == 0 || last > stopped+0.5 { // a read that completed as the broker closed may be set just after
		t.Fatalf("%s = %v after the broker stopped at %v: want the time of the last read before it", updated, last, stopped)
	}
	time.Sleep(5 * cfg.LagInterval)
	if again := metricValue(t, reg, updated, "stage", "test", "topic", e.topic); again != last {
		t.Fatalf("%s moved from %v to %v with the broker down", updated, last, again)
	}
	if errs := metricValue(t, reg, "trace_consumer_errors_total", "op", "lag"); errs < 3 {
		t.Fatalf("errors_total{op=lag} = %v, want the failed reads counted", errs)
	}
	if _, err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	if lagSeries(t, reg) != 0 || metricValue(t, reg, updated) != 0 {
		t.Fatal("a stopped consumer left lag series behind")
	}
}

// lagSeries counts the trace_consumer_lag series.
func lagSeries(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "trace_consumer_lag" {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// stoppingSink gives its batches up at shutdown: Write waits for
// stream.Stopping(ctx) and returns stream.ErrStopped; after early it
// returns ErrStopped at once, stopping or not.
type stoppingSink struct {
	mu     sync.Mutex
	calls  int
	early  bool
	called chan struct{}
}

func (s *stoppingSink) Write(ctx context.Context, batch []stream.Record[string]) error {
	s.mu.Lock()
	s.calls++
	early := s.early
	s.mu.Unlock()
	select {
	case s.called <- struct{}{}:
	default:
	}
	if early {
		return fmt.Errorf("gave up: %w", stream.ErrStopped)
	}
	stop := stream.Stopping(ctx)
	if stop == nil {
		return errors.New("no Stopping channel in the sink's context")
	}
	select {
	case <-stop:
		return fmt.Errorf("gave up: %w", stream.ErrStopped)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestConsumerSinkGivesUpAtShutdown: a sink that returns ErrStopped once
// Stopping(ctx) is closed ends the drain at once: Run returns well before
// DrainTimeout, the batch is neither retried nor committed, and the next
// Run gets it again. ErrStopped while the consumer is not stopping is
// retried like any other error.
func TestConsumerSinkGivesUpAtShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produceN(t, "m", 10)
	cfg := e.config()
	cfg.DrainTimeout = 8 * time.Second
	s := &stoppingSink{called: make(chan struct{}, 1)}
	c := newConsumer(t, cfg, strDecoder, stream.Sink[string](s), nil)
	run := start(t, c)
	select {
	case <-s.called:
	case <-time.After(20 * time.Second):
		t.Fatal("the sink was not called")
	}
	took, err := run.stop(t)
	if err != nil {
		t.Fatal(err)
	}
	if took > 4*time.Second {
		t.Fatalf("Run returned %v after cancel with the sink giving up; want well under DrainTimeout %v", took, cfg.DrainTimeout)
	}
	s.mu.Lock()
	calls := s.calls
	s.early = true // from now on ErrStopped at once, and the consumer is not stopping
	s.mu.Unlock()
	if calls != 1 {
		t.Fatalf("Write called %d times: a batch given up at shutdown was retried", calls)
	}
	if n := e.committedTotal(t); n != 0 {
		t.Fatalf("committed %d of a batch given up", n)
	}

	run = start(t, c)
	waitFor(t, 20*time.Second, "the batch redelivered and retried", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.calls >= 3
	})
	if n := e.committedTotal(t); n != 0 {
		t.Fatalf("committed %d", n)
	}
	if _, err := run.stop(t); err != nil {
		t.Fatal(err)
	}
}
