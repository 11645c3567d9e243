package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// DecodeRollout is the rollout Decoder with a size limit.
func DecodeRollout(maxBytes int) stream.Decoder[*schemas.Rollout] {
	opt := schemas.DecodeOptions{MaxBytes: maxBytes}
	return func(b []byte) (*schemas.Rollout, error) {
		r, err := schemas.DecodeRollout(b, opt)
		if err != nil {
			return nil, err
		}
		if err := storableTimes(r); err != nil {
			return nil, err
		}
		return r, nil
	}
}

// DecodeLabel is the label-event Decoder.
func DecodeLabel(b []byte) (*schemas.LabelEvent, error) {
	l, err := schemas.DecodeLabel(b, schemas.DecodeOptions{})
	if err != nil {
		return nil, err
	}
	if err := storableTime("/ts", l.TS); err != nil {
		return nil, err
	}
	return l, nil
}

// storableTimes refuses a rollout whose start or end time the rollouts
// table cannot hold (see storableTime).
func storableTimes(r *schemas.Rollout) error {
	if err := storableTime("/start_time", r.StartTime); err != nil {
		return err
	}
	return storableTime("/end_time", r.EndTime)
}

// storableTime refuses a time that the store's DateTime columns cannot hold
// (before 1970 or after 2106-02-07T06:28:15Z: it would be stored wrapped
// around, 2110 as 1973, where the TTL deletes it). The message is
// dead-lettered, reason schema, instead of being stored with another time.
// A zero time is an absent one (sink.EventTime then stores the Kafka
// message's timestamp for an end time, the end time for a start time).
func storableTime(path string, t time.Time) error {
	if t.IsZero() || sink.InDateTimeRange(t) {
		return nil
	}
	return &schemas.Error{Reason: schemas.ReasonSchema, Path: path, Msg: fmt.Sprintf("%s %s is outside %s..%s, the times the store holds",
		path[1:], t.Format(time.RFC3339Nano), sink.MinDateTime.Format(time.RFC3339), sink.MaxDateTime.Format(time.RFC3339))}
}

// DecodeRolloutRow decodes, validates and compacts a rollout into its
// ClickHouse row in one step. The ingest stage uses it so that compaction
// runs in the consumer's parallel decode workers and a batch holds compact
// rows instead of whole rollouts (less memory, less work in the serial write
// stage). The row's Kafka coordinates are filled in by RowSink.
//
// The rollout is decoded raw (schemas.DecodeRawRollout): contents,
// arguments and metadata are stored as JSON anyway, so the row is made from
// their text in the input (sink.RawRolloutRow) rather than from decoded
// values encoded again.
func DecodeRolloutRow(maxBytes int) stream.Decoder[*sink.RolloutRow] {
	opt := schemas.DecodeOptions{MaxBytes: maxBytes}
	return func(b []byte) (*sink.RolloutRow, error) {
		r, err := schemas.DecodeRawRollout(b, opt)
		if err != nil {
			return nil, err
		}
		if err := storableTimes(&r.Head); err != nil {
			return nil, err
		}
		row := sink.RawRolloutRow(r, sink.Coord{})
		return &row, nil
	}
}

// RowSink writes rows made by DecodeRolloutRow: the ingest stage's sink.
// Errors that retrying cannot fix are marked Fatal; everything else
// (ClickHouse down, too many parts, timeouts) is retried by the consumer with
// backoff while it fetches nothing, so there is backpressure and no loss.
type RowSink struct {
	Store *sink.Store
}

// Write implements Sink: the batch through one Stream. (A Consumer streams
// instead; see StreamSink.)
func (s *RowSink) Write(ctx context.Context, batch []stream.Record[*sink.RolloutRow]) error {
	st, err := s.Begin(ctx)
	if err != nil {
		return err
	}
	defer st.Abort()
	if err := st.Add(batch); err != nil {
		return err
	}
	return st.Commit()
}

// Begin implements StreamSink: the batch is streamed into one INSERT, each
// row dropped as soon as it is appended.
func (s *RowSink) Begin(ctx context.Context) (stream.Stream[*sink.RolloutRow], error) {
	ins, err := s.Store.BeginRollouts(ctx)
	if err != nil {
		return nil, classify(ctx, err)
	}
	return &rowStream{ctx: ctx, ins: ins}, nil
}

type rowStream struct {
	ctx context.Context
	ins *sink.RolloutInsert
}

func (st *rowStream) Add(recs []stream.Record[*sink.RolloutRow]) error {
	for _, rec := range recs {
		row := rec.Value
		row.Coord = sink.Coord{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset}
		row.EndTime = sink.EventTime(row.EndTime, row.StartTime, rec.Time)
		if err := st.ins.Append(row); err != nil {
			return classify(st.ctx, err)
		}
	}
	return nil
}

func (st *rowStream) Commit() error { return classify(st.ctx, st.ins.Commit()) }
func (st *rowStream) Abort()        { st.ins.Abort() }

// classify marks errors that retrying cannot fix as Fatal.
func classify(ctx context.Context, err error) error {
	if err != nil && !sink.IsRetryable(err) && ctx.Err() == nil {
		return stream.Fatal(err)
	}
	return err
}
