package synthesizer

import (
	"fmt"
)

// Status is where an environment's synthesis stands (the environments
// table's status column).
type Status string

// The statuses. DONE and FAILED are terminal; WAITING_FOR_LLM resumes when a
// generation model is configured.
const (
	StatusPending       Status = "PENDING"
	StatusGenerating    Status = "GENERATING"
	StatusValidating    Status = "VALIDATING"
	StatusCalibrating   Status = "CALIBRATING"
	StatusDone          Status = "DONE"
	StatusFailed        Status = "FAILED"
	StatusWaitingForLLM Status = "WAITING_FOR_LLM"
)

// Statuses lists every status in lifecycle order.
var Statuses = []Status{StatusPending, StatusGenerating, StatusValidating, StatusCalibrating, StatusDone, StatusFailed, StatusWaitingForLLM}

// Terminal reports whether s is final: nothing moves a DONE or FAILED
// environment again.
func (s Status) Terminal() bool { return s == StatusDone || s == StatusFailed }

// Path is how an environment's programs are written.
type Path string

// The paths.
const (
	PathNone     Path = ""
	PathLLM      Path = "llm"      // the generation agent writes them
	PathTemplate Path = "template" // a built-in template family is instantiated and tuned
)

// DefaultMaxAttempts bounds the programs written for one environment
// (TRACE-METHOD.md step 2: at most 5 regenerations, then FAILED).
const DefaultMaxAttempts = 5

// Machine is the state of one environment's synthesis. It is a value: Step
// returns the next one and never changes its argument, so the state machine
// is pure and its whole behaviour is the table in state_test.go.
type Machine struct {
	Status Status
	Path   Path
	// Attempt is the current attempt, 1-based (0 before the first). An
	// attempt is one program: written, validated, calibrated.
	Attempt     int
	MaxAttempts int // 0 means DefaultMaxAttempts
	// Reason says why the machine is FAILED or WAITING_FOR_LLM.
	Reason string
	// Diagnoses are the failures of the earlier attempts, in order: what
	// the next attempt is told to fix.
	Diagnoses []string
}

// EventKind is what happened.
type EventKind int

// The events the stage feeds the machine.
const (
	// EvStart begins (or, after a restart or redelivery, resumes) the
	// synthesis. HaveLLM: a generation model is configured; HaveTemplate: a
	// template family matches the capability; TemplateTried: a template
	// was tried before and did not fit (a waiting environment does not try
	// it again). Without either, Reason (when set) says why it waits.
	EvStart EventKind = iota + 1
	// EvWritten: the attempt's program exists (written or instantiated).
	EvWritten
	// EvWriteFailed: no program for this attempt (the answer held none, the
	// model refused). Final: another attempt cannot help (a template that
	// cannot adapt to the target's tools).
	EvWriteFailed
	// EvValid / EvInvalid: the validation checks passed / failed.
	EvValid
	EvInvalid
	// EvAccepted / EvRejected: calibration was within / outside the bands.
	EvAccepted
	EvRejected
	// EvAbort stops the synthesis for a reason outside the program (the
	// request's deliveries ran out): FAILED.
	EvAbort
)

var eventNames = map[EventKind]string{EvStart: "start", EvWritten: "written", EvWriteFailed: "write_failed", EvValid: "valid",
	EvInvalid: "invalid", EvAccepted: "accepted", EvRejected: "rejected", EvAbort: "abort"}

func (k EventKind) String() string {
	if s, ok := eventNames[k]; ok {
		return s
	}
	return fmt.Sprintf("event(%d)", int(k))
}

// Event is one input of the machine.
type Event struct {
	Kind          EventKind
	HaveLLM       bool   // EvStart
	HaveTemplate  bool   // EvStart
	TemplateTried bool   // EvStart
	Reason        string // the diagnosis of EvWriteFailed, EvInvalid, EvRejected; the reason of EvAbort
	Final         bool   // the failure cannot be fixed by another attempt on this path
}

// Action is what the stage must do after a step.
type Action int

// The actions.
const (
	ActNone      Action = iota // nothing (a terminal environment stays as it is)
	ActWrite                   // write the program of Machine.Attempt, telling it Machine.Diagnoses
	ActValidate                // validate the program just written
	ActCalibrate               // calibrate the valid program
	ActPublish                 // DONE: announce it on trace.environments.ready
	ActWait                    // WAITING_FOR_LLM: record it and acknowledge the request
	ActGiveUp                  // FAILED: record it and acknowledge the request
)

var actionNames = []string{"none", "write", "validate", "calibrate", "publish", "wait", "give_up"}

func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// Start is the machine of a new environment.
func Start(maxAttempts int) Machine {
	return Machine{Status: StatusPending, MaxAttempts: maxAttempts}
}

func (m Machine) max() int {
	if m.MaxAttempts > 0 {
		return m.MaxAttempts
	}
	return DefaultMaxAttempts
}

// Step applies ev to m. An event that cannot happen in m's status is an
// error (the stage's bug, not the program's); a terminal machine ignores a
// repeated EvStart (a redelivered request of a finished environment) with
// ActNone.
func Step(m Machine, ev Event) (Machine, Action, error) {
	m.Diagnoses = append([]string(nil), m.Diagnoses...) // never share the caller's slice
	if ev.Kind == EvAbort {
		if m.Status.Terminal() {
			return m, ActNone, nil
		}
		m.Status, m.Reason = StatusFailed, ev.Reason
		return m, ActGiveUp, nil
	}
	bad := func() (Machine, Action, error) {
		return m, ActNone, fmt.Errorf("synthesizer: event %s in status %s", ev.Kind, m.Status)
	}
	switch m.Status {
	case StatusPending, StatusWaitingForLLM:
		if ev.Kind != EvStart {
			return bad()
		}
		return m.start(ev)
	case StatusGenerating:
		switch ev.Kind {
		case EvStart: // resumed mid-attempt: write it again
			return m.resume(ev)
		case EvWritten:
			m.Status = StatusValidating
			return m, ActValidate, nil
		case EvWriteFailed:
			return m.failAttempt("generation: "+ev.Reason, ev.Final)
		}
	case StatusValidating:
		switch ev.Kind {
		case EvStart:
			return m.resume(ev)
		case EvValid:
			m.Status = StatusCalibrating
			return m, ActCalibrate, nil
		case EvInvalid:
			return m.failAttempt("validation: "+ev.Reason, ev.Final)
		}
	case StatusCalibrating:
		switch ev.Kind {
		case EvStart:
			return m.resume(ev)
		case EvAccepted:
			m.Status, m.Reason = StatusDone, ""
			return m, ActPublish, nil
		case EvRejected:
			return m.failAttempt("calibration: "+ev.Reason, ev.Final)
		}
	case StatusDone, StatusFailed:
		if ev.Kind == EvStart {
			return m, ActNone, nil
		}
	}
	return bad()
}

// start chooses the path of a PENDING or WAITING_FOR_LLM machine, or of
// one interrupted mid-attempt whose path cannot go on (resume), and writes:
// a machine interrupted on the chosen path goes on with its attempt and
// diagnoses; a new path starts at attempt 1. Without a path it waits,
// keeping the interrupted attempt.
func (m Machine) start(ev Event) (Machine, Action, error) {
	var path Path
	switch {
	case ev.HaveLLM:
		// A model writes better programs than a fixed template, and it is
		// what resumes a WAITING_FOR_LLM environment.
		path = PathLLM
	case ev.HaveTemplate && (m.Status == StatusPending || !ev.TemplateTried):
		path = PathTemplate
	default:
		if m.Attempt == 0 {
			m.Path = PathNone
		}
		m.Status = StatusWaitingForLLM
		switch {
		case ev.Reason != "":
			m.Reason = ev.Reason
		case m.Reason == "":
			m.Reason = "no generation model is configured and no template family matches the capability"
		}
		return m, ActWait, nil
	}
	if path == m.Path && m.Attempt > 0 && m.Status != StatusPending {
		m.Status, m.Reason = StatusGenerating, ""
		return m, ActWrite, nil
	}
	m.Status, m.Path, m.Reason, m.Attempt, m.Diagnoses = StatusGenerating, path, "", 1, nil
	return m, ActWrite, nil
}

// resume restarts a machine interrupted mid-attempt: its attempt is
// written again when its path's author is still there (and a policy can
// calibrate it: ev.Reason empty), else it starts over as a waiting one
// would (the model or the templates were unconfigured since).
func (m Machine) resume(ev Event) (Machine, Action, error) {
	if ev.Reason == "" && ((m.Path == PathLLM && ev.HaveLLM) || (m.Path == PathTemplate && ev.HaveTemplate)) {
		m.Status = StatusGenerating
		return m, ActWrite, nil
	}
	m.Reason = ""
	return m.start(ev)
}

// failAttempt ends the current attempt with diagnosis d: the next attempt
// when there is one, FAILED after the last, and for a final failure of a
// template WAITING_FOR_LLM (no template fits; a model may still write one).
func (m Machine) failAttempt(d string, final bool) (Machine, Action, error) {
	m.Diagnoses = append(m.Diagnoses, fmt.Sprintf("attempt %d: %s", m.Attempt, d))
	switch {
	case final && m.Path == PathTemplate:
		m.Status, m.Reason = StatusWaitingForLLM, "template cannot be used: "+d
		return m, ActWait, nil
	case final:
		m.Status, m.Reason = StatusFailed, d
		return m, ActGiveUp, nil
	case m.Attempt >= m.max():
		m.Status, m.Reason = StatusFailed, fmt.Sprintf("%d attempts, none accepted; last: %s", m.Attempt, d)
		return m, ActGiveUp, nil
	}
	m.Attempt++
	m.Status = StatusGenerating
	return m, ActWrite, nil
}
