package schemas_test

import (
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/schemas"
)

func TestAdapterEventRoundTripAndRejects(t *testing.T) {
	e := &schemas.AdapterEvent{EventID: schemas.AdapterEventID("ad", "rolled_back", 7), Type: schemas.AdapterRolledBack, Adapter: "ad",
		Capability: "multi_step_completion", Environment: "sim-airline", At: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), By: "guard",
		Evidence: &schemas.Evidence{Verdict: "worse", Before: schemas.Side{Rollouts: 10, Failures: 5, Delta: schemas.Interval{Value: 0.7, Lo: 0.5, Hi: 0.8}},
			After: schemas.Side{Rollouts: 10, Failures: 9}}}
	data, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := schemas.DecodeAdapterEvent(data)
	if err != nil || got.Schema != "adapter_event/v1" || got.Evidence.Before.Delta.Lo != 0.5 || got.EventID != e.EventID {
		t.Fatalf("%+v %v", got, err)
	}
	if schemas.AdapterEventID("ad", "rolled_back", 7) == schemas.AdapterEventID("ad", "rolled_back", 8) {
		t.Fatal("event ids must differ per registry version")
	}
	ok := string(data)
	for _, tc := range []struct{ name, doc, path string }{
		{"unknown type", strings.Replace(ok, `"rolled_back"`, `"paused"`, 1), "/type"},
		{"no adapter", strings.Replace(ok, `"adapter":"ad",`, "", 1), ""},
		{"unknown verdict", strings.Replace(ok, `"worse"`, `"meh"`, 1), "/evidence/verdict"},
		{"unknown field", strings.Replace(ok, `"by":"guard"`, `"by":"guard","x":1`, 1), ""},
	} {
		_, err := schemas.DecodeAdapterEvent([]byte(tc.doc))
		se, isSchema := err.(*schemas.Error)
		if !isSchema || se.Reason != schemas.ReasonSchema || (tc.path != "" && se.Path != tc.path) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if _, err := (&schemas.AdapterEvent{Type: "rolled_back"}).Encode(); err == nil {
		t.Fatal("an invalid event was encoded")
	}
}
