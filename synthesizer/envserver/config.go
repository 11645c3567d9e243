package envserver

import (
	"errors"
	"fmt"
	"net"
	"path"
	"time"

	"github.com/traceops/trace/synthesizer/envprog"
)

// Config is the environment server's configuration (the `env:` section of
// trace's configuration; `trace env serve` sets it from flags).
type Config struct {
	// Addr is a dedicated listen address (host:port). Empty: the server is
	// mounted on the serve role's HTTP server.
	Addr string `koanf:"addr"`
	// BearerToken protects everything but the health endpoints. It is sent
	// as "Authorization: Bearer T", as the password of HTTP Basic
	// authentication (so that a client that cannot set headers, such as
	// openenv's WebSocket client, puts it in the URL: http://trace:T@host/…),
	// or as ?token=T. Empty: no authentication (trace's HTTP token model).
	BearerToken string `koanf:"bearer_token"`
	// MaxSessions bounds the concurrent sessions of one environment
	// (WebSocket connections and stateful HTTP sessions); one more is
	// answered CAPACITY_REACHED.
	MaxSessions int `koanf:"max_sessions"`
	// IdleTimeout evicts a session without a frame or request for that long
	// (SESSION_ERROR on its WebSocket, then the connection closes).
	IdleTimeout time.Duration `koanf:"idle_timeout"`
	// StepTimeout bounds one reset, step or reward computation; past it the
	// caller gets EXECUTION_ERROR at once and the episode is over.
	StepTimeout time.Duration `koanf:"step_timeout"`
	// MaxMessageBytes bounds one WebSocket frame or HTTP body; a larger one
	// is answered VALIDATION_ERROR (the WebSocket session survives a frame
	// up to 64 times the limit; a larger one closes it, 1009).
	MaxMessageBytes int `koanf:"max_message_bytes"`
	// MaxObservationBytes bounds one observation the server sends (its
	// JSON, as a WebSocket frame's data or an HTTP body; a tools/call
	// answer carries less than its step's observation). A program's
	// transcript is bounded (envprog.MaxTranscriptText, 16 MiB), but the
	// observation holds the last tool result three times (messages,
	// tool_results, last_tool_result), each escaped (a control character
	// takes 6 bytes): ~300 MB at worst. One over the limit is answered
	// EXECUTION_ERROR instead, saying its size, and its episode is over.
	MaxObservationBytes int `koanf:"max_observation_bytes"`
	// RecordSample is the share of finished episodes recorded in ClickHouse
	// env_episodes (0 to 1; the choice is a hash of the episode id).
	RecordSample float64 `koanf:"record_sample"`
	// RecordQueue bounds the episodes waiting to be written; past it an
	// episode is dropped (trace_env_episodes_dropped_total) rather than
	// slowing a step.
	RecordQueue int `koanf:"record_queue"`
	// RecordBatch and RecordFlush: an INSERT per RecordBatch episodes or
	// every RecordFlush, whichever comes first.
	RecordBatch int           `koanf:"record_batch"`
	RecordFlush time.Duration `koanf:"record_flush"`
	// GOGC is the garbage collector's target (Go's GOGC, a percentage) of
	// a process that runs the serve role alone: 400 by default, 0 leaves
	// Go's own (100). Serving environments makes garbage fast (every
	// reset builds a fresh store in the interpreter, every frame a buffer)
	// over a live heap of a few MB, so at Go's 100 the collector runs
	// every few MB; 400 collects a quarter as often for a heap goal of
	// five times the live heap instead of two (in the benchmark, 7–20 %
	// less CPU per step with programs in-process, no measurable change
	// sandboxed, ~15 MB more memory). GOGC in the environment wins; a
	// process with other roles keeps Go's setting. The sandbox workers set
	// their own (400, bounded by their memory limit).
	GOGC int `koanf:"gogc"`
	// WSOrigins are the origins, besides the server's own host, whose
	// browser pages may open a WebSocket (host patterns in path.Match
	// syntax, such as "*.example.com" or "localhost:*", matched against
	// scheme://host when they hold "://"; "*" allows any).
	// A connection whose Origin header names another host is refused
	// (403): it comes from a page of another site. Trainers' clients send
	// no Origin and are never refused.
	WSOrigins []string `koanf:"ws_origins"`
}

// minObservationBytes is the least env.max_observation_bytes: an
// observation carries the tools' schemas and the prompts, a few kB for a
// small environment.
const minObservationBytes = 64 << 10

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		MaxSessions:     64,
		IdleTimeout:     5 * time.Minute,
		StepTimeout:     30 * time.Second,
		MaxMessageBytes: 1 << 20,
		// Twice the transcript's bound: any transcript fits once, with
		// room for the step's results beside it; far below openenv's
		// client's 100 MB frame limit.
		MaxObservationBytes: 2 * envprog.MaxTranscriptText,
		RecordSample:        1.0,
		RecordQueue:         10000,
		RecordBatch:         1000,
		RecordFlush:         time.Second,
		GOGC:                400,
	}
}

// Validate names the first bad field of every bad value, as trace's
// configuration spells it (ConfigName: env.max_sessions).
func (c Config) Validate() error { return c.Check(ConfigName) }

// ConfigName is a setting's name in trace's configuration, given its key
// (max_sessions → env.max_sessions).
func ConfigName(key string) string { return "env." + key }

// Check is Validate with every setting named by name(key), key being its
// configuration key (max_sessions): trace env serve names its flags.
func (c Config) Check(name func(key string) string) error {
	var errs []error
	if c.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not host:port", name("addr"), c.Addr))
		}
	}
	if c.MaxSessions < 1 {
		errs = append(errs, fmt.Errorf("%s: %d, must be at least 1", name("max_sessions"), c.MaxSessions))
	}
	if c.IdleTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%s: %s, must be positive", name("idle_timeout"), c.IdleTimeout))
	}
	if c.StepTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%s: %s, must be positive", name("step_timeout"), c.StepTimeout))
	}
	if c.MaxMessageBytes < 1024 {
		errs = append(errs, fmt.Errorf("%s: %d, must be at least 1024", name("max_message_bytes"), c.MaxMessageBytes))
	}
	if c.MaxObservationBytes < minObservationBytes {
		errs = append(errs, fmt.Errorf("%s: %d, must be at least %d", name("max_observation_bytes"), c.MaxObservationBytes, minObservationBytes))
	}
	if !(c.RecordSample >= 0 && c.RecordSample <= 1) {
		errs = append(errs, fmt.Errorf("%s: %v, must be in [0, 1]", name("record_sample"), c.RecordSample))
	}
	if c.RecordQueue < 1 {
		errs = append(errs, fmt.Errorf("%s: %d, must be at least 1", name("record_queue"), c.RecordQueue))
	}
	if c.RecordBatch < 1 {
		errs = append(errs, fmt.Errorf("%s: %d, must be at least 1", name("record_batch"), c.RecordBatch))
	}
	if c.RecordFlush <= 0 {
		errs = append(errs, fmt.Errorf("%s: %s, must be positive", name("record_flush"), c.RecordFlush))
	}
	if c.GOGC < 0 || c.GOGC > 10000 {
		errs = append(errs, fmt.Errorf("%s: %d, must be 0 (Go's own) or a percentage up to 10000", name("gogc"), c.GOGC))
	}
	for i, p := range c.WSOrigins {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			errs = append(errs, fmt.Errorf("%s[%d]: %q is not a host pattern (path.Match syntax, such as *.example.com)", name("ws_origins"), i, p))
		}
	}
	return errors.Join(errs...)
}
