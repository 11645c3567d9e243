package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/traceops/trace/schemas"
)

// Where a webhook's trainers report.
const (
	EventsNATS     = "nats"     // trace.training.events.<job_id>
	EventsCallback = "callback" // POST /v1/training/jobs/{id}/events on the serve role
)

// Defaults of WebhookConfig.
const (
	DefaultWebhookTimeout  = 10 * time.Second
	DefaultWebhookRetryFor = 45 * time.Second
	minSecretLen           = 16
)

// WebhookConfig configures the webhook backend (adapter.webhook).
type WebhookConfig struct {
	URL string // where specs are POSTed
	// Secret is the HMAC-SHA256 key of SignatureHeader (and of callbacks);
	// at least 16 bytes.
	Secret string
	// BearerToken, when set, is sent as Authorization: Bearer too.
	BearerToken string
	// Timeout bounds one attempt; RetryFor all of them (network errors,
	// 5xx and 429 are retried with exponential backoff from
	// InitialInterval).
	Timeout         time.Duration
	RetryFor        time.Duration
	InitialInterval time.Duration
	// Events is where trainers report: nats (default) or callback.
	Events string
	// CallbackURL is the base URL trainers reach this trace's HTTP server
	// at (events: callback); a job's report.callback_url is
	// <CallbackURL>/v1/training/jobs/<job_id>/events.
	CallbackURL string
	// CallbackToken, when set, is a bearer token the callback accepts
	// instead of a signature.
	CallbackToken string
	// Tolerance of a callback signature's timestamp (default 5m).
	Tolerance time.Duration
}

// WithDefaults fills the zero values.
func (c WebhookConfig) WithDefaults() WebhookConfig {
	if c.Timeout == 0 {
		c.Timeout = DefaultWebhookTimeout
	}
	if c.RetryFor == 0 {
		c.RetryFor = DefaultWebhookRetryFor
	}
	if c.InitialInterval == 0 {
		c.InitialInterval = 500 * time.Millisecond
	}
	if c.Events == "" {
		c.Events = EventsNATS
	}
	if c.Tolerance == 0 {
		c.Tolerance = DefaultSignatureTolerance
	}
	return c
}

// Validate checks the configuration; prefix names the fields.
func (c WebhookConfig) Validate(prefix string) error {
	var errs []error
	if u, err := url.Parse(c.URL); c.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("%surl: %q is not an http(s) URL", prefix, c.URL))
	}
	if len(c.Secret) < minSecretLen {
		errs = append(errs, fmt.Errorf("%ssecret: at least %d bytes are required (it signs every POST; set TRACE_ADAPTER__WEBHOOK__SECRET)", prefix, minSecretLen))
	}
	for name, d := range map[string]time.Duration{"timeout": c.Timeout, "retry_for": c.RetryFor, "tolerance": c.Tolerance} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s%s: must not be negative, got %s", prefix, name, d))
		}
	}
	switch c.Events {
	case "", EventsNATS, EventsCallback:
	default:
		errs = append(errs, fmt.Errorf("%sevents: %q is not nats or callback", prefix, c.Events))
	}
	if c.CallbackURL != "" {
		if u, err := url.Parse(c.CallbackURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%scallback_url: %q is not an http(s) URL", prefix, c.CallbackURL))
		}
	}
	return errors.Join(errs...)
}

// CallbackPath is the callback endpoint of a job.
func CallbackPath(jobID string) string { return "/v1/training/jobs/" + jobID + "/events" }

// Webhook POSTs each job's spec, signed, to a URL (a team's scheduler or
// CI). Dispatch returns once the receiver answered 2xx. Network errors,
// 5xx and 429 are retried with exponential backoff for RetryFor, each
// attempt signed afresh; when they run out Dispatch returns the error and
// the adapt role retries the dispatch later. Any other 4xx is final: the
// job is recorded FAILED with the status and the answer.
type Webhook struct {
	cfg      WebhookConfig
	endpoint string   // cfg.URL without its password, for records and errors
	Reporter Reporter // set before the first Dispatch (the adapt stage)
	Client   *http.Client
	log      *slog.Logger
	now      func() time.Time
}

// NewWebhook checks cfg.
func NewWebhook(cfg WebhookConfig, log *slog.Logger) (*Webhook, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate("adapter.webhook."); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	u, _ := url.Parse(cfg.URL) // Validate parsed it
	return &Webhook{cfg: cfg, endpoint: u.Redacted(), Client: &http.Client{}, log: log, now: time.Now}, nil
}

// Name is "webhook".
func (w *Webhook) Name() string { return "webhook" }

// Config is the effective configuration.
func (w *Webhook) Config() WebhookConfig { return w.cfg }

// statusError is a non-2xx answer.
type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string {
	s := fmt.Sprintf("answered %d %s", e.code, http.StatusText(e.code))
	if e.body != "" {
		s += ": " + e.body
	}
	return s
}

// Retryable says whether an answer's status is worth another attempt:
// 5xx and 429 (and no answer at all, status 0).
func Retryable(status int) bool {
	return status == 0 || status == http.StatusTooManyRequests || status >= 500
}

// Dispatch POSTs the spec; see Webhook.
func (w *Webhook) Dispatch(ctx context.Context, job *schemas.TrainingJob, spec []byte) error {
	if w.Reporter == nil {
		return errors.New("webhook backend: no reporter")
	}
	attempts := 0
	var accepted *http.Response
	var acceptedBody string
	op := func() error {
		attempts++
		res, body, err := w.post(ctx, job.JobID, spec)
		if err != nil {
			w.log.Warn("webhook: no answer", "job", job.JobID, "attempt", attempts, "err", err)
			return err
		}
		if res.StatusCode >= 200 && res.StatusCode < 300 {
			accepted, acceptedBody = res, body
			return nil
		}
		se := &statusError{code: res.StatusCode, body: body}
		if !Retryable(res.StatusCode) {
			return backoff.Permanent(se)
		}
		w.log.Warn("webhook: will retry", "job", job.JobID, "attempt", attempts, "status", res.StatusCode)
		return se
	}
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(w.cfg.InitialInterval), backoff.WithMaxElapsedTime(w.cfg.RetryFor))
	err := backoff.Retry(op, backoff.WithContext(b, ctx))
	if err == nil {
		note, _ := json.Marshal(map[string]any{"url": w.endpoint, "status": accepted.StatusCode, "attempts": attempts, "answer": acceptedBody,
			"events": w.cfg.Events})
		w.log.Info("webhook accepted the training job", "job", job.JobID, "status", accepted.StatusCode, "attempts", attempts)
		return w.Reporter.RecordNote(ctx, job.JobID, "webhook:accepted", "webhook_accepted", note)
	}
	var se *statusError
	if errors.As(err, &se) && !Retryable(se.code) {
		reason := fmt.Sprintf("webhook: POST %s %s (attempt %d); not retried", w.endpoint, se.Error(), attempts)
		e := &schemas.TrainingEvent{JobID: job.JobID, Type: schemas.EventFailed, At: w.now().UTC(), Worker: "trace webhook backend", Reason: reason}
		data, eerr := e.Encode()
		if eerr != nil {
			return eerr
		}
		w.log.Warn("webhook rejected the training job", "job", job.JobID, "status", se.code, "answer", se.body)
		return w.Reporter.HandleEvent(ctx, e, "webhook:rejected", data)
	}
	return fmt.Errorf("webhook: POST %s: %d attempts in %s: %w", w.endpoint, attempts, w.cfg.RetryFor, err)
}

// post makes one signed attempt; the answer's body is read (at most 1 KiB
// kept).
func (w *Webhook) post(ctx context.Context, jobID string, spec []byte) (*http.Response, string, error) {
	actx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, w.cfg.URL, bytes.NewReader(spec))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "trace-webhook/1")
	req.Header.Set("X-Trace-Job-Id", jobID)
	req.Header.Set("Idempotency-Key", jobID)
	req.Header.Set(SignatureHeader, Sign([]byte(w.cfg.Secret), w.now(), spec))
	if w.cfg.BearerToken != "" {
		req.Header.Set("Authorization", "Bearer "+w.cfg.BearerToken)
	}
	res, err := w.Client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 1024))
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20))
	return res, strings.TrimSpace(string(body)), nil
}
