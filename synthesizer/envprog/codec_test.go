package envprog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/traceops/trace/schemas"
)

// The sandbox protocol's binary encoding: every field of a request and a
// response survives a frame; damaged frames are errors.

func roundTrip[T any, P interface {
	*T
	message
}](t *testing.T, in P) P {
	t.Helper()
	f, err := appendFrame([]byte("x"), in) // after other bytes, as frames share a buffer
	if err != nil {
		t.Fatal(err)
	}
	var scratch []byte
	out := P(new(T))
	if err := readFrame(bufio.NewReader(bytes.NewReader(f[1:])), out, &scratch); err != nil {
		t.Fatalf("decoding %T: %v", in, err)
	}
	return out
}

func TestCodecRequests(t *testing.T) {
	for _, req := range []*request{
		{ID: 1, Op: "load", Name: "p.star", Src: []byte("def tools(): return []"), Limits: &Limits{MaxSteps: 7, MaxMemory: 1 << 30, CallTimeout: 1500 * time.Millisecond, MaxTurns: 3, ResetCache: -1}},
		{ID: 1<<63 + 5, Op: "reset", Episode: 9, Seed: -42},
		{ID: 3, Op: "step", Episode: 9, Action: &Action{Content: "ünïcode \x00 and \"quotes\"", ToolCalls: []ToolCall{
			{ID: "c1", Name: "get_user_details", Arguments: json.RawMessage(`{"user_id":"mia_kim_1"}`)},
			{ID: "", Name: "x", Arguments: nil}}}},
		{ID: 4, Op: "step", Episode: 9, Action: &Action{}},
		{ID: 5, Op: "cancel", Target: 3},
		{ID: 6, Op: "stats"},
	} {
		if req.Limits != nil { // every field set, so that one the codec leaves out shows
			lim := reflect.ValueOf(*req.Limits)
			for i := range lim.NumField() {
				if lim.Field(i).IsZero() {
					t.Fatalf("set Limits.%s in this test", lim.Type().Field(i).Name)
				}
			}
		}
		if got := roundTrip(t, req); !reflect.DeepEqual(got, req) {
			t.Errorf("request changed on the way:\n got %+v\nwant %+v", got, req)
		}
	}
}

func TestCodecResponses(t *testing.T) {
	info := &Info{Name: "p.star", Doc: "why", Hash: "ab", HasHint: true,
		Tools: []schemas.Tool{{Type: "function", Function: schemas.FunctionDef{Name: "f", Parameters: json.RawMessage(`{"type":"object"}`)}}}}
	for _, resp := range []*response{
		{ID: 1, Info: info},
		{ID: 2, Start: &Start{System: "sys", User: "user id mia_kim_1"}},
		{ID: 2, Start: &Start{System: "sys", User: "u"}, Cached: true},
		{ID: 3, Assistant: &Message{Role: "assistant", ToolCalls: []ToolCall{{ID: "c", Name: "f", Arguments: json.RawMessage(`"{}"`)}}},
			Step:  &StepResult{ToolResults: []Message{{Role: "tool", Content: `{"a":"b\n"}`, ToolCallID: "c", Name: "f"}}, Done: true},
			Final: &Reward{Value: 0.6, Components: map[string]float64{"action": 1, "communication": 0}}},
		{ID: 4, Step: &StepResult{}, Final: &Reward{Value: 1}, FinalErr: &wireError{Code: "program", Func: "reward", Seed: -1, Limit: "steps", Msg: "m"}},
		{ID: 5, Reward: &Reward{Value: 0.25}, Err: &wireError{Code: "done", Msg: "envprog: episode is done"}},
		{ID: 6, Hint: "read the records first"},
		{ID: 7, Reference: []Action{{ToolCalls: []ToolCall{{ID: "ref_0_0", Name: "f", Arguments: json.RawMessage(`{"x":1}`)}}}, {Content: "done"}}},
		{ID: 8, Stats: &workerStats{Goroutines: 4, Episodes: 2, Calls: 1, Resets: 1}},
	} {
		if got := roundTrip(t, resp); !reflect.DeepEqual(got, resp) {
			t.Errorf("response changed on the way:\n got %+v\nwant %+v", got, resp)
		}
	}
}

func TestCodecDamagedFrames(t *testing.T) {
	f, err := appendFrame(nil, &response{ID: 3, Step: &StepResult{ToolResults: []Message{{Role: "tool", Content: "result"}}}})
	if err != nil {
		t.Fatal(err)
	}
	body := f[4:]
	for n := 0; n < len(body); n++ {
		var r response
		if err := r.decode(body[:n]); err == nil {
			t.Errorf("a frame cut to %d of %d bytes decoded", n, len(body))
		}
	}
	var r response
	if err := r.decode(append(body[:len(body):len(body)], 0)); err == nil {
		t.Error("a frame with a trailing byte decoded")
	}
	// A length far beyond the frame is refused before allocating.
	if err := r.decode([]byte{1, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0x0f}); err == nil {
		t.Error("a frame claiming 4 GiB of tool results decoded")
	}
}

func FuzzCodecResponse(f *testing.F) {
	for _, r := range []*response{
		{ID: 3, Step: &StepResult{ToolResults: []Message{{Role: "tool", Content: "result", ToolCalls: []ToolCall{{ID: "a"}}}}}, Final: &Reward{Value: 1, Components: map[string]float64{"a": 1}}},
		{ID: 1, Info: &Info{Name: "x"}},
	} {
		b, _ := r.encode(nil)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r response
		if r.decode(b) != nil {
			return
		}
		// What decodes re-encodes to a frame that decodes to the same.
		again, err := r.encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		var r2 response
		if err := r2.decode(again); err != nil {
			t.Fatalf("re-encoded frame: %v", err)
		}
	})
}
