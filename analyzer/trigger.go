package analyzer

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
)

// TriggerState is the state of one capability's trigger in one cohort.
type TriggerState string

// Trigger states: idle → selected → cooldown → (after the re-arm delay) idle.
const (
	StateIdle     TriggerState = "idle"     // armed: the next selection fires
	StateSelected TriggerState = "selected" // fired for the current epoch
	StateCooldown TriggerState = "cooldown" // deselected; re-arms after RearmAfter
)

// TriggerKey identifies one trigger.
type TriggerKey struct {
	Environment       string
	AgentVersion      string
	DictionaryVersion uint32
	Capability        string
}

func (k TriggerKey) String() string {
	return fmt.Sprintf("%s/%s/v%d/%s", k.Environment, k.AgentVersion, k.DictionaryVersion, k.Capability)
}

// TriggerID is the deterministic id of the epoch-th firing of a trigger. It is
// the JetStream Msg-Id of the synthesis request, so two replicas firing the
// same trigger produce one message.
func TriggerID(k TriggerKey, epoch uint32) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%s\x00%d\x00%s\x00%d", k.Environment, k.AgentVersion, k.DictionaryVersion, k.Capability, epoch)))
	return hex.EncodeToString(h[:16])
}

// Trigger is the state machine of one trigger. Its zero value is idle at epoch 0.
type Trigger struct {
	State TriggerState
	Epoch uint32    // number of firings so far; the next firing is Epoch+1
	Since time.Time // when the current state was entered
}

// Action is what an observation asks the caller to do.
type Action string

// Actions returned by Observe.
const (
	ActNone       Action = ""
	ActFire       Action = "fired"      // publish a synthesis request for Epoch (already incremented)
	ActDeselected Action = "deselected" // record: no longer selected, cooldown begins
	ActReselected Action = "reselected" // selected again during cooldown: no new request (hysteresis)
	ActRearmed    Action = "rearmed"    // record: cooldown over, armed again
)

// Observe feeds one evaluation of the window into the state machine and
// returns the next state and the action. decided is false when the window is
// too small to decide (fewer failures than the minimum): no transition then.
// rearmAfter is how long a capability must stay deselected before the trigger
// re-arms. Observe is pure: the caller applies the returned state only after
// the action's effect (publish, record) succeeded, so a failed publish is
// retried by the next evaluation.
func (t Trigger) Observe(now time.Time, decided, selected bool, rearmAfter time.Duration) (Trigger, Action) {
	t.State = cmp.Or(t.State, StateIdle)
	if !decided {
		return t, ActNone
	}
	switch t.State {
	case StateIdle:
		if selected {
			return Trigger{State: StateSelected, Epoch: t.Epoch + 1, Since: now}, ActFire
		}
	case StateSelected:
		if !selected {
			return Trigger{State: StateCooldown, Epoch: t.Epoch, Since: now}, ActDeselected
		}
	case StateCooldown:
		if selected {
			return Trigger{State: StateSelected, Epoch: t.Epoch, Since: now}, ActReselected
		}
		if now.Sub(t.Since) >= rearmAfter {
			return Trigger{State: StateIdle, Epoch: t.Epoch, Since: now}, ActRearmed
		}
	}
	return t, ActNone
}

// Replay rebuilds a trigger from its recorded actions (oldest first), as read
// back from ClickHouse trigger_events after a restart or rebalance.
func Replay(events []RecordedAction) Trigger {
	var t Trigger
	t.State = StateIdle
	for _, e := range events {
		switch e.Action {
		case ActFire:
			t = Trigger{State: StateSelected, Epoch: e.Epoch, Since: e.At}
		case ActDeselected:
			t = Trigger{State: StateCooldown, Epoch: e.Epoch, Since: e.At}
		case ActReselected:
			t = Trigger{State: StateSelected, Epoch: e.Epoch, Since: e.At}
		case ActRearmed:
			t = Trigger{State: StateIdle, Epoch: e.Epoch, Since: e.At}
		}
	}
	return t
}

// RecordedAction is one stored trigger transition.
type RecordedAction struct {
	Action Action
	Epoch  uint32
	At     time.Time
}
