package serving

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/llmtest"
)

func fast(srv *llmtest.Server, token string) *VLLM {
	return &VLLM{BaseURL: srv.URL, Token: token, InitialBackoff: time.Millisecond, MaxElapsed: 2 * time.Second, Timeout: time.Second}
}

// TestVLLMLoadUnload: a load is retried through 503s and then serves the
// adapter's name; a repeated load of the same path is a success (a retried
// load whose answer was lost), of another path an error; unloading an
// unknown adapter is not an error; a missing path and a wrong token fail
// at once.
func TestVLLMLoadUnload(t *testing.T) {
	ctx := context.Background()
	srv := llmtest.New(t)
	srv.ServeLoRA(llmtest.LoRAOptions{APIKey: "secret"})
	dir, other := t.TempDir(), t.TempDir()
	v := fast(srv, "secret")
	srv.EnqueueLoRA(llmtest.Status(http.StatusServiceUnavailable, "busy"), llmtest.Status(http.StatusServiceUnavailable, "busy"))
	if err := v.Load(ctx, "cap-a", dir); err != nil {
		t.Fatal(err)
	}
	if got := srv.LoadedAdapters()["cap-a"]; got != dir {
		t.Fatalf("loaded %q", got)
	}
	if n := len(srv.LoRACalls()); n != 3 {
		t.Errorf("%d calls, want 2 failed and 1 accepted", n)
	}
	if err := v.Load(ctx, "cap-a", dir); err != nil {
		t.Errorf("a repeated load of the same path: %v", err)
	}
	err := v.Load(ctx, "cap-a", other)
	var ve *Error
	if !errors.As(err, &ve) || ve.Status != 400 || !strings.Contains(err.Error(), "it is loaded from "+dir) {
		t.Errorf("load from another path: %v", err)
	}
	if p, ok, err := v.Loaded(ctx, "cap-a"); err != nil || !ok || p != dir {
		t.Errorf("Loaded: %q %v %v", p, ok, err)
	}
	before := len(srv.LoRACalls())
	err = v.Load(ctx, "cap-b", "/nonexistent/adapter")
	if !errors.As(err, &ve) || ve.Status != 404 || ve.Attempts != 1 || !strings.Contains(err.Error(), "No adapter found for /nonexistent/adapter") {
		t.Errorf("missing path: %v", err)
	}
	if n := len(srv.LoRACalls()) - before; n != 1 {
		t.Errorf("a 404 was retried: %d calls", n)
	}
	if err := fast(srv, "wrong").Load(ctx, "cap-b", dir); !errors.As(err, &ve) || ve.Status != 401 || !strings.Contains(err.Error(), "adapter.serving.token") {
		t.Errorf("wrong token: %v", err)
	}
	if err := v.Unload(ctx, "cap-a"); err != nil {
		t.Fatal(err)
	}
	if len(srv.LoadedAdapters()) != 0 {
		t.Fatalf("still loaded: %v", srv.LoadedAdapters())
	}
	if err := v.Unload(ctx, "cap-a"); err != nil {
		t.Errorf("unloading an unloaded adapter: %v", err)
	}
	// A server that stays down: retried until MaxElapsed, then reported.
	srv.EnqueueLoRA(llmtest.ServerError(), llmtest.ServerError(), llmtest.ServerError(), llmtest.ServerError(), llmtest.ServerError(),
		llmtest.ServerError(), llmtest.ServerError(), llmtest.ServerError(), llmtest.ServerError(), llmtest.ServerError())
	v.MaxElapsed = 50 * time.Millisecond
	if err := v.Load(ctx, "cap-c", dir); !errors.As(err, &ve) || ve.Status != 500 || ve.Attempts < 2 {
		t.Errorf("a server that stays down: %v", err)
	}
	down := &VLLM{BaseURL: "http://127.0.0.1:1/v1", InitialBackoff: time.Millisecond, MaxElapsed: 20 * time.Millisecond}
	if err := down.Load(ctx, "x", dir); !errors.As(err, &ve) || ve.Status != 0 || !strings.Contains(err.Error(), "POST http://127.0.0.1:1/v1/load_lora_adapter") {
		t.Errorf("unreachable: %v", err)
	}
}

func TestErrorBodies(t *testing.T) {
	for _, c := range []struct{ body, msg string }{
		{`{"error": {"message": "m1", "type": "NotFoundError", "code": 404}}`, "m1"},
		{`{"object": "error", "message": "m2", "type": "x", "code": 400}`, "m2"},
		{`{"error": "Unauthorized"}`, "Unauthorized"},
		{`{"detail": "Not Found"}`, "Not Found"},
		{`Internal Server Error`, "Internal Server Error"},
	} {
		if got := errorMessage([]byte(c.body)); got != c.msg {
			t.Errorf("%s: %q", c.body, got)
		}
	}
	if !isRouteMissing([]byte(`{"detail": "Not Found"}`)) || isRouteMissing([]byte(`{"error": {"message": "The lora adapter 'x' cannot be found."}}`)) {
		t.Error("isRouteMissing")
	}
}

// TestVLLMServed: Served lists the loaded adapters with their paths, not
// the base model; a server that is down is an error naming its endpoint.
func TestVLLMServed(t *testing.T) {
	ctx := context.Background()
	srv := llmtest.New(t)
	srv.ServeLoRA(llmtest.LoRAOptions{APIKey: "secret"})
	v := fast(srv, "secret")
	a, b := t.TempDir(), t.TempDir()
	for name, dir := range map[string]string{"cap-a": a, "cap-b": b} {
		if err := v.Load(ctx, name, dir); err != nil {
			t.Fatal(err)
		}
	}
	got, err := v.Served(ctx)
	if err != nil || len(got) != 2 || got["cap-a"] != a || got["cap-b"] != b {
		t.Fatalf("Served: %v %v", got, err)
	}
	srv.RestartLoRA()
	if got, err := v.Served(ctx); err != nil || len(got) != 0 {
		t.Fatalf("Served after a restart: %v %v", got, err)
	}
	srv.SetDown(true)
	if _, err := v.Served(ctx); err == nil || !strings.Contains(err.Error(), "GET "+srv.URL+"/models") {
		t.Fatalf("Served of a server that is down: %v", err)
	}
}

// TestVLLMLoadRefusedByTheEngine: current vLLM answers a load its engine
// refuses (an adapter whose rank exceeds --max-lora-rank, target modules
// the model lacks, unreadable weights) with a 500 of its own error object,
// type InternalServerError (vllm/entrypoints/openai/models/serving.py,
// load_lora_adapter); older versions a 400. Another try reads the same
// files and is refused again: it is reported at once, not retried for
// MaxElapsed. A 500 that is not vLLM's answer (a proxy's, a crash page)
// is still retried (TestVLLMLoadUnload).
func TestVLLMLoadRefusedByTheEngine(t *testing.T) {
	ctx := context.Background()
	srv := llmtest.New(t)
	srv.ServeLoRA(llmtest.LoRAOptions{})
	v := fast(srv, "")
	v.MaxElapsed = time.Minute
	const msg = "LoRA rank 64 is greater than max_lora_rank 16."
	refused := llmtest.Reply{Status: http.StatusInternalServerError,
		Body: `{"error": {"message": "` + msg + `", "type": "InternalServerError", "param": null, "code": 500}}`}
	srv.EnqueueLoRA(refused, refused, refused)
	start := time.Now()
	err := v.Load(ctx, "cap-a", t.TempDir())
	var ve *Error
	if !errors.As(err, &ve) || ve.Status != 500 || ve.Attempts != 1 || !strings.Contains(err.Error(), msg) {
		t.Fatalf("a load the engine refused: %v", err)
	}
	if n := len(srv.LoRACalls()); n != 1 || time.Since(start) > 10*time.Second {
		t.Errorf("%d calls in %s: the engine's refusal was retried", n, time.Since(start))
	}
	srv.DropLoRAFaults()
	// A 500 with a proxy's text body is retried, and the load then succeeds.
	srv.EnqueueLoRA(llmtest.Reply{Status: http.StatusInternalServerError, Body: "Internal Server Error"})
	if err := v.Load(ctx, "cap-a", t.TempDir()); err != nil {
		t.Fatalf("a proxy's 500, then a load: %v", err)
	}
}
