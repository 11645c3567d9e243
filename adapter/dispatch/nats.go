// Package dispatch holds the adapt role's trainer backends, each an
// adapter.Backend: nats (jobs on the JetStream work queue
// trace.training.jobs for external trainer workers), command (a configured
// command per job, run to completion with events on its standard output,
// or a scheduler's submit command), and webhook (an HMAC-signed HTTP POST
// of the spec); and the webhook's callback endpoint, over which trainers
// may report instead of NATS. docs/training-protocol.md is the contract.
package dispatch

import (
	"context"

	"github.com/traceops/trace/schemas"
)

// JobPublisher puts a job on trace.training.jobs with Msg-Id = job id
// (internal/bus.Bus).
type JobPublisher interface {
	PublishTrainingJob(ctx context.Context, jobID string, spec []byte) error
}

// JobWithdrawer removes a job not taken yet from trace.training.jobs
// (internal/bus.Bus).
type JobWithdrawer interface {
	WithdrawTrainingJob(ctx context.Context, jobID string) (bool, error)
}

// NATS dispatches to external trainer workers through JetStream; trainers
// report on trace.training.events.<job_id>, which the adapt role consumes.
type NATS struct{ Pub JobPublisher }

// Name is "nats".
func (NATS) Name() string { return "nats" }

// Dispatch publishes the spec; it returns once JetStream stored it.
func (n NATS) Dispatch(ctx context.Context, job *schemas.TrainingJob, spec []byte) error {
	return n.Pub.PublishTrainingJob(ctx, job.JobID, spec)
}

// Withdraw removes a job no trainer has taken from the queue (false: it
// is not there); a publisher that cannot withdraw withdraws nothing.
func (n NATS) Withdraw(ctx context.Context, jobID string) (bool, error) {
	w, ok := n.Pub.(JobWithdrawer)
	if !ok {
		return false, nil
	}
	return w.WithdrawTrainingJob(ctx, jobID)
}
