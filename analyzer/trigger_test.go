package analyzer

import (
	"testing"
	"time"
)

func TestTriggerStateMachine(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rearm := time.Hour
	type step struct {
		at                time.Duration
		decided, selected bool
		want              TriggerState
		act               Action
		epoch             uint32
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"undecided windows never fire", []step{
			{0, false, true, StateIdle, ActNone, 0},
			{time.Minute, false, true, StateIdle, ActNone, 0},
		}},
		{"fires once while selected", []step{
			{0, true, false, StateIdle, ActNone, 0},
			{1 * time.Minute, true, true, StateSelected, ActFire, 1},
			{2 * time.Minute, true, true, StateSelected, ActNone, 1},
			{3 * time.Minute, false, false, StateSelected, ActNone, 1},
		}},
		{"flapping within the re-arm delay does not fire again", []step{
			{0, true, true, StateSelected, ActFire, 1},
			{time.Minute, true, false, StateCooldown, ActDeselected, 1},
			{30 * time.Minute, true, true, StateSelected, ActReselected, 1},
			{31 * time.Minute, true, false, StateCooldown, ActDeselected, 1},
			{60 * time.Minute, true, false, StateCooldown, ActNone, 1},
		}},
		{"re-arms after the delay and fires a new epoch", []step{
			{0, true, true, StateSelected, ActFire, 1},
			{time.Minute, true, false, StateCooldown, ActDeselected, 1},
			{61 * time.Minute, true, false, StateIdle, ActRearmed, 1},
			{62 * time.Minute, true, true, StateSelected, ActFire, 2},
		}},
		{"undecided window during cooldown does not re-arm", []step{
			{0, true, true, StateSelected, ActFire, 1},
			{time.Minute, true, false, StateCooldown, ActDeselected, 1},
			{2 * time.Hour, false, false, StateCooldown, ActNone, 1},
			{3 * time.Hour, true, false, StateIdle, ActRearmed, 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tr Trigger
			var recorded []RecordedAction
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				var act Action
				tr, act = tr.Observe(now, s.decided, s.selected, rearm)
				if tr.State != s.want || act != s.act || tr.Epoch != s.epoch {
					t.Fatalf("step %d: state %s action %q epoch %d; want %s %q %d", i, tr.State, act, tr.Epoch, s.want, s.act, s.epoch)
				}
				if act != ActNone {
					recorded = append(recorded, RecordedAction{act, tr.Epoch, now})
				}
			}
			// Recovery from the recorded actions yields the same state.
			if got := Replay(recorded); got.State != tr.State || got.Epoch != tr.Epoch {
				t.Fatalf("Replay = %+v, want %+v", got, tr)
			}
		})
	}
}

func TestTriggerIDDeterministic(t *testing.T) {
	k := TriggerKey{"env", "v1", 1, "cap_a"}
	if TriggerID(k, 1) != TriggerID(k, 1) || TriggerID(k, 1) == TriggerID(k, 2) {
		t.Fatal("trigger ids must be deterministic per epoch and differ across epochs")
	}
	k2 := k
	k2.DictionaryVersion = 2
	if TriggerID(k, 1) == TriggerID(k2, 1) {
		t.Fatal("dictionary version must be part of the id")
	}
}
