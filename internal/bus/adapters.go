package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/schemas"
)

// Adapter transitions (TRACE step 4, the closed loop). Every transition of
// an adapter in the registry — activated, retired, rolled_back — is
// published on trace.adapters.events (schema adapter_event/v1) so that the
// routers drop or add it without polling the registry; the closed loop's
// guard publishes its rollbacks here. The stream keeps them for replay (a
// router that starts reads the registry, then follows the stream).
const (
	StreamAdapterEvents  = "TRACE_ADAPTER_EVENTS"
	SubjectAdapterEvents = "trace.adapters.events"
)

// Auto-activations (adapter.auto_activate): the adapt role applies a job's
// success on the ordered events consumer and puts the activation of its
// adapter (a load into the serving engine, which may take minutes) here,
// as a unit of work of its own, so that it holds up no job's events.
// Work-queue retention: a request is removed once a replica acks it.
const (
	StreamAdapterActivations  = "TRACE_ADAPTER_ACTIVATIONS"
	SubjectAdapterActivate    = "trace.adapters.activate"
	DurableAdapterActivations = "trace-adapter-activations"
	DefaultActivationAckWait  = time.Minute
)

func adapterStreams(dup time.Duration) []jetstream.StreamConfig {
	return []jetstream.StreamConfig{
		{Name: StreamAdapterEvents, Subjects: []string{SubjectAdapterEvents}, Storage: jetstream.FileStorage, Duplicates: dup,
			MaxAge: 30 * 24 * time.Hour, Description: "trace adapter transitions (adapter_event/v1): activated, retired, rolled_back"},
		{Name: StreamAdapterActivations, Subjects: []string{SubjectAdapterActivate}, Storage: jetstream.FileStorage, Duplicates: dup,
			Retention: jetstream.WorkQueuePolicy, Description: "trace adapt role: activations of succeeded jobs' adapters (adapter.auto_activate)"},
	}
}

// PublishActivation puts an activation request on trace.adapters.activate
// with msgID as Msg-Id: publishing it again within the duplicate window
// (a redelivered success, another replica) adds nothing.
func (b *Bus) PublishActivation(ctx context.Context, payload []byte, msgID string) error {
	if _, err := b.JS.Publish(ctx, SubjectAdapterActivate, payload, jetstream.WithMsgID(msgID)); err != nil {
		return fmt.Errorf("nats: publish activation %s: %w", msgID, err)
	}
	return nil
}

// ActivationsConsumer is the adapt role's durable consumer of activation
// requests, shared by every replica. It has one request out at a time
// (MaxAckPending 1): the registry's transitions are serialised within a
// process only, and two replicas activating two adapters of one
// (environment, capability) at once could both leave theirs active. The
// handler reports progress while the engine loads, so AckWait bounds a
// replica that died, not a slow load.
func (b *Bus) ActivationsConsumer(ctx context.Context, ackWait time.Duration) (jetstream.Consumer, error) {
	c, err := b.JS.CreateOrUpdateConsumer(ctx, StreamAdapterActivations, jetstream.ConsumerConfig{
		Durable: DurableAdapterActivations, Description: "trace adapt role: auto-activation of succeeded jobs' adapters",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: cmpDur(ackWait, DefaultActivationAckWait), MaxDeliver: -1, MaxAckPending: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("nats: activations consumer: %w", err)
	}
	return c, nil
}

// PublishAdapterEvent validates an event and publishes it on
// trace.adapters.events with its event id as Msg-Id: the same transition
// published twice within the duplicate window is stored once.
func (b *Bus) PublishAdapterEvent(ctx context.Context, e *schemas.AdapterEvent) error {
	data, err := e.Encode()
	if err != nil {
		return err
	}
	if _, err := b.JS.Publish(ctx, SubjectAdapterEvents, data, jetstream.WithMsgID(e.EventID)); err != nil {
		return fmt.Errorf("nats: publish adapter event %s: %w", e.EventID, err)
	}
	return nil
}
