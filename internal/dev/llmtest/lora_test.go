package llmtest

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func postJSON(t *testing.T, url, body, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeLoRA: vLLM's runtime LoRA routes and the model check of chat
// requests (after a load the adapter's name is served; unknown names are
// vLLM's 404).
func TestServeLoRA(t *testing.T) {
	s := New(t)
	chat := func(model string) int {
		st, _ := postJSON(t, s.URL+"/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`, "")
		return st
	}
	s.Handle(func(Request) Reply { return Text("ok") })
	if chat("anything") != 200 {
		t.Fatal("without ServeLoRA every model is served")
	}
	if st, _ := postJSON(t, s.URL+"/load_lora_adapter", `{}`, ""); st != 404 {
		t.Fatalf("without ServeLoRA the LoRA routes do not exist: %d", st)
	}
	s.ServeLoRA(LoRAOptions{APIKey: "k"})
	dir := t.TempDir()
	if chat("cap-a") != 404 || chat(s.Model) != 200 {
		t.Fatal("model check")
	}
	if st, _ := postJSON(t, s.URL+"/load_lora_adapter", `{"lora_name":"cap-a","lora_path":"`+dir+`"}`, ""); st != 401 {
		t.Fatalf("no token: %d", st)
	}
	if st, body := postJSON(t, s.URL+"/load_lora_adapter", `{"lora_name":"cap-a","lora_path":"/nonexistent/x"}`, "k"); st != 404 || !strings.Contains(body, "No adapter found for /nonexistent/x") {
		t.Fatalf("missing path: %d %s", st, body)
	}
	if st, body := postJSON(t, s.URL+"/load_lora_adapter", `{"lora_name":"cap-a","lora_path":"`+dir+`"}`, "k"); st != 200 || body != "Success: LoRA adapter 'cap-a' added successfully." {
		t.Fatalf("load: %d %s", st, body)
	}
	if st, body := postJSON(t, s.URL+"/load_lora_adapter", `{"lora_name":"cap-a","lora_path":"`+dir+`"}`, "k"); st != 400 || !strings.Contains(body, "has already been loaded") {
		t.Fatalf("second load: %d %s", st, body)
	}
	if chat("cap-a") != 200 || s.LoadedAdapters()["cap-a"] != dir {
		t.Fatal("the loaded adapter is not served")
	}
	resp, _ := http.Get(s.URL + "/models")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"id":"cap-a"`) || !strings.Contains(string(b), `"root":"`+dir+`"`) {
		t.Fatalf("models: %s", b)
	}
	s.EnqueueLoRA(ServerError())
	if st, _ := postJSON(t, s.URL+"/unload_lora_adapter", `{"lora_name":"cap-a"}`, "k"); st != 500 {
		t.Fatalf("scripted fault: %d", st)
	}
	if st, _ := postJSON(t, s.URL+"/unload_lora_adapter", `{"lora_name":"cap-a"}`, "k"); st != 200 {
		t.Fatalf("unload: %d", st)
	}
	if st, body := postJSON(t, s.URL+"/unload_lora_adapter", `{"lora_name":"cap-a"}`, "k"); st != 404 || !strings.Contains(body, "cannot be found") {
		t.Fatalf("second unload: %d %s", st, body)
	}
	if chat("cap-a") != 404 {
		t.Fatal("an unloaded adapter is still served")
	}
	calls := s.LoRACalls()
	var got []string
	for _, c := range calls {
		got = append(got, c.Op+":"+http.StatusText(c.Status))
	}
	if strings.Join(got, ",") != "load:Unauthorized,load:Not Found,load:OK,load:Bad Request,unload:Internal Server Error,unload:OK,unload:Not Found" {
		t.Fatalf("calls %v", got)
	}
}

// TestRestartAndDown: RestartLoRA forgets every loaded adapter (a vLLM
// restart), SetDown closes every connection unanswered until it is back.
func TestRestartAndDown(t *testing.T) {
	s := New(t)
	s.ServeLoRA(LoRAOptions{})
	dir := t.TempDir()
	if st, _ := postJSON(t, s.URL+"/load_lora_adapter", `{"lora_name":"cap-a","lora_path":"`+dir+`"}`, ""); st != 200 {
		t.Fatalf("load: %d", st)
	}
	s.RestartLoRA()
	if n := len(s.LoadedAdapters()); n != 0 {
		t.Fatalf("%d adapters loaded after a restart", n)
	}
	s.SetDown(true)
	if resp, err := http.Get(s.URL + "/models"); err == nil {
		resp.Body.Close()
		t.Fatalf("a server that is down answered %s", resp.Status)
	}
	s.SetDown(false)
	if st, _ := postJSON(t, s.URL+"/load_lora_adapter", `{"lora_name":"cap-a","lora_path":"`+dir+`"}`, ""); st != 200 {
		t.Fatalf("load after the restart: %d", st)
	}
}
