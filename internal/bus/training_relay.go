package bus

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/schemas"
)

// RelayTrainingEvent publishes an event received over the webhook
// backend's callback endpoint, as received, on the job's subject
// trace.training.events.<job_id> (no new subject: the adapt role consumes
// it as any trainer's event, and records a malformed one as such). msgID,
// when set, is the JetStream Msg-Id, so a POST retried within the
// duplicate window is stored once.
func (b *Bus) RelayTrainingEvent(ctx context.Context, jobID string, data []byte, msgID string) error {
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	if _, err := b.JS.Publish(ctx, schemas.TrainingEventsSubject(jobID), data, opts...); err != nil {
		return fmt.Errorf("nats: relay training event: %w", err)
	}
	return nil
}
