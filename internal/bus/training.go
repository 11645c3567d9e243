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

// The training resources (TRACE step 3). JetStream stream names cannot hold
// dots, so the stream the issue calls trace.training.jobs is
// TRACE_TRAINING_JOBS, capturing subject trace.training.jobs.
const (
	StreamTrainingJobs    = "TRACE_TRAINING_JOBS"
	SubjectTrainingJobs   = "trace.training.jobs"
	StreamTrainingEvents  = "TRACE_TRAINING_EVENTS"
	BucketTrainingClaims  = "trace_training_claims"
	DurableAdapter        = "trace-adapter"        // the adapt role on TRACE_ENVIRONMENTS
	DurableAdapterEvents  = "trace-adapter-events" // the adapt role on TRACE_TRAINING_EVENTS
	DurableTrainers       = "trace-trainers"       // trainer workers on TRACE_TRAINING_JOBS
	DefaultAdapterAckWait = time.Minute
)

// trainingStreams are ensured with the others: jobs with work-queue
// retention (a job is removed once a worker acks it, and one consumer
// takes each), events kept for replay.
func trainingStreams(dup time.Duration) []jetstream.StreamConfig {
	return []jetstream.StreamConfig{
		{Name: StreamTrainingJobs, Subjects: []string{SubjectTrainingJobs}, Storage: jetstream.FileStorage, Duplicates: dup,
			Retention: jetstream.WorkQueuePolicy, Description: "trace training jobs (training_job/v1) for trainer workers"},
		{Name: StreamTrainingEvents, Subjects: []string{schemas.SubjectTrainingEvents + ".>"}, Storage: jetstream.FileStorage, Duplicates: dup,
			MaxAge: 30 * 24 * time.Hour, Description: "trace training events (training_event/v1) reported by trainers"},
	}
}

// ReadyConsumer is the adapt role's durable consumer of
// trace.environments.ready: every replica shares it.
func (b *Bus) ReadyConsumer(ctx context.Context, ackWait time.Duration) (jetstream.Consumer, error) {
	c, err := b.JS.CreateOrUpdateConsumer(ctx, StreamEnvReady, jetstream.ConsumerConfig{
		Durable: DurableAdapter, Description: "trace adapt role: ready environments → training jobs",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: cmpDur(ackWait, DefaultAdapterAckWait), MaxDeliver: -1,
		FilterSubject: SubjectEnvReady,
	})
	if err != nil {
		return nil, fmt.Errorf("nats: ready consumer: %w", err)
	}
	return c, nil
}

// TrainingEventsConsumer is the adapt role's durable consumer of every
// job's events. Every replica shares it, and it has one event out at a
// time (MaxAckPending 1): applying an event reads the job's row and writes
// a new version of it, so two replicas applying two events of one job at
// once would write one over the other (a success lost under a heartbeat
// read before it). One at a time, the replicas apply the events as one
// replica does, in stream order.
func (b *Bus) TrainingEventsConsumer(ctx context.Context, ackWait time.Duration) (jetstream.Consumer, error) {
	c, err := b.JS.CreateOrUpdateConsumer(ctx, StreamTrainingEvents, jetstream.ConsumerConfig{
		Durable: DurableAdapterEvents, Description: "trace adapt role: training events → status, history, registry",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: cmpDur(ackWait, DefaultAdapterAckWait), MaxDeliver: -1, MaxAckPending: 1,
		FilterSubject: schemas.SubjectTrainingEvents + ".>",
	})
	if err != nil {
		return nil, fmt.Errorf("nats: training events consumer: %w", err)
	}
	return c, nil
}

// TrainerMaxAckPending bounds the jobs the trainer workers hold un-acked
// at once, fleet-wide: a worker acks a job when its terminal event is
// out, so this is how many can train at once (each worker takes one at a
// time).
const TrainerMaxAckPending = 1024

// TrainerConsumerConfig is the durable consumer trainer workers share on
// TRACE_TRAINING_JOBS (a work queue admits one consumer per subject), with
// ackWait (0: 5 minutes).
func TrainerConsumerConfig(ackWait time.Duration) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable: DurableTrainers, Description: "trainer workers", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: cmpDur(ackWait, 5*time.Minute), MaxAckPending: TrainerMaxAckPending,
	}
}

// TrainerConsumer creates or updates TrainerConsumerConfig(ackWait).
func (b *Bus) TrainerConsumer(ctx context.Context, ackWait time.Duration) (jetstream.Consumer, error) {
	c, err := b.JS.CreateOrUpdateConsumer(ctx, StreamTrainingJobs, TrainerConsumerConfig(ackWait))
	if err != nil {
		return nil, fmt.Errorf("nats: trainer consumer: %w", err)
	}
	return c, nil
}

func cmpDur(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// PublishTrainingJob puts a job on trace.training.jobs with the job id as
// Msg-Id (a second publish within the duplicate window is dropped).
func (b *Bus) PublishTrainingJob(ctx context.Context, jobID string, spec []byte) error {
	if _, err := b.JS.Publish(ctx, SubjectTrainingJobs, spec, jetstream.WithMsgID(jobID)); err != nil {
		return fmt.Errorf("nats: publish training job %s: %w", jobID, err)
	}
	return nil
}

// WithdrawTrainingJob removes a job from trace.training.jobs (the message
// whose Msg-Id is jobID), so that no trainer starts a job trace has given
// up on; false when it is not there (ended and acked, or withdrawn
// already). It reads the queue's messages in order until it finds the
// job: the queue holds the jobs not yet acked, waiting or held by a
// trainer (trainers ack a job when it ends), and withdrawing a held one
// does not stop its trainer.
func (b *Bus) WithdrawTrainingJob(ctx context.Context, jobID string) (bool, error) {
	s, err := b.JS.Stream(ctx, StreamTrainingJobs)
	if err != nil {
		return false, fmt.Errorf("nats: withdraw training job %s: %w", jobID, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("nats: withdraw training job %s: %w", jobID, err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(SubjectTrainingJobs))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("nats: withdraw training job %s: %w", jobID, err)
		}
		if m.Header.Get(jetstream.MsgIDHeader) == jobID {
			if err := s.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				return false, fmt.Errorf("nats: withdraw training job %s: %w", jobID, err)
			}
			return true, nil
		}
		seq = m.Sequence + 1
	}
	return false, nil
}

// PublishTrainingEvent reports an event on trace.training.events.<job_id>
// (the simulated trainer, tests); it is validated before it goes out.
func (b *Bus) PublishTrainingEvent(ctx context.Context, e *schemas.TrainingEvent) error {
	return b.PublishTrainingEventID(ctx, e, "")
}

// PublishTrainingEventID is PublishTrainingEvent with msgID as Msg-Id
// (none when empty): publishing it again within the duplicate window, from
// any replica, adds nothing. The adapt role's deadline check publishes a
// job's failure so.
func (b *Bus) PublishTrainingEventID(ctx context.Context, e *schemas.TrainingEvent, msgID string) error {
	data, err := e.Encode()
	if err != nil {
		return err
	}
	return b.RelayTrainingEvent(ctx, e.JobID, data, msgID)
}

// RelayTrainingEvent publishes an event as it is (an event received over
// the webhook backend's callback endpoint or a command's output, which may
// be malformed) on the job's subject trace.training.events.<job_id> (no
// new subject: the adapt role consumes it as any trainer's event, and
// records a malformed one as such). msgID, when set, is the JetStream
// Msg-Id, so a POST retried within the duplicate window is stored once.
func (b *Bus) RelayTrainingEvent(ctx context.Context, jobID string, data []byte, msgID string) error {
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	if _, err := b.JS.Publish(ctx, schemas.TrainingEventsSubject(jobID), data, opts...); err != nil {
		return fmt.Errorf("nats: publish training event: %w", err)
	}
	return nil
}

// Claims of training jobs (trace_training_claims): a job's claim holds
// its dispatcher's bound (until: the deadline of the dispatch's context,
// else DefaultClaimBound from the claim) and, once the backend took the
// job, when it did (dispatched_at). A claim past its bound by ClaimSlack
// and never marked dispatched is its dispatcher's that died (kill -9, OOM,
// SIGKILL after the grace period) or could not release it (NATS away):
// the next claimer takes it over, so the job is dispatched rather than
// lost. A claim without a bound (written before bounds were kept) counts
// as dispatched.
const (
	DefaultClaimBound = 10 * time.Minute
	ClaimSlack        = 10 * time.Second
)

// trainingClaim is the value of a job's claim.
type trainingClaim struct {
	ClaimedAt    time.Time  `json:"claimed_at"`
	Until        *time.Time `json:"until,omitempty"`
	DispatchedAt *time.Time `json:"dispatched_at,omitempty"`
}

// ClaimTrainingJob claims a job id in trace_training_claims (atomic across
// replicas, durable across restarts) until ctx's deadline (else
// DefaultClaimBound). rev is the claim's revision when this caller holds
// it now: the first caller, or one that took over a claim past its bound
// (+ ClaimSlack) whose job was never marked dispatched. Otherwise rev is 0
// and heldUntil is zero when the job was dispatched, or the bound of the
// claimer that may still be dispatching it.
func (b *Bus) ClaimTrainingJob(ctx context.Context, jobID string) (rev uint64, heldUntil time.Time, err error) {
	key := Token(jobID)
	now := time.Now().UTC()
	until, ok := ctx.Deadline()
	if !ok {
		until = now.Add(DefaultClaimBound)
	}
	until = until.UTC()
	v, _ := json.Marshal(trainingClaim{ClaimedAt: now, Until: &until})
	for range 3 {
		rev, err := b.trainingClaims.Create(ctx, key, v)
		if err == nil {
			return rev, time.Time{}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return 0, time.Time{}, fmt.Errorf("nats: claim training job: %w", err)
		}
		e, err := b.trainingClaims.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // released meanwhile
		}
		if err != nil {
			return 0, time.Time{}, fmt.Errorf("nats: claim training job: %w", err)
		}
		var c trainingClaim
		if json.Unmarshal(e.Value(), &c) != nil || c.Until == nil || c.DispatchedAt != nil {
			return 0, time.Time{}, nil
		}
		if time.Now().Before(c.Until.Add(ClaimSlack)) {
			return 0, *c.Until, nil
		}
		rev, err = b.trainingClaims.Update(ctx, key, v, e.Revision())
		if err == nil {
			return rev, time.Time{}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
			return 0, time.Time{}, fmt.Errorf("nats: take over the claim of training job: %w", err)
		}
		// Another claimer took it over first.
	}
	return 0, until, nil
}

// DispatchedTrainingJob marks a job's claim dispatched: its backend has
// it, and no claimer takes the claim over.
func (b *Bus) DispatchedTrainingJob(ctx context.Context, jobID string) error {
	now := time.Now().UTC()
	v, _ := json.Marshal(trainingClaim{ClaimedAt: now, DispatchedAt: &now})
	if _, err := b.trainingClaims.Put(ctx, Token(jobID), v); err != nil {
		return fmt.Errorf("nats: mark training job dispatched: %w", err)
	}
	return nil
}

// ReleaseTrainingJob drops the claim at revision rev (the dispatch failed
// and will be retried); a claim another claimer took over since is left.
func (b *Bus) ReleaseTrainingJob(ctx context.Context, jobID string, rev uint64) error {
	if err := b.trainingClaims.Delete(ctx, Token(jobID), jetstream.LastRevision(rev)); err != nil {
		return fmt.Errorf("nats: release training job: %w", err)
	}
	return nil
}
