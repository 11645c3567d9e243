package stream_test

import (
	"bytes"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/internal/stream"
)

// TestDeadLetterValueCutAtTheLimit: with DLQMaxValueBytes = 1000, dead
// letters of 999 and 1000 bytes keep their value byte for byte and carry no
// size headers; one of 1001 bytes keeps its first 1000 bytes with
// trace-truncated: true and trace-original-size: 1001.
func TestDeadLetterValueCutAtTheLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	const limit = 1000
	value := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('a' + i%26)
		}
		return b
	}
	sizes := []int{limit - 1, limit, limit + 1}
	var msgs []kafka.Message
	for _, n := range sizes {
		msgs = append(msgs, kafka.Message{Key: []byte(strconv.Itoa(n)), Value: value(n)})
	}
	e.produce(t, msgs...)
	cfg := e.config()
	cfg.DLQMaxValueBytes = limit
	c := newConsumer(t, cfg, func([]byte) (string, error) { return "", errors.New("always invalid") }, &testSink[string]{}, nil)
	run := start(t, c)
	waitFor(t, 20*time.Second, "commit", func() bool { return e.committedTotal(t) == int64(len(msgs)) })
	if _, err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	dead := map[string]kafka.Message{}
	for _, m := range e.readDLQ(t, len(msgs)) {
		dead[string(m.Key)] = m
	}
	for _, n := range sizes {
		m, ok := dead[strconv.Itoa(n)]
		if !ok {
			t.Errorf("%d bytes: not dead-lettered", n)
			continue
		}
		truncated, hasT := header(m, stream.HeaderTruncated)
		size, hasS := header(m, stream.HeaderOriginalSize)
		if n <= limit {
			if !bytes.Equal(m.Value, value(n)) || hasT || hasS {
				t.Errorf("%d bytes: dead letter of %d bytes, truncated %q, original size %q; want the original bytes", n, len(m.Value), truncated, size)
			}
			continue
		}
		if !bytes.Equal(m.Value, value(n)[:limit]) || truncated != "true" || size != strconv.Itoa(n) {
			t.Errorf("%d bytes: dead letter of %d bytes, truncated %q, original size %q; want the first %d bytes, true, %d", n, len(m.Value), truncated, size, limit, n)
		}
		if _, ok := header(m, stream.HeaderDLQError); ok {
			t.Errorf("%d bytes: value dropped", n)
		}
	}
}
