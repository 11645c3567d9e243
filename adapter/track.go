package adapter

import (
	"fmt"

	"github.com/traceops/trace/schemas"
)

// Job statuses. PLANNED: recorded, not dispatched (backend none);
// DISPATCHED: handed to the backend; RUNNING: the trainer reported;
// SUCCEEDED and FAILED are final.
const (
	StatusPlanned    = "PLANNED"
	StatusDispatched = "DISPATCHED"
	StatusRunning    = "RUNNING"
	StatusSucceeded  = "SUCCEEDED"
	StatusFailed     = "FAILED"
)

// Terminal reports whether a status is final.
func Terminal(status string) bool { return status == StatusSucceeded || status == StatusFailed }

// Transition is what one event does to a job.
type Transition struct {
	Status string // the job's status after the event
	Reason string // a failure's reason
	// Ignored: the event changes nothing (a late event after the job
	// ended); it is still recorded in the history.
	Ignored bool
	// Register: the job succeeded now; its adapter must be registered.
	Register bool
}

// Apply is the job state machine: started and progress move an open job
// to RUNNING; succeeded and failed end it. An event after the end changes
// nothing (a success reported after its deadline failed the job stays
// FAILED, with the late event in the history).
func Apply(status string, e *schemas.TrainingEvent) Transition {
	if Terminal(status) {
		return Transition{Status: status, Ignored: true}
	}
	switch e.Type {
	case schemas.EventStarted, schemas.EventProgress, schemas.EventHeartbeat:
		return Transition{Status: StatusRunning}
	case schemas.EventSucceeded:
		return Transition{Status: StatusSucceeded, Register: true}
	case schemas.EventFailed:
		return Transition{Status: StatusFailed, Reason: e.Reason}
	default:
		return Transition{Status: status, Ignored: true, Reason: fmt.Sprintf("unknown event type %q", e.Type)}
	}
}
