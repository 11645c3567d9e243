package verify_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/verify"
	"github.com/traceops/trace/verify/verifytest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// gap is a cohort lacking the capability: ER− 0.8, ER+ 0.1, Δ 0.7.
var gap = verifytest.Mix{LF: 40, PF: 10, NF: 10, LP: 5, PP: 45, NP: 10}

// TestGuardEndToEnd: real ClickHouse and embedded NATS. Three active
// adapters — one that closed its gap, one that made its capability's pass
// rate collapse, one with too little routed traffic. With the guard off
// nothing changes; with it on, exactly the bad one is rolled back in the
// registry and one valid adapter_event/v1 with the evidence is on
// trace.adapters.events; a second run does nothing more.
func TestGuardEndToEnd(t *testing.T) {
	ctx := context.Background()
	st, b := guardWorld(t)
	act := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, a := range []verifytest.Adapter{
		{Name: "good", Capability: "precondition_verification", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 2, PF: 28, NF: 5, LP: 2, PP: 60, NP: 3}},
		{Name: "bad", Capability: "multi_step_completion", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act.Add(time.Minute),
			Before: gap, After: verifytest.Mix{LF: 45, PF: 40, NF: 5, LP: 2, PP: 13, NP: 5}, Simulated: true},
		{Name: "fresh", Capability: "argument_grounding", Environment: "sim-retail", AgentVersion: "1.5.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 3, PF: 2, PP: 10}},
	} {
		if err := verifytest.Seed(ctx, st, a); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))

	off := verify.New(verify.Config{Guard: false}, st, verify.StoreRollBack{Store: st}, b, log)
	checks, err := off.Guard(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]verify.Verdict{"good": verify.GapClosed, "bad": verify.Worse, "fresh": verify.NotEnoughData}
	got := map[string]verify.AdapterCheck{}
	for _, c := range checks {
		got[c.Adapter] = c
	}
	for name, v := range want {
		if got[name].Verdict != v {
			t.Fatalf("%s: verdict %s (%s), want %s", name, got[name].Verdict, got[name].Reason, v)
		}
	}
	if got["bad"].Action != "guard off: would roll back" || got["good"].Action != "" {
		t.Fatalf("guard off: actions %q %q", got["bad"].Action, got["good"].Action)
	}
	if a, _ := st.Adapter(ctx, "bad"); a.Status != "active" {
		t.Fatalf("guard off rolled back: %+v", a)
	}
	// The before side is the base cohort before activation, the after side
	// the routed rollouts: 120 rollouts before, 100 after, 10 runs each.
	if g := got["good"]; g.Before.Rollouts != 120 || g.After.Rollouts != 100 || g.Before.Runs != 10 || g.DictionaryVersion != 1 ||
		!g.ActivatedAt.Equal(act) || g.Before.Delta.Value < 0.69 || g.After.Delta.Value > 0.1 {
		t.Fatalf("good: %+v", g)
	}

	on := verify.New(verify.Config{Guard: true}, st, verify.StoreRollBack{Store: st}, b, log)
	checks, err = on.Guard(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		if (c.Action == "rolled_back") != (c.Adapter == "bad") {
			t.Fatalf("%s: action %q (verdict %s)", c.Adapter, c.Action, c.Verdict)
		}
	}
	bad, err := st.Adapter(ctx, "bad")
	if err != nil || bad.Status != "rolled_back" {
		t.Fatalf("bad after the guard: %+v %v", bad, err)
	}
	if good, _ := st.Adapter(ctx, "good"); good.Status != "active" {
		t.Fatalf("good after the guard: %+v", good)
	}
	act2, err := st.Adapters(ctx, sink.AdapterFilter{Status: "active"})
	if err != nil || len(act2) != 2 {
		t.Fatalf("active after the guard: %d %v", len(act2), err)
	}

	// A second run: bad is no longer active, nothing happens.
	checks, err = on.Guard(ctx)
	if err != nil || len(checks) != 2 {
		t.Fatalf("second run: %d checks, %v", len(checks), err)
	}
	// The rolled-back adapter is still reported (trace report shows it).
	all, err := on.Check(ctx, "active", "rolled_back")
	if err != nil || len(all) != 3 {
		t.Fatalf("check all: %d %v", len(all), err)
	}
	for _, c := range all {
		if c.Adapter == "bad" && (c.Verdict != verify.Worse || !c.ActivatedAt.Equal(act.Add(time.Minute))) {
			t.Fatalf("rolled-back adapter's check: %+v", c)
		}
		// Only an active adapter's guard is computed (its queries too).
		if (c.Guard.Reason != "") != (c.Status == "active") {
			t.Fatalf("%s (%s): guard %+v", c.Adapter, c.Status, c.Guard)
		}
	}

	s, err := b.JS.Stream(ctx, bus.StreamAdapterEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("adapter events: %+v %v", info.State, err)
	}
	msg, err := s.GetMsg(ctx, info.State.FirstSeq)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := schemas.DecodeAdapterEvent(msg.Data)
	if err != nil {
		t.Fatalf("the event breaks its schema: %v\n%s", err, msg.Data)
	}
	if msg.Subject != "trace.adapters.events" || ev.Type != "rolled_back" || ev.Adapter != "bad" || ev.By != "guard" || !ev.Simulated ||
		ev.Evidence == nil || ev.Evidence.Verdict != "worse" || ev.Evidence.PassRateChange.Hi >= 0 {
		t.Fatalf("event: %s", msg.Data)
	}
	// The evidence is the guard's look: the earliest routed rollouts up to
	// its failures, at its level, not the verdict's 110 at 95 %.
	g := got["bad"].Guard
	if g.Comparison == nil || ev.Evidence.After.Rollouts != g.Comparison.After.Rollouts || ev.Evidence.After.Rollouts >= 110 ||
		ev.Evidence.Level != g.Level || g.Level != 1-0.05/6 || g.Look < 1 || !strings.Contains(ev.Reason, "look") {
		t.Fatalf("event evidence: %s; guard %+v", msg.Data, g)
	}
	if msg.Header.Get(jetstream.MsgIDHeader) != ev.EventID {
		t.Fatalf("Msg-Id %q, event id %q", msg.Header.Get(jetstream.MsgIDHeader), ev.EventID)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// TestGuardRunLoop: Run rolls a worse adapter back on its own schedule
// and returns nil when its context ends.
func TestGuardRunLoop(t *testing.T) {
	ctx := context.Background()
	st, b := guardWorld(t)
	c := verify.New(verify.Config{Guard: true, Interval: 200 * time.Millisecond}, st, verify.StoreRollBack{Store: st}, b, nil)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	// The adapter turns up after the guard started.
	time.Sleep(300 * time.Millisecond)
	if err := verifytest.Seed(ctx, st, verifytest.Adapter{Name: "bad", Capability: "multi_step_completion", Environment: "sim-airline",
		AgentVersion: "1.4.0", ActivatedAt: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC),
		Before: gap, After: verifytest.Mix{LF: 45, PF: 40, NF: 5, LP: 2, PP: 13, NP: 5}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		a, err := st.Adapter(ctx, "bad")
		if err == nil && a != nil && a.Status == "rolled_back" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not rolled back: %+v %v", a, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v on shutdown", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// failingLabels is the real store whose LoopLabels fails for the routed
// side of one adapter: one adapter's query failing, as when its sample
// times out, while every other query reaches ClickHouse.
type failingLabels struct {
	*sink.Store
	adapter string
}

func (f failingLabels) LoopLabels(ctx context.Context, spec sink.LoopSample) ([]sink.RolloutLabels, error) {
	if spec.Adapter == f.adapter || f.adapter == "*" {
		return nil, errors.New("code: 159, message: Timeout exceeded")
	}
	return f.Store.LoopLabels(ctx, spec)
}

// TestGuardRollsBackDespiteAFailedCheck: real ClickHouse and embedded NATS.
// Two active adapters, a worse one and one whose query fails: the guard
// still rolls back the worse one, leaves the other active, and returns
// the failed check's error.
func TestGuardRollsBackDespiteAFailedCheck(t *testing.T) {
	ctx := context.Background()
	st, b := guardWorld(t)
	act := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, a := range []verifytest.Adapter{
		{Name: "bad", Capability: "multi_step_completion", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 45, PF: 40, NF: 5, LP: 2, PP: 13, NP: 5}},
		{Name: "unreadable", Capability: "precondition_verification", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 45, PF: 40, NF: 5, LP: 2, PP: 13, NP: 5}},
	} {
		if err := verifytest.Seed(ctx, st, a); err != nil {
			t.Fatal(err)
		}
	}
	g := verify.New(verify.Config{Guard: true}, failingLabels{Store: st, adapter: "unreadable"}, verify.StoreRollBack{Store: st}, b,
		slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	checks, err := g.Guard(ctx)
	if err == nil || !strings.Contains(err.Error(), "adapter unreadable") {
		t.Fatalf("guard error %v, want the unreadable adapter's", err)
	}
	if len(checks) != 1 || checks[0].Adapter != "bad" || checks[0].Verdict != verify.Worse || checks[0].Action != "rolled_back" {
		t.Fatalf("checks %+v", checks)
	}
	if a, err := st.Adapter(ctx, "bad"); err != nil || a.Status != "rolled_back" {
		t.Fatalf("bad after the guard: %+v %v", a, err)
	}
	if a, err := st.Adapter(ctx, "unreadable"); err != nil || a.Status != "active" {
		t.Fatalf("unreadable after the guard: %+v %v", a, err)
	}
	// The report shows what it could read and names what it could not:
	// the unreadable adapter, and a routing share that fails.
	rep, err := g.Report(ctx, 0, time.Hour, failingShares{})
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	if len(rep.Capabilities) != 1 || rep.Capabilities[0].Adapters[0].Adapter != "bad" {
		t.Fatalf("report capabilities %+v", rep.Capabilities)
	}
	if len(rep.Errors) != 2 || !strings.Contains(rep.Errors[0], "adapter unreadable") || !strings.Contains(rep.Errors[1], "routing share of sim-airline: no share") {
		t.Fatalf("report errors %q", rep.Errors)
	}
	// Nothing readable at all: the report is an error.
	if _, err := verify.New(verify.Config{}, failingLabels{Store: st, adapter: "*"}, nil, nil, nil).Report(ctx, 0, time.Hour); err == nil {
		t.Fatal("a report of no readable adapter is no error")
	}
}

// failingShares is a share source that always fails.
type failingShares struct{}

func (failingShares) RoutingShare(context.Context, string, time.Duration, time.Duration) ([]sink.ShareRow, error) {
	return nil, errors.New("no share")
}

// guardWorld is a ClickHouse store and a bus on an embedded NATS server,
// closed when the test ends.
func guardWorld(t *testing.T) (*sink.Store, *bus.Bus) {
	t.Helper()
	st := testenv.ClickHouse(t).Store()
	b, err := bus.Connect(context.Background(), bus.Config{URL: testenv.NATS(t).URL()}, "verify-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.NC.Close)
	return st, b
}

// routedV2 stores n rollouts routed to adapter that ended from start on,
// failed and labeled LACKING for capability by dictionary v2 alone (3
// runs): the stream's labels once a new dictionary version took over.
func routedV2(t *testing.T, st *sink.Store, adapter, capability string, start time.Time, n int) {
	t.Helper()
	routedFailures(t, st, adapter, capability, 2, 3, "test", start, n)
}

// routedFailures stores n rollouts routed to adapter that ended from start
// on, failed and labeled LACKING for capability by dictionary dv in runs
// 0..runs−1, from source.
func routedFailures(t *testing.T, st *sink.Store, adapter, capability string, dv uint32, runs int, source string, start time.Time, n int) {
	t.Helper()
	var rows []sink.RolloutRow
	var labels []sink.LabelRow
	for i := range n {
		id := fmt.Sprintf("%s-v%d-%dr-%04d", adapter, dv, runs, i)
		end := start.Add(time.Duration(i) * time.Second)
		rows = append(rows, sink.RolloutRow{RolloutID: id, Environment: "sim-airline", AgentName: "bot", AgentVersion: "1.4.0", TaskID: id,
			StartTime: end.Add(-time.Minute), EndTime: end, Messages: "[]", Tools: "[]", Grader: "{}", Metadata: "{}", Adapter: adapter})
		for run := range runs {
			labels = append(labels, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: id, Environment: "sim-airline", AgentVersion: "1.4.0",
				DictionaryVersion: dv, Capability: capability, Run: uint16(run), Label: "LACKING", Source: source, TS: end}})
		}
	}
	if err := st.InsertRollouts(context.Background(), rows); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertLabels(context.Background(), labels); err != nil {
		t.Fatal(err)
	}
}

// TestGuardAcrossANewDictionary: real ClickHouse and embedded NATS. A new
// dictionary version (discovery's, or trace dict apply without
// --backfill) labels the stream from then on, not the rollouts before
// activation. The comparison on its labels has no before side; the older
// version's labels still decide, so a worse adapter is still rolled back,
// and the reason says which dictionary decided. An adapter neither version
// can decide reports the newest's reason and the relabel that fixes it.
func TestGuardAcrossANewDictionary(t *testing.T) {
	ctx := context.Background()
	st, b := guardWorld(t)
	act := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, a := range []verifytest.Adapter{
		{Name: "bad", Capability: "multi_step_completion", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 45, PF: 40, NF: 5, LP: 2, PP: 13, NP: 5}},
		{Name: "young", Capability: "precondition_verification", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 3, PF: 2, PP: 10}},
	} {
		if err := verifytest.Seed(ctx, st, a); err != nil {
			t.Fatal(err)
		}
	}
	routedV2(t, st, "bad", "multi_step_completion", act.Add(2*time.Hour), 30)
	routedV2(t, st, "young", "precondition_verification", act.Add(2*time.Hour), 30)

	g := verify.New(verify.Config{Guard: true}, st, verify.StoreRollBack{Store: st}, b, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	checks, err := g.Guard(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]verify.AdapterCheck{}
	for _, c := range checks {
		got[c.Adapter] = c
	}
	if c := got["bad"]; c.Verdict != verify.Worse || c.Action != "rolled_back" || c.DictionaryVersion != 1 ||
		!strings.Contains(c.Reason, "with dictionary v1's labels; v2, the newest labeling multi_step_completion, cannot decide yet: 0 labeled failures that need the capability before activation") {
		t.Fatalf("bad: %s (%s), action %q, dictionary v%d", c.Verdict, c.Reason, c.Action, c.DictionaryVersion)
	}
	if c := got["young"]; c.Verdict != verify.NotEnoughData || c.DictionaryVersion != 2 ||
		!strings.Contains(c.Reason, "no rollout before activation is labeled with dictionary v2") ||
		!strings.Contains(c.Reason, "trace relabel --env sim-airline --agent-version 1.4.0") {
		t.Fatalf("young: %s (%s), dictionary v%d", c.Verdict, c.Reason, c.DictionaryVersion)
	}
	if a, err := st.Adapter(ctx, "bad"); err != nil || a.Status != "rolled_back" {
		t.Fatalf("bad after the guard: %+v %v", a, err)
	}
}

// TestGuardAfterLLMRunsLowered: real ClickHouse and embedded NATS. An
// adapter activated while llm.runs was 10, whose routed rollouts have since
// been labeled in 3 runs (llm.runs lowered to cut the labeler's cost): the
// selection counts runs 0..2 of every rollout (N = 3), and so does the
// closed loop with the selection's rule, so the harm in the newer rollouts
// is seen and the adapter rolled back. Without the rule (N = the most runs
// a rollout has, 10) the 3-run rollouts were left out as incomplete and
// the verdict rested on the older ones alone.
func TestGuardAfterLLMRunsLowered(t *testing.T) {
	ctx := context.Background()
	st, b := guardWorld(t)
	act := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	if err := verifytest.Seed(ctx, st, verifytest.Adapter{Name: "ad", Capability: "multi_step_completion", Environment: "sim-airline",
		AgentVersion: "1.4.0", ActivatedAt: act, Source: schemas.SourceLLM, Runs: 10,
		Before: gap, After: verifytest.Mix{LF: 2, PF: 28, NF: 5, LP: 2, PP: 60, NP: 3}}); err != nil {
		t.Fatal(err)
	}
	routedFailures(t, st, "ad", "multi_step_completion", 1, 3, schemas.SourceLLM, act.Add(2*time.Hour), 300)

	old := verify.New(verify.Config{}, st, nil, nil, nil)
	checks, err := old.Check(ctx)
	if err != nil || len(checks) != 1 {
		t.Fatalf("%v %v", checks, err)
	}
	if c := checks[0]; c.After.Runs != 10 || c.After.Incomplete != 300 || c.Verdict == verify.Worse {
		t.Fatalf("without the selection's rule: %s (%s), after %+v", c.Verdict, c.Reason, c.After)
	}

	sel := analyzer.EvalConfig{LLMRuns: 3}.WithDefaults()
	g := verify.New(verify.Config{Guard: true, Selection: &sel}, st, verify.StoreRollBack{Store: st}, b, nil)
	checks, err = g.Guard(ctx)
	if err != nil || len(checks) != 1 {
		t.Fatalf("%v %v", checks, err)
	}
	if c := checks[0]; c.After.Runs != 3 || c.After.Incomplete != 0 || c.After.Rollouts != 400 || c.Verdict != verify.Worse || c.Action != "rolled_back" {
		t.Fatalf("with the selection's N: %s (%s), action %q, after %+v", c.Verdict, c.Reason, c.Action, c.After)
	}
}

// TestBeforeSideEndsAtTheCapabilitysFirstAdapter: real ClickHouse. While
// an adapter serves a capability the router sends it the conversations
// that need the capability, so the base model's rollouts of that time are
// the others (here all NA). The adapter that replaces it is compared with
// the base model's rollouts before the first adapter was activated, not
// with those: the verdict is decided, and says where the before side ends.
func TestBeforeSideEndsAtTheCapabilitysFirstAdapter(t *testing.T) {
	ctx := context.Background()
	st, _ := guardWorld(t)
	t1 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	t2 := t1.Add(3 * time.Hour)
	for _, a := range []verifytest.Adapter{
		{Name: "first", Capability: "precondition_verification", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: t1,
			Before: gap, After: gap},
		// Its before side: the base model's rollouts while "first" served
		// the capability, none of them needing it.
		{Name: "second", Capability: "precondition_verification", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: t2,
			Before: verifytest.Mix{NF: 60, NP: 60}, After: verifytest.Mix{LF: 2, PF: 28, NF: 5, LP: 2, PP: 60, NP: 3}},
	} {
		if err := verifytest.Seed(ctx, st, a); err != nil {
			t.Fatal(err)
		}
	}
	// "first" was retired when "second" was activated; the registry's
	// history says when it had been active.
	ads, err := st.Adapters(ctx, sink.AdapterFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range ads {
		if a.Name == "first" {
			a.Status, a.UpdatedAt, a.Version = "retired", t2, uint64(t2.UnixNano())
			a.Metadata = fmt.Sprintf(`{"transitions":[{"to":"active","at":%q},{"to":"retired","at":%q}]}`, t1.Format(time.RFC3339), t2.Format(time.RFC3339))
			if err := st.SaveAdapter(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The 100 most recent base rollouts before t2 are the 120 NA ones.
	checks, err := verify.New(verify.Config{SampleLimit: 100}, st, nil, nil, nil).Check(ctx)
	if err != nil || len(checks) != 1 {
		t.Fatalf("%+v %v", checks, err)
	}
	c := checks[0]
	if c.Adapter != "second" || !c.ActivatedAt.Equal(t2) || !c.BeforeUntil.Equal(t1) || c.BaselineAdapter != "first" {
		t.Fatalf("%s activated %s, before until %s (baseline %q); want second, %s, %s, first", c.Adapter, c.ActivatedAt, c.BeforeUntil, c.BaselineAdapter, t2, t1)
	}
	if c.Verdict != verify.GapClosed || c.Before.NeededFailures < 20 || !c.Before.To.Before(t1) {
		t.Fatalf("%s (%s); before %+v", c.Verdict, c.Reason, c.Before)
	}
	if n := c.BeforeNote(func(t time.Time) string { return t.Format(time.RFC3339) }); n != "until 2026-12-01T12:00:00Z, when first, the capability's first adapter, was activated" {
		t.Fatalf("note %q", n)
	}
}

// TestGuardWatchCatchesALateHarm: real ClickHouse and NATS. An adapter
// that did well through its looks is not rolled back; once its rollouts in
// the last complete watch block turn bad, it is, with the block's evidence.
func TestGuardWatchCatchesALateHarm(t *testing.T) {
	ctx := context.Background()
	st, b := guardWorld(t)
	// Activated two hours ago: the looks' rollouts end minutes after it,
	// so the first watch block (an hour long) is complete now.
	act := time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Second)
	a := verifytest.Adapter{Name: "late", Capability: "precondition_verification", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
		Before: gap, After: verifytest.Mix{LF: 2, PF: 28, NF: 5, LP: 2, PP: 60, NP: 3}}
	if err := verifytest.Seed(ctx, st, a); err != nil {
		t.Fatal(err)
	}
	cfg := verify.Config{Guard: true, GuardLooks: 2}
	c := verify.New(cfg, st, verify.StoreRollBack{Store: st}, b, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	checks, err := c.Guard(ctx)
	if err != nil || len(checks) != 1 {
		t.Fatalf("%d checks, %v", len(checks), err)
	}
	g := checks[0].Guard
	if g.RollBack() || g.Look != 2 || g.LooksEnd.IsZero() || g.Watch == nil || g.Watch.Block != 1 || g.Watch.Worse ||
		!strings.Contains(g.Watch.Reason, "not_enough_data") && !strings.Contains(g.Watch.Reason, "labeled failures") {
		t.Fatalf("before the harm: %+v; watch %+v", g, g.Watch)
	}
	if from := g.LooksEnd.Truncate(time.Second).Add(time.Second); !g.Watch.From.Equal(from) || g.Watch.To.Sub(from) != time.Hour {
		t.Fatalf("watch block [%v, %v), want from %v, an hour long", g.Watch.From, g.Watch.To, from)
	}
	looked := g.Comparison.After.Rollouts // the looks' rollouts; the rest of the 100 ended in the block
	// Its rollouts in the block turn bad.
	if err := verifytest.SeedRouted(ctx, st, a, "later", verifytest.Mix{LF: 45, PF: 40, NF: 5, LP: 2, PP: 13, NP: 5}, g.Watch.From.Add(10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	checks, err = c.Guard(ctx)
	if err != nil || len(checks) != 1 {
		t.Fatalf("%d checks, %v", len(checks), err)
	}
	g = checks[0].Guard
	if !g.RollBack() || g.Worse || g.Watch == nil || !g.Watch.Worse || checks[0].Action != "rolled_back" ||
		!strings.Contains(g.RollBackReason(), "pass rate fell") || !strings.Contains(g.RollBackReason(), "watch block 1") {
		t.Fatalf("after the harm: %+v; watch %+v; action %q", g, g.Watch, checks[0].Action)
	}
	if ad, err := st.Adapter(ctx, "late"); err != nil || ad.Status != "rolled_back" {
		t.Fatalf("registry: %+v %v", ad, err)
	}
	if ev := g.Evidence(); ev == nil || ev.Level != g.Watch.Level || ev.After.Rollouts != 100-looked+110 {
		t.Fatalf("evidence %+v, want the block's %d rollouts at its level %v", ev, 100-looked+110, g.Watch.Level)
	}
}
