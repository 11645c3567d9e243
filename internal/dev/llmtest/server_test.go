package llmtest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// postRaw posts a chat completion request and reads the whole answer.
func postRaw(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func post(t *testing.T, url, body string) (*http.Response, map[string]any) {
	t.Helper()
	resp, b := postRaw(t, url, body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return resp, m
}

func TestServerScriptAndRecord(t *testing.T) {
	s := New(t)
	resp, err := http.Get(s.URL + "/models")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", err, resp)
	}
	resp.Body.Close()
	if r, _ := http.Get(s.URL + "/nope"); r.StatusCode != 404 {
		t.Fatalf("status %d", r.StatusCode)
	}

	s.Enqueue(RateLimited("2"), Reply{Content: "hello", PromptTokens: 9, CompletionTokens: 2})
	s.Handle(func(req Request) Reply { return Text("from handler") })
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object","schema":{"type":"object"}}}`
	r1, _ := post(t, s.URL, body)
	if r1.StatusCode != 429 || r1.Header.Get("Retry-After") != "2" {
		t.Fatalf("%d %v", r1.StatusCode, r1.Header)
	}
	_, m := post(t, s.URL, body)
	usage := m["usage"].(map[string]any)
	if m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"] != "hello" || usage["prompt_tokens"] != 9.0 {
		t.Fatalf("%v", m)
	}
	_, m = post(t, s.URL, body)
	if m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"] != "from handler" {
		t.Fatalf("%v", m)
	}
	reqs := s.Requests()
	if len(reqs) != 3 || reqs[2].Seq != 2 || reqs[0].Chat.ResponseFormatType() != "json_object" || !bytes.Equal(reqs[0].Chat.Schema(), []byte(`{"type":"object"}`)) {
		t.Fatalf("%+v", reqs)
	}
	if r, _ := post(t, s.URL, "{not json"); r.StatusCode != 400 {
		t.Fatalf("status %d", r.StatusCode)
	}
}

func TestServerUnscriptedAndSlow(t *testing.T) {
	s := New(t)
	if r, _ := post(t, s.URL, `{"messages":[]}`); r.StatusCode != 500 {
		t.Fatalf("unscripted status %d", r.StatusCode)
	}
	s.Enqueue(Slow(100*time.Millisecond, Text("late")))
	start := time.Now()
	post(t, s.URL, `{"messages":[]}`)
	if time.Since(start) < 100*time.Millisecond {
		t.Fatal("no delay")
	}
}

func TestLabelsJSONAndAutoLabels(t *testing.T) {
	got := LabelsJSON(Label{"a_b", "NA"}, Label{"a_b", "PRESENT"})
	if got != `{"labels": {"a_b": {"label":"NA","reason":"scripted by llmtest"}, "a_b": {"label":"PRESENT","reason":"scripted by llmtest"}}}` {
		t.Fatalf("%s", got)
	}
	schema := `{"type":"object","properties":{"labels":{"type":"object","required":["x_y","z_w"]}}}`
	req := Request{Chat: ChatRequest{ResponseFormat: json.RawMessage(`{"type":"json_schema","json_schema":{"name":"n","schema":` + schema + `}}`)}}
	rep := AutoLabels(func(_ Request, c string) string { return "LACKING" })(req)
	if rep.Content != LabelsJSON(Label{"x_y", "LACKING"}, Label{"z_w", "LACKING"}) {
		t.Fatalf("%s", rep.Content)
	}
	if rep := AutoLabels(func(Request, string) string { return "NA" })(Request{}); rep.Status != 400 {
		t.Fatal("AutoLabels answered a request without schema")
	}
}

// sseEvents reads a streamed answer: the data of each event, [DONE] included.
func sseEvents(t *testing.T, url, body string) []string {
	t.Helper()
	_, b := postRaw(t, url, body)
	var data []string
	for _, ev := range strings.Split(strings.TrimSpace(string(b)), "\n\n") {
		d, ok := strings.CutPrefix(ev, "data: ")
		if !ok {
			t.Fatalf("event %q is not a data line", ev)
		}
		data = append(data, d)
	}
	return data
}

// TestStreamIncludeUsage: with stream_options.include_usage the stream
// ends, after the finish_reason chunk and before [DONE], in a chunk with
// empty choices and the usage (vLLM's and OpenAI's shape); without it, or
// with NoUsage (an upstream that ignores the option), there is none; a
// stream that fails has none either.
func TestStreamIncludeUsage(t *testing.T) {
	const (
		withUsage = `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
		falseOpt  = `{"model":"m","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"hi"}]}`
		noOpt     = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	)
	s := New(t)
	for _, tc := range []struct {
		name, body string
		rep        Reply
		usage      map[string]any // the last chunk's usage; nil: no usage chunk
		events     int            // data events, [DONE] included
	}{
		{"scripted tokens", withUsage, Reply{Stream: &Stream{Chunks: []string{"Hel", "lo"}}, PromptTokens: 12, CompletionTokens: 2},
			map[string]any{"prompt_tokens": 12.0, "completion_tokens": 2.0, "total_tokens": 14.0}, 5},
		{"estimated tokens", withUsage, StreamText("Hello there, ", "traveller."),
			map[string]any{"prompt_tokens": 1.0, "completion_tokens": 6.0, "total_tokens": 7.0}, 5},
		{"include_usage false", falseOpt, StreamText("Hel", "lo"), nil, 4},
		{"no stream_options", noOpt, StreamText("Hel", "lo"), nil, 4},
		{"NoUsage", withUsage, Reply{Stream: &Stream{Chunks: []string{"Hel", "lo"}}, NoUsage: true}, nil, 4},
		{"error event", withUsage, Reply{Stream: &Stream{Chunks: []string{"Hel", "lo"}, FailAfter: 1, ErrorMessage: "boom"}}, nil, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.Enqueue(tc.rep)
			evs := sseEvents(t, s.URL, tc.body)
			if len(evs) != tc.events {
				t.Fatalf("%d events, want %d: %q", len(evs), tc.events, evs)
			}
			if tc.rep.Stream.FailAfter > 0 {
				if evs[len(evs)-1] == "[DONE]" || strings.Contains(strings.Join(evs, "\n"), `"usage":{`) {
					t.Fatalf("a failed stream: %q", evs)
				}
				return
			}
			if evs[len(evs)-1] != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", evs[len(evs)-1])
			}
			var chunks []map[string]any
			for _, e := range evs[:len(evs)-1] {
				var c map[string]any
				if err := json.Unmarshal([]byte(e), &c); err != nil {
					t.Fatalf("event %q: %v", e, err)
				}
				if c["object"] != "chat.completion.chunk" || c["id"] != "chatcmpl-llmtest" || c["model"] != DefaultModel {
					t.Fatalf("chunk %v", c)
				}
				chunks = append(chunks, c)
			}
			last := chunks[len(chunks)-1]
			if tc.usage == nil {
				for _, c := range chunks {
					if _, ok := c["usage"]; ok {
						t.Fatalf("a usage field without include_usage: %v", c)
					}
				}
				if ch := last["choices"].([]any); len(ch) != 1 || ch[0].(map[string]any)["finish_reason"] != "stop" {
					t.Fatalf("last chunk %v, want the finish_reason", last)
				}
				return
			}
			if ch, ok := last["choices"].([]any); !ok || len(ch) != 0 || !reflect.DeepEqual(last["usage"], tc.usage) {
				t.Fatalf("last chunk %v, want choices [] and usage %v", last, tc.usage)
			}
			if ch := chunks[len(chunks)-2]["choices"].([]any); len(ch) != 1 || ch[0].(map[string]any)["finish_reason"] != "stop" {
				t.Fatalf("the chunk before the usage %v, want the finish_reason", chunks[len(chunks)-2])
			}
			for _, c := range chunks[:len(chunks)-1] {
				if u, ok := c["usage"]; !ok || u != nil {
					t.Fatalf("chunk %v: want usage null before the usage chunk (OpenAI's shape)", c)
				}
			}
		})
	}
}
