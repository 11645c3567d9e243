package config

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Planner configures the planning agent (adapter.planner): an LLM that may
// adjust each training plan within the bounds, giving its reason. Off by
// default; it uses the llm endpoint (llm.base_url, its key, concurrency
// and audit) with its own model if Model is set.
type Planner struct {
	Enabled     bool    `koanf:"enabled"`
	Model       string  `koanf:"model"`      // default: llm.model
	MaxTokens   int     `koanf:"max_tokens"` // default 512
	Temperature float64 `koanf:"temperature"`
}

// Serving configures loading active adapters into the serving engine
// (adapter.serving): vLLM's runtime LoRA API. Off by default: the registry
// then only records statuses.
type Serving struct {
	Enabled bool `koanf:"enabled"`
	// Engine is the serving engine's API: vllm (the only one).
	Engine string `koanf:"engine"`
	// BaseURL is the engine's OpenAI API base, ending in /v1.
	BaseURL string `koanf:"base_url"`
	Token   string `koanf:"token"` // secret: vLLM's --api-key
	// Timeout bounds one request; RetryFor all the retries of one load or
	// unload.
	Timeout  time.Duration `koanf:"timeout"`
	RetryFor time.Duration `koanf:"retry_for"`
	// ReconcileEvery is how often the adapt role compares what the engine
	// serves with the registry: an active adapter it does not serve (the
	// engine restarted) is loaded again, a retired or rolled-back one it
	// still serves is unloaded. 0 turns it off.
	ReconcileEvery time.Duration `koanf:"reconcile_every"`
	// PathMap rewrites adapter URIs into paths the engine's host sees:
	// "FROM=TO" entries, the longest matching FROM prefix wins (e.g.
	// file:///var/lib/trace/adapters=/models/adapters).
	PathMap []string `koanf:"path_map"`
}

// DefaultPlanner and DefaultServing are the defaults (both off).
func DefaultPlanner() Planner { return Planner{MaxTokens: 512} }

// DefaultServing is adapter.serving's defaults.
func DefaultServing() Serving {
	return Serving{Engine: "vllm", Timeout: 30 * time.Second, RetryFor: 2 * time.Minute, ReconcileEvery: time.Minute}
}

// PathMapOf parses path_map entries.
func PathMapOf(entries []string) (map[string]string, error) {
	m := map[string]string{}
	for _, e := range entries {
		from, to, ok := strings.Cut(e, "=")
		if !ok || from == "" || to == "" {
			return nil, fmt.Errorf("adapter.serving.path_map: %q is not FROM=TO", e)
		}
		m[from] = to
	}
	return m, nil
}

// validateTraining checks adapter.planner, adapter.serving and
// adapter.auto_activate.
func (c Config) validateTraining() []error {
	var errs []error
	p := c.Adapter.Planner
	if p.Enabled {
		if c.LLM.BaseURL == "" {
			errs = append(errs, errors.New("adapter.planner.enabled: needs llm.base_url (the planning agent is an LLM)"))
		}
		if p.Model == "" && c.LLM.Model == "" {
			errs = append(errs, errors.New("adapter.planner.model: required (or llm.model) with adapter.planner.enabled"))
		}
	}
	if p.MaxTokens < 16 || p.MaxTokens > 32768 {
		errs = append(errs, fmt.Errorf("adapter.planner.max_tokens: must be in [16, 32768], got %d", p.MaxTokens))
	}
	if p.Temperature < 0 || p.Temperature > 2 {
		errs = append(errs, fmt.Errorf("adapter.planner.temperature: must be in [0, 2], got %v", p.Temperature))
	}
	s := c.Adapter.Serving
	if s.Engine != "vllm" {
		errs = append(errs, fmt.Errorf("adapter.serving.engine: %q is not vllm", s.Engine))
	}
	if s.Enabled {
		if u, err := url.Parse(s.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("adapter.serving.base_url: %q is not an http(s) URL like http://vllm:8000/v1", s.BaseURL))
		}
	}
	if s.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("adapter.serving.timeout: must be positive, got %s", s.Timeout))
	}
	if s.RetryFor <= 0 { // the client reads 0 as its default (2m), not as "no retries"
		errs = append(errs, fmt.Errorf("adapter.serving.retry_for: must be positive (the time all attempts of one load or unload may take), got %s", s.RetryFor))
	}
	if s.ReconcileEvery < 0 || (s.ReconcileEvery > 0 && s.ReconcileEvery < time.Second) {
		errs = append(errs, fmt.Errorf("adapter.serving.reconcile_every: must be 0 (off) or at least 1s, got %s", s.ReconcileEvery))
	}
	if _, err := PathMapOf(s.PathMap); err != nil {
		errs = append(errs, err)
	}
	return errs
}
