package llmtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// vLLM's runtime LoRA API (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), as the
// server serves it after ServeLoRA:
//
//	POST /v1/load_lora_adapter   {"lora_name", "lora_path"} → 200 text; 400 already loaded
//	                             or a field missing; 404 when lora_path does not exist
//	POST /v1/unload_lora_adapter {"lora_name"} → 200 text; 404 when it is not loaded
//	GET  /v1/models              the base model and every loaded adapter (root = path)
//
// and chat requests must then name the base model or a loaded adapter:
// any other model is a 404 NotFoundError, as vLLM answers. Without
// ServeLoRA the server accepts every model and has no such routes.

// LoRAOptions configure ServeLoRA.
type LoRAOptions struct {
	// APIKey, when set, is required as a bearer token on the LoRA routes
	// (vLLM's --api-key; 401 {"error": "Unauthorized"} otherwise).
	APIKey string
	// AnyPath skips the check that lora_path exists on disk.
	AnyPath bool
	// BeforeLoad, when set, is called with a load's lora_name before the
	// load is answered, outside the server's lock: a test that blocks in
	// it makes a slow load (a large adapter's weights being read).
	BeforeLoad func(name string)
}

// LoRACall is one request to a LoRA route.
type LoRACall struct {
	Op     string // load | unload
	Name   string
	Path   string
	Status int // what the server answered
	Header http.Header
	Time   time.Time
}

type loraState struct {
	opts   LoRAOptions
	loaded map[string]string // name → path
	calls  []LoRACall
	faults []Reply // answered, in order, before the routes do their work
}

// ServeLoRA turns on the runtime LoRA routes and the model check of chat
// requests.
func (s *Server) ServeLoRA(opts LoRAOptions) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lora = &loraState{opts: opts, loaded: map[string]string{}}
}

// EnqueueLoRA queues replies (faults such as ServerError()) that the LoRA
// routes answer, one per request, before they do their work again.
func (s *Server) EnqueueLoRA(replies ...Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lora != nil {
		s.lora.faults = append(s.lora.faults, replies...)
	}
}

// DropLoRAFaults forgets the queued faults the LoRA routes have not
// answered yet, and returns how many there were.
func (s *Server) DropLoRAFaults() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lora == nil {
		return 0
	}
	n := len(s.lora.faults)
	s.lora.faults = nil
	return n
}

// RestartLoRA simulates a restart of the engine: every loaded adapter is
// forgotten (vLLM's runtime-loaded adapters live only in the process's
// memory), the queued faults too; the calls stay recorded.
func (s *Server) RestartLoRA() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lora != nil {
		s.lora.loaded = map[string]string{}
		s.lora.faults = nil
	}
}

// LoadedAdapters returns the loaded adapters: name → path.
func (s *Server) LoadedAdapters() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	if s.lora != nil {
		for k, v := range s.lora.loaded {
			out[k] = v
		}
	}
	return out
}

// LoRACalls returns every request to the LoRA routes, in arrival order.
func (s *Server) LoRACalls() []LoRACall {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lora == nil {
		return nil
	}
	return slices.Clone(s.lora.calls)
}

// serveLoRA answers the LoRA routes and GET /v1/models when ServeLoRA is
// on; false leaves the request to serve.
func (s *Server) serveLoRA(w http.ResponseWriter, r *http.Request) bool {
	s.mu.Lock()
	on := s.lora != nil
	s.mu.Unlock()
	if !on {
		return false
	}
	switch {
	case r.URL.Path == "/v1/models" && r.Method == http.MethodGet:
		s.mu.Lock()
		data := []any{map[string]any{"id": s.Model, "object": "model", "owned_by": "llmtest", "root": s.Model}}
		names := make([]string, 0, len(s.lora.loaded))
		for n := range s.lora.loaded {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			data = append(data, map[string]any{"id": n, "object": "model", "owned_by": "llmtest", "root": s.lora.loaded[n], "parent": s.Model})
		}
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
		return true
	case (r.URL.Path == "/v1/load_lora_adapter" || r.URL.Path == "/v1/unload_lora_adapter") && r.Method == http.MethodPost:
		s.loraRoute(w, r)
		return true
	}
	return false
}

func vllmError(status int, typ, msg string) map[string]any {
	return map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}}
}

func (s *Server) loraRoute(w http.ResponseWriter, r *http.Request) {
	op := "load"
	if strings.HasSuffix(r.URL.Path, "/unload_lora_adapter") {
		op = "unload"
	}
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	jerr := json.Unmarshal(body, &req)
	if op == "load" && jerr == nil {
		s.mu.Lock()
		hook := s.lora.opts.BeforeLoad
		s.mu.Unlock()
		if hook != nil {
			hook(req.Name)
		}
	}
	call := LoRACall{Op: op, Header: r.Header.Clone(), Time: time.Now()}
	s.mu.Lock()
	st := s.lora
	answer := func(status int, v any) {
		call.Status = status
		st.calls = append(st.calls, call)
		s.mu.Unlock()
		if text, ok := v.(string); ok {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, text)
			return
		}
		writeJSON(w, status, v)
	}
	if jerr != nil {
		answer(http.StatusBadRequest, vllmError(400, "BadRequestError", "body is not JSON: "+jerr.Error()))
		return
	}
	call.Name, call.Path = req.Name, req.Path
	if k := st.opts.APIKey; k != "" && r.Header.Get("Authorization") != "Bearer "+k {
		answer(http.StatusUnauthorized, map[string]any{"error": "Unauthorized"})
		return
	}
	if len(st.faults) > 0 {
		f := st.faults[0]
		st.faults = st.faults[1:]
		status := cmpStatus(f.Status)
		if f.Body != "" {
			call.Status = status
			st.calls = append(st.calls, call)
			s.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, f.Body)
			return
		}
		answer(status, vllmError(status, "InternalServerError", http.StatusText(status)))
		return
	}
	if op == "unload" {
		if req.Name == "" {
			answer(http.StatusBadRequest, vllmError(400, "InvalidUserInput", "'lora_name' needs to be provided to unload a LoRA adapter."))
			return
		}
		if _, ok := st.loaded[req.Name]; !ok {
			answer(http.StatusNotFound, vllmError(404, "NotFoundError", fmt.Sprintf("The lora adapter '%s' cannot be found.", req.Name)))
			return
		}
		delete(st.loaded, req.Name)
		answer(http.StatusOK, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.Name))
		return
	}
	if req.Name == "" || req.Path == "" {
		answer(http.StatusBadRequest, vllmError(400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."))
		return
	}
	if _, ok := st.loaded[req.Name]; ok {
		answer(http.StatusBadRequest, vllmError(400, "InvalidUserInput", fmt.Sprintf("The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", req.Name)))
		return
	}
	if !st.opts.AnyPath {
		if _, err := os.Stat(req.Path); err != nil {
			answer(http.StatusNotFound, vllmError(404, "NotFoundError", fmt.Sprintf("Loading lora %s failed: No adapter found for %s", req.Name, req.Path)))
			return
		}
	}
	st.loaded[req.Name] = req.Path
	answer(http.StatusOK, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.Name))
}

func cmpStatus(s int) int {
	if s == 0 {
		return http.StatusOK
	}
	return s
}

// rejectModel answers a chat request for a model the server does not
// serve (ServeLoRA on: not the base model nor a loaded adapter) with
// vLLM's 404, and reports whether it did.
func (s *Server) rejectModel(w http.ResponseWriter, model string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lora == nil || model == "" || model == s.Model {
		return false
	}
	if _, ok := s.lora.loaded[model]; ok {
		return false
	}
	writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{"message": fmt.Sprintf("The model `%s` does not exist.", model),
		"type": "NotFoundError", "param": "model", "code": 404}})
	return true
}
