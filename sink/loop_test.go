package sink_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// TestLoopSamplesAndRoutingShare: the before side is the cohort's base
// rollouts that ended before activation (not routed ones — by their
// routing field or by their conversation's decision —, not another agent
// version's, not later ones), the after side the rollouts routed to the
// adapter in the same cohort (by either, not another version's); a relabel's newest label wins; the
// limit keeps the most recent; the dictionaries are the cohort's, newest first; the
// routing share counts rollouts per bucket and adapter.
func TestLoopSamplesAndRoutingShare(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	act := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	type ro struct {
		id, version, adapter, conv string
		end                        time.Time
		ok                         bool
		labels                     []string // per run
	}
	data := []ro{
		{"b1", "1.4.0", "", "", act.Add(-2 * time.Hour), false, []string{"LACKING", "LACKING"}},
		{"b2", "1.4.0", "", "", act.Add(-time.Hour), true, []string{"PRESENT", "NA"}},
		{"b3", "1.4.0", "", "", act.Add(-time.Minute), false, []string{"PRESENT", "LACKING"}},
		{"b4", "1.4.0", "", "c-other", act.Add(-30 * time.Minute), false, []string{"LACKING", "LACKING"}}, // routed to "other" (found through its conversation)
		{"b5", "1.4.0", "", "c-base", act.Add(-20 * time.Minute), true, []string{"PRESENT", "PRESENT"}},   // the router chose the base model
		{"x1", "1.5.0", "", "", act.Add(-time.Hour), false, []string{"LACKING", "LACKING"}},               // another version
		{"late", "1.4.0", "", "", act.Add(time.Hour), false, []string{"LACKING", "LACKING"}},              // base, after activation
		{"r1", "1.4.0", "ad", "", act.Add(10 * time.Minute), true, []string{"PRESENT", "PRESENT"}},
		{"r2", "1.4.0", "ad", "", act.Add(70 * time.Minute), false, []string{"PRESENT"}},    // one run so far
		{"r3", "1.5.0", "ad", "", act.Add(30 * time.Minute), false, []string{"LACKING"}},    // another version
		{"r4", "1.4.0", "", "c-ad", act.Add(40 * time.Minute), false, []string{"NA", "NA"}}, // no routing field: joined by conversation
		{"o1", "1.4.0", "other", "", act.Add(20 * time.Minute), false, []string{"LACKING", "LACKING"}},
	}
	var rows []sink.RolloutRow
	var labels []sink.LabelRow
	for _, d := range data {
		rows = append(rows, sink.RolloutRow{RolloutID: d.id, Environment: "env", AgentName: "bot", AgentVersion: d.version, TaskID: d.id,
			Success: d.ok, StartTime: d.end.Add(-time.Minute), EndTime: d.end, Messages: "[]", Tools: "[]", Grader: "{}", Metadata: "{}", Adapter: d.adapter,
			ConversationID: d.conv})
		for run, l := range d.labels {
			labels = append(labels, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: d.id, Environment: "env", AgentVersion: d.version,
				DictionaryVersion: 2, Capability: "cap", Run: uint16(run), Label: l, Success: d.ok, Source: "test", TS: d.end}})
		}
	}
	if err := s.InsertRollouts(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertLabels(ctx, labels); err != nil {
		t.Fatal(err)
	}
	// The router's decisions of the conversations without a routing field
	// (c-ad decided twice: the latest, for ad, wins).
	var decisions []sink.RouteDecisionRow
	for i, d := range []struct{ conv, adapter string }{{"c-other", "other"}, {"c-base", ""}, {"c-ad", ""}, {"c-ad", "ad"}, {"c-fb", "ad"}, {"c-fb", ""}} {
		decisions = append(decisions, sink.RouteDecisionRow{At: act.Add(time.Duration(i) * time.Second), RequestID: "q" + d.conv, DecisionID: "d-" + d.conv,
			ConversationID: d.conv, Environment: "env", AgentVersion: "1.4.0", Endpoint: "proxy", Adapter: d.adapter, Outcome: "ok"})
	}
	if err := s.InsertRouteDecisions(ctx, decisions); err != nil {
		t.Fatal(err)
	}
	// An older dictionary's labels and a relabel of b2's run 1 (newer ingest wins).
	time.Sleep(5 * time.Millisecond)
	if err := s.InsertLabels(ctx, []sink.LabelRow{
		{LabelEvent: schemas.LabelEvent{RolloutID: "b2", Environment: "env", AgentVersion: "1.4.0", DictionaryVersion: 2, Capability: "cap", Run: 1,
			Label: "LACKING", Success: true, Source: "test", TS: act.Add(-time.Hour)}},
		{LabelEvent: schemas.LabelEvent{RolloutID: "b1", Environment: "env", AgentVersion: "1.4.0", DictionaryVersion: 1, Capability: "cap", Run: 0,
			Label: "NA", Source: "test", TS: act.Add(-2 * time.Hour)}},
	}); err != nil {
		t.Fatal(err)
	}
	dvs, err := s.LoopDictionaries(ctx, "env", "1.4.0", "cap")
	if err != nil || !reflect.DeepEqual(dvs, []uint32{2, 1}) {
		t.Fatalf("dictionaries %v %v, want [2 1]", dvs, err)
	}
	if dvs, err := s.LoopDictionaries(ctx, "env", "1.4.0", "nope"); err != nil || len(dvs) != 0 {
		t.Fatalf("no labels: dictionaries %v %v", dvs, err)
	}
	before, err := s.LoopLabels(ctx, sink.LoopSample{Environment: "env", AgentVersion: "1.4.0", Until: act, DictionaryVersion: 2, Capability: "cap"})
	if err != nil {
		t.Fatal(err)
	}
	want := []sink.RolloutLabels{
		{RolloutID: "b1", EndTime: act.Add(-2 * time.Hour), Labels: []string{"LACKING", "LACKING"}},
		{RolloutID: "b2", Success: true, EndTime: act.Add(-time.Hour), Labels: []string{"PRESENT", "LACKING"}},
		{RolloutID: "b3", EndTime: act.Add(-time.Minute), Labels: []string{"PRESENT", "LACKING"}},
		{RolloutID: "b5", Success: true, EndTime: act.Add(-20 * time.Minute), Labels: []string{"PRESENT", "PRESENT"}},
	}
	if !reflect.DeepEqual(before, want) {
		t.Fatalf("before = %+v\nwant %+v", before, want)
	}
	last2, err := s.LoopLabels(ctx, sink.LoopSample{Environment: "env", AgentVersion: "1.4.0", Until: act, DictionaryVersion: 2, Capability: "cap", Limit: 2})
	if err != nil || len(last2) != 2 || last2[0].RolloutID != "b3" || last2[1].RolloutID != "b5" {
		t.Fatalf("limit 2 = %+v %v", last2, err)
	}
	after, err := s.LoopLabels(ctx, sink.LoopSample{Environment: "env", AgentVersion: "1.4.0", Adapter: "ad", DictionaryVersion: 2, Capability: "cap"})
	if err != nil {
		t.Fatal(err)
	}
	want = []sink.RolloutLabels{
		{RolloutID: "r1", Success: true, EndTime: act.Add(10 * time.Minute), Labels: []string{"PRESENT", "PRESENT"}},
		{RolloutID: "r2", EndTime: act.Add(70 * time.Minute), Labels: []string{"PRESENT"}},
		{RolloutID: "r4", EndTime: act.Add(40 * time.Minute), Labels: []string{"NA", "NA"}},
	}
	if !reflect.DeepEqual(after, want) {
		t.Fatalf("after = %+v\nwant %+v", after, want)
	}
	loopIDs := func(rs []sink.RolloutLabels) []string {
		var ids []string
		for _, r := range rs {
			ids = append(ids, r.RolloutID)
		}
		return ids
	}
	// The guard's looks: the earliest routed rollouts (r1 at +10 m, r4 at
	// +40 m), not the most recent (r2 at +70 m, r4).
	for _, tc := range []struct {
		oldest bool
		want   string
	}{{true, "r1 r4"}, {false, "r2 r4"}} {
		got, err := s.LoopLabels(ctx, sink.LoopSample{Environment: "env", AgentVersion: "1.4.0", Adapter: "ad", DictionaryVersion: 2, Capability: "cap",
			Limit: 2, Oldest: tc.oldest})
		ids := loopIDs(got)
		if err != nil || strings.Join(ids, " ") != tc.want {
			t.Fatalf("routed, limit 2, oldest %v: %v %v; want %s", tc.oldest, ids, err, tc.want)
		}
	}
	// The guard's watch blocks: routed rollouts that ended in [From, To).
	for _, tc := range []struct {
		from, to time.Duration
		want     string
	}{{10 * time.Minute, 40 * time.Minute, "r1"}, {30 * time.Minute, 71 * time.Minute, "r2 r4"}, {71 * time.Minute, 0, ""}, {0, 11 * time.Minute, "r1"}} {
		spec := sink.LoopSample{Environment: "env", AgentVersion: "1.4.0", Adapter: "ad", DictionaryVersion: 2, Capability: "cap", Oldest: true}
		if tc.from > 0 {
			spec.From = act.Add(tc.from)
		}
		if tc.to > 0 {
			spec.To = act.Add(tc.to)
		}
		got, err := s.LoopLabels(ctx, spec)
		ids := loopIDs(got)
		if err != nil || strings.Join(ids, " ") != tc.want {
			t.Fatalf("routed, ended in [%v, %v): %v %v; want %q", tc.from, tc.to, ids, err, tc.want)
		}
	}

	share, err := s.RoutingShare(ctx, "env", 110*time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	wantShare := []sink.ShareRow{
		{Bucket: act.Add(-time.Hour), Adapter: "", Rollouts: 3}, // b3, b4, b5 (rollouts.adapter: what the rollouts say)
		{Bucket: act, Adapter: "", Rollouts: 1},                 // r4
		{Bucket: act, Adapter: "ad", Rollouts: 2},
		{Bucket: act, Adapter: "other", Rollouts: 1},
		{Bucket: act.Add(time.Hour), Adapter: "", Rollouts: 1}, // late
		{Bucket: act.Add(time.Hour), Adapter: "ad", Rollouts: 1},
	}
	if !reflect.DeepEqual(share, wantShare) {
		t.Fatalf("share = %+v\nwant %+v", share, wantShare)
	}

	// The router's decisions: one per decision id and bucket, under the
	// adapter of its last request there (c-ad's two rows share theirs: the
	// base model's, then ad's; c-fb was served by ad, then by the base
	// model after the upstream stopped serving ad).
	dshare, err := s.DecisionShare(ctx, "env", 0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	wantD := []sink.ShareRow{{Bucket: act, Adapter: "", Rollouts: 2}, {Bucket: act, Adapter: "ad", Rollouts: 1}, {Bucket: act, Adapter: "other", Rollouts: 1}}
	if !reflect.DeepEqual(dshare, wantD) {
		t.Fatalf("decision share = %+v\nwant %+v", dshare, wantD)
	}
	if none, err := s.DecisionShare(ctx, "nope", time.Hour, time.Hour); err != nil || len(none) != 0 {
		t.Fatalf("no decisions: %+v %v", none, err)
	}

	a := sink.AdapterRow{Name: "ad", Capability: "cap", Environment: "env", Status: "active", Metadata: "{}", CreatedAt: act, UpdatedAt: act, Version: 5}
	if err := s.SaveAdapter(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkAdapterRolledBack(ctx, a, `{"rolled_back_by":"guard"}`, act.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	got, err := s.Adapter(ctx, "ad")
	if err != nil || got.Status != "rolled_back" || got.Metadata != `{"rolled_back_by":"guard"}` || !got.UpdatedAt.Equal(act.Add(time.Hour)) || got.Version <= 5 {
		t.Fatalf("rolled back: %+v %v", got, err)
	}
}
