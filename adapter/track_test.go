package adapter

import (
	"testing"

	"github.com/traceops/trace/schemas"
)

func TestApply(t *testing.T) {
	for _, tt := range []struct {
		status, event string
		want          Transition
	}{
		{StatusDispatched, schemas.EventStarted, Transition{Status: StatusRunning}},
		{StatusDispatched, schemas.EventProgress, Transition{Status: StatusRunning}},
		{StatusRunning, schemas.EventHeartbeat, Transition{Status: StatusRunning}},
		{StatusRunning, schemas.EventSucceeded, Transition{Status: StatusSucceeded, Register: true}},
		{StatusDispatched, schemas.EventSucceeded, Transition{Status: StatusSucceeded, Register: true}},
		{StatusRunning, schemas.EventFailed, Transition{Status: StatusFailed, Reason: "oom"}},
		{StatusFailed, schemas.EventSucceeded, Transition{Status: StatusFailed, Ignored: true}},       // late success after the deadline
		{StatusSucceeded, schemas.EventSucceeded, Transition{Status: StatusSucceeded, Ignored: true}}, // a redelivery
		{StatusSucceeded, schemas.EventProgress, Transition{Status: StatusSucceeded, Ignored: true}},
	} {
		got := Apply(tt.status, &schemas.TrainingEvent{Type: tt.event, Reason: "oom"})
		if got != tt.want {
			t.Errorf("%s + %s = %+v, want %+v", tt.status, tt.event, got, tt.want)
		}
	}
}
