package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/schemas"
)

// Headers of a dead letter. The key and value of a dead letter are the
// original message's, byte for byte; the original headers come first, then
// these.
const (
	HeaderError           = "trace-error"            // the decoder's error string
	HeaderErrorReason     = "trace-error-reason"     // *schemas.Error Reason, or ReasonDecode / ReasonPanic
	HeaderStage           = "trace-stage"            // Config.Stage
	HeaderSourceTopic     = "trace-source-topic"     // where the message came from
	HeaderSourcePartition = "trace-source-partition" // decimal
	HeaderSourceOffset    = "trace-source-offset"    // decimal
	HeaderFailedAt        = "trace-failed-at"        // RFC 3339, UTC
	// HeaderOriginalSize is only present on a dead letter whose value is not
	// the whole original (see "Dead letters" on Consumer): the original
	// value's size in bytes. HeaderTruncated ("true") then says the value
	// was cut to Config.DLQMaxValueBytes; HeaderDLQError says why it had to
	// be dropped altogether.
	HeaderOriginalSize = "trace-original-size"
	HeaderTruncated    = "trace-truncated"
	HeaderDLQError     = "trace-dlq-error"
)

// Reasons of dead letters that are not a *schemas.Error.
const (
	ReasonDecode = "decode" // the decoder returned an error that is not a *schemas.Error
	ReasonPanic  = "panic"  // the decoder panicked
)

// maxErrorHeader caps the trace-error header (the value is cut only past
// Config.DLQMaxValueBytes, and then marked).
const maxErrorHeader = 8 << 10

// DeadLetterReason is the reason code a decode error is filed under: the
// Reason of a *schemas.Error in err's chain, else ReasonDecode.
func DeadLetterReason(err error) string {
	var se *schemas.Error
	if errors.As(err, &se) && se.Reason != "" {
		return se.Reason
	}
	var pe *panicError
	if errors.As(err, &pe) {
		return ReasonPanic
	}
	return ReasonDecode
}

// panicError is a recovered decoder panic.
type panicError struct{ v any }

func (e *panicError) Error() string { return fmt.Sprintf("decoder panic: %v", e.v) }

// deadLetter is one rejected message on its way to the DLQ.
type deadLetter struct {
	msg      kafka.Message // the original message
	err      error
	reason   string
	failedAt time.Time
	done     bool // written (or given up on); set by dlqWriter.write
}

// dlqWriter writes dead letters with acks=all.
type dlqWriter struct {
	w        *kafka.Writer
	stage    string
	maxValue int // Config.DLQMaxValueBytes
	log      *slog.Logger
	met      *consumerMetrics
}

func newDLQWriter(cfg Config, tr *kafka.Transport, log *slog.Logger, met *consumerMetrics) *dlqWriter {
	// BatchBytes bounds one produce batch on the client side. It must exceed the
	// largest dead letter (a value of at most DLQMaxValueBytes, the key and
	// the headers), or kafka-go refuses the message before the broker sees
	// it. Whether the broker accepts it is the DLQ topic's
	// max.message.bytes; see write.
	batchBytes := int64(cfg.DLQMaxValueBytes + 1<<20)
	return &dlqWriter{
		w: &kafka.Writer{
			Addr:                   kafka.TCP(cfg.Brokers...),
			Topic:                  cfg.DLQTopic,
			Balancer:               &kafka.Hash{}, // dead letters of one key stay in order
			RequiredAcks:           kafka.RequireAll,
			AllowAutoTopicCreation: true,
			BatchBytes:             batchBytes,
			BatchSize:              1000,
			// Synchronous writes wait BatchTimeout for a batch to fill; we
			// always hand over everything we have, so do not wait.
			BatchTimeout: time.Millisecond,
			// kafka-go's own retries sleep uncancellably; the consumer
			// retries with its backoff instead, under its drain deadline.
			MaxAttempts: 1,
			Transport:   tr,
		},
		stage:    cfg.Stage,
		maxValue: cfg.DLQMaxValueBytes,
		log:      log,
		met:      met,
	}
}

// message builds the dead letter of dl.
func (d *dlqWriter) message(dl *deadLetter) kafka.Message {
	m := dl.msg
	h := make([]kafka.Header, 0, len(m.Headers)+9)
	h = append(h, m.Headers...)
	h = append(h,
		kafka.Header{Key: HeaderError, Value: []byte(capString(dl.err.Error(), maxErrorHeader))},
		kafka.Header{Key: HeaderErrorReason, Value: []byte(dl.reason)},
		kafka.Header{Key: HeaderStage, Value: []byte(d.stage)},
		kafka.Header{Key: HeaderSourceTopic, Value: []byte(m.Topic)},
		kafka.Header{Key: HeaderSourcePartition, Value: []byte(strconv.Itoa(m.Partition))},
		kafka.Header{Key: HeaderSourceOffset, Value: []byte(strconv.FormatInt(m.Offset, 10))},
		kafka.Header{Key: HeaderFailedAt, Value: []byte(dl.failedAt.UTC().Format(time.RFC3339))},
	)
	value := m.Value
	if len(value) > d.maxValue {
		// Over the size limit: its first bytes, marked, and the original
		// stays readable in the source topic at the coordinates above.
		value = value[:d.maxValue]
		h = append(h,
			kafka.Header{Key: HeaderTruncated, Value: []byte("true")},
			kafka.Header{Key: HeaderOriginalSize, Value: []byte(strconv.Itoa(len(m.Value)))},
		)
	}
	return kafka.Message{Key: m.Key, Value: value, Headers: h}
}

// write writes every dead letter of dls that is not done yet, marking those
// that succeed. It returns an error if any is left; the caller retries with
// backoff, and only the ones still not done are written again.
//
// A dead letter that the broker (or kafka-go) rejects as too large is
// written again without its value: empty value, HeaderOriginalSize and
// HeaderDLQError added, key and headers kept. If even that is too large, it
// is written without its key too, and if that still fails it is logged and
// skipped: a poison message must never block its partition.
func (d *dlqWriter) write(ctx context.Context, dls []*deadLetter) error {
	pending := make([]*deadLetter, 0, len(dls))
	msgs := make([]kafka.Message, 0, len(dls))
	for _, dl := range dls {
		if !dl.done {
			pending = append(pending, dl)
			msgs = append(msgs, d.message(dl))
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	err := d.w.WriteMessages(ctx, msgs...)
	if err == nil {
		for _, dl := range pending {
			d.written(dl)
		}
		return nil
	}
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) && len(werrs) == len(msgs) {
		var first error
		for i, dl := range pending {
			switch e := werrs[i]; {
			case e == nil:
				d.written(dl)
			case isTooLarge(e):
				// The produce batch may have been too large only because of
				// its neighbours: retry the message alone.
				if e2 := d.writeAlone(ctx, dl, msgs[i]); e2 != nil && first == nil {
					first = e2
				}
			case first == nil:
				first = e
			}
		}
		return first
	}
	if isTooLarge(err) {
		// Refused before anything was sent (kafka.MessageTooLargeError): one
		// message exceeds BatchBytes. Write them one by one.
		var first error
		for i, dl := range pending {
			if e := d.writeAlone(ctx, dl, msgs[i]); e != nil && first == nil {
				first = e
			}
		}
		return first
	}
	return err
}

// writeAlone writes one dead letter in its own request, stripping its value
// (then its key) if it is too large.
func (d *dlqWriter) writeAlone(ctx context.Context, dl *deadLetter, m kafka.Message) error {
	err := d.w.WriteMessages(ctx, m)
	if err == nil {
		d.written(dl)
		return nil
	}
	if !isTooLarge(err) {
		return err
	}
	tooLarge := err
	hs := m.Headers[:len(m.Headers):len(m.Headers)]
	if len(m.Value) == len(dl.msg.Value) { // not truncated: no size header yet
		hs = append(hs, kafka.Header{Key: HeaderOriginalSize, Value: []byte(strconv.Itoa(len(dl.msg.Value)))})
	}
	m.Headers = append(hs, kafka.Header{Key: HeaderDLQError, Value: []byte("value dropped: " + tooLarge.Error())})
	m.Value = nil
	d.log.Error("dead letter too large for the DLQ topic; writing it without its value",
		"dlq_topic", d.w.Topic, "source_partition", dl.msg.Partition, "source_offset", dl.msg.Offset,
		"value_bytes", len(dl.msg.Value), "reason", dl.reason, "error", tooLarge)
	if err = d.w.WriteMessages(ctx, m); err == nil {
		d.written(dl)
		return nil
	}
	if !isTooLarge(err) {
		return err
	}
	m.Key = nil
	if err = d.w.WriteMessages(ctx, m); err == nil {
		d.written(dl)
		return nil
	}
	if !isTooLarge(err) {
		return err
	}
	d.log.Error("dead letter too large for the DLQ topic even without key and value; skipped",
		"dlq_topic", d.w.Topic, "source_partition", dl.msg.Partition, "source_offset", dl.msg.Offset,
		"reason", dl.reason, "error", err)
	dl.done = true
	d.met.error("dlq_skipped")
	return nil
}

func (d *dlqWriter) written(dl *deadLetter) {
	dl.done = true
	d.met.deadLettered(dl.reason)
}

func (d *dlqWriter) close() error { return d.w.Close() }

// isTooLarge reports whether err says a message or batch exceeds a size limit
// (kafka.MessageTooLargeError unwraps to kafka.MessageSizeTooLarge).
// For kafka.WriteErrors (which has no Unwrap) every non-nil element must be.
func isTooLarge(err error) bool {
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) {
		n := 0
		for _, e := range werrs {
			if e != nil {
				if !isTooLarge(e) {
					return false
				}
				n++
			}
		}
		return n > 0
	}
	return errors.Is(err, kafka.MessageSizeTooLarge) || errors.Is(err, kafka.RecordListTooLarge)
}

// capString cuts s to at most n bytes on a rune boundary, marking the cut.
func capString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…(truncated)"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
