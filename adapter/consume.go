package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// RunReady consumes trace.environments.ready (the durable consumer cons)
// until ctx ends: each message is planned and dispatched, then acked. An
// invalid message is terminated (it can never be planned) and logged; a
// failure to record or dispatch is retried with a growing delay. On
// cancellation the message in hand is finished first.
func (s *Stage) RunReady(ctx context.Context, cons jetstream.Consumer) error {
	return consume(ctx, cons, s, handlerBound, func(hctx context.Context, m jetstream.Msg) error {
		r, err := schemas.DecodeEnvironmentReady(m.Data())
		if err != nil {
			s.cfg.Log.Error("adapter: invalid environment ready message, dropped", "subject", m.Subject(), "err", err)
			return m.TermWithReason("invalid environment ready message: " + truncate(err.Error(), 200))
		}
		res, err := s.HandleReady(hctx, r)
		if err != nil { // named, for the retry's warning
			return fmt.Errorf("environment %s (%s): %w", r.EnvironmentID, r.Capability.Name, err)
		}
		if res.Duplicate {
			s.cfg.Log.Info("adapter: ready environment already has its job", "environment_id", r.EnvironmentID, "job", res.JobID)
		}
		return m.Ack()
	}, nil)
}

// RunEvents consumes trace.training.events.> until ctx ends. A malformed
// event is recorded in the job's history (type "malformed", the payload
// as received) and acked: never lost, never fatal. A deadline's failure
// (Msg-Id DeadlineMsgID, published by CheckDeadlines) is applied only if
// the job is still open with that deadline. An event that cannot be
// applied — a permanent error (Permanent), or any error at its
// MaxDeliveries-th delivery — is recorded in its job's history in its
// place (type "rejected": the error, the deliveries, the event) and
// terminated: the consumer hands out one event at a time, so an event
// retried without end held up every job's events. A rejected terminal
// event (succeeded, failed) fails its job now, with the rejection as the
// reason (it stayed open until its deadline): trace publishes that failure
// on the job's subject (worker RejectedWorker, Msg-Id RejectedMsgID), so
// it is applied in order, once, and only if the job is still open. (A success that was
// applied but whose adapter's activation could not be requested is
// recorded as activation_failed instead.) Other errors are
// retried with a growing delay (RetryDelay); a rejection that cannot be
// recorded (ClickHouse away) is retried too, never dropped.
func (s *Stage) RunEvents(ctx context.Context, cons jetstream.Consumer) error {
	return consume(ctx, cons, s, handlerBound, func(hctx context.Context, m jetstream.Msg) error {
		e, jobID, key, own, err := eventOf(m)
		if err != nil {
			if rerr := s.RecordMalformed(hctx, jobID, key, m.Data(), err); rerr != nil {
				return rerr
			}
			return m.Ack()
		}
		if own != nil {
			if _, err := s.handleEvent(hctx, e, key, m.Data(), own); err != nil {
				return err
			}
			return m.Ack()
		}
		if err := s.HandleEvent(hctx, e, key, m.Data()); err != nil {
			if errors.Is(err, ErrUnknownJob) {
				s.cfg.Log.Warn("adapter: event of an unknown job (recorded)", "job", e.JobID, "type", e.Type)
				return m.Ack()
			}
			return err
		}
		return m.Ack()
	}, func(hctx context.Context, m jetstream.Msg, cause error, deliveries uint64) error {
		e, jobID, key, own, _ := eventOf(m)
		var ar *activationRequestError
		if errors.As(cause, &ar) { // the event was applied: only the activation is given up on
			return s.recordActivationFailed(hctx, jobID, ar.adapter, cause, deliveries)
		}
		if err := s.recordRejected(hctx, jobID, key, m.Data(), cause, deliveries); err != nil {
			return err
		}
		if e == nil || own != nil || (e.Type != schemas.EventSucceeded && e.Type != schemas.EventFailed) {
			return nil
		}
		return s.failRejected(hctx, e, key, cause)
	})
}

// RejectedWorker is the worker of the failed events trace makes of a
// job whose terminal event was rejected.
const RejectedWorker = "trace rejection"

// RejectedMsgID is the Msg-Id of the failure of a job whose terminal
// event, key in its history, was rejected: rejected:<job_id>:<key>, the
// same for every replica and delivery that rejects it.
func RejectedMsgID(jobID, key string) string { return rejectedPrefix + jobID + ":" + key }

const rejectedPrefix = "rejected:"

// failRejected publishes the failure of e's job, whose terminal event e
// (key) was rejected for cause, on the job's events subject (RunEvents
// applies it if the job is still open). An error is the rejection's: the
// event is delivered again, rejected again and the failure published
// again (one message per Msg-Id).
func (s *Stage) failRejected(ctx context.Context, e *schemas.TrainingEvent, key string, cause error) error {
	if s.cfg.Queue == nil {
		s.cfg.Log.Warn("adapter: no queue to fail the job of a rejected terminal event; it ends at its deadline", "job", e.JobID)
		return nil
	}
	f := &schemas.TrainingEvent{JobID: e.JobID, Type: schemas.EventFailed, At: s.cfg.Now().UTC(), Worker: RejectedWorker,
		Reason: fmt.Sprintf("rejected: the trainer's %s event (%s) could not be applied: %s", e.Type, key, truncate(cause.Error(), 2048))}
	return s.cfg.Queue.PublishTrainingEventID(ctx, f, RejectedMsgID(e.JobID, key))
}

// eventOf decodes an event message: the event, its job (the subject's when
// the event does not decode) and its key in the job's history (seq:<seq>,
// else js:<stream sequence>; trace:deadline for a deadline's failure,
// trace:rejected for a rejected terminal event's) and, for a failure of
// trace's (Msg-Id DeadlineMsgID or RejectedMsgID), what it is. err says
// why a message is malformed.
func eventOf(m jetstream.Msg) (e *schemas.TrainingEvent, jobID, key string, own *ownFailure, err error) {
	jobID = strings.TrimPrefix(m.Subject(), schemas.SubjectTrainingEvents+".")
	key = "js:0"
	if md, err := m.Metadata(); err == nil {
		key = "js:" + strconv.FormatUint(md.Sequence.Stream, 10)
	}
	e, err = schemas.DecodeTrainingEvent(m.Data())
	if err == nil && schemas.TrainingEventsSubject(e.JobID) != m.Subject() {
		err = errors.New("job_id " + e.JobID + " is not the subject's")
	}
	if err != nil {
		return nil, jobID, key, nil, err
	}
	if e.Seq != nil {
		key = "seq:" + strconv.FormatInt(*e.Seq, 10)
	}
	msgID := m.Headers().Get(jetstream.MsgIDHeader)
	if job, at, ok := deadlineOf(msgID); ok && job == e.JobID && e.Type == schemas.EventFailed {
		key, own = "trace:deadline", &ownFailure{deadline: &at}
	} else if strings.HasPrefix(msgID, rejectedPrefix+e.JobID+":") && e.Type == schemas.EventFailed && e.Worker == RejectedWorker {
		key, own = "trace:rejected", &ownFailure{}
	}
	return e, e.JobID, key, own, nil
}

// recordRejected records, in its job's history and in its place (the same
// key), an event that could not be applied: type "rejected", with the
// error, the deliveries it took and the event as received. The job's
// status is unchanged (RunEvents fails it after, through failRejected,
// when the event was its terminal one).
func (s *Stage) recordRejected(ctx context.Context, jobID, key string, payload []byte, cause error, deliveries uint64) error {
	now := s.cfg.Now().UTC()
	var event any = json.RawMessage(payload)
	if len(payload) > 64<<10 || !json.Valid(payload) {
		event = truncate(string(payload), 64<<10)
	}
	body, err := json.Marshal(map[string]any{"error": truncate(cause.Error(), 2048), "deliveries": deliveries, "event": event})
	if err != nil {
		return err
	}
	s.cfg.Log.Error("adapter: training event rejected: it cannot be applied (recorded in its job's history)", "job", jobID, "key", key,
		"deliveries", deliveries, "err", truncate(cause.Error(), 2048))
	return s.cfg.Store.InsertTrainingEvents(ctx, []sink.TrainingEventRow{{JobID: jobID, Key: key, Type: "rejected", At: now, Iteration: -1,
		Payload: string(body), ReceivedAt: now}})
}

// RecordMalformed records an event that could not be decoded in its job's
// history.
func (s *Stage) RecordMalformed(ctx context.Context, jobID, key string, payload []byte, cause error) error {
	now := s.cfg.Now().UTC()
	s.cfg.Log.Warn("adapter: malformed training event (recorded)", "job", jobID, "err", cause)
	return s.cfg.Store.InsertTrainingEvents(ctx, []sink.TrainingEventRow{{JobID: jobID, Key: key, Type: "malformed", At: now, Iteration: -1,
		Payload: truncate(string(payload), 64<<10) + "\n# " + cause.Error(), ReceivedAt: now}})
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// RunDeadlines publishes the failure of silent jobs every interval until
// ctx ends (CheckDeadlines); RunEvents applies it.
func (s *Stage) RunDeadlines(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := s.CheckDeadlines(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Log.Warn("adapter: deadline check", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// handlerBound bounds the handling of a ready environment or an event.
const handlerBound = time.Minute

// drainBound bounds the drain of a consumer's buffered messages on
// shutdown.
const drainBound = 10 * time.Second

// rejectBound bounds the recording of a rejected message.
const rejectBound = 30 * time.Second

// MaxDeliveries bounds the deliveries of an event or an activation request
// whose handling keeps failing with an error that might pass (ClickHouse
// unavailable, a timeout): at the last one it is rejected (recorded, then
// terminated). With RetryDelay's delays the last comes about 2.5 minutes
// after the first. JetStream's own MaxDeliver is not set: it stops the
// deliveries without a record, and leaves a work queue's message in the
// stream; the bound here records why.
const MaxDeliveries = 10

// RetryDelay is how long a message whose handling failed at its
// deliveries-th delivery waits before the next (NakWithDelay): 1 s,
// doubling, at most 30 s.
func RetryDelay(deliveries uint64) time.Duration {
	d := time.Second
	for i := uint64(1); i < deliveries && d < 30*time.Second; i++ {
		d *= 2
	}
	return min(d, 30*time.Second)
}

// Permanent says whether retrying cannot mend err: a ClickHouse exception
// whose code is not one of the retryable ones (sink.IsRetryable: a query
// the server refuses, a value it cannot take), or a panic in the handler.
// Everything else — network, timeouts, NATS, an unknown error — may pass
// and is retried, up to MaxDeliveries.
func Permanent(err error) bool {
	var p *permanentError
	if errors.As(err, &p) {
		return true
	}
	return sink.ErrorCode(err) != 0 && !sink.IsRetryable(err)
}

// permanentError marks an error no retry can mend.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// rejectFunc records a message consume gives up on (why, after how many
// deliveries); nil: every failure is retried.
type rejectFunc func(ctx context.Context, m jetstream.Msg, cause error, deliveries uint64) error

// consume runs handle on each message of cons until ctx ends, each within
// bound. handle's error naks the message with RetryDelay; with reject, a
// Permanent error, or any at the MaxDeliveries-th delivery, is recorded by
// reject and the message terminated (if reject fails, the message is
// retried: what is given up on is never dropped unrecorded). A panic in
// handle is a permanent error. The message in hand when ctx ends is
// finished with a context of its own. Messages already buffered when ctx
// ends are handed back (Nak'd) after the subscription is drained, so
// another replica gets them at once instead of after the consumer's
// AckWait. A consumer that no longer exists on the server ends consume with
// an error naming it (consumerGone).
func consume(ctx context.Context, cons jetstream.Consumer, s *Stage, bound time.Duration, handle func(context.Context, jetstream.Msg) error,
	reject rejectFunc) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(16))
	if err != nil {
		return err
	}
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			it.Drain()
			select { // a drain that cannot finish (the connection gone) is cut short
			case <-stopped:
			case <-time.After(drainBound):
				it.Stop()
			}
		case <-stopped:
			it.Stop()
		}
	}()
	for {
		m, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			if ctx.Err() == nil { // else draining: Next ends with ErrMsgIteratorClosed
				if gone := consumerGone(ctx, cons); gone != nil {
					return gone
				}
				s.cfg.Log.Warn("adapter: consumer", "err", err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if ctx.Err() != nil {
			_ = m.Nak()
			continue
		}
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
		err = s.handleSafely(hctx, m, handle)
		cancel()
		if err != nil {
			// A context of its own: the handler may have used up its bound.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rejectBound)
			s.failed(fctx, m, err, reject)
			cancel()
		}
	}
}

// consumerGone returns an error naming cons when it no longer exists on
// the server (NATS came back without its JetStream storage, or the
// consumer was deleted): nothing but a start of the role creates it
// again, and the iterator went on without it, reporting missed
// heartbeats, while ready environments piled up unhandled. Nil while it
// exists or cannot be asked (NATS away).
func consumerGone(ctx context.Context, cons jetstream.Consumer) error {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := cons.Info(ictx)
	if !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	name, stream := "", ""
	if info := cons.CachedInfo(); info != nil {
		name, stream = info.Name, info.Stream
	}
	return fmt.Errorf("nats: consumer %s of stream %s is gone (NATS restarted without its JetStream storage, or it was deleted): %w; "+
		"a restart of trace creates it again", name, stream, err)
}

// handleSafely runs handle; a panic is logged with its stack and returned
// as a permanent error.
func (s *Stage) handleSafely(ctx context.Context, m jetstream.Msg, handle func(context.Context, jetstream.Msg) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.cfg.Log.Error("adapter: panic handling a message", "subject", m.Subject(), "panic", p, "stack", string(debug.Stack()))
			err = &permanentError{fmt.Errorf("panic: %v", p)}
		}
	}()
	return handle(ctx, m)
}

// failed settles a message whose handling failed with err: rejected and
// terminated (see consume), or Nak'd with RetryDelay.
func (s *Stage) failed(ctx context.Context, m jetstream.Msg, err error, reject rejectFunc) {
	n := uint64(1)
	if md, merr := m.Metadata(); merr == nil {
		n = md.NumDelivered
	}
	if reject != nil && (Permanent(err) || n >= MaxDeliveries) {
		rerr := reject(ctx, m, err, n)
		if rerr == nil {
			_ = m.TermWithReason("rejected by trace: " + truncate(err.Error(), 200))
			return
		}
		s.cfg.Log.Warn("adapter: recording a rejected message failed; it will be retried", "subject", m.Subject(), "err", rerr)
	}
	delay := RetryDelay(n)
	if s.retryDelay != nil {
		delay = s.retryDelay(n)
	}
	s.cfg.Log.Warn("adapter: will retry", "subject", m.Subject(), "deliveries", n, "err", truncate(err.Error(), 2048), "delay", delay)
	_ = m.NakWithDelay(delay)
}
