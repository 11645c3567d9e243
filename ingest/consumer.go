package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/listoffsets"
)

// Record is one decoded message with its Kafka coordinates.
type Record[T any] struct {
	Value     T
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Time      time.Time // the message timestamp
	Size      int       // bytes of the encoded value
}

// Sink makes a batch durable.
//
// Write returns nil only when every record of the batch is durable: that is
// the promise that lets the consumer commit the batch's offsets. It may see
// the same records again after a failure, a rebalance or a restart
// (at-least-once), so it must be idempotent.
//
// An error for which Config.IsRetryable is true makes the consumer retry the
// same batch (same slice, same order) with capped exponential backoff, forever
// until Run's context ends, while it fetches nothing and commits nothing
// (backpressure). Any other error stops the consumer: Run returns it.
//
// Write is called from one goroutine at a time, never with an empty batch.
// Its ctx is not Run's: after Run's context is cancelled, the batch in flight
// gets Config.DrainTimeout more to finish, and ctx ends then. Write must
// return promptly when ctx ends. The batch slice is not reused after Write
// returns nil, so a Sink may keep it.
type Sink[T any] interface {
	Write(ctx context.Context, batch []Record[T]) error
}

// SinkFunc adapts a function to a Sink.
type SinkFunc[T any] func(ctx context.Context, batch []Record[T]) error

// Write calls f.
func (f SinkFunc[T]) Write(ctx context.Context, batch []Record[T]) error { return f(ctx, batch) }

// Decoder turns a message value into T. It is called concurrently from
// Config.DecodeWorkers goroutines. An error (or a panic) sends the message,
// untouched, to the dead-letter topic; the reason header is the Reason of a
// *schemas.Error in the error's chain, else "decode" ("panic" for a panic).
// The decoder must not keep value: the consumer releases it afterwards.
type Decoder[T any] func(value []byte) (T, error)

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
//     While it fills a batch it hands chunks of it (256 messages or 1 MiB) to
//     the decode workers, so decoding starts before the batch is complete;
//   - DecodeWorkers goroutines decode chunks in parallel; each chunk keeps its
//     message order, and the batch is reassembled in fetch order, so records
//     of one partition reach the sink in offset order;
//   - the write stage (one goroutine) waits for a batch's decoding, then
//     writes, dead-letters and commits it.
//
// The fetch loop hands sealed batches to the write stage through a channel of
// capacity 1. When the sink is slow or down, that channel fills, the fetch
// loop blocks on it and stops fetching (kafka-go's own prefetch queue of 100
// messages fills and stops too). At most three batches are in memory: the one
// being written, one queued, and one being filled; the raw value of a valid
// message is released as soon as it is decoded.
//
// # Errors
//
// Sink errors are classified by Config.IsRetryable: retryable ones are retried
// on the same batch forever with capped, jittered exponential backoff
// (cenkalti/backoff/v4) and a warning per attempt; while that goes on nothing
// is fetched or committed. Any other sink error stops Run, which returns it
// and commits nothing of the failed batch. Kafka errors (fetch, DLQ write,
// commit) are always retried the same way: they never lose data and never
// stop the consumer.
//
// # Dead letters
//
// A message the Decoder rejects (or panics on) goes to Config.DLQTopic with
// its original key, value and headers, byte for byte, plus the headers
// HeaderError, HeaderErrorReason, HeaderStage, HeaderSourceTopic,
// HeaderSourcePartition, HeaderSourceOffset and HeaderFailedAt. The DLQ
// writer uses acks=all, may auto-create the topic, and accepts client-side
// batches of 2×MaxMessageBytes+1 MiB, so a value larger than the decoder's
// limit is still written as is. Dead letters may be duplicated (a DLQ write
// that is retried, or a batch redelivered), never lost.
//
// Edge case: a dead letter larger than the DLQ topic's max.message.bytes
// (brokers default to about 1 MiB, and on first use an auto-created topic
// gets that default) cannot be stored. Nothing is truncated: the consumer
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
		return nil, errors.New("ingest: NewConsumer: nil Decoder")
	}
	if sink == nil {
		return nil, errors.New("ingest: NewConsumer: nil Sink")
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
// On cancellation it stops fetching, lets the batch being written finish
// (sink write, dead letters, commit) for at most Config.DrainTimeout, drops
// the batches not yet written without committing them (they are redelivered
// to whoever owns their partitions next), closes the reader and the DLQ
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
		return errors.New("ingest: Consumer.Run is already running (or abandoned a stuck Sink.Write)")
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

	tr := newTransport(c.cfg.Dialer)
	reader := kafka.NewReader(c.readerConfig())
	dlq := newDLQWriter(c.cfg, tr, c.log, c.met)

	runCtx, cancelRun := context.WithCancel(ctx) // ends fetching and decoding
	defer cancelRun()
	// work is the context of the batch in flight: detached from ctx so that
	// it can finish, cancelled DrainTimeout after ctx (or on return).
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
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

	jobs := make(chan decodeJob[T], 2*c.cfg.DecodeWorkers)
	batches := make(chan *batch[T], 1)

	var workers sync.WaitGroup
	for range c.cfg.DecodeWorkers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			c.decodeWorker(runCtx, jobs)
		}()
	}
	fetchDone := make(chan struct{})
	go func() {
		defer close(fetchDone)
		defer close(jobs)
		c.fetchLoop(runCtx, reader, jobs, batches)
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
			err = errors.New("ingest: the Kafka reader stopped unexpectedly")
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
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) {
			c.log.Warn("kafka-go: "+fmt.Sprintf(msg, args...), "source", "kafka-go")
		}),
	}
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

// A batch is the unit of sink writes and commits. The fetch loop fills it and
// hands its messages to the decode workers in chunks as they arrive, so that
// decoding overlaps fetching; decoded is closed when every chunk is decoded.
type batch[T any] struct {
	chunks     []*chunk[T]
	rows       int
	bytes      int
	first      time.Time
	last       map[int]kafka.Message // per partition, the coordinates of the highest offset
	pending    sync.WaitGroup        // chunks not decoded yet
	decoded    chan struct{}
	incomplete atomic.Bool // a chunk was skipped (shutdown): never write this batch
}

// A chunk is a slice of a batch decoded by one worker, in message order.
type chunk[T any] struct {
	msgs  []kafka.Message // released after decoding
	bytes int
	recs  []Record[T]
	dead  []*deadLetter
}

type decodeJob[T any] struct {
	b  *batch[T]
	ch *chunk[T]
}

// Chunks are cut at whichever comes first.
const (
	chunkRows  = 256
	chunkBytes = 1 << 20
)

func (c *Consumer[T]) fetchLoop(ctx context.Context, r *kafka.Reader, jobs chan<- decodeJob[T], out chan<- *batch[T]) {
	var (
		b        *batch[T]
		cur      *chunk[T]
		bctx     context.Context // ends at the batch's timeout
		bcancel  context.CancelFunc
		deadline time.Time
		bo       = c.newBackOff()
	)
	defer func() {
		if bcancel != nil {
			bcancel()
		}
	}()
	dispatch := func() bool {
		if cur == nil || len(cur.msgs) == 0 {
			return true
		}
		b.chunks = append(b.chunks, cur)
		b.pending.Add(1)
		select {
		case jobs <- decodeJob[T]{b: b, ch: cur}:
			cur = nil
			return true
		case <-ctx.Done():
			b.pending.Done()
			b.incomplete.Store(true)
			return false
		}
	}
	// seal closes the current batch and hands it to the writer; false when
	// ctx ended first (the batch is dropped, uncommitted).
	seal := func() bool {
		bcancel()
		if !dispatch() {
			return false
		}
		sb := b
		b, cur, bctx, bcancel = nil, nil, nil, nil
		go func() {
			sb.pending.Wait()
			close(sb.decoded)
		}()
		select {
		case out <- sb:
			return true
		case <-ctx.Done():
			return false
		}
	}

	for {
		fctx := ctx
		if b != nil {
			fctx = bctx
		}
		m, err := r.FetchMessage(fctx)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return // shutdown: the partial batch is dropped, uncommitted
			case b != nil && bctx.Err() != nil:
				if !seal() {
					return
				}
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
		now := time.Now()
		if b == nil {
			b = &batch[T]{first: now, last: make(map[int]kafka.Message), decoded: make(chan struct{})}
			deadline = now.Add(c.cfg.BatchTimeout)
			bctx, bcancel = batchContext(ctx, deadline)
		}
		if cur == nil {
			cur = &chunk[T]{msgs: make([]kafka.Message, 0, chunkRows)}
		}
		size := len(m.Key) + len(m.Value)
		cur.msgs = append(cur.msgs, m)
		cur.bytes += size
		b.rows++
		b.bytes += size
		b.last[m.Partition] = kafka.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
		c.met.addConsumed(1)
		if len(cur.msgs) >= chunkRows || cur.bytes >= chunkBytes {
			if !dispatch() {
				return
			}
		}
		if b.rows >= c.cfg.BatchRows || b.bytes >= c.cfg.BatchBytes || !now.Before(deadline) {
			if !seal() {
				return
			}
		}
	}
}

// batchContext is the context of the fetches into one batch: it ends at the
// batch's timeout. The fetch loop cancels it when the batch is sealed.
func batchContext(parent context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	return context.WithDeadline(parent, deadline)
}

func (c *Consumer[T]) decodeWorker(ctx context.Context, jobs <-chan decodeJob[T]) {
	for j := range jobs {
		if ctx.Err() != nil {
			// Shutting down: this batch will not be written; skip the work.
			j.b.incomplete.Store(true)
		} else {
			c.decodeChunk(j.ch)
		}
		j.b.pending.Done()
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
		ch.recs = append(ch.recs, Record[T]{Value: v, Topic: m.Topic, Partition: m.Partition,
			Offset: m.Offset, Key: m.Key, Time: m.Time, Size: len(m.Value)})
	}
	ch.msgs = nil // the raw values of valid records are no longer needed
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

func (c *Consumer[T]) writeLoop(ctx, work context.Context, r *kafka.Reader, dlq *dlqWriter, in <-chan *batch[T]) error {
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
		select {
		case <-b.decoded:
		case <-ctx.Done():
			return nil // not being written yet: dropped, uncommitted
		}
		if ctx.Err() != nil || b.incomplete.Load() {
			return nil
		}
		err := c.process(work, r, dlq, b)
		if errors.Is(err, errDrainExpired) {
			c.log.Warn("drain deadline expired; the batch in flight is not committed and will be redelivered",
				"rows", b.rows, "error", err)
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// process makes one decoded batch durable: sink write, dead letters, commit.
// Each step is retried with backoff until it succeeds, the sink fails
// fatally, or work ends (errDrainExpired).
func (c *Consumer[T]) process(work context.Context, r *kafka.Reader, dlq *dlqWriter, b *batch[T]) error {
	nrecs, ndead := 0, 0
	for _, ch := range b.chunks {
		nrecs += len(ch.recs)
		ndead += len(ch.dead)
	}
	recs := make([]Record[T], 0, nrecs)
	dead := make([]*deadLetter, 0, ndead)
	for _, ch := range b.chunks {
		recs = append(recs, ch.recs...)
		dead = append(dead, ch.dead...)
		ch.recs, ch.dead = nil, nil
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
		}, func(err error) bool { return !c.cfg.IsRetryable(err) },
			func(attempt int, err error, wait time.Duration) {
				c.met.sinkRetry()
				c.log.Warn("sink write failed; retrying the batch", "attempt", attempt, "rows", len(recs),
					"error", err, "retry_in", wait)
			})
		if err != nil {
			if !errors.Is(err, errDrainExpired) {
				return fmt.Errorf("ingest: sink: %w", err)
			}
			return err
		}
		c.met.addInserted(len(recs))
	}

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

	offsets := make([]kafka.Message, 0, len(b.last))
	for _, m := range b.last {
		offsets = append(offsets, m)
	}
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

// retry runs op until it returns nil, fatal(err) is true (err is returned),
// or ctx ends (errDrainExpired, wrapping the last error, is returned).
func (c *Consumer[T]) retry(ctx context.Context, op func(context.Context) error, fatal func(error) bool,
	onRetry func(attempt int, err error, wait time.Duration)) error {
	bo := c.newBackOff()
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			// Past the drain deadline nothing new starts. (kafka-go may
			// still commit a request that raced with the cancellation;
			// that is harmless, the batch is durable.)
			return fmt.Errorf("%w: %w", errDrainExpired, err)
		}
		err := op(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", errDrainExpired, err)
		}
		if fatal != nil && fatal(err) {
			return err
		}
		wait := bo.NextBackOff()
		onRetry(attempt, err, wait)
		if !sleep(ctx, wait) {
			return fmt.Errorf("%w: %w", errDrainExpired, err)
		}
	}
}

// newBackOff is the capped, jittered exponential backoff of every retry:
// BackoffInitial doubling up to BackoffMax, each wait randomized by ±50% and
// then capped at BackoffMax, never giving up.
func (c *Consumer[T]) newBackOff() backoff.BackOff {
	return cappedBackOff{
		b: backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(c.cfg.BackoffInitial),
			backoff.WithMaxInterval(c.cfg.BackoffMax),
			backoff.WithMultiplier(2),
			backoff.WithRandomizationFactor(0.5),
			backoff.WithMaxElapsedTime(0),
		),
		max: c.cfg.BackoffMax,
	}
}

type cappedBackOff struct {
	b   *backoff.ExponentialBackOff
	max time.Duration
}

func (b cappedBackOff) NextBackOff() time.Duration { return min(b.b.NextBackOff(), b.max) }
func (b cappedBackOff) Reset()                     { b.b.Reset() }

// sleep waits d or until ctx ends; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// lagLoop refreshes the lag gauge every LagInterval until ctx ends.
//
// kafka-go's group Reader.Stats().Lag is the lag of whichever partition was
// read last (and Reader.ReadLag refuses groups), so the lag is computed the
// way external monitors do it: the partitions' high watermarks (ListOffsets)
// minus the group's committed offsets (OffsetFetch). A partition without a
// committed offset counts from its log start for StartOffset FirstOffset,
// and as 0 for LastOffset. Being based on commits, it includes the batches in
// flight and rises while the sink applies backpressure.
func (c *Consumer[T]) lagLoop(ctx context.Context, tr *kafka.Transport) {
	if c.cfg.LagInterval < 0 {
		return
	}
	defer c.met.clearLag()
	if c.met.m == nil {
		return
	}
	client := &kafka.Client{Addr: kafka.TCP(c.cfg.Brokers...), Transport: tr, Timeout: 10 * time.Second}
	t := time.NewTicker(c.cfg.LagInterval)
	defer t.Stop()
	for {
		lags, err := c.pollLag(ctx, client, tr)
		switch {
		case err == nil:
			c.met.setLag(lags)
		case ctx.Err() == nil:
			c.met.error("lag")
			c.log.Debug("lag poll failed", "error", err)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

func (c *Consumer[T]) pollLag(ctx context.Context, client *kafka.Client, tr *kafka.Transport) (map[int]int64, error) {
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{c.cfg.Topic}})
	if err != nil {
		return nil, err
	}
	var parts []int
	for _, t := range md.Topics {
		if t.Name == c.cfg.Topic {
			if t.Error != nil {
				return nil, t.Error
			}
			for _, p := range t.Partitions {
				parts = append(parts, p.ID)
			}
		}
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("topic %q has no partitions", c.cfg.Topic)
	}
	high, err := listOffsets(ctx, client, tr, c.cfg.Topic, parts, kafka.LastOffset)
	if err != nil {
		return nil, err
	}
	var low map[int]int64
	if c.cfg.StartOffset == kafka.FirstOffset {
		if low, err = listOffsets(ctx, client, tr, c.cfg.Topic, parts, kafka.FirstOffset); err != nil {
			return nil, err
		}
	}
	of, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: c.cfg.GroupID, Topics: map[string][]int{c.cfg.Topic: parts}})
	if err != nil {
		return nil, err
	}
	if of.Error != nil {
		return nil, of.Error
	}
	committed := make(map[int]int64, len(parts))
	for _, p := range of.Topics[c.cfg.Topic] {
		if p.Error == nil {
			committed[p.Partition] = p.CommittedOffset
		}
	}
	lags := make(map[int]int64, len(parts))
	for _, p := range parts {
		h, ok := high[p]
		if !ok {
			continue
		}
		from, ok := committed[p]
		if !ok || from < 0 {
			if low == nil {
				lags[p] = 0
				continue
			}
			from = low[p]
		}
		lags[p] = max(h-from, 0)
	}
	return lags, nil
}

// listOffsets asks the partition leaders for the earliest or latest offset of
// each partition. It uses the protocol request directly: kafka.Client's
// ListOffsets files responses by their record timestamp, which brokers set
// to -1 for both earliest and latest.
func listOffsets(ctx context.Context, client *kafka.Client, tr *kafka.Transport, topic string, parts []int, which int64) (map[int]int64, error) {
	req := &listoffsets.Request{ReplicaID: -1, Topics: []listoffsets.RequestTopic{{Topic: topic}}}
	for _, p := range parts {
		req.Topics[0].Partitions = append(req.Topics[0].Partitions,
			listoffsets.RequestPartition{Partition: int32(p), CurrentLeaderEpoch: -1, Timestamp: which})
	}
	rctx, cancel := context.WithTimeout(ctx, client.Timeout)
	defer cancel()
	m, err := tr.RoundTrip(rctx, client.Addr, req)
	if err != nil {
		return nil, err
	}
	res, ok := m.(*listoffsets.Response)
	if !ok {
		return nil, fmt.Errorf("ListOffsets: unexpected response %T", m)
	}
	out := make(map[int]int64, len(parts))
	for _, t := range res.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return nil, fmt.Errorf("ListOffsets %s/%d: %w", topic, p.Partition, kafka.Error(p.ErrorCode))
			}
			out[int(p.Partition)] = p.Offset
		}
	}
	return out, nil
}
