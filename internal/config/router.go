package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/traceops/trace/router"
)

// Router is the route role (TRACE step 4): the router and its
// OpenAI-compatible proxy, on their own listener (router.addr), so that
// agents' traffic, with its own token, never shares the dashboard's server.
type Router struct {
	// Addr is where POST /v1/route and POST /v1/chat/completions are served.
	Addr string `koanf:"addr"`
	// UpstreamURL is the OpenAI-compatible API root of the engine serving
	// the base model and its LoRA adapters (vLLM multi-LoRA), e.g.
	// http://127.0.0.1:8000/v1. Required with the route role.
	UpstreamURL string `koanf:"upstream_url"`
	// UpstreamAPIKey is sent upstream when a caller sends no Authorization (secret).
	UpstreamAPIKey string `koanf:"upstream_api_key"`
	// BaseModel is the upstream's served name of the base model: the model
	// of conversations routed to no adapter, and the classifier's model.
	BaseModel string `koanf:"base_model"`
	// BearerToken, when set, is the router's own token, which callers send
	// in X-Trace-Token (Authorization goes to the upstream) (secret).
	BearerToken string `koanf:"bearer_token"`
	// DefaultEnvironment applies to requests that name none.
	DefaultEnvironment string `koanf:"default_environment"`
	// Classifier: the base model by default (ClassifierURL = UpstreamURL,
	// ClassifierModel = BaseModel, key = UpstreamAPIKey).
	ClassifierURL      string        `koanf:"classifier_url"`
	ClassifierModel    string        `koanf:"classifier_model"`
	ClassifierAPIKey   string        `koanf:"classifier_api_key"` // secret
	ClassifierTimeout  time.Duration `koanf:"classifier_timeout"`
	ClassifierAttempts int           `koanf:"classifier_attempts"`
	// ClassifierExtraBody are further top-level fields of every classifier
	// request (the OpenAI SDK's extra_body), e.g. chat_template_kwargs:
	// {enable_thinking: false} for a reasoning model: an object, in YAML a
	// mapping, in TRACE_ROUTER__CLASSIFIER_EXTRA_BODY or --set JSON text.
	// Read through ClassifierBody. Default none.
	ClassifierExtraBody any `koanf:"classifier_extra_body"`
	// TopP is the decision rule's p (0.95); Temperature the classifier
	// temperature of the renormalisation (1.0); TopLogprobs the
	// alternatives asked for (20).
	TopP        float64 `koanf:"top_p"`
	Temperature float64 `koanf:"temperature"`
	TopLogprobs int     `koanf:"top_logprobs"`
	// Context is first_user (the first user turn) or last_n (the last
	// LastN user and assistant turns).
	Context string `koanf:"context"`
	LastN   int    `koanf:"last_n"`
	// ContextMaxChars bounds the characters of those turns the classifier
	// is shown (16000, ~4,000 tokens; -1: no bound): a longer text keeps
	// its beginning and end. The request forwarded is not changed.
	ContextMaxChars int `koanf:"context_max_chars"`
	// CacheTTL keeps each conversation's decision; CacheMax bounds the
	// conversations kept.
	CacheTTL time.Duration `koanf:"cache_ttl"`
	CacheMax int           `koanf:"cache_max"`
	// LabelConstraint: none, or structured_outputs (vLLM: the output is
	// restricted to the labels with structured_outputs: {choice: [...]}).
	LabelConstraint string `koanf:"label_constraint"`
	// AdaptersRefresh is how long the list of active adapters is kept.
	AdaptersRefresh time.Duration `koanf:"adapters_refresh"`
	// FallbackOnMissingAdapter (default true): a request forwarded to an
	// adapter that the upstream answers 404 (it does not serve it: vLLM
	// restarted and forgot its runtime-loaded adapters, a failed load) is
	// sent once more with BaseModel, whose answer the caller gets; false
	// passes the 404 to the caller.
	FallbackOnMissingAdapter bool `koanf:"fallback_on_missing_adapter"`
	// DrainTimeout bounds the wait for requests in flight (streams) on SIGTERM.
	DrainTimeout time.Duration `koanf:"drain_timeout"`
	// MaxBodyBytes bounds a request body, chat and passed through (32 MiB;
	// a larger one is a 413): raise it for agents that send many images
	// or long audio inline.
	MaxBodyBytes int64 `koanf:"max_body_bytes"`
	// GOGC and GCHeadroomMB pace the garbage collector of a process that
	// runs the route role alone (internal/gcpace): the next collection
	// comes when the heap has grown past the live heap by the larger of
	// GOGC percent of it (Go's GOGC; 100 by default, 0 also means 100) and
	// GCHeadroomMB MiB (128 by default; 0: the ratio alone). A router's
	// live heap is a few MB plus ~1.3 KB per cached decision, and it makes
	// ~7.6 KB of garbage per request: at Go's ratio alone a small router
	// collects every ~1,000 requests, and each cycle holds up the requests in
	// flight; with the headroom it collects once per 128 MiB of garbage
	// (~17,000 requests) while its heap is small, and at Go's ratio once
	// the cache has made it large. GOGC in the environment wins (then
	// neither applies); GOMEMLIMIT still caps the heap; a process with
	// other roles keeps Go's setting (their heaps are large).
	GOGC         int `koanf:"gogc"`
	GCHeadroomMB int `koanf:"gc_headroom_mb"`
	// Passthrough are the upstream's endpoints besides chat completions
	// that the proxy passes through unrouted ("METHOD /v1/path", ServeMux
	// patterns; default router.DefaultPassthrough: models, embeddings,
	// completions, the Responses API; empty: none). Never list an engine's
	// administration endpoints: a caller without Authorization is sent
	// with upstream_api_key.
	Passthrough []string `koanf:"passthrough"`
	// Retrieval shows each candidate with its most similar successful
	// trajectory; on when retrieval.embeddings_url is set.
	Retrieval RouterRetrieval `koanf:"retrieval"`
}

// RouterRetrieval is the router's retrieval variant (off by default).
type RouterRetrieval struct {
	// EmbeddingsURL is an OpenAI-compatible API root with /embeddings
	// ("" = retrieval off); EmbeddingsModel its model (required with it).
	EmbeddingsURL   string        `koanf:"embeddings_url"`
	EmbeddingsModel string        `koanf:"embeddings_model"`
	APIKey          string        `koanf:"api_key"` // secret
	Pool            int           `koanf:"pool"`    // successful trajectories considered per capability
	TTL             time.Duration `koanf:"ttl"`     // how long their embeddings are kept
}

// DefaultRouter is the route role's defaults.
func DefaultRouter() Router {
	return Router{Addr: "127.0.0.1:8088", ClassifierTimeout: 10 * time.Second, ClassifierAttempts: 2, TopP: 0.95, Temperature: 1,
		TopLogprobs: 20, Context: "first_user", LastN: 4, ContextMaxChars: router.DefaultContextMaxChars, CacheTTL: time.Hour, CacheMax: 100000, LabelConstraint: "none",
		AdaptersRefresh: 10 * time.Second, FallbackOnMissingAdapter: true, DrainTimeout: 30 * time.Second, MaxBodyBytes: 32 << 20, GOGC: 100, GCHeadroomMB: 128,
		Passthrough: slices.Clone(router.DefaultPassthrough), Retrieval: RouterRetrieval{Pool: 50, TTL: 10 * time.Minute}}
}

// ClassifierBody is router.classifier_extra_body as an object (nil when
// unset): a YAML mapping as it is, JSON text (the environment, --set)
// decoded. It is an error naming the key when the value is no object or
// sets a field the router sets itself (router.ClassifierOwnFields).
func (r Router) ClassifierBody() (map[string]any, error) {
	m, err := objectSetting("router.classifier_extra_body", r.ClassifierExtraBody)
	if err != nil {
		return nil, err
	}
	if err := router.CheckClassifierExtraBody(m); err != nil {
		return nil, err
	}
	return m, nil
}

// objectSetting is the object setting key (an extra_body) whose value is v:
// nil when unset, a YAML mapping as it is, JSON text (the environment,
// --set) decoded; an error naming key when it is no object.
func objectSetting(key string, v any) (map[string]any, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case map[string]any:
		return v, nil
	case string:
		if strings.TrimSpace(v) == "" {
			return nil, nil
		}
		var x any
		if err := json.Unmarshal([]byte(v), &x); err != nil {
			return nil, fmt.Errorf("%s: must be an object, as JSON text here (e.g. {\"chat_template_kwargs\": {\"enable_thinking\": false}}): %v", key, err)
		}
		m, ok := x.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: must be an object, got %s", key, cutValue(v))
		}
		return m, nil
	default:
		return nil, fmt.Errorf("%s: must be an object (a YAML mapping, or JSON text in the environment or --set), got %s", key, cutValue(fmt.Sprint(v)))
	}
}

func cutValue(s string) string {
	if r := []rune(s); len(r) > 60 {
		return string(r[:60]) + "…"
	}
	return s
}

// redactUserinfo is u without its user information, for messages.
func redactUserinfo(u *url.URL) string {
	c := *u
	c.User = nil
	return c.String()
}

// validate checks the route role's settings (only when the role runs).
func (r Router) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("router.%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if _, _, err := net.SplitHostPort(r.Addr); err != nil {
		bad("addr", "%q is not host:port", r.Addr)
	}
	for field, v := range map[string]string{"upstream_url": r.UpstreamURL, "classifier_url": r.ClassifierURL} {
		if v == "" {
			if field == "upstream_url" {
				bad(field, "is required with the route role (the OpenAI-compatible API root serving the base model and its adapters, e.g. http://127.0.0.1:8000/v1)")
			}
			continue
		}
		if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad(field, "%q is not an http(s) URL", v)
		} else if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
			// /chat/completions is appended to the root: a query or a
			// fragment would end up before it (".../v1?api-version=x/chat/completions").
			bad(field, "%q has a query or fragment; it must be the API root without one (e.g. http://127.0.0.1:8000/v1)", redactUserinfo(u))
		}
	}
	if r.BaseModel == "" {
		bad("base_model", "is required with the route role (the upstream's served name of the base model)")
	}
	if r.TopP > 1 || r.TopP != r.TopP {
		bad("top_p", "must be at most 1 (0 or less: the top adapter alone), got %v", r.TopP)
	}
	if r.Temperature <= 0 {
		bad("temperature", "must be positive, got %v", r.Temperature)
	}
	if r.TopLogprobs < 1 || r.TopLogprobs > 20 {
		bad("top_logprobs", "must be in [1, 20], got %d", r.TopLogprobs)
	}
	switch r.Context {
	case "first_user", "last_n":
	default:
		bad("context", "must be first_user or last_n, got %q", r.Context)
	}
	if r.LastN < 1 {
		bad("last_n", "must be at least 1, got %d", r.LastN)
	}
	if r.ContextMaxChars != -1 && r.ContextMaxChars < 200 {
		bad("context_max_chars", "must be at least 200, or -1 for no bound, got %d", r.ContextMaxChars)
	}
	if err := router.CheckPassthrough(r.Passthrough); err != nil {
		errs = append(errs, err)
	}
	if r.CacheTTL < 0 {
		bad("cache_ttl", "must not be negative, got %s", r.CacheTTL)
	}
	if r.CacheMax < 1 {
		// The router would take it as its default bound, 100,000.
		bad("cache_max", "must be at least 1, got %d (router.cache_ttl: 0 keeps no decisions)", r.CacheMax)
	}
	switch r.LabelConstraint {
	case "none", "structured_outputs":
	default:
		bad("label_constraint", "must be none or structured_outputs, got %q", r.LabelConstraint)
	}
	if r.ClassifierTimeout <= 0 {
		bad("classifier_timeout", "must be positive, got %s", r.ClassifierTimeout)
	}
	if r.ClassifierAttempts < 1 || r.ClassifierAttempts > 50 {
		bad("classifier_attempts", "must be in [1, 50], got %d", r.ClassifierAttempts)
	}
	if r.AdaptersRefresh <= 0 {
		bad("adapters_refresh", "must be positive, got %s", r.AdaptersRefresh)
	}
	if r.GOGC < 0 || r.GOGC > 10000 {
		bad("gogc", "must be 0 (Go's own) or a percentage up to 10000, got %d", r.GOGC)
	}
	if r.GCHeadroomMB < 0 || r.GCHeadroomMB > 1<<20 {
		bad("gc_headroom_mb", "must be 0 (the ratio alone) or MiB up to 1048576, got %d", r.GCHeadroomMB)
	}
	if rv := r.Retrieval; rv.EmbeddingsURL != "" {
		if u, err := url.Parse(rv.EmbeddingsURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("retrieval.embeddings_url", "%q is not an http(s) URL", rv.EmbeddingsURL)
		} else if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
			// /embeddings is appended to the root, as /chat/completions is above.
			bad("retrieval.embeddings_url", "%q has a query or fragment; it must be the API root without one (e.g. http://127.0.0.1:8000/v1)", redactUserinfo(u))
		}
		if rv.EmbeddingsModel == "" {
			bad("retrieval.embeddings_model", "is required with router.retrieval.embeddings_url")
		}
		if rv.Pool < 1 {
			bad("retrieval.pool", "must be at least 1, got %d", rv.Pool)
		}
		if rv.TTL <= 0 {
			bad("retrieval.ttl", "must be positive, got %s", rv.TTL)
		}
	}
	if r.DrainTimeout <= 0 {
		bad("drain_timeout", "must be positive, got %s", r.DrainTimeout)
	}
	if r.MaxBodyBytes < 64<<10 {
		bad("max_body_bytes", "must be at least 65536 (64 KiB), got %d", r.MaxBodyBytes)
	}
	if _, err := r.ClassifierBody(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
