package router

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/traceops/trace/internal/httpauth"
	"github.com/traceops/trace/sink"
)

// Request headers the proxy reads (and does not forward).
const (
	HeaderConversation = "X-Trace-Conversation-Id"
	HeaderEnvironment  = "X-Trace-Environment"
	HeaderAgentVersion = "X-Trace-Agent-Version"
	// HeaderToken carries the proxy's own bearer token (router.bearer_token):
	// Authorization is the upstream's and passes through.
	HeaderToken = "X-Trace-Token"
)

// HeaderRequestID is a request's id. The caller's X-Request-Id (a
// gateway's, an SDK's) is recorded in route_decisions.client_request_id
// when it is a plain token (1–128 visible ASCII characters), passed
// upstream unchanged and echoed back; without one, the router's own
// request id (route_decisions' request_id) is sent upstream (vLLM takes it
// as its request id) and back in it. (One header: a second one for the
// router's id beside the caller's made the response header's map grow,
// three more allocations and ~0.8 kB per request.)
const HeaderRequestID = "X-Request-Id"

// maxRequestIDLen bounds a caller's request id that is recorded.
const maxRequestIDLen = 128

// clientRequestID is the caller's X-Request-Id when it is a plain token,
// else "" (not recorded).
func clientRequestID(h http.Header) string {
	v := h.Get(HeaderRequestID)
	if len(v) > maxRequestIDLen {
		return ""
	}
	for i := range len(v) {
		if v[i] <= ' ' || v[i] > '~' {
			return ""
		}
	}
	return v
}

// setRequestIDHeaders answers with the request's id (see
// HeaderRequestID): in is the caller's request header, id the router's
// request id as a header value (one slice shared with the upstream
// request's header, read only).
func setRequestIDHeaders(h, in http.Header, id []string) {
	if v := in[HeaderRequestID]; len(v) > 0 {
		h[HeaderRequestID] = v
	} else {
		h[HeaderRequestID] = id
	}
}

// Response headers the proxy adds.
const (
	HeaderAdapter  = "X-Trace-Adapter" // the adapter's served name, or "none" for the base model
	HeaderDecision = "X-Trace-Decision-Id"
	HeaderModel    = "X-Trace-Model" // the model the upstream was asked for
)

// Conversation id sources, in the order the proxy tries them.
const (
	SourceHeader   = "header"   // X-Trace-Conversation-Id
	SourceRequest  = "request"  // /v1/route's conversation_id field
	SourceMetadata = "metadata" // the body's metadata.conversation_id
	SourceHash     = "hash"     // sha256 of the environment and the messages up to the first user turn
)

// Outcomes of a proxied request, as recorded.
const (
	OutcomeOK            = "ok"
	OutcomeRouted        = "routed" // POST /v1/route: nothing forwarded
	OutcomeUpstreamError = "upstream_error"
	OutcomeStreamError   = "stream_error" // an error event or a broken connection after the status was sent
	OutcomeUnreachable   = "unreachable"
	OutcomeCanceled      = "canceled"
)

// ProxyConfig configures the HTTP side.
type ProxyConfig struct {
	// UpstreamURL is the OpenAI-compatible API root of the engine serving
	// the base model and its adapters (vLLM multi-LoRA), e.g.
	// http://127.0.0.1:8000/v1.
	UpstreamURL string
	// UpstreamAPIKey is sent as Authorization when the caller sends none.
	UpstreamAPIKey string
	// BearerToken, when set, must come in X-Trace-Token.
	BearerToken string
	// DefaultEnvironment applies when a request names none.
	DefaultEnvironment string
	// MaxBodyBytes bounds a request body (router.max_body_bytes, default 32 MiB).
	MaxBodyBytes int64
	// NoAdapterFallback passes the upstream's 404 for an adapter to the
	// caller (router.fallback_on_missing_adapter: false). By default a
	// request forwarded to an adapter that the upstream answers 404 (it
	// does not serve the adapter: vLLM restarted and forgot its
	// runtime-loaded adapters, a failed load) is sent once more with the
	// base model, whose answer the caller gets: the adapter is an
	// optimisation, the base model answers too.
	NoAdapterFallback bool
	// Passthrough are the upstream's other endpoints passed through
	// unrouted, as "METHOD /v1/path" patterns of net/http's ServeMux
	// ({name} and {name...} wildcards); nil or empty: none.
	// DefaultPassthrough lists the inference endpoints of the OpenAI API.
	// Never an engine's administration (vLLM's /v1/load_lora_adapter):
	// a caller without Authorization is sent with UpstreamAPIKey.
	Passthrough []string
	// Registerer, when set, registers the proxy's metrics (metrics.go:
	// trace_router_requests_total, _tokens_total, _overhead_seconds,
	// _adapter_fallbacks_total).
	Registerer prometheus.Registerer
	// Transport reaches the upstream (nil: a pooled transport of its own).
	Transport http.RoundTripper
	Logger    *slog.Logger
}

// DecisionRecorder receives one row per routed request (requests refused
// before routing, 4xx, have none); Record must not block.
type DecisionRecorder interface {
	Record(row sink.RouteDecisionRow)
}

// Proxy is the router's HTTP API: POST /v1/route and the
// OpenAI-compatible POST /v1/chat/completions.
type Proxy struct {
	cfg     ProxyConfig
	r       *Router
	rec     DecisionRecorder
	root    string // the upstream's API root (router.upstream_url)
	chatURL string // root + /chat/completions
	// transport sends the request as it is (as httputil.ReverseProxy
	// does): an http.Client would follow redirects and copy the headers
	// for them, and a redirect is the caller's to see.
	transport http.RoundTripper
	log       *slog.Logger

	metrics *proxyMetrics
	warnMu  sync.Mutex
	warned  map[string]time.Time // when a missing adapter was last logged
}

// fallbackWarnEvery is how often a missing adapter is logged at most.
const fallbackWarnEvery = time.Minute

// NewProxy validates cfg and returns the proxy. rec may be nil (nothing recorded).
func NewProxy(cfg ProxyConfig, r *Router, rec DecisionRecorder) (*Proxy, error) {
	u, err := url.Parse(strings.TrimRight(strings.TrimSpace(cfg.UpstreamURL), "/"))
	if cfg.UpstreamURL == "" {
		return nil, errors.New("router.upstream_url: is required (the OpenAI-compatible API root of the engine serving the adapters, e.g. http://127.0.0.1:8000/v1)")
	}
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("router.upstream_url: %q is not an http(s) URL", cfg.UpstreamURL)
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		// /chat/completions is appended to the root, after the query.
		u.User = nil
		return nil, fmt.Errorf("router.upstream_url: %q has a query or fragment; it must be the API root without one", u.String())
	}
	if err := CheckPassthrough(cfg.Passthrough); err != nil {
		return nil, err
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 32 << 20
	}
	tr := cfg.Transport
	if tr == nil {
		tr = newUpstreamTransport()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newProxyMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Proxy{cfg: cfg, r: r, rec: rec, root: u.String(), chatURL: u.String() + "/chat/completions", transport: tr, log: log,
		metrics: m, warned: map[string]time.Time{}}, nil
}

// upstreamShards is how many connection pools the default transport
// spreads requests over (round robin).
const upstreamShards = 8

// newUpstreamTransport is the default way to the upstream: HTTP/1.1 with
// keep-alive to an http:// upstream (vLLM's server speaks no h2c; HTTP/2
// when an https:// one offers it), up to 1,024 idle connections
// kept (Go's default of 2 per host would make concurrent callers open
// and close a connection per request), no limit on open ones, and no
// compression asked for (the caller's Accept-Encoding is not forwarded
// either: the proxy reads the usage in the answer). The
// pool is split into upstreamShards http.Transports used in turn: one
// Transport's pool is one mutex, which every request takes twice (to get
// a connection and to put it back), and many concurrent requests queue on it.
func newUpstreamTransport() http.RoundTripper {
	s := &shardedTransport{ts: make([]*http.Transport, upstreamShards)}
	for i := range s.ts {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns, t.MaxIdleConnsPerHost = 1024/upstreamShards, 1024/upstreamShards
		t.ResponseHeaderTimeout = 10 * time.Minute
		t.DisableCompression = true
		s.ts[i] = t
	}
	return s
}

type shardedTransport struct {
	next atomic.Uint32
	ts   []*http.Transport
}

func (s *shardedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return s.ts[s.next.Add(1)%uint32(len(s.ts))].RoundTrip(r)
}

// CloseIdleConnections closes every shard's idle connections.
func (s *shardedTransport) CloseIdleConnections() {
	for _, t := range s.ts {
		t.CloseIdleConnections()
	}
}

// Handler serves the API. /healthz is open; the rest needs X-Trace-Token
// when a token is configured.
func (p *Proxy) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.Handle("POST /v1/route", p.auth(http.HandlerFunc(p.route)))
	mux.Handle("POST /v1/chat/completions", p.auth(http.HandlerFunc(p.chat)))
	// Any other method on the routed paths is a 405, not the upstream's.
	for _, path := range []string{"/v1/route", "/v1/chat/completions"} {
		mux.Handle(path, p.auth(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, http.StatusMethodNotAllowed, r.Method+" "+r.URL.Path+": only POST is served", "invalid_request_error")
		})))
	}
	// The upstream's other inference endpoints (router.passthrough), passed
	// through unrouted: the model list (OpenAI clients' models.list() and
	// health checks), embeddings, the legacy completions, the Responses
	// API, so that an application can point its whole OpenAI client at the
	// router. Only those: the engine's administration (vLLM's adapter
	// loads) must not be reachable with the router's upstream key.
	for _, pat := range p.cfg.Passthrough {
		mux.Handle(pat, p.auth(http.HandlerFunc(p.passthrough)))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no route "+r.Method+" "+r.URL.Path+" (the router serves POST /v1/route and POST /v1/chat/completions, and passes router.passthrough's endpoints through: "+strings.Join(p.cfg.Passthrough, ", ")+")", "invalid_request_error")
	})
	return mux
}

// DefaultPassthrough are router.passthrough's defaults: the OpenAI API's
// inference endpoints besides chat completions.
var DefaultPassthrough = []string{
	"GET /v1/models", "GET /v1/models/{id...}",
	"POST /v1/embeddings", "POST /v1/completions",
	"POST /v1/responses", "GET /v1/responses/{id...}", "DELETE /v1/responses/{id}", "POST /v1/responses/{id}/cancel",
}

// CheckPassthrough checks router.passthrough's patterns: "METHOD /v1/…"
// with a method, a ServeMux pattern that neither is malformed nor
// conflicts with the routed endpoints or another of the list.
func CheckPassthrough(patterns []string) error {
	mux := http.NewServeMux()
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	mux.Handle("POST /v1/route", noop)
	mux.Handle("POST /v1/chat/completions", noop)
	mux.Handle("/v1/route", noop)
	mux.Handle("/v1/chat/completions", noop)
	for _, pat := range patterns {
		method, path, ok := strings.Cut(pat, " ")
		if !ok || method == "" || method != strings.ToUpper(method) || !strings.HasPrefix(path, "/v1/") || len(path) == len("/v1/") {
			return fmt.Errorf("router.passthrough: %q is not \"METHOD /v1/path\" (e.g. \"POST /v1/embeddings\")", pat)
		}
		if err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("router.passthrough: %q: %v", pat, r)
				}
			}()
			mux.Handle(pat, noop)
			return nil
		}(); err != nil {
			return err
		}
	}
	return nil
}

// passthrough passes a request for a router.passthrough endpoint to the
// upstream (the same API root, method, query string and body, the headers as for a
// chat request) and its answer back, streamed as it arrives: nothing
// routed (the body's model is the caller's) or recorded in
// route_decisions; counted in trace_router_passthrough_total.
func (p *Proxy) passthrough(w http.ResponseWriter, r *http.Request) {
	endpoint := r.Pattern // router.passthrough's pattern it matched: a bounded label
	if r.ContentLength > p.cfg.MaxBodyBytes {
		p.metrics.passthrough.WithLabelValues(endpoint, "refused").Inc()
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body exceeds %d bytes (router.max_body_bytes)", p.cfg.MaxBodyBytes), "invalid_request_error")
		return
	}
	var body io.Reader
	if r.Body != nil && r.Body != http.NoBody {
		body = http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes)
		// A body of a known length up to maxReplayBody (an embeddings or
		// completions request) is read first, so that it can be sent
		// again (see replayable); a larger or chunked one is streamed.
		if r.ContentLength >= 0 && r.ContentLength <= maxReplayBody {
			b, err := io.ReadAll(body) // a slice of its own: the transport may still read it after the answer
			if err != nil {
				if r.Context().Err() != nil {
					p.metrics.passthrough.WithLabelValues(endpoint, OutcomeCanceled).Inc()
					return
				}
				p.metrics.passthrough.WithLabelValues(endpoint, "refused").Inc()
				writeError(w, http.StatusBadRequest, "reading body: "+err.Error(), "invalid_request_error")
				return
			}
			body = bytes.NewReader(b)
		}
	}
	ureq, err := http.NewRequestWithContext(r.Context(), r.Method, withQuery(p.root+strings.TrimPrefix(r.URL.EscapedPath(), "/v1"), r), body)
	if err != nil {
		p.metrics.passthrough.WithLabelValues(endpoint, OutcomeUnreachable).Inc()
		writeError(w, http.StatusBadGateway, "router: building the upstream request: "+err.Error(), "upstream_error")
		return
	}
	if body != nil {
		ureq.ContentLength = r.ContentLength // -1 (chunked) when unknown
	}
	ureq.Header = p.upstreamHeader(r.Header)
	if body == nil || ureq.GetBody != nil {
		replayable(ureq.Header) // a body read whole (or none) can be sent again on a new connection
	}
	resp, err := p.transport.RoundTrip(ureq)
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			p.metrics.passthrough.WithLabelValues(endpoint, "refused").Inc()
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body exceeds %d bytes (router.max_body_bytes)", p.cfg.MaxBodyBytes), "invalid_request_error")
		case r.Context().Err() != nil:
			p.metrics.passthrough.WithLabelValues(endpoint, OutcomeCanceled).Inc()
		default:
			p.metrics.passthrough.WithLabelValues(endpoint, OutcomeUnreachable).Inc()
			p.log.Warn("router: passthrough: the upstream is unreachable", "method", r.Method, "path", r.URL.Path, "err", redactURLError(err))
			writeError(w, http.StatusBadGateway, "router: the upstream is unreachable (the cause is in the router's log)", "upstream_error")
		}
		return
	}
	defer resp.Body.Close()
	copyResponseHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	c := copyFlush(w, resp.Body, false, false)
	outcome := OutcomeOK
	switch {
	case resp.StatusCode >= 400:
		outcome = OutcomeUpstreamError
	case c.err != nil && r.Context().Err() != nil:
		outcome = OutcomeCanceled
	case c.err != nil:
		outcome = OutcomeStreamError
	}
	p.metrics.passthrough.WithLabelValues(endpoint, outcome).Inc()
	if c.err != nil && r.Context().Err() == nil {
		panic(http.ErrAbortHandler) // a broken stream, as for a chat request
	}
}

// withQuery is the upstream URL u with the caller's query string (an
// api-version=…), which goes on.
func withQuery(u string, r *http.Request) string {
	if r.URL.RawQuery == "" {
		return u
	}
	return u + "?" + r.URL.RawQuery
}

// upstreamHeader is the header of a request to the upstream: the
// caller's, less the hop-by-hop ones (and those its Connection names) and
// Accept-Encoding (the upstream's answer comes plain, the transport asking
// for no compression, so the proxy can read its usage and error events;
// the caller gets it plain too), with router.upstream_api_key when the
// caller sends no Authorization.
func (p *Proxy) upstreamHeader(in http.Header) http.Header {
	out := make(http.Header, len(in)+3) // sized once
	hop := connectionHeaders(in)
	for k, vs := range in {
		if !hopHeaders[k] && !hop[k] && k != "Accept-Encoding" {
			out[k] = vs
		}
	}
	if out.Get("Authorization") == "" && p.cfg.UpstreamAPIKey != "" {
		out.Set("Authorization", "Bearer "+p.cfg.UpstreamAPIKey)
	}
	return out
}

// replayable marks a request to the upstream (a chat request, a passed-through
// one whose body was read whole or that has none) idempotent for Go's
// transport (X-Idempotency-Key without a value, which is not sent), unless
// the caller's header does: a request whose kept-alive connection the
// upstream closes before answering anything (vLLM's and llama.cpp's servers
// close connections idle for 5 s; the transport keeps them for 90 s, and
// one may be picked as it closes) is then sent again on a new connection
// (its body from GetBody) instead of failing as unreachable. The transport
// retries only on a reused connection that ended before the first byte of
// an answer.
func replayable(h http.Header) {
	if h["Idempotency-Key"] == nil && h["X-Idempotency-Key"] == nil {
		h["X-Idempotency-Key"] = nil
	}
}

// copyResponseHeader copies the upstream's response header to the
// caller's, less the hop-by-hop ones (Content-Length kept) and those its
// Connection names.
func copyResponseHeader(dst, src http.Header) {
	hop := connectionHeaders(src)
	for k, vs := range src {
		if (!hopHeaders[k] || k == "Content-Length") && !hop[k] {
			dst[k] = vs
		}
	}
}

func (p *Proxy) auth(h http.Handler) http.Handler {
	if p.cfg.BearerToken == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !httpauth.Match(p.cfg.BearerToken, httpauth.Bearer(r.Header.Get(HeaderToken))) {
			writeError(w, http.StatusUnauthorized, "missing or wrong "+HeaderToken+" (the router's own token; Authorization is passed to the upstream)", "authentication_error")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// wireMessage is a chat message as the proxy reads it; content is a string
// or an array of parts.
type wireMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// turn is the message as the router reads it: its text parts joined, and,
// with media, its other parts (images, audio, files) as their JSON, which
// only the conversation hash reads.
func (m wireMessage) turn(media bool) Turn {
	t := Turn{Role: m.Role}
	if json.Unmarshal(m.Content, &t.Text) == nil {
		return t
	}
	var parts []json.RawMessage
	if json.Unmarshal(m.Content, &parts) != nil {
		return t
	}
	var b strings.Builder
	var other []byte
	for _, raw := range parts {
		var pt struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		_ = json.Unmarshal(raw, &pt)
		if pt.Type == "text" || (pt.Type == "" && pt.Text != "") {
			if pt.Text != "" {
				if b.Len() > 0 {
					b.WriteByte('\n')
				}
				b.WriteString(pt.Text)
			}
			continue
		}
		if media {
			other = append(append(other, raw...), 0)
		}
	}
	t.Text, t.Media = b.String(), string(other)
	return t
}

// turnsOf reads msgs, with the media of the turns HashConversation reads
// (up to the first user turn) only: later turns' images are not copied on
// every request.
func turnsOf(msgs []wireMessage) []Turn {
	out := make([]Turn, len(msgs))
	media := true
	for i, m := range msgs {
		out[i] = m.turn(media)
		if m.Role == "user" {
			media = false
		}
	}
	return out
}

// HashConversation is the conversation id of a request that names none:
// sha256 over the environment and the turns up to and including the first
// user turn (their text and their other parts: images, audio, files), so
// every later request of the same conversation, which repeats them, maps
// to the same id.
func HashConversation(environment string, turns []Turn) string {
	h := sha256.New()
	h.Write([]byte(environment))
	for _, t := range turns {
		h.Write([]byte{0})
		h.Write([]byte(t.Role))
		h.Write([]byte{0})
		h.Write([]byte(t.Text))
		if t.Media != "" { // two first turns of one text but other images differ
			h.Write([]byte{1})
			h.Write([]byte(t.Media))
		}
		if t.Role == "user" {
			break
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)[:16])
}

type metadata struct {
	ConversationID string `json:"conversation_id"`
	Environment    string `json:"environment"`
	AgentVersion   string `json:"agent_version"`
}

// RouteRequest is the body of POST /v1/route.
type RouteRequest struct {
	Messages       []wireMessage   `json:"messages"`
	Tools          json.RawMessage `json:"tools,omitempty"`
	Environment    string          `json:"environment"`
	AgentVersion   string          `json:"agent_version,omitempty"`
	ConversationID string          `json:"conversation_id,omitempty"`
}

// RouteResponse is the answer of POST /v1/route.
type RouteResponse struct {
	Adapter        *string            `json:"adapter"`
	Model          string             `json:"model"`
	Probabilities  map[string]float64 `json:"probabilities"`
	Labels         map[string]string  `json:"labels"`
	Weights        []Weight           `json:"weights,omitempty"`
	Cached         bool               `json:"cached"`
	DecisionID     string             `json:"decision_id"`
	ConversationID string             `json:"conversation_id"`
	Reason         string             `json:"reason"`
}

func (p *Proxy) route(w http.ResponseWriter, r *http.Request) {
	body, ok := p.readBody(w, r)
	if !ok {
		return
	}
	defer putBody(body)
	var req RouteRequest
	if b := bytes.TrimSpace(body); len(b) == 0 || b[0] != '{' {
		// null decodes into a RouteRequest without an error; it is no
		// request (chat completions refuse it too).
		writeError(w, http.StatusBadRequest, "body is not a route request: want a JSON object", "invalid_request_error")
		return
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "body is not a route request: "+err.Error(), "invalid_request_error")
		return
	}
	env := firstOf(req.Environment, r.Header.Get(HeaderEnvironment), p.cfg.DefaultEnvironment)
	if env == "" {
		writeError(w, http.StatusBadRequest, "environment is required (field environment, header "+HeaderEnvironment+", or router.default_environment)", "invalid_request_error")
		return
	}
	turns := turnsOf(req.Messages)
	in := Input{Environment: env, AgentVersion: firstOf(req.AgentVersion, r.Header.Get(HeaderAgentVersion)), Turns: turns}
	switch {
	case req.ConversationID != "":
		in.ConversationID, in.ConversationSource = req.ConversationID, SourceRequest
	case r.Header.Get(HeaderConversation) != "":
		in.ConversationID, in.ConversationSource = r.Header.Get(HeaderConversation), SourceHeader
	default:
		in.ConversationID, in.ConversationSource = HashConversation(env, turns), SourceHash
	}
	start := time.Now()
	d, cached := p.r.Route(r.Context(), in)
	resp := RouteResponse{Model: d.Model, Probabilities: d.Probabilities, Labels: map[string]string{}, Weights: d.Weights, Cached: cached,
		DecisionID: d.ID, ConversationID: d.ConversationID, Reason: d.Reason}
	if d.Adapter != "" {
		a := d.Adapter
		resp.Adapter = &a
	}
	if resp.Probabilities == nil {
		resp.Probabilities = map[string]float64{}
	}
	for _, l := range d.Labels {
		resp.Labels[l.Name] = l.Capability()
	}
	d.wire = wireOf(d)
	setDecisionHeaders(w.Header(), d)
	row := Row(d, NewID(), "route", cached)
	row.ClientRequestID = clientRequestID(r.Header)
	setRequestIDHeaders(w.Header(), r.Header, []string{row.RequestID})
	row.Outcome, row.UpstreamStatus = OutcomeRouted, 0
	row.OverheadUS = micros(time.Since(start))
	p.record(row)
	writeJSON(w, http.StatusOK, resp)
}

func (p *Proxy) record(row sink.RouteDecisionRow) {
	p.metrics.count(&row)
	if p.rec != nil {
		p.rec.Record(row)
	}
}

func setDecisionHeaders(h http.Header, d Decision) {
	w := wireOf(d)
	// The names are canonical already: assigned without Set's canonicalisation.
	h[HeaderAdapter] = w.hAdapter
	h[HeaderDecision] = w.hDecision
	h[HeaderModel] = w.hModel
	h[HeaderConversation] = w.hConv
}

// connectionHeaders are the header names a message's Connection header
// lists: hop-by-hop for that connection only, so not forwarded either
// (RFC 9110 §7.6.1); nil when it lists none but the usual options.
func connectionHeaders(h http.Header) map[string]bool {
	var out map[string]bool
	for _, v := range h["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			name = http.CanonicalHeaderKey(strings.TrimSpace(name))
			if name == "" || name == "Keep-Alive" || name == "Close" {
				continue
			}
			if out == nil {
				out = map[string]bool{}
			}
			out[name] = true
		}
	}
	return out
}

// hopHeaders are not forwarded (RFC 9110 §7.6.1), nor are the router's own.
var hopHeaders = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true, "Host": true,
	HeaderToken: true, HeaderConversation: true, HeaderEnvironment: true, HeaderAgentVersion: true,
}

func (p *Proxy) chat(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	body, ok := p.readBody(w, r)
	if !ok {
		return
	}
	defer putBody(body)
	cb, err := scanChat(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error(), "invalid_request_error")
		return
	}
	md := readMetadata(cb.metadata) // metadata of another shape is the upstream's business
	stream := bytes.Equal(cb.stream, []byte("true"))
	env := firstOf(r.Header.Get(HeaderEnvironment), md.Environment, p.cfg.DefaultEnvironment)
	in := Input{Environment: env, AgentVersion: firstOf(r.Header.Get(HeaderAgentVersion), md.AgentVersion)}
	switch {
	case r.Header.Get(HeaderConversation) != "":
		in.ConversationID, in.ConversationSource = r.Header.Get(HeaderConversation), SourceHeader
	case md.ConversationID != "":
		in.ConversationID, in.ConversationSource = md.ConversationID, SourceMetadata
	}
	// A named conversation with a fresh decision needs nothing from the
	// messages: the common case skips decoding them.
	d, cached := Decision{}, false
	if in.ConversationID != "" && env != "" {
		d, cached = p.r.Lookup(env, in.ConversationID)
	}
	if !cached {
		var msgs []wireMessage
		if err := json.Unmarshal(cb.messages, &msgs); err != nil || len(msgs) == 0 {
			writeError(w, http.StatusBadRequest, "messages: must be a non-empty array of chat messages", "invalid_request_error")
			return
		}
		in.Turns = turnsOf(msgs)
		if in.ConversationID == "" {
			in.ConversationID, in.ConversationSource = HashConversation(env, in.Turns), SourceHash
		}
		if env == "" {
			d = Decision{ID: NewID(), At: time.Now().UTC(), ConversationID: in.ConversationID, ConversationSource: in.ConversationSource,
				AgentVersion: in.AgentVersion, Model: p.r.cfg.BaseModel, Reason: ReasonNoAdapters, Error: "no environment named (header " + HeaderEnvironment + ", metadata.environment or router.default_environment)"}
		} else {
			d, cached = p.r.Route(r.Context(), in)
		}
	}
	d.wire = wireOf(d) // an uncached decision's is made once for this request
	out := cb.withModel(d.wire.model)
	row := Row(d, NewID(), "proxy", cached)
	row.Stream, row.ClientRequestID = stream, clientRequestID(r.Header)
	reqID := []string{row.RequestID}
	setRequestIDHeaders(w.Header(), r.Header, reqID)
	recorded := false
	defer func() {
		if !recorded {
			p.record(row)
		}
	}()

	target := withQuery(p.chatURL, r)
	ureq, err := http.NewRequestWithContext(r.Context(), http.MethodPost, target, bytes.NewReader(out))
	if err != nil {
		row.Outcome, row.Error = OutcomeUnreachable, err.Error()
		writeError(w, http.StatusBadGateway, "router: building the upstream request: "+err.Error(), "upstream_error")
		return
	}
	ureq.Header = p.upstreamHeader(r.Header)
	ureq.Header.Set("Content-Type", "application/json")
	replayable(ureq.Header)
	if len(ureq.Header[HeaderRequestID]) == 0 {
		ureq.Header[HeaderRequestID] = reqID
	}
	row.OverheadUS = micros(time.Since(start))
	resp, err := p.transport.RoundTrip(ureq)
	if err == nil && resp.StatusCode == http.StatusNotFound && d.Adapter != "" && d.Model != p.r.cfg.BaseModel && !p.cfg.NoAdapterFallback {
		// The upstream does not serve the adapter; nothing has been sent
		// to the caller yet: the base model answers instead.
		d, resp, err = p.fallback(r.Context(), d, resp, cb, target, ureq.Header, &row)
	}
	if err != nil {
		if r.Context().Err() != nil {
			row.Outcome = OutcomeCanceled
			return
		}
		row.Outcome, row.Error = OutcomeUnreachable, thenErr(row.Error, redactURLError(err))
		setDecisionHeaders(w.Header(), d)
		// The cause (the upstream's address, a classifier's failure) is
		// the operator's: it is in the request's route_decisions row.
		writeError(w, http.StatusBadGateway, "router: the upstream is unreachable (the cause is in route_decisions, request_id "+row.RequestID+")", "upstream_error")
		return
	}
	defer resp.Body.Close()
	row.UpstreamStatus = uint16(min(resp.StatusCode, math.MaxUint16))
	h := w.Header()
	copyResponseHeader(h, resp.Header)
	setDecisionHeaders(h, d)
	setRequestIDHeaders(h, r.Header, reqID) // over the upstream's own
	w.WriteHeader(resp.StatusCode)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	c := copyFlush(w, resp.Body, sse, resp.StatusCode < 300)
	if c.usageOK && !c.sawError {
		row.Usage, row.PromptTokens, row.CompletionTokens = true, c.usage.PromptTokens, c.usage.CompletionTokens
	}
	switch {
	case resp.StatusCode >= 400:
		row.Outcome = OutcomeUpstreamError
	case c.sawError:
		row.Outcome, row.Error = OutcomeStreamError, thenErr(row.Error, "the upstream sent an error event")
	case c.err != nil && r.Context().Err() != nil:
		row.Outcome = OutcomeCanceled
	case c.err != nil:
		row.Outcome, row.Error = OutcomeStreamError, thenErr(row.Error, c.err.Error())
	default:
		row.Outcome = OutcomeOK
	}
	if c.err != nil && r.Context().Err() == nil {
		// The upstream broke the body off: abort the response so that the
		// caller sees a broken stream, not a clean but truncated one.
		p.record(row)
		recorded = true
		panic(http.ErrAbortHandler)
	}
}

// fallback sends the request again with the base model after the
// upstream answered resp, a 404, for d's adapter, and returns the decision
// as served (the base model) with the upstream's new answer. row becomes
// the base model's, with ReasonAdapterUnavailable and the missing adapter
// in its error. Only here, off the path of every other request.
func (p *Proxy) fallback(ctx context.Context, d Decision, resp *http.Response, cb chatBody, target string, hdr http.Header, row *sink.RouteDecisionRow) (Decision, *http.Response, error) {
	missing := d.Adapter
	// Read (some of) the 404 so that its connection is reused.
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	p.metrics.fallbacks.WithLabelValues(missing).Inc()
	p.warnMissing(d, missing, msg)
	d.Adapter, d.Capability, d.Model = "", "", p.r.cfg.BaseModel
	d.wire = newWire(d) // the base model's headers and JSON model
	row.Adapter, row.Capability, row.Model = "", "", d.Model
	row.Reason = ReasonAdapterUnavailable
	row.Error = "the upstream answered 404 for the adapter " + missing + " (it does not serve it); the base model served the request"
	ureq, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(cb.withModel(d.wire.model)))
	if err != nil {
		return d, nil, err
	}
	ureq.Header = hdr // read only, as by the first request
	resp, err = p.transport.RoundTrip(ureq)
	return d, resp, err
}

// thenErr is the row's error after err: err, after what the row said
// already (a fallback's missing adapter) when it said something.
func thenErr(prev, err string) string {
	if prev == "" {
		return err
	}
	return prev + "; then: " + err
}

// warnMissing logs a missing adapter at most once per fallbackWarnEvery
// (the upstream's message, never the request's headers).
func (p *Proxy) warnMissing(d Decision, missing string, msg []byte) {
	now := time.Now()
	p.warnMu.Lock()
	last, seen := p.warned[missing]
	due := !seen || now.Sub(last) >= fallbackWarnEvery
	if due {
		for a, t := range p.warned { // forget the adapters that were not missing for a while
			if now.Sub(t) >= fallbackWarnEvery {
				delete(p.warned, a)
			}
		}
		p.warned[missing] = now
	}
	p.warnMu.Unlock()
	if due {
		p.log.Warn("router: the upstream does not serve the adapter (404); its conversations are served by the base model until it does (logged once a minute per adapter)",
			"adapter", missing, "base_model", p.r.cfg.BaseModel, "environment", d.Environment, "upstream_says", cutText(strings.TrimSpace(string(msg)), 300))
	}
}

// copyBuffers are copyFlush's: the read buffer and the body's tail.
type copyBuffers struct{ buf, tail []byte }

var copyBufs = sync.Pool{New: func() any {
	return &copyBuffers{buf: make([]byte, 32<<10), tail: make([]byte, 0, usageTail)}
}}

// copied is what copyFlush saw of a body.
type copied struct {
	err      error // reading the upstream's body or writing the caller's
	sawError bool  // with sse: an error event passed
	usage    Usage // the body's token usage, when usageOK
	usageOK  bool
}

// copyFlush copies the upstream body to the caller read by read, flushing
// after each, so that SSE events pass through as they arrive. With sse it
// reports whether an error event passed ("data: {"error"…", an object
// of type "error", or an "error:" line, older llama.cpp servers' error
// field, which they follow with "data: [DONE]"). With usage it keeps the body's end and, when the body
// ended cleanly, reports the token usage it holds (see usage.go).
func copyFlush(w http.ResponseWriter, body io.Reader, sse, usage bool) (c copied) {
	rc := http.NewResponseController(w)
	bufs := copyBufs.Get().(*copyBuffers)
	defer copyBufs.Put(bufs)
	buf, tail := bufs.buf, bufs.tail[:0]
	// The end of the previous read, for a pattern split across reads; a
	// newline before the first, so that a line starting the body matches.
	edge := []byte{'\n'}
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if sse && !c.sawError {
				chunk := append(edge, buf[:n]...)
				c.sawError = bytes.Contains(chunk, []byte(`data: {"error"`)) || bytes.Contains(chunk, []byte(`data:{"error"`)) ||
					bytes.Contains(chunk, []byte(`"object":"error"`)) || bytes.Contains(chunk, []byte(`"object": "error"`)) ||
					bytes.Contains(chunk, []byte("\nerror:")) // older llama.cpp servers: an "error" field, then [DONE]
				edge = append(edge[:0], chunk[max(0, len(chunk)-24):]...)
			}
			if usage {
				tail = keepTail(tail, buf[:n])
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				c.err = werr
				return c
			}
			_ = rc.Flush()
		}
		// A stream that has sent its terminator is whole: a read that
		// fails after it (the caller, done, hung up and canceled the
		// upstream request before its end was read) is its end.
		if rerr == io.EOF || (rerr != nil && usage && sse && sseDone(tail)) {
			if usage {
				c.usage, c.usageOK = parseUsage(tail)
			}
			return c
		}
		if rerr != nil {
			c.err = rerr
			return c
		}
	}
}

// sseDone reports whether an SSE body's end is the stream's terminator,
// "data: [DONE]".
func sseDone(end []byte) bool {
	end = bytes.TrimRight(end, "\r\n ")
	return bytes.HasSuffix(end, []byte("data: [DONE]")) || bytes.HasSuffix(end, []byte("data:[DONE]"))
}

// bodyBufs holds request-body buffers between requests: a body is read
// into one sized by Content-Length, and the buffer comes back when the
// handler returns (the upstream is sent a new slice, see chatBody.withModel).
var bodyBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledBody = 1 << 20 // larger buffers are left to the GC

// maxReplayBody is the largest passed-through body read whole before it is
// sent, so that it can be sent again; a larger one is streamed.
const maxReplayBody = 1 << 20

func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	buf := bodyBufs.Get().(*bytes.Buffer)
	buf.Reset()
	// Sized by Content-Length up to maxPooledBody (a declared length is
	// not yet a body: beyond that the buffer grows as bytes arrive);
	// ReadFrom wants MinRead spare bytes before it sees EOF.
	if n := min(r.ContentLength, p.cfg.MaxBodyBytes, maxPooledBody); n > 0 {
		buf.Grow(int(n) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes))
	if err != nil {
		putBody(buf.Bytes())
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body exceeds %d bytes (router.max_body_bytes)", p.cfg.MaxBodyBytes), "invalid_request_error")
		} else {
			writeError(w, http.StatusBadRequest, "reading body: "+err.Error(), "invalid_request_error")
		}
		return nil, false
	}
	return buf.Bytes(), true
}

// putBody returns a body from readBody to the pool; nothing may use it after.
func putBody(b []byte) {
	if cap(b) == 0 || cap(b) > maxPooledBody {
		return
	}
	bodyBufs.Put(bytes.NewBuffer(b[:0]))
}

// redactURLError drops the URL from a transport error (it may carry user
// information); the error itself says what failed.
func redactURLError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout: " + err.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return err.Error()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg, typ string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": nil}}) // OpenAI's shape
}

func firstOf(vs ...string) string {
	for _, v := range vs {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func micros(d time.Duration) uint32 { return uint32(min(d.Microseconds(), math.MaxUint32)) }
