package router

import (
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
