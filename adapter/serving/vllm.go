// Package serving loads adapters into the serving engine: vLLM's runtime
// LoRA API (the server started with --enable-lora and
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True). After a load, a chat request
// with `model: <lora_name>` is served by the adapter (vLLM's multi-LoRA
// convention); after an unload, the name is unknown again (404).
//
// The protocol, as vLLM implements it:
//
//	POST {base}/load_lora_adapter   {"lora_name": N, "lora_path": P}
//	  200, a plain-text "Success: LoRA adapter 'N' added successfully."
//	  400 {"error": {"message": "... has already been loaded ...", ...}}  (also: a missing field)
//	  404 {"error": {"message": "Loading lora N failed: No adapter found for P", ...}}
//	  500 {"error": {"type": "InternalServerError", ...}} when the engine refuses it (a rank
//	  above --max-lora-rank, unreadable weights; older versions: 400): not retried
//	POST {base}/unload_lora_adapter {"lora_name": N}
//	  200, plain text; 404 {"error": {"message": "The lora adapter 'N' cannot be found.", ...}}
//	GET  {base}/models lists the base model and every loaded adapter (id = name, root = path,
//	  parent = the base model; the base model has no parent)
//
// Without VLLM_ALLOW_RUNTIME_LORA_UPDATING the routes do not exist, and
// the answer is FastAPI's 404 {"detail": "Not Found"}; older vLLM versions
// send the error fields at the top level instead of under "error". Both
// are understood.
package serving

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Defaults of VLLM.
const (
	DefaultTimeout    = 30 * time.Second
	DefaultMaxElapsed = 2 * time.Minute
)

// VLLM is a vLLM server's runtime LoRA API. Load and Unload retry
// failures another try may fix (connection errors, time-outs, 429, 5xx
// but a load's refusal by vLLM's engine) with capped exponential backoff
// for at most MaxElapsed; other failures are returned at once. Safe for
// concurrent use.
type VLLM struct {
	// BaseURL is the OpenAI API base, ending in /v1 (http://vllm:8000/v1).
	BaseURL string
	// Token is vLLM's --api-key (sent as a bearer token), "" for none.
	Token string
	// Timeout bounds one HTTP attempt (default 30 s; a load reads the
	// adapter's weights). MaxElapsed bounds all attempts (default 2 min).
	Timeout, MaxElapsed time.Duration
	// InitialBackoff is the first wait between attempts (default 500 ms).
	InitialBackoff time.Duration
	HTTPClient     *http.Client
}

// Name is "vllm".
func (v *VLLM) Name() string { return "vllm" }

// Endpoint is the base URL without credentials (for logs and records).
func (v *VLLM) Endpoint() string {
	u, err := url.Parse(v.BaseURL)
	if err != nil {
		return "(invalid URL)"
	}
	u.User = nil
	return strings.TrimRight(u.String(), "/")
}

// Error is a failed load or unload: the attempts made and the last
// status (0 when none came back).
type Error struct {
	Op       string // load_lora_adapter | unload_lora_adapter
	Name     string
	Status   int
	Attempts int
	Msg      string
}

func (e *Error) Error() string {
	s := fmt.Sprintf("vllm %s %q: %s", e.Op, e.Name, e.Msg)
	if e.Status != 0 {
		s = fmt.Sprintf("vllm %s %q: HTTP %d: %s", e.Op, e.Name, e.Status, e.Msg)
	}
	if e.Attempts > 1 {
		s += fmt.Sprintf(" (after %d attempts)", e.Attempts)
	}
	return s
}

// Load loads the adapter at path under name. A name that is already
// loaded from the same path counts as loaded (a retried load whose answer
// was lost); from another path it is an error.
func (v *VLLM) Load(ctx context.Context, name, path string) error {
	if name == "" || path == "" {
		return &Error{Op: "load_lora_adapter", Name: name, Msg: "lora_name and lora_path are required"}
	}
	status, msg, err := v.post(ctx, "load_lora_adapter", name, map[string]string{"lora_name": name, "lora_path": path})
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) && status == http.StatusBadRequest && strings.Contains(msg, "already been loaded") {
		root, found, lerr := v.loaded(ctx, name)
		if lerr != nil {
			return fmt.Errorf("%w; and listing the loaded adapters failed: %v", err, lerr)
		}
		if found && root == path {
			return nil
		}
		if found {
			e.Msg += fmt.Sprintf(" (it is loaded from %s, not %s: unload it first)", root, path)
		}
	}
	return err
}

// Unload unloads the adapter name. An adapter the server does not know is
// already unloaded: not an error.
func (v *VLLM) Unload(ctx context.Context, name string) error {
	status, msg, err := v.post(ctx, "unload_lora_adapter", name, map[string]string{"lora_name": name})
	if err != nil && status == http.StatusNotFound && strings.Contains(msg, "cannot be found") {
		return nil
	}
	return err
}

// Loaded reports whether name is loaded, and from which path (GET /models).
func (v *VLLM) Loaded(ctx context.Context, name string) (path string, ok bool, err error) {
	return v.loaded(ctx, name)
}

func (v *VLLM) client() *http.Client { return cmp.Or(v.HTTPClient, http.DefaultClient) }

func (v *VLLM) url(op string) string { return strings.TrimRight(v.BaseURL, "/") + "/" + op }

// post sends body to op with retries. It returns the last status and the
// server's message with the error.
func (v *VLLM) post(ctx context.Context, op, name string, body any) (int, string, error) {
	data, _ := json.Marshal(body)
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = cmp.Or(v.InitialBackoff, 500*time.Millisecond)
	b.MaxInterval = 10 * time.Second
	b.MaxElapsedTime = cmp.Or(v.MaxElapsed, DefaultMaxElapsed)
	var (
		status   int
		msg      string
		attempts int
	)
	op2 := func() error {
		attempts++
		var err error
		status, msg, err = v.attempt(ctx, op, data)
		if err == nil {
			return nil
		}
		if status == 0 || status == http.StatusTooManyRequests || status >= 500 {
			return err
		}
		return backoff.Permanent(err)
	}
	err := backoff.Retry(op2, backoff.WithContext(b, ctx))
	if err == nil {
		return status, msg, nil
	}
	if ctx.Err() != nil && status == 0 {
		msg = ctx.Err().Error()
	}
	return status, msg, &Error{Op: op, Name: name, Status: status, Attempts: attempts, Msg: msg}
}

func (v *VLLM) attempt(ctx context.Context, op string, data []byte) (int, string, error) {
	actx, cancel := context.WithTimeout(ctx, cmp.Or(v.Timeout, DefaultTimeout))
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, v.url(op), bytes.NewReader(data))
	if err != nil {
		return 0, err.Error(), backoff.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if v.Token != "" {
		req.Header.Set("Authorization", "Bearer "+v.Token)
	}
	resp, err := v.client().Do(req)
	if err != nil {
		msg := err.Error()
		var ue *url.Error
		if errors.As(err, &ue) {
			msg = "POST " + v.Endpoint() + "/" + op + ": " + ue.Err.Error()
		}
		return 0, msg, errors.New(msg)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp.StatusCode, strings.TrimSpace(string(raw)), nil
	}
	msg := errorMessage(raw)
	if op == "load_lora_adapter" && resp.StatusCode == http.StatusInternalServerError && errorType(raw) == "InternalServerError" {
		// vLLM's own answer that its engine refused the adapter: another
		// try reads the same files and is refused again.
		return resp.StatusCode, msg, backoff.Permanent(errors.New(msg))
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && isRouteMissing(raw):
		msg = "the server has no " + op + " route: start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (and --enable-lora)"
	case resp.StatusCode == http.StatusUnauthorized:
		msg = "unauthorized: adapter.serving.token must be vLLM's --api-key"
	}
	return resp.StatusCode, msg, errors.New(msg)
}

// errorMessage reads vLLM's error body: {"error": {"message"}} (current),
// {"message"} (older), {"error": "..."} (the API-key middleware), else the
// body itself, cut.
func errorMessage(raw []byte) string {
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  any             `json:"detail"`
	}
	if json.Unmarshal(raw, &e) == nil {
		var inner struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case len(e.Error) > 0 && json.Unmarshal(e.Error, &inner) == nil && inner.Message != "":
			return inner.Message
		case len(e.Error) > 0 && json.Unmarshal(e.Error, &s) == nil && s != "":
			return s
		case e.Message != "":
			return e.Message
		case e.Detail != nil:
			return fmt.Sprint(e.Detail)
		}
	}
	s := strings.TrimSpace(string(raw))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// errorType is the type of vLLM's error object ({"error": {"type"}}), ""
// for another body.
func errorType(raw []byte) string {
	var e struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &e) != nil {
		return ""
	}
	return e.Error.Type
}

// isRouteMissing: FastAPI's answer to a path it has no route for.
func isRouteMissing(raw []byte) bool {
	var e struct {
		Detail string `json:"detail"`
	}
	return json.Unmarshal(raw, &e) == nil && e.Detail == "Not Found"
}

// model is one entry of GET /models: the base model (no parent) or an
// adapter (id = its name, root = its path, parent = the base model).
type model struct {
	ID     string `json:"id"`
	Root   string `json:"root"`
	Parent string `json:"parent"`
}

func (v *VLLM) models(ctx context.Context) ([]model, error) {
	actx, cancel := context.WithTimeout(ctx, cmp.Or(v.Timeout, DefaultTimeout))
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodGet, v.url("models"), nil)
	if err != nil {
		return nil, err
	}
	if v.Token != "" {
		req.Header.Set("Authorization", "Bearer "+v.Token)
	}
	resp, err := v.client().Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			return nil, fmt.Errorf("GET %s/models: %w", v.Endpoint(), ue.Err)
		}
		return nil, err
	}
	defer resp.Body.Close()
	var list struct {
		Data []model `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/models: HTTP %d", v.Endpoint(), resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("GET %s/models: %w", v.Endpoint(), err)
	}
	return list.Data, nil
}

func (v *VLLM) loaded(ctx context.Context, name string) (string, bool, error) {
	ms, err := v.models(ctx)
	if err != nil {
		return "", false, err
	}
	for _, m := range ms {
		if m.ID == name {
			return m.Root, true, nil
		}
	}
	return "", false, nil
}

// Served lists the adapters the server serves now: name → path (GET
// /models, the entries with a parent; the base model has none). One
// attempt: the caller (the adapt role's reconciliation) tries again later.
func (v *VLLM) Served(ctx context.Context) (map[string]string, error) {
	ms, err := v.models(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, m := range ms {
		if m.Parent != "" && m.ID != "" {
			out[m.ID] = m.Root
		}
	}
	return out, nil
}
