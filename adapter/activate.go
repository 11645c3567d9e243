package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/sink"
)

// activation is an auto-activation request (trace.adapters.activate).
type activation struct {
	JobID   string `json:"job_id"`
	Adapter string `json:"adapter"`
}

// ActivationMsgID is the Msg-Id of the request to activate a job's
// adapter: one per job, whichever replica or delivery publishes it.
func ActivationMsgID(jobID string) string { return "activate:" + jobID }

func (s *Stage) requestActivation(ctx context.Context, jobID, name string) error {
	payload, err := json.Marshal(activation{JobID: jobID, Adapter: name})
	if err != nil {
		return err
	}
	return s.cfg.Queue.PublishActivation(ctx, payload, ActivationMsgID(jobID))
}

// activationBound bounds one activation's handling: the engine's load is
// retried for adapter.serving.retry_for (2 min by default), and the
// previous active adapter is unloaded after.
const activationBound = 10 * time.Minute

// defaultActivationAckWait is the consumer's AckWait when its info does
// not say (internal/bus.DefaultActivationAckWait).
const defaultActivationAckWait = time.Minute

// RunActivations consumes activation requests (the durable consumer cons
// of trace.adapters.activate) until ctx ends: each job's adapter is
// activated through the Registry, with the outcome in the job's history
// ("activated", or "activation_failed", which leaves the adapter a
// candidate), then the request is acked. While the engine loads, the
// request is kept in progress, so JetStream redelivers it to another
// replica only if this one dies (AckWait after its last progress). An
// adapter already active is loaded again (an earlier delivery saved its
// status, but the write was answered with an error and the load undone);
// one retired or rolled back since is left as it is. A request whose
// handling fails to read or write the registry (the adapter's row, its
// new status: ClickHouse away) is retried with a growing delay (RetryDelay) while the error may
// pass; a permanent error (Permanent), or any at the MaxDeliveries-th
// delivery, is recorded as activation_failed in the job's history and the
// request terminated: with one request out at a time, a request retried
// without end held up every later activation.
func (s *Stage) RunActivations(ctx context.Context, cons jetstream.Consumer) error {
	ackWait := defaultActivationAckWait
	if info := cons.CachedInfo(); info != nil && info.Config.AckWait > 0 {
		ackWait = info.Config.AckWait
	}
	return consume(ctx, cons, s, activationBound, func(hctx context.Context, m jetstream.Msg) error {
		var a activation
		if err := json.Unmarshal(m.Data(), &a); err != nil || a.JobID == "" || a.Adapter == "" {
			s.cfg.Log.Error("adapter: invalid activation request, dropped", "payload", truncate(string(m.Data()), 512), "err", err)
			why := "no job_id or adapter"
			if err != nil {
				why = truncate(err.Error(), 200)
			}
			return m.TermWithReason("invalid activation request: " + why)
		}
		stop := inProgress(m, ackWait/3)
		defer stop()
		if err := s.activateJobAdapter(hctx, a.JobID, a.Adapter); err != nil {
			return err
		}
		return m.Ack()
	}, func(hctx context.Context, m jetstream.Msg, cause error, deliveries uint64) error {
		var a activation
		_ = json.Unmarshal(m.Data(), &a)
		return s.recordActivationFailed(hctx, a.JobID, a.Adapter, cause, deliveries)
	})
}

// recordActivationFailed records, in the job's history, an activation
// request given up on before the registry was asked (an
// "activation_failed" event: the adapter, the error, the deliveries); the
// adapter is left as it is (a candidate: `trace adapters activate`).
func (s *Stage) recordActivationFailed(ctx context.Context, jobID, name string, cause error, deliveries uint64) error {
	s.cfg.Log.Error("adapter: activation request given up on (recorded as activation_failed)", "job", jobID, "adapter", truncate(name, 256),
		"deliveries", deliveries, "err", truncate(cause.Error(), 2048))
	payload, err := json.Marshal(map[string]any{"adapter": truncate(name, 1024), "error": truncate(cause.Error(), 2048), "deliveries": deliveries})
	if err != nil {
		return err
	}
	return s.RecordNote(ctx, jobID, "trace:activate", "activation_failed", payload)
}

// inProgress tells JetStream every interval that m is still being worked
// on, until the returned function is called.
func inProgress(m jetstream.Msg, every time.Duration) func() {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(max(every, 100*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = m.InProgress()
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// activateJobAdapter activates a succeeded job's adapter if it is still a
// candidate registered to that job, or loads it again if it is active (a
// write of its active status can fail ambiguously: ClickHouse stored the
// row, the answer was lost, and the registry undid the engine's load;
// Activate of an active adapter is a reload, the engine's no-op when it is
// loaded), and records the outcome in the job's history. An error is a
// failure to read or write the registry, to be retried; the activation's
// own failures (the engine's refusal, a transition not allowed) are
// recorded, not returned.
func (s *Stage) activateJobAdapter(ctx context.Context, jobID, name string) error {
	a, err := s.cfg.Store.Adapter(ctx, name)
	if err != nil {
		return err
	}
	switch {
	case a == nil || a.JobID != jobID:
		s.cfg.Log.Warn("adapter: activation request for an adapter not registered to its job, dropped", "adapter", name, "job", jobID)
		return nil
	case a.Status != AdapterCandidate && a.Status != AdapterActive:
		s.cfg.Log.Info("adapter: activation request for an adapter that is no longer a candidate, nothing to do", "adapter", name, "job", jobID,
			"status", a.Status)
		return nil
	}
	changes, err := s.cfg.Registry.Activate(ctx, name)
	if se := (*storeError)(nil); err != nil && len(changes) == 0 && errors.As(err, &se) {
		return err
	}
	now := s.cfg.Now().UTC()
	typ, body := "activated", map[string]any{"adapter": name, "changes": changes}
	if err != nil {
		s.cfg.Log.Warn("adapter: auto-activation failed", "adapter", name, "job", jobID, "err", err)
		body["error"] = err.Error()
		if len(changes) == 0 {
			typ = "activation_failed"
		}
	}
	payload, _ := json.Marshal(body)
	if ierr := s.cfg.Store.InsertTrainingEvents(context.WithoutCancel(ctx), []sink.TrainingEventRow{{JobID: jobID, Key: "trace:activate", Type: typ,
		At: now, Iteration: -1, Payload: string(payload), ReceivedAt: now}}); ierr != nil {
		s.cfg.Log.Warn("adapter: recording the auto-activation", "job", jobID, "err", ierr)
	}
	return nil
}
