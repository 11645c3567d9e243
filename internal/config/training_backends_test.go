package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/adapter/dispatch"
)

func load(t *testing.T, yaml string, set ...string) (Config, error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "trace.yaml")
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return Load(f, set)
}

func TestTrainingBackendsLoad(t *testing.T) {
	c, err := load(t, `
data_dir: /var/lib/trace
adapter:
  backend: command
  command:
    argv: [python, -m, trace_trainer, --spec, "{spec}"]
    env: [HF_HOME=/models]
`)
	if err != nil {
		t.Fatal(err)
	}
	cc := c.CommandConfig()
	if strings.Join(cc.Argv, " ") != "python -m trace_trainer --spec {spec}" || cc.Mode != dispatch.ModeRun || cc.SpecDir != "/var/lib/trace/training/specs" ||
		cc.Timeout != dispatch.DefaultRunTimeout || cc.MaxRunning != 1 || cc.KillGrace != dispatch.DefaultKillGrace || cc.Env[0] != "HF_HOME=/models" {
		t.Errorf("command defaults: %+v", cc)
	}
	c, err = load(t, "adapter:\n  backend: command\n  command:\n    mode: submit\n", "adapter.command.argv=sbatch,--parsable,train.sbatch,{spec}")
	if err != nil {
		t.Fatal(err)
	}
	if cc := c.CommandConfig(); len(cc.Argv) != 4 || cc.Timeout != dispatch.DefaultSubmitTimeout || cc.MaxRunning != dispatch.DefaultSubmitRunning {
		t.Errorf("submit defaults and --set argv: %+v", cc)
	}

	t.Setenv("TRACE_ADAPTER__WEBHOOK__SECRET", "from-the-environment-0123")
	c, err = load(t, `
http: {addr: "0.0.0.0:8080"}
adapter:
  backend: webhook
  webhook:
    url: https://ci.example.internal/trace
    events: callback
`)
	if err != nil {
		t.Fatal(err)
	}
	wc := c.WebhookConfig()
	if wc.Secret != "from-the-environment-0123" || wc.CallbackURL != "http://0.0.0.0:8080" || wc.Timeout != dispatch.DefaultWebhookTimeout ||
		wc.RetryFor != dispatch.DefaultWebhookRetryFor || !c.TrainingCallback() {
		t.Errorf("webhook config: %+v", wc)
	}
	r := c.Redacted()
	if r.Adapter.Webhook.Secret != "[REDACTED]" || c.Adapter.Webhook.Secret == "[REDACTED]" {
		t.Errorf("the webhook secret is redacted in a copy only")
	}
	if d, _ := load(t, ""); d.TrainingCallback() || d.Adapter.Webhook.Events != "nats" {
		t.Errorf("no callback by default")
	}
}

func TestTrainingBackendsValidateNameTheField(t *testing.T) {
	for _, tt := range []struct {
		yaml, want string
	}{
		{"adapter:\n  backend: command\n", "adapter.command.argv: a command is required"},
		{"adapter:\n  backend: command\n  command:\n    argv: [train, \"{specfile}\"]\n", "adapter.command.argv[1]: unknown placeholder {specfile}"},
		{"adapter:\n  backend: command\n  command:\n    argv: [train]\n    mode: background\n", `adapter.command.mode: "background" is not run or submit`},
		{"adapter:\n  backend: command\n  command:\n    argv: [train]\n    timeout: -1s\n", "adapter.command.timeout"},
		{"adapter:\n  backend: webhook\n  webhook:\n    secret: 0123456789abcdef\n", `adapter.webhook.url: "" is not an http(s) URL`},
		{"adapter:\n  backend: webhook\n  webhook:\n    url: https://x.internal/y\n", "adapter.webhook.secret: at least 16 bytes"},
		{"adapter:\n  backend: webhook\n  webhook:\n    url: https://x.internal/y\n    secret: 0123456789abcdef\n    events: sqs\n", `adapter.webhook.events: "sqs" is not nats or callback`},
		{"adapter:\n  backend: webhook\n  webhook:\n    url: https://x.internal/y\n    secret: 0123456789abcdef\n    retry_for: 0s\n", "adapter.webhook.retry_for: must be positive"},
		// A replayed signed callback must still meet its first copy's Msg-Id.
		{"adapter:\n  backend: webhook\n  webhook:\n    url: https://x.internal/y\n    secret: 0123456789abcdef\n    tolerance: 6m\n",
			"adapter.webhook.tolerance: 6m0s is more than half the de-duplication window nats.duplicates (10m0s)"},
		{"nats:\n  duplicates: 2m\nadapter:\n  backend: webhook\n  webhook:\n    url: https://x.internal/y\n    secret: 0123456789abcdef\n",
			"adapter.webhook.tolerance: 5m0s is more than half the de-duplication window nats.duplicates (2m0s)"},
	} {
		_, err := load(t, tt.yaml)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want %q", tt.yaml, err, tt.want)
		}
	}
	// A backend's section is checked only when it is selected.
	if _, err := load(t, "adapter:\n  backend: nats\n  webhook:\n    events: sqs\n"); err != nil {
		t.Errorf("an unselected backend's section: %v", err)
	}
	for _, y := range []string{
		"adapter:\n  backend: webhook\n  webhook:\n    url: https://x.internal/y\n    secret: 0123456789abcdef\n    tolerance: 5m\n",
		"nats:\n  duplicates: 1h\nadapter:\n  backend: webhook\n  webhook:\n    url: https://x.internal/y\n    secret: 0123456789abcdef\n    tolerance: 30m\n",
	} {
		if _, err := load(t, y); err != nil {
			t.Errorf("%q: %v", y, err)
		}
	}
	_ = time.Second
}
