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

func adapterStreams(dup time.Duration) []jetstream.StreamConfig {
	return []jetstream.StreamConfig{
		{Name: StreamAdapterEvents, Subjects: []string{SubjectAdapterEvents}, Storage: jetstream.FileStorage, Duplicates: dup,
			MaxAge: 30 * 24 * time.Hour, Description: "trace adapter transitions (adapter_event/v1): activated, retired, rolled_back"},
	}
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
