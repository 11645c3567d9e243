package stream

import (
	"context"
	"errors"
	"time"
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
//
// A Sink that cannot finish its batch within the drain anyway (one waiting
// on a rate limit, or with minutes of work left) may give it up instead of
// holding the shutdown until the drain deadline: once Stopping(ctx) is
// closed it returns an error wrapping ErrStopped, after making durable
// what it wants to keep. The batch is then neither retried nor committed
// (it is redelivered), and Run returns at once.
type Sink[T any] interface {
	Write(ctx context.Context, batch []Record[T]) error
}

// ErrStopped is what a Sink wraps in the error of a Write that gave its
// batch up because the consumer is stopping (Stopping). Returned at any
// other time it is an error like any other.
var ErrStopped = errors.New("stream: the batch in flight was given up at shutdown")

type stoppingKey struct{}

// Stopping returns a channel that is closed when the Consumer that called
// Sink.Write (or StreamSink.Begin) with ctx begins to stop (Run's context
// ended): the batch in flight then has what is left of
// Config.DrainTimeout, until ctx ends. It is nil for a ctx that does not
// come from a Consumer.
func Stopping(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(stoppingKey{}).(<-chan struct{})
	return ch
}

// WithStopping returns ctx with stop as what Stopping(ctx) returns. The
// Consumer does this for every batch it hands a Sink; a caller that runs a
// Sink by itself (a replay, a test of the sink's stop) does it with its own
// channel.
func WithStopping(ctx context.Context, stop <-chan struct{}) context.Context {
	return context.WithValue(ctx, stoppingKey{}, stop)
}

// stopped reports whether the consumer of ctx is stopping.
func stopped(ctx context.Context) bool {
	ch := Stopping(ctx)
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A StreamSink is a Sink that also takes a batch in pieces, while it is
// being fetched and decoded, so that the consumer holds none of its records:
// memory stays bounded by a few chunks whatever the batch size, and large
// batches (few, large inserts) cost no memory.
//
// The consumer then calls Begin once per batch, Add for its records in
// fetch order (records of one partition in offset order), and Commit when
// the batch is sealed; Commit returning nil is the promise that lets it
// commit the batch's offsets. When Begin, Add or Commit fails with a
// retryable error the records are gone from memory: the consumer reads the
// batch's offset ranges again from Kafka (outside the group) and writes them
// to a new Stream, with backoff, until that succeeds (a retry may see the
// partitions in another order). Write is not called. The rest of Sink's
// contract holds: at-least-once, idempotent, one goroutine at a time.
type StreamSink[T any] interface {
	Sink[T]
	// Begin starts the write of one batch; ctx bounds the whole Stream.
	Begin(ctx context.Context) (Stream[T], error)
}

// Stream is one batch being written by a StreamSink.
type Stream[T any] interface {
	// Add takes the next records. It must not keep recs (the slice is
	// reused); it may keep the values.
	Add(recs []Record[T]) error
	// Commit makes every added record durable.
	Commit() error
	// Abort ends a Stream that is not committed; a no-op after Commit.
	Abort()
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
