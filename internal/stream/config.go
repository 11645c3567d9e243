package stream

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/schemas"
)

// Defaults of Config. A zero field of a Config means "use the default";
// WithDefaults fills them in and Validate checks the result.
const (
	DefaultBatchRows       = 10000
	DefaultBatchBytes      = 64 << 20
	DefaultBatchTimeout    = time.Second
	DefaultMaxMessageBytes = 4<<20 + 256<<10 // schemas.DefaultMaxBytes plus room for the record envelope
	DefaultBackoffInitial  = 200 * time.Millisecond
	DefaultBackoffMax      = 10 * time.Second
	DefaultDrainTimeout    = 8 * time.Second
	DefaultLagInterval     = 15 * time.Second
	// DefaultSessionTimeout and DefaultRebalanceTimeout are kafka-go's.
	DefaultSessionTimeout   = 30 * time.Second
	DefaultRebalanceTimeout = 30 * time.Second
	DefaultStage            = "ingest"
	DefaultDLQSuffix        = ".dlq"
)

// Config configures a Consumer. Only Brokers, Topic and GroupID are required.
type Config struct {
	// Brokers are the bootstrap addresses ("host:port").
	Brokers []string
	// Topic is the source topic; GroupID the consumer group whose committed
	// offsets are the checkpoint of this consumer.
	Topic   string
	GroupID string
	// DLQTopic receives the messages the Decoder rejects. Default Topic+".dlq".
	// Create it with max.message.bytes at least as large as the source topic's
	// (see "Dead letters" in the Consumer documentation).
	DLQTopic string
	// SkipInvalid makes the consumer count and skip the messages the Decoder
	// rejects instead of dead-lettering them: for a stage that reads a topic
	// whose invalid messages another stage (ingest) already dead-letters,
	// so that each bad message is in the DLQ once.
	SkipInvalid bool
	// Stage names the pipeline step in the trace-stage DLQ header and in the
	// metric labels ("ingest", "analyze", ...). Default "ingest".
	Stage string

	// A batch closes when it holds BatchRows messages, when it holds
	// BatchBytes bytes of keys and values, or BatchTimeout after its first
	// message arrived, whichever comes first. Defaults 10000, 64 MiB, 1s.
	BatchRows    int
	BatchBytes   int
	BatchTimeout time.Duration

	// DecodeWorkers is the number of goroutines decoding messages.
	// Default runtime.GOMAXPROCS(0).
	DecodeWorkers int

	// MaxMessageBytes is the reader's fetch size (kafka-go ReaderConfig.MaxBytes):
	// it must cover the largest message the topic holds (its
	// max.message.bytes), so that a message over the decoder's limit is still
	// fetched and dead-lettered. Default 4 MiB + 256 KiB.
	MaxMessageBytes int

	// DLQMaxValueBytes is the largest value a dead letter keeps whole (the
	// decoder's size limit, kafka.max_message_bytes): a longer value is cut
	// to its first DLQMaxValueBytes bytes and the dead letter says so
	// (HeaderTruncated, HeaderOriginalSize). It also sizes the DLQ writer's
	// batches (DLQMaxValueBytes + 1 MiB for the key and headers); the DLQ
	// topic's max.message.bytes must be at least that. Default
	// schemas.DefaultMaxBytes (4 MiB).
	DLQMaxValueBytes int

	// Retries of the sink, the DLQ writer and the offset commit back off
	// exponentially (with jitter) from BackoffInitial to BackoffMax, forever.
	// Defaults 200ms and 10s.
	BackoffInitial time.Duration
	BackoffMax     time.Duration

	// DrainTimeout bounds how long the batch in flight may still take to be
	// written, dead-lettered and committed after Run's context is cancelled.
	// Run returns at most about DrainTimeout + 1s after the cancellation.
	// Default 8s.
	DrainTimeout time.Duration

	// IsRetryable classifies Sink.Write errors: true means retry the same
	// batch with backoff (backpressure), false means stop the consumer with
	// the error. Default: every error is retryable except those wrapped with
	// Fatal (and context errors of the consumer's own drain deadline).
	IsRetryable func(error) bool

	// Dialer carries TLS, SASL and the client id for every connection (reader,
	// DLQ writer, lag poller). Nil means kafka.DefaultDialer.
	Dialer *kafka.Dialer

	// StartOffset is where a group without a committed offset starts:
	// kafka.FirstOffset (default) or kafka.LastOffset.
	StartOffset int64

	// LagInterval is how often the consumer-group lag gauge is refreshed
	// (ListOffsets + OffsetFetch). Default 15s; negative disables it. After
	// three intervals without a successful read the lag series are dropped
	// (see lagLoop).
	LagInterval time.Duration

	// SessionTimeout is how long the group coordinator waits for a
	// member's heartbeat before it gives the member's partitions to the
	// others (a replica killed without leaving the group): the longest
	// those partitions sit unread. The heartbeat is sent every third of it,
	// at most every 3 s. RebalanceTimeout is how long the coordinator waits
	// for every member to rejoin during a rebalance. Defaults 30s each
	// (kafka-go's); the broker bounds the session timeout
	// (group.min.session.timeout.ms, 6 s by default).
	SessionTimeout   time.Duration
	RebalanceTimeout time.Duration
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.DLQTopic == "" && c.Topic != "" {
		c.DLQTopic = c.Topic + DefaultDLQSuffix
	}
	c.Stage = cmp.Or(c.Stage, DefaultStage)
	c.BatchRows = cmp.Or(c.BatchRows, DefaultBatchRows)
	c.BatchBytes = cmp.Or(c.BatchBytes, DefaultBatchBytes)
	c.BatchTimeout = cmp.Or(c.BatchTimeout, DefaultBatchTimeout)
	c.DecodeWorkers = cmp.Or(c.DecodeWorkers, runtime.GOMAXPROCS(0))
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	c.DLQMaxValueBytes = cmp.Or(c.DLQMaxValueBytes, schemas.DefaultMaxBytes)
	c.BackoffInitial = cmp.Or(c.BackoffInitial, DefaultBackoffInitial)
	c.BackoffMax = cmp.Or(c.BackoffMax, DefaultBackoffMax)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DefaultDrainTimeout)
	if c.IsRetryable == nil {
		c.IsRetryable = DefaultIsRetryable
	}
	c.StartOffset = cmp.Or(c.StartOffset, kafka.FirstOffset)
	c.LagInterval = cmp.Or(c.LagInterval, DefaultLagInterval)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, DefaultSessionTimeout)
	c.RebalanceTimeout = cmp.Or(c.RebalanceTimeout, DefaultRebalanceTimeout)
	return c
}

// Validate reports the first invalid field of c (after WithDefaults), naming it.
func (c Config) Validate() error {
	switch {
	case len(c.Brokers) == 0:
		return errors.New("stream: Config.Brokers is empty")
	case c.Topic == "":
		return errors.New("stream: Config.Topic is empty")
	case c.GroupID == "":
		return errors.New("stream: Config.GroupID is empty")
	case c.DLQTopic == "":
		return errors.New("stream: Config.DLQTopic is empty")
	case c.DLQTopic == c.Topic:
		return fmt.Errorf("stream: Config.DLQTopic %q is the source topic", c.DLQTopic)
	case c.Stage == "":
		return errors.New("stream: Config.Stage is empty")
	case c.BatchRows < 1:
		return fmt.Errorf("stream: Config.BatchRows %d < 1", c.BatchRows)
	case c.BatchBytes < 1:
		return fmt.Errorf("stream: Config.BatchBytes %d < 1", c.BatchBytes)
	case c.BatchTimeout <= 0:
		return fmt.Errorf("stream: Config.BatchTimeout %v <= 0", c.BatchTimeout)
	case c.DecodeWorkers < 1:
		return fmt.Errorf("stream: Config.DecodeWorkers %d < 1", c.DecodeWorkers)
	case c.MaxMessageBytes < 1:
		return fmt.Errorf("stream: Config.MaxMessageBytes %d < 1", c.MaxMessageBytes)
	case c.DLQMaxValueBytes < 1:
		return fmt.Errorf("stream: Config.DLQMaxValueBytes %d < 1", c.DLQMaxValueBytes)
	case c.BackoffInitial <= 0:
		return fmt.Errorf("stream: Config.BackoffInitial %v <= 0", c.BackoffInitial)
	case c.BackoffMax < c.BackoffInitial:
		return fmt.Errorf("stream: Config.BackoffMax %v < BackoffInitial %v", c.BackoffMax, c.BackoffInitial)
	case c.SessionTimeout < time.Second:
		return fmt.Errorf("stream: Config.SessionTimeout %v < 1s", c.SessionTimeout)
	case c.RebalanceTimeout < time.Second:
		return fmt.Errorf("stream: Config.RebalanceTimeout %v < 1s", c.RebalanceTimeout)
	case c.DrainTimeout <= 0:
		return fmt.Errorf("stream: Config.DrainTimeout %v <= 0", c.DrainTimeout)
	case c.IsRetryable == nil:
		return errors.New("stream: Config.IsRetryable is nil")
	case c.StartOffset != kafka.FirstOffset && c.StartOffset != kafka.LastOffset:
		return fmt.Errorf("stream: Config.StartOffset %d is neither kafka.FirstOffset nor kafka.LastOffset", c.StartOffset)
	}
	for i, b := range c.Brokers {
		if b == "" {
			return fmt.Errorf("stream: Config.Brokers[%d] is empty", i)
		}
	}
	return nil
}

// fatalError marks an error that must stop the consumer.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// Fatal marks err as not retryable for DefaultIsRetryable: a Sink returns
// Fatal(err) when retrying the same batch cannot help (a schema mismatch, a
// permission error), so that the consumer stops instead of spinning. Fatal(nil)
// is nil.
func Fatal(err error) error {
	if err == nil {
		return nil
	}
	return &fatalError{err: err}
}

// IsFatal reports whether err, or an error it wraps, was marked with Fatal.
func IsFatal(err error) bool {
	var f *fatalError
	return errors.As(err, &f)
}

// DefaultIsRetryable treats every sink error as transient (backpressure rather
// than loss) unless it was marked with Fatal.
func DefaultIsRetryable(err error) bool { return !IsFatal(err) }
