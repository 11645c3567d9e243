package stream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/internal/stream"
)

// streamSink is a StreamSink that records the records of every committed
// Stream, and fails the first failCommits commits with errTransient.
type streamSink struct {
	mu          sync.Mutex
	committed   [][]stream.Record[string] // per successful commit
	failed      [][]int64                 // offsets of each failed stream
	failCommits int
	writes      int // calls of Write (must stay 0)
	onFail      func()
	maxAdd      int
}

func (s *streamSink) Write(context.Context, []stream.Record[string]) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return errors.New("Write called on a StreamSink")
}

func (s *streamSink) Begin(context.Context) (stream.Stream[string], error) {
	return &testStream{s: s}, nil
}

type testStream struct {
	s    *streamSink
	recs []stream.Record[string]
}

func (st *testStream) Add(recs []stream.Record[string]) error {
	st.s.mu.Lock()
	st.s.maxAdd = max(st.s.maxAdd, len(recs))
	st.s.mu.Unlock()
	st.recs = append(st.recs, recs...) // copies: recs is reused
	return nil
}

func (st *testStream) Commit() error {
	s := st.s
	s.mu.Lock()
	if s.failCommits > 0 {
		s.failCommits--
		offs := make([]int64, len(st.recs))
		for i, r := range st.recs {
			offs[i] = int64(r.Partition)<<40 | r.Offset
		}
		s.failed = append(s.failed, offs)
		onFail := s.onFail
		s.mu.Unlock()
		if onFail != nil {
			onFail()
		}
		return errTransient
	}
	s.committed = append(s.committed, st.recs)
	s.mu.Unlock()
	return nil
}

func (st *testStream) Abort() {}

func (s *streamSink) all() []stream.Record[string] {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []stream.Record[string]
	for _, c := range s.committed {
		out = append(out, c...)
	}
	return out
}

func offsetSet(recs []stream.Record[string]) []int64 {
	offs := make([]int64, len(recs))
	for i, r := range recs {
		offs[i] = int64(r.Partition)<<40 | r.Offset
	}
	slices.Sort(offs)
	return offs
}

// A StreamSink gets each batch in pieces and never through Write. When a
// commit fails, the batch (no longer in memory) is read again from Kafka and
// written to a new Stream: the same records, valid ones only, while nothing
// is committed; the dead letters of the first pass are kept.
func TestStreamSinkFailedBatchIsReadAgainFromKafka(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	var vals []string
	var msgs []kafka.Message
	for i := range 600 {
		v := fmt.Sprintf("m-%03d", i)
		if i%50 == 7 {
			v = fmt.Sprintf("bad-%03d", i)
		} else {
			vals = append(vals, v)
		}
		msgs = append(msgs, kafka.Message{Key: []byte(fmt.Sprint(i % 7)), Value: []byte(v)})
	}
	e.produce(t, msgs...)
	reg := prometheus.NewRegistry()
	sink := &streamSink{failCommits: 2}
	var committedWhileFailing []int64
	sink.onFail = func() { committedWhileFailing = append(committedWhileFailing, e.committedTotal(t)) }
	cfg := e.config()
	cfg.BatchRows = 1000 // one batch
	cfg.BatchTimeout = 2 * time.Second
	c := newConsumer(t, cfg, strDecoder, stream.Sink[string](sink), stream.NewMetrics(reg))
	run := start(t, c)
	waitFor(t, 30*time.Second, "everything committed", func() bool { return e.committedTotal(t) == int64(len(msgs)) })
	if _, err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	if sink.writes != 0 {
		t.Fatalf("Write called %d times on a StreamSink", sink.writes)
	}
	for i, n := range committedWhileFailing {
		if n != 0 {
			t.Errorf("failed commit %d: %d offsets committed while the sink was failing", i+1, n)
		}
	}
	got := sink.all()
	seen := map[string]int{}
	for _, r := range got {
		seen[r.Value]++
	}
	for _, v := range vals {
		if seen[v] != 1 {
			t.Errorf("%s stored %d times, want once", v, seen[v])
		}
	}
	if len(got) != len(vals) {
		t.Errorf("stored %d records, want the %d valid ones", len(got), len(vals))
	}
	// The retries carried exactly the records of the failed live pass.
	if len(sink.failed) != 2 {
		t.Fatalf("%d failed commits, want 2", len(sink.failed))
	}
	first := slices.Clone(sink.failed[0])
	slices.Sort(first)
	second := slices.Clone(sink.failed[1])
	slices.Sort(second)
	if !slices.Equal(first, second) || !slices.Equal(first, offsetSet(got)) {
		t.Errorf("re-read batch differs: live %d records, first re-read %d, committed %d", len(first), len(second), len(got))
	}
	// Per partition, records keep their offset order within a stream.
	for _, c := range sink.committed {
		last := map[int]int64{}
		for _, r := range c {
			if o, ok := last[r.Partition]; ok && r.Offset <= o {
				t.Fatalf("partition %d: offset %d after %d", r.Partition, r.Offset, o)
			}
			last[r.Partition] = r.Offset
		}
	}
	if sink.maxAdd > 256 {
		t.Errorf("Add got %d records at once; the consumer should hand over chunks", sink.maxAdd)
	}
	dead := e.readDLQ(t, 12)
	if len(dead) != 12 {
		t.Errorf("%d dead letters, want 12 (once each, from the live pass)", len(dead))
	}
	if n := metricValue(t, reg, "trace_consumer_sink_retries_total"); n != 2 {
		t.Errorf("sink_retries_total = %v, want 2", n)
	}
	if n := metricValue(t, reg, "trace_consumer_records_inserted_total"); n != float64(len(vals)) {
		t.Errorf("records_inserted_total = %v, want %d", n, len(vals))
	}
}

// On shutdown the streaming batch in flight (not sealed yet: its timeout is
// far off) is sealed, committed, and its offsets committed: nothing fetched
// is left for redelivery.
func TestStreamSinkDrainCommitsTheBatchInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	e.produceN(t, "m", 40)
	sink := &streamSink{}
	cfg := e.config()
	cfg.BatchTimeout = time.Minute
	reg := prometheus.NewRegistry()
	run := start(t, newConsumer(t, cfg, strDecoder, stream.Sink[string](sink), stream.NewMetrics(reg)))
	waitFor(t, 20*time.Second, "all 40 messages fetched", func() bool {
		return metricValue(t, reg, "trace_consumer_messages_consumed_total") == 40
	})
	if len(sink.all()) != 0 {
		t.Fatal("committed before the batch was sealed")
	}
	took, err := run.stop(t)
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	stored := len(sink.all())
	if n := e.committedTotal(t); n != 40 || stored != 40 {
		t.Fatalf("committed %d offsets, stored %d records: want 40 and 40", n, stored)
	}
	t.Logf("drained in %v", took)
}
