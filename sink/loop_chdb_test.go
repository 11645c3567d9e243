//go:build chdb

package sink

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// chdbLoop runs the closed loop's queries (loop.go) on chDB: the before
// and after samples, the dictionary and the routing share.
func chdbLoop(t *testing.T, c *chdbDB, base time.Time) {
	c = c.on(t)
	act := base.Add(2 * time.Hour)
	conv := map[string]string{"b3": "c-other", "r4": "c-ad"} // no routing field: found through route_decisions
	ro := func(id, version, adapter string, end time.Time, ok uint8) []any {
		return []any{id, "loop-env", "bot", version, id, ok, float64(ok), end.Add(-time.Minute), end, uint32(0), uint32(0), uint32(0),
			"[]", "[]", "{}", "{}", "t", int32(0), int64(0), end, uint64(end.UnixNano()), adapter, conv[id]}
	}
	cols := "rollout_id, environment, agent_name, agent_version, task_id, success, reward, start_time, end_time, n_messages, n_tool_calls, n_tool_errors, " +
		"messages, tools, grader, metadata, kafka_topic, kafka_partition, kafka_offset, ingested_at, ingest_ns, adapter, conversation_id"
	dec := func(conv, adapter string, at time.Time) []any {
		return []any{at, at.UnixNano(), "q-" + conv, "d-" + conv, conv, "header", "loop-env", "1.4.0", "proxy", uint8(0), adapter, "cap", adapter, "A",
			[]string{"A"}, []string{"cap"}, []string{adapter}, []float64{1}, []string{}, []float64{}, "classified", "", "base", uint32(1), uint32(1), uint16(200), "ok", uint8(0), nil, nil, ""}
	}
	c.insert("route_decisions", routeDecisionColumns, dec("c-other", "other", act.Add(-2*time.Minute)), dec("c-ad", "", act), dec("c-ad", "ad", act.Add(time.Second)),
		dec("c-fb", "ad", act.Add(2*time.Second)), dec("c-fb", "", act.Add(3*time.Second))) // c-fb: ad, then the base model (the upstream stopped serving ad)
	c.insert("rollouts", cols, ro("b1", "1.4.0", "", act.Add(-time.Hour), 0), ro("b2", "1.4.0", "", act.Add(-time.Minute), 1),
		ro("x1", "1.5.0", "", act.Add(-time.Hour), 0), ro("late", "1.4.0", "", act.Add(time.Hour), 0),
		ro("r1", "1.4.0", "ad", act.Add(10*time.Minute), 1), ro("r2", "1.4.0", "ad", act.Add(70*time.Minute), 0), ro("r3", "1.5.0", "ad", act.Add(20*time.Minute), 0),
		ro("b3", "1.4.0", "", act.Add(-2*time.Minute), 0), ro("r4", "1.4.0", "", act.Add(30*time.Minute), 0))
	lab := func(id, version string, run uint16, l string, ok uint8, end time.Time, ns uint64) []any {
		return []any{"loop-env", version, uint32(2), "cap", run, id, l, ok, float64(ok), "test", end, ns}
	}
	labelCols := "environment, agent_version, dictionary_version, capability, run, rollout_id, label, success, reward, source, ts, ingest_ns"
	c.insert("capability_labels", labelCols, lab("b1", "1.4.0", 0, "LACKING", 0, act.Add(-time.Hour), 1), lab("b1", "1.4.0", 1, "PRESENT", 0, act.Add(-time.Hour), 1),
		lab("b1", "1.4.0", 1, "LACKING", 0, act.Add(-time.Hour), 2), // a relabel: the newest wins
		lab("b2", "1.4.0", 0, "NA", 1, act.Add(-time.Minute), 1), lab("b2", "1.4.0", 1, "PRESENT", 1, act.Add(-time.Minute), 1),
		lab("x1", "1.5.0", 0, "LACKING", 0, act.Add(-time.Hour), 1), lab("late", "1.4.0", 0, "LACKING", 0, act.Add(time.Hour), 1),
		lab("r1", "1.4.0", 0, "PRESENT", 1, act.Add(10*time.Minute), 1), lab("r2", "1.4.0", 0, "LACKING", 0, act.Add(70*time.Minute), 1), lab("r3", "1.5.0", 0, "LACKING", 0, act.Add(20*time.Minute), 1),
		lab("b3", "1.4.0", 0, "LACKING", 0, act.Add(-2*time.Minute), 1), lab("r4", "1.4.0", 0, "NA", 0, act.Add(30*time.Minute), 1))

	if r := c.query(loopDictionariesSQL, "loop-env", "1.4.0", "cap"); len(r.rows) != 1 || r.rows[0].uint(0) != 2 {
		t.Fatalf("loop dictionary: %v", r.rows)
	}
	q, args := loopLabelsSQL(LoopSample{Environment: "loop-env", AgentVersion: "1.4.0", Until: act, DictionaryVersion: 2, Capability: "cap"})
	r := c.query(q, args...)
	r.wantTypes(t, "LoopLabels", "String", "UInt16", "Enum8('NA' = 0, 'PRESENT' = 1, 'LACKING' = 2)", "UInt8", "DateTime")
	var got []string
	for _, row := range r.rows {
		got = append(got, row.str(0)+"/"+row.str(2))
	}
	if want := "b1/LACKING b1/LACKING b2/NA b2/PRESENT"; strings.Join(got, " ") != want {
		t.Fatalf("before: %s, want %s", strings.Join(got, " "), want)
	}
	q, args = loopLabelsSQL(LoopSample{Environment: "loop-env", AgentVersion: "1.4.0", Adapter: "ad", DictionaryVersion: 2, Capability: "cap", Limit: 10})
	got = nil
	for _, row := range c.query(q, args...).rows {
		got = append(got, row.str(0)+"/"+row.str(2))
	}
	if want := "r1/PRESENT r2/LACKING r4/NA"; strings.Join(got, " ") != want {
		t.Fatalf("after: %s, want %s", strings.Join(got, " "), want)
	}
	q, args = decisionShareSQL("loop-env", 0, time.Hour)
	got = nil
	for _, row := range c.query(q, args...).rows {
		got = append(got, fmt.Sprintf("%s/%s/%d", row.time(0).Sub(act), row.str(1), row.uint(2)))
	}
	if want := "-1h0m0s/other/1 0s//1 0s/ad/1"; strings.Join(got, " ") != want {
		t.Fatalf("decision share: %s, want %s", strings.Join(got, " "), want)
	}
	q, args = routingShareSQL("loop-env", 70*time.Minute, time.Hour)
	got = nil
	for _, row := range c.query(q, args...).rows {
		got = append(got, fmt.Sprintf("%s/%s/%d", row.time(0).Sub(act), row.str(1), row.uint(2)))
	}
	if want := "0s//1 0s/ad/2 1h0m0s//1 1h0m0s/ad/1"; strings.Join(got, " ") != want {
		t.Fatalf("share: %s, want %s", strings.Join(got, " "), want)
	}
}
