package llmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// Environment of the real-model fixture.
const (
	EnvURL     = "TRACE_TEST_LLM_URL"   // e.g. http://127.0.0.1:18080/v1
	EnvModel   = "TRACE_TEST_LLM_MODEL" // e.g. gemma3-270m; default: the first of GET /models
	EnvRequire = "TRACE_REQUIRE_LLM"    // "1": a missing server fails the test instead of skipping it
)

const startHint = `eval "$(scripts/llm-server.sh start | grep '^TRACE_TEST_LLM_')"`

// RealServer returns the base URL and model name of the real OpenAI-compatible
// server named by $TRACE_TEST_LLM_URL and $TRACE_TEST_LLM_MODEL (a llama.cpp
// server with Gemma 3 270M, started by scripts/llm-server.sh). It skips the
// test with instructions when the variables are unset, unless
// $TRACE_REQUIRE_LLM=1, in which case it fails it. A URL that is set but does
// not answer GET /models fails the test either way.
func RealServer(t testing.TB) (baseURL, model string) {
	t.Helper()
	baseURL = strings.TrimRight(os.Getenv(EnvURL), "/")
	model = os.Getenv(EnvModel)
	if baseURL == "" {
		msg := fmt.Sprintf("no real LLM server: $%s is unset (start one with: %s)", EnvURL, startHint)
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("%s; $%s=1 requires it", msg, EnvRequire)
		}
		t.Skip(msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second) // a llama-cpp-python server answers /models only between completions
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/models", nil)
	if err != nil {
		t.Fatalf("$%s=%q: %v", EnvURL, baseURL, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("real LLM server $%s=%s does not answer GET /models: %v (start it with: %s)", EnvURL, baseURL, err, startHint)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&list) != nil {
		t.Fatalf("real LLM server %s: GET /models answered %s, not a model list", baseURL, resp.Status)
	}
	if model == "" {
		if len(list.Data) == 0 {
			t.Fatalf("real LLM server %s lists no model and $%s is unset", baseURL, EnvModel)
		}
		model = list.Data[0].ID
	}
	return baseURL, model
}
