package llmtest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func post(t *testing.T, url, body string) (*http.Response, map[string]any) {
	t.Helper()
	resp, err := http.Post(url+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
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
