package synthesizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/traceops/trace/schemas"
)

// The stage's collaborators, defined here where they are consumed; the
// adapters live with what they adapt (sink, internal/bus, envprog,
// synthesizer/calibrate, synthesizer/templates).

// Validator runs the validation checks on a program against the target's
// tools. A program that fails to load or a check that fails is a Validation
// with OK false; an error means the checks could not run (transient).
type Validator interface {
	Validate(ctx context.Context, d Draft, target []schemas.Tool) (*Validation, error)
}

// Calibrator plays a valid program with a policy and judges the rewards
// against the bands. An error means calibration could not run (the policy
// server is unreachable): transient. progress, when not nil, is called with
// the rollouts played of all after each finished rollout, never
// concurrently; it must not block.
type Calibrator interface {
	Calibrate(ctx context.Context, d Draft, progress func(done, total int)) (*Calibration, error)
}

// CalibratorFor returns the calibrator of a job: its policy is the
// cohort's agent model (configured per environment and agent version), or
// the simulated policy of that cohort in the demo and in tests.
type CalibratorFor func(job *Job) (Calibrator, error)

// Store keeps environment records. SaveEnvironment stores a new version of
// the record (e.Version orders them); LoadEnvironment returns the latest,
// or nil and no error when there is none.
type Store interface {
	SaveEnvironment(ctx context.Context, e *Environment) error
	LoadEnvironment(ctx context.Context, id string) (*Environment, error)
}

// ReadyPublisher announces a DONE environment on trace.environments.ready,
// at most once per environment id (the Msg-Id).
type ReadyPublisher interface {
	PublishEnvironmentReady(ctx context.Context, m *schemas.EnvironmentReady) error
}

// ExampleSource reads a cohort's rollouts by id (compacted, as stored).
type ExampleSource interface {
	ExampleRollouts(ctx context.Context, environment, agentVersion string, ids []string) ([]*schemas.Rollout, error)
}

// CapabilityInfo is what the dictionary says about a capability.
type CapabilityInfo struct {
	Definition string
	Family     string // "" when the dictionary names none
}

// Dictionaries resolves a request's capability in its dictionary version.
type Dictionaries interface {
	Capability(environment, agentVersion string, version uint32, name string) (CapabilityInfo, bool)
}

// FamilyMatcher knows the template families.
type FamilyMatcher interface {
	// Match returns the family whose templates practise a capability of
	// this name and definition, and false when none does; why explains the
	// match (or its absence) for the record.
	Match(name, definition string) (family, why string, ok bool)
	// Known reports whether family has a template.
	Known(family string) bool
}

// Config assembles a Stage. Validator, Calibrators and Store are required.
type Config struct {
	// MaxAttempts bounds the programs per environment and path, 1 to 5.
	// Default 5.
	MaxAttempts int
	// LLM is the generation agent; nil when no model is configured.
	LLM Author
	// Templates instantiates and tunes the built-in templates; Families
	// matches capabilities to them. Nil: no template path.
	Templates Author
	Families  FamilyMatcher
	// Dictionaries resolves definitions and families; nil uses the request's
	// description and matches the family.
	Dictionaries Dictionaries
	Validator    Validator
	Calibrators  CalibratorFor
	Store        Store
	Publisher    ReadyPublisher // nil: DONE is only recorded
	Examples     ExampleSource  // nil: prompts carry no example rollouts
	Now          func() time.Time
	Log          *slog.Logger
	// ProgressEvery is how often a running calibration's progress is saved
	// in the record (Environment.Progress) and logged, at most. Default
	// DefaultProgressEvery.
	ProgressEvery time.Duration
}

// Stage turns synthesis requests into environments. Safe for concurrent
// use on distinct requests; one environment must be worked on by one
// goroutine at a time (the worker's scheduler ensures it).
type Stage struct {
	cfg Config
}

// NewStage checks cfg.
func NewStage(cfg Config) (*Stage, error) {
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.MaxAttempts < 1 || cfg.MaxAttempts > DefaultMaxAttempts {
		return nil, fmt.Errorf("synthesizer: MaxAttempts must be 1 to %d, got %d", DefaultMaxAttempts, cfg.MaxAttempts)
	}
	if cfg.Validator == nil || cfg.Calibrators == nil || cfg.Store == nil {
		return nil, errors.New("synthesizer: Validator, Calibrators and Store are required")
	}
	if (cfg.Templates == nil) != (cfg.Families == nil) {
		return nil, errors.New("synthesizer: Templates and Families go together")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = DefaultProgressEvery
	}
	return &Stage{cfg: cfg}, nil
}

// HasLLM reports whether a generation model is configured.
func (s *Stage) HasLLM() bool { return s.cfg.LLM != nil }

// Synthesize runs one request to its end: DONE (published), FAILED or
// WAITING_FOR_LLM, recording every step. A request whose environment exists
// resumes it: a DONE one is announced again (the Msg-Id makes that a no-op
// when it was announced before) and a FAILED one is left alone, so a
// redelivered or duplicated request never makes a second environment. An
// error is transient (ClickHouse, NATS, the model or the policy server was
// unreachable): the record keeps where it stood and a redelivery resumes it.
func (s *Stage) Synthesize(ctx context.Context, req *schemas.SynthesisRequest) (*Environment, error) {
	e, err := s.synthesize(ctx, req)
	if !errors.Is(err, errEndedElsewhere) {
		return e, err
	}
	// Another run of the request ended its environment while this one
	// ran: a second replica was given the request when this one's acks
	// lapsed (a NATS outage longer than the ack wait). Its record stands,
	// and a DONE one is announced as it is stored, so the announced hash
	// is the stored program's.
	stored, err := s.load(ctx, req)
	if err != nil {
		return e, err
	}
	s.cfg.Log.Warn("synthesizer: another run of the request ended its environment meanwhile; keeping that one", "id", stored.ID,
		"trigger_id", req.TriggerID, "status", stored.Status)
	if stored.Status == StatusDone {
		return stored, s.publish(ctx, stored)
	}
	return stored, nil
}

func (s *Stage) synthesize(ctx context.Context, req *schemas.SynthesisRequest) (*Environment, error) {
	e, err := s.load(ctx, req)
	if err != nil {
		return nil, err
	}
	if e.Status == StatusDone {
		return e, s.publish(ctx, e)
	}
	if e.Status == StatusFailed {
		return e, nil
	}
	job, start, m, act, err := s.begin(ctx, e)
	if err != nil {
		return e, err
	}
	if stillWaiting(e, m) {
		return e, nil // still nothing to write or calibrate it with; the record stands
	}
	var (
		draft   Draft
		attempt Attempt
	)
	for {
		e.setMachine(m)
		switch act {
		case ActNone:
			return e, nil
		case ActWait, ActGiveUp:
			return e, s.save(ctx, e)
		case ActPublish:
			attempt.Accepted = true
			s.endAttempt(e, &attempt, StageCalibrate, "")
			e.Program, e.ProgramHash = draft.Program, ProgramHash(draft.Program)
			e.Calibration = attempt.Calibration
			if err := s.save(ctx, e); err != nil {
				return e, err
			}
			return e, s.publish(ctx, e)
		case ActWrite:
			if err := s.save(ctx, e); err != nil {
				return e, err
			}
			attempt = Attempt{N: m.Attempt, StartedAt: s.cfg.Now().UTC()}
			var ev Event
			draft, ev, err = s.write(ctx, job, e, m)
			attempt.Origin, attempt.Family, attempt.Model, attempt.Knobs, attempt.LLM = draft.Origin, draft.Family, draft.Model, draft.Knobs, draft.LLM
			if errors.Is(err, ErrModelRefusesTrace) {
				// As if no model were configured: a template, or wait with
				// the attempt kept.
				m, act, err = Step(m, Event{Kind: EvStart, Reason: "generation model: " + err.Error(),
					HaveTemplate: start.HaveTemplate, TemplateTried: start.TemplateTried})
				break
			}
			if err != nil {
				return e, err
			}
			if ev.Kind == EvWriteFailed {
				s.endAttempt(e, &attempt, StageGenerate, "generation: "+ev.Reason)
			} else {
				attempt.Program, attempt.ProgramHash = draft.Program, ProgramHash(draft.Program)
				e.Program, e.ProgramHash = draft.Program, attempt.ProgramHash
			}
			m, act, err = Step(m, ev)
		case ActValidate:
			if err := s.save(ctx, e); err != nil {
				return e, err
			}
			v, err := s.cfg.Validator.Validate(ctx, draft, req.Tools)
			if err != nil {
				return e, fmt.Errorf("%w: validate: %w", ErrTransient, err)
			}
			attempt.Validation = v
			e.Tools, e.Rationale = v.Tools, v.Rationale
			ev := Event{Kind: EvValid}
			if !v.OK {
				// A template that fails validation does not fit this target
				// (it lacks a tool the template needs): tuning cannot fix it.
				ev = Event{Kind: EvInvalid, Reason: v.Diagnosis(), Final: m.Path == PathTemplate}
				s.endAttempt(e, &attempt, StageValidate, "validation: "+ev.Reason)
			}
			m, act, err = Step(m, ev)
		case ActCalibrate:
			e.Progress = &CalibrationProgress{Path: m.Path, Attempt: m.Attempt, StartedAt: s.cfg.Now().UTC()}
			if err := s.save(ctx, e); err != nil {
				return e, err
			}
			cal, err := s.cfg.Calibrators(job)
			if err != nil {
				return e, fmt.Errorf("%w: calibrator for %s/%s: %w", ErrTransient, req.Environment, req.AgentVersion, err)
			}
			c, err := s.calibrate(ctx, cal, e, draft)
			if errors.Is(err, errEndedElsewhere) {
				return e, err
			}
			if RefusesTrace(err) {
				// No policy can play it until the configuration is fixed.
				m, act, err = Step(m, Event{Kind: EvStart, Reason: "calibration policy: " + ErrModelRefusesTrace.Error() + ": " + err.Error()})
				break
			}
			if err != nil {
				return e, fmt.Errorf("%w: calibrate: %w", ErrTransient, err)
			}
			attempt.Calibration = c
			ev := Event{Kind: EvAccepted}
			if !c.Accepted {
				ev = Event{Kind: EvRejected, Reason: calibrationDiagnosis(c)}
				s.endAttempt(e, &attempt, StageCalibrate, "calibration: "+ev.Reason)
			}
			m, act, err = Step(m, ev)
		}
		if err != nil {
			return e, err
		}
	}
}

// calibrate runs cal on draft and saves its progress in e.Progress (set
// by the caller) at most every ProgressEvery while it runs; e is not
// touched otherwise until it returns, and then holds the progress at the
// end for the next save. A save that finds the environment ended by
// another run stops the calibration with errEndedElsewhere; another failed
// save is logged and the calibration goes on (the next save retries).
func (s *Stage) calibrate(ctx context.Context, cal Calibrator, e *Environment, draft Draft) (*Calibration, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu          sync.Mutex
		done, total int
	)
	counted := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return done, total
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(s.cfg.ProgressEvery)
		defer t.Stop()
		saved := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			d, n := counted()
			if n == 0 || d == saved {
				continue
			}
			now := s.cfg.Now().UTC()
			if d < n { // a calibration by a model may take hours: the log shows it move
				elapsed := now.Sub(e.Progress.StartedAt)
				left := time.Duration(float64(elapsed) * float64(n-d) / float64(max(d, 1)))
				s.cfg.Log.Info("synthesizer: calibrating", "id", e.ID, "rollouts", fmt.Sprintf("%d/%d", d, n), "percent", 100*d/n,
					"elapsed", elapsed.Round(time.Second).String(), "estimated_left", left.Round(time.Second).String())
			}
			e.Progress.Done, e.Progress.Total, e.Progress.At = d, n, now
			err := s.save(ctx, e)
			if errors.Is(err, errEndedElsewhere) {
				cancel(err) // the calibration stops; the cause says why
				return
			}
			if err != nil {
				if ctx.Err() == nil {
					s.cfg.Log.Warn("synthesizer: saving the calibration's progress", "id", e.ID, "err", err)
				}
				continue
			}
			saved = d
		}
	})
	c, err := cal.Calibrate(ctx, draft, func(d, n int) {
		mu.Lock()
		done, total = d, n
		mu.Unlock()
	})
	cancel(nil) // stops the saver (a cause set before stays)
	wg.Wait()
	if errors.Is(context.Cause(ctx), errEndedElsewhere) {
		return nil, errEndedElsewhere
	}
	if d, n := counted(); n > 0 {
		e.Progress.Done, e.Progress.Total, e.Progress.At = d, n, s.cfg.Now().UTC()
	}
	return c, err
}

// begin resolves e's job and takes the machine's first step.
func (s *Stage) begin(ctx context.Context, e *Environment) (*Job, Event, Machine, Action, error) {
	job, err := s.job(ctx, e)
	if err != nil {
		return nil, Event{}, Machine{}, ActNone, err
	}
	start := Event{Kind: EvStart, HaveLLM: s.cfg.LLM != nil, HaveTemplate: s.cfg.Templates != nil && job.Family != ""}
	for _, a := range e.Attempts {
		start.TemplateTried = start.TemplateTried || a.Origin == schemas.OriginTemplate
	}
	if _, err := s.cfg.Calibrators(job); errors.Is(err, ErrNoPolicy) {
		// Nothing can calibrate it: it waits, like a request without a
		// generation model, until a policy is configured.
		start = Event{Kind: EvStart, Reason: err.Error()}
	}
	m, act, err := Step(e.Machine(s.cfg.MaxAttempts), start)
	return job, start, m, act, err
}

// stillWaiting: e waits and this stage has nothing more to go on with it
// than its record says (the same reason).
func stillWaiting(e *Environment, m Machine) bool {
	return e.Status == StatusWaitingForLLM && m.Status == StatusWaitingForLLM && m.Reason == e.Reason
}

// Resumable reports whether this stage takes a WAITING_FOR_LLM environment
// further than its record (a generation model, a template or a policy it
// waited for is configured now); it records nothing.
func (s *Stage) Resumable(ctx context.Context, e *Environment) (bool, error) {
	if e.Status != StatusWaitingForLLM || e.Request == nil {
		return false, nil
	}
	c := *e
	_, _, m, _, err := s.begin(ctx, &c)
	if err != nil {
		return false, err
	}
	return !stillWaiting(e, m), nil
}

// write runs the attempt's author and turns its outcome into an event.
func (s *Stage) write(ctx context.Context, job *Job, e *Environment, m Machine) (Draft, Event, error) {
	author := s.cfg.LLM
	origin := schemas.OriginLLM
	if m.Path == PathTemplate {
		author, origin = s.cfg.Templates, schemas.OriginTemplate
	}
	var prior []Attempt
	for _, a := range e.Attempts {
		if a.Origin == origin && a.N < m.Attempt {
			prior = append(prior, a)
		}
	}
	d, err := author.Write(ctx, job, m.Attempt, s.cfg.MaxAttempts, prior)
	if d.Origin == "" {
		d.Origin = origin
	}
	var we *WriteError
	switch {
	case err == nil && d.Program == "":
		return d, Event{Kind: EvWriteFailed, Reason: "the author returned an empty program"}, nil
	case err == nil:
		return d, Event{Kind: EvWritten}, nil
	case errors.As(err, &we):
		return d, Event{Kind: EvWriteFailed, Reason: we.Reason, Final: we.Final}, nil
	case errors.Is(err, ErrModelRefusesTrace):
		return d, Event{}, err
	case ctx.Err() != nil:
		return d, Event{}, ctx.Err()
	default:
		if !errors.Is(err, ErrTransient) {
			err = fmt.Errorf("%w: %w", ErrTransient, err)
		}
		return d, Event{}, err
	}
}

func (s *Stage) endAttempt(e *Environment, a *Attempt, stage, diagnosis string) {
	a.Stage, a.Diagnosis, a.EndedAt = stage, diagnosis, s.cfg.Now().UTC()
	// A resumed attempt replaces the record of its interrupted run.
	for i := range e.Attempts {
		if e.Attempts[i].N == a.N && e.Attempts[i].Origin == a.Origin {
			e.Attempts[i] = *a
			return
		}
	}
	e.Attempts = append(e.Attempts, *a)
}

// calibrationDiagnosis is what the repair loop is told of a rejection.
func calibrationDiagnosis(c *Calibration) string {
	d := c.Diagnosis
	if d == "" {
		d = c.Verdict
	}
	return fmt.Sprintf("%s (mean reward %.3f, success rate %.3f, reward std %.3f, informative groups %.2f, %d seeds × %d rollouts)",
		d, c.MeanReward, c.SuccessRate, c.StdReward, c.InformativeGroups, c.Seeds, c.RolloutsPerSeed)
}

// Abort records the request's environment FAILED for reason (its
// deliveries ran out). A finished environment is left as it is.
func (s *Stage) Abort(ctx context.Context, req *schemas.SynthesisRequest, reason string) (*Environment, error) {
	e, err := s.load(ctx, req)
	if err != nil {
		return nil, err
	}
	m, act, err := Step(e.Machine(s.cfg.MaxAttempts), Event{Kind: EvAbort, Reason: reason})
	if err != nil || act == ActNone {
		return e, err
	}
	e.setMachine(m)
	if err := s.save(ctx, e); errors.Is(err, errEndedElsewhere) {
		return s.load(ctx, req) // another run ended it: left as it is
	} else if err != nil {
		return e, err
	}
	return e, nil
}

// NoteTransient records that a delivery of req ended in a transient
// failure and returns how many have (Environment.TransientFailures). A
// finished environment is left as it is.
func (s *Stage) NoteTransient(ctx context.Context, req *schemas.SynthesisRequest) (int, error) {
	e, err := s.load(ctx, req)
	if err != nil {
		return 0, err
	}
	if e.Status.Terminal() {
		return e.TransientFailures, nil
	}
	e.TransientFailures++
	if err := s.save(ctx, e); errors.Is(err, errEndedElsewhere) {
		return e.TransientFailures - 1, nil // another run ended it: left as it is
	} else if err != nil {
		return 0, err
	}
	return e.TransientFailures, nil
}

// load returns the request's environment record, a new PENDING one when
// none is stored.
func (s *Stage) load(ctx context.Context, req *schemas.SynthesisRequest) (*Environment, error) {
	if req == nil || req.TriggerID == "" {
		return nil, errors.New("synthesizer: request without a trigger id")
	}
	id := schemas.EnvironmentID(req.TriggerID)
	e, err := s.cfg.Store.LoadEnvironment(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%w: load environment %s: %w", ErrTransient, id, err)
	}
	if e != nil {
		if e.Request == nil {
			e.Request = req
		}
		return e, nil
	}
	now := s.cfg.Now().UTC()
	e = &Environment{
		ID: id, TriggerID: req.TriggerID, Environment: req.Environment, AgentVersion: req.AgentVersion,
		DictionaryVersion: req.DictionaryVersion, Capability: req.Capability.Skill, Definition: req.Capability.Description,
		Rank: req.Rank, MeanDelta: req.Capability.MeanDelta, Request: req, Status: StatusPending, CreatedAt: now,
	}
	return e, nil
}

// job resolves the definition, the family and the examples of e's request.
func (s *Stage) job(ctx context.Context, e *Environment) (*Job, error) {
	req := e.Request
	job := &Job{ID: e.ID, Request: req, Definition: e.Definition, Started: s.cfg.Now()}
	if s.cfg.Dictionaries != nil {
		if ci, ok := s.cfg.Dictionaries.Capability(req.Environment, req.AgentVersion, req.DictionaryVersion, req.Capability.Skill); ok {
			if ci.Definition != "" {
				job.Definition = ci.Definition
			}
			job.Family, job.FamilySource = ci.Family, FamilyFromDictionary
		}
	}
	why := ""
	switch {
	case s.cfg.Families == nil:
		job.Family, job.FamilySource = "", ""
	case job.Family == "other": // the dictionary says no template practises it
		job.Family, why = "", "the dictionary declares family other: no built-in template"
	case job.Family != "" && s.cfg.Families.Known(job.Family):
		why = "the dictionary declares family " + job.Family
	default:
		declared := job.Family
		f, w, ok := s.cfg.Families.Match(req.Capability.Skill, job.Definition)
		if declared != "" {
			w = fmt.Sprintf("the dictionary declares unknown family %q; %s", declared, w)
		}
		job.Family, job.FamilySource, why = "", "", w
		if ok {
			job.Family, job.FamilySource = f, FamilyMatched
		}
	}
	e.Definition, e.Family, e.FamilySource, e.FamilyWhy = job.Definition, job.Family, job.FamilySource, why
	if s.cfg.Examples != nil && len(req.ExampleFailedRolloutIDs) > 0 && s.cfg.LLM != nil {
		rs, err := s.cfg.Examples.ExampleRollouts(ctx, req.Environment, req.AgentVersion, req.ExampleFailedRolloutIDs)
		if err != nil {
			return nil, fmt.Errorf("%w: example rollouts: %w", ErrTransient, err)
		}
		job.Examples = rs
	}
	return job, nil
}

// terminalVersion is set in the version of an ended record (DONE,
// FAILED): unended versions are nanosecond times, below 2^62 until 2116.
const terminalVersion = uint64(1) << 62

// errEndedElsewhere: save found the environment ended (DONE or FAILED) by
// another run of its request; nothing was written.
var errEndedElsewhere = errors.New("synthesizer: the environment was ended by another run of its request")

// save writes e, unless the stored record has ended meanwhile
// (errEndedElsewhere): a run never saves after it ends, and each run
// starts from a record that has not, so a stored end is another run's,
// which this one must not overwrite.
func (s *Stage) save(ctx context.Context, e *Environment) error {
	stored, err := s.cfg.Store.LoadEnvironment(ctx, e.ID)
	if err != nil {
		return fmt.Errorf("%w: load environment %s: %w", ErrTransient, e.ID, err)
	}
	if stored != nil && stored.Status.Terminal() {
		return errEndedElsewhere
	}
	now := s.cfg.Now().UTC()
	e.UpdatedAt = now
	e.Version = max(e.Version+1, uint64(now.UnixNano()))
	if e.Status.Terminal() {
		// The check above and the write are not one step: another run's
		// save that passed its check just before this one may land after
		// it. An end's version sorts above every unended one's, so such a
		// write cannot replace it (the table keeps the highest version).
		e.Version |= terminalVersion
	}
	if err := s.cfg.Store.SaveEnvironment(ctx, e); err != nil {
		return fmt.Errorf("%w: save environment %s: %w", ErrTransient, e.ID, err)
	}
	s.cfg.Log.Info("synthesizer: environment", "id", e.ID, "environment", e.Environment, "agent_version", e.AgentVersion,
		"capability", e.Capability, "status", e.Status, "attempt", e.Attempt, "reason", e.Reason)
	return nil
}

func (s *Stage) publish(ctx context.Context, e *Environment) error {
	if s.cfg.Publisher == nil {
		return nil
	}
	m, err := e.Ready(s.cfg.Now())
	if err != nil {
		return err
	}
	if err := s.cfg.Publisher.PublishEnvironmentReady(ctx, m); err != nil {
		return fmt.Errorf("%w: publish %s ready: %w", ErrTransient, e.ID, err)
	}
	return nil
}
