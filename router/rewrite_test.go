package router

import (
	"encoding/json"
	"strings"
	"testing"
)

// The forwarded body is the caller's byte for byte except the value of
// the top-level "model"; what is not one JSON object is refused.
func TestScanChatWithModel(t *testing.T) {
	const model = `"lora-1"`
	for _, tc := range []struct {
		name, in, want     string
		metadata, messages string
		stream             bool
	}{
		{name: "replaced in place, order and spacing kept",
			in:       `{"messages":[{"role":"user","content":"hi <b>&</b>"}], "model" : "m",  "z":1.50}`,
			want:     `{"messages":[{"role":"user","content":"hi <b>&</b>"}], "model" : "lora-1",  "z":1.50}`,
			messages: `[{"role":"user","content":"hi <b>&</b>"}]`},
		{name: "added first when absent",
			in:       ` {"stream":true,"metadata":{"conversation_id":"c","model":"inner"}}`,
			want:     ` {"model":"lora-1","stream":true,"metadata":{"conversation_id":"c","model":"inner"}}`,
			metadata: `{"conversation_id":"c","model":"inner"}`, stream: true},
		{name: "empty object", in: `{}`, want: `{"model":"lora-1"}`},
		{name: "empty object with space", in: "{ \n}", want: "{\"model\":\"lora-1\" \n}"},
		{name: "model of another type", in: `{"model":{"a":[1,2]},"stream":false}`, want: `{"model":"lora-1","stream":false}`},
		{name: "duplicates all replaced", in: `{"model":"a","x":null,"model":"b"}`, want: `{"model":"lora-1","x":null,"model":"lora-1"}`},
		{name: "escaped name", in: `{"mod\u0065l":"a","stre\u0061m":true}`, want: `{"mod\u0065l":"lora-1","stre\u0061m":true}`, stream: true},
		{name: "nested model untouched", in: `{"tools":[{"model":"t"}],"model":"m"}`, want: `{"tools":[{"model":"t"}],"model":"lora-1"}`},
		{name: "stream not a bool", in: `{"stream":"yes","model":"m"}`, want: `{"stream":"yes","model":"lora-1"}`},
		{name: "unicode and escapes kept", in: `{"messages":"\u00e9\n✓","model":"m"}`, want: `{"messages":"\u00e9\n✓","model":"lora-1"}`, messages: `"\u00e9\n✓"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := scanChat([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if got := string(c.withModel([]byte(model))); got != tc.want {
				t.Fatalf("forwarded\n%s\nwant\n%s", got, tc.want)
			}
			if string(c.metadata) != tc.metadata || string(c.messages) != tc.messages {
				t.Fatalf("metadata %q messages %q, want %q %q", c.metadata, c.messages, tc.metadata, tc.messages)
			}
			if got := string(c.stream) == "true"; got != tc.stream {
				t.Fatalf("stream %v, want %v", got, tc.stream)
			}
		})
	}
	for _, bad := range []string{``, `[]`, `"x"`, `null`, `{"model":"m"`, `{"model":"m"} {}`, `{"model":"m"}x`, `{"a":1,}`, `{"a" 1}`, `{'a':1}`, `{"a":tru}`, strings.Repeat("[", 20) + "{}"} {
		if _, err := scanChat([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// readMetadata reads what encoding/json decodes into metadata, for any
// JSON value (the proxy validated the body before).
func FuzzReadMetadata(f *testing.F) {
	for _, seed := range []string{
		`{"conversation_id":"c1","environment":"airline","agent_version":"v2","user":"u"}`,
		`{"CONVERSATION_ID":"a","Conversation_Id":"b"}`,
		`{"conversation_id":"a","conversation_id":null}`,
		`{"conversation_id":7,"environment":["x"],"agent_version":{"v":1}}`,
		`{"conversation_\u0069d":"esc","environment":"caf\u00e9 \ud83d\ude00","nested":{"conversation_id":"no"}}`,
		`{"conversation_id":"a\"b\\c\n"}`,
		`{"ﬀ":"x","conversation_ıd":"dotless"}`,
		"{\"conversation_id\":\"a\xffb\xc3\"}", `{"environment":"\ud800x"}`,
		`"a string"`, `null`, `[{"conversation_id":"x"}]`, `{}`, `12`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want metadata
		if !json.Valid(raw) {
			t.Skip("the proxy validated the body before")
		}
		_ = json.Unmarshal(raw, &want)
		if got := readMetadata(raw); got != want {
			t.Fatalf("readMetadata(%s) = %+v, encoding/json %+v", raw, got, want)
		}
	})
}
