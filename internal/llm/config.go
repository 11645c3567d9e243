package llm

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"
)

// Defaults of Config. A zero field means "use the default"; WithDefaults
// fills them in and Validate checks the result.
const (
	DefaultTimeout        = 60 * time.Second
	DefaultMaxAttempts    = 4
	DefaultBackoffInitial = 500 * time.Millisecond
	DefaultBackoffMax     = 30 * time.Second
	DefaultMaxRetryAfter  = 2 * time.Minute
	DefaultConcurrency    = 4
	DefaultTemperature    = 1.0

	// MaxAttemptsLimit bounds MaxAttempts (the audit row stores the attempt
	// number as UInt8).
	MaxAttemptsLimit = 50

	// MaxTokensGrowth bounds how far Chat raises a cut answer's token cap
	// for the attempts after it: each doubles it, up to this many times
	// the request's (or Config.MaxTokens).
	MaxTokensGrowth = 4
)

// Environment variables consulted, in this order, when Config.APIKey is empty.
const (
	EnvAPIKey       = "TRACE_LLM_API_KEY"
	EnvOpenAIAPIKey = "OPENAI_API_KEY"
)

// StructuredOutput selects how a request's JSON Schema (Request.Schema) is
// sent to the server. Requests without a Schema never send response_format.
type StructuredOutput string

const (
	// StructuredJSONSchema sends OpenAI structured outputs:
	// {"type":"json_schema","json_schema":{"name":…,"schema":…,"strict":true}}.
	// OpenAI, vLLM, Ollama (/v1) and llama.cpp's own llama-server accept it.
	StructuredJSONSchema StructuredOutput = "json_schema"
	// StructuredJSONObject sends {"type":"json_object"}: any JSON object, the
	// schema is enforced by validation (and retries) only.
	StructuredJSONObject StructuredOutput = "json_object"
	// StructuredJSONObjectSchema sends {"type":"json_object","schema":…}, the
	// form llama-cpp-python's server turns into a grammar (constrained
	// decoding). Use it for llama-cpp-python, which (0.3.x) rejects
	// "json_schema" — with an HTTP 500, so that mode would burn every attempt
	// on it; other servers may ignore "schema".
	StructuredJSONObjectSchema StructuredOutput = "json_object_schema"
	// StructuredNone sends no response_format; the prompt alone asks for JSON.
	StructuredNone StructuredOutput = "none"
)

// Secret is a credential. Its String, GoString, LogValue and MarshalJSON
// never reveal it, so a Config can be printed or logged whole.
type Secret string

const redacted = "[REDACTED]"

func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString implements fmt.GoStringer (%#v).
func (s Secret) GoString() string { return fmt.Sprintf("%q", s.String()) }

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON writes the redacted form.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(fmt.Sprintf("%q", s.String())), nil }

// Reveal returns the secret itself, for the Authorization header only.
func (s Secret) Reveal() string { return string(s) }

// Config configures a Client. Only BaseURL and Model are required.
type Config struct {
	// BaseURL is the OpenAI-compatible API root including its version path,
	// e.g. https://api.openai.com/v1, http://127.0.0.1:8000/v1 (vLLM),
	// http://127.0.0.1:11434/v1 (Ollama), http://127.0.0.1:18080/v1
	// (llama-cpp-python). Requests go to BaseURL + "/chat/completions"
	// (NormalizeBaseURL adds a missing /v1).
	BaseURL string
	// Model is sent as "model" in every request and recorded in the audit.
	Model string
	// APIKey is sent as "Authorization: Bearer …" and nowhere else: it never
	// appears in logs, errors or audit rows. Empty means $TRACE_LLM_API_KEY,
	// then $OPENAI_API_KEY, then no Authorization header (local servers).
	APIKey Secret

	// Timeout bounds one HTTP attempt (connect to last byte). Default 60s.
	Timeout time.Duration
	// MaxAttempts is the number of HTTP attempts per Chat call, the first
	// included. Default 4.
	MaxAttempts int
	// Retries wait with capped exponential backoff (with jitter) from
	// BackoffInitial to BackoffMax. Defaults 500ms and 30s.
	BackoffInitial time.Duration
	BackoffMax     time.Duration
	// MaxRetryAfter caps the wait a server asks for with Retry-After (or
	// retry-after-ms) on a 429. Default 2m.
	MaxRetryAfter time.Duration

	// Concurrency bounds the HTTP requests in flight across all calls of the
	// client (a slot is held for one attempt, not during backoff). Default 4.
	Concurrency int
	// RatePerSecond limits the attempts started per second across all calls
	// of the client (burst 1). 0 means unlimited.
	RatePerSecond float64

	// Temperature is sent with every request unless the Request overrides
	// it. nil means 1.0: independent labeling runs need sampling.
	Temperature *float64
	// MaxTokens is sent as max_tokens unless the Request sets its own.
	// 0 sends none (the server's default).
	MaxTokens int
	// StructuredOutput selects the response_format of requests that carry a
	// Schema. Default StructuredJSONSchema.
	StructuredOutput StructuredOutput
	// ExtraBody are further top-level fields of every request (the OpenAI
	// SDK's extra_body), e.g. vLLM's chat_template_kwargs: {enable_thinking:
	// false} for a reasoning model whose thinking would use up max_tokens.
	// A request's own Extra wins for a key both set; neither replaces a
	// field the client sets itself. New refuses the fields of OwnFields.
	ExtraBody map[string]any

	// Recorder receives one audit row per HTTP attempt. Nil records nothing.
	Recorder Recorder
	// HTTPClient carries TLS and proxies. Nil means a client with its own
	// transport sized to Concurrency. Its Timeout should be 0: attempts are
	// bounded by Timeout through their context.
	HTTPClient *http.Client
	// Logger receives retry warnings (never the key or the prompt). Nil
	// discards them.
	Logger *slog.Logger
}

// OwnFields are the request fields the client sets itself, or that would
// change the answer's shape (a stream, several choices): Config.ExtraBody
// may not set them.
var OwnFields = []string{"model", "messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs",
	"response_format", "stream", "stream_options", "n"}

// CheckExtraBody names the first field of extra in OwnFields, as
// <key>.<field>, key naming the setting (e.g. llm.extra_body).
func CheckExtraBody(key string, extra map[string]any) error {
	return CheckOwnFields(key, "the client", OwnFields, extra)
}

// CheckOwnFields names the first field (in sorted order) of extra, an
// extra_body setting named key, that is in own, the fields who sets itself:
// "<key>.<field>: <who> sets <field> itself (…)".
func CheckOwnFields(key, who string, own []string, extra map[string]any) error {
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		if slices.Contains(own, k) {
			return fmt.Errorf("%s.%s: %s sets %s itself (it may not be set here: %s)", key, k, who, k, strings.Join(own, ", "))
		}
	}
	return nil
}

// Float returns a pointer to v, for Config.Temperature and Request.Temperature.
func Float(v float64) *float64 { return &v }

// APIKeyFromEnv returns $TRACE_LLM_API_KEY, or else $OPENAI_API_KEY.
func APIKeyFromEnv() Secret {
	if v := os.Getenv(EnvAPIKey); v != "" {
		return Secret(v)
	}
	return Secret(os.Getenv(EnvOpenAIAPIKey))
}

// WithDefaults returns c with every zero field set to its default, and an
// empty APIKey taken from the environment.
func (c Config) WithDefaults() Config {
	c.BaseURL = strings.TrimRight(strings.TrimSpace(c.BaseURL), "/")
	c.APIKey = cmp.Or(c.APIKey, APIKeyFromEnv())
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.BackoffInitial = cmp.Or(c.BackoffInitial, DefaultBackoffInitial)
	c.BackoffMax = cmp.Or(c.BackoffMax, DefaultBackoffMax)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, DefaultMaxRetryAfter)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	if c.Temperature == nil {
		c.Temperature = Float(DefaultTemperature)
	}
	c.StructuredOutput = cmp.Or(c.StructuredOutput, StructuredJSONSchema)
	return c
}

// Validate reports every invalid field of c (call it after WithDefaults).
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("llm config: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.BaseURL == "" {
		bad("BaseURL", "is required (e.g. http://127.0.0.1:8080/v1)")
	} else if u, err := url.Parse(c.BaseURL); err != nil {
		bad("BaseURL", "does not parse as a URL")
	} else if u.Scheme != "http" && u.Scheme != "https" {
		bad("BaseURL", "scheme must be http or https, got %q", u.Scheme)
	} else if u.Host == "" {
		bad("BaseURL", "has no host")
	}
	if strings.TrimSpace(c.Model) == "" {
		bad("Model", "is required")
	}
	if c.Timeout < 0 {
		bad("Timeout", "must be positive, got %v", c.Timeout)
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > MaxAttemptsLimit {
		bad("MaxAttempts", "must be in [1, %d], got %d", MaxAttemptsLimit, c.MaxAttempts)
	}
	if c.BackoffInitial < 0 {
		bad("BackoffInitial", "must be positive, got %v", c.BackoffInitial)
	}
	if c.BackoffMax < c.BackoffInitial {
		bad("BackoffMax", "(%v) must be at least BackoffInitial (%v)", c.BackoffMax, c.BackoffInitial)
	}
	if err := CheckExtraBody("ExtraBody", c.ExtraBody); err != nil {
		errs = append(errs, fmt.Errorf("llm config: %w", err))
	}
	if c.MaxRetryAfter < 0 {
		bad("MaxRetryAfter", "must be positive, got %v", c.MaxRetryAfter)
	}
	if c.Concurrency < 1 {
		bad("Concurrency", "must be at least 1, got %d", c.Concurrency)
	}
	if c.RatePerSecond < 0 || c.RatePerSecond != c.RatePerSecond {
		bad("RatePerSecond", "must be >= 0 (0 = unlimited), got %v", c.RatePerSecond)
	}
	if c.Temperature != nil && (*c.Temperature < 0 || *c.Temperature > 2) {
		bad("Temperature", "must be in [0, 2], got %v", *c.Temperature)
	}
	if c.MaxTokens < 0 {
		bad("MaxTokens", "must be >= 0 (0 = server default), got %d", c.MaxTokens)
	}
	switch c.StructuredOutput {
	case StructuredJSONSchema, StructuredJSONObject, StructuredJSONObjectSchema, StructuredNone:
	default:
		bad("StructuredOutput", "must be one of json_schema, json_object, json_object_schema, none; got %q", c.StructuredOutput)
	}
	return errors.Join(errs...)
}

// NormalizeBaseURL is the chat-completions API root meant by a configured
// base URL (llm.base_url): white space and trailing slashes trimmed, a
// /chat/completions pasted with the root dropped, and a URL without a path
// (http://host:8000) given the /v1 that OpenAI, vLLM, Ollama and llama.cpp
// all serve their chat API under — requests go to BaseURL +
// "/chat/completions", and without /v1 every one would be a 404 (not
// retried, so every call failed). A URL with another path (a gateway's
// /openai/v1) is kept. Config.BaseURL is not normalized by New: an
// embeddings server may serve its API at the root.
func NormalizeBaseURL(raw string) string {
	s := strings.TrimRight(strings.TrimSpace(raw), "/")
	s = strings.TrimRight(strings.TrimSuffix(s, "/chat/completions"), "/")
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return s
	}
	return s + "/v1"
}

// redactURL returns u without credentials, query or fragment: the form that
// appears in audit rows, logs and errors.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(invalid url)"
	}
	u.User = nil
	u.RawQuery = ""
	u.ForceQuery = false
	u.Fragment = ""
	return u.String()
}
