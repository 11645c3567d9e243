package ingest_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/sink"
)

// TestBackfillFromOriginalsKeepsTheStoredTime: a backfill (trace relabel,
// trace dict apply --backfill) labels a rollout from its original Kafka
// message; one without end_time or start_time is stored at its message's
// timestamp, and its backfilled labels must be in that hour too (as the
// stream's labels are), not at the time of the backfill.
func TestBackfillFromOriginalsKeepsTheStoredTime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	brokers := testenv.KFake(t).ListenAddrs()
	topic := testenv.UniqueTopic(t, "trace.rollouts")
	testenv.CreateTopic(t, brokers, topic, 1)
	doc := []byte(`{"rollout_id":"no-times","environment":"e","agent":{"name":"a","version":"v"},"task_id":"t",` +
		`"outcome":{"reward":0},"messages":[{"role":"user","content":"cancel my order"},{"role":"assistant","content":"done"}]}`)
	msgTime := time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond}
	if err := w.WriteMessages(ctx, kafka.Message{Value: doc, Time: msgTime}); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0})
	defer rd.Close()
	m, err := rd.ReadMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Time.Equal(msgTime) {
		t.Fatalf("message time %v, want %v", m.Time, msgTime)
	}

	// Stored as the ingest stage stores it.
	st := testenv.ClickHouse(t).Store()
	row, err := ingest.DecodeRolloutRow(0)(m.Value)
	if err != nil {
		t.Fatal(err)
	}
	rec := stream.Record[*sink.RolloutRow]{Value: row, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Time: m.Time}
	if err := (&ingest.RowSink{Store: st}).Write(ctx, []stream.Record[*sink.RolloutRow]{rec}); err != nil {
		t.Fatal(err)
	}

	reg := analyzer.NewRegistry()
	ds, err := analyzer.BuiltinDictionaries()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		reg.Put(d)
	}
	bf := &analyzer.Backfill{Store: st, Registry: reg, Labeler: analyzer.NewRulesLabeler(analyzer.RulesOptions{}),
		Originals: &ingest.Originals{Brokers: brokers}, Decode: ingest.DecodeRollout(4 << 20)}
	targets, err := bf.Plan(ctx, analyzer.BackfillFilter{})
	if err != nil || len(targets) != 1 || len(targets[0].Todo) != 1 {
		t.Fatalf("plan: %+v, %v", targets, err)
	}
	res, err := bf.Run(ctx, targets, nil)
	if err != nil || res.Labeled != 1 || res.Compacted != 0 {
		t.Fatalf("backfill: %+v, %v (want 1 rollout labeled from its original)", res, err)
	}
	var n uint64
	var lo, hi, stored uint32
	conn := testenv.StoreConn(t, st)
	if err := conn.QueryRow(ctx, "SELECT count(), min(toUnixTimestamp(ts)), max(toUnixTimestamp(ts)) FROM capability_labels WHERE rollout_id = 'no-times'").Scan(&n, &lo, &hi); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT toUnixTimestamp(end_time) FROM rollouts WHERE rollout_id = 'no-times'").Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if n == 0 || int64(stored) != msgTime.Unix() || int64(lo) != msgTime.Unix() || int64(hi) != msgTime.Unix() {
		t.Fatalf("row at %d, %d labels at %d..%d; want the row and every label at the message's timestamp %d",
			stored, n, lo, hi, msgTime.Unix())
	}
}
