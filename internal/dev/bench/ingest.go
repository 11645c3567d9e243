package bench

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/chserver"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// Options configure Run.
type Options struct {
	// Rows per set: Whole and Compact rows (0: 20,000 and 60,000).
	WholeRows, CompactRows int
	Sets                   []Set
	// Tau2Dir holds the τ²-bench result files.
	Tau2Dir string
	// ClickHouse is host:port of a server to use; "" starts a local one.
	ClickHouse string
	// WorkDir holds the broker's DataDir, the local ClickHouse and the
	// ceiling's input files ("" picks /dev/shm when it has room, else the
	// system temp directory).
	WorkDir string
	// Partitions of the bench topics (0: 4).
	Partitions int
	// Compression of the produced messages: none, gzip, snappy, lz4, zstd
	// (default zstd, as `trace replay` publishes).
	Compression string
	// CHCompression is the ClickHouse protocol compression of the stores
	// under test (clickhouse.compression; "" is its default, auto).
	CHCompression string
	// Consumer is the ingest configuration under test (zero fields take
	// ingest's defaults); Brokers, Topic and GroupID are set by Run.
	Consumer stream.Config
	// Skip baselines (ceiling, bare consume, obvious loop).
	SkipBaselines bool
	// Repeat runs every step this many times (alternating) and keeps each
	// step's best run (0 or 1: once).
	Repeat int
	// RSSRollouts is the number of compact rollouts RunRSS streams.
	RSSRollouts int
	// Binary is the trace executable RunRSS starts as `trace run --roles
	// ingest`; ChildMemoryLimit, when set, is its GOMEMLIMIT.
	Binary, ChildMemoryLimit string
	// Log receives progress; nil discards it.
	Log *slog.Logger
}

// Result is one measured step.
type Result struct {
	Set       Set
	Step      string
	Rows      int
	Bytes     int64 // Kafka value bytes (for the ceiling: JSONEachRow bytes)
	Elapsed   time.Duration
	CPU       time.Duration // this process (trace + broker)
	ServerCPU time.Duration // the ClickHouse server, when started here
	Note      string
}

// RowsPerSec is the throughput in rows per second.
func (r Result) RowsPerSec() float64 { return float64(r.Rows) / r.Elapsed.Seconds() }

// MBPerSec is the throughput in MB (10^6 bytes) per second.
func (r Result) MBPerSec() float64 { return float64(r.Bytes) / 1e6 / r.Elapsed.Seconds() }

// The steps.
const (
	StepCeiling = "clickhouse-client ceiling"
	StepBare    = "kafka-go bare consume"
	StepObvious = "obvious loop"
	StepTrace   = "trace stream.Consumer"
)

// env is what the steps share.
type env struct {
	opt     Options
	log     *slog.Logger
	brokers []string
	chAddr  string
	chPid   int
	dir     string
	run     string
	store   func(ctx context.Context, db string) (*sink.Store, error)

	sinkBusy string // of the last runConsumer
	round    int    // of Options.Repeat, in names of groups and databases
}

// Run measures every step for every set and returns the results in order.
func Run(ctx context.Context, opt Options) ([]Result, error) {
	e, cleanup, err := setup(ctx, &opt)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	rollouts, err := LoadTau2(opt.Tau2Dir)
	if err != nil {
		return nil, err
	}
	var results []Result
	for _, set := range opt.Sets {
		n := opt.WholeRows
		if set == Compact {
			n = opt.CompactRows
		}
		ds, err := NewDataset(set, rollouts, e.run)
		if err != nil {
			return results, err
		}
		topic := "bench-" + e.run + "-" + string(set)
		if err := e.createTopic(ctx, topic); err != nil {
			return results, err
		}
		e.log.Info("producing", "set", set, "rows", n, "avg_bytes", int(ds.AvgBytes()), "topic", topic)
		t0 := time.Now()
		bytes, err := e.produce(ctx, topic, ds, n)
		if err != nil {
			return results, err
		}
		// A tail of one more batch, which no step reads to its end: trace
		// is timed until n rows are durable, and with the tail its last
		// batch fills as in a steady stream instead of waiting out
		// BatchTimeout on an idle topic (the baselines stop at n by
		// themselves).
		tail := e.opt.Consumer.BatchRows
		if _, err := e.produceFn(ctx, topic, tail, func(i int, dst []byte) ([]byte, []byte) {
			return ds.Key(n + i), ds.Value(n+i, dst)
		}); err != nil {
			return results, err
		}
		e.log.Info("produced", "set", set, "rows", n, "MB", bytes/1e6, "took", time.Since(t0).Round(time.Millisecond))
		steps := []func(context.Context, Set, *Dataset, string, int, int64) (Result, error){e.ceiling, e.bare, e.obvious, e.trace}
		if opt.SkipBaselines {
			steps = steps[3:]
		}
		// Each round runs every step once; a step's best round is kept, so a
		// burst of load from other processes hurts one round, not the result.
		best := make([]Result, len(steps))
		for round := range max(opt.Repeat, 1) {
			e.round = round
			for i, step := range steps {
				e.settle(ctx)
				r, err := step(ctx, set, ds, topic, n, bytes)
				if err != nil {
					return results, err
				}
				e.log.Info("measured", "set", set, "step", r.Step, "round", round, "rows_per_s", int(r.RowsPerSec()),
					"MB_per_s", fmt.Sprintf("%.1f", r.MBPerSec()), "elapsed", r.Elapsed.Round(time.Millisecond),
					"cpu_ms_per_1k", r.CPU.Milliseconds()*1000/int64(max(r.Rows, 1)),
					"ch_ms_per_1k", r.ServerCPU.Milliseconds()*1000/int64(max(r.Rows, 1)), "note", r.Note)
				if best[i].Rows == 0 || r.RowsPerSec() > best[i].RowsPerSec() {
					best[i] = r
				}
			}
		}
		results = append(results, best...)
	}
	return results, nil
}

func setup(ctx context.Context, opt *Options) (*env, func(), error) {
	// The consumer under test runs with `trace run`'s ingest defaults.
	opt.Consumer.BatchRows = cmp.Or(opt.Consumer.BatchRows, config.IngestBatchRows)
	opt.Consumer.BatchBytes = cmp.Or(opt.Consumer.BatchBytes, config.IngestBatchBytes)
	opt.Consumer.BatchTimeout = cmp.Or(opt.Consumer.BatchTimeout, config.IngestBatchTimeout)
	if opt.WholeRows <= 0 {
		opt.WholeRows = 20000
	}
	if opt.CompactRows <= 0 {
		opt.CompactRows = 60000
	}
	if len(opt.Sets) == 0 {
		opt.Sets = []Set{Whole, Compact}
	}
	if opt.Partitions <= 0 {
		opt.Partitions = 4
	}
	opt.Compression = cmp.Or(opt.Compression, "zstd")
	log := opt.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var cleanups []func()
	cleanup := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	fail := func(err error) (*env, func(), error) { cleanup(); return nil, nil, err }

	runID := make([]byte, 4)
	_, _ = rand.Read(runID)
	e := &env{opt: *opt, log: log, run: hex.EncodeToString(runID)}

	// Room for the broker's log (the messages, twice for safety), the
	// ceiling files and ClickHouse's parts.
	var need int64
	for _, set := range opt.Sets {
		switch set {
		case Whole:
			need += int64(float64(opt.WholeRows) * 27e3 * 2.5)
		case Compact:
			need += int64(float64(opt.CompactRows) * 10e3 * 2.5)
		}
	}
	need += int64(float64(opt.RSSRollouts) * 10e3 * 1.5)
	parent := opt.WorkDir
	if parent == "" {
		parent = os.TempDir()
		if free := freeBytes("/dev/shm"); free > 3*need {
			parent = "/dev/shm"
		}
	}
	if free := freeBytes(parent); free > 0 && free < need {
		return fail(fmt.Errorf("bench: %s has %d MB free, the run needs about %d MB (use --workdir)", parent, free>>20, need>>20))
	}
	dir, err := os.MkdirTemp(parent, "trace-bench-")
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { os.RemoveAll(dir) })
	e.dir = dir
	log.Info("work directory", "dir", dir, "free_MB", freeBytes(parent)>>20)

	// Kafka: kfake with its log on disk.
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DataDir(filepath.Join(dir, "kafka")),
		kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(opt.Partitions),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, "127.0.0.1:0") }))
	if err != nil {
		return fail(fmt.Errorf("bench: kfake: %w", err))
	}
	cleanups = append(cleanups, kc.Close)
	e.brokers = kc.ListenAddrs()

	// ClickHouse.
	e.chAddr = opt.ClickHouse
	if e.chAddr == "" {
		srv, err := chserver.Start(ctx, chserver.Options{Dir: filepath.Join(dir, "clickhouse"), Logger: log})
		if err != nil {
			return fail(fmt.Errorf("bench: start ClickHouse: %w", err))
		}
		cleanups = append(cleanups, func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = srv.Stop(sctx)
		})
		e.chAddr = srv.Addr()
		e.chPid = srv.Pid()
		log.Info("started ClickHouse", "addr", e.chAddr, "version", srv.Version())
	}
	var dbs []string
	var mu sync.Mutex
	e.store = func(ctx context.Context, db string) (*sink.Store, error) {
		s, err := sink.Open(ctx, sink.Config{Addr: []string{e.chAddr}, Database: db, Compression: opt.CHCompression}, log)
		if err != nil {
			return nil, err
		}
		if err := s.Migrate(ctx); err != nil {
			s.Close()
			return nil, err
		}
		mu.Lock()
		dbs = append(dbs, db)
		mu.Unlock()
		return s, nil
	}
	cleanups = append(cleanups, func() {
		if len(dbs) == 0 {
			return
		}
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := sink.Open(cctx, sink.Config{Addr: []string{e.chAddr}, Database: "default"}, log)
		if err != nil {
			return
		}
		defer s.Close()
		for _, db := range dbs {
			_ = s.DropDatabase(cctx, db)
		}
	})
	return e, cleanup, nil
}

func freeBytes(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

func codec(name string) (kafka.Compression, error) {
	switch name {
	case "none", "":
		return 0, nil
	case "gzip":
		return kafka.Gzip, nil
	case "snappy":
		return kafka.Snappy, nil
	case "lz4":
		return kafka.Lz4, nil
	case "zstd":
		return kafka.Zstd, nil
	}
	return 0, fmt.Errorf("bench: unknown compression %q", name)
}

// produce writes n messages of ds to topic; it returns the value bytes.
func (e *env) produce(ctx context.Context, topic string, ds *Dataset, n int) (int64, error) {
	return e.produceFn(ctx, topic, n, func(i int, dst []byte) ([]byte, []byte) { return ds.Key(i), ds.Value(i, dst) })
}

func (e *env) produceFn(ctx context.Context, topic string, n int, gen func(i int, dst []byte) (key, value []byte)) (int64, error) {
	comp, err := codec(e.opt.Compression)
	if err != nil {
		return 0, err
	}
	w := &kafka.Writer{Addr: kafka.TCP(e.brokers...), Topic: topic, Balancer: &kafka.Hash{},
		BatchSize: 500, BatchBytes: 1 << 20, BatchTimeout: 5 * time.Millisecond,
		RequiredAcks: kafka.RequireAll, Compression: comp, AllowAutoTopicCreation: true}
	defer w.Close()
	const chunk = 2000
	var total int64
	msgs := make([]kafka.Message, 0, chunk)
	bufs := make([][]byte, chunk)
	for i := 0; i < n; {
		msgs = msgs[:0]
		for j := 0; j < chunk && i < n; j, i = j+1, i+1 {
			k, v := gen(i, bufs[j])
			bufs[j] = v
			msgs = append(msgs, kafka.Message{Key: k, Value: v})
			total += int64(len(v))
		}
		for attempt := 0; ; attempt++ {
			err := w.WriteMessages(ctx, msgs...)
			if err == nil {
				break
			}
			if attempt >= 20 || ctx.Err() != nil {
				return total, fmt.Errorf("bench: produce to %s: %w", topic, err)
			}
			time.Sleep(200 * time.Millisecond) // the topic is being created
		}
	}
	return total, nil
}

func (e *env) createTopic(ctx context.Context, topic string) error {
	c := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: 10 * time.Second}
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
		{Topic: topic, NumPartitions: e.opt.Partitions, ReplicationFactor: 1}}})
	if err != nil {
		return err
	}
	for _, err := range res.Errors {
		if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return err
		}
	}
	return nil
}

// settle waits (bounded) until the ClickHouse server has no merges running,
// so that one step does not pay for the last one's parts.
func (e *env) settle(ctx context.Context) {
	s, err := sink.Open(ctx, sink.Config{Addr: []string{e.chAddr}, Database: "default"}, e.log)
	if err != nil {
		return
	}
	defer s.Close()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if n, err := s.ActiveMerges(ctx); err != nil || n == 0 {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (e *env) dbName(set Set, step string) string {
	return "bench_" + e.run + "_" + string(set) + "_" + step + "_" + strconv.Itoa(e.round)
}

func (e *env) group(step string, set Set) string {
	return "bench-" + step + "-" + e.run + "-" + string(set) + "-" + strconv.Itoa(e.round)
}

func (e *env) measure(set Set, step string, rows int, bytes int64, fn func() (time.Duration, error)) (Result, error) {
	cpu0, srv0 := CPUTime(), ProcCPUTime(e.chPid)
	elapsed, err := fn()
	if err != nil {
		return Result{}, fmt.Errorf("bench: %s, %s: %w", set, step, err)
	}
	return Result{Set: set, Step: step, Rows: rows, Bytes: bytes, Elapsed: elapsed,
		CPU: CPUTime() - cpu0, ServerCPU: ProcCPUTime(e.chPid) - srv0}, nil
}

// ceilingBlocks are the clickhouse-client block sizes (max_insert_block_size)
// the ceiling tries besides the consumer's batch size; 0 is the client's
// default (1,048,576 rows).
var ceilingBlocks = []int{10000, 0}

// ceiling: clickhouse-client inserts the same rows from a JSONEachRow file.
// Block size changes its speed by a fifth either way on this machine, so it
// runs with blocks of the consumer's batch size, of 10,000 rows and of the
// client's default, and the fastest is the ceiling.
func (e *env) ceiling(ctx context.Context, set Set, ds *Dataset, _ string, n int, _ int64) (Result, error) {
	client, err := exec.LookPath("clickhouse-client")
	if err != nil {
		if client, err = exec.LookPath("clickhouse"); err != nil {
			return Result{}, errors.New("bench: no clickhouse-client for the ceiling")
		}
	}
	path := filepath.Join(e.dir, "ceiling-"+string(set)+".jsonl")
	f, err := os.Create(path)
	if err != nil {
		return Result{}, err
	}
	defer os.Remove(path)
	bw := bufio.NewWriterSize(f, 1<<20)
	var size int64
	var buf []byte
	for i := range n {
		buf = ds.Row(i, buf)
		size += int64(len(buf))
		_, _ = bw.Write(buf)
	}
	if err := bw.Flush(); err != nil {
		return Result{}, err
	}
	f.Close()
	host, port, _ := net.SplitHostPort(e.chAddr)
	blocks := []int{e.opt.Consumer.BatchRows}
	for _, b := range ceilingBlocks {
		if !slices.Contains(blocks, b) {
			blocks = append(blocks, b)
		}
	}
	var best Result
	var tried []string
	for _, block := range blocks {
		db := e.dbName(set, "ceiling") + "_" + strconv.Itoa(block)
		s, err := e.store(ctx, db)
		if err != nil {
			return Result{}, err
		}
		s.Close()
		args := []string{"--host", host, "--port", port, "--database", db,
			"--query", sink.InsertRolloutsJSONEachRowSQL}
		name := "client default"
		if block > 0 {
			args = append(args, "--max_insert_block_size="+strconv.Itoa(block))
			name = strconv.Itoa(block)
		}
		if filepath.Base(client) == "clickhouse" {
			args = append([]string{"client"}, args...)
		}
		e.settle(ctx)
		r, err := e.measure(set, StepCeiling, n, size, func() (time.Duration, error) {
			in, err := os.Open(path)
			if err != nil {
				return 0, err
			}
			defer in.Close()
			cmd := exec.CommandContext(ctx, client, args...)
			cmd.Stdin = in
			var stderr strings.Builder
			cmd.Stderr = &stderr
			t0 := time.Now()
			if err := cmd.Run(); err != nil {
				return 0, fmt.Errorf("clickhouse-client: %v: %s", err, stderr.String())
			}
			return time.Since(t0), nil
		})
		if err != nil {
			return r, err
		}
		if err := e.checkCount(ctx, db, n); err != nil {
			return r, err
		}
		tried = append(tried, fmt.Sprintf("%s: %.0f", name, r.RowsPerSec()))
		if best.Rows == 0 || r.RowsPerSec() > best.RowsPerSec() {
			best = r
			best.Note = "blocks of " + name + " rows"
		}
	}
	best.Note += fmt.Sprintf(" (rows/s by block size: %s); CPU includes neither client nor server", strings.Join(tried, ", "))
	return best, nil
}

func (e *env) checkCount(ctx context.Context, db string, n int) error {
	s, err := sink.Open(ctx, sink.Config{Addr: []string{e.chAddr}, Database: db}, e.log)
	if err != nil {
		return err
	}
	defer s.Close()
	got, err := s.CountRollouts(ctx)
	if err != nil {
		return err
	}
	if got < uint64(n) {
		return fmt.Errorf("bench: %s holds %d rows, want %d", db, got, n)
	}
	_ = s.DropDatabase(ctx, db)
	return nil
}

func (e *env) reader(topic, group string) *kafka.Reader {
	maxBytes := e.opt.Consumer.MaxMessageBytes
	if maxBytes <= 0 {
		maxBytes = stream.DefaultMaxMessageBytes
	}
	return kafka.NewReader(kafka.ReaderConfig{Brokers: e.brokers, Topic: topic, GroupID: group,
		MinBytes: 1, MaxBytes: maxBytes, MaxWait: 2 * time.Second, StartOffset: kafka.FirstOffset})
}

// closeReader closes r in the background (kafka-go may idle on Close).
func closeReader(r *kafka.Reader) {
	done := make(chan struct{})
	go func() { _ = r.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
	}
}

// bare: a kafka-go group reader fetches every message and commits at the end.
func (e *env) bare(ctx context.Context, set Set, _ *Dataset, topic string, n int, bytes int64) (Result, error) {
	r := e.reader(topic, e.group("bare", set))
	defer closeReader(r)
	res, err := e.measure(set, StepBare, n, bytes, func() (time.Duration, error) {
		var t0 time.Time
		last := map[int]kafka.Message{}
		for i := range n {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				return 0, err
			}
			if i == 0 {
				t0 = time.Now()
			}
			last[m.Partition] = kafka.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
		}
		if err := r.CommitMessages(ctx, slices.Collect(maps.Values(last))...); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	})
	res.Note = "timed from the first message (group join excluded)"
	return res, err
}

// obvious: one goroutine, FetchMessage → encoding/json → rows →
// PrepareBatch/Append/Send every 10,000 rows → CommitMessages.
func (e *env) obvious(ctx context.Context, set Set, _ *Dataset, topic string, n int, bytes int64) (Result, error) {
	db := e.dbName(set, "obvious")
	store, err := e.store(ctx, db)
	if err != nil {
		return Result{}, err
	}
	defer store.Close()
	r := e.reader(topic, e.group("obvious", set))
	defer closeReader(r)
	const batch = 10000
	res, err := e.measure(set, StepObvious, n, bytes, func() (time.Duration, error) {
		var t0 time.Time
		rows := make([]sink.RolloutRow, 0, batch)
		last := map[int]kafka.Message{}
		flush := func() error {
			if err := store.InsertRollouts(ctx, rows); err != nil {
				return err
			}
			offs := slices.Collect(maps.Values(last))
			rows = rows[:0]
			clear(last)
			return r.CommitMessages(ctx, offs...)
		}
		for i := range n {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				return 0, err
			}
			if i == 0 {
				t0 = time.Now()
			}
			var ro schemas.Rollout
			if err := json.Unmarshal(m.Value, &ro); err != nil {
				return 0, err
			}
			rows = append(rows, sink.RolloutRowFrom(&ro, sink.Coord{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}))
			last[m.Partition] = kafka.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
			if len(rows) == batch {
				if err := flush(); err != nil {
					return 0, err
				}
			}
		}
		if len(rows) > 0 {
			if err := flush(); err != nil {
				return 0, err
			}
		}
		return time.Since(t0), nil
	})
	if err != nil {
		return res, err
	}
	res.Note = "encoding/json without schema validation; timed from the first message"
	return res, e.checkCount(ctx, db, n)
}

// countingSink counts the rows the wrapped sink made durable and signals
// when target is reached. It streams (stream.StreamSink) as RowSink does.
type countingSink struct {
	inner    *ingest.RowSink
	n        atomic.Int64
	target   int64
	done     chan struct{}
	once     sync.Once
	doneAt   atomic.Int64
	doneRows atomic.Int64 // rows durable when target was reached
	busy     atomic.Int64 // nanoseconds inside Write, or from Begin to the end of Commit
	writes   atomic.Int64
}

func (s *countingSink) durable(rows int, since time.Time) {
	s.busy.Add(int64(time.Since(since)))
	s.writes.Add(1)
	if total := s.n.Add(int64(rows)); total >= s.target {
		s.once.Do(func() { s.doneAt.Store(time.Now().UnixNano()); s.doneRows.Store(total); close(s.done) })
	}
}

func (s *countingSink) Write(ctx context.Context, batch []stream.Record[*sink.RolloutRow]) error {
	t0 := time.Now()
	if err := s.inner.Write(ctx, batch); err != nil {
		return err
	}
	s.durable(len(batch), t0)
	return nil
}

func (s *countingSink) Begin(ctx context.Context) (stream.Stream[*sink.RolloutRow], error) {
	t0 := time.Now()
	st, err := s.inner.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &countingStream{Stream: st, s: s, t0: t0}, nil
}

type countingStream struct {
	stream.Stream[*sink.RolloutRow]
	s    *countingSink
	t0   time.Time
	rows int
}

func (st *countingStream) Add(recs []stream.Record[*sink.RolloutRow]) error {
	st.rows += len(recs)
	return st.Stream.Add(recs)
}

func (st *countingStream) Commit() error {
	if err := st.Stream.Commit(); err != nil {
		return err
	}
	st.s.durable(st.rows, st.t0)
	return nil
}

// trace: stream.Consumer with DecodeRolloutRow and RowSink, as `trace run` ingests.
func (e *env) trace(ctx context.Context, set Set, _ *Dataset, topic string, n int, bytes int64) (Result, error) {
	db := e.dbName(set, "trace")
	store, err := e.store(ctx, db)
	if err != nil {
		return Result{}, err
	}
	defer store.Close()
	var durable int64
	res, err := e.measure(set, StepTrace, n, bytes, func() (time.Duration, error) {
		_, elapsed, rows, err := e.runConsumer(ctx, topic, e.group("trace", set), store, int64(n), nil)
		durable = rows
		return elapsed, err
	})
	if err != nil {
		return res, err
	}
	// Rows durable when n were reached (the batch with row n may hold more).
	res.Rows, res.Bytes = int(durable), bytes*durable/int64(n)
	c := e.opt.Consumer.WithDefaults()
	res.Note = fmt.Sprintf("BatchRows=%d BatchBytes=%dMiB BatchTimeout=%v DecodeWorkers=%d; %s; timed from the first decode",
		c.BatchRows, c.BatchBytes>>20, c.BatchTimeout, c.DecodeWorkers, e.sinkBusy)
	res.Note += "; until the rows are durable, with one more batch in the topic so that the last batch fills as in a steady stream"
	return res, e.checkCount(ctx, db, n)
}

// runConsumer runs an stream.Consumer until target rows are durable; it
// returns the consumer's configuration, the time from the first decode to
// the write that reached the target, and the rows durable then. tick, when
// set, is called every 500ms while it runs.
func (e *env) runConsumer(ctx context.Context, topic, group string, store *sink.Store, target int64, tick func()) (stream.Config, time.Duration, int64, error) {
	cfg := e.opt.Consumer
	cfg.Brokers, cfg.Topic, cfg.GroupID = e.brokers, topic, group
	cfg.LagInterval = -1
	var first atomic.Int64
	dec := ingest.DecodeRolloutRow(cfg.MaxMessageBytes)
	decode := func(b []byte) (*sink.RolloutRow, error) {
		if first.Load() == 0 {
			first.CompareAndSwap(0, time.Now().UnixNano())
		}
		return dec(b)
	}
	cs := &countingSink{inner: &ingest.RowSink{Store: store}, target: target, done: make(chan struct{})}
	c, err := stream.NewConsumer[*sink.RolloutRow](cfg, decode, cs, e.log, nil)
	if err != nil {
		return cfg, 0, 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(rctx) }()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-cs.done:
			elapsed := time.Duration(cs.doneAt.Load() - first.Load())
			e.sinkBusy = fmt.Sprintf("%d inserts, one open %.0f%% of the time", cs.writes.Load(), 100*float64(cs.busy.Load())/float64(elapsed))
			cancel()
			select {
			case <-runErr:
			case <-time.After(15 * time.Second):
			}
			return c.Config(), elapsed, cs.doneRows.Load(), nil
		case err := <-runErr:
			if err == nil {
				err = errors.New("consumer stopped early")
			}
			return c.Config(), 0, 0, err
		case <-t.C:
			if tick != nil {
				tick()
			}
		case <-ctx.Done():
			return c.Config(), 0, 0, ctx.Err()
		}
	}
}

// Table formats results: per set, each step's throughput, and trace's
// throughput as a ratio of the ceiling and of the obvious loop.
func Table(results []Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s %-27s %8s %10s %8s %9s %11s %11s\n", "set", "step", "rows", "rows/s", "MB/s", "elapsed", "cpu ms/1k", "ch ms/1k")
	bySet := map[Set]map[string]Result{}
	var order []Set
	for _, r := range results {
		if bySet[r.Set] == nil {
			bySet[r.Set] = map[string]Result{}
			order = append(order, r.Set)
		}
		bySet[r.Set][r.Step] = r
		perK := func(d time.Duration) string {
			if d <= 0 {
				return "-"
			}
			return fmt.Sprintf("%.0f", float64(d.Milliseconds())/float64(r.Rows)*1000)
		}
		fmt.Fprintf(&b, "%-8s %-27s %8d %10.0f %8.1f %9s %11s %11s\n", r.Set, r.Step, r.Rows, r.RowsPerSec(), r.MBPerSec(),
			r.Elapsed.Round(10*time.Millisecond), perK(r.CPU), perK(r.ServerCPU))
	}
	b.WriteString("\n")
	for _, set := range order {
		m := bySet[set]
		tr, ok := m[StepTrace]
		if !ok {
			continue
		}
		line := fmt.Sprintf("%-8s trace: %.0f rows/s, %.1f MB/s", set, tr.RowsPerSec(), tr.MBPerSec())
		if c, ok := m[StepCeiling]; ok {
			line += fmt.Sprintf(" = %.2f × ceiling (%.0f rows/s)", tr.RowsPerSec()/c.RowsPerSec(), c.RowsPerSec())
		}
		if o, ok := m[StepObvious]; ok {
			line += fmt.Sprintf(" = %.2f × obvious loop (%.0f rows/s)", tr.RowsPerSec()/o.RowsPerSec(), o.RowsPerSec())
		}
		if k, ok := m[StepBare]; ok {
			line += fmt.Sprintf("; bare kafka-go consume %.0f rows/s", k.RowsPerSec())
		}
		b.WriteString(line + "\n")
		if tr.Note != "" {
			fmt.Fprintf(&b, "%-8s trace config: %s\n", set, tr.Note)
		}
		if c, ok := m[StepCeiling]; ok && c.Note != "" {
			fmt.Fprintf(&b, "%-8s ceiling: %s\n", set, c.Note)
		}
	}
	b.WriteString("\ncpu ms/1k: CPU of this process (consumer + embedded broker) per 1000 rows; ch ms/1k: CPU of the\n" +
		"ClickHouse server per 1000 rows (when bench started it). The ceiling's CPU column excludes clickhouse-client.\n")
	return b.String()
}
