package adapter

import (
	"context"
	"errors"
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
			return m.Term()
		}
		res, err := s.HandleReady(hctx, r)
		if err != nil {
			return err
		}
		if res.Duplicate {
			s.cfg.Log.Info("adapter: ready environment already has its job", "environment_id", r.EnvironmentID, "job", res.JobID)
		}
		return m.Ack()
	})
}

// RunEvents consumes trace.training.events.> until ctx ends. A malformed
// event is recorded in the job's history (type "malformed", the payload
// as received) and acked: never lost, never fatal. A deadline's failure
// (Msg-Id DeadlineMsgID, published by CheckDeadlines) is applied only if
// the job is still open with that deadline.
func (s *Stage) RunEvents(ctx context.Context, cons jetstream.Consumer) error {
	return consume(ctx, cons, s, handlerBound, func(hctx context.Context, m jetstream.Msg) error {
		key := "js:0"
		if md, err := m.Metadata(); err == nil {
			key = "js:" + strconv.FormatUint(md.Sequence.Stream, 10)
		}
		e, err := schemas.DecodeTrainingEvent(m.Data())
		if err == nil && schemas.TrainingEventsSubject(e.JobID) != m.Subject() {
			err = errors.New("job_id " + e.JobID + " is not the subject's")
		}
		if err != nil {
			jobID := strings.TrimPrefix(m.Subject(), schemas.SubjectTrainingEvents+".")
			if rerr := s.RecordMalformed(hctx, jobID, key, m.Data(), err); rerr != nil {
				return rerr
			}
			return m.Ack()
		}
		if e.Seq != nil {
			key = "seq:" + strconv.FormatInt(*e.Seq, 10)
		}
		if job, deadline, ok := deadlineOf(m.Headers().Get(jetstream.MsgIDHeader)); ok && job == e.JobID && e.Type == schemas.EventFailed {
			if _, err := s.handleEvent(hctx, e, "trace:deadline", m.Data(), &deadline); err != nil {
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
	})
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

// consume runs handle on each message of cons until ctx ends, each within
// bound. handle's error naks the message with a delay growing with its deliveries; the
// message in hand when ctx ends is finished with a context of its own.
// Messages already buffered when ctx ends are handed back (Nak'd) after
// the subscription is drained, so another replica gets them at once
// instead of after the consumer's AckWait.
func consume(ctx context.Context, cons jetstream.Consumer, s *Stage, bound time.Duration, handle func(context.Context, jetstream.Msg) error) error {
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
		if err := handle(hctx, m); err != nil {
			delay := time.Second
			if md, merr := m.Metadata(); merr == nil {
				delay = min(time.Duration(md.NumDelivered)*time.Second, 30*time.Second)
			}
			s.cfg.Log.Warn("adapter: will retry", "subject", m.Subject(), "err", err, "delay", delay)
			_ = m.NakWithDelay(delay)
		}
		cancel()
	}
}
