package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// DecodeRolloutRow keeps only content prefixes, stores contents, arguments
// and metadata from their input text, and reuses its decode buffers, yet its
// rows are exactly the rows of the fully decoded rollouts (the metadata the
// same JSON value): on simulated fleets, on the τ²-bench simulations and on
// long contents with escapes and multi-byte characters around the cut.
func TestDecodeRolloutRowMatchesFullDecode(t *testing.T) {
	var docs [][]byte
	long := func(unit string, n int) string { return strings.Repeat(unit, n) }
	for _, content := range []string{
		long("é", 1500), long("a\"b\\\n", 400), long("😀x", 700), long("abc", 100) + long("\u2028<&>", 500),
		long("x", 1203) + "é" + long("y", 10), long("x", 1204) + "\u0001", long("ab", 150),
	} {
		r := &schemas.Rollout{RolloutID: "r", Environment: "env", Agent: schemas.Agent{Name: "a", Version: "v1"}, TaskID: "t",
			Outcome: schemas.Outcome{Reward: 1}, Messages: []schemas.Message{{Role: "user", Content: content}, {Role: "assistant", Content: content[:len(content)/2]}}}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b)
	}
	// The simulator's fleets: varied lengths, escapes and characters.
	gen := simulate.New(simulate.Config{Seed: 7, Rollouts: 3000, Start: time.Unix(1.7e9, 0), Interval: time.Second})
	for r := gen.Next(); r != nil; r = gen.Next() {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b)
	}
	if dir, err := shareddata.Lookup("tau2"); err == nil {
		files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		for _, f := range files {
			rs, err := ingest.ConvertTau2File(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				b, _ := json.Marshal(r)
				docs = append(docs, b)
			}
		}
	} else {
		t.Log("../shared/data/tau2 absent: synthetic rollouts only")
	}
	dec := ingest.DecodeRolloutRow(0)
	cut := 0
	var gots, wants []sink.RolloutRow
	for i, b := range docs {
		full, err := schemas.DecodeRollout(b, schemas.DecodeOptions{})
		if err != nil {
			t.Fatalf("doc %d: %v", i, err)
		}
		wants = append(wants, sink.RolloutRowFrom(full, sink.Coord{}))
		got, err := dec(b)
		if err != nil {
			t.Fatalf("doc %d: DecodeRolloutRow: %v", i, err)
		}
		gots = append(gots, *got)
		for _, m := range full.Messages {
			if len(m.Content) > 4*(sink.MaxContentChars+1) {
				cut++
			}
		}
	}
	// Compared after every decode: a row must not view the decoder's reused
	// buffer.
	for i := range gots {
		// The JSON columns are stored from their input text: the same JSON
		// values, spelled as the input spelled them (60.0 stays 60.0, an
		// escaped \u003e stays escaped).
		for _, c := range []struct {
			name      string
			got, want *string
		}{{"messages", &gots[i].Messages, &wants[i].Messages}, {"tools", &gots[i].Tools, &wants[i].Tools},
			{"grader", &gots[i].Grader, &wants[i].Grader}, {"metadata", &gots[i].Metadata, &wants[i].Metadata}} {
			if (*c.got == "") != (*c.want == "") || !jsonEqual(*c.got, *c.want) {
				t.Fatalf("doc %d: %s %.2000s, want %.2000s", i, c.name, *c.got, *c.want)
			}
			*c.got = *c.want
		}
		if gots[i] != wants[i] {
			t.Fatalf("doc %d: row differs\n got %.2000v\nwant %.2000v", i, gots[i], wants[i])
		}
	}
	if cut == 0 {
		t.Fatal("no content was long enough to be cut: the test does not exercise the prefix")
	}
	t.Logf("%d documents, %d contents decoded as prefixes", len(docs), cut)
}

// Rollouts written by other JSON encoders than Go's (Python's json.dumps:
// ", " and ": " separators, \u escapes for every non-ASCII character, keys
// in insertion order; escaped slashes) give rows with the same values as a
// full decode: contents decode to the same cut text, arguments to the same
// JSON value (or are both cut at 200 characters), and every other column is
// equal. What RFC 7493 forbids (a repeated key, a lone surrogate escape) is
// refused, not stored.
func TestDecodeRolloutRowOtherEncoders(t *testing.T) {
	long := strings.Repeat(`caf\u00e9 \"x\" \/ `, 40)
	longArgs := `{"z": "` + strings.Repeat(`\u00e9 `, 150) + `", "a": [1, 2.50, {"b": null}]}`
	msgs := []string{
		`{"role": "system", "content": "` + long + `"}`,
		`{"role": "user", "content": "\ud83d\ude00 na\u00efve \u2028 <&>", "turn_idx": 0}`,
		`{"role": "assistant", "content": null, "tool_calls": [` +
			`{"id": "c1", "name": "f", "arguments": {"z": 1, "a": "x\/y", "m": {"k": [true, false]}}},` +
			`{"id": "c2", "name": "f", "arguments": {"a": 1, "b": 2}},` +
			`{"id": "c3", "name": "f", "arguments": {"s": "\ud83d\ude00"}},` +
			`{"id": "c4", "name": "f", "arguments": ` + longArgs + `, "requestor": "user"}]}`,
		`{"role": "tool", "tool_call_id": "c1", "content": "\udbff\udfff pair", "error": true, "error_text": "` + long + `"}`,
		`{"role": "tool", "tool_call_id": "c2", "content": "` + strings.Repeat("x", 298) + `\ud83d\ude00 in the part kept"}`,
		`{"role": "assistant", "reasoning": "` + strings.Repeat("x", 300) + `\ud83d\ude00 past the cut", "content": "ok"}`,
		`{"role": "user", "content": "` + strings.Repeat(`\u00e9`, 299) + `\n"}`,
		`{"role": "user", "content": "` + strings.Repeat(`\u00e9`, 301) + `"}`,
	}
	doc := `{"schema": "rollout/v1", "rollout_id": "r-py", "environment": "env", "agent": {"name": "a", "version": "v1"},` +
		` "task_id": "t", "outcome": {"reward": 0.5}, "messages": [` + strings.Join(msgs, ", ") + `], "metadata": {"k": "v"}}`
	full, err := schemas.DecodeRollout([]byte(doc), schemas.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := sink.RolloutRowFrom(full, sink.Coord{})
	got, err := ingest.DecodeRolloutRow(0)([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var gm, wm []sink.CompactMessage
	if err := json.Unmarshal([]byte(got.Messages), &gm); err != nil {
		t.Fatalf("stored messages are not JSON: %v\n%s", err, got.Messages)
	}
	if err := json.Unmarshal([]byte(want.Messages), &wm); err != nil {
		t.Fatal(err)
	}
	if len(gm) != len(wm) {
		t.Fatalf("%d messages, want %d", len(gm), len(wm))
	}
	cutArgs := 0
	for i := range wm {
		g, w := gm[i], wm[i]
		if len(g.ToolCalls) != len(w.ToolCalls) {
			t.Fatalf("message %d: %d calls, want %d", i, len(g.ToolCalls), len(w.ToolCalls))
		}
		for j := range w.ToolCalls {
			ga, wa := g.ToolCalls[j].Arguments, w.ToolCalls[j].Arguments
			if strings.HasSuffix(ga, "…") || strings.HasSuffix(wa, "…") {
				if utf8.RuneCountInString(ga) != sink.MaxArgumentsChars || utf8.RuneCountInString(wa) != sink.MaxArgumentsChars {
					t.Fatalf("message %d call %d: arguments cut unequally:\n%s\n%s", i, j, ga, wa)
				}
				cutArgs++
			} else {
				if !jsonEqual(ga, wa) {
					t.Fatalf("message %d call %d: arguments %s, want %s", i, j, ga, wa)
				}
			}
			g.ToolCalls[j].Arguments = wa
		}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("message %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
	if cutArgs != 1 {
		t.Fatalf("%d arguments cut, want 1", cutArgs)
	}
	if gm[5].Reasoning == "" || !strings.HasSuffix(gm[5].Reasoning, "…") || utf8.RuneCountInString(gm[3].ErrorText) != sink.MaxContentChars {
		t.Fatalf("reasoning %q, error text %q: not kept or not cut", gm[5].Reasoning, gm[3].ErrorText)
	}
	for _, bad := range []struct{ old, new, reason string }{
		{`"arguments": {"a": 1, "b": 2}`, `"arguments": {"a": 1, "a": 2}`, schemas.ReasonDuplicateKey},
		{`pair`, `\ud800 lone`, schemas.ReasonNotJSON},
	} {
		_, err := ingest.DecodeRolloutRow(0)([]byte(strings.Replace(doc, bad.old, bad.new, 1)))
		if e := (*schemas.Error)(nil); !errors.As(err, &e) || e.Reason != bad.reason {
			t.Fatalf("%s: err %v, want %s", bad.new, err, bad.reason)
		}
	}
	got.Messages = want.Messages
	if *got != want {
		t.Fatalf("row differs beyond messages:\n got %+v\nwant %+v", *got, want)
	}
}

// jsonEqual reports whether a and b are the same JSON value ("" is null).
func jsonEqual(a, b string) bool {
	var av, bv any
	if a != "" && json.Unmarshal([]byte(a), &av) != nil || b != "" && json.Unmarshal([]byte(b), &bv) != nil {
		return false
	}
	return reflect.DeepEqual(av, bv)
}

// RowSink.Write (the plain Sink path, through one Stream) stores each row
// once with its Kafka coordinates.
func TestRowSinkWrite(t *testing.T) {
	s := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	dec := ingest.DecodeRolloutRow(0)
	gen := simulate.New(simulate.Config{Seed: 3, Rollouts: 5, Start: time.Unix(1.7e9, 0), Interval: time.Second})
	var batch []stream.Record[*sink.RolloutRow]
	for r := gen.Next(); r != nil; r = gen.Next() {
		b, _ := json.Marshal(r)
		row, err := dec(b)
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, stream.Record[*sink.RolloutRow]{Value: row, Topic: "t", Partition: 2, Offset: int64(100 + len(batch))})
	}
	if err := (&ingest.RowSink{Store: s}).Write(ctx, batch); err != nil {
		t.Fatal(err)
	}
	var n uint64
	var offsets int64
	if err := testenv.StoreConn(t, s).QueryRow(ctx, "SELECT count(), sum(kafka_offset) FROM rollouts WHERE kafka_topic = 't' AND kafka_partition = 2").Scan(&n, &offsets); err != nil {
		t.Fatal(err)
	}
	if n != 5 || offsets != 100+101+102+103+104 {
		t.Fatalf("%d rows with offsets summing to %d, want 5 and 510", n, offsets)
	}
}

// The rollouts' start_time and end_time and the labels' ts are ClickHouse
// DateTime columns: whole seconds since 1970 in a UInt32. The driver sends a
// time outside that range wrapped around (an end_time in 2110 was stored as
// 1973, where the TTL deletes it; one in 1960 as 2096), so the decoders
// refuse it: the message is dead-lettered (reason schema, at the time's
// path) instead of being stored with a wrong time. The boundaries, in any
// zone, are accepted.
func TestDecodersRefuseTimesTheStoreCannotHold(t *testing.T) {
	rollout := func(field, v string) []byte {
		return []byte(`{"rollout_id":"r","environment":"e","agent":{"name":"a","version":"v"},"task_id":"t",` +
			`"` + field + `":"` + v + `","outcome":{"reward":1},"messages":[{"role":"user","content":"x"}]}`)
	}
	label := func(v string) []byte {
		return []byte(`{"rollout_id":"r","environment":"e","agent_version":"v","dictionary_version":1,"capability":"c",` +
			`"run":0,"label":"PRESENT","success":true,"source":"rules","ts":"` + v + `"}`)
	}
	for _, tc := range []struct {
		v  string
		ok bool
	}{
		{"1970-01-01T00:00:00Z", true},
		{"1970-01-01T01:00:00+01:00", true},
		{"2106-02-07T06:28:15Z", true},
		{"2106-02-07T06:28:15.999999999Z", true},
		{"2106-02-07T07:28:15+01:00", true},
		{"2026-01-01T00:00:00-07:30", true},
		{"1969-12-31T23:59:59Z", false},
		{"1969-12-31T23:59:59.999Z", false},
		{"1970-01-01T00:59:59+01:00", false},
		{"2106-02-07T06:28:16Z", false},
		{"2106-02-07T05:28:16-01:00", false},
		{"2110-01-01T00:00:00Z", false},
		{"1960-01-01T00:00:00Z", false},
		{"9999-12-31T23:59:59Z", false},
		{"0002-01-01T00:00:00Z", false},
	} {
		check := func(what, path string, err error) {
			t.Helper()
			if tc.ok {
				if err != nil {
					t.Errorf("%s %s: %v, want accepted", what, tc.v, err)
				}
				return
			}
			var e *schemas.Error
			if !errors.As(err, &e) || e.Reason != schemas.ReasonSchema || e.Path != path {
				t.Errorf("%s %s: err %v, want reason %s at %s", what, tc.v, err, schemas.ReasonSchema, path)
			}
		}
		for _, field := range []string{"start_time", "end_time"} {
			_, err := ingest.DecodeRolloutRow(0)(rollout(field, tc.v))
			check("DecodeRolloutRow "+field, "/"+field, err)
			_, err = ingest.DecodeRollout(0)(rollout(field, tc.v))
			check("DecodeRollout "+field, "/"+field, err)
		}
		_, err := ingest.DecodeLabel(label(tc.v))
		check("DecodeLabel ts", "/ts", err)
	}
}

// storedTimes writes through RowSink one minimal rollout per fragment
// (JSON members, each ending in a comma; "" for none), each as a Kafka
// message of timestamp msg, and returns their stored start and end times
// (unix seconds), rollout by rollout.
func storedTimes(t *testing.T, msg time.Time, fragments ...string) []uint32 {
	t.Helper()
	s := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	var batch []stream.Record[*sink.RolloutRow]
	for i, f := range fragments {
		doc := `{"rollout_id":"r` + string(rune('0'+i)) + `","environment":"e","agent":{"name":"a","version":"v"},"task_id":"t",` +
			f + `"outcome":{"reward":1},"messages":[{"role":"user","content":"x"}]}`
		row, err := ingest.DecodeRolloutRow(0)([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, stream.Record[*sink.RolloutRow]{Value: row, Topic: "t", Offset: int64(i), Time: msg})
	}
	if err := (&ingest.RowSink{Store: s}).Write(ctx, batch); err != nil {
		t.Fatal(err)
	}
	rows, err := testenv.StoreConn(t, s).Query(ctx, "SELECT toUnixTimestamp(start_time), toUnixTimestamp(end_time) FROM rollouts ORDER BY rollout_id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []uint32
	for rows.Next() {
		var a, b uint32
		if err := rows.Scan(&a, &b); err != nil {
			t.Fatal(err)
		}
		got = append(got, a, b)
	}
	return got
}

// The boundaries of what the decoders accept are stored as themselves.
func TestRowSinkStoresBoundaryTimes(t *testing.T) {
	var fragments []string
	for _, v := range []string{"1970-01-01T00:00:00Z", "2106-02-07T06:28:15Z"} {
		fragments = append(fragments, `"start_time":"`+v+`","end_time":"`+v+`",`)
	}
	if got, want := storedTimes(t, time.Time{}, fragments...), []uint32{0, 0, 1<<32 - 1, 1<<32 - 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
}

// TestRowSinkEndTimeFromTheMessage: a rollout without end_time is stored
// at its own start_time, else at its Kafka message's timestamp, which a
// redelivery keeps (its start too, as an absent start takes the end); one
// with its own end_time keeps it.
func TestRowSinkEndTimeFromTheMessage(t *testing.T) {
	msg := time.Date(2026, 11, 3, 4, 5, 6, 0, time.UTC)
	own := uint32(time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC).Unix())
	start := uint32(time.Date(2025, 6, 1, 9, 0, 0, 0, time.UTC).Unix())
	got := storedTimes(t, msg, "", `"end_time":"2026-10-01T00:00:00Z",`, `"start_time":"2025-06-01T09:00:00Z",`)
	if want := []uint32{uint32(msg.Unix()), uint32(msg.Unix()), own, own, start, start}; !reflect.DeepEqual(got, want) {
		t.Fatalf("start and end times %v, want %v (the message's timestamp, the rollout's own end, its own start)", got, want)
	}
}
