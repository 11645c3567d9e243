package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/traceops/trace/adapter/plan"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// Store keeps jobs, their history and the adapter registry (sink.Store).
type Store interface {
	SaveTrainingJob(ctx context.Context, r sink.TrainingJobRow) error
	TrainingJob(ctx context.Context, id string) (*sink.TrainingJobRow, error)
	OverdueTrainingJobs(ctx context.Context, now time.Time) ([]sink.TrainingJobRow, error)
	InsertTrainingEvents(ctx context.Context, evs []sink.TrainingEventRow) error
	SaveAdapter(ctx context.Context, r sink.AdapterRow) error
	Adapter(ctx context.Context, name string) (*sink.AdapterRow, error)
}

// Claims makes a job id's dispatch happen once (internal/bus: a KV bucket).
// ClaimTrainingJob holds the claim until ctx's deadline and returns its
// revision to the first caller, across replicas and restarts, and to one
// that finds a claim past its bound whose job was never marked
// dispatched (its dispatcher died, or could not release it); else rev 0,
// with heldUntil the bound of a claimer that may still be dispatching, or
// zero when the job was dispatched. DispatchedTrainingJob marks the
// backend's acceptance; ReleaseTrainingJob undoes a claim whose dispatch
// failed.
type Claims interface {
	ClaimTrainingJob(ctx context.Context, jobID string) (rev uint64, heldUntil time.Time, err error)
	DispatchedTrainingJob(ctx context.Context, jobID string) error
	ReleaseTrainingJob(ctx context.Context, jobID string, rev uint64) error
}

// ErrBeingDispatched: another dispatcher holds the job's claim within its
// bound; the ready message is retried, and finds the job dispatched, or
// the claim past its bound and taken over.
var ErrBeingDispatched = errors.New("being dispatched by another replica")

// Backend hands a job to trainers. Dispatch returns once the job is
// durably handed over (nats: in the stream; command: started; webhook:
// accepted); an error means it was not, and the dispatch is retried.
// Backends whose trainers report through another channel than the events
// subject relay the reports to it (the events consumer applies them in
// order); Stage.HandleEvent is for what they decide themselves.
type Backend interface {
	Name() string
	Dispatch(ctx context.Context, job *schemas.TrainingJob, spec []byte) error
}

// Withdrawer is a Backend whose jobs wait in a queue until a trainer takes
// them (nats): a job that fails before any trainer reported on it (its
// deadline passed while it waited) is withdrawn from the queue, so that a
// trainer started later does not train, for hours, a job whose success
// trace would ignore. Trainers ack a job when it ends, so a job still in
// the queue may also be held by a trainer whose events have not come
// through (NATS unreachable): withdrawing it does not stop that trainer.
type Withdrawer interface {
	Withdraw(ctx context.Context, jobID string) (bool, error)
}

// Planner is the optional planning agent: it may adjust a plan within the
// bounds (the adjusted plan is validated; out of bounds is an error naming
// the field) and gives its reason. A nil adjustment keeps the plan. An
// error is the agent's failure (no valid answer), except a *RejectedError:
// an answer that was valid but out of bounds. Either way the plan stands.
type Planner interface {
	Adjust(ctx context.Context, r *schemas.EnvironmentReady, job *schemas.TrainingJob) (adj *plan.Settings, reason, model string, err error)
}

// RejectedError is a planning agent's answer whose settings are out of
// bounds: Fields names them, Err says why.
type RejectedError struct {
	Fields []string
	Err    error
}

func (e *RejectedError) Error() string { return e.Err.Error() }
func (e *RejectedError) Unwrap() error { return e.Err }

// Config assembles a Stage. Plan, Store, Claims are required; Backend nil
// records jobs as PLANNED without dispatching them.
type Config struct {
	Plan      plan.Config
	Store     Store
	Claims    Claims
	Backend   Backend
	Planner   Planner // nil: the configured plan stands
	Simulated bool    // jobs go to the simulated trainer (trace demo)
	// AutoActivate makes a succeeded job's adapter active through
	// Registry (loaded into the serving engine, the previous active one of
	// its environment and capability retired), as a request on Queue that
	// RunActivations takes. Off: adapters stay candidates until `trace
	// adapters activate`.
	AutoActivate bool
	Registry     *Registry
	// Queue puts the stage's own work on JetStream (internal/bus);
	// required with AutoActivate, and by CheckDeadlines; RunEvents fails
	// the job of a rejected terminal event through it (without one, that
	// job ends at its deadline).
	Queue Queue
	Now   func() time.Time
	Log   *slog.Logger
}

// Queue is where the stage puts work it must not do beside the ordered
// events (internal/bus.Bus): JetStream keeps one message per Msg-Id
// within the duplicate window.
type Queue interface {
	// PublishActivation requests an adapter's activation
	// (trace.adapters.activate, consumed by RunActivations).
	PublishActivation(ctx context.Context, payload []byte, msgID string) error
	// PublishTrainingEventID publishes an event trace makes on its job's
	// events subject (consumed by RunEvents, in order with the trainer's).
	PublishTrainingEventID(ctx context.Context, e *schemas.TrainingEvent, msgID string) error
}

// Stage is the adapt role's logic. Safe for concurrent use: event handling
// is serialised within the stage (it reads a job and writes its next
// version); across replicas, the events consumer hands out one event at a
// time, and the deadline check writes nothing itself.
type Stage struct {
	cfg Config
	mu  sync.Mutex
	// retryDelay replaces RetryDelay (tests).
	retryDelay func(deliveries uint64) time.Duration
}

// NewStage checks cfg.
func NewStage(cfg Config) (*Stage, error) {
	if cfg.Store == nil || cfg.Claims == nil {
		return nil, errors.New("adapter: Store and Claims are required")
	}
	if err := cfg.Plan.Validate("adapter.plan."); err != nil {
		return nil, err
	}
	if cfg.AutoActivate && (cfg.Registry == nil || cfg.Queue == nil) {
		return nil, errors.New("adapter: AutoActivate needs a Registry and a Queue")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Stage{cfg: cfg}, nil
}

// Result says what HandleReady did.
type Result struct {
	JobID      string
	Dispatched bool // handed to the backend now
	Duplicate  bool // the job existed already: nothing done
	Planned    bool // recorded only (no backend)
}

// Plan builds the job of a ready environment at a revision, with the
// planning agent's adjustment when one is configured. The agent's outcome
// is recorded in the job's planner record (schemas.PlannerRecord): an
// adjustment in bounds is applied with its reason; one out of bounds is
// rejected with the fields it broke, and a failed agent is recorded with
// its error — in both cases the configured plan stands.
func (s *Stage) Plan(ctx context.Context, r *schemas.EnvironmentReady, revision int) (*schemas.TrainingJob, error) {
	return PlanJob(ctx, s.cfg.Plan, s.cfg.Planner, plan.Input{Ready: r, Revision: revision, Simulated: s.cfg.Simulated, Now: s.cfg.Now()}, s.cfg.Log)
}

// PlanJob is Stage.Plan without a stage (trace train plan): the job pc
// builds from in, adjusted by planner when it is not nil.
func PlanJob(ctx context.Context, pc plan.Config, planner Planner, in plan.Input, log *slog.Logger) (*schemas.TrainingJob, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := in.Ready
	job, err := pc.Build(in)
	if err != nil {
		return nil, err
	}
	if planner == nil {
		return job, nil
	}
	// The agent gets half of what is left of ctx: past it the configured
	// plan stands. With all of it, an agent slower than the handling's
	// bound took the handling down with it, at every delivery, and the
	// environment never got a job.
	pctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		pctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
		defer cancel()
	}
	adj, reason, model, err := planner.Adjust(pctx, r, job)
	job.Planner.Model, job.Planner.Reason = model, reason
	reject := func(err error, fields []string) (*schemas.TrainingJob, error) {
		log.Warn("adapter: the planning agent's plan is out of bounds; the configured plan stands", "job", job.JobID, "fields", fields, "err", err)
		job.Planner.Agent, job.Planner.Error, job.Planner.RejectedFields = schemas.AgentRejected, err.Error(), fields
		return job, nil
	}
	var rej *RejectedError
	switch {
	case errors.As(err, &rej):
		return reject(rej.Err, rej.Fields)
	case err != nil:
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		log.Warn("adapter: planning agent failed; the configured plan stands", "job", job.JobID, "err", err)
		job.Planner.Agent, job.Planner.Error = schemas.AgentFailed, err.Error()
		return job, nil
	case adj == nil:
		job.Planner.Agent = schemas.AgentUnchanged
		return job, nil
	}
	in.Adjust, in.Source, in.Model, in.Reason = adj, schemas.PlanAgent, model, reason
	adjusted, err := pc.Build(in)
	if err != nil {
		return reject(err, plan.ErrorFields(err))
	}
	adjusted.Planner.Agent = schemas.AgentAccepted
	log.Info("adapter: the planning agent adjusted the plan", "job", job.JobID, "overrides", adjusted.Planner.Overrides, "reason", reason)
	return adjusted, nil
}

// HandleReady plans and dispatches the job of a ready environment at plan
// revision 1; see DispatchReady.
func (s *Stage) HandleReady(ctx context.Context, r *schemas.EnvironmentReady) (Result, error) {
	res, _, err := s.DispatchReady(ctx, r, 1)
	return res, err
}

// DispatchReady plans and dispatches the job of a ready environment at a
// revision (see Dispatch). A job already recorded is a duplicate before
// anything is planned, so a redelivered ready event costs no planning
// agent call; the job is nil then.
func (s *Stage) DispatchReady(ctx context.Context, r *schemas.EnvironmentReady, revision int) (Result, *schemas.TrainingJob, error) {
	id := schemas.TrainingJobID(r.EnvironmentID, max(revision, 1))
	if prev, err := s.cfg.Store.TrainingJob(ctx, id); err != nil {
		return Result{JobID: id}, nil, err
	} else if prev != nil && prev.Status != StatusDispatched {
		return Result{JobID: id, Duplicate: true}, nil, nil
	} else if prev != nil {
		// DISPATCHED: maybe a dispatch that failed and released its claim
		// (Dispatch decides); its recorded plan is dispatched again, without
		// planning anew.
		job, err := schemas.DecodeTrainingJob([]byte(prev.Spec))
		if err != nil {
			return Result{JobID: id}, nil, fmt.Errorf("job %s: recorded spec: %w", id, err)
		}
		res, err := s.Dispatch(ctx, job)
		return res, job, err
	}
	job, err := s.Plan(ctx, r, revision)
	if err != nil {
		return Result{JobID: id}, nil, err
	}
	res, err := s.Dispatch(ctx, job)
	return res, job, err
}

// Dispatch records and dispatches a job once: a job already in
// training_jobs or whose claim is marked dispatched is a duplicate. A
// failed dispatch releases the claim and returns the error (the caller
// retries, and the retry finds the DISPATCHED row with a free claim: it
// dispatches again). A claim held by another dispatcher within its bound is
// ErrBeingDispatched (retried); past its bound, never marked dispatched
// (its dispatcher was killed, or could not release it), it is taken over
// and the job dispatched.
func (s *Stage) Dispatch(ctx context.Context, job *schemas.TrainingJob) (Result, error) {
	res := Result{JobID: job.JobID}
	spec, err := job.Encode()
	if err != nil {
		return res, err
	}
	// A DISPATCHED job whose claim is free again (released by a failed
	// dispatch) or past its bound unmarked (a dead dispatcher's) is
	// dispatched again. Every other recorded job is a duplicate.
	if prev, err := s.cfg.Store.TrainingJob(ctx, job.JobID); err != nil {
		return res, err
	} else if prev != nil && prev.Status != StatusDispatched {
		res.Duplicate = true
		return res, nil
	}
	rev, heldUntil, err := s.cfg.Claims.ClaimTrainingJob(ctx, job.JobID)
	if err != nil {
		return res, err
	}
	if rev == 0 && heldUntil.IsZero() {
		res.Duplicate = true
		return res, nil
	}
	if rev == 0 {
		// Not a duplicate yet: its claimer may be dead. Acked as one, the
		// job was never handed to a trainer.
		return res, fmt.Errorf("job %s: %w (its claim holds until %s, then is taken over if the job is not dispatched)", job.JobID,
			ErrBeingDispatched, heldUntil.UTC().Format(time.RFC3339))
	}
	now := s.cfg.Now().UTC()
	row := jobRow(job, spec, now)
	row.Status, row.Backend = StatusPlanned, "none"
	if s.cfg.Backend != nil {
		row.Status, row.Backend = StatusDispatched, s.cfg.Backend.Name()
	}
	release := func(err error) (Result, error) {
		if rerr := s.cfg.Claims.ReleaseTrainingJob(context.WithoutCancel(ctx), job.JobID, rev); rerr != nil {
			s.cfg.Log.Warn("adapter: release claim", "job", job.JobID, "err", rerr)
		}
		return res, err
	}
	if err := s.cfg.Store.SaveTrainingJob(ctx, row); err != nil {
		return release(err)
	}
	if s.cfg.Backend == nil {
		res.Planned = true
		s.markDispatched(ctx, job.JobID)
		return res, nil
	}
	payload, _ := json.Marshal(map[string]any{"backend": s.cfg.Backend.Name(), "planner": job.Planner})
	if err := s.cfg.Store.InsertTrainingEvents(ctx, []sink.TrainingEventRow{{JobID: job.JobID, Key: "trace:dispatched", Type: "dispatched",
		At: now, Iteration: -1, Payload: string(payload), ReceivedAt: now}}); err != nil {
		return release(err)
	}
	if err := s.cfg.Backend.Dispatch(ctx, job, spec); err != nil {
		return release(fmt.Errorf("dispatch %s (%s): %w", job.JobID, s.cfg.Backend.Name(), err))
	}
	res.Dispatched = true
	s.markDispatched(ctx, job.JobID)
	s.cfg.Log.Info("training job dispatched", "job", job.JobID, "environment_id", job.EnvironmentID, "capability", job.Capability.Name,
		"backend", s.cfg.Backend.Name(), "adapter", job.Output.AdapterName, "planner", job.Planner.Source)
	return res, nil
}

// markDispatched marks a job's claim dispatched, so that no claimer takes
// it over past its bound. A failure is logged: the ready message is acked
// all the same, and only its redelivery (the ack lost too) past the
// claim's bound would dispatch the job again.
func (s *Stage) markDispatched(ctx context.Context, jobID string) {
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.cfg.Claims.DispatchedTrainingJob(mctx, jobID); err != nil {
		s.cfg.Log.Warn("adapter: the job was dispatched but its claim could not be marked so", "job", jobID, "err", err)
	}
}

func jobRow(job *schemas.TrainingJob, spec []byte, now time.Time) sink.TrainingJobRow {
	planner, _ := json.Marshal(job.Planner)
	return sink.TrainingJobRow{JobID: job.JobID, EnvironmentID: job.EnvironmentID, PlanRevision: uint32(job.PlanRevision),
		Environment: job.Environment, AgentVersion: job.AgentVersion, Capability: job.Capability.Name, BaseModel: job.BaseModel,
		AdapterName: job.Output.AdapterName, Iterations: uint32(job.GRPO.Iterations), Simulated: job.Simulated,
		Planner: string(planner), Spec: string(spec), DispatchedAt: now, LastEventAt: now,
		DeadlineAt: now.Add(time.Duration(job.Report.DeadlineSeconds) * time.Second),
		CreatedAt:  job.CreatedAt, UpdatedAt: now, Version: uint64(now.UnixNano())}
}

// JobStatus is a job's status ("" for an unknown job): the command backend
// stops the command of a job that failed meanwhile (dispatch.JobStatusReader).
func (s *Stage) JobStatus(ctx context.Context, jobID string) (string, error) {
	j, err := s.cfg.Store.TrainingJob(ctx, jobID)
	if err != nil || j == nil {
		return "", err
	}
	return j.Status, nil
}

// ErrUnknownJob: an event names a job trace has no record of (yet).
var ErrUnknownJob = errors.New("unknown training job")

// HandleEvent records a trainer's event and applies it to its job: status,
// last event, deadline, progress; a success registers the adapter (as
// candidate) before the job is saved SUCCEEDED, so a crash in between is
// repaired by the redelivery; a success naming an adapter another job
// registered fails the job instead. key identifies the event within its
// job (a redelivery has the same key). An event of an unknown job returns
// ErrUnknownJob after recording it.
//
// With AutoActivate, the activation of the adapter of a job that succeeded
// now is requested on the Queue (Msg-Id activate:<job_id>) before
// HandleEvent returns, and done by RunActivations, outside the ordered
// events: a load that takes minutes holds up no other event. A success
// delivered again to a job already SUCCEEDED with its adapter requests it
// again (the request may not have been published before a crash; the
// duplicate window makes it a no-op otherwise, and an adapter active
// already is only loaded again, the engine's no-op). A failure to publish is the event's error: it is redelivered.
func (s *Stage) HandleEvent(ctx context.Context, e *schemas.TrainingEvent, key string, payload []byte) error {
	name, err := s.handleEvent(ctx, e, key, payload, nil)
	if err != nil || name == "" || !s.cfg.AutoActivate {
		return err
	}
	if err := s.requestActivation(ctx, e.JobID, name); err != nil {
		return &activationRequestError{adapter: name, err: err}
	}
	return nil
}

// activationRequestError: the event was applied, but the activation of
// the adapter it registered could not be requested.
type activationRequestError struct {
	adapter string
	err     error
}

func (e *activationRequestError) Error() string {
	return "requesting the activation of adapter " + e.adapter + ": " + e.err.Error()
}
func (e *activationRequestError) Unwrap() error { return e.err }

// ownFailure marks a failed event trace published on a job's subject
// itself (eventOf: by its Msg-Id): the failure of a job silent past a
// deadline (CheckDeadlines), or of a job whose terminal event was rejected
// (deadline nil; RunEvents).
type ownFailure struct {
	deadline *time.Time
}

// handleEvent is HandleEvent under the lock; it returns the name of the
// adapter registered now, or registered by this job before when e is its
// success delivered again ("" for none). own, when not nil, makes e a
// failure of trace's (ownFailure): it is applied, and recorded, only while
// the job is open (and, for a deadline's, with that deadline still: no
// event moved it since the check), and it leaves the job's last event as
// it was.
func (s *Stage) handleEvent(ctx context.Context, e *schemas.TrainingEvent, key string, payload []byte, own *ownFailure) (string, error) {
	name, withdraw, err := s.applyEvent(ctx, e, key, payload, own)
	if withdraw {
		s.withdraw(ctx, e.JobID) // outside the lock: it reads the queue
	}
	return name, err
}

// withdraw removes a job that failed while DISPATCHED (no trainer had
// reported on it) from the trainers' queue when the backend has one
// (Withdrawer), so that a trainer started later does not train it. Best
// effort: a trainer that holds it already (taken, no event through yet)
// trains on and reports into a FAILED job.
func (s *Stage) withdraw(ctx context.Context, jobID string) {
	w, ok := s.cfg.Backend.(Withdrawer)
	if !ok {
		return
	}
	if gone, err := w.Withdraw(ctx, jobID); err != nil {
		s.cfg.Log.Warn("adapter: withdraw a failed job from the trainers' queue", "job", jobID, "err", err)
	} else if gone {
		s.cfg.Log.Info("adapter: a job that failed before any trainer reported on it was withdrawn from the trainers' queue", "job", jobID)
	}
}

// applyEvent is handleEvent under the lock; withdraw reports that the job
// failed while DISPATCHED.
func (s *Stage) applyEvent(ctx context.Context, e *schemas.TrainingEvent, key string, payload []byte, own *ownFailure) (string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now().UTC()
	job, err := s.cfg.Store.TrainingJob(ctx, e.JobID)
	if err != nil {
		return "", false, err
	}
	if own != nil && own.deadline != nil && (job == nil || Terminal(job.Status) || job.DeadlineAt.Unix() != own.deadline.Unix()) {
		s.cfg.Log.Info("adapter: deadline no longer applies (the job ended, or reported, since it was checked)", "job", e.JobID,
			"deadline", own.deadline.UTC())
		return "", false, nil
	}
	if own != nil && (job == nil || Terminal(job.Status)) {
		s.cfg.Log.Info("adapter: the failure of a rejected terminal event no longer applies (the job ended)", "job", e.JobID)
		return "", false, nil
	}
	row := eventRow(e, key, payload, now)
	if err := s.cfg.Store.InsertTrainingEvents(ctx, []sink.TrainingEventRow{row}); err != nil {
		return "", false, err
	}
	if job == nil {
		return "", false, fmt.Errorf("%w: %s", ErrUnknownJob, e.JobID)
	}
	tr := Apply(job.Status, e)
	if tr.Ignored {
		if Terminal(job.Status) {
			s.cfg.Log.Info("adapter: event after the job ended (recorded, status unchanged)", "job", e.JobID, "status", job.Status, "event", e.Type)
		}
		if s.cfg.AutoActivate && job.Status == StatusSucceeded && e.Type == schemas.EventSucceeded {
			name := registeredName(job, e)
			if a, err := s.cfg.Store.Adapter(ctx, name); err != nil {
				return "", false, err
			} else if a != nil && a.JobID == job.JobID {
				return name, false, nil
			}
		}
		return "", false, nil
	}
	registered := ""
	if tr.Register {
		conflict, err := s.register(ctx, job, e, now)
		if err != nil {
			return "", false, err
		}
		if conflict != "" {
			s.cfg.Log.Warn("adapter: a success names another job's adapter; the job fails", "job", e.JobID, "reason", conflict)
			tr = Transition{Status: StatusFailed, Reason: conflict}
		} else {
			registered = registeredName(job, e)
		}
	}
	next := *job
	next.Status, next.Reason, next.UpdatedAt = tr.Status, tr.Reason, now
	if own == nil {
		next.LastEventAt = now
		var spec schemas.TrainingJob
		_ = json.Unmarshal([]byte(job.Spec), &spec)
		next.DeadlineAt = now.Add(time.Duration(max(spec.Report.DeadlineSeconds, 1)) * time.Second)
	}
	// A started event begins a run: on a job already RUNNING it is a
	// second worker's (the nats backend redelivers a job whose worker died
	// without acking it), which trains from the start; the job's
	// iteration and mean reward are that run's from now on, not the dead
	// one's.
	if e.Type == schemas.EventStarted && job.Status == StatusRunning {
		next.Iteration, next.MeanReward = 0, 0
		s.cfg.Log.Info("adapter: training job started again (another worker took it over)", "job", e.JobID, "worker", e.Worker)
	}
	// Progress of an earlier iteration than the job's (a redelivery that
	// comes back behind the events after it) is history only: the job
	// keeps its newest iteration and mean reward.
	late := e.Iteration != nil && uint32(max(*e.Iteration, 0)) < next.Iteration
	if e.Iteration != nil && !late {
		next.Iteration = uint32(max(*e.Iteration, 0))
	}
	if e.MeanReward != nil && !late {
		next.MeanReward = *e.MeanReward
	}
	if e.Simulated {
		next.Simulated = true
	}
	next.Version = max(job.Version+1, uint64(now.UnixNano()))
	if err := s.cfg.Store.SaveTrainingJob(ctx, next); err != nil {
		return "", false, err
	}
	switch {
	case own != nil && own.deadline != nil:
		s.cfg.Log.Warn("training job failed: silent past its deadline", "job", e.JobID, "last_event", job.LastEventAt, "deadline", job.DeadlineAt)
	case own != nil:
		s.cfg.Log.Warn("training job failed: its terminal event was rejected", "job", e.JobID, "reason", truncate(tr.Reason, 2048))
	case tr.Status != job.Status:
		s.cfg.Log.Info("training job status", "job", e.JobID, "from", job.Status, "to", tr.Status, "reason", tr.Reason)
	}
	return registered, job.Status == StatusDispatched && tr.Status == StatusFailed, nil
}

// registeredName is the name a succeeded job's adapter is registered
// under: the trainer's, else the plan's.
func registeredName(job *sink.TrainingJobRow, e *schemas.TrainingEvent) string {
	if e.Adapter != nil && e.Adapter.Name != "" {
		return e.Adapter.Name
	}
	return job.AdapterName
}

func eventRow(e *schemas.TrainingEvent, key string, payload []byte, now time.Time) sink.TrainingEventRow {
	r := sink.TrainingEventRow{JobID: e.JobID, Key: key, Type: e.Type, At: e.At, Iteration: -1, Payload: string(payload), ReceivedAt: now}
	if e.Iteration != nil {
		r.Iteration = int32(*e.Iteration)
	}
	if e.MeanReward != nil {
		r.MeanReward = *e.MeanReward
	}
	if e.RewardStd != nil {
		r.RewardStd = *e.RewardStd
	}
	if e.KL != nil {
		r.KL, r.HasKL = *e.KL, true
	}
	return r
}

// register saves a succeeded job's adapter as a candidate, unless it is
// registered already (a redelivered success must not reset an adapter an
// operator activated since). A name registered by another job is not
// taken over: conflict says so, and the job fails with it.
func (s *Stage) register(ctx context.Context, job *sink.TrainingJobRow, e *schemas.TrainingEvent, now time.Time) (conflict string, err error) {
	name := registeredName(job, e)
	if prev, err := s.cfg.Store.Adapter(ctx, name); err != nil {
		return "", err
	} else if prev != nil && prev.JobID != job.JobID {
		return fmt.Sprintf("the trainer reported adapter %q, which is registered to job %s: not registered (write each job's adapter under its output.adapter_name, %s)",
			name, prev.JobID, job.AdapterName), nil
	} else if prev != nil {
		return "", nil
	}
	eval, _ := json.Marshal(e.Eval)
	trainer := "external"
	if job.Simulated || e.Simulated {
		trainer = "simulated (no model was trained)"
	}
	meta, _ := json.Marshal(map[string]any{"trainer": trainer, "simulated": job.Simulated || e.Simulated, "worker": e.Worker,
		"plan_revision": job.PlanRevision, "backend": job.Backend})
	r := sink.AdapterRow{Name: name, JobID: job.JobID, EnvironmentID: job.EnvironmentID, Capability: job.Capability,
		Environment: job.Environment, AgentVersion: job.AgentVersion, BaseModel: job.BaseModel, URI: e.Adapter.URI,
		Eval: string(eval), Status: AdapterCandidate, Simulated: job.Simulated || e.Simulated, Metadata: string(meta),
		CreatedAt: now, UpdatedAt: now, Version: uint64(now.UnixNano())}
	if e.Eval != nil {
		r.EvalMeanReward, r.EvalSuccessRate = e.Eval.MeanReward, e.Eval.SuccessRate
	}
	if err := s.cfg.Store.SaveAdapter(ctx, r); err != nil {
		return "", err
	}
	s.cfg.Log.Info("adapter registered", "adapter", name, "job", job.JobID, "uri", r.URI, "eval_mean_reward", r.EvalMeanReward, "simulated", r.Simulated)
	return "", nil
}

// Adapter statuses in the registry.
const (
	AdapterCandidate  = "candidate"
	AdapterActive     = "active"
	AdapterRetired    = "retired"
	AdapterRolledBack = "rolled_back"
)

// CheckDeadlines finds every open job with no event within its deadline
// and publishes its failure as a `failed` event (worker "trace deadline")
// on the job's events subject, with Msg-Id DeadlineMsgID: the events
// consumer applies it in order with the trainer's events, only if the job
// is still open with that deadline (a success or a heartbeat received
// before it wins), and every replica that checks at once publishes one
// message. It returns how many jobs it found overdue. (It wrote the failure
// to the job's row itself at first, on every replica, beside the events
// consumer: a success applied on another replica meanwhile could be
// written over with FAILED.)
func (s *Stage) CheckDeadlines(ctx context.Context) (int, error) {
	if s.cfg.Queue == nil {
		return 0, errors.New("adapter: the deadline check needs a Queue")
	}
	now := s.cfg.Now().UTC()
	over, err := s.cfg.Store.OverdueTrainingJobs(ctx, now)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, j := range over {
		reason := fmt.Sprintf("deadline: no event from the trainer since %s (deadline %s)", j.LastEventAt.Format(time.RFC3339), j.DeadlineAt.Format(time.RFC3339))
		if j.Status == StatusDispatched {
			reason += "; no trainer ever reported on it"
			if j.Backend == "nats" {
				reason += " (is a trainer worker taking jobs from trace.training.jobs? e.g. python -m trace_trainer --nats URL)"
			}
		}
		e := &schemas.TrainingEvent{JobID: j.JobID, Type: schemas.EventFailed, At: now, Worker: DeadlineWorker, Reason: reason}
		if err := s.cfg.Queue.PublishTrainingEventID(ctx, e, DeadlineMsgID(j.JobID, j.DeadlineAt)); err != nil {
			return n, err
		}
		s.cfg.Log.Debug("adapter: deadline passed, failure published", "job", j.JobID, "deadline", j.DeadlineAt)
		n++
	}
	return n, nil
}

// DeadlineWorker is the worker of the failed events CheckDeadlines makes.
const DeadlineWorker = "trace deadline"

// DeadlineMsgID is the Msg-Id of the failure of a job silent past a
// deadline: deadline:<job_id>:<deadline, Unix seconds>, the same for every
// replica that finds it (deadlines are stored to the second).
func DeadlineMsgID(jobID string, deadline time.Time) string {
	return deadlinePrefix + jobID + ":" + strconv.FormatInt(deadline.Unix(), 10)
}

const deadlinePrefix = "deadline:"

// deadlineOf is the job and deadline a deadline event's Msg-Id names; ok
// false for any other Msg-Id.
func deadlineOf(msgID string) (jobID string, deadline time.Time, ok bool) {
	rest, ok := strings.CutPrefix(msgID, deadlinePrefix)
	if !ok {
		return "", time.Time{}, false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return "", time.Time{}, false
	}
	sec, err := strconv.ParseInt(rest[i+1:], 10, 64)
	if err != nil {
		return "", time.Time{}, false
	}
	return rest[:i], time.Unix(sec, 0).UTC(), true
}
