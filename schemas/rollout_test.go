package schemas

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

const validRollout = `{"rollout_id":"r1","environment":"tau2-airline","agent":{"name":"a","version":"v1"},"task_id":"7",
 "start_time":"2026-01-01T00:00:00Z","end_time":"2026-01-01T00:01:00Z","outcome":{"reward":0.5},
 "messages":[{"role":"system","content":"policy"},{"role":"user","content":"hi"},
  {"role":"assistant","content":null,"tool_calls":[{"id":"c1","name":"get_user","arguments":{"user_id":"u1"}}]},
  {"role":"tool","tool_call_id":"c1","content":"{}","error":false},
  {"role":"assistant","content":"done","tool_calls":[{"id":"c2","name":"toggle","arguments":{},"requestor":"user"}]}],
 "tools":[{"type":"function","function":{"name":"get_user","parameters":{"type":"object"}}}],
 "grader":{"reasons":["db mismatch"],"breakdown":{"DB":0}},"metadata":{"k":1}}`

func TestDecodeRolloutValid(t *testing.T) {
	r, err := DecodeRollout([]byte(validRollout), DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.RolloutID != "r1" || r.Key() != "tau2-airline/v1" || r.Succeeded() || len(r.Messages) != 5 {
		t.Fatalf("decoded %+v", r)
	}
	if tc := r.Messages[2].ToolCalls[0]; tc.ID != "c1" || tc.Arguments["user_id"] != "u1" {
		t.Fatalf("tool call %+v", tc)
	}
	if r.Messages[3].ToolCallID != "c1" || r.Messages[4].ToolCalls[0].Requestor != "user" {
		t.Fatalf("tool result/requestor lost: %+v", r.Messages[3:])
	}
}

func TestSuccessDefaultsToRewardOne(t *testing.T) {
	tests := []struct {
		outcome string
		want    bool
	}{
		{`{"reward":1.0}`, true},
		{`{"reward":1}`, true},
		{`{"reward":0.999}`, false},
		{`{"reward":0.2,"success":true}`, true},
		{`{"reward":1.0,"success":false}`, false},
	}
	for _, tt := range tests {
		doc := strings.Replace(validRollout, `{"reward":0.5}`, tt.outcome, 1)
		r, err := DecodeRollout([]byte(doc), DecodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Succeeded() != tt.want {
			t.Errorf("outcome %s: success %v, want %v", tt.outcome, r.Succeeded(), tt.want)
		}
	}
}

func TestDecodeRolloutRejects(t *testing.T) {
	mod := func(old, new string) string { return strings.Replace(validRollout, old, new, 1) }
	tests := []struct {
		name, doc, reason, path, rule string
	}{
		{"empty", "  ", ReasonEmpty, "", ""},
		{"not json", "{not json", ReasonNotJSON, "", ""},
		{"trailing garbage", validRollout + "x", ReasonNotJSON, "", ""},
		{"invalid utf8", mod(`"hi"`, "\"h\xffi\""), ReasonInvalidUTF8, "", ""},
		{"NaN reward", mod(`{"reward":0.5}`, `{"reward":NaN}`), ReasonNonFiniteReward, "/outcome/reward", ""},
		{"Infinity reward", mod(`{"reward":0.5}`, `{"reward":-Infinity}`), ReasonNonFiniteReward, "/outcome/reward", ""},
		{"overflowing reward", mod(`{"reward":0.5}`, `{"reward":1e999}`), ReasonNonFiniteReward, "/outcome/reward", ""},
		{"missing rollout_id", mod(`"rollout_id":"r1",`, ``), ReasonSchema, "/", "required"},
		{"reward is a string", mod(`{"reward":0.5}`, `{"reward":"0.5"}`), ReasonSchema, "/outcome/reward", "type"},
		{"bad role", mod(`"role":"user"`, `"role":"robot"`), ReasonSchema, "/messages/1/role", ""},
		{"tool result without call id", mod(`"tool_call_id":"c1",`, ``), ReasonSchema, "/messages/3", "required"},
		{"arguments not an object", mod(`"arguments":{"user_id":"u1"}`, `"arguments":"u1"`), ReasonSchema, "/messages/2/tool_calls/0/arguments", ""},
		{"bad time", mod(`"2026-01-01T00:00:00Z"`, `"yesterday"`), ReasonSchema, "/start_time", "format"},
		{"no messages", mod(`"messages":[`, `"messages":[],"x":[`), ReasonSchema, "/messages", ""},
		{"top level array", `[1,2]`, ReasonSchema, "/", "type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeRollout([]byte(tt.doc), DecodeOptions{})
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v, want *Error", err)
			}
			if e.Reason != tt.reason {
				t.Fatalf("reason %q, want %q (%v)", e.Reason, tt.reason, e)
			}
			if tt.path != "" && e.Path != tt.path {
				t.Fatalf("path %q, want %q (%v)", e.Path, tt.path, e)
			}
			if tt.rule != "" && !strings.Contains(e.Rule, tt.rule) {
				t.Fatalf("rule %q, want it to contain %q (%v)", e.Rule, tt.rule, e)
			}
		})
	}
}

// TestConfluentFramingIsNamed: a rollout produced with a Confluent Schema
// Registry serializer (a 0 byte and a 4-byte schema id before the JSON),
// or after a UTF-8 byte order mark, is not JSON, and its dead letter says
// what it looks like and what to do.
func TestConfluentFramingIsNamed(t *testing.T) {
	for name, prefix := range map[string]string{"schema id 7": "\x00\x00\x00\x00\x07", "schema id 100000 (bytes above 0x7f)": "\x00\x00\x01\x86\xa0"} {
		_, err := DecodeRollout([]byte(prefix+validRollout), DecodeOptions{})
		var e *Error
		if !errors.As(err, &e) || (e.Reason != ReasonNotJSON && e.Reason != ReasonInvalidUTF8) {
			t.Fatalf("%s: err = %v, want not_json or invalid_utf8", name, err)
		}
		if !strings.Contains(e.Error(), "Confluent Schema Registry wire format") || !strings.Contains(e.Error(), strings.Fields(name)[2]) {
			t.Errorf("%s: %v, want it to name the Confluent wire format and the schema id", name, err)
		}
	}
	if _, err := DecodeRollout([]byte("{not json"), DecodeOptions{}); err == nil || strings.Contains(err.Error(), "Confluent") || strings.Contains(err.Error(), "byte order mark") {
		t.Errorf("plain garbage: %v, want no framing hint", err)
	}
	// A UTF-8 byte order mark before the JSON: not JSON, and named.
	_, err := DecodeRollout([]byte("\ufeff"+validRollout), DecodeOptions{})
	var e *Error
	if !errors.As(err, &e) || e.Reason != ReasonNotJSON || !strings.Contains(e.Error(), "UTF-8 byte order mark") {
		t.Errorf("a rollout after a BOM: %v, want not_json naming the byte order mark", err)
	}
}

func TestSizeLimit(t *testing.T) {
	if _, err := DecodeRollout([]byte(validRollout), DecodeOptions{MaxBytes: 100}); err == nil || err.(*Error).Reason != ReasonTooLarge {
		t.Fatalf("err = %v, want too_large", err)
	}
	big := strings.Replace(validRollout, `"hi"`, `"`+strings.Repeat("x", DefaultMaxBytes)+`"`, 1)
	if _, err := DecodeRollout([]byte(big), DecodeOptions{}); err == nil || err.(*Error).Reason != ReasonTooLarge {
		t.Fatalf("default limit: err = %v, want too_large", err)
	}
}

func TestRoundTrip(t *testing.T) {
	r, err := DecodeRollout([]byte(validRollout), DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := DecodeRollout(b, DecodeOptions{})
	if err != nil {
		t.Fatalf("re-encoded rollout invalid: %v\n%s", err, b)
	}
	if r2.Messages[2].ToolCalls[0].ID != "c1" {
		t.Fatal("round trip lost tool call")
	}
}

func TestDecodeLabel(t *testing.T) {
	good := `{"rollout_id":"r1","environment":"e","agent_version":"v1","dictionary_version":1,"capability":"multi_step_completion","run":3,"label":"LACKING","success":false,"source":"external"}`
	l, err := DecodeLabel([]byte(good), DecodeOptions{})
	if err != nil || l.Run != 3 || l.Label != LabelLacking {
		t.Fatalf("%+v %v", l, err)
	}
	for _, bad := range []string{
		strings.Replace(good, `"LACKING"`, `"MAYBE"`, 1),
		strings.Replace(good, `"multi_step_completion"`, `"Multi Step"`, 1),
		strings.Replace(good, `"run":3`, `"run":-1`, 1),
		strings.Replace(good, `"source":"external"`, `"source":"external","extra":1`, 1),
	} {
		if _, err := DecodeLabel([]byte(bad), DecodeOptions{}); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func FuzzDecodeRollout(f *testing.F) {
	f.Add([]byte(validRollout))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"outcome":{"reward":NaN}}`))
	f.Add([]byte("\xff\xfe"))
	f.Add([]byte(`{"rollout_id":"x","environment":"e","agent":{"name":"a","version":"1"},"task_id":"t","outcome":{"reward":1e400},"messages":[{"role":"user"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRollout(data, DecodeOptions{MaxBytes: 1 << 16})
		if err == nil {
			if r == nil || r.RolloutID == "" || len(r.Messages) == 0 {
				t.Fatalf("accepted an invalid rollout: %q", data)
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) || e.Reason == "" {
			t.Fatalf("rejection without a reason: %v", err)
		}
	})
}
