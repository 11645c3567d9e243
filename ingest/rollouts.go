package ingest

import (
	"context"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// RolloutSink writes rollouts to ClickHouse: the ingest stage's Sink. Errors
// that retrying cannot fix are marked Fatal; everything else (ClickHouse down,
// too many parts, timeouts) is retried by the consumer with backoff while it
// fetches nothing, so there is backpressure and no loss.
type RolloutSink struct {
	Store *sink.Store
}

// Write implements Sink.
func (s *RolloutSink) Write(ctx context.Context, batch []Record[*schemas.Rollout]) error {
	rows := make([]sink.RolloutRow, len(batch))
	for i, rec := range batch {
		rows[i] = sink.RolloutRowFrom(rec.Value, sink.Coord{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset})
	}
	if err := s.Store.InsertRollouts(ctx, rows); err != nil {
		if !sink.IsRetryable(err) && ctx.Err() == nil {
			return Fatal(err)
		}
		return err
	}
	return nil
}

// DecodeRollout is the rollout Decoder with a size limit.
func DecodeRollout(maxBytes int) Decoder[*schemas.Rollout] {
	opt := schemas.DecodeOptions{MaxBytes: maxBytes}
	return func(b []byte) (*schemas.Rollout, error) { return schemas.DecodeRollout(b, opt) }
}

// DecodeLabel is the label-event Decoder.
func DecodeLabel(b []byte) (*schemas.LabelEvent, error) {
	return schemas.DecodeLabel(b, schemas.DecodeOptions{})
}
