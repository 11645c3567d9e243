package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
)

// sizedRollout is a valid rollout of exactly size bytes (a metadata string
// pads it), keyed like a producer would.
func sizedRollout(t *testing.T, id string, size int) kafka.Message {
	t.Helper()
	r := simulate.New(simulate.Config{Seed: 3, Rollouts: 1, Start: time.Now().Add(-time.Minute)}).Next()
	r.RolloutID, r.Metadata = id, nil
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(`"metadata"`)) {
		t.Fatal("the rollout has metadata already")
	}
	const open, closing = `,"metadata":{"pad":"`, `"}}`
	n := size - (len(b) - 1) - len(open) - len(closing)
	if n < 0 {
		t.Fatalf("a rollout of %d bytes cannot be padded to %d", len(b), size)
	}
	v := append(append(append(b[:len(b)-1:len(b)-1], open...), strings.Repeat("x", n)...), closing...)
	if len(v) != size {
		t.Fatalf("padded to %d bytes, want %d", len(v), size)
	}
	if _, err := schemas.DecodeRollout(v, schemas.DecodeOptions{MaxBytes: 64 << 20}); err != nil {
		t.Fatalf("padded rollout is invalid: %v", err)
	}
	return kafka.Message{Key: []byte(r.Key() + "#" + id), Value: v} // one key per message, to find it in the DLQ
}

// TestLargeMessagesThroughEmbeddedBroker publishes rollouts of 1, 3.9 and
// 4.1 MiB, uncompressed, to the embedded broker with kafka.max_message_bytes
// at its 4 MiB default, and runs them through the ingest stage: the valid
// ones of 1 and 3.9 MiB are stored; invalid ones of the same sizes are
// dead-lettered with their bytes intact; the 4.1 MiB one is dead-lettered
// as too_large with its first 4 MiB and headers saying it was truncated
// and its original size.
func TestLargeMessagesThroughEmbeddedBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("moves ~20 MiB through the broker")
	}
	ch := testenv.ClickHouse(t)
	cfg, err := config.Load("", []string{"data_dir=" + t.TempDir(), "roles=ingest", "http.addr=127.0.0.1:0",
		"kafka.embedded_addr=127.0.0.1:0", "kafka.batch_timeout=200ms",
		"clickhouse.addr=" + ch.Addr, "clickhouse.database=" + ch.Database})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Kafka.MaxBytes != 4<<20 {
		t.Fatalf("kafka.max_message_bytes default %d, want 4 MiB", cfg.Kafka.MaxBytes)
	}
	w := &world{cfg: cfg}
	a, stop := w.start(t, cfg)
	defer stop()
	<-a.Ready()

	const mib = 1 << 20
	limit := cfg.Kafka.MaxBytes
	valid1, valid39 := sizedRollout(t, "big-1", mib), sizedRollout(t, "big-3.9", 39*mib/10)
	over := sizedRollout(t, "big-4.1", 41*mib/10)
	invalid := func(m kafka.Message) kafka.Message {
		// The same size, but an environment the schema refuses.
		v := bytes.Replace(m.Value, []byte(`"environment":"sim-`), []byte(`"environment":"sim/`), 1)
		if bytes.Equal(v, m.Value) {
			t.Fatal("no environment to break")
		}
		return kafka.Message{Key: append([]byte("bad/"), m.Key...), Value: v}
	}
	bad1, bad39 := invalid(valid1), invalid(valid39)
	kw := &kafka.Writer{Addr: kafka.TCP(a.Brokers...), Topic: cfg.Kafka.RolloutsTopic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchBytes: int64(cfg.Kafka.WriterBatchBytes()),
		Compression: 0} // uncompressed: the broker sees every byte
	defer kw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, m := range []kafka.Message{valid1, valid39, bad1, bad39, over} {
		if err := kw.WriteMessages(ctx, m); err != nil {
			t.Fatalf("produce %s (%d bytes, uncompressed): %v", m.Key, len(m.Value), err)
		}
	}

	// The valid ones are stored, whole (the metadata is kept as sent).
	deadline := time.Now().Add(time.Minute)
	for {
		var n uint64
		err := testenv.StoreConn(t, a.Store).QueryRow(ctx, "SELECT uniqExact(rollout_id) FROM rollouts WHERE rollout_id IN ('big-1', 'big-3.9')").Scan(&n)
		if err == nil && n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the 2 valid large rollouts stored (%v)", n, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var metaLen uint64
	if err := testenv.StoreConn(t, a.Store).QueryRow(ctx, "SELECT max(length(metadata)) FROM rollouts WHERE rollout_id = 'big-3.9'").Scan(&metaLen); err != nil {
		t.Fatal(err)
	}
	if metaLen < uint64(39*mib/10-64<<10) {
		t.Errorf("the 3.9 MiB rollout's metadata was stored with %d bytes", metaLen)
	}

	// The others are dead letters.
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: a.Brokers, Topic: cfg.Kafka.DLQTopic, GroupID: "check-" + t.Name(),
		MaxBytes: cfg.Kafka.TopicMaxBytes(), StartOffset: kafka.FirstOffset, MaxWait: 500 * time.Millisecond})
	defer rd.Close()
	dead := map[string]kafka.Message{}
	for len(dead) < 3 {
		m, err := rd.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("read the DLQ (%d of 3 dead letters so far: %v): %v", len(dead), keys(dead), err)
		}
		dead[string(m.Key)] = m
	}
	header := func(m kafka.Message, k string) (string, bool) {
		for _, h := range m.Headers {
			if h.Key == k {
				return string(h.Value), true
			}
		}
		return "", false
	}
	for _, src := range []kafka.Message{bad1, bad39} {
		m, ok := dead[string(src.Key)]
		if !ok {
			t.Errorf("%s (%d bytes) is not in the DLQ", src.Key, len(src.Value))
			continue
		}
		reason, _ := header(m, stream.HeaderErrorReason)
		_, truncated := header(m, stream.HeaderTruncated)
		if !bytes.Equal(m.Value, src.Value) || reason != schemas.ReasonSchema || truncated {
			t.Errorf("%s: dead letter of %d bytes (original %d), reason %q, truncated %v; want the original bytes, reason schema",
				src.Key, len(m.Value), len(src.Value), reason, truncated)
		}
	}
	m, ok := dead[string(over.Key)]
	if !ok {
		t.Fatalf("the 4.1 MiB rollout is not in the DLQ")
	}
	reason, _ := header(m, stream.HeaderErrorReason)
	truncated, _ := header(m, stream.HeaderTruncated)
	size, _ := header(m, stream.HeaderOriginalSize)
	if reason != schemas.ReasonTooLarge || truncated != "true" || size != fmt.Sprint(len(over.Value)) ||
		len(m.Value) != limit || !bytes.Equal(m.Value, over.Value[:limit]) {
		t.Errorf("4.1 MiB dead letter: reason %q, truncated %q, original size %q, %d value bytes (prefix intact %v); want too_large, true, %d, the first %d bytes",
			reason, truncated, size, len(m.Value), bytes.HasPrefix(over.Value, m.Value), len(over.Value), limit)
	}
	if _, ok := header(m, stream.HeaderDLQError); ok {
		t.Errorf("the 4.1 MiB dead letter had its value dropped")
	}
}

func keys(m map[string]kafka.Message) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
