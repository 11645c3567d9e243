// Package plan builds training jobs (TRACE step 3): one LoRA adapter per
// capability environment, trained with GRPO, base model frozen. It is pure:
// the defaults, the presets, configuration overrides per target
// environment or capability, the bounds every plan must satisfy (an error
// names the field), and the deterministic job id. Nothing here does I/O.
package plan

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/traceops/trace/schemas"
)

// Presets of the GRPO and LoRA settings.
const (
	// PresetPaper is the paper's values (TRACE-METHOD.md step 3): the
	// default.
	PresetPaper = "paper"
	// PresetRelease is the authors' release trainer: targets q,k,v,o only,
	// clip 0.28, 4 groups per iteration, advantage without the group std.
	PresetRelease = "release"
)

// AllTargets are the paper's LoRA target modules (attention and MLP).
var AllTargets = []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

// Settings are the plan's tunable values: what a preset fixes and what
// configuration or the planning agent may override.
type Settings struct {
	BaseModel          string   `koanf:"base_model" json:"base_model,omitempty"`
	LoRARank           int      `koanf:"lora_rank" json:"lora_rank,omitempty"`
	LoRAAlpha          int      `koanf:"lora_alpha" json:"lora_alpha,omitempty"`
	LoRADropout        *float64 `koanf:"lora_dropout" json:"lora_dropout,omitempty"`
	TargetModules      []string `koanf:"target_modules" json:"target_modules,omitempty"`
	GroupSize          int      `koanf:"group_size" json:"group_size,omitempty"`
	GroupsPerIteration int      `koanf:"groups_per_iteration" json:"groups_per_iteration,omitempty"`
	Iterations         int      `koanf:"iterations" json:"iterations,omitempty"`
	LearningRate       float64  `koanf:"learning_rate" json:"learning_rate,omitempty"`
	Temperature        float64  `koanf:"temperature" json:"temperature,omitempty"`
	KLCoef             *float64 `koanf:"kl_coef" json:"kl_coef,omitempty"`
	ClipEpsilon        float64  `koanf:"clip_epsilon" json:"clip_epsilon,omitempty"`
	MaxGradNorm        float64  `koanf:"max_grad_norm" json:"max_grad_norm,omitempty"`
	HintRatio          *float64 `koanf:"hint_ratio" json:"hint_ratio,omitempty"`
	Advantage          string   `koanf:"advantage" json:"advantage,omitempty"`
	EvalSeeds          int      `koanf:"eval_seeds" json:"eval_seeds,omitempty"`
	EvalRollouts       int      `koanf:"eval_rollouts" json:"eval_rollouts,omitempty"`
	SuccessThreshold   *float64 `koanf:"success_threshold" json:"success_threshold,omitempty"`
}

// Config is the planning configuration (adapter.plan in trace's config).
// Zero values take the preset's; per-environment and per-capability
// overrides apply in that order (a capability's wins).
type Config struct {
	Preset   string   `koanf:"preset"` // paper (default) | release
	Defaults Settings `koanf:"defaults"`
	// Environments overrides by target environment name (e.g. sim-airline).
	Environments map[string]Settings `koanf:"environments"`
	// Capabilities overrides by capability name.
	Capabilities map[string]Settings `koanf:"capabilities"`
	// EnvServerURL is the base URL of trace's OpenEnv-compatible
	// environment server; a job plays <url>/v1/environments/<id>. Empty in
	// trace's configuration: `trace run` fills in where its own serve role
	// serves environments (env.addr, else http.addr).
	EnvServerURL string `koanf:"env_server_url"`
	// EnvServerTokenEnv names the variable that holds the environment
	// server's bearer token on the trainer's side.
	EnvServerTokenEnv string `koanf:"env_server_token_env"`
	// OutputURI is where adapters are written: <output_uri>/<adapter name>.
	OutputURI string `koanf:"output_uri"`
	// Heartbeat and Deadline: a trainer reports at least every Heartbeat;
	// a job silent for Deadline is FAILED.
	Heartbeat time.Duration `koanf:"heartbeat"`
	Deadline  time.Duration `koanf:"deadline"`
	// CallbackURL, when set, is the base URL of the webhook backend's
	// callback endpoint: a job's report.callback_url is
	// <CallbackURL>/v1/training/jobs/<job_id>/events. Set by `trace run`
	// from adapter.webhook (events: callback), not a plan setting.
	CallbackURL string `koanf:"-"`
	// EvalFirstSeed is the first held-out seed; training seeds lie below
	// it (calibration uses seeds 0–99, so held-out seeds start above).
	EvalFirstSeed int64 `koanf:"eval_first_seed"`
}

// Defaults of the parts of Config that are not settings.
const (
	DefaultBaseModel     = "Qwen/Qwen3-30B-A3B"
	DefaultEnvServerURL  = "http://127.0.0.1:8090"
	DefaultOutputURI     = "file:///var/lib/trace/adapters"
	DefaultHeartbeat     = time.Minute
	DefaultDeadline      = 30 * time.Minute
	DefaultEvalFirstSeed = 1_000_000
)

// DefaultConfig is Config with its defaults (the paper's preset).
func DefaultConfig() Config {
	return Config{Preset: PresetPaper, EnvServerURL: DefaultEnvServerURL, OutputURI: DefaultOutputURI,
		Heartbeat: DefaultHeartbeat, Deadline: DefaultDeadline, EvalFirstSeed: DefaultEvalFirstSeed}
}

func f(v float64) *float64 { return &v }

// Preset returns a preset's full settings.
func Preset(name string) (Settings, error) {
	s := Settings{
		BaseModel: DefaultBaseModel, LoRARank: 16, LoRAAlpha: 16, LoRADropout: f(0), TargetModules: slices.Clone(AllTargets),
		GroupSize: 16, GroupsPerIteration: 32, Iterations: 20, LearningRate: 1e-5, Temperature: 1.0, KLCoef: f(0),
		ClipEpsilon: 0.2, MaxGradNorm: 1.0, HintRatio: f(0.25), Advantage: schemas.AdvantageGroupStd,
		EvalSeeds: 50, EvalRollouts: 4, SuccessThreshold: f(0.6),
	}
	switch name {
	case "", PresetPaper:
	case PresetRelease:
		s.TargetModules = []string{"q_proj", "k_proj", "v_proj", "o_proj"}
		s.ClipEpsilon = 0.28
		s.GroupsPerIteration = 4
		s.Advantage = schemas.AdvantageGroupMean
	default:
		return Settings{}, fmt.Errorf("preset: %q is not %s or %s", name, PresetPaper, PresetRelease)
	}
	return s, nil
}

// Merge returns s with every field set in o replacing s's, and the names
// of the fields o set.
func (s Settings) Merge(o Settings) (Settings, []string) {
	var set []string
	str := func(dst *string, v, name string) {
		if v != "" {
			*dst = v
			set = append(set, name)
		}
	}
	num := func(dst *int, v int, name string) {
		if v != 0 {
			*dst = v
			set = append(set, name)
		}
	}
	fl := func(dst *float64, v float64, name string) {
		if v != 0 {
			*dst = v
			set = append(set, name)
		}
	}
	ptr := func(dst **float64, v *float64, name string) {
		if v != nil {
			*dst = f(*v)
			set = append(set, name)
		}
	}
	str(&s.BaseModel, o.BaseModel, "base_model")
	num(&s.LoRARank, o.LoRARank, "lora_rank")
	num(&s.LoRAAlpha, o.LoRAAlpha, "lora_alpha")
	ptr(&s.LoRADropout, o.LoRADropout, "lora_dropout")
	if len(o.TargetModules) > 0 {
		s.TargetModules = slices.Clone(o.TargetModules)
		set = append(set, "target_modules")
	}
	num(&s.GroupSize, o.GroupSize, "group_size")
	num(&s.GroupsPerIteration, o.GroupsPerIteration, "groups_per_iteration")
	num(&s.Iterations, o.Iterations, "iterations")
	fl(&s.LearningRate, o.LearningRate, "learning_rate")
	fl(&s.Temperature, o.Temperature, "temperature")
	ptr(&s.KLCoef, o.KLCoef, "kl_coef")
	fl(&s.ClipEpsilon, o.ClipEpsilon, "clip_epsilon")
	fl(&s.MaxGradNorm, o.MaxGradNorm, "max_grad_norm")
	ptr(&s.HintRatio, o.HintRatio, "hint_ratio")
	str(&s.Advantage, o.Advantage, "advantage")
	num(&s.EvalSeeds, o.EvalSeeds, "eval_seeds")
	num(&s.EvalRollouts, o.EvalRollouts, "eval_rollouts")
	ptr(&s.SuccessThreshold, o.SuccessThreshold, "success_threshold")
	return s, set
}

// Bounds of every setting (inclusive). They are wider than the paper's
// ranges (iterations 10–40, 32–64 groups) so that the release's preset and
// small smoke runs fit; the schema enforces the same bounds.
var Bounds = struct {
	LoRARank, LoRAAlpha, GroupSize, GroupsPerIteration, Iterations, EvalSeeds, EvalRollouts               [2]int
	LoRADropout, LearningRate, Temperature, KLCoef, ClipEpsilon, MaxGradNorm, HintRatio, SuccessThreshold [2]float64
}{
	LoRARank: [2]int{1, 256}, LoRAAlpha: [2]int{1, 512}, GroupSize: [2]int{2, 64}, GroupsPerIteration: [2]int{1, 256},
	Iterations: [2]int{1, 200}, EvalSeeds: [2]int{1, 1000}, EvalRollouts: [2]int{1, 64},
	LoRADropout: [2]float64{0, 0.5}, LearningRate: [2]float64{1e-8, 1e-3}, Temperature: [2]float64{0.1, 2},
	KLCoef: [2]float64{0, 1}, ClipEpsilon: [2]float64{0.01, 0.5}, MaxGradNorm: [2]float64{1e-3, 100},
	HintRatio: [2]float64{0, 0.5}, SuccessThreshold: [2]float64{0, 1},
}

// Validate checks complete settings against Bounds; prefix names the
// settings in errors (e.g. "adapter.plan.capabilities.x."). Every
// violation is named.
func (s Settings) Validate(prefix string) error {
	var errs []error
	in := func(name string, v int, b [2]int) {
		if v < b[0] || v > b[1] {
			errs = append(errs, fmt.Errorf("%s%s: must be in [%d, %d], got %d", prefix, name, b[0], b[1], v))
		}
	}
	inf := func(name string, v float64, b [2]float64) {
		if math.IsNaN(v) || v < b[0] || v > b[1] {
			errs = append(errs, fmt.Errorf("%s%s: must be in [%g, %g], got %g", prefix, name, b[0], b[1], v))
		}
	}
	inp := func(name string, v *float64, b [2]float64) {
		if v == nil {
			errs = append(errs, fmt.Errorf("%s%s: must be set", prefix, name))
			return
		}
		inf(name, *v, b)
	}
	if strings.TrimSpace(s.BaseModel) == "" {
		errs = append(errs, fmt.Errorf("%sbase_model: must not be empty", prefix))
	}
	in("lora_rank", s.LoRARank, Bounds.LoRARank)
	in("lora_alpha", s.LoRAAlpha, Bounds.LoRAAlpha)
	inp("lora_dropout", s.LoRADropout, Bounds.LoRADropout)
	if len(s.TargetModules) == 0 {
		errs = append(errs, fmt.Errorf("%starget_modules: at least one of %s", prefix, strings.Join(AllTargets, ", ")))
	}
	seen := map[string]bool{}
	for _, m := range s.TargetModules {
		if !slices.Contains(AllTargets, m) {
			errs = append(errs, fmt.Errorf("%starget_modules: %q is not one of %s", prefix, m, strings.Join(AllTargets, ", ")))
		}
		if seen[m] {
			errs = append(errs, fmt.Errorf("%starget_modules: %q twice", prefix, m))
		}
		seen[m] = true
	}
	in("group_size", s.GroupSize, Bounds.GroupSize)
	in("groups_per_iteration", s.GroupsPerIteration, Bounds.GroupsPerIteration)
	in("iterations", s.Iterations, Bounds.Iterations)
	inf("learning_rate", s.LearningRate, Bounds.LearningRate)
	inf("temperature", s.Temperature, Bounds.Temperature)
	inp("kl_coef", s.KLCoef, Bounds.KLCoef)
	inf("clip_epsilon", s.ClipEpsilon, Bounds.ClipEpsilon)
	inf("max_grad_norm", s.MaxGradNorm, Bounds.MaxGradNorm)
	inp("hint_ratio", s.HintRatio, Bounds.HintRatio)
	if s.Advantage != schemas.AdvantageGroupStd && s.Advantage != schemas.AdvantageGroupMean {
		errs = append(errs, fmt.Errorf("%sadvantage: %q is not %s or %s", prefix, s.Advantage, schemas.AdvantageGroupStd, schemas.AdvantageGroupMean))
	}
	in("eval_seeds", s.EvalSeeds, Bounds.EvalSeeds)
	in("eval_rollouts", s.EvalRollouts, Bounds.EvalRollouts)
	inp("success_threshold", s.SuccessThreshold, Bounds.SuccessThreshold)
	return errors.Join(errs...)
}

// ErrorFields returns the setting names an error of Settings.Validate
// (with an empty prefix) or Build names, in order, without repeats: the
// text before the first colon of each of its lines, when that is a
// setting's JSON name.
func ErrorFields(err error) []string {
	if err == nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(err.Error(), "\n") {
		name, _, ok := strings.Cut(line, ":")
		if ok && slices.Contains(SettingNames, name) && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// SettingNames are the JSON names of Settings' fields.
var SettingNames = []string{"base_model", "lora_rank", "lora_alpha", "lora_dropout", "target_modules", "group_size", "groups_per_iteration",
	"iterations", "learning_rate", "temperature", "kl_coef", "clip_epsilon", "max_grad_norm", "hint_ratio", "advantage",
	"eval_seeds", "eval_rollouts", "success_threshold"}

// Validate checks the configuration: the preset, and every override
// merged over it (so an override out of bounds is named with its key).
func (c Config) Validate(prefix string) error {
	base, err := Preset(c.Preset)
	if err != nil {
		return fmt.Errorf("%s%w", prefix, err)
	}
	var errs []error
	merged, _ := base.Merge(c.Defaults)
	if err := merged.Validate(prefix + "defaults."); err != nil {
		errs = append(errs, err)
	}
	for _, kind := range []struct {
		name string
		m    map[string]Settings
	}{{"environments", c.Environments}, {"capabilities", c.Capabilities}} {
		keys := make([]string, 0, len(kind.m))
		for k := range kind.m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			s, _ := merged.Merge(kind.m[k])
			if err := s.Validate(prefix + kind.name + "." + k + "."); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for name, u := range map[string]string{"env_server_url": c.EnvServerURL, "output_uri": c.OutputURI} {
		if name == "env_server_url" && u == "" {
			continue // filled in by the caller (trace run: its serve role)
		}
		if !strings.Contains(u, "://") {
			errs = append(errs, fmt.Errorf("%s%s: %q is not a URL", prefix, name, u))
			continue
		}
		// A job's output.uri is <output_uri>/<adapter name>, the name up
		// to MaxAdapterName characters, and it is bounded as its
		// success's adapter.uri is: a longer root failed every job.
		if n := len(strings.TrimRight(u, "/")) + 1 + MaxAdapterName; name == "output_uri" && n > schemas.MaxAdapterURI {
			errs = append(errs, fmt.Errorf("%s%s: %d characters; at most %d, so that with an adapter's name (up to %d) a job's output.uri fits in %d",
				prefix, name, len(u), schemas.MaxAdapterURI-1-MaxAdapterName, MaxAdapterName, schemas.MaxAdapterURI))
		}
		// file://var/lib/… (two slashes) names the host "var": trainers
		// wrote to /lib/…, and the engine was told to load from there.
		if pu, err := url.Parse(u); name == "output_uri" && err == nil && pu.Scheme == "file" && pu.Host != "" && pu.Host != "localhost" {
			errs = append(errs, fmt.Errorf("%s%s: %q names the host %q; a local path is file:///path (three slashes)", prefix, name, u, pu.Host))
		}
		// Trainers reach the environment server over OpenEnv (HTTP or
		// WebSocket): the job's schema takes nothing else, so another
		// scheme would fail every job's planning, not the start.
		if pu, err := url.Parse(u); name == "env_server_url" && (err != nil || !slices.Contains([]string{"http", "https", "ws", "wss"}, pu.Scheme) || pu.Host == "") {
			errs = append(errs, fmt.Errorf("%s%s: %q is not an http, https, ws or wss URL with a host", prefix, name, u))
		}
	}
	// Training seeds are [0, eval_first_seed), held-out ones from it on, and
	// the environment server's seeds 0 to 2⁶³−1: below 1 no job could be
	// planned (no training seed), and past the bound held-out seeds wrap.
	if last := int64(math.MaxInt64 - Bounds.EvalSeeds[1] + 1); c.EvalFirstSeed < 1 || c.EvalFirstSeed > last {
		errs = append(errs, fmt.Errorf("%seval_first_seed: must be in [1, %d] (training seeds lie below it, up to %d held-out seeds from it on), got %d",
			prefix, last, Bounds.EvalSeeds[1], c.EvalFirstSeed))
	}
	if c.Heartbeat <= 0 {
		errs = append(errs, fmt.Errorf("%sheartbeat: must be positive, got %s", prefix, c.Heartbeat))
	}
	if c.Deadline < c.Heartbeat {
		errs = append(errs, fmt.Errorf("%sdeadline: must be at least heartbeat (%s), got %s", prefix, c.Heartbeat, c.Deadline))
	}
	return errors.Join(errs...)
}

// Resolve returns the settings of an environment's job: the preset, then
// the defaults, the target environment's and the capability's overrides,
// with the names of the overridden fields (sorted, unique).
func (c Config) Resolve(environment, capability string) (Settings, []string, error) {
	s, err := Preset(c.Preset)
	if err != nil {
		return Settings{}, nil, err
	}
	var all []string
	for _, o := range []Settings{c.Defaults, c.Environments[environment], c.Capabilities[capability]} {
		var set []string
		s, set = s.Merge(o)
		all = append(all, set...)
	}
	slices.Sort(all)
	return s, slices.Compact(all), nil
}

// Input is what a plan is built from.
type Input struct {
	Ready    *schemas.EnvironmentReady
	Revision int // plan revision, >= 1 (0 means 1)
	// Adjust are the planning agent's (or the CLI's) changes over the
	// configured settings, applied last; Source and Reason record them.
	Adjust    *Settings
	Source    string // schemas.PlanAgent or PlanCLI when Adjust is set
	Model     string // the planning agent's model
	Reason    string
	Simulated bool // the demo's simulated trainer will run it
	Now       time.Time
}

// MaxAdapterName bounds an adapter's served name, as training_job/v1's
// output.adapter_name and training_event/v1's adapter.name do.
const MaxAdapterName = 128

// AdapterName is the served name of an environment's adapter: the
// capability and the environment id's hash part, revision-suffixed after
// the first, lowercase (vLLM's model field).
func AdapterName(capability, environmentID string, revision int) string {
	name := strings.ReplaceAll(capability, "_", "-") + "-" + strings.TrimPrefix(environmentID, "env-")[:8]
	if revision > 1 {
		name += fmt.Sprintf("-r%d", revision)
	}
	if len(name) > MaxAdapterName {
		name = name[:MaxAdapterName]
	}
	return name
}

// Build makes the training job of a ready environment. The result is
// validated against the training_job schema and the bounds; an error names
// the field.
func (c Config) Build(in Input) (*schemas.TrainingJob, error) {
	r := in.Ready
	if r == nil {
		return nil, errors.New("plan: no ready environment")
	}
	if c.EnvServerURL == "" {
		return nil, errors.New("plan: adapter.plan.env_server_url is not set")
	}
	rev := max(in.Revision, 1)
	s, overrides, err := c.Resolve(r.Environment, r.Capability.Name)
	if err != nil {
		return nil, err
	}
	source := schemas.PlanDefaults
	if len(overrides) > 0 {
		source = schemas.PlanConfig
	}
	if in.Adjust != nil {
		var set []string
		s, set = s.Merge(*in.Adjust)
		if len(set) > 0 {
			source = cmp.Or(in.Source, schemas.PlanAgent)
			overrides = append(overrides, set...)
			slices.Sort(overrides)
			overrides = slices.Compact(overrides)
		}
	}
	if err := s.Validate(""); err != nil {
		return nil, err
	}
	id := schemas.TrainingJobID(r.EnvironmentID, rev)
	name := AdapterName(r.Capability.Name, r.EnvironmentID, rev)
	seeds := make([]int64, s.EvalSeeds)
	for i := range seeds {
		seeds[i] = c.EvalFirstSeed + int64(i)
	}
	now := in.Now
	if now.IsZero() {
		now = time.Now()
	}
	ptrs := make([]string, len(overrides))
	for i, o := range overrides {
		ptrs[i] = "/" + o
	}
	j := &schemas.TrainingJob{
		Schema: schemas.TrainingJobSchema, JobID: id, PlanRevision: rev,
		EnvironmentID: r.EnvironmentID, Environment: r.Environment, AgentVersion: r.AgentVersion,
		Capability:  schemas.JobCapability{Name: r.Capability.Name, Definition: r.Capability.Definition},
		ProgramHash: r.Program.Hash,
		EnvServer:   schemas.JobEnvServer{BaseURL: strings.TrimRight(c.EnvServerURL, "/") + "/v1/environments/" + r.EnvironmentID, TokenEnv: c.EnvServerTokenEnv},
		BaseModel:   s.BaseModel,
		LoRA:        schemas.LoRASettings{Rank: s.LoRARank, Alpha: s.LoRAAlpha, Dropout: *s.LoRADropout, TargetModules: slices.Clone(s.TargetModules)},
		GRPO: schemas.GRPOSettings{GroupSize: s.GroupSize, GroupsPerIteration: s.GroupsPerIteration, Iterations: s.Iterations,
			LearningRate: s.LearningRate, Temperature: s.Temperature, KLCoef: *s.KLCoef, ClipEpsilon: s.ClipEpsilon,
			MaxGradNorm: s.MaxGradNorm, HintRatio: *s.HintRatio, StripHints: true, DropConstantGroups: true, Advantage: s.Advantage},
		Eval:       schemas.EvalPlan{Seeds: seeds, RolloutsPerSeed: s.EvalRollouts, SuccessThreshold: *s.SuccessThreshold},
		TrainSeeds: &schemas.SeedRange{First: 0, Count: c.EvalFirstSeed},
		Output:     schemas.JobOutput{AdapterName: name, URI: strings.TrimRight(c.OutputURI, "/") + "/" + name},
		Report: schemas.JobReport{EventsSubject: schemas.TrainingEventsSubject(id),
			HeartbeatSeconds: int(max(c.Heartbeat, time.Second) / time.Second), DeadlineSeconds: int(max(c.Deadline, time.Second) / time.Second)},
		Planner:   schemas.PlannerRecord{Source: source, Preset: cmp.Or(c.Preset, PresetPaper), Overrides: ptrs, Model: in.Model, Reason: in.Reason},
		Simulated: in.Simulated,
		CreatedAt: now.UTC().Truncate(time.Second),
	}
	if c.CallbackURL != "" {
		j.Report.CallbackURL = strings.TrimRight(c.CallbackURL, "/") + "/v1/training/jobs/" + id + "/events"
	}
	if _, err := j.Encode(); err != nil {
		return nil, err
	}
	return j, nil
}
