package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/schemas"
)

// DurableSynthesizer is the durable consumer of the synthesize role on
// TRACE_SYNTHESIS: every replica shares it, so each request goes to one.
const DurableSynthesizer = "trace-synthesizer"

// DefaultSynthesisAckWait is the ack wait of DurableSynthesizer; the worker
// sends an in-progress ack every third of it.
const DefaultSynthesisAckWait = 2 * time.Minute

// SynthesisConsumer returns the durable pull consumer of synthesis
// requests, creating or updating it. It redelivers without a limit
// (MaxDeliver -1): the synthesizer counts deliveries itself and records a
// request FAILED at its own MaxDeliver, so no request is dropped before its
// failure is recorded.
func (b *Bus) SynthesisConsumer(ctx context.Context, ackWait time.Duration) (jetstream.Consumer, error) {
	if ackWait <= 0 {
		ackWait = DefaultSynthesisAckWait
	}
	c, err := b.JS.CreateOrUpdateConsumer(ctx, StreamSynthesis, jetstream.ConsumerConfig{
		Durable:       DurableSynthesizer,
		Description:   "trace synthesize role: synthesis requests → environments",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: 256,
		FilterSubject: SubjectSynthesis + ".>",
	})
	if err != nil {
		return nil, fmt.Errorf("nats: synthesis consumer: %w", err)
	}
	return c, nil
}

// RequeueSynthesis puts a synthesis request back on its subject, for the
// synthesize role to resume its environment, with msgID as Msg-Id: every
// replica that requeues the same msgID within the duplicate window adds
// one message, which the durable consumer hands to one replica. (The
// trigger claim of PublishSynthesis is not consulted: the request was
// published and handled once already.)
func (b *Bus) RequeueSynthesis(ctx context.Context, req *schemas.SynthesisRequest, msgID string) error {
	r := *req
	r.Schema = "synthesis_request/v1"
	data, err := json.Marshal(&r)
	if err != nil {
		return err
	}
	if _, err := b.JS.Publish(ctx, SynthesisSubject(r.Environment, r.Capability.Skill), data, jetstream.WithMsgID(msgID)); err != nil {
		return fmt.Errorf("nats: requeue synthesis request: %w", err)
	}
	return nil
}

// PublishEnvironmentReady announces a DONE environment on
// trace.environments.ready (stream TRACE_ENVIRONMENTS) with the
// environment id as Msg-Id: announcing it again within the duplicate window
// (a redelivered request of a DONE environment) is dropped by JetStream.
func (b *Bus) PublishEnvironmentReady(ctx context.Context, m *schemas.EnvironmentReady) error {
	m.Schema = schemas.EnvironmentReadySchema
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if _, err := schemas.DecodeEnvironmentReady(data); err != nil { // never put an invalid message on the wire
		return fmt.Errorf("environment ready %s: %w", m.EnvironmentID, err)
	}
	if _, err := b.JS.Publish(ctx, SubjectEnvReady, data, jetstream.WithMsgID(m.EnvironmentID)); err != nil {
		return fmt.Errorf("nats: publish environment ready: %w", err)
	}
	return nil
}

// ReadyEnvironments reads every environment-ready message still in the
// stream, in order, decoded; an invalid one is an error. No command calls
// it (trace env list reads the environments table, and the stream's
// readers are subscribers outside trace, such as trainers): the tests of
// this package and internal/app use it to check what was announced, as a
// subscriber of trace.environments.ready receives it.
func (b *Bus) ReadyEnvironments(ctx context.Context) ([]*schemas.EnvironmentReady, error) {
	s, err := b.JS.Stream(ctx, StreamEnvReady)
	if err != nil {
		return nil, fmt.Errorf("nats: stream %s: %w", StreamEnvReady, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("nats: stream %s: %w", StreamEnvReady, err)
	}
	var out []*schemas.EnvironmentReady
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("nats: %s seq %d: %w", StreamEnvReady, seq, err)
		}
		e, err := schemas.DecodeEnvironmentReady(m.Data)
		if err != nil {
			return nil, fmt.Errorf("nats: %s seq %d: %w", StreamEnvReady, seq, err)
		}
		out = append(out, e)
	}
	return out, nil
}
