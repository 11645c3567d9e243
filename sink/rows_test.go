package sink_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// legacyCompactMessages and legacyRolloutRowFrom are the plain encoding/json
// compaction: the reference.
func legacyTruncate(s string, n int) string {
	if len(s) <= n || utf8.RuneCountInString(s) <= n {
		return s
	}
	i, count := 0, 0
	for i = range s {
		if count == n-1 {
			break
		}
		count++
	}
	return s[:i] + "…"
}

func legacyCompactMessages(msgs []schemas.Message) []sink.CompactMessage {
	out := make([]sink.CompactMessage, len(msgs))
	for i, m := range msgs {
		cm := sink.CompactMessage{Role: m.Role, Content: legacyTruncate(m.Content, sink.MaxContentChars), Reasoning: legacyTruncate(m.Reasoning, sink.MaxContentChars),
			ToolCallID: m.ToolCallID, Error: m.Error, ErrorText: legacyTruncate(m.ErrorText, sink.MaxContentChars), Requestor: m.Requestor}
		for _, tc := range m.ToolCalls {
			args, _ := json.Marshal(tc.Arguments)
			cm.ToolCalls = append(cm.ToolCalls, sink.CompactToolCall{ID: tc.ID, Name: tc.Name, Arguments: legacyTruncate(string(args), sink.MaxArgumentsChars), Requestor: tc.Requestor})
		}
		out[i] = cm
	}
	return out
}

func legacyRolloutRowFrom(r *schemas.Rollout, c sink.Coord) sink.RolloutRow {
	row := sink.RolloutRow{
		RolloutID: r.RolloutID, Environment: r.Environment, AgentName: r.Agent.Name, AgentVersion: r.Agent.Version,
		TaskID: r.TaskID, Success: r.Succeeded(), Reward: r.Outcome.Reward,
		StartTime: r.StartTime, EndTime: r.EndTime, NMessages: uint32(len(r.Messages)), Coord: c,
	}
	for _, m := range r.Messages {
		row.NToolCalls += uint32(len(m.ToolCalls))
		if m.Role == "tool" && m.Error {
			row.NToolErrors++
		}
	}
	b, _ := json.Marshal(legacyCompactMessages(r.Messages))
	row.Messages = string(b)
	if len(r.Tools) > 0 {
		b, _ = json.Marshal(r.Tools)
		row.Tools = string(b)
	}
	if r.Grader != nil {
		b, _ = json.Marshal(r.Grader)
		row.Grader = string(b)
	}
	if len(r.Metadata) > 0 {
		b, _ = json.Marshal(r.Metadata)
		row.Metadata = string(b)
	}
	return row
}

func TestTruncateUnchanged(t *testing.T) {
	for _, s := range []string{"", "a", "ab", "abc", "é", "éé", "ééé", "\xff\xfe\xfd", "a\xe2\x80b", strings.Repeat("é", 300), strings.Repeat("x", 299) + "😀", strings.Repeat("😀", 301), strings.Repeat("a", 298) + "\xe2\x80" + "bc"} {
		for _, n := range []int{1, 2, 3, 199, 200, 201, 298, 299, 300, 301} {
			if got, want := sink.Truncate(s, n), legacyTruncate(s, n); got != want {
				t.Fatalf("Truncate(%q, %d) = %q, want %q", s, n, got, want)
			}
		}
	}
}

// checkRow: RolloutRowFrom stores the values encoding/json would, and so
// does RawRolloutRow for the rollout as it is on the wire (when it is a
// valid rollout).
func checkRow(t *testing.T, r *schemas.Rollout) {
	t.Helper()
	c := sink.Coord{Topic: "t", Partition: 1, Offset: 2}
	want := legacyRolloutRowFrom(r, c)
	sameRow(t, "RolloutRowFrom", sink.RolloutRowFrom(r, c), want)
	if cm, lcm := sink.CompactMessages(r.Messages), legacyCompactMessages(r.Messages); !reflect.DeepEqual(cm, lcm) {
		t.Fatalf("CompactMessages\n got %+v\nwant %+v", cm, lcm)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	raw, err := schemas.DecodeRawRollout(b, schemas.DecodeOptions{})
	if err != nil {
		return // not a valid rollout: never on the ingest path
	}
	dr, err := raw.Decode()
	if err != nil {
		t.Fatal(err)
	}
	sameRow(t, "RawRolloutRow", sink.RawRolloutRow(raw, c), legacyRolloutRowFrom(dr, c))
}

// sameRow compares the JSON columns by value and the others exactly.
func sameRow(t *testing.T, what string, got, want sink.RolloutRow) {
	t.Helper()
	for _, f := range []struct {
		name      string
		got, want *string
	}{{"messages", &got.Messages, &want.Messages}, {"tools", &got.Tools, &want.Tools}, {"grader", &got.Grader, &want.Grader}, {"metadata", &got.Metadata, &want.Metadata}} {
		if (*f.got == "") != (*f.want == "") || !jsonEqual(*f.got, *f.want) {
			t.Fatalf("%s: %s:\n got %s\nwant %s", what, f.name, *f.got, *f.want)
		}
		*f.got = *f.want
	}
	if got != want {
		t.Fatalf("%s: row\n got %+v\nwant %+v", what, got, want)
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

// TestRolloutRowMatchesEncodingJSON: the rows hold the values encoding/json
// wrote, on the τ² rollouts (as converted and as decoded from the wire) and
// on awkward values.
func TestRolloutRowMatchesEncodingJSON(t *testing.T) {
	dir := shareddata.Dir(t, "tau2")
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	n := 0
	for _, f := range files {
		rs, err := ingest.ConvertTau2File(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			checkRow(t, r) // as converted (Go values)
			b, _ := json.Marshal(r)
			dr, err := schemas.DecodeRollout(b, schemas.DecodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			checkRow(t, dr) // as decoded
			n++
		}
	}
	if n == 0 {
		t.Fatal("no τ² rollouts")
	}

	awkward := []string{"", "<a href='x'>&amp;</a>", "\u2028\u2029", "\x00\x01\x1f\x7f", "tab\there\nnl\r\\\"",
		"bad utf8 \xff\xfe end", strings.Repeat("é", 299), strings.Repeat("é", 300), strings.Repeat("é", 301),
		strings.Repeat("x", 199) + "é€😀", strings.Repeat("😀", 250), strings.Repeat("a", 197) + "\xe2\x80"}
	floats := []float64{0, -0.0, 1, -1.5, 1e-7, 1e-6, 123456789, 1e20, 1e21, 1.7976931348623157e308, 5e-324, 0.1 + 0.2, 100}
	rng := rand.New(rand.NewPCG(1, 2))
	var randValue func(depth int) any
	randValue = func(depth int) any {
		switch k := rng.IntN(8); {
		case k == 0:
			return nil
		case k == 1:
			return rng.IntN(2) == 0
		case k == 2:
			return floats[rng.IntN(len(floats))]
		case k == 3 && depth < 3:
			m := map[string]any{}
			for range rng.IntN(5) {
				m[awkward[rng.IntN(len(awkward))]+string(rune('a'+rng.IntN(26)))] = randValue(depth + 1)
			}
			return m
		case k == 4 && depth < 3:
			a := []any{}
			for range rng.IntN(4) {
				a = append(a, randValue(depth+1))
			}
			return a
		default:
			return awkward[rng.IntN(len(awkward))]
		}
	}
	for i := range 300 {
		r := &schemas.Rollout{RolloutID: "r", Environment: "e", Agent: schemas.Agent{Name: "a", Version: "v"}, TaskID: "t",
			EndTime: time.Unix(int64(i), 0), Outcome: schemas.Outcome{Reward: floats[i%len(floats)]}}
		for j := range 1 + rng.IntN(6) {
			m := schemas.Message{Role: []string{"user", "assistant", "tool", ""}[j%4], Content: awkward[rng.IntN(len(awkward))],
				Reasoning: awkward[rng.IntN(len(awkward))], ErrorText: awkward[rng.IntN(len(awkward))],
				ToolCallID: awkward[rng.IntN(len(awkward))], Error: rng.IntN(2) == 0, Requestor: awkward[rng.IntN(len(awkward))]}
			for range rng.IntN(3) {
				args, _ := randValue(2).(map[string]any)
				if rng.IntN(3) == 0 {
					args = map[string]any{"long": strings.Repeat("<é>", 100), "n": floats[rng.IntN(len(floats))], "nested": randValue(0)}
				}
				m.ToolCalls = append(m.ToolCalls, schemas.ToolCall{ID: awkward[rng.IntN(len(awkward))], Name: "f", Arguments: args, Requestor: awkward[rng.IntN(len(awkward))]})
			}
			r.Messages = append(r.Messages, m)
		}
		for range rng.IntN(3) {
			r.Tools = append(r.Tools, schemas.Tool{Type: "function", Function: schemas.FunctionDef{Name: awkward[rng.IntN(len(awkward))],
				Description: awkward[rng.IntN(len(awkward))],
				Parameters:  json.RawMessage([]string{``, `{"type": "object"}`, "{ \"a\" : [1, 2,\n 3], \"<b>\":\"x \\\" y\u2028&\" }", `null`}[rng.IntN(4)])}})
		}
		if rng.IntN(2) == 0 {
			r.Grader = &schemas.Grader{Reasons: awkward[:rng.IntN(4)], Breakdown: map[string]float64{"DB": floats[rng.IntN(len(floats))], "<x>": 1}}
		}
		if m, ok := randValue(2).(map[string]any); ok {
			r.Metadata = m
		}
		checkRow(t, r)
	}

	// Values encoding/json refuses or that only it covers.
	odd := &schemas.Rollout{RolloutID: "r", Messages: []schemas.Message{{Role: "assistant", ToolCalls: []schemas.ToolCall{
		{ID: "1", Name: "f", Arguments: map[string]any{"nan": math.NaN()}},
		{ID: "2", Name: "f", Arguments: nil},
		{ID: "3", Name: "f", Arguments: map[string]any{"n": json.Number("12"), "i": 3, "u": uint8(4), "s": []string{"a"}}},
	}}},
		Tools:    []schemas.Tool{{Type: "function", Function: schemas.FunctionDef{Name: "f", Parameters: json.RawMessage(`{bad`)}}},
		Grader:   &schemas.Grader{Breakdown: map[string]float64{"inf": math.Inf(1)}},
		Metadata: map[string]any{"ch": make(chan int)},
	}
	checkRow(t, odd)
}

func BenchmarkRolloutRowFrom(b *testing.B) {
	dir := shareddata.Dir(b, "tau2")
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	var rs []*schemas.Rollout
	var raws []*schemas.RawRollout
	for _, f := range files {
		conv, err := ingest.ConvertTau2File(f)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range conv {
			j, _ := json.Marshal(r)
			dr, err := schemas.DecodeRollout(j, schemas.DecodeOptions{})
			if err != nil {
				b.Fatal(err)
			}
			rs = append(rs, dr)
			raw, _ := schemas.DecodeRawRollout(j, schemas.DecodeOptions{})
			raws = append(raws, raw)
		}
	}
	b.Run("raw", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			sink.RawRolloutRow(raws[i%len(raws)], sink.Coord{})
		}
	})
	for _, impl := range []struct {
		name string
		fn   func(*schemas.Rollout, sink.Coord) sink.RolloutRow
	}{{"RolloutRowFrom", sink.RolloutRowFrom}, {"encoding-json", legacyRolloutRowFrom}} {
		b.Run(impl.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				impl.fn(rs[i%len(rs)], sink.Coord{})
			}
		})
	}
}
