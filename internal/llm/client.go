package llm

import (
	"bytes"
	"cmp"
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
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v4"
	"golang.org/x/time/rate"
)

// maxResponseBytes bounds one response body.
const maxResponseBytes = 16 << 20

// Message is one chat message.
type Message struct {
	Role    string `json:"role"` // system | user | assistant
	Content string `json:"content"`
}

// Request is one chat completion to obtain. Every attempt sends the same
// body as a new, independent HTTP request: the server keeps no conversation.
type Request struct {
	// Purpose, RolloutID and Run only label the audit rows ("label",
	// "discover", "route", …).
	Purpose   string
	RolloutID string
	Run       int

	Messages []Message

	// Schema is the JSON Schema the answer must satisfy. When set, the
	// answer must be one JSON value (after stripping a ``` fence) that the
	// schema accepts and that repeats no object key; the schema is also sent
	// as response_format according to Config.StructuredOutput.
	Schema json.RawMessage
	// SchemaName names the schema in json_schema mode (^[a-zA-Z0-9_-]{1,64}$).
	// Default "response".
	SchemaName string
	// Validate, when set, is the caller's check of the (fence-stripped)
	// answer, run after the schema check. An error makes the attempt fail and
	// be retried with a fresh request; wrap ErrInvalidJSON to record it as
	// invalid_json rather than schema.
	Validate func(content string) error

	// Temperature overrides Config.Temperature; MaxTokens overrides
	// Config.MaxTokens when > 0.
	Temperature *float64
	MaxTokens   int
	// Timeout bounds each HTTP attempt of this request instead of
	// Config.Timeout when > 0 (a long answer, such as a generated
	// program, takes minutes where a label takes seconds).
	Timeout time.Duration
	// Logprobs asks for the log probabilities of the answer's tokens and
	// TopLogprobs (0–20) alternatives for each.
	Logprobs    bool
	TopLogprobs int
	// Extra are further top-level request fields, sent as given (e.g.
	// vLLM's "structured_outputs": {"choice": [...]}). They never replace
	// the fields the client sets itself (model, messages, temperature,
	// max_tokens, logprobs, top_logprobs, response_format).
	Extra map[string]any
	// MaxAttempts, when > 0, lowers Config.MaxAttempts for this call (a
	// latency-bound caller such as the router retries less).
	MaxAttempts int
}

// TopLogprob is one alternative token with its log probability.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
}

// TokenLogprob is one token of the answer with its log probability.
type TokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	TopLogprobs []TopLogprob `json:"top_logprobs,omitempty"`
}

// Response is the accepted answer of a Chat call.
type Response struct {
	// Content is the accepted answer with a surrounding ``` fence removed;
	// Raw is the answer as the server sent it.
	Content string
	Raw     string
	// Model is the model name the server reports; FinishReason its
	// finish_reason ("stop", "length", …).
	Model        string
	FinishReason string
	// Token usage (from "usage") of the accepted attempt, and summed over
	// every attempt of the call.
	PromptTokens, CompletionTokens           int
	TotalPromptTokens, TotalCompletionTokens int
	// Logprobs of the answer's tokens, when requested and returned.
	Logprobs []TokenLogprob
	// Attempts is the number of HTTP attempts the call made (1 = first try).
	Attempts int
	// Latency of the accepted attempt.
	Latency time.Duration
}

// Client is an OpenAI chat-completions client. It is safe for concurrent use;
// all calls share its concurrency bound and rate limit.
type Client struct {
	cfg      Config
	chatURL  string
	endpoint string // redacted base URL, for audit rows and errors
	http     *http.Client
	sem      chan struct{}
	limiter  *rate.Limiter
	log      *slog.Logger
	schemas  schemaCache
	// completionTokens is set once the server refused max_tokens and asked
	// for max_completion_tokens (OpenAI's reasoning models: o1, o3, gpt-5,
	// …): every later request caps its answer with that field instead.
	completionTokens atomic.Bool
}

// New validates cfg (after WithDefaults) and returns a client.
func New(cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Client{
		cfg:      cfg,
		chatURL:  cfg.BaseURL + "/chat/completions",
		endpoint: redactURL(cfg.BaseURL),
		http:     cfg.HTTPClient,
		sem:      make(chan struct{}, cfg.Concurrency),
		log:      cfg.Logger,
	}
	if c.http == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = cfg.Concurrency
		c.http = &http.Client{Transport: tr}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if cfg.RatePerSecond > 0 {
		c.limiter = rate.NewLimiter(rate.Limit(cfg.RatePerSecond), 1)
	}
	return c, nil
}

// Model is the configured model name.
func (c *Client) Model() string { return c.cfg.Model }

// Endpoint is the base URL without credentials, as recorded in audit rows.
func (c *Client) Endpoint() string { return c.endpoint }

// StructuredOutput is the configured structured-output mode.
func (c *Client) StructuredOutput() StructuredOutput { return c.cfg.StructuredOutput }

// PromptHash is the hex sha256 of the JSON encoding of msgs: equal prompts
// have equal hashes, so audit rows can be grouped without storing prompts.
func PromptHash(msgs []Message) string {
	b, _ := json.Marshal(msgs)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Chat obtains one accepted answer for req.
//
// Attempts that end in a 429 (after the server's Retry-After, capped by
// MaxRetryAfter), a 5xx, a 408 or 409, a timeout, a connection error, or an answer that
// is not JSON or that the schema or req.Validate rejects are retried with
// capped exponential backoff, up to MaxAttempts in all; the attempt after
// a rejected answer cut at the token cap (finish_reason length) asks for
// twice that cap, up to MaxTokensGrowth times the first. Any other non-2xx
// status is returned at once. Every attempt is recorded through the
// Recorder. When no attempt succeeds the error is an *Error listing what
// each attempt ended with. A cancelled ctx stops the call and returns an
// error wrapping ctx.Err(); so does a stop of WithRetryStop, which ends
// the waits between attempts (ErrStopped).
func (c *Client) Chat(ctx context.Context, req Request) (Response, error) {
	if len(req.Messages) == 0 {
		return Response{}, fmt.Errorf("llm %s: request has no messages", req.Purpose)
	}
	var sch *compiledSchema
	if len(req.Schema) > 0 {
		var err error
		if sch, err = c.schemas.get(req.Schema); err != nil {
			return Response{}, fmt.Errorf("llm %s: request schema: %w", req.Purpose, err)
		}
	}
	// sent is req with the cap of the next attempt: an answer cut at the
	// cap (finish_reason length) that fails its checks would be cut the
	// same way again (at temperature 0, word for word), so the attempt
	// after it asks for twice the cap, up to MaxTokensGrowth times the
	// first. Without a cap there is nothing to raise.
	sent := req
	if req.MaxTokens <= 0 {
		sent.MaxTokens = c.cfg.MaxTokens
	}
	first := sent.MaxTokens
	body, err := c.newBody(func() ([]byte, error) { return c.body(sent) })
	if err != nil {
		return Response{}, fmt.Errorf("llm %s: %w", req.Purpose, err)
	}
	hash := PromptHash(req.Messages)

	r, tally, err := retry(ctx, c, req, func(attempt int) (attemptResult, Response) {
		res := c.attempt(ctx, req, body.current(), hash, attempt, sch)
		if next := min(2*sent.MaxTokens, MaxTokensGrowth*first); res.truncated && next > sent.MaxTokens {
			c.log.Info("llm answer cut at its token cap; the next attempt asks for more", "purpose", req.Purpose,
				"rollout_id", req.RolloutID, "attempt", attempt, "max_tokens", sent.MaxTokens, "next_max_tokens", next)
			sent.MaxTokens = next
			body.rebuild()
		}
		return res, res.resp
	})
	r.Attempts, r.TotalPromptTokens, r.TotalCompletionTokens = tally.attempts, tally.promptTokens, tally.completionTokens
	return r, err
}

// tally counts a call's attempts and the tokens they spent.
type tally struct{ attempts, promptTokens, completionTokens int }

// retry runs try (attempt 1, 2, …) until an attempt succeeds, fails for
// good (not retryable, or cfg.MaxAttempts reached: an *Error listing every
// outcome) or ctx ends, waiting between attempts with capped exponential
// backoff or the server's Retry-After (at most cfg.MaxRetryAfter). req names
// the call in errors and logs. On a cancelled ctx the tally is empty, and
// so it is when ctx's stop (WithRetryStop) ends the call between attempts:
// it starts no attempt after the stop.
func retry[R any](ctx context.Context, c *Client, req Request, try func(attempt int) (attemptResult, R)) (R, tally, error) {
	var zero R
	stop := retryStop(ctx)
	b := &backoff.ExponentialBackOff{
		InitialInterval:     c.cfg.BackoffInitial,
		RandomizationFactor: backoff.DefaultRandomizationFactor,
		Multiplier:          backoff.DefaultMultiplier,
		MaxInterval:         c.cfg.BackoffMax,
		MaxElapsedTime:      0,
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	b.Reset()
	var (
		outcomes []string
		t        tally
	)
	for attempt := 1; ; attempt++ {
		if isClosed(stop) {
			return zero, tally{}, fmt.Errorf("llm %s: before attempt %d: %w", req.Purpose, attempt, ErrStopped)
		}
		res, r := try(attempt)
		t.attempts = attempt
		t.promptTokens += res.promptTokens
		t.completionTokens += res.completionTokens
		if res.outcome == OutcomeOK {
			return r, t, nil
		}
		if ctx.Err() != nil {
			return zero, tally{}, fmt.Errorf("llm %s: attempt %d: %w", req.Purpose, attempt, context.Cause(ctx))
		}
		if res.stopped { // while waiting for a slot: nothing was sent
			return zero, tally{}, fmt.Errorf("llm %s: attempt %d: %w", req.Purpose, attempt, ErrStopped)
		}
		outcomes = append(outcomes, res.outcome)
		maxAttempts := c.cfg.MaxAttempts
		if req.MaxAttempts > 0 {
			maxAttempts = min(maxAttempts, req.MaxAttempts)
		}
		if !res.retryable || attempt >= maxAttempts {
			return zero, t, &Error{Purpose: req.Purpose, Attempts: attempt, Outcomes: outcomes, Status: res.status, Retryable: res.retryable, Err: res.err}
		}
		if isClosed(stop) { // a failed attempt that was in flight at the stop
			return zero, tally{}, fmt.Errorf("llm %s: attempt %d %s, not retried: %w", req.Purpose, attempt, res.outcome, ErrStopped)
		}
		wait := b.NextBackOff()
		switch {
		case res.retryNow:
			wait = 0
		case res.retryAfter > 0:
			wait = min(res.retryAfter, c.cfg.MaxRetryAfter)
		}
		c.log.Warn("llm attempt failed, retrying", "purpose", req.Purpose, "rollout_id", req.RolloutID, "run", req.Run,
			"attempt", attempt, "outcome", res.outcome, "error", res.err, "wait", wait)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return zero, tally{}, fmt.Errorf("llm %s: waiting to retry: %w", req.Purpose, context.Cause(ctx))
		case <-stop:
			timer.Stop()
			return zero, tally{}, fmt.Errorf("llm %s: waiting %v to retry after attempt %d (%s): %w", req.Purpose, wait, attempt, res.outcome, ErrStopped)
		case <-timer.C:
		}
	}
}

// acquire takes a slot of the concurrency bound, then a token of the rate
// limit (spent right before the request goes out). It returns the slot's
// release, or the attempt's result when ctx ended, ctx's stop
// (WithRetryStop) came first, or the limiter refused.
func (c *Client) acquire(ctx context.Context) (release func(), failed *attemptResult) {
	wctx := ctx // ends with ctx, and at its stop
	if stop := retryStop(ctx); stop != nil {
		var cancel context.CancelFunc
		wctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-stop:
				cancel()
			case <-wctx.Done():
			}
		}()
	}
	ended := func() *attemptResult {
		if ctx.Err() != nil {
			return &attemptResult{outcome: OutcomeCanceled, err: ctx.Err()}
		}
		return &attemptResult{outcome: OutcomeCanceled, err: ErrStopped, stopped: true}
	}
	select {
	case c.sem <- struct{}{}:
	case <-wctx.Done():
		return nil, ended()
	}
	release = func() { <-c.sem }
	if c.limiter != nil {
		if err := c.limiter.Wait(wctx); err != nil {
			release()
			if wctx.Err() != nil {
				return nil, ended()
			}
			return nil, &attemptResult{outcome: OutcomeTimeout, err: fmt.Errorf("rate limit: %w", err)}
		}
	}
	return release, nil
}

// ErrStopped is wrapped in the error of a call that ended because the stop
// of its context (WithRetryStop) came before its next attempt. It wraps
// context.Canceled: the call was cancelled, it did not fail.
var ErrStopped = fmt.Errorf("stopped before the next attempt by the caller (a shutdown, or its work held): %w", context.Canceled)

type retryStopKey struct{}

// WithRetryStop returns ctx with a stop for the calls made with it: once
// stop is closed, a call starts no new attempt. A call waiting to retry (a
// backoff, a 429's Retry-After: up to MaxRetryAfter), or for a slot of
// the concurrency bound or the rate limit, returns at once with an error
// wrapping ErrStopped (and so context.Canceled), auditing nothing, since
// nothing was sent. An attempt already sent is not cut short (its answer
// is paid for): the call returns its answer, its failure when it is not
// retried or the last, or else ErrStopped. ctx's own cancellation works
// as ever.
//
// It is for work that a shutdown hands back to be done again (a Kafka
// batch left uncommitted) while its context stays alive for a drain: the
// waits between attempts would otherwise hold the shutdown until the
// context ends (a 60 s Retry-After held the analyze stage's for its whole
// 8 s drain). The analyze stage also closes it once the endpoint is found
// unavailable (a 401): the batch is held and retried, and no attempt of it
// is worth sending meanwhile.
func WithRetryStop(ctx context.Context, stop <-chan struct{}) context.Context {
	if stop == nil {
		return ctx
	}
	return context.WithValue(ctx, retryStopKey{}, stop)
}

// retryStop is ctx's stop (WithRetryStop), nil without one.
func retryStop(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(retryStopKey{}).(<-chan struct{})
	return ch
}

// isClosed reports whether ch (nil: never) is closed.
func isClosed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

type wireRequest struct {
	Model       string    `json:"model"`
	Messages    []Message `json:"messages"`
	Temperature *float64  `json:"temperature,omitempty"`
	MaxTokens   int       `json:"max_tokens,omitempty"`
	// MaxCompletionTokens replaces MaxTokens for a server that refuses it
	// (Client.completionTokens).
	MaxCompletionTokens int  `json:"max_completion_tokens,omitempty"`
	Logprobs            bool `json:"logprobs,omitempty"`
	TopLogprobs         int  `json:"top_logprobs,omitempty"`
	ResponseFormat      any  `json:"response_format,omitempty"`
}

func (c *Client) body(req Request) ([]byte, error) {
	w := wireRequest{Model: c.cfg.Model, Messages: req.Messages, Temperature: c.cfg.Temperature, MaxTokens: c.cfg.MaxTokens}
	if req.Temperature != nil {
		w.Temperature = req.Temperature
	}
	if req.MaxTokens > 0 {
		w.MaxTokens = req.MaxTokens
	}
	if c.completionTokens.Load() {
		w.MaxTokens, w.MaxCompletionTokens = 0, w.MaxTokens
	}
	if req.Logprobs {
		w.Logprobs = true
		w.TopLogprobs = req.TopLogprobs
	}
	if len(req.Schema) > 0 {
		name := req.SchemaName
		name = cmp.Or(name, "response")
		switch c.cfg.StructuredOutput {
		case StructuredJSONSchema:
			w.ResponseFormat = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": name, "schema": req.Schema, "strict": true}}
		case StructuredJSONObject:
			w.ResponseFormat = map[string]any{"type": "json_object"}
		case StructuredJSONObjectSchema:
			w.ResponseFormat = map[string]any{"type": "json_object", "schema": req.Schema}
		}
	}
	if len(req.Extra) == 0 && len(c.cfg.ExtraBody) == 0 {
		return json.Marshal(w)
	}
	base, err := json.Marshal(w)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(base, &fields); err != nil {
		return nil, err
	}
	// The request's fields first: a key both set is the request's.
	for _, extra := range []map[string]any{req.Extra, c.cfg.ExtraBody} {
		for k, v := range extra {
			if _, own := fields[k]; own || k == "model" || k == "messages" {
				continue
			}
			if k == "max_tokens" && c.completionTokens.Load() { // the server refuses it
				continue
			}
			b, err := json.Marshal(v)
			if err != nil {
				return nil, fmt.Errorf("request field %q: %w", k, err)
			}
			fields[k] = b
		}
	}
	return json.Marshal(fields)
}

// reqBody is a request's body, made again for the attempts after the
// client switched to max_completion_tokens (a server refused max_tokens).
type reqBody struct {
	c          *Client
	build      func() ([]byte, error)
	b          []byte
	completion bool // made with max_completion_tokens
	stale      bool // the request changed since b was made
}

func (c *Client) newBody(build func() ([]byte, error)) (*reqBody, error) {
	completion := c.completionTokens.Load()
	b, err := build()
	if err != nil {
		return nil, err
	}
	return &reqBody{c: c, build: build, b: b, completion: completion}, nil
}

// current is the body for the next attempt.
func (r *reqBody) current() []byte {
	if ct := r.c.completionTokens.Load(); ct != r.completion || r.stale {
		if b, err := r.build(); err == nil {
			r.b, r.completion, r.stale = b, ct, false
		}
	}
	return r.b
}

// rebuild makes the next attempt's body again (its request changed).
func (r *reqBody) rebuild() { r.stale = true }

type attemptResult struct {
	outcome                        string
	retryable                      bool
	status                         int
	retryAfter                     time.Duration
	retryNow                       bool // retry at once: the next attempt sends another request
	stopped                        bool // not made: ctx's stop came while it waited for a slot
	truncated                      bool // the answer failed its checks and was cut at the cap (finish_reason length)
	promptTokens, completionTokens int
	err                            error
	resp                           Response
}

type wireResponse struct {
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content *string `json:"content"`
			Refusal *string `json:"refusal"`
		} `json:"message"`
		FinishReason string          `json:"finish_reason"`
		Logprobs     json.RawMessage `json:"logprobs"` // read by readLogprobs
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	// CompletionProbs is llama.cpp's own layout of logprobs (readLogprobs).
	CompletionProbs json.RawMessage `json:"completion_probabilities"`
}

// attempt makes one HTTP attempt and records it.
func (c *Client) attempt(ctx context.Context, req Request, body []byte, hash string, attempt int, sch *compiledSchema) (res attemptResult) {
	release, failed := c.acquire(ctx)
	if failed != nil {
		return *failed
	}
	defer release()

	start := time.Now()
	defer func() { c.record(ctx, req, hash, attempt, start, res) }()

	timeout := c.cfg.Timeout
	if req.Timeout > 0 {
		timeout = req.Timeout
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(actx, http.MethodPost, c.chatURL, bytes.NewReader(body))
	if err != nil {
		return attemptResult{outcome: OutcomeNetwork, err: c.redactErr(err)}
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	if c.cfg.APIKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.cfg.APIKey.Reveal())
	}
	hresp, err := c.http.Do(hreq)
	if err != nil {
		return c.transportFailure(ctx, actx, err, timeout)
	}
	data, err := io.ReadAll(io.LimitReader(hresp.Body, maxResponseBytes+1))
	hresp.Body.Close()
	if err != nil {
		r := c.transportFailure(ctx, actx, err, timeout)
		r.status = hresp.StatusCode
		return r
	}
	latency := time.Since(start)

	if s := hresp.StatusCode; s < 200 || s > 299 {
		return c.statusFailure(s, hresp.Header, data, body)
	}
	res.status = hresp.StatusCode
	if len(data) > maxResponseBytes {
		res.outcome, res.retryable, res.err = OutcomeInvalidJSON, true, fmt.Errorf("%w: response body exceeds %d bytes", ErrInvalidJSON, maxResponseBytes)
		return res
	}
	var wr wireResponse
	if err := json.Unmarshal(data, &wr); err != nil {
		res.outcome, res.retryable, res.err = OutcomeInvalidJSON, true, fmt.Errorf("%w: response envelope: %v (body %q)", ErrInvalidJSON, err, cut(string(data), 120))
		return res
	}
	if wr.Usage != nil {
		res.promptTokens, res.completionTokens = wr.Usage.PromptTokens, wr.Usage.CompletionTokens
	}
	if len(wr.Choices) == 0 {
		res.outcome, res.retryable, res.err = OutcomeInvalidJSON, true, fmt.Errorf("%w: response has no choices%s", ErrInvalidJSON, c.bodyError(data))
		return res
	}
	ch := wr.Choices[0]
	if ch.Message.Content == nil {
		msg := "answer has no content"
		if ch.Message.Refusal != nil {
			msg = "model refused: " + cut(*ch.Message.Refusal, 200)
		}
		res.outcome, res.retryable, res.err = OutcomeSchema, true, fmt.Errorf("%w: %s (finish_reason %q)", ErrSchema, msg, ch.FinishReason)
		res.truncated = ch.FinishReason == "length" // a reasoning model that thought up to the cap
		return res
	}
	raw := *ch.Message.Content
	content := StripFences(raw)
	if err := checkAnswer(content, sch, req.Validate); err != nil {
		res.outcome, res.retryable = OutcomeSchema, true
		if errors.Is(err, ErrInvalidJSON) {
			res.outcome = OutcomeInvalidJSON
		}
		if ch.FinishReason == "length" {
			err = fmt.Errorf("%w (answer cut at max_tokens: finish_reason length)", err)
			res.truncated = true
		}
		res.err = err
		return res
	}
	res.outcome = OutcomeOK
	res.resp = Response{
		Content: content, Raw: raw, Model: wr.Model, FinishReason: ch.FinishReason,
		PromptTokens: res.promptTokens, CompletionTokens: res.completionTokens, Latency: latency,
	}
	res.resp.Logprobs = readLogprobs(ch.Logprobs, wr.CompletionProbs)
	return res
}

// checkAnswer applies the JSON, schema, duplicate-key and caller checks.
func checkAnswer(content string, sch *compiledSchema, validate func(string) error) error {
	if sch != nil {
		if !json.Valid([]byte(content)) {
			return fmt.Errorf("%w: answer is not one JSON value: %q", ErrInvalidJSON, cut(content, 120))
		}
		if err := sch.validate(content); err != nil {
			// The caller's check usually says more precisely what is wrong
			// (which capability, which id); prefer it when it also objects.
			if validate != nil {
				if verr := validate(content); verr != nil && !errors.Is(verr, ErrInvalidJSON) {
					if errors.Is(verr, ErrSchema) {
						return verr
					}
					return fmt.Errorf("%w: %w", ErrSchema, verr)
				}
			}
			return fmt.Errorf("%w: %v (answer %q)", ErrSchema, err, cut(content, 160))
		}
		if err := CheckDuplicateKeys([]byte(content)); err != nil {
			return fmt.Errorf("%w: %v (answer %q)", ErrSchema, err, cut(content, 160))
		}
	}
	if validate != nil {
		if err := validate(content); err != nil {
			if errors.Is(err, ErrInvalidJSON) || errors.Is(err, ErrSchema) {
				return err
			}
			return fmt.Errorf("%w: %w", ErrSchema, err)
		}
	}
	return nil
}

// statusFailure classifies a non-2xx answer to the request body sent.
// 429 and 5xx are retried (after the server's Retry-After, when it sends
// one), and so are 408 (a proxy's or load balancer's request time-out) and
// 409 (a conflict, which OpenAI's own SDKs retry); any other status is
// returned at once: sending the same request again cannot help (400, 401,
// 403, 404, 422, …). One 400 is the exception: a server that refuses
// max_tokens for max_completion_tokens (OpenAI's reasoning models) gets
// the latter from then on, and the attempt is retried at once.
func (c *Client) statusFailure(s int, h http.Header, data, body []byte) attemptResult {
	r := attemptResult{outcome: OutcomeHTTP4xx, status: s, err: &StatusError{Status: s, Message: c.errorMessage(data)}}
	switch {
	case s == http.StatusBadRequest && bytes.Contains(body, []byte(`"max_tokens":`)) && refusesMaxTokens(data):
		if !c.completionTokens.Swap(true) {
			c.log.Info("llm: the server refuses max_tokens; sending max_completion_tokens from now on", "endpoint", c.endpoint, "model", c.cfg.Model)
		}
		r.retryable, r.retryNow = true, true
		return r
	case s == http.StatusTooManyRequests:
		r.outcome, r.retryable = OutcomeHTTP429, true
	case s >= 500:
		r.outcome, r.retryable = OutcomeHTTP5xx, true
	case s == http.StatusRequestTimeout || s == http.StatusConflict:
		r.retryable = true
	default:
		return r
	}
	r.retryAfter = retryAfter(h, time.Now())
	return r
}

// refusesMaxTokens reports whether a 400's body says that max_tokens is not
// supported and max_completion_tokens is wanted instead, as OpenAI answers
// for its reasoning models: {"error": {"message": "Unsupported parameter:
// 'max_tokens' is not supported with this model. Use
// 'max_completion_tokens' instead.", "param": "max_tokens", "code":
// "unsupported_parameter"}}.
func refusesMaxTokens(data []byte) bool {
	var e struct {
		Error struct {
			Message string `json:"message"`
			Param   string `json:"param"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &e) != nil {
		return false
	}
	m := e.Error.Message
	return strings.Contains(m, "max_completion_tokens") && (e.Error.Param == "max_tokens" || strings.Contains(strings.ReplaceAll(m, "max_completion_tokens", ""), "max_tokens"))
}

// transportFailure classifies an error of Do or of reading the body.
func (c *Client) transportFailure(ctx, actx context.Context, err error, timeout time.Duration) attemptResult {
	if ctx.Err() != nil {
		return attemptResult{outcome: OutcomeCanceled, err: ctx.Err()}
	}
	var ne net.Error
	if errors.Is(actx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return attemptResult{outcome: OutcomeTimeout, retryable: true, err: fmt.Errorf("no answer from %s within %v", c.endpoint, timeout)}
	}
	return attemptResult{outcome: OutcomeNetwork, retryable: true, err: fmt.Errorf("POST %s/chat/completions: %w", c.endpoint, c.redactErr(unwrapURLError(err)))}
}

// unwrapURLError drops *url.Error's wrapper, whose text repeats the request
// URL (which may carry a user name); the caller names the redacted endpoint.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err
	}
	return err
}

// record writes the audit row of one attempt.
func (c *Client) record(ctx context.Context, req Request, hash string, attempt int, start time.Time, res attemptResult) {
	if c.cfg.Recorder == nil {
		return
	}
	row := AuditRecord{
		TS: start, Purpose: req.Purpose, Model: c.cfg.Model, Endpoint: c.endpoint,
		PromptHash: hash, RolloutID: req.RolloutID, Run: uint16(max(req.Run, 0)), Attempt: uint8(min(attempt, math.MaxUint8)),
		PromptTokens: uint32(max(res.promptTokens, 0)), CompletionTokens: uint32(max(res.completionTokens, 0)),
		LatencyMS: uint32(min(time.Since(start).Milliseconds(), math.MaxUint32)), Outcome: res.outcome,
	}
	if res.err != nil {
		row.Error = cut(c.redact(res.err.Error()), 500)
	}
	c.cfg.Recorder.RecordLLMCall(context.WithoutCancel(ctx), row)
}

// errorMessage extracts the OpenAI error message of a non-2xx body.
func (c *Client) errorMessage(data []byte) string {
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	msg := strings.TrimSpace(string(data))
	if json.Unmarshal(data, &e) == nil && len(e.Error) > 0 {
		var obj struct {
			Message string `json:"message"`
		}
		var s string
		if json.Unmarshal(e.Error, &obj) == nil && obj.Message != "" {
			msg = obj.Message
		} else if json.Unmarshal(e.Error, &s) == nil {
			msg = s
		}
	}
	return cut(c.redact(msg), 300)
}

// bodyError is ": the server says: <message>" when a 2xx body without
// choices carries an error (some servers and gateways answer a failure
// with 200): OpenAI's {"error": {"message": …}} or vLLM's {"object":
// "error", "message": …}; "" otherwise.
func (c *Client) bodyError(data []byte) string {
	var e struct {
		Error   json.RawMessage `json:"error"`
		Object  string          `json:"object"`
		Message string          `json:"message"`
	}
	switch {
	case json.Unmarshal(data, &e) != nil:
		return ""
	case len(e.Error) > 0 && string(e.Error) != "null":
		return ": the server says: " + c.errorMessage(data)
	case e.Object == "error" && e.Message != "":
		return ": the server says: " + cut(c.redact(e.Message), 300)
	}
	return ""
}

// redact removes the API key from s (a server may echo it in an error).
func (c *Client) redact(s string) string {
	if k := c.cfg.APIKey.Reveal(); len(k) >= 4 {
		s = strings.ReplaceAll(s, k, redacted)
	}
	return s
}

func (c *Client) redactErr(err error) error {
	if err == nil {
		return nil
	}
	if s := c.redact(err.Error()); s != err.Error() {
		return errors.New(s)
	}
	return err
}

// retryAfter reads retry-after-ms (OpenAI) or Retry-After (seconds or an
// HTTP date). 0 means the server did not say.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 && ms < 1e9 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s <= 0 || s > 1e6 {
			return 0
		}
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// cut shortens s to n runes, marking the cut.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}
