package dashboard

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// The demo data: environment "airline" with agent versions v1 (20 days,
// 300 rollouts) and v2 (5 days, 320 rollouts), labeled in 10 runs against a
// 4-capability dictionary, and environment "retail" with unlabeled
// rollouts. The planted pattern: multi_step_transaction_completion is
// LACKING on most failures and almost never on successes (selected);
// policy_rule_adherence is LACKING as often on successes as on failures
// (Δ ≈ 0); user_intent_clarification is rarely needed (Cov < ρ);
// tool_argument_formatting sits near δ.

const (
	capMulti  = "multi_step_transaction_completion"
	capPolicy = "policy_rule_adherence"
	capIntent = "user_intent_clarification"
	capArgs   = "tool_argument_formatting"
	demoRuns  = 10
)

var demoDict = &analyzer.Dictionary{
	Environment: "airline", AgentVersion: analyzer.AnyVersion, Version: 1, Source: "file",
	Capabilities: []analyzer.Capability{
		{Name: capMulti, Definition: "Completes every step of a multi-step transaction (lookup, change, payment, confirmation) before ending the conversation."},
		{Name: capPolicy, Definition: "Applies the domain policy rules (eligibility, fees, cancellation windows) before acting on a request."},
		{Name: capIntent, Definition: "Asks a clarifying question when the user's request is ambiguous instead of guessing."},
		{Name: capArgs, Definition: "Passes tool arguments with the exact names, types and formats the tool schema requires."},
	},
}

// probabilities of LACKING, PRESENT (rest NA) on failures and on successes.
type labelProbs struct{ lf, pf, lp, pp float64 }

var demoProbs = map[string]map[string]labelProbs{
	"v1": {
		capMulti:  {0.75, 0.20, 0.03, 0.90},
		capPolicy: {0.25, 0.60, 0.22, 0.60},
		capIntent: {0.05, 0.25, 0.00, 0.30},
		capArgs:   {0.30, 0.50, 0.12, 0.70},
	},
	"v2": {
		capMulti:  {0.55, 0.40, 0.03, 0.90},
		capPolicy: {0.25, 0.60, 0.22, 0.60},
		capIntent: {0.05, 0.25, 0.00, 0.30},
		capArgs:   {0.20, 0.60, 0.12, 0.70},
	},
}

type labelKey struct {
	env, av string
	cap     string
	run     uint16
	id      string
}

type finalLabel struct {
	label   string
	success bool
	ts      time.Time
}

type demo struct {
	now      time.Time
	loc      *time.Location
	rollouts map[string]sink.RolloutRow // by id
	labels   map[labelKey]finalLabel
	triggers []sink.TriggerEvent
}

func openStore(t *testing.T) *sink.Store {
	t.Helper()
	ch := testenv.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := sink.Open(ctx, sink.Config{Addr: []string{ch.Addr}, Database: ch.Database}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

func conversation(id string, ok bool) []schemas.Message {
	msgs := []schemas.Message{
		{Role: "system", Content: "You are an airline customer service agent. Follow the policy: verify the user, confirm every change before acting, and collect payment for fees."},
		{Role: "user", Content: "Hi! I need to move my reservation " + id + " to next Friday and add one checked bag."},
		{Role: "assistant", ToolCalls: []schemas.ToolCall{{ID: "call_1", Name: "get_reservation_details", Arguments: map[string]any{"reservation_id": id}}}},
		{Role: "tool", ToolCallID: "call_1", Content: `{"reservation_id":"` + id + `","origin":"SFO","destination":"JFK","cabin":"economy","bags":0}`},
		{Role: "assistant", Content: "I found your reservation SFO → JFK. The new flight on Friday costs $40 more. Shall I proceed?"},
		{Role: "user", Content: "Yes, please go ahead, use my card on file."},
		{Role: "assistant", ToolCalls: []schemas.ToolCall{{ID: "call_2", Name: "update_reservation_flights", Arguments: map[string]any{"reservation_id": id, "date": "2026-12-04", "payment_id": "credit_card_7"}}}},
	}
	if ok {
		msgs = append(msgs,
			schemas.Message{Role: "tool", ToolCallID: "call_2", Content: `{"status":"ok"}`},
			schemas.Message{Role: "assistant", ToolCalls: []schemas.ToolCall{{ID: "call_3", Name: "update_reservation_baggages", Arguments: map[string]any{"reservation_id": id, "total_baggages": 1, "payment_id": "credit_card_7"}}}},
			schemas.Message{Role: "tool", ToolCallID: "call_3", Content: `{"status":"ok"}`},
			schemas.Message{Role: "assistant", Content: "Done: you fly on Friday and have one checked bag."})
	} else {
		msgs = append(msgs,
			schemas.Message{Role: "tool", ToolCallID: "call_2", Content: "Error: payment method credit_card_7 not found", Error: true},
			schemas.Message{Role: "assistant", Content: "Your flight has been changed to Friday and your bag is added. Anything else?"},
			schemas.Message{Role: "user", Content: "No, thanks! ###STOP###"})
	}
	return msgs
}

var demoTools = []schemas.Tool{
	{Type: "function", Function: schemas.FunctionDef{Name: "get_reservation_details", Description: "Get a reservation."}},
	{Type: "function", Function: schemas.FunctionDef{Name: "update_reservation_flights", Description: "Change flights."}},
	{Type: "function", Function: schemas.FunctionDef{Name: "update_reservation_baggages", Description: "Change bags."}},
}

func pick(r *rand.Rand, p labelProbs, ok bool) string {
	l, pr := p.lf, p.pf
	if ok {
		l, pr = p.lp, p.pp
	}
	x := r.Float64()
	switch {
	case x < l:
		return schemas.LabelLacking
	case x < l+pr:
		return schemas.LabelPresent
	}
	return schemas.LabelNA
}

// seedDemo writes the demo data through the sink and returns what it wrote.
func seedDemo(t *testing.T, st *sink.Store, now time.Time) *demo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := &demo{now: now, loc: time.UTC, rollouts: map[string]sink.RolloutRow{}, labels: map[labelKey]finalLabel{}}
	var tz string
	if err := testenv.StoreConn(t, st).QueryRow(ctx, "SELECT timezone()").Scan(&tz); err == nil {
		if loc, err := time.LoadLocation(tz); err == nil {
			d.loc = loc
		}
	}
	r := rand.New(rand.NewPCG(7, 11))
	var rows []sink.RolloutRow
	var labels []sink.LabelRow
	type cohort struct {
		env, av string
		n       int
		days    float64
		pass    float64
		labeled bool
	}
	for _, c := range []cohort{{"airline", "v1", 300, 20, 0.40, true}, {"airline", "v2", 320, 5, 0.60, true}, {"retail", "v1", 30, 3, 0.5, false}} {
		for i := 0; i < c.n; i++ {
			id := fmt.Sprintf("%s:%s:%03d", c.env, c.av, i)
			ok := r.Float64() < c.pass
			end := now.Add(-time.Duration((0.01 + r.Float64()*c.days) * float64(24*time.Hour))).Truncate(time.Second)
			reward := 1.0
			if !ok {
				reward = math.Round(r.Float64()*50) / 100
			}
			ro := &schemas.Rollout{RolloutID: id, Environment: c.env, Agent: schemas.Agent{Name: "qwen3-agent", Version: c.av},
				TaskID: fmt.Sprintf("task_%d", i%37), StartTime: end.Add(-3 * time.Minute), EndTime: end,
				Outcome: schemas.Outcome{Reward: reward}, Messages: conversation(id, ok), Tools: demoTools}
			if !ok {
				ro.Grader = &schemas.Grader{Reasons: []string{"expected action update_reservation_baggages was not taken"}, Breakdown: map[string]float64{"actions": reward}}
			}
			row := sink.RolloutRowFrom(ro, sink.Coord{Topic: "rollouts", Partition: 0, Offset: int64(i)})
			rows = append(rows, row)
			d.rollouts[id] = row
			if !c.labeled {
				continue
			}
			for _, capName := range demoDict.Names() {
				for run := uint16(0); run < demoRuns; run++ {
					l := pick(r, demoProbs[c.av][capName], ok)
					labels = append(labels, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: id, Environment: c.env, AgentVersion: c.av,
						DictionaryVersion: 1, Capability: capName, Run: run, Label: l, Success: ok, Reward: reward, Source: schemas.SourceLLM, TS: end}})
					d.labels[labelKey{c.env, c.av, capName, run, id}] = finalLabel{l, ok, end}
				}
			}
		}
	}
	if err := st.InsertRollouts(ctx, rows); err != nil {
		t.Fatal(err)
	}
	// Redelivery: the same rollouts again must not count twice.
	if err := st.InsertRollouts(ctx, rows[:25]); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertLabels(ctx, labels); err != nil {
		t.Fatal(err)
	}
	// A relabel (newer ingest_ns) wins: flip 40 labels of one run.
	var again []sink.LabelRow
	for _, l := range labels {
		if l.AgentVersion == "v2" && l.Capability == capPolicy && l.Run == 3 && len(again) < 40 {
			switch l.Label {
			case schemas.LabelLacking:
				l.Label = schemas.LabelPresent
			default:
				l.Label = schemas.LabelLacking
			}
			again = append(again, l)
			d.labels[labelKey{l.Environment, l.AgentVersion, l.Capability, l.Run, l.RolloutID}] = finalLabel{l.Label, l.Success, l.TS}
		}
	}
	time.Sleep(5 * time.Millisecond)
	if err := st.InsertLabels(ctx, again); err != nil {
		t.Fatal(err)
	}
	if err := st.SaveDictionary(ctx, analyzer.DictionaryRow(demoDict)); err != nil {
		t.Fatal(err)
	}
	payload := fmt.Sprintf(`{"trigger_id":"t-v1-2","environment":"airline","agent_version":"v1","dictionary_version":1,"epoch":2,`+
		`"capability":{"skill":%q,"description":"Completes every step.","mean_cov":0.71,"std_cov":0.02,"mean_delta":0.78,"std_delta":0.03,`+
		`"n_runs_passed":10,"n_runs_total":10,"passes_consistency":true,"example_failed_cases":["airline:v1:001"],"status":"PENDING"},"rank":1,`+
		`"window":{"start":"2026-01-01T00:00:00Z","end":"2026-01-02T00:00:00Z","rollouts":240,"failures":140},`+
		`"example_failed_rollout_ids":["airline:v1:001","airline:v1:002"],"tools":[{"type":"function","function":{"name":"get_reservation_details"}}],"fired_at":"2026-01-02T00:00:00Z"}`, capMulti)
	h := func(n int) time.Time { return now.Add(-time.Duration(n) * time.Hour).Truncate(time.Second) }
	w := schemas.Window{Start: h(24 * 8), End: h(24 * 5), Rollouts: 120, Failures: 70}
	d.triggers = []sink.TriggerEvent{
		{TriggerID: "t-v1-1", Environment: "airline", AgentVersion: "v1", DictionaryVersion: 1, Capability: capMulti, Epoch: 1, Event: "fired", At: h(24 * 5),
			MeanCov: 0.70, MeanDelta: 0.77, RunsPassed: 10, RunsTotal: 10, Window: w, Payload: payload},
		{TriggerID: "t-v1-1", Environment: "airline", AgentVersion: "v1", DictionaryVersion: 1, Capability: capMulti, Epoch: 1, Event: "deselected", At: h(24 * 3),
			MeanCov: 0.40, MeanDelta: 0.15, RunsPassed: 3, RunsTotal: 10, Window: w},
		{TriggerID: "t-v1-1", Environment: "airline", AgentVersion: "v1", DictionaryVersion: 1, Capability: capMulti, Epoch: 1, Event: "rearmed", At: h(24*3 - 2),
			MeanCov: 0.41, MeanDelta: 0.16, RunsPassed: 3, RunsTotal: 10, Window: w},
		{TriggerID: "t-v1-2", Environment: "airline", AgentVersion: "v1", DictionaryVersion: 1, Capability: capMulti, Epoch: 2, Event: "fired", At: h(20),
			MeanCov: 0.71, MeanDelta: 0.78, RunsPassed: 10, RunsTotal: 10, Window: w, Payload: payload},
		{TriggerID: "t-v1-a", Environment: "airline", AgentVersion: "v1", DictionaryVersion: 1, Capability: capArgs, Epoch: 1, Event: "fired", At: h(24 * 4),
			MeanCov: 0.31, MeanDelta: 0.24, RunsPassed: 8, RunsTotal: 10, Window: w, Payload: payload},
	}
	if err := st.InsertTriggerEvents(ctx, d.triggers); err != nil {
		t.Fatal(err)
	}
	return d
}

// --- expectations, computed from what was written, independently of the SQL ---

type runCounts struct{ lf, pf, nf, lp, pp, np int }

func (c runCounts) stats() (cov, delta float64) {
	div := func(a, b int) float64 {
		if b == 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	return div(c.lf, c.lf+c.pf+c.nf), div(c.lf, c.lf+c.pf) - div(c.lp, c.lp+c.pp)
}

func (c *runCounts) add(f finalLabel) {
	switch {
	case !f.success && f.label == schemas.LabelLacking:
		c.lf++
	case !f.success && f.label == schemas.LabelPresent:
		c.pf++
	case !f.success:
		c.nf++
	case f.label == schemas.LabelLacking:
		c.lp++
	case f.label == schemas.LabelPresent:
		c.pp++
	default:
		c.np++
	}
}

// counts per run of one capability of a cohort, over labels with ts >= since.
func (d *demo) counts(env, av, capName string, since time.Time) map[uint16]runCounts {
	out := map[uint16]runCounts{}
	for k, f := range d.labels {
		if k.env != env || k.av != av || k.cap != capName || f.ts.Before(since) {
			continue
		}
		c := out[k.run]
		c.add(f)
		out[k.run] = c
	}
	return out
}

type expCap struct {
	meanCov, meanDelta float64
	runsPassed, runs   int
}

func (d *demo) expectCap(env, av, capName string, since time.Time, rho, delta float64) expCap {
	var e expCap
	cs := d.counts(env, av, capName, since)
	for _, c := range cs {
		cov, dl := c.stats()
		e.meanCov += cov
		e.meanDelta += dl
		if cov >= rho && dl >= delta {
			e.runsPassed++
		}
		e.runs++
	}
	if e.runs > 0 {
		e.meanCov /= float64(e.runs)
		e.meanDelta /= float64(e.runs)
	}
	return e
}

// hour is the start of t's hour in the server's time zone, as
// toStartOfHour: t less its local minutes and seconds. (Rebuilding it from
// the wall clock with time.Date is ambiguous in the hour that repeats when
// daylight saving time ends: Go picks one of the two, and ClickHouse has
// both, 01:00 EDT and 01:00 EST.)
func (d *demo) hour(t time.Time) int64 {
	l := t.In(d.loc)
	return l.Add(-time.Duration(l.Minute())*time.Minute - time.Duration(l.Second())*time.Second - time.Duration(l.Nanosecond())).Unix()
}

func (d *demo) day(t time.Time) int64 {
	l := t.In(d.loc)
	return time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, d.loc).Unix()
}

func (d *demo) monday(t time.Time) string {
	l := t.In(d.loc)
	day := time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, time.UTC)
	for day.Weekday() != time.Monday {
		day = day.AddDate(0, 0, -1)
	}
	return day.Format("2006-01-02")
}

// newest is the end of an environment's newest rollout (its labels carry
// the same time): the trends page's "this week" is its week.
func (d *demo) newest(env string) time.Time {
	var t time.Time
	for _, r := range d.rollouts {
		if r.Environment == env && r.EndTime.After(t) {
			t = r.EndTime
		}
	}
	return t
}

// pass rate of a cohort per bucket: bucket start (Unix) → [rollouts,
// successes], over the rollouts whose hour starts at or after since (the
// rollout_counts aggregate is hourly).
func (d *demo) passBuckets(env, av string, since time.Time, bucket func(time.Time) int64) map[int64][2]uint64 {
	out := map[int64][2]uint64{}
	for _, r := range d.rollouts {
		if r.Environment != env || r.AgentVersion != av || d.hour(r.EndTime) < since.Unix() {
			continue
		}
		b := bucket(r.EndTime)
		v := out[b]
		v[0]++
		if r.Success {
			v[1]++
		}
		out[b] = v
	}
	return out
}

// capBuckets: bucket → mean Cov, mean Δ over the runs with labels in it.
func (d *demo) capBuckets(env, av, capName string, since time.Time, bucket func(time.Time) int64) map[int64][2]float64 {
	per := map[int64]map[uint16]*runCounts{}
	for k, f := range d.labels {
		if k.env != env || k.av != av || k.cap != capName || f.ts.Before(since) {
			continue
		}
		h := bucket(f.ts)
		if per[h] == nil {
			per[h] = map[uint16]*runCounts{}
		}
		if per[h][k.run] == nil {
			per[h][k.run] = &runCounts{}
		}
		per[h][k.run].add(f)
	}
	out := map[int64][2]float64{}
	for h, runs := range per {
		var sc, sd float64
		for _, c := range runs {
			cov, dl := c.stats()
			sc += cov
			sd += dl
		}
		out[h] = [2]float64{sc / float64(len(runs)), sd / float64(len(runs))}
	}
	return out
}

// lackingExamples: failed rollouts with LACKING in ≥1 run → LACKING runs.
func (d *demo) lackingExamples(env, av, capName string) map[string]int {
	out := map[string]int{}
	for k, f := range d.labels {
		if k.env == env && k.av == av && k.cap == capName && !f.success && f.label == schemas.LabelLacking {
			out[k.id]++
		}
	}
	return out
}

// weekly: Monday → [rollouts, successes] of a cohort.
func (d *demo) passWeekly(env, av string) map[string][2]uint64 {
	out := map[string][2]uint64{}
	for _, r := range d.rollouts {
		if r.Environment != env || r.AgentVersion != av {
			continue
		}
		w := d.monday(r.EndTime)
		v := out[w]
		v[0]++
		if r.Success {
			v[1]++
		}
		out[w] = v
	}
	return out
}

// weekCov: mean over runs of Cov of a capability in the week of monday.
func (d *demo) weekCov(env, av, capName, monday string) (cov float64, runs int) {
	per := map[uint16]*runCounts{}
	for k, f := range d.labels {
		if k.env != env || k.av != av || k.cap != capName || d.monday(f.ts) != monday {
			continue
		}
		if per[k.run] == nil {
			per[k.run] = &runCounts{}
		}
		per[k.run].add(f)
	}
	for _, c := range per {
		cv, _ := c.stats()
		cov += cv
	}
	if len(per) > 0 {
		cov /= float64(len(per))
	}
	return cov, len(per)
}

// lackingCaps: how many capabilities were LACKING on a failure, in any
// run, in the week of monday (the ones the week's top can list).
func (d *demo) lackingCaps(env, av, monday string) int {
	caps := map[string]bool{}
	for k, f := range d.labels {
		if k.env == env && k.av == av && !f.success && f.label == schemas.LabelLacking && d.monday(f.ts) == monday {
			caps[k.cap] = true
		}
	}
	return len(caps)
}

func sortedKeys[K comparable, V any](m map[K]V, less func(a, b K) bool) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return less(out[i], out[j]) })
	return out
}

// Long names, as τ²-bench result files have them (tau2-<domain>, dated
// model names, long capability names), labeled in one run (as the rules
// labeler does): for the layout of the trigger timeline and for counts
// that are whole numbers.
const (
	longEnv = "tau2-airline-with-a-rather-long-environment-name"
	longAV  = "claude-3-7-sonnet-20250219-with-extended-thinking"
	longCap = "handling_concurrent_user_intents_across_several_reservations"
)

// seedLongNames writes 40 rollouts of one long-named cohort over the last
// 10 days, labeled in run 0 only, and three trigger events for it.
func seedLongNames(t *testing.T, st *sink.Store, now time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rows []sink.RolloutRow
	var labels []sink.LabelRow
	for i := range 40 {
		id := fmt.Sprintf("long:%03d", i)
		ok := i%3 == 0
		end := now.Add(-time.Duration(i) * 6 * time.Hour).Truncate(time.Second)
		reward := 1.0
		if !ok {
			reward = 0
		}
		ro := &schemas.Rollout{RolloutID: id, Environment: longEnv, Agent: schemas.Agent{Name: "agent", Version: longAV},
			TaskID: fmt.Sprintf("task_%d", i%7), StartTime: end.Add(-time.Minute), EndTime: end,
			Outcome: schemas.Outcome{Reward: reward}, Messages: conversation(id, ok), Tools: demoTools}
		rows = append(rows, sink.RolloutRowFrom(ro, sink.Coord{Topic: "rollouts", Offset: int64(i)}))
		for j, c := range []string{longCap, capMulti} {
			l := schemas.LabelPresent
			if !ok && (i+j)%2 == 0 {
				l = schemas.LabelLacking
			}
			labels = append(labels, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: id, Environment: longEnv, AgentVersion: longAV,
				DictionaryVersion: 3, Capability: c, Run: 0, Label: l, Success: ok, Reward: reward, Source: schemas.SourceRules, TS: end}})
		}
	}
	if err := st.InsertRollouts(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertLabels(ctx, labels); err != nil {
		t.Fatal(err)
	}
	h := func(n int) time.Time { return now.Add(-time.Duration(n) * time.Hour).Truncate(time.Second) }
	w := schemas.Window{Start: h(24 * 9), End: h(1), Rollouts: 40, Failures: 26}
	var evs []sink.TriggerEvent
	for i, e := range []struct {
		cap, kind string
		at        int
	}{{longCap, "fired", 72}, {longCap, "deselected", 30}, {capMulti, "fired", 48}} {
		evs = append(evs, sink.TriggerEvent{TriggerID: fmt.Sprintf("t-long-%d", i), Environment: longEnv, AgentVersion: longAV,
			DictionaryVersion: 3, Capability: e.cap, Epoch: 1, Event: e.kind, At: h(e.at), MeanCov: 0.4, MeanDelta: 0.5,
			RunsPassed: 1, RunsTotal: 1, Window: w})
	}
	if err := st.InsertTriggerEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
}
