package envserver

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/traceops/trace/synthesizer/envprog"
)

// The hand encoder writes what json.Marshal writes, byte for byte.
func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", `quote " and \ backslash`, "<b>&amp;</b>", "tab\tnl\nret\rbs\bff\f", "\x00\x01\x1f\x7f",
		"héllo wörld ✓ 😀", "bad \xff utf8 \xc3", "\u2028\u2029", `{"user_id": "mia_kim_123"}`} {
		want, _ := json.Marshal(s)
		if got := appendString(nil, s); string(got) != string(want) {
			t.Errorf("appendString(%q) = %s, json.Marshal gives %s", s, got, want)
		}
	}
}

func FuzzAppendString(f *testing.F) {
	f.Add("a<b>\"c\\\u2028\xff")
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := appendString(nil, s); string(got) != string(want) {
			t.Fatalf("appendString(%q) = %s, json.Marshal gives %s", s, got, want)
		}
	})
}

func TestAppendMessageMatchesChatMessage(t *testing.T) {
	for _, tc := range []struct {
		m    envprog.Message
		hint string
	}{
		{envprog.Message{Role: "system", Content: "policy <text>"}, ""},
		{envprog.Message{Role: "system", Content: "policy"}, "look it up & check"},
		{envprog.Message{Role: "user", Content: "hi, I'm mia"}, ""},
		{envprog.Message{Role: "assistant", Content: ""}, ""},
		{envprog.Message{Role: "assistant", Content: "let me look", ToolCalls: []envprog.ToolCall{
			{ID: "c1", Name: "get_user_details", Arguments: json.RawMessage(`{"user_id":"x"}`)},
			{ID: "c2", Name: "noargs"}}}, ""},
		{envprog.Message{Role: "tool", Content: `{"a":[1,2],"b":"<x>"}`, ToolCallID: "c1", Name: "get_user_details"}, ""},
	} {
		m := chatMessages([]envprog.Message{tc.m})[0]
		if tc.hint != "" {
			m.Content += "\n\n" + envprog.HintOpen + tc.hint + envprog.HintClose
		}
		want, _ := json.Marshal(m)
		got, span := appendMessage([]byte("xx"), tc.m, tc.hint)
		if string(got[2:]) != string(want) {
			t.Errorf("appendMessage(%+v) = %s, json.Marshal gives %s", tc.m, got[2:], want)
		}
		if c, _ := json.Marshal(m.Content); string(got[span[0]:span[1]]) != string(c) {
			t.Errorf("content span of %+v is %s, want %s", tc.m, got[span[0]:span[1]], c)
		}
	}
}

// A ResponseWriter that cannot be hijacked is still refused with 501 (the
// big write buffer wraps only writers that can be).
func TestAcceptWithoutHijacker(t *testing.T) {
	req := httptest.NewRequest("GET", "/ws", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	rec := httptest.NewRecorder()
	if _, err := (&Server{}).accept(rec, req); err == nil || rec.Code != http.StatusNotImplemented {
		t.Fatalf("accept on a recorder: %v, status %d; want an error and 501", err, rec.Code)
	}
	if canHijack(rec) || !canHijack(bigWriter{struct {
		http.ResponseWriter
		http.Hijacker
	}{rec, nil}}) {
		t.Fatal("canHijack")
	}
}
