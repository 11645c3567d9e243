package config

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/traceops/trace/adapter/dispatch"
)

// CommandBackend is adapter.command: the command backend (adapter.backend:
// command) runs a command per training job. See docs/training-protocol.md.
type CommandBackend struct {
	// Argv is the command template, run without a shell (write
	// [sh, -c, "…"] for one). Placeholders: {spec} (the job-spec file),
	// {job_id}, {adapter_name}, {output_uri}, {events_subject}, {spec_dir}.
	Argv []string `koanf:"argv"`
	// Mode: run (the command is the trainer: events on its stdout, its exit
	// code mapped) or submit (it hands the job to a scheduler and returns;
	// events then come over NATS).
	Mode string `koanf:"mode"`
	// SpecDir receives <job_id>.json (default: <data_dir>/training/specs).
	SpecDir string `koanf:"spec_dir"`
	// Dir is the command's working directory (default: trace's).
	Dir string `koanf:"dir"`
	// Env is added to the command's environment (KEY=value).
	Env []string `koanf:"env"`
	// Timeout kills the command's process group (0: 12h run, 10m submit).
	Timeout time.Duration `koanf:"timeout"`
	// KillGrace is the time between SIGTERM and SIGKILL.
	KillGrace time.Duration `koanf:"kill_grace"`
	// MaxRunning bounds commands at once (0: 1 in run mode, 4 in submit).
	MaxRunning int `koanf:"max_running"`
}

// WebhookBackend is adapter.webhook: the webhook backend (adapter.backend:
// webhook) POSTs each job spec, HMAC-signed, to URL.
type WebhookBackend struct {
	URL string `koanf:"url"`
	// Secret signs every POST and authenticates callbacks (>= 16 bytes;
	// a secret: TRACE_ADAPTER__WEBHOOK__SECRET).
	Secret string `koanf:"secret"`
	// BearerToken, when set, is also sent as Authorization: Bearer (secret).
	BearerToken string `koanf:"bearer_token"`
	// Timeout bounds one attempt; RetryFor all attempts (network errors,
	// 5xx, 429), after which the dispatch is retried later.
	Timeout  time.Duration `koanf:"timeout"`
	RetryFor time.Duration `koanf:"retry_for"`
	// Events: nats (trainers publish on trace.training.events.<job_id>) or
	// callback (they POST to /v1/training/jobs/<job_id>/events on the serve
	// role's HTTP server).
	Events string `koanf:"events"`
	// CallbackURL is the base URL trainers reach the serve role's HTTP
	// server at (default: http://<http.addr>).
	CallbackURL string `koanf:"callback_url"`
	// CallbackToken, when set, is a bearer token the callback accepts
	// instead of a signature (secret).
	CallbackToken string `koanf:"callback_token"`
	// Tolerance of a callback signature's timestamp.
	Tolerance time.Duration `koanf:"tolerance"`
}

func defaultCommandBackend() CommandBackend {
	return CommandBackend{Mode: dispatch.ModeRun, KillGrace: dispatch.DefaultKillGrace}
}

func defaultWebhookBackend() WebhookBackend {
	return WebhookBackend{Timeout: dispatch.DefaultWebhookTimeout, RetryFor: dispatch.DefaultWebhookRetryFor,
		Events: dispatch.EventsNATS, Tolerance: dispatch.DefaultSignatureTolerance}
}

// CommandConfig is adapter.command for the dispatch package, with the
// spec directory defaulted under data_dir.
func (c Config) CommandConfig() dispatch.CommandConfig {
	b := c.Adapter.Command
	return dispatch.CommandConfig{Argv: b.Argv, Mode: b.Mode, SpecDir: cmp.Or(b.SpecDir, c.Path("training", "specs")), Dir: b.Dir,
		Env: b.Env, Timeout: b.Timeout, KillGrace: b.KillGrace, MaxRunning: b.MaxRunning}.WithDefaults()
}

// WebhookConfig is adapter.webhook for the dispatch package, with the
// callback URL defaulted to this trace's HTTP server.
func (c Config) WebhookConfig() dispatch.WebhookConfig {
	b := c.Adapter.Webhook
	return dispatch.WebhookConfig{URL: b.URL, Secret: b.Secret, BearerToken: b.BearerToken, Timeout: b.Timeout, RetryFor: b.RetryFor,
		Events: b.Events, CallbackURL: cmp.Or(b.CallbackURL, "http://"+c.HTTP.Addr), CallbackToken: b.CallbackToken,
		Tolerance: b.Tolerance}.WithDefaults()
}

// TrainingCallback reports whether the serve role mounts the training
// callback endpoint (adapter.backend: webhook with events: callback).
func (c Config) TrainingCallback() bool {
	return c.Adapter.Backend == "webhook" && c.Adapter.Webhook.Events == dispatch.EventsCallback
}

// validateBackend checks the selected backend's section only.
func (c Config) validateBackend() error {
	switch c.Adapter.Backend {
	case "nats", "none":
		return nil
	case "command":
		return c.CommandConfig().Validate("adapter.command.")
	case "webhook":
		w := c.Adapter.Webhook
		var errs []error
		if w.Timeout <= 0 {
			errs = append(errs, fmt.Errorf("adapter.webhook.timeout: must be positive, got %s", w.Timeout))
		}
		if w.RetryFor <= 0 {
			errs = append(errs, fmt.Errorf("adapter.webhook.retry_for: must be positive, got %s", w.RetryFor))
		}
		if w.Tolerance <= 0 {
			errs = append(errs, fmt.Errorf("adapter.webhook.tolerance: must be positive, got %s", w.Tolerance))
		} else if dup := c.NATS.DuplicateWindow(); 2*w.Tolerance > dup {
			// A signed callback is accepted from tolerance before its
			// timestamp to tolerance after it; the copy's Msg-Id must still
			// be in the window when a replay comes.
			errs = append(errs, fmt.Errorf("adapter.webhook.tolerance: %s is more than half the de-duplication window nats.duplicates (%s), which drops a signed callback sent again within the tolerance", w.Tolerance, dup))
		}
		errs = append(errs, c.WebhookConfig().Validate("adapter.webhook."))
		return errors.Join(errs...)
	default:
		return fmt.Errorf("adapter.backend: %q is not nats, command, webhook or none", c.Adapter.Backend)
	}
}
