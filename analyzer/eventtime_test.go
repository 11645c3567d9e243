package analyzer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// eventTimeRun labels rollouts with the rules labeler and the default
// dictionary, writes the labels in batches in the given order, evaluates the
// touched cohorts after every batch as the stream does, and returns the
// final evaluation, the window of each cohort and the capabilities fired.
type eventTimeRun struct {
	results map[sink.Cohort][]analyzer.Result
	infos   map[sink.Cohort]sink.WindowInfo
	marks   map[sink.Cohort]time.Time
	fired   []string
}

var eventTimeCfg = analyzer.EvalConfig{Rho: 0.10, Delta: 0.20, K: 1, N: 1, Window: 24 * time.Hour, MinFailures: 20}

func runEventTime(t *testing.T, rollouts []*schemas.Rollout, batch int) eventTimeRun {
	t.Helper()
	ctx := context.Background()
	st, b := storeAndBus(t)
	reg := builtinRegistry(t)
	lab := analyzer.NewRulesLabeler(analyzer.RulesOptions{})
	ev := analyzer.NewEvaluator(eventTimeCfg, st, app.BusPublisher{Bus: b}, reg, nil, nil)
	for i := 0; i < len(rollouts); i += batch {
		var rows []sink.LabelRow
		touched := map[sink.Cohort]bool{}
		for _, r := range rollouts[i:min(i+batch, len(rollouts))] {
			d := reg.Resolve(r.Environment, r.Agent.Version)
			runs, err := lab.Label(ctx, d, r)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range analyzer.Events(d, r, "rules", runs) {
				rows = append(rows, sink.LabelRowFrom(&e))
			}
			touched[sink.Cohort{Environment: r.Environment, AgentVersion: r.Agent.Version, DictionaryVersion: d.Version}] = true
		}
		if err := st.InsertLabels(ctx, rows); err != nil {
			t.Fatal(err)
		}
		var cs []sink.Cohort
		for c := range touched {
			cs = append(cs, c)
		}
		if err := ev.Evaluate(ctx, cs...); err != nil {
			t.Fatal(err)
		}
	}
	out := eventTimeRun{results: ev.Snapshot(), infos: map[sink.Cohort]sink.WindowInfo{}}
	var cohorts []sink.Cohort
	for c := range out.results {
		cohorts = append(cohorts, c)
	}
	spec, marks, err := st.EventSpec(ctx, cohorts, eventTimeCfg.Window, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	out.marks = marks
	if out.infos, err = st.WindowInfoMulti(ctx, spec); err != nil {
		t.Fatal(err)
	}
	hist, err := st.TriggerHistory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hist {
		if h.Event == string(analyzer.ActFire) {
			out.fired = append(out.fired, fmt.Sprintf("%s/%s %s epoch %d", h.Environment, h.AgentVersion, h.Capability, h.Epoch))
		}
	}
	sort.Strings(out.fired)
	return out
}

// storeAndBus is a store on a test database and a connection to a
// test NATS server.
// builtinRegistry is a registry of the built-in dictionaries.
func builtinRegistry(t *testing.T) *analyzer.Registry {
	t.Helper()
	reg := analyzer.NewRegistry()
	ds, err := analyzer.BuiltinDictionaries()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		reg.Put(d)
	}
	return reg
}

func storeAndBus(t *testing.T) (*sink.Store, *bus.Bus) {
	t.Helper()
	st := testenv.ClickHouse(t).Store()
	b, err := bus.Connect(context.Background(), bus.Config{URL: testenv.NATS(t).URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return st, b
}

func simulated(start time.Time, n int) []*schemas.Rollout {
	g := simulate.New(simulate.Config{Seed: 7, Rollouts: n, Start: start, Interval: 45 * time.Second})
	var out []*schemas.Rollout
	for r := range g.All() {
		out = append(out, r)
	}
	return out
}

// TestWindowsFollowEventTime: a cohort's window ends at its watermark, not
// at the wall clock. The same fleet replayed with its original 2025
// timestamps and shifted to end now decides the same; arriving shuffled
// (late rollouts inside the window, and rollouts older than the window
// after the watermark passed them) gives the same statistics as in order;
// rollouts older than the window do not count.
func TestWindowsFollowEventTime(t *testing.T) {
	const n = 2400 // 45 s apart: 30 hours, so the first 6 are outside a 24 h window
	orig := simulated(time.Date(2025, 6, 2, 9, 0, 0, 0, time.UTC), n)
	last := orig[0].EndTime
	for _, r := range orig {
		if r.EndTime.After(last) {
			last = r.EndTime
		}
	}
	shift := time.Now().UTC().Truncate(time.Second).Sub(last.Truncate(time.Second)) // whole seconds, as stored
	shifted := simulated(time.Date(2025, 6, 2, 9, 0, 0, 0, time.UTC), n)
	for _, r := range shifted {
		r.StartTime, r.EndTime = r.StartTime.Add(shift), r.EndTime.Add(shift)
	}
	shuffled := simulated(time.Date(2025, 6, 2, 9, 0, 0, 0, time.UTC), n)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })

	a := runEventTime(t, orig, 200)
	b := runEventTime(t, shifted, 200)
	c := runEventTime(t, shuffled, 200)

	// 2025 data decides: the planted deficits fire although every rollout
	// ended more than a window before the wall clock.
	if len(a.fired) == 0 {
		t.Fatal("no trigger fired on the 2025 timestamps")
	}
	t.Logf("fired: %v", a.fired)
	if !reflect.DeepEqual(a.fired, b.fired) {
		t.Errorf("fired with 2025 timestamps %v, shifted to now %v", a.fired, b.fired)
	}
	if !reflect.DeepEqual(a.results, b.results) {
		t.Errorf("statistics differ between 2025 timestamps and shifted to now:\n%v\n%v", a.results, b.results)
	}
	if !reflect.DeepEqual(a.results, c.results) {
		t.Errorf("statistics differ between in-order and shuffled arrival:\n%v\n%v", a.results, c.results)
	}
	if !reflect.DeepEqual(a.infos, c.infos) {
		t.Errorf("windows differ between in-order and shuffled arrival: %v vs %v", a.infos, c.infos)
	}
	// Each cohort's window holds exactly its rollouts that ended within 24 h
	// of its own newest one; the older ones are out.
	for coh, info := range a.infos {
		wm := a.marks[coh]
		want, failures, all := 0, 0, 0
		for _, r := range orig {
			if r.Environment != coh.Environment || r.Agent.Version != coh.AgentVersion {
				continue
			}
			all++
			if end := r.EndTime.Truncate(time.Second); !end.Before(wm.Add(-eventTimeCfg.Window)) {
				want++
				if !r.Succeeded() {
					failures++
				}
			}
		}
		if info.Rollouts != want || info.Failures != failures || want >= all {
			t.Errorf("%s: window has %d rollouts (%d failed), want %d (%d failed) of %d", coh, info.Rollouts, info.Failures, want, failures, all)
		}
		if d := b.marks[sink.Cohort(coh)].Sub(wm); d != shift {
			t.Errorf("%s: watermark moved by %s, want %s", coh, d, shift)
		}
	}
}

// TestLabelingSinkTimeFromTheMessage: a rollout without end_time is
// labeled at its start_time, else at its Kafka message's timestamp, the
// time the ingest stage stores it at, so its labels and its row share an
// hour.
func TestLabelingSinkTimeFromTheMessage(t *testing.T) {
	ctx := context.Background()
	st, _ := storeAndBus(t)
	reg := builtinRegistry(t)
	r := simulated(time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC), 1)[0]
	r.StartTime, r.EndTime = time.Time{}, time.Time{}
	msgTime := time.Date(2026, 11, 3, 4, 5, 6, 0, time.UTC)
	s := &analyzer.LabelingSink{Labeler: analyzer.NewRulesLabeler(analyzer.RulesOptions{}), Registry: reg, Store: st}
	if err := s.Write(ctx, []stream.Record[*schemas.Rollout]{{Value: r, Topic: "t", Time: msgTime}}); err != nil {
		t.Fatal(err)
	}
	var n uint64
	var at uint32
	if err := testenv.StoreConn(t, st).QueryRow(ctx, "SELECT count(), max(toUnixTimestamp(ts)) FROM capability_labels WHERE rollout_id = ?", r.RolloutID).Scan(&n, &at); err != nil {
		t.Fatal(err)
	}
	if n == 0 || int64(at) != msgTime.Unix() {
		t.Fatalf("%d labels at %d, want labels at the message's timestamp %d", n, at, msgTime.Unix())
	}

	// With a start time of its own, the rollout is labeled at it, as the
	// ingest stage stores it (a replay of history sent today).
	r2 := simulated(time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC), 2)[1]
	r2.EndTime = time.Time{}
	if r2.StartTime.IsZero() {
		t.Fatal("the simulated rollout has no start time")
	}
	if err := s.Write(ctx, []stream.Record[*schemas.Rollout]{{Value: r2, Topic: "t", Offset: 1, Time: msgTime}}); err != nil {
		t.Fatal(err)
	}
	if err := testenv.StoreConn(t, st).QueryRow(ctx, "SELECT count(), max(toUnixTimestamp(ts)) FROM capability_labels WHERE rollout_id = ?", r2.RolloutID).Scan(&n, &at); err != nil {
		t.Fatal(err)
	}
	if n == 0 || int64(at) != r2.StartTime.Unix() {
		t.Fatalf("%d labels at %d, want labels at the rollout's start time %d", n, at, r2.StartTime.Unix())
	}
}

// TestRulesSinkDictionaryWithoutDetectors: with the rules labeler, a
// cohort whose dictionary has no detectors (a discovered or imported one)
// gets a failed run naming the capability, and the rest of the batch is
// labeled; the batch is not an error the stream retries forever.
func TestRulesSinkDictionaryWithoutDetectors(t *testing.T) {
	ctx := context.Background()
	st, _ := storeAndBus(t)
	reg := builtinRegistry(t)
	rs := simulated(time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC), 40)
	own := rs[0]
	var other *schemas.Rollout
	for _, r := range rs {
		if r.Environment != own.Environment {
			other = r
			break
		}
	}
	if other == nil {
		t.Fatal("the simulated fleet has one environment")
	}
	reg.Put(&analyzer.Dictionary{Environment: own.Environment, AgentVersion: analyzer.AnyVersion, Version: 2, Source: "discovery",
		Capabilities: []analyzer.Capability{{Name: "policy_constraint_enforcement", Definition: "Refuses actions the policy forbids. Explains why."}}})
	s := &analyzer.LabelingSink{Labeler: analyzer.NewRulesLabeler(analyzer.RulesOptions{}), Registry: reg, Store: st}
	if err := s.Write(ctx, []stream.Record[*schemas.Rollout]{{Value: own}, {Value: other}}); err != nil {
		t.Fatalf("a dictionary without detectors failed the batch: %v", err)
	}
	var labeled uint64
	if err := testenv.StoreConn(t, st).QueryRow(ctx, "SELECT uniqExact(rollout_id) FROM capability_labels").Scan(&labeled); err != nil {
		t.Fatal(err)
	}
	if labeled != 1 {
		t.Errorf("%d rollouts labeled, want 1 (the one whose dictionary has detectors)", labeled)
	}
	failed, err := st.FailedLabelRuns(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(failed) != 1 || failed[0].Environment != own.Environment || failed[0].DictionaryVersion != 2 || failed[0].Runs != 1 ||
		!strings.Contains(failed[0].Reason, "policy_constraint_enforcement") || !strings.Contains(failed[0].Reason, "no detector") {
		t.Errorf("failed runs %+v, want one for %s v2 naming the capability without a detector", failed, own.Environment)
	}
}
