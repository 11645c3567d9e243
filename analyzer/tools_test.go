package analyzer_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// TestSynthesisRequestsCarryTools: cohorts evaluated together, whose tools
// are looked up in one read, each fire a request with their own target's
// tool schemas (from their newest rollout that declared tools); a cohort
// whose rollouts declared none fires one without tools.
func TestSynthesisRequestsCarryTools(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, b := storeAndBus(t)
	reg := analyzer.NewRegistry()
	dict := &analyzer.Dictionary{Environment: "env", AgentVersion: analyzer.AnyVersion, Version: 1, Source: "file",
		Capabilities: []analyzer.Capability{{Name: "cap", Definition: "does the thing"}}}
	reg.Put(dict)
	versions := []string{"v1", "v2", "v3"} // v3's rollouts declare no tools
	now := time.Now().UTC().Truncate(time.Second)
	var rs []sink.RolloutRow
	var ls []sink.LabelRow
	var cohorts []sink.Cohort
	for _, av := range versions {
		cohorts = append(cohorts, sink.Cohort{Environment: "env", AgentVersion: av, DictionaryVersion: 1})
		for i := range 30 {
			ok := i < 10
			r := &schemas.Rollout{RolloutID: av + "-" + string(rune('a'+i)), Environment: "env", Agent: schemas.Agent{Name: "a", Version: av},
				TaskID: "t", StartTime: now.Add(-time.Hour), EndTime: now.Add(-time.Duration(i) * time.Minute), Outcome: schemas.Outcome{Success: &ok}}
			if av != "v3" {
				r.Tools = []schemas.Tool{{Type: "function", Function: schemas.FunctionDef{Name: "tool_of_" + av}}}
			}
			rs = append(rs, sink.RolloutRowFrom(r, sink.Coord{Topic: "t", Offset: int64(len(rs))}))
			label := schemas.LabelPresent
			if !ok {
				label = schemas.LabelLacking
			}
			ls = append(ls, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: r.RolloutID, Environment: "env", AgentVersion: av,
				DictionaryVersion: 1, Capability: "cap", Label: label, Success: ok, Source: schemas.SourceExternal, TS: r.EndTime}})
		}
	}
	if err := st.InsertRollouts(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertLabels(ctx, ls); err != nil {
		t.Fatal(err)
	}
	ev := analyzer.NewEvaluator(analyzer.EvalConfig{Rho: 0.10, Delta: 0.20, K: 1, N: 1, Window: 24 * time.Hour, MinFailures: 20},
		st, app.BusPublisher{Bus: b}, reg, nil, nil)
	if err := ev.Evaluate(ctx, cohorts...); err != nil {
		t.Fatal(err)
	}
	oc, err := b.JS.OrderedConsumer(ctx, bus.StreamSynthesis, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]schemas.Tool{}
	for len(got) < len(versions) {
		m, err := oc.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("after %d requests: %v", len(got), err)
		}
		var req schemas.SynthesisRequest
		if err := json.Unmarshal(m.Data(), &req); err != nil {
			t.Fatal(err)
		}
		got[req.AgentVersion] = req.Tools
	}
	for _, av := range versions[:2] {
		if len(got[av]) != 1 || got[av][0].Function.Name != "tool_of_"+av {
			t.Errorf("%s: tools %+v, want tool_of_%s", av, got[av], av)
		}
	}
	if len(got["v3"]) != 0 {
		t.Errorf("v3: tools %+v, want none", got["v3"])
	}
}
