package dispatch

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/schemas"
)

func TestSignAndVerify(t *testing.T) {
	secret := []byte("0123456789abcdef-secret")
	body := []byte(`{"job_id":"job-0123456789abcdef"}`)
	at := time.Unix(1_800_000_000, 0)
	sig := Sign(secret, at, body)
	// The documented construction, computed independently.
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("1800000000." + string(body)))
	if want := "t=1800000000,v1=" + hex.EncodeToString(m.Sum(nil)); sig != want {
		t.Fatalf("Sign = %s, want %s", sig, want)
	}
	other := Sign([]byte("another-secret-of-16"), at, body)
	v1 := strings.TrimPrefix(sig, "t=1800000000,")
	for _, tc := range []struct {
		name, header string
		body         []byte
		now          time.Time
		want         error  // errors.Is, or nil
		msg          string // substring of the error, when want is nil and an error is expected
	}{
		{"valid", sig, body, at, nil, ""},
		{"valid within tolerance", sig, body, at.Add(4 * time.Minute), nil, ""},
		{"rotation: a second v1", other + "," + v1, body, at, nil, ""},
		{"tampered body", sig, []byte(`{"job_id":"job-ffffffffffffffff"}`), at, ErrBadSignature, ""},
		{"other secret", other, body, at, ErrBadSignature, ""},
		{"replayed later", sig, body, at.Add(6 * time.Minute), ErrStale, ""},
		{"from the future", sig, body, at.Add(-6 * time.Minute), ErrStale, ""},
		{"timestamp changed", strings.Replace(sig, "t=1800000000", "t=1800000060", 1), body, at, ErrBadSignature, ""},
		{"missing", "", body, at, ErrNoSignature, ""},
		{"no v1", "t=1800000000", body, at, nil, "no v1 signature"},
		{"not hex", "t=1800000000,v1=zz", body, at, nil, "not hex"},
		{"bad t", "t=yesterday," + v1, body, at, nil, "not unix seconds"},
		{"garbage", "sha256=abc", body, at, nil, "not unix seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Verify(secret, tc.header, tc.body, tc.now, 5*time.Minute)
			switch {
			case tc.want == nil && tc.msg == "":
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
			case tc.want != nil:
				if !errors.Is(err, tc.want) {
					t.Fatalf("Verify = %v, want %v", err, tc.want)
				}
			default:
				if err == nil || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("Verify = %v, want an error with %q", err, tc.msg)
				}
			}
		})
	}
}

func TestExitOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		x    Exit
		want string // "" = the job's status stands
	}{
		{"run: success reported, exit 0", Exit{Mode: ModeRun, Code: 0, Terminal: true}, ""},
		{"run: exit 0 without a terminal event", Exit{Mode: ModeRun, Code: 0}, "command exited 0 without reporting succeeded or failed"},
		{"run: non-zero with stderr", Exit{Mode: ModeRun, Code: 3, StderrTail: "loading\nCUDA out of memory\n"},
			"command exited with code 3; stderr: loading\nCUDA out of memory"},
		{"run: non-zero after failed (recorded, ignored by the job)", Exit{Mode: ModeRun, Code: 1, Terminal: true}, "command exited with code 1"},
		{"run: timeout", Exit{Mode: ModeRun, Code: -1, Signal: "terminated", TimedOut: true, Timeout: 2 * time.Hour},
			"command timed out after 2h0m0s; its process group was killed"},
		{"run: trace stopping", Exit{Mode: ModeRun, Code: -1, Signal: "terminated", Stopped: true},
			"trace stopped while the command ran; its process group was killed"},
		{"run: killed by someone", Exit{Mode: ModeRun, Code: -1, Signal: "killed"}, "command killed by signal killed"},
		{"submit: accepted", Exit{Mode: ModeSubmit, Code: 0}, ""},
		{"submit: refused", Exit{Mode: ModeSubmit, Code: 1, StderrTail: "sbatch: error: invalid partition specified: gpu"},
			"submit command exited with code 1; stderr: sbatch: error: invalid partition specified: gpu"},
		{"submit: timeout", Exit{Mode: ModeSubmit, Code: -1, TimedOut: true, Timeout: 10 * time.Minute},
			"submit command timed out after 10m0s; its process group was killed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExitOutcome(tc.x); got != tc.want {
				t.Errorf("ExitOutcome = %q, want %q", got, tc.want)
			}
		})
	}
	long := strings.Repeat("x", 3000)
	if got := ExitOutcome(Exit{Mode: ModeRun, Code: 2, StderrTail: "a\n" + long}); len(got) > 1100 || !strings.HasSuffix(got, "xxx") {
		t.Errorf("a long stderr is cut to its end: %d bytes", len(got))
	}
}

func TestParseEventLine(t *testing.T) {
	const id = "job-0123456789abcdef"
	for _, tc := range []struct {
		name, line string
		event      bool
		typ        string // the event's type when valid
		err        string // substring of the error when malformed
	}{
		{"log line", "step 3 loss=0.21", false, "", ""},
		{"blank", "   ", false, "", ""},
		{"progress", `{"schema":"training_event/v1","job_id":"` + id + `","type":"progress","at":"2026-12-01T10:00:00Z","iteration":1,"mean_reward":0.4,"reward_std":0.2}`, true, "progress", ""},
		{"indented", `  {"schema":"training_event/v1","job_id":"` + id + `","type":"started","at":"2026-12-01T10:00:00Z"}`, true, "started", ""},
		{"truncated", `{"schema":"training_event/v1","job_id":"` + id + `","type":"progress"`, true, "", "json"},
		{"unknown type", `{"schema":"training_event/v1","job_id":"` + id + `","type":"done","at":"2026-12-01T10:00:00Z"}`, true, "", "type"},
		{"progress without reward", `{"schema":"training_event/v1","job_id":"` + id + `","type":"progress","at":"2026-12-01T10:00:00Z","iteration":1}`, true, "", "mean_reward"},
		{"other job", `{"schema":"training_event/v1","job_id":"job-ffffffffffffffff","type":"started","at":"2026-12-01T10:00:00Z"}`, true, "", "is not this command's job"},
		{"unknown field", `{"schema":"training_event/v1","job_id":"` + id + `","type":"started","at":"2026-12-01T10:00:00Z","gpu":"a100"}`, true, "", "gpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, isEvent, err := ParseEventLine(id, []byte(tc.line))
			if isEvent != tc.event {
				t.Fatalf("isEvent = %v, want %v", isEvent, tc.event)
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(strings.ToLower(err.Error()), tc.err) {
					t.Fatalf("err = %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.event && e.Type != tc.typ {
				t.Errorf("type %q, want %q", e.Type, tc.typ)
			}
		})
	}
}

func TestLineWriter(t *testing.T) {
	var got []string
	w := &lineWriter{line: func(b []byte) { got = append(got, string(b)) }}
	for _, p := range []string{"a", "b\nc\r\n", "", "\n\nd"} {
		_, _ = w.Write([]byte(p))
	}
	w.flush()
	if strings.Join(got, "|") != "ab|c|||d" {
		t.Errorf("lines %q", got)
	}
	got = nil
	_, _ = w.Write([]byte(strings.Repeat("y", maxLine+10) + "\nnext\n"))
	_, _ = w.Write([]byte(strings.Repeat("z", maxLine-1)))
	_, _ = w.Write([]byte("zz"))
	_, _ = w.Write([]byte("zz\nlast"))
	w.flush()
	if len(got) != 4 || len(got[0]) != maxLine || got[1] != "next" || got[2] != strings.Repeat("z", maxLine) || got[3] != "last" {
		t.Errorf("a line over maxLine is cut there, the rest dropped: %d pieces", len(got))
	}
}

func TestCommandConfigValidateAndExpand(t *testing.T) {
	ok := CommandConfig{Argv: []string{"sbatch", "--job-name=trace-{job_id}", "train.sh", "{spec}"}, SpecDir: "/tmp/specs"}
	if err := ok.Validate("adapter.command."); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    CommandConfig
		want string
	}{
		{CommandConfig{SpecDir: "/tmp"}, "adapter.command.argv: a command is required"},
		{CommandConfig{Argv: []string{"x", "{spec_path}"}, SpecDir: "/tmp"}, "adapter.command.argv[1]: unknown placeholder {spec_path}"},
		{CommandConfig{Argv: []string{"x"}, SpecDir: "/tmp", Mode: "detached"}, `adapter.command.mode: "detached" is not run or submit`},
		{CommandConfig{Argv: []string{"x"}}, "adapter.command.spec_dir: must not be empty"},
		{CommandConfig{Argv: []string{"x"}, SpecDir: "/tmp", Timeout: -time.Second}, "adapter.command.timeout"},
		{CommandConfig{Argv: []string{"x"}, SpecDir: "/tmp", Env: []string{"NOEQUALS"}}, "adapter.command.env[0]"},
	} {
		if err := tc.c.Validate("adapter.command."); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.c, err, tc.want)
		}
	}
	if _, err := NewCommand(CommandConfig{Argv: []string{"no-such-trainer-binary"}, SpecDir: t.TempDir()}, nil); err == nil ||
		!strings.HasPrefix(err.Error(), "adapter.command.argv[0]:") {
		t.Errorf("a missing program fails at start naming the field: %v", err)
	}
	job := &schemas.TrainingJob{JobID: "job-0123456789abcdef", Output: schemas.JobOutput{AdapterName: "cap-1", URI: "s3://b/cap-1"},
		Report: schemas.JobReport{EventsSubject: "trace.training.events.job-0123456789abcdef"}}
	got := Expand([]string{"run", "{spec}", "--name={adapter_name}", "{output_uri}", "{events_subject}", "{spec_dir}", `{"k":1}`, "{job_id}{job_id}"}, job, "/s/job-0123456789abcdef.json")
	want := []string{"run", "/s/job-0123456789abcdef.json", "--name=cap-1", "s3://b/cap-1", "trace.training.events.job-0123456789abcdef", "/s", `{"k":1}`,
		"job-0123456789abcdefjob-0123456789abcdef"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("Expand = %q, want %q", got, want)
	}
}

func TestRetryable(t *testing.T) {
	for code, want := range map[int]bool{0: true, 200: false, 400: false, 401: false, 404: false, 409: false, 422: false, 429: true, 500: true, 502: true, 503: true} {
		if Retryable(code) != want {
			t.Errorf("Retryable(%d) = %v", code, !want)
		}
	}
}

func TestWebhookConfigValidate(t *testing.T) {
	good := WebhookConfig{URL: "https://ci.example.internal/hooks/trace", Secret: "0123456789abcdef"}
	if err := good.WithDefaults().Validate("adapter.webhook."); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    WebhookConfig
		want string
	}{
		{WebhookConfig{Secret: "0123456789abcdef"}, `adapter.webhook.url: "" is not an http(s) URL`},
		{WebhookConfig{URL: "ftp://x/y", Secret: "0123456789abcdef"}, "adapter.webhook.url"},
		{WebhookConfig{URL: "https://x/y", Secret: "short"}, "adapter.webhook.secret: at least 16 bytes"},
		{WebhookConfig{URL: "https://x/y", Secret: "0123456789abcdef", Events: "kafka"}, `adapter.webhook.events: "kafka" is not nats or callback`},
		{WebhookConfig{URL: "https://x/y", Secret: "0123456789abcdef", CallbackURL: "trace:8080"}, "adapter.webhook.callback_url"},
	} {
		if err := tc.c.Validate("adapter.webhook."); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.c, err, tc.want)
		}
	}
}

func TestChildEnv(t *testing.T) {
	// OPENAI_API_KEY is trace's LLM key when llm.api_key is unset
	got := ChildEnv([]string{"PATH=/bin", "TRACE_CLICKHOUSE__PASSWORD=x", "TRACE_ADAPTER__WEBHOOK__SECRET=y", "TRACE_ENV_TOKEN=t", "HF_TOKEN=h", "TRACE_X", "OPENAI_API_KEY=sk"}, "TRACE_ENV_TOKEN")
	if strings.Join(got, " ") != "PATH=/bin TRACE_ENV_TOKEN=t HF_TOKEN=h" {
		t.Errorf("ChildEnv = %q", got)
	}
	if got := ChildEnv([]string{"TRACE_A=1", "B=2"}, ""); strings.Join(got, " ") != "B=2" {
		t.Errorf("ChildEnv without keep = %q", got)
	}
}
