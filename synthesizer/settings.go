package synthesizer

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/prompts"
	"github.com/traceops/trace/synthesizer/calibrate"
	"github.com/traceops/trace/synthesizer/envprog"
)

// Settings is the synthesizer section of trace's configuration
// (internal/config, key "synthesizer"). Zero fields take the defaults of
// DefaultSettings; Validate names the first bad field.
type Settings struct {
	// MaxAttempts bounds the programs per environment (1–5, default 5).
	MaxAttempts int `koanf:"max_attempts"`
	// Concurrency is the environments synthesized at once (default 2),
	// never two of one target environment.
	Concurrency int `koanf:"concurrency"`
	// AckWait, MaxDeliver and NakDelay: the request consumer's ack wait
	// (in-progress acks every third of it; default 2m), the deliveries of a
	// request that keeps failing transiently before it is recorded FAILED
	// (default 5), the first redelivery delay (doubling, default 5s).
	AckWait    time.Duration `koanf:"ack_wait"`
	MaxDeliver int           `koanf:"max_deliver"`
	NakDelay   time.Duration `koanf:"nak_delay"`
	// Templates lets capabilities of a known family get a built-in
	// template when no generation model is configured (default true).
	Templates bool `koanf:"templates"`
	// MaxTokens of a generation answer (default 8192). The generation model
	// is llm.model at llm.base_url.
	MaxTokens int `koanf:"max_tokens"`
	// GenerationTimeout bounds one attempt of a generation request
	// (default 10m): an answer of max_tokens takes minutes on a
	// self-hosted model, where llm.timeout bounds the labeling's calls.
	GenerationTimeout time.Duration `koanf:"generation_timeout"`
	// Calibration is the calibration run of every program.
	Calibration CalibrationSettings `koanf:"calibration"`
	// Policy is what plays calibrations: "model" (default) — the cohort's
	// agent model from Policies, else the labeling model (llm.*) — or
	// "simulated", the simulated fleet's agent versions (trace demo only;
	// labeled simulated wherever it is shown).
	Policy string `koanf:"policy"`
	// Policies are the agent models of cohorts, by environment and agent
	// version ("*" for every version of an environment).
	Policies []PolicySettings `koanf:"policies"`
}

// CalibrationSettings are the calibration run and its bands.
type CalibrationSettings struct {
	Seeds        int           `koanf:"seeds"`          // default 100
	Rollouts     int           `koanf:"rollouts"`       // per seed, default 16
	Temperature  float64       `koanf:"temperature"`    // default 0.7
	Concurrency  int           `koanf:"concurrency"`    // rollouts at once, default 4
	HintShareMin float64       `koanf:"hint_share_min"` // default 0.25
	HintShareMax float64       `koanf:"hint_share_max"` // default 0.5
	Bands        BandsSettings `koanf:"bands"`
}

// BandsSettings are calibrate.Bands in the configuration.
type BandsSettings struct {
	MeanMin        float64 `koanf:"mean_min"`        // default 0.2
	MeanMax        float64 `koanf:"mean_max"`        // default 0.6
	SuccessMin     float64 `koanf:"success_min"`     // default 0.2
	SuccessMax     float64 `koanf:"success_max"`     // default 0.6
	MinStd         float64 `koanf:"min_std"`         // default 0.05
	MaxAllSuccess  float64 `koanf:"max_all_success"` // default 0.2
	MaxAllZero     float64 `koanf:"max_all_zero"`    // default 0.2
	MaxConstant    float64 `koanf:"max_constant"`    // default 0.5
	MinInformative float64 `koanf:"min_informative"` // default 0.5
}

// PolicySettings names the agent model of a cohort.
type PolicySettings struct {
	Environment  string `koanf:"environment"`
	AgentVersion string `koanf:"agent_version"` // "*": every version
	BaseURL      string `koanf:"base_url"`
	Model        string `koanf:"model"`
	APIKey       string `koanf:"api_key"` // secret
}

// Policy kinds.
const (
	PolicyModel     = "model"
	PolicySimulated = "simulated"
)

// DefaultSettings are the release's calibration (100 seeds × 16 rollouts
// at temperature 0.7, hints on 25–50 % of each group, the bands of
// TRACE-METHOD.md step 2), 5 attempts, templates on.
func DefaultSettings() Settings {
	b := calibrate.DefaultBands()
	c := calibrate.DefaultConfig()
	return Settings{
		MaxAttempts: DefaultMaxAttempts, Concurrency: DefaultWorkerConcurrency, AckWait: DefaultAckWait, MaxDeliver: DefaultMaxDeliver,
		NakDelay: DefaultNakDelay, Templates: true, MaxTokens: DefaultGenerateMaxTokens, GenerationTimeout: DefaultGenerateTimeout, Policy: PolicyModel,
		Calibration: CalibrationSettings{Seeds: c.Seeds, Rollouts: c.Rollouts, Temperature: c.Temperature, Concurrency: c.Concurrency,
			HintShareMin: c.HintShareMin, HintShareMax: c.HintShareMax,
			Bands: BandsSettings{MeanMin: b.MeanMin, MeanMax: b.MeanMax, SuccessMin: b.SuccessMin, SuccessMax: b.SuccessMax, MinStd: b.MinStd,
				MaxAllSuccess: b.MaxAllSuccess, MaxAllZero: b.MaxAllZero, MaxConstant: b.MaxConstant, MinInformative: b.MinInformative}},
	}
}

// CalibrationConfig is the calibration run the settings describe.
func (s Settings) CalibrationConfig() calibrate.Config {
	c := calibrate.DefaultConfig()
	cs := s.Calibration
	c.Seeds, c.Rollouts, c.Temperature, c.Concurrency = cs.Seeds, cs.Rollouts, cs.Temperature, cs.Concurrency
	c.HintShareMin, c.HintShareMax = cs.HintShareMin, cs.HintShareMax
	b := cs.Bands
	c.Bands = calibrate.Bands{MeanMin: b.MeanMin, MeanMax: b.MeanMax, SuccessMin: b.SuccessMin, SuccessMax: b.SuccessMax, MinStd: b.MinStd,
		MaxAllSuccess: b.MaxAllSuccess, MaxAllZero: b.MaxAllZero, MaxConstant: b.MaxConstant, MinInformative: b.MinInformative,
		SuccessThreshold: calibrate.DefaultBands().SuccessThreshold}
	return c
}

// Validate names the first bad field of the section ("synthesizer.…").
func (s Settings) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("synthesizer.%s: %s", field, fmt.Sprintf(format, args...))
	}
	switch {
	case s.MaxAttempts < 1 || s.MaxAttempts > DefaultMaxAttempts:
		return bad("max_attempts", "must be 1 to %d (TRACE: at most 5 regenerations), got %d", DefaultMaxAttempts, s.MaxAttempts)
	case s.Concurrency < 1:
		return bad("concurrency", "must be at least 1, got %d", s.Concurrency)
	case s.AckWait < time.Second:
		return bad("ack_wait", "must be at least 1s, got %s", s.AckWait)
	case s.MaxDeliver < 1:
		return bad("max_deliver", "must be at least 1, got %d", s.MaxDeliver)
	case s.NakDelay <= 0 || s.NakDelay > DefaultMaxNakDelay:
		return bad("nak_delay", "must be positive and at most %s (the retry delay's cap), got %s", DefaultMaxNakDelay, s.NakDelay)
	case s.MaxTokens < 256:
		return bad("max_tokens", "must be at least 256 (a program is thousands of tokens), got %d", s.MaxTokens)
	case s.GenerationTimeout < time.Second:
		return bad("generation_timeout", "must be at least 1s, got %s", s.GenerationTimeout)
	case s.Policy != PolicyModel && s.Policy != PolicySimulated:
		return bad("policy", "must be %q or %q, got %q", PolicyModel, PolicySimulated, s.Policy)
	}
	if err := s.CalibrationConfig().Check(func(key string) string { return "synthesizer.calibration." + key }); err != nil {
		return err
	}
	for i, p := range s.Policies {
		field := func(f string) string { return fmt.Sprintf("policies[%d].%s", i, f) }
		switch {
		case p.Environment == "":
			return bad(field("environment"), "is required")
		case p.AgentVersion == "":
			return bad(field("agent_version"), "is required (\"*\" for every version)")
		case p.BaseURL == "":
			return bad(field("base_url"), "is required (an OpenAI-compatible API root, e.g. http://vllm:8000/v1)")
		case p.Model == "":
			return bad(field("model"), "is required")
		}
	}
	return nil
}

// PolicyFor returns the agent model of a cohort: its exact entry in
// Policies, else the environment's "*" entry, else def (the labeling
// model); false when none has a base URL and a model.
func (s Settings) PolicyFor(environment, agentVersion string, def PolicySettings) (PolicySettings, bool) {
	for _, want := range []string{agentVersion, "*"} {
		for _, p := range s.Policies {
			if p.Environment == environment && p.AgentVersion == want {
				return p, true
			}
		}
	}
	return def, def.BaseURL != "" && def.Model != ""
}

// ErrNoPolicy is returned by a CalibratorFor when no policy is configured
// for a cohort: the environment waits (WAITING_FOR_LLM) until one is.
var ErrNoPolicy = errors.New("no policy model to calibrate with")

// Deps are what Build needs besides the settings.
type Deps struct {
	// Generator is the generation model's client; nil when none is
	// configured (templates only, or WAITING_FOR_LLM).
	Generator ChatClient
	// DefaultPolicy is the labeling model (llm.base_url, llm.model).
	DefaultPolicy PolicySettings
	// PolicyClient makes the client of a policy model (through
	// internal/llm, audited). Required with Policy "model".
	PolicyClient func(p PolicySettings) (*llm.Client, error)
	// Simulated returns the simulated policy of a cohort for a capability.
	// Required with Policy "simulated" (trace demo passes the simulated
	// fleet's agent versions).
	Simulated func(environment, agentVersion, capability string) (calibrate.Policy, error)
	Store     Store
	Examples  ExampleSource
	Dicts     Dictionaries
	Publisher ReadyPublisher
	Prompts   *prompts.Set
	Limits    envprog.Limits
	Log       *slog.Logger
}

// Build assembles the stage the settings describe.
func Build(s Settings, d Deps) (*Stage, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	cal := s.CalibrationConfig()
	cfg := Config{MaxAttempts: s.MaxAttempts, Validator: EnvValidator{Limits: d.Limits}, Store: d.Store, Publisher: d.Publisher,
		Examples: d.Examples, Dictionaries: d.Dicts, Log: d.Log}
	if d.Generator != nil {
		g, err := NewGenerator(d.Generator, GeneratorConfig{Prompts: d.Prompts, MaxTokens: s.MaxTokens, Timeout: s.GenerationTimeout})
		if err != nil {
			return nil, err
		}
		cfg.LLM = g
	}
	if s.Templates {
		cfg.Templates, cfg.Families = TemplateAuthor{Bands: cal.Bands}, TemplateFamilies{}
	}
	switch s.Policy {
	case PolicySimulated:
		if d.Simulated == nil {
			return nil, errors.New("synthesizer.policy: simulated is only available in trace demo")
		}
		cfg.Calibrators = func(j *Job) (Calibrator, error) {
			p, err := d.Simulated(j.Request.Environment, j.Request.AgentVersion, j.Request.Capability.Skill)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrNoPolicy, err)
			}
			return PolicyCalibrator{Policy: p, Config: cal, Limits: d.Limits}, nil
		}
	default:
		if d.PolicyClient == nil {
			return nil, errors.New("synthesizer: Deps.PolicyClient is required with synthesizer.policy: model")
		}
		var (
			mu      sync.Mutex
			clients = map[PolicySettings]*llm.Client{} // by URL, model and key
		)
		cfg.Calibrators = func(j *Job) (Calibrator, error) {
			r := j.Request
			p, ok := s.PolicyFor(r.Environment, r.AgentVersion, d.DefaultPolicy)
			if !ok {
				return nil, fmt.Errorf("%w for %s/%s: configure synthesizer.policies or llm.base_url and llm.model", ErrNoPolicy, r.Environment, r.AgentVersion)
			}
			mu.Lock()
			defer mu.Unlock()
			key := PolicySettings{BaseURL: p.BaseURL, Model: p.Model, APIKey: p.APIKey}
			c := clients[key]
			if c == nil {
				var err error
				if c, err = d.PolicyClient(p); err != nil {
					return nil, fmt.Errorf("policy %s at %s: %w", p.Model, p.BaseURL, err)
				}
				clients[key] = c
			}
			return PolicyCalibrator{Policy: calibrate.NewOpenAIPolicy(c, j.ID), Config: cal, Limits: d.Limits}, nil
		}
	}
	return NewStage(cfg)
}

// WorkerConfig is the worker the settings describe.
func (s Settings) WorkerConfig(waiting WaitingLister, requeue Requeuer, log *slog.Logger) WorkerConfig {
	return WorkerConfig{Concurrency: s.Concurrency, AckWait: s.AckWait, MaxDeliver: s.MaxDeliver, NakDelay: s.NakDelay, Waiting: waiting,
		Requeue: requeue, Log: log}
}
