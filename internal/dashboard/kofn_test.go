package dashboard

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// TestDecisionKOfNPerCohort: with analyzer.k and analyzer.n unset, each
// cohort's decision is made, and shown, with the K of N of its labels'
// source: external labels 8 of 10, the rules labeler's 1 of 1. An
// evaluation stored before the evaluator recorded its K of N is computed
// again.
func TestDecisionKOfNPerCohort(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	var labels []sink.LabelRow
	for i := range 40 {
		ts := now.Add(-time.Duration(i) * time.Minute)
		// LACKING on failures, PRESENT on successes: selected in every run.
		l := schemas.LabelLacking
		if i%4 == 0 {
			l = schemas.LabelPresent
		}
		for run := range uint16(10) {
			labels = append(labels, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: fmt.Sprintf("x-%02d", i), Environment: "imported", AgentVersion: "v1",
				DictionaryVersion: 1, Capability: capMulti, Run: run, Label: l, Success: i%4 == 0, Source: schemas.SourceExternal, TS: ts}})
		}
		labels = append(labels, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: fmt.Sprintf("r-%02d", i), Environment: "ruled", AgentVersion: "v1",
			DictionaryVersion: 1, Capability: capMulti, Label: l, Success: i%4 == 0, Source: schemas.SourceRules, TS: ts}})
	}
	if err := st.InsertLabels(ctx, labels); err != nil {
		t.Fatal(err)
	}
	// An evaluation stored without its K of N: computed again.
	old := fmt.Sprintf(`{"evaluated_at":%q,"as_of":%q,"rollouts":40,"failures":30,"runs":1,"decided":true,"results":[]}`, now.Format(time.RFC3339), now.Format(time.RFC3339))
	if err := st.SaveEvaluations(ctx, []sink.StoredEvaluation{{Cohort: sink.Cohort{Environment: "ruled", AgentVersion: "v1", DictionaryVersion: 1},
		EvaluatedNs: uint64(now.UnixNano()), Payload: old}}); err != nil {
		t.Fatal(err)
	}
	ev := testEval
	ev.K, ev.N = 0, 0
	h := New(Deps{Store: st, Dicts: registry(), Rho: 0.10, Delta: 0.20, Eval: ev, Now: func() time.Time { return now }})
	for env, want := range map[string][2]int{"imported": {8, 10}, "ruled": {1, 1}} {
		var o OverviewResponse
		getJSON(t, h, "/api/overview?env="+env, &o)
		d := o.Decision
		if d == nil || d.Source != "computed" || !d.Decided || d.K != want[0] || d.N != want[1] || d.Runs != want[1] || d.Window.Rollouts != 40 {
			t.Fatalf("%s: decision %+v, want one computed by %d of %d runs over 40 rollouts", env, d, want[0], want[1])
		}
		if o.Thresholds.K != 0 || o.Thresholds.N != 0 {
			t.Errorf("%s: thresholds %+v, want k and n unset", env, o.Thresholds)
		}
		selected := false
		for _, c := range d.Capabilities {
			selected = selected || c.Name == capMulti && c.Decision == DecisionSelected && c.RunsPassed == want[1]
		}
		if !selected {
			t.Errorf("%s: %s not selected: %+v", env, capMulti, d.Capabilities)
		}
		var c CapabilityResponse
		getJSON(t, h, "/api/capability?env="+env+"&agent_version=v1&dict=1&name="+capMulti, &c)
		if c.K != want[0] || c.N != want[1] || !c.Decided {
			t.Errorf("%s: capability page k %d n %d decided %v, want %d of %d", env, c.K, c.N, c.Decided, want[0], want[1])
		}
		code, body := getStatus(h, "/?env="+env)
		if s := fmt.Sprintf("passes ≥ %d of %d runs", want[0], want[1]); code != 200 || !strings.Contains(body, s) || !strings.Contains(body, fmt.Sprintf("selected iff ≥ %d of %d runs pass", want[0], want[1])) {
			t.Errorf("%s: overview page (%d) lacks %q", env, code, s)
		}
		code, body = getStatus(h, "/capability?env="+env+"&agent_version=v1&dict=1&name="+capMulti)
		if s := fmt.Sprintf("needs %d of %d", want[0], want[1]); code != 200 || !strings.Contains(body, s) {
			t.Errorf("%s: capability page (%d) lacks %q", env, code, s)
		}
	}
}
