package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
)

// Consumer reads one topic in a consumer group, decodes every message, hands
// the valid ones to a Sink in batches, dead-letters the invalid ones, and
// commits offsets only when both are durable.
//
// # Delivery
//
// At-least-once. The offsets of a batch (the highest offset per partition)
// are committed synchronously (kafka-go CommitMessages, no CommitInterval)
// only after Sink.Write returned nil for the batch's valid records AND every
// invalid message of the batch was acknowledged by all in-sync replicas of
// the DLQ topic. Anything not committed is redelivered after a crash, a
// restart or a rebalance, so the Sink sees duplicates and must be idempotent.
// A commit that lands after a rebalance is still safe: it only ever covers
// records that are durable.
//
// # Pipeline
//
// Three stages, so that on a small machine fetching, decoding and writing
// overlap:
//
//   - the fetch loop (one goroutine) calls FetchMessage and cuts batches by
//     BatchRows, BatchBytes, or BatchTimeout after the batch's first message.
//     It hands a batch to the write stage when it opens it, and its messages
//     to the decode workers in chunks (256 messages or 1 MiB) as they arrive;
//   - DecodeWorkers goroutines decode chunks in parallel; each chunk keeps its
//     message order, and the write stage takes the chunks in fetch order, so
//     records of one partition reach the sink in offset order;
//   - the write stage writes, dead-letters and commits each batch.
//
// For a plain Sink the write stage collects a batch's chunks and calls Write
// when the batch is sealed; the next batch fills meanwhile (one more may
// wait, sealed). At most three batches are in memory then: the one being
// written, one queued, and one being filled.
//
// For a StreamSink (the ingest stage's RowSink) the write stage adds each
// chunk to the batch's Stream as soon as it is decoded and drops it, and a
// committer goroutine commits the Streams in order, so the next batch
// streams while the previous one commits. Memory is then bounded by the
// chunks in flight (at most 16 per batch waiting for the write stage, plus
// the decode queue), not by the batch size: batches can be as large as the
// database likes its inserts.
//
// When the sink is slow or down, these hand-offs fill, the fetch loop blocks
// and stops fetching (kafka-go's own prefetch queue of 100 messages fills
// and stops too). The raw value of a valid message is released as soon as
// it is decoded.
//
// # Errors
//
// Sink errors are classified by Config.IsRetryable: retryable ones are retried
// on the same batch forever with capped, jittered exponential backoff
// (cenkalti/backoff/v4) and a warning per attempt (a StreamSink's batch is
// read again from Kafka for each retry); while that goes on nothing is
// fetched or committed. Any other sink error stops Run, which returns it
// and commits nothing of the failed batch. Kafka errors (fetch, DLQ write,
// commit) are always retried the same way: they never lose data and never
// stop the consumer.
//
// # Dead letters
//
// A message the Decoder rejects (or panics on) goes to Config.DLQTopic with
// its original key, value and headers, byte for byte, plus the headers
// HeaderError, HeaderErrorReason, HeaderStage, HeaderSourceTopic,
// HeaderSourcePartition, HeaderSourceOffset and HeaderFailedAt. A value
// longer than Config.DLQMaxValueBytes (the decoder's size limit) keeps its
// first DLQMaxValueBytes bytes and gets HeaderTruncated and
// HeaderOriginalSize. The DLQ writer uses acks=all, may auto-create the
// topic, and accepts client-side batches of DLQMaxValueBytes+1 MiB. Dead
// letters may be duplicated (a DLQ write that is retried, or a batch
// redelivered), never lost.
//
// Edge case: a dead letter larger than the DLQ topic's max.message.bytes
// (brokers default to about 1 MiB, and on first use an auto-created topic
// gets that default) cannot be stored. The consumer
// logs an error and writes the dead letter with an empty value, its key and
// headers, plus HeaderOriginalSize (the value's size) and HeaderDLQError (the
// broker's error); the original stays readable in the source topic at the
// coordinates in the headers until retention removes it. (If even that is
// refused it is written without its key, and failing that skipped with an
// error log.) Create the DLQ topic with max.message.bytes at least as large
// as the source topic's to avoid this.
//
// # Shutdown
//
// See Run. kafka-go's Reader.Close blocks until the partition readers'
// fetch long-polls return (it reads out the current fetch response), which
// with its default 10 s MaxWait made an idle shutdown take ~7–9 s; the reader
// is configured with a 2 s MaxWait (a 1 s broker long-poll), and Run additionally closes the reader in
// the background with a bounded wait.
//
// # Metrics
//
// See NewMetrics. The lag gauge is polled every Config.LagInterval as the
// partitions' high watermarks (ListOffsets) minus the group's committed
// offsets (OffsetFetch), the way external monitors compute it, because
// kafka-go's group Reader.Stats().Lag only reflects the partition read last
// and Reader.ReadLag refuses consumer groups. Being commit-based it includes
// the batches in flight and keeps rising while the sink applies
// backpressure.
type Consumer[T any] struct {
	cfg     Config
	dec     Decoder[T]
	sink    Sink[T]
	log     *slog.Logger
	met     *consumerMetrics
	running atomic.Bool
	problem atomic.Pointer[stalled] // why no batch gets through now (nil: none)
}

// stalled is why a consumer makes no progress: what fails, since when,
// after how many attempts, and the last error.
type stalled struct {
	what    string
	since   time.Time
	attempt int
	err     error
}

func (s *stalled) Error() string {
	return fmt.Sprintf("%s for %s (%d attempts): %v", s.what, time.Since(s.since).Round(time.Second), s.attempt, s.err)
}

// problemGrace is how long a consumer is held before Problem reports it:
// one retried insert (a moment of TOO_MANY_PARTS) is not an outage.
const problemGrace = 5 * time.Second

// Problem says why the consumer has made no progress for problemGrace or
// longer, nil while it does: its sink failing and the batch being retried
// (a full disk, a ClickHouse that refuses inserts while it answers pings),
// or, before it starts, its topic missing or Kafka unreachable. /readyz
// reports it.
func (c *Consumer[T]) Problem() error {
	if p := c.problem.Load(); p != nil && time.Since(p.since) >= problemGrace {
		return p
	}
	return nil
}

// NewConsumer checks cfg (after filling in its defaults) and returns a
// Consumer. It connects to nothing: Run does. logger nil means slog.Default();
// m nil records no metrics.
func NewConsumer[T any](cfg Config, dec Decoder[T], sink Sink[T], logger *slog.Logger, m *Metrics) (*Consumer[T], error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if dec == nil {
		return nil, errors.New("stream: NewConsumer: nil Decoder")
	}
	if sink == nil {
		return nil, errors.New("stream: NewConsumer: nil Sink")
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Consumer[T]{
		cfg:  cfg,
		dec:  dec,
		sink: sink,
		log:  logger.With("component", "consumer", "stage", cfg.Stage, "topic", cfg.Topic, "group", cfg.GroupID),
		met:  m.bind(cfg.Stage, cfg.Topic),
	}, nil
}

// Config returns the configuration in effect (with defaults filled in).
func (c *Consumer[T]) Config() Config { return c.cfg }

// errDrainExpired means the drain deadline ended a retry loop: the batch in
// flight was not committed and will be redelivered.
var errDrainExpired = errors.New("drain deadline expired")

// errGivenUp means the sink gave its batch up while the consumer stops
// (ErrStopped): not committed, redelivered.
var errGivenUp = errors.New("given up at shutdown")

// Bounds of Run's shutdown.
const (
	abandonGrace = 250 * time.Millisecond // past DrainTimeout before a stuck sink is abandoned
	closeSlack   = 900 * time.Millisecond // past DrainTimeout for closing the reader and writer
	minCloseWait = 300 * time.Millisecond
	// readerMaxWait is kafka-go's fetch MaxWait. kafka-go asks the broker to
	// wait MaxWait minus up to 1s of assumed RTT and sets the connection
	// deadline at MaxWait: 2s means a 1s long-poll with 1s of slack (at 1s
	// the slack is 250ms, and a loaded broker answering later makes kafka-go
	// drop the connection with an i/o timeout). It also bounds how long
	// Reader.Close blocks, which with the 10s default is ~9s.
	readerMaxWait = 2 * time.Second
)

// Run consumes until ctx is cancelled or a fatal error occurs.
//
// On cancellation it stops fetching and seals the batch being filled; the
// batch the write stage holds (with a StreamSink: also the one committing)
// is finished (sink write, dead letters, commit) within Config.DrainTimeout;
// batches not yet taken by the write stage are dropped without committing
// them (they are redelivered to whoever owns their partitions next). It
// then closes the reader and the DLQ
// writer, and returns nil. It returns within about DrainTimeout + 1s of the
// cancellation even if the broker or the sink hang: the Kafka clients are
// closed in the background with a bounded wait, and a Sink.Write that ignores
// its context is abandoned.
//
// A Sink error that is not retryable is returned (after the same closing),
// with nothing of the failed batch committed. Kafka errors (fetch, DLQ write,
// commit) are logged and retried with backoff: they never stop the consumer.
//
// Run may not be called concurrently. After it returned it may be called
// again, unless it had to abandon a Sink.Write (which may still be running:
// Write is never called concurrently).
func (c *Consumer[T]) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("stream: Consumer.Run is already running (or abandoned a stuck Sink.Write)")
	}
	abandoned := false
	defer func() {
		if !abandoned {
			c.running.Store(false)
		}
	}()
	if ctx.Err() != nil {
		return nil
	}
	if !c.waitForTopic(ctx) {
		return nil // ctx ended
	}

	tr := newTransport(c.cfg.Dialer)
	reader := kafka.NewReader(c.readerConfig())
	dlq := newDLQWriter(c.cfg, tr, c.log, c.met)

	runCtx, cancelRun := context.WithCancel(ctx) // ends fetching and decoding
	defer cancelRun()
	// work is the context of the batch in flight: detached from ctx so that
	// it can finish, cancelled DrainTimeout after ctx (or on return).
	// It carries Stopping's channel: runCtx's end.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	work = WithStopping(work, runCtx.Done())
	var stopAt atomic.Int64 // unix nanos at which stopping began
	watchDone := make(chan struct{})
	go func() {
		select {
		case <-runCtx.Done():
		case <-watchDone:
			return
		}
		stopAt.CompareAndSwap(0, time.Now().UnixNano())
		t := time.NewTimer(c.cfg.DrainTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			cancelWork()
		case <-watchDone:
		}
	}()
	defer close(watchDone)

	c.log.Info("consumer starting", "brokers", c.cfg.Brokers, "dlq_topic", c.cfg.DLQTopic,
		"batch_rows", c.cfg.BatchRows, "batch_bytes", c.cfg.BatchBytes, "batch_timeout", c.cfg.BatchTimeout,
		"decode_workers", c.cfg.DecodeWorkers)

	jobs := make(chan *chunk[T], 2*c.cfg.DecodeWorkers)
	batches := make(chan *batch[T], 1)

	var workers sync.WaitGroup
	for range c.cfg.DecodeWorkers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			c.decodeWorker(jobs)
		}()
	}
	fetchDone := make(chan struct{})
	go func() {
		defer close(fetchDone)
		defer close(jobs)
		c.fetchLoop(runCtx, work, reader, jobs, batches)
	}()
	lagDone := make(chan struct{})
	go func() {
		defer close(lagDone)
		c.lagLoop(runCtx, tr)
	}()
	writeDone := make(chan error, 1)
	go func() { writeDone <- c.writeLoop(runCtx, work, reader, dlq, batches) }()

	var err error
	select {
	case err = <-writeDone:
	case <-fetchDone:
		// Only a closed reader ends the fetch loop on its own. Stop like on a
		// cancellation (the writer finishes its batch), but report it.
		cancelRun()
		t := time.NewTimer(c.cfg.DrainTimeout + abandonGrace)
		select {
		case err = <-writeDone:
		case <-t.C:
			abandoned = true
		}
		t.Stop()
		if err == nil && ctx.Err() == nil {
			err = errors.New("stream: the Kafka reader stopped unexpectedly")
		}
	case <-ctx.Done():
		// The writer finishes its batch under work, which ends DrainTimeout
		// from now; past that (plus a grace) a sink ignoring ctx is abandoned.
		t := time.NewTimer(c.cfg.DrainTimeout + abandonGrace)
		select {
		case err = <-writeDone:
		case <-t.C:
			abandoned = true
			c.log.Error("sink did not return after the drain deadline; abandoning it (its batch is not committed)")
		}
		t.Stop()
	}
	stopAt.CompareAndSwap(0, time.Now().UnixNano())
	cancelRun()
	cancelWork() // the writer is done (or abandoned): nothing waits for it any more
	<-fetchDone
	workers.Wait()
	<-lagDone

	// Close the Kafka clients in the background and wait a bounded time:
	// kafka-go's Reader.Close can block for the length of a fetch long-poll,
	// and it leaves the group only after that.
	closeBy := time.Unix(0, stopAt.Load()).Add(c.cfg.DrainTimeout + closeSlack)
	wait := max(time.Until(closeBy), minCloseWait)
	closed := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); _ = reader.Close() }()
		go func() { defer wg.Done(); _ = dlq.close() }()
		wg.Wait()
		tr.CloseIdleConnections()
		close(closed)
	}()
	t := time.NewTimer(wait)
	select {
	case <-closed:
	case <-t.C:
		c.log.Warn("kafka clients did not close in time; leaving them to finish in the background", "waited", wait)
	}
	t.Stop()

	if err != nil {
		c.log.Error("consumer stopped", "error", err)
		return err
	}
	c.log.Info("consumer stopped")
	return nil
}

// topicWarnEvery is how often waitForTopic repeats its warning.
const topicWarnEvery = 10 * time.Second

// waitForTopic returns true once a broker lists the source topic's
// partitions, false if ctx ended first; meanwhile it retries with the
// consumer's backoff and warns (at most every topicWarnEvery) naming the
// topic and the error. kafka-go's group reader started on a topic that
// does not exist (not created yet, or a misspelled topic setting on a
// cluster that does not create topics on use) rejoins its group in a tight
// loop: its partition watcher ends each generation at once, and a
// generation that ends without an error is followed by the next without
// backoff (about 1,400 warnings a second and most of a core). The lookup is
// the reader's own (Conn.ReadPartitions), so a cluster that creates topics
// on use creates it here as it would there.
func (c *Consumer[T]) waitForTopic(ctx context.Context) bool {
	d := c.cfg.Dialer
	if d == nil {
		d = kafka.DefaultDialer
	}
	bo := c.newBackOff()
	var warned time.Time
	since := time.Now()
	for attempt := 1; ; attempt++ {
		err := c.lookupTopic(ctx, d)
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			c.problem.Store(nil)
			if !warned.IsZero() {
				c.log.Info("topic found; consuming", "attempts", attempt)
			}
			return true
		}
		wait := bo.NextBackOff()
		what := "kafka not reachable"
		if errors.Is(err, kafka.UnknownTopicOrPartition) {
			what = "topic " + c.cfg.Topic + " does not exist"
		}
		c.problem.Store(&stalled{what: what, since: since, attempt: attempt, err: err})
		if warned.IsZero() || time.Since(warned) >= topicWarnEvery {
			warned = time.Now()
			msg := "kafka not reachable; waiting for it"
			if errors.Is(err, kafka.UnknownTopicOrPartition) {
				msg = "topic does not exist; waiting for it to be created (or check the topic setting)"
			}
			c.log.Warn(msg, "brokers", c.cfg.Brokers, "attempts", attempt, "next_in", wait.Round(time.Millisecond), "error", err)
		}
		if !sleep(ctx, wait) {
			return false
		}
	}
}

// lookupTopic reads the source topic's partitions from the first broker
// that answers.
func (c *Consumer[T]) lookupTopic(ctx context.Context, d *kafka.Dialer) error {
	var errs []error
	for _, b := range c.cfg.Brokers {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ps, err := d.LookupPartitions(lctx, "tcp", b, c.cfg.Topic)
		cancel()
		switch {
		case err == nil && len(ps) > 0:
			return nil
		case err == nil:
			return kafka.UnknownTopicOrPartition
		case errors.Is(err, kafka.UnknownTopicOrPartition) || ctx.Err() != nil:
			return err
		}
		errs = append(errs, fmt.Errorf("%s: %w", b, err))
	}
	return errors.Join(errs...)
}

func (c *Consumer[T]) readerConfig() kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers:               c.cfg.Brokers,
		GroupID:               c.cfg.GroupID,
		Topic:                 c.cfg.Topic,
		Dialer:                c.cfg.Dialer,
		MinBytes:              1,
		MaxBytes:              c.cfg.MaxMessageBytes,
		MaxWait:               readerMaxWait,
		StartOffset:           c.cfg.StartOffset,
		CommitInterval:        0, // synchronous commits through CommitMessages only
		WatchPartitionChanges: true,
		SessionTimeout:        c.cfg.SessionTimeout,
		RebalanceTimeout:      c.cfg.RebalanceTimeout,
		HeartbeatInterval:     heartbeat(c.cfg.SessionTimeout),
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) {
			c.log.Warn("kafka-go: "+fmt.Sprintf(msg, args...), "source", "kafka-go")
		}),
	}
}

// heartbeat is the group heartbeat interval for a session timeout: a
// third of it (the usual rule: two heartbeats may be lost before the
// session expires), at most kafka-go's 3 s.
func heartbeat(session time.Duration) time.Duration {
	return min(3*time.Second, session/3)
}

// newTransport builds the transport of the DLQ writer and the lag poller from
// the reader's dialer, so that TLS, SASL and the client id apply to all
// connections. (Dialer.Resolver is not carried over.)
func newTransport(d *kafka.Dialer) *kafka.Transport {
	if d == nil {
		d = kafka.DefaultDialer
	}
	dial := d.DialFunc
	if dial == nil {
		nd := &net.Dialer{Timeout: d.Timeout, Deadline: d.Deadline, LocalAddr: d.LocalAddr,
			FallbackDelay: d.FallbackDelay, KeepAlive: d.KeepAlive}
		dial = nd.DialContext
	}
	return &kafka.Transport{
		Dial:        dial,
		DialTimeout: d.Timeout,
		ClientID:    d.ClientID,
		TLS:         d.TLS,
		SASL:        d.SASLMechanism,
		IdleTimeout: 30 * time.Second,
	}
}

// A batch is the unit of sink writes and commits. The fetch loop creates it
// at its first message and hands it to the write stage at once; it then
// hands the batch's messages to the decode workers in chunks and passes each
// chunk on through ready, in fetch order, and closes ready when the batch is
// sealed. The write stage takes the chunks from ready as they are decoded.
type batch[T any] struct {
	ready chan *chunk[T]
	// Written by the fetch loop; the write stage reads them after ready
	// is closed.
	rows, bytes int
	firstOff    map[int]int64         // per partition, the lowest offset (for re-reading)
	last        map[int]kafka.Message // per partition, the coordinates of the highest offset
	incomplete  atomic.Bool           // a chunk was left out (drain deadline): never commit this batch
}

// A chunk is a slice of a batch decoded by one worker, in message order.
type chunk[T any] struct {
	msgs  []kafka.Message // released after decoding
	bytes int
	recs  []Record[T]
	dead  []*deadLetter
	done  chan struct{} // closed when decoded
}

// Chunks are cut at whichever comes first.
const (
	chunkRows  = 256
	chunkBytes = 1 << 20
	// streamChunks bounds the decoded chunks a streaming batch may have
	// waiting for the write stage (about streamChunks MiB of messages).
	streamChunks = 16
	// maxChunks bounds a plain Sink's chunks waiting for the write stage.
	maxChunks = 1024
)

func (c *Consumer[T]) fetchLoop(ctx, work context.Context, r *kafka.Reader, jobs chan<- *chunk[T], out chan<- *batch[T]) {
	var (
		b            *batch[T]
		cur          *chunk[T]
		bctx         context.Context // ends at the batch's timeout
		bcancel      context.CancelFunc
		deadline     time.Time
		bo           = c.newBackOff()
		_, streaming = c.sink.(StreamSink[T])
	)
	// A plain Sink's write stage collects the chunks as they come but
	// writes only sealed batches: while it writes, the next batch fills,
	// up to maxChunks chunks.
	readyCap := min(c.cfg.BatchRows, maxChunks) + 1
	if streaming {
		readyCap = streamChunks
	}
	// give passes a chunk to the decode workers, then to the write stage
	// (in fetch order). Blocked at shutdown, it goes on waiting until work
	// ends: the write stage finishes the batch it holds. false when the
	// chunk could not be passed on (the batch is then incomplete).
	give := func(ch *chunk[T]) bool {
		toWorkers := func(x context.Context) bool {
			select {
			case jobs <- ch:
				return true
			case <-x.Done():
				return false
			}
		}
		toWriter := func(x context.Context) bool {
			select {
			case b.ready <- ch:
				return true
			case <-x.Done():
				return false
			}
		}
		return (toWorkers(ctx) || toWorkers(work)) && (toWriter(ctx) || toWriter(work))
	}
	// seal closes the current batch: its last chunk goes out and ready is
	// closed. At shutdown too: the write stage finishes (and commits) the
	// batch it holds, within the drain deadline.
	seal := func() {
		if bcancel != nil {
			bcancel()
		}
		if cur != nil && len(cur.msgs) > 0 && !give(cur) {
			b.incomplete.Store(true)
		}
		close(b.ready)
		b, cur, bctx, bcancel = nil, nil, nil, nil
	}
	defer func() {
		if b != nil {
			seal()
		}
	}()

	for {
		fctx := ctx
		if b != nil {
			fctx = bctx
		}
		m, err := r.FetchMessage(fctx)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return // shutdown: the deferred seal ends the partial batch
			case b != nil && bctx.Err() != nil:
				seal()
			case errors.Is(err, io.EOF):
				c.log.Error("reader closed unexpectedly")
				return
			default:
				wait := bo.NextBackOff()
				c.met.error("fetch")
				c.log.Warn("fetch failed; retrying", "error", err, "retry_in", wait)
				if !sleep(ctx, wait) {
					return
				}
			}
			continue
		}
		bo.Reset()
		if b == nil {
			nb := &batch[T]{ready: make(chan *chunk[T], readyCap), firstOff: make(map[int]int64), last: make(map[int]kafka.Message)}
			select {
			case out <- nb:
			case <-ctx.Done():
				return // not taken by the write stage: dropped, uncommitted
			}
			b = nb
			// The timeout runs from when the write stage can take the batch.
			deadline = time.Now().Add(c.cfg.BatchTimeout)
			bctx, bcancel = batchContext(ctx, deadline)
		}
		if cur == nil {
			cur = &chunk[T]{msgs: make([]kafka.Message, 0, chunkRows), done: make(chan struct{})}
		}
		size := len(m.Key) + len(m.Value)
		cur.msgs = append(cur.msgs, m)
		cur.bytes += size
		b.rows++
		b.bytes += size
		if _, ok := b.firstOff[m.Partition]; !ok {
			b.firstOff[m.Partition] = m.Offset
		}
		b.last[m.Partition] = kafka.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
		c.met.addConsumed(1)
		if len(cur.msgs) >= chunkRows || cur.bytes >= chunkBytes {
			ch := cur
			cur = nil
			if !give(ch) {
				b.incomplete.Store(true)
				return
			}
		}
		if b.rows >= c.cfg.BatchRows || b.bytes >= c.cfg.BatchBytes || !time.Now().Before(deadline) {
			seal()
		}
	}
}

// batchContext is the context of the fetches into one batch: it ends at the
// batch's timeout. The fetch loop cancels it when the batch is sealed.
func batchContext(parent context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	return context.WithDeadline(parent, deadline)
}

// decodeWorker decodes chunks until jobs is closed, shutdown included: the
// chunks of the batch being drained must be decoded, and the rest are few
// (jobs is small).
func (c *Consumer[T]) decodeWorker(jobs <-chan *chunk[T]) {
	for ch := range jobs {
		c.decodeChunk(ch)
		close(ch.done)
	}
}

func (c *Consumer[T]) decodeChunk(ch *chunk[T]) {
	ch.recs = make([]Record[T], 0, len(ch.msgs))
	for i := range ch.msgs {
		m := &ch.msgs[i]
		v, err := c.decode(m.Value)
		if err != nil {
			ch.dead = append(ch.dead, &deadLetter{msg: *m, err: err, reason: DeadLetterReason(err), failedAt: time.Now()})
			continue
		}
		ch.recs = append(ch.recs, record(m, v))
	}
	ch.msgs = nil // the raw values of valid records are no longer needed
}

// record is the Record of message m decoded to v.
func record[T any](m *kafka.Message, v T) Record[T] {
	return Record[T]{Value: v, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Time: m.Time, Size: len(m.Value)}
}

func (c *Consumer[T]) decode(value []byte) (v T, err error) {
	defer func() {
		if p := recover(); p != nil {
			var zero T
			v, err = zero, &panicError{v: p}
		}
	}()
	return c.dec(value)
}

// errIncomplete means a batch lost chunks at shutdown: it is not committed.
var errIncomplete = errors.New("batch incomplete at shutdown")

// next returns the batch's next decoded chunk, nil when the batch is sealed
// and every chunk was returned, or errIncomplete when work ended first.
func (b *batch[T]) next(work context.Context) (*chunk[T], error) {
	select {
	case ch, ok := <-b.ready:
		if !ok {
			return nil, nil
		}
		select {
		case <-ch.done:
			return ch, nil
		case <-work.Done():
			return nil, errIncomplete
		}
	case <-work.Done():
		return nil, errIncomplete
	}
}

func (c *Consumer[T]) writeLoop(ctx, work context.Context, r *kafka.Reader, dlq *dlqWriter, in <-chan *batch[T]) error {
	if ss, ok := c.sink.(StreamSink[T]); ok {
		return c.streamLoop(ctx, work, r, dlq, ss, in)
	}
	for {
		if ctx.Err() != nil {
			return nil
		}
		var b *batch[T]
		select {
		case b = <-in:
		case <-ctx.Done():
			return nil
		}
		if stop, err := c.verdict(c.processBatch(work, r, dlq, b), b); stop {
			return err
		}
	}
}

// verdict turns the outcome of a batch into the write stage's: go on (nil),
// stop quietly when a shutdown left the batch uncommitted (logged; it is
// redelivered), or stop with the error.
func (c *Consumer[T]) verdict(err error, b *batch[T]) (stop bool, _ error) {
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, errIncomplete):
		c.log.Warn("stopping: the batch in flight is incomplete and not committed; it will be redelivered", "rows", b.rows)
		return true, nil
	case errors.Is(err, errDrainExpired):
		c.log.Warn("drain deadline expired; the batch in flight is not committed and will be redelivered",
			"rows", b.rows, "error", err)
		return true, nil
	case errors.Is(err, errGivenUp):
		c.log.Info("stopping: the sink gave up the batch in flight; it is not committed and will be redelivered",
			"rows", b.rows, "reason", err)
		return true, nil
	}
	return true, err
}

// processBatch collects a batch's decoded chunks and makes it durable with
// Sink.Write, retried in place.
func (c *Consumer[T]) processBatch(work context.Context, r *kafka.Reader, dlq *dlqWriter, b *batch[T]) error {
	var recs []Record[T]
	var dead []*deadLetter
	for {
		ch, err := b.next(work)
		if err != nil {
			return err
		}
		if ch == nil {
			break
		}
		recs = append(recs, ch.recs...)
		dead = append(dead, ch.dead...)
		ch.recs, ch.dead = nil, nil
	}
	if b.incomplete.Load() {
		return errIncomplete
	}
	c.met.batch(b.rows, b.bytes)
	if len(recs) > 0 {
		err := c.retry(work, func(ctx context.Context) error {
			start := time.Now()
			err := c.sink.Write(ctx, recs)
			if err == nil {
				c.met.insert(time.Since(start).Seconds())
			}
			return err
		}, c.fatal, c.onSinkRetry(len(recs)))
		if err != nil {
			return c.sinkError(err)
		}
		c.problem.Store(nil)
		c.met.addInserted(len(recs))
	}
	return c.finish(work, r, dlq, b, dead)
}

func (c *Consumer[T]) fatal(err error) bool { return !c.cfg.IsRetryable(err) }

func (c *Consumer[T]) onSinkRetry(rows int) func(attempt int, err error, wait time.Duration) {
	since := time.Now()
	return func(attempt int, err error, wait time.Duration) {
		c.problem.Store(&stalled{what: "sink failing", since: since, attempt: attempt, err: err})
		c.met.sinkRetry()
		c.log.Warn("sink write failed; retrying the batch", "attempt", attempt, "rows", rows,
			"error", err, "retry_in", wait)
	}
}

func (c *Consumer[T]) sinkError(err error) error {
	if errors.Is(err, errDrainExpired) || errors.Is(err, errIncomplete) || errors.Is(err, errGivenUp) {
		return err
	}
	return fmt.Errorf("stream: sink: %w", err)
}

// streamLoop is the write stage for a StreamSink, in two steps so that a
// batch streams while the previous one commits: this goroutine adds each
// batch's chunks to a Stream as they are decoded (releasing them), and a
// committer goroutine commits the Streams in batch order, retries a failed
// batch by reading it again from Kafka (with backoff; meanwhile the next
// batch cannot be handed over, so fetching stops), dead-letters and commits
// the offsets. At most two INSERTs are open.
func (c *Consumer[T]) streamLoop(ctx, work context.Context, r *kafka.Reader, dlq *dlqWriter, ss StreamSink[T], in <-chan *batch[T]) error {
	commits := make(chan *pending[T])
	cdone := make(chan struct{})
	var cerr error
	go func() {
		defer close(cdone)
		for p := range commits {
			var stop bool
			if stop, cerr = c.verdict(c.commitStream(work, r, dlq, ss, p), p.b); stop {
				return
			}
		}
	}()
	stop := func() error {
		close(commits)
		<-cdone
		return cerr
	}
	for {
		if ctx.Err() != nil {
			return stop()
		}
		var b *batch[T]
		select {
		case b = <-in:
		case <-ctx.Done():
			return stop()
		case <-cdone:
			return stop()
		}
		p := &pending[T]{b: b, start: time.Now()}
		p.st, p.n, p.err = c.streamLive(work, ss, b, &p.dead)
		if errors.Is(p.err, errIncomplete) {
			c.verdict(p.err, b) //nolint:errcheck // logs; the verdict is to stop
			return stop()
		}
		if p.err == nil {
			c.met.batch(b.rows, b.bytes)
		}
		select {
		case commits <- p:
		case <-cdone:
			if p.st != nil {
				p.st.Abort()
			}
			return stop()
		}
	}
}

// pending is a streamed batch on its way to the committer.
type pending[T any] struct {
	b     *batch[T]
	st    Stream[T] // nil when the batch had no valid record or Begin failed
	n     int       // records added
	err   error     // of the live pass
	dead  []*deadLetter
	start time.Time
}

// commitStream commits a streamed batch; if the live pass or its commit
// failed with a retryable error, the batch is read again from Kafka and
// written to a new Stream, with backoff, until that succeeds. Then it
// dead-letters and commits the offsets.
func (c *Consumer[T]) commitStream(work context.Context, r *kafka.Reader, dlq *dlqWriter, ss StreamSink[T], p *pending[T]) error {
	err := p.err
	if err == nil && p.st != nil {
		err = p.st.Commit()
	}
	if p.st != nil {
		p.st.Abort()
	}
	if err != nil {
		live, attempt := err, 0
		err = c.retry(work, func(ctx context.Context) error {
			if attempt++; attempt == 1 {
				return live // the first attempt was the live pass
			}
			n, rerr := c.streamAgain(ctx, ss, p.b)
			p.n = n
			return rerr
		}, c.fatal, c.onSinkRetry(p.b.rows))
		if err != nil {
			return c.sinkError(err)
		}
		c.problem.Store(nil)
	}
	if p.n > 0 {
		c.met.insert(time.Since(p.start).Seconds())
		c.met.addInserted(p.n)
	}
	return c.finish(work, r, dlq, p.b, p.dead)
}

// streamLive adds the batch's records to a Stream as its chunks arrive and
// returns the Stream uncommitted (nil when there was no valid record). It
// always reads the batch to its end (to collect the dead letters and the
// offsets), also after the Stream failed.
func (c *Consumer[T]) streamLive(ctx context.Context, ss StreamSink[T], b *batch[T], dead *[]*deadLetter) (Stream[T], int, error) {
	var st Stream[T]
	var serr error
	n := 0
	for {
		ch, err := b.next(ctx)
		if err != nil {
			serr = err
			break
		}
		if ch == nil {
			break
		}
		*dead = append(*dead, ch.dead...)
		if serr == nil && len(ch.recs) > 0 {
			if st == nil {
				st, serr = ss.Begin(ctx)
			}
			if serr == nil {
				serr = st.Add(ch.recs)
				n += len(ch.recs)
			}
		}
		ch.recs, ch.dead = nil, nil
	}
	if b.incomplete.Load() {
		serr = errIncomplete
	}
	if serr != nil && st != nil {
		st.Abort()
		st = nil
	}
	return st, n, serr
}

// streamAgain reads the batch's offset ranges from Kafka again, partition by
// partition, and writes its valid records to a new Stream.
func (c *Consumer[T]) streamAgain(ctx context.Context, ss StreamSink[T], b *batch[T]) (int, error) {
	st, err := ss.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer st.Abort()
	n := 0
	recs := make([]Record[T], 0, chunkRows)
	flush := func() error {
		n += len(recs)
		err := st.Add(recs)
		recs = recs[:0]
		return err
	}
	for p, lo := range b.firstOff {
		hi := b.last[p].Offset
		if err := c.readRange(ctx, p, lo, hi, func(m *kafka.Message) error {
			v, err := c.decode(m.Value)
			if err != nil {
				return nil // dead-lettered on the first pass
			}
			if recs = append(recs, record(m, v)); len(recs) == chunkRows {
				return flush()
			}
			return nil
		}); err != nil {
			return n, err
		}
	}
	if len(recs) > 0 {
		if err := flush(); err != nil {
			return n, err
		}
	}
	if n == 0 {
		return 0, nil
	}
	return n, st.Commit()
}

// readRange calls fn for every message of partition p from offset lo to hi
// (inclusive), read outside the consumer group.
func (c *Consumer[T]) readRange(ctx context.Context, p int, lo, hi int64, fn func(*kafka.Message) error) error {
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: c.cfg.Brokers, Topic: c.cfg.Topic, Partition: p, Dialer: c.cfg.Dialer,
		MinBytes: 1, MaxBytes: c.cfg.MaxMessageBytes, MaxWait: readerMaxWait})
	defer closeInBackground(rd)
	if err := rd.SetOffset(lo); err != nil {
		return fmt.Errorf("re-read partition %d from offset %d: %w", p, lo, err)
	}
	for {
		m, err := rd.FetchMessage(ctx)
		if err != nil {
			return fmt.Errorf("re-read partition %d at offset %d..%d: %w", p, lo, hi, err)
		}
		if m.Offset > hi {
			return nil
		}
		if err := fn(&m); err != nil {
			return err
		}
		if m.Offset == hi {
			return nil
		}
	}
}

// closeInBackground closes a reader without waiting for its fetch long-poll.
func closeInBackground(rd *kafka.Reader) { go func() { _ = rd.Close() }() }

// finish dead-letters the batch's invalid messages and commits its offsets,
// each retried with backoff until it succeeds or work ends (errDrainExpired).
func (c *Consumer[T]) finish(work context.Context, r *kafka.Reader, dlq *dlqWriter, b *batch[T], dead []*deadLetter) error {
	if len(dead) > 0 && c.cfg.SkipInvalid {
		for _, dl := range dead {
			c.met.skipped(dl.reason)
		}
		c.log.Debug("skipping invalid messages (another stage dead-letters them)", "count", len(dead))
		dead = nil
	}
	if len(dead) > 0 {
		reasons := map[string]int{}
		for _, dl := range dead {
			reasons[dl.reason]++
			c.log.Debug("dead-lettering message", "partition", dl.msg.Partition, "offset", dl.msg.Offset,
				"reason", dl.reason, "error", capString(dl.err.Error(), 512))
		}
		c.log.Info("dead-lettering messages", "count", len(dead), "reasons", reasons, "dlq_topic", c.cfg.DLQTopic)
		err := c.retry(work, func(ctx context.Context) error { return dlq.write(ctx, dead) }, nil,
			func(attempt int, err error, wait time.Duration) {
				c.met.error("dlq")
				c.log.Warn("dead-letter write failed; retrying", "attempt", attempt, "dlq_topic", c.cfg.DLQTopic,
					"error", err, "retry_in", wait)
			})
		if err != nil {
			return err
		}
	}

	offsets := slices.Collect(maps.Values(b.last))
	return c.retry(work, func(ctx context.Context) error {
		start := time.Now()
		err := r.CommitMessages(ctx, offsets...)
		if err == nil {
			c.met.commit(time.Since(start).Seconds())
		}
		return err
	}, nil, func(attempt int, err error, wait time.Duration) {
		c.met.error("commit")
		c.log.Warn("offset commit failed; retrying", "attempt", attempt, "error", err, "retry_in", wait)
	})
}
