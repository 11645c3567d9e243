package openenv

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

func TestDecodeFrame(t *testing.T) {
	for _, tc := range []struct {
		in       string
		typ      string // want this type when code is ""
		data     string
		code     string
		contains string
	}{
		{in: `{"type":"reset","data":{"seed":3}}`, typ: "reset", data: `{"seed":3}`},
		{in: `{"type":"reset"}`, typ: "reset", data: `{}`},
		{in: `{"type":"step","data":{"role":"assistant","content":"hi"}}`, typ: "step", data: `{"role":"assistant","content":"hi"}`},
		{in: `{"type":"state"}`, typ: "state"},
		{in: `{"type":"close"}`, typ: "close"},
		{in: ` {"type":"mcp","data":{"jsonrpc":"2.0","method":"tools/list"}} `, typ: "mcp", data: `{"jsonrpc":"2.0","method":"tools/list"}`},
		{in: `{"type":"reset"`, code: CodeInvalidJSON, contains: "Invalid JSON"},
		{in: ``, code: CodeInvalidJSON},
		{in: "\xff", code: CodeInvalidJSON},
		{in: `[1,2]`, code: CodeValidation, contains: "an array"},
		{in: `"reset"`, code: CodeValidation},
		{in: `{"data":{}}`, code: CodeUnknownType, contains: "Unknown message type: "},
		{in: `{"type":"jump"}`, code: CodeUnknownType, contains: "jump"},
		{in: `{"type":5}`, code: CodeUnknownType, contains: "5"},
		{in: `{"type":"step"}`, code: CodeValidation, contains: "Field required (data)"},
		{in: `{"type":"step","data":[1]}`, code: CodeValidation, contains: "valid dictionary"},
		{in: `{"type":"reset","data":"x"}`, code: CodeValidation},
		{in: `{"type":"state","data":{}}`, code: CodeValidation, contains: "Extra inputs are not permitted (data)"},
		{in: `{"type":"reset","data":{},"extra":1}`, code: CodeValidation, contains: "(extra)"},
	} {
		f, err := DecodeFrame([]byte(tc.in))
		if tc.code != "" {
			if err == nil {
				t.Errorf("DecodeFrame(%q) = %+v, want %s", tc.in, f, tc.code)
				continue
			}
			if err.Code != tc.code || !strings.Contains(err.Message, tc.contains) {
				t.Errorf("DecodeFrame(%q) error %s %q, want %s containing %q", tc.in, err.Code, err.Message, tc.code, tc.contains)
			}
			if err.Code == CodeValidation && len(err.Fields) == 0 {
				t.Errorf("DecodeFrame(%q): validation error without field errors", tc.in)
			}
			continue
		}
		if err != nil {
			t.Errorf("DecodeFrame(%q): %v", tc.in, err)
			continue
		}
		if f.Type != tc.typ || string(f.Data) != tc.data {
			t.Errorf("DecodeFrame(%q) = %s %s, want %s %s", tc.in, f.Type, f.Data, tc.typ, tc.data)
		}
	}
}

func TestDecodeAction(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       string
		want     Action
		code     string
		contains string
	}{
		{name: "final answer", in: `{"role":"assistant","content":"done"}`, want: Action{Kind: ActionMessage, Content: "done"}},
		{name: "no role, null content", in: `{"content":null}`, want: Action{Kind: ActionMessage}},
		{name: "string arguments", in: `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_user_details","arguments":"{\"user_id\": \"u1\"}"}}]}`,
			want: Action{Kind: ActionMessage, ToolCalls: []Call{{ID: "c1", Name: "get_user_details", Arguments: []byte(`{"user_id":"u1"}`)}}}},
		{name: "object arguments, two calls", in: `{"tool_calls":[{"function":{"name":"a","arguments":{"x": 1}}},{"function":{"name":"b"}}]}`,
			want: Action{Kind: ActionMessage, ToolCalls: []Call{{Name: "a", Arguments: []byte(`{"x":1}`)}, {Name: "b", Arguments: []byte(`{}`)}}}},
		{name: "empty string arguments", in: `{"tool_calls":[{"function":{"name":"a","arguments":""}}]}`,
			want: Action{Kind: ActionMessage, ToolCalls: []Call{{Name: "a", Arguments: []byte(`{}`)}}}},
		{name: "content parts and extra members", in: `{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"reasoning_content":"…","refusal":null}`,
			want: Action{Kind: ActionMessage, Content: "ab"}},
		{name: "null tool_calls", in: `{"content":"x","tool_calls":null}`, want: Action{Kind: ActionMessage, Content: "x"}},
		{name: "list_tools", in: `{"type":"list_tools"}`, want: Action{Kind: ActionListTools}},
		{name: "call_tool", in: `{"type":"call_tool","tool_name":"t","arguments":{"k":"v"},"metadata":{}}`,
			want: Action{Kind: ActionCallTool, ToolCalls: []Call{{Name: "t", Arguments: []byte(`{"k":"v"}`)}}}},
		{name: "user role", in: `{"role":"user","content":"x"}`, code: CodeValidation, contains: "role must be"},
		{name: "not an object", in: `"hello"`, code: CodeValidation, contains: "a string"},
		{name: "bad json", in: `{"content":`, code: CodeInvalidJSON},
		{name: "arguments not json", in: `{"tool_calls":[{"function":{"name":"a","arguments":"{user_id: 1}"}}]}`, code: CodeValidation, contains: "tool_calls[0].function.arguments: not valid JSON"},
		{name: "arguments an array", in: `{"tool_calls":[{"function":{"name":"a","arguments":"[1]"}}]}`, code: CodeValidation, contains: "must be a JSON object"},
		{name: "arguments a number", in: `{"tool_calls":[{"function":{"name":"a","arguments":3}}]}`, code: CodeValidation, contains: "must be a JSON object"},
		{name: "no name", in: `{"tool_calls":[{"function":{"arguments":"{}"}}]}`, code: CodeValidation, contains: "function.name"},
		{name: "wrong type", in: `{"tool_calls":[{"type":"code","function":{"name":"a"}}]}`, code: CodeValidation, contains: `"function"`},
		{name: "tool_calls an object", in: `{"tool_calls":{"function":{"name":"a"}}}`, code: CodeValidation, contains: "valid list"},
		{name: "content a number", in: `{"content":3}`, code: CodeValidation, contains: "content"},
		{name: "image part", in: `{"content":[{"type":"image_url","image_url":{}}]}`, code: CodeValidation, contains: "only text parts"},
		{name: "call_tool extra", in: `{"type":"call_tool","tool_name":"t","args":{}}`, code: CodeValidation, contains: "(args)"},
		{name: "call_tool no name", in: `{"type":"call_tool"}`, code: CodeValidation, contains: "tool_name"},
		{name: "an OpenAI SDK message's nulls", in: `{"role":"assistant","content":"x","function_call":null,"tool_calls":null,"refusal":null,"audio":null,"annotations":[]}`,
			want: Action{Kind: ActionMessage, Content: "x"}},
		{name: "null type", in: `{"type":null,"content":"x"}`, want: Action{Kind: ActionMessage, Content: "x"}},
		{name: "unknown type", in: `{"type":"call_tools","tool_name":"t","arguments":{}}`, code: CodeValidation, contains: `type: "call_tools" is not an action type`},
		{name: "type on a message", in: `{"type":"assistant","content":"x"}`, code: CodeValidation, contains: "not an action type"},
		{name: "empty object", in: `{}`, code: CodeValidation, contains: "has none of the three"},
		{name: "only unknown members", in: `{"bogus":1}`, code: CodeValidation, contains: "has none of the three"},
		{name: "tool_call misspelled", in: `{"role":"assistant","tool_call":[{"function":{"name":"a"}}]}`, code: CodeValidation, contains: `tool_call: not read; a tool call goes in "tool_calls"`},
		{name: "toolCalls", in: `{"role":"assistant","content":"","toolCalls":[]}`, code: CodeValidation, contains: "toolCalls: not read"},
		{name: "legacy function_call", in: `{"role":"assistant","content":null,"function_call":{"name":"a","arguments":"{}"}}`, code: CodeValidation, contains: "function_call: not read"},
		{name: "call_tool arguments string", in: `{"type":"call_tool","tool_name":"t","arguments":"{}"}`, code: CodeValidation, contains: "valid dictionary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := DecodeAction([]byte(tc.in))
			if tc.code != "" {
				if err == nil || err.Code != tc.code || !strings.Contains(err.Message, tc.contains) {
					t.Fatalf("DecodeAction(%s) = %+v, %v; want %s containing %q", tc.in, a, err, tc.code, tc.contains)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeAction(%s): %v", tc.in, err)
			}
			got, _ := json.Marshal(a)
			want, _ := json.Marshal(tc.want)
			if string(got) != string(want) {
				t.Fatalf("DecodeAction(%s)\n got %s\nwant %s", tc.in, got, want)
			}
		})
	}
}

func TestDecodeResetAndStep(t *testing.T) {
	r, err := DecodeReset([]byte(`{"seed": 7, "episode_id": "e1", "hint": true, "other": [1]}`))
	if err != nil || *r.Seed != 7 || *r.EpisodeID != "e1" || !r.Hint {
		t.Fatalf("DecodeReset = %+v, %v", r, err)
	}
	if r, err := DecodeReset(nil); err != nil || r.Seed != nil {
		t.Fatalf("DecodeReset(empty) = %+v, %v", r, err)
	}
	if r, err := DecodeReset([]byte(`{"seed": 4.0}`)); err != nil || *r.Seed != 4 {
		t.Fatalf("DecodeReset(4.0) = %+v, %v", r, err)
	}
	if r, err := DecodeReset([]byte(`{"seed": 9223372036854775807}`)); err != nil || *r.Seed != 1<<63-1 {
		t.Fatalf("DecodeReset(max int64) = %+v, %v", r, err)
	}
	if r, err := DecodeReset([]byte(`{"seed": "42"}`)); err != nil || *r.Seed != 42 { // pydantic's lax mode
		t.Fatalf("DecodeReset(\"42\") = %+v, %v", r, err)
	}
	for in, contains := range map[string]string{
		// pydantic takes an integer of any size; trace's seeds are int64,
		// and an integer past that is not "not a valid integer".
		`{"seed": 9223372036854775808}`:    "seed: Input should be less than or equal to 9223372036854775807",
		`{"seed": 18446744073709551615}`:   "seed: Input should be less than or equal to 9223372036854775807",
		`{"seed": -1}`:                     "greater than or equal to 0",
		`{"seed": 1.5}`:                    "valid integer",
		`{"seed": "x"}`:                    "valid integer",
		`{"seed": "1e3"}`:                  "unable to parse string as an integer",
		`{"seed": "4.0"}`:                  "unable to parse string as an integer",
		`{"seed": "99999999999999999999"}`: "less than or equal to 9223372036854775807",
		`{"episode_id": 3}`:                "valid string",
		`{"episode_id": "` + strings.Repeat("e", 256) + `"}`: "at most 255",
		`[]`: "must be an object",
	} {
		if _, err := DecodeReset([]byte(in)); err == nil || err.Code != CodeValidation || !strings.Contains(err.Message, contains) {
			t.Errorf("DecodeReset(%.40s) error %v, want VALIDATION_ERROR containing %q", in, err, contains)
		}
	}
	s, err := DecodeStep([]byte(`{"action": {"content": "x"}, "timeout_s": 2.5, "session_id": "s1", "seed": 9}`))
	if err != nil || string(s.Action) != `{"content": "x"}` || *s.TimeoutS != 2.5 || s.SessionID != "s1" || *s.Seed != 9 {
		t.Fatalf("DecodeStep = %+v, %v", s, err)
	}
	for in, contains := range map[string]string{
		`{}`:                                           "action: Field required",
		`{"action": "x"}`:                              "valid dictionary",
		`{"action": {}, "timeout_s": 0}`:               "greater than 0",
		`{"action": {}, "request_id": 5}`:              "request_id",
		`{"action": {}, "session_id": true}`:           "session_id",
		`{"action": {}, "seed": 18446744073709551616}`: "seed: Input should be less than or equal to 9223372036854775807",
	} {
		if _, err := DecodeStep([]byte(in)); err == nil || err.Code != CodeValidation || !strings.Contains(err.Message, contains) {
			t.Errorf("DecodeStep(%s) error %v, want VALIDATION_ERROR containing %q", in, err, contains)
		}
	}
}

func TestDecodeRPC(t *testing.T) {
	r, err := DecodeRPC([]byte(`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"x"},"id":7}`))
	if err != nil || r.Method != "tools/call" || string(r.ID) != "7" || string(r.Params) != `{"name":"x"}` {
		t.Fatalf("DecodeRPC = %+v, %v", r, err)
	}
	r, err = DecodeRPC([]byte(`{"jsonrpc":"2.0","method":"tools/list"}`))
	if err != nil || string(r.Params) != "{}" || r.ID != nil {
		t.Fatalf("DecodeRPC(no params) = %+v, %v", r, err)
	}
	for _, id := range []string{`1.0`, `1e3`, `99999999999999999999`, `-3`, `"abc"`, `0.0e-5`, `100e-2`, `1.50e1`, `1e99999999999999999999`} {
		r, err := DecodeRPC([]byte(`{"jsonrpc":"2.0","method":"m","id":` + id + `}`))
		if err != nil || string(r.ID) != id {
			t.Errorf("DecodeRPC(id %s) = %+v, %v; want the id echoed as sent", id, r, err)
		}
	}
	for in, code := range map[string]int{
		`{`:                              RPCParseError,
		`{"jsonrpc":"1.0","method":"m"}`: RPCInvalidRequest,
		`{"jsonrpc":"2.0"}`:              RPCInvalidRequest,
		`{"jsonrpc":"2.0","method":"m","params":[1]}`:                          RPCInvalidRequest,
		`{"jsonrpc":"2.0","method":"m","id":1.5}`:                              RPCInvalidRequest,
		`{"jsonrpc":"2.0","method":"m","id":true}`:                             RPCInvalidRequest,
		`{"jsonrpc":"2.0","method":"m","id":1e-3}`:                             RPCInvalidRequest,
		`{"jsonrpc":"2.0","method":"m","id":123456789012345678901234567890.5}`: RPCInvalidRequest,
		`{"jsonrpc":"2.0","method":"m","id":1e-99999999999999999999}`:          RPCInvalidRequest,
		`{"jsonrpc":"2.0","method":"m","x":1}`:                                 RPCInvalidRequest,
		`5`:                                                                    RPCInvalidRequest,
	} {
		if _, err := DecodeRPC([]byte(in)); err == nil || err.Code != code {
			t.Errorf("DecodeRPC(%s) = %v, want code %d", in, err, code)
		}
	}
	b, _ := json.Marshal(RPCResponse{ID: json.RawMessage("7"), Result: nil})
	if string(b) != `{"jsonrpc":"2.0","id":7,"result":null}` {
		t.Errorf("success response %s", b)
	}
	b, _ = json.Marshal(RPCResponse{Error: NewRPCError(RPCMethodNotFound, "", nil)})
	if string(b) != `{"jsonrpc":"2.0","id":null,"error":{"code":-32601,"message":"Method not found","data":null}}` {
		t.Errorf("error response %s", b)
	}
}

// FuzzDecodeFrame: the frame decoder never panics, accepts only frames of a
// known type whose data is an object (or absent where allowed), and a frame
// it accepts decodes again to the same frame once re-encoded; the action
// decoder never panics on any step data and gives valid JSON arguments.
func FuzzDecodeFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"reset","data":{"seed":3}}`, `{"type":"step","data":{"role":"assistant","content":"x","tool_calls":[{"id":"1","type":"function","function":{"name":"a","arguments":"{\"b\":1}"}}]}}`,
		`{"type":"state"}`, `{"type":"close"}`, `{"type":"mcp","data":{"jsonrpc":"2.0","method":"tools/list","id":1}}`,
		`{"type":"step","data":{"type":"call_tool","tool_name":"a","arguments":{}}}`, `{"type":`, `[]`, `{"type":"step","data":{"tool_calls":[{"function":{"name":"a","arguments":"[\"x\"]"}}]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := DecodeFrame(b)
		if err != nil {
			if err.Code == "" || err.Message == "" {
				t.Fatalf("error without code or message: %+v", err)
			}
			return
		}
		if _, ok := frameFields[fr.Type]; !ok {
			t.Fatalf("accepted unknown type %q", fr.Type)
		}
		if frameFields[fr.Type].data && !isObject(fr.Data) {
			t.Fatalf("accepted %s frame with data %q", fr.Type, fr.Data)
		}
		again, _ := json.Marshal(fr)
		fr2, err := DecodeFrame(again)
		if err != nil || fr2.Type != fr.Type {
			t.Fatalf("re-encoded frame %s: %+v, %v", again, fr2, err)
		}
		if fr.Type == FrameStep {
			a, err := DecodeAction(fr.Data)
			if err == nil {
				for _, c := range a.ToolCalls {
					if !json.Valid(c.Arguments) || !isObject(c.Arguments) || c.Name == "" {
						t.Fatalf("accepted call %+v", c)
					}
				}
			}
		}
		if fr.Type == FrameReset {
			DecodeReset(fr.Data)
		}
		if fr.Type == FrameMCP {
			DecodeRPC(fr.Data)
		}
	})
}

// TestActionSchemaShape: GET /schema's action schema accepts the messages
// the decoder takes and refuses the shapes it refuses for not being an
// assistant message (type, misplaced calls, none of role, content and
// tool_calls).
func TestActionSchemaShape(t *testing.T) {
	c := jsonschema.NewCompiler()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(Schemas([]string{"a", "t"}).Action))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource("action.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("action.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{`{"role":"assistant","content":"x","function_call":null,"tool_calls":null,"refusal":null}`, true},
		{`{"content":null}`, true},
		{`{"type":null,"content":"x"}`, true},
		{`{"tool_calls":[{"function":{"name":"a","arguments":"{}"}}]}`, true},
		{`{"type":"list_tools"}`, true},
		{`{"type":"call_tool","tool_name":"t","arguments":{}}`, true},
		{`{}`, false},
		{`{"bogus":1}`, false},
		{`{"type":"call_tools","tool_name":"t"}`, false},
		{`{"type":"assistant","content":"x"}`, false},
		{`{"role":"assistant","content":null,"function_call":{"name":"a"}}`, false},
	} {
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(tc.in))
		if err != nil {
			t.Fatal(err)
		}
		if got := sch.Validate(v) == nil; got != tc.want {
			t.Errorf("schema accepts %s: %v, want %v", tc.in, got, tc.want)
		}
		if _, derr := DecodeAction([]byte(tc.in)); (derr == nil) != tc.want {
			t.Errorf("decoder accepts %s: %v, want %v", tc.in, derr == nil, tc.want)
		}
	}
}
