package openenv

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

var fastSeeds = []string{
	`{"type":"step","data":{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"get_user_details","arguments":"{\"user_id\": \"mia_kim_123\"}"}}]}}`,
	`{"type":"step","data":{"role":"assistant","content":"I'm sorry, I cannot do that for reservation ABC123."}}`,
	`{"type":"reset","data":{"seed":3}}`, `{"type":"reset"}`, `{"type":"reset","data":{"seed":0,"episode_id":"e1","hint":true}}`,
	`{"type":"reset","data":{"seed":-1}}`, `{"type":"reset","data":{"seed":3.0}}`, `{"type":"reset","data":{"seed":null,"hint":false}}`,
	`{"type":"reset","data":{"seed":123456789012345678901}}`, `{"type":"reset","data":{"seed":1,"seed":2}}`,
	`{"type":"step","data":{"content":"tab\there \"q\" \\ \/ \u00e9 \ud83d\ude00"}}`, `{"type":"state"}`, `{"type":"close"}`,
	` { "type" : "step" , "data" : { "content" : "a\nb" , "tool_calls" : [ { "function" : { "name" : "f" , "arguments" : { "x" : [1, 2] } } } ] } } `,
	`{"type":"step","data":{"content":null,"role":null,"tool_calls":null,"reasoning_content":"hm"}}`,
	`{"type":"step","data":{"tool_calls":[{"id":null,"type":null,"function":{"name":"f","arguments":""}},{"function":{"name":"g","arguments":null}}]}}`,
	`{"type":"step","data":{"tool_calls":[{"ID":"x","Function":{"Name":"f"}}]}}`, `{"type":"step","data":{"tool_calls":[]}}`,
	`{"type":"step","data":{"tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}}`,
	`{"type":"step","data":{"tool_calls":[{"function":{"name":"f","arguments":"{bad"}}]}}`,
	`{"type":"step","data":{"content":[{"type":"text","text":"a"}]}}`, `{"type":"step","data":{"type":"list_tools"}}`,
	`{"type":"step","data":{"role":"user"}}`, `{"type":"st\u0065p","data":{}}`, `{"type":"step","type":"reset","data":{}}`,
	`{"type":"step","data":{"content":"\xff"}}`, `{"type":"step","data":{"id":"x","content":"dup","content":"last"}}`,
	`{"type":"step","data":{"tool_calls":[{"function":{"name":"a","name":"b","arguments":"{ }"}}]}}`,
	`{"type":"mcp","data":{"jsonrpc":"2.0","method":"tools/list","id":1}}`, `{"type":"state","data":{}}`, `{"type":"step"}`,
	`{"type":"step","data":[]}`, `[]`, `{`, `{"type":"step","data":{}}`, `{"type":"step","data":{"bogus":1}}`,
	`{"type":"step","data":{"role":"assistant","tool_call":[{"function":{"name":"f"}}]}}`, `{"type":"step","data":{"Tool_Calls":[]}}`,
	`{"type":"step","data":{"role":"assistant","content":"x","function_call":null,"tool_calls":null,"refusal":null}}`,
	`{"type":"step","data":{"role":"assistant","content":null,"function_call":{"name":"f","arguments":"{}"}}}`, `{"type":"step","data":{"tool_calls":[{"function":{"name":"f","arguments":"{\"a\":\"\\u00e9\"}"}}]}}`,
}

// TestFastDecodeAgrees: on the shapes a trainer sends, and on the near
// misses the fast path must leave to the general decoder, DecodeFrame and
// DecodeAction give what the general decoder gives.
func TestFastDecodeAgrees(t *testing.T) {
	accepted := 0
	for _, s := range fastSeeds {
		if checkFastDecode(t, []byte(s)) {
			accepted++
		}
	}
	if accepted < 8 {
		t.Errorf("the fast path took only %d of the seeds", accepted)
	}
}

// FuzzFastDecode: whatever the fast path accepts, the general decoder
// decodes to the same frame and action.
func FuzzFastDecode(f *testing.F) {
	for _, s := range fastSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkFastDecode(t, b) })
}

// checkFastDecode compares the two paths on b and on its data, and reports
// whether the fast path decoded the frame.
func checkFastDecode(t *testing.T, b []byte) bool {
	t.Helper()
	fast, ok := decodeFrameFast(b)
	slow, perr := decodeFrame(b)
	if ok && (perr != nil || !reflect.DeepEqual(fast, slow)) {
		t.Fatalf("frame %q: fast path %+v, general decoder %+v, %v", b, fast, slow, perr)
	}
	if perr == nil && slow.Type == FrameReset {
		fr, rok := decodeResetFast(slow.Data)
		sr, rerr := decodeReset(slow.Data)
		if rok && (rerr != nil || !reflect.DeepEqual(fr, sr)) {
			t.Fatalf("reset %q: fast path %+v, general decoder %+v, %v", slow.Data, fr, sr, rerr)
		}
	}
	if perr != nil || slow.Type != FrameStep {
		return ok
	}
	fa, aok := decodeActionFast(slow.Data)
	sa, aerr := decodeAction(slow.Data)
	if aok && (aerr != nil || !reflect.DeepEqual(fa, sa)) {
		t.Fatalf("action %q: fast path %+v, general decoder %+v, %v", slow.Data, fa, sa, aerr)
	}
	return ok
}

// SchemaValue decodes as jsonschema.UnmarshalJSON does.
func FuzzSchemaValue(f *testing.F) {
	for _, s := range []string{`{"user_id":"mia_kim_1"}`, `{"a":[1,2.5,-3e2,{"b":null}],"c":true,"d":false,"e":"x\ny\u00e9","a":0}`, `[]`, `{}`, `"s"`, `12`, ` { "k" : [ ] } `, `{"\u0061":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := SchemaValue(b)
		want, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if ok != (err == nil) || (ok && !reflect.DeepEqual(got, want)) {
			t.Fatalf("SchemaValue(%q) = %#v, %v; jsonschema.UnmarshalJSON gives %#v, %v", b, got, ok, want, err)
		}
	})
}
