package adapter

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/template"
	"unicode"

	"github.com/traceops/trace/adapter/plan"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/prompts"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// PurposePlan labels the planning agent's calls in llm_calls.
const PurposePlan = "plan_training"

// ChatClient is what the planning agent needs of internal/llm's Client:
// every call goes through it (retries, rate limit, llm_calls audit).
type ChatClient interface {
	Chat(ctx context.Context, req llm.Request) (llm.Response, error)
	Model() string
}

// CalibrationSource finds an environment's stored record (sink.Store), for
// the calibration's reward histogram, which the ready event does not carry.
type CalibrationSource interface {
	Environment(ctx context.Context, id string) (*sink.EnvironmentRow, error)
}

// Defaults of LLMPlannerConfig.
const DefaultPlannerMaxTokens = 512

// LLMPlannerConfig configures the planning agent.
type LLMPlannerConfig struct {
	// Prompts resolves prompts/plan_training.md. Nil: embedded.
	Prompts *prompts.Set
	// MaxTokens of an answer. Default 512.
	MaxTokens int
	// Temperature of the calls; nil: 0 (the plan should not be a lottery).
	Temperature *float64
	// Environments, when set, provides the calibration's reward histogram;
	// without it the prompt says it is not available.
	Environments CalibrationSource
}

// LLMPlanner is the planning agent (TRACE step 3 "driven by an LLM
// agent"): it shows a model the environment (capability, family,
// calibration, tools) and the plan configuration made, and takes back a
// JSON answer {"reason", "adjust"}. An answer that breaks the schema (not
// JSON, an unknown setting, a wrong type, the base model) is retried by
// the client and then returned as an error: the agent failed. A valid
// answer whose settings are out of plan.Bounds is a *RejectedError naming
// them. It implements Planner and is safe for concurrent use.
type LLMPlanner struct {
	client ChatClient
	cfg    LLMPlannerConfig
	tmpl   *template.Template
}

// NewLLMPlanner parses the planning prompt.
func NewLLMPlanner(client ChatClient, cfg LLMPlannerConfig) (*LLMPlanner, error) {
	if client == nil {
		return nil, errors.New("adapter: planning agent without an LLM client")
	}
	cfg.MaxTokens = cmp.Or(cfg.MaxTokens, DefaultPlannerMaxTokens)
	if cfg.Temperature == nil {
		zero := 0.0
		cfg.Temperature = &zero
	}
	if cfg.Prompts == nil {
		cfg.Prompts = prompts.Default()
	}
	t, err := cfg.Prompts.Template(prompts.PlanTraining)
	if err != nil {
		return nil, fmt.Errorf("adapter: %w", err)
	}
	return &LLMPlanner{client: client, cfg: cfg, tmpl: t}, nil
}

// PlanPromptData is what prompts/plan_training.md is rendered with.
// Strings from the environment are escaped so they cannot open or close a
// delimited block.
type PlanPromptData struct {
	Environment, AgentVersion string
	Capability, Definition    string
	Family                    string
	Tools                     string
	Calibration               schemas.ReadyCalib
	PassAtK                   string
	Histogram                 string
	DefaultPlan               string // the tunable settings of the plan, indented JSON
	Bounds                    []string
}

// Prompt renders the planning prompt for job: one user message.
func (p *LLMPlanner) Prompt(ctx context.Context, r *schemas.EnvironmentReady, job *schemas.TrainingJob) ([]llm.Message, error) {
	cur := SettingsOf(job)
	cur.BaseModel = ""
	def, err := json.MarshalIndent(cur, "", "  ")
	if err != nil {
		return nil, err
	}
	d := PlanPromptData{
		Environment: esc(r.Environment), AgentVersion: esc(r.AgentVersion),
		Capability: esc(r.Capability.Name), Definition: esc(oneLine(r.Capability.Definition)), Family: esc(r.Capability.Family),
		Tools: esc(strings.Join(r.Program.Tools, ", ")), Calibration: r.Calibration,
		PassAtK: passAtK(r.Calibration.PassAtK), Histogram: "(not available)",
		DefaultPlan: string(def), Bounds: BoundsText(),
	}
	d.Calibration.Policy = esc(d.Calibration.Policy)
	if d.Tools == "" {
		d.Tools = "(not listed)"
	}
	if h := p.histogram(ctx, r.EnvironmentID); len(h) > 0 {
		parts := make([]string, len(h))
		for i, n := range h {
			parts[i] = fmt.Sprintf("%d", n)
		}
		d.Histogram = "[" + strings.Join(parts, ", ") + "]"
	}
	var b bytes.Buffer
	if err := p.tmpl.Execute(&b, d); err != nil {
		return nil, fmt.Errorf("adapter: rendering %s: %w", prompts.PlanTraining, err)
	}
	return []llm.Message{{Role: "user", Content: b.String()}}, nil
}

// histogram is the stored calibration's reward histogram, nil when it
// cannot be read (the prompt then says so; planning goes on).
func (p *LLMPlanner) histogram(ctx context.Context, envID string) []int {
	if p.cfg.Environments == nil {
		return nil
	}
	row, err := p.cfg.Environments.Environment(ctx, envID)
	if err != nil || row == nil || row.Calibration == "" {
		return nil
	}
	var c struct {
		Histogram []int `json:"histogram"`
	}
	if json.Unmarshal([]byte(row.Calibration), &c) != nil {
		return nil
	}
	return c.Histogram
}

// Adjust asks the model. It returns the adjustment (nil for none), the
// agent's reason and the model; see LLMPlanner for the errors.
func (p *LLMPlanner) Adjust(ctx context.Context, r *schemas.EnvironmentReady, job *schemas.TrainingJob) (*plan.Settings, string, string, error) {
	model := p.client.Model()
	msgs, err := p.Prompt(ctx, r, job)
	if err != nil {
		return nil, "", model, err
	}
	resp, err := p.client.Chat(ctx, llm.Request{Purpose: PurposePlan, RolloutID: job.JobID, Messages: msgs,
		Schema: PlanAnswerSchema, SchemaName: "trace_training_plan", MaxTokens: p.cfg.MaxTokens, Temperature: p.cfg.Temperature,
		Validate: func(content string) error { _, err := ParsePlanAnswer(content); return err }})
	if err != nil {
		return nil, "", model, err
	}
	a, err := ParsePlanAnswer(resp.Content)
	if err != nil { // a client that does not run Validate
		return nil, "", model, err
	}
	adj, err := a.Check(SettingsOf(job))
	return adj, a.Reason, model, err
}

// PlanAnswerSchema is the JSON Schema of the planning agent's answer. It
// fixes the shape and the types; the bounds are checked after (an answer
// out of bounds is a valid answer, rejected, not retried). It has no
// length bounds: llama-cpp-python turns a maxLength into one nested
// grammar rule per character, and one of 2000 crashed its server.
var PlanAnswerSchema = json.RawMessage(`{
  "type": "object",
  "additionalProperties": false,
  "required": ["reason", "adjust"],
  "properties": {
    "reason": {"type": "string"},
    "adjust": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "lora_rank": {"type": "integer"},
        "lora_alpha": {"type": "integer"},
        "lora_dropout": {"type": "number"},
        "target_modules": {"type": "array", "items": {"type": "string"}},
        "group_size": {"type": "integer"},
        "groups_per_iteration": {"type": "integer"},
        "iterations": {"type": "integer"},
        "learning_rate": {"type": "number"},
        "temperature": {"type": "number"},
        "kl_coef": {"type": "number"},
        "clip_epsilon": {"type": "number"},
        "max_grad_norm": {"type": "number"},
        "hint_ratio": {"type": "number"},
        "advantage": {"type": "string"},
        "eval_seeds": {"type": "integer"},
        "eval_rollouts": {"type": "integer"},
        "success_threshold": {"type": "number"}
      }
    }
  }
}`)

// MaxReasonChars bounds an answer's reason (checked here, not in the
// schema: see PlanAnswerSchema).
const MaxReasonChars = 2000

// PlanAnswer is a decoded answer: every setting the agent set is non-nil.
type PlanAnswer struct {
	Reason string     `json:"reason"`
	Adjust PlanAdjust `json:"adjust"`
}

// PlanAdjust are the settings an agent may change (not the base model).
type PlanAdjust struct {
	LoRARank           *int     `json:"lora_rank"`
	LoRAAlpha          *int     `json:"lora_alpha"`
	LoRADropout        *float64 `json:"lora_dropout"`
	TargetModules      []string `json:"target_modules"`
	GroupSize          *int     `json:"group_size"`
	GroupsPerIteration *int     `json:"groups_per_iteration"`
	Iterations         *int     `json:"iterations"`
	LearningRate       *float64 `json:"learning_rate"`
	Temperature        *float64 `json:"temperature"`
	KLCoef             *float64 `json:"kl_coef"`
	ClipEpsilon        *float64 `json:"clip_epsilon"`
	MaxGradNorm        *float64 `json:"max_grad_norm"`
	HintRatio          *float64 `json:"hint_ratio"`
	Advantage          *string  `json:"advantage"`
	EvalSeeds          *int     `json:"eval_seeds"`
	EvalRollouts       *int     `json:"eval_rollouts"`
	SuccessThreshold   *float64 `json:"success_threshold"`
}

// ParsePlanAnswer decodes an answer strictly: one JSON object with a
// non-empty reason and an adjust object of known settings with the right
// types. Nothing is repaired. Errors wrap llm.ErrInvalidJSON or
// llm.ErrSchema.
func ParsePlanAnswer(content string) (*PlanAnswer, error) {
	if !json.Valid([]byte(content)) {
		return nil, fmt.Errorf("%w: the answer is not one JSON value", llm.ErrInvalidJSON)
	}
	if err := llm.CheckDuplicateKeys([]byte(content)); err != nil {
		return nil, fmt.Errorf("%w: %v", llm.ErrSchema, err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(content), &top); err != nil {
		return nil, fmt.Errorf("%w: the answer is not a JSON object", llm.ErrSchema)
	}
	if _, ok := top["adjust"]; !ok {
		return nil, fmt.Errorf("%w: the answer has no \"adjust\" object", llm.ErrSchema)
	}
	dec := json.NewDecoder(strings.NewReader(content))
	dec.DisallowUnknownFields()
	var a PlanAnswer
	if err := dec.Decode(&a); err != nil {
		return nil, fmt.Errorf("%w: %v (the settings an agent may set: %s)", llm.ErrSchema, err, strings.Join(AgentSettings(), ", "))
	}
	if !strings.ContainsFunc(a.Reason, unicode.IsLetter) {
		return nil, fmt.Errorf("%w: \"reason\" %q says nothing (the answer format's placeholder is not a reason)", llm.ErrSchema, a.Reason)
	}
	if n := len([]rune(a.Reason)); n > MaxReasonChars {
		return nil, fmt.Errorf("%w: \"reason\" has %d characters, more than %d", llm.ErrSchema, n, MaxReasonChars)
	}
	return &a, nil
}

// AgentSettings are the settings the agent may set: every setting but the
// base model.
func AgentSettings() []string {
	return slices.DeleteFunc(slices.Clone(plan.SettingNames), func(s string) bool { return s == "base_model" })
}

// Check applies the answer to cur (the plan's settings) and validates the
// result against the bounds. It returns nil when the answer sets nothing,
// the adjustment when it is in bounds, and a *RejectedError naming the
// fields when not. A setting given as 0 counts (plan.Settings treats 0 as
// unset, so it is checked here rather than dropped).
func (a *PlanAnswer) Check(cur plan.Settings) (*plan.Settings, error) {
	j := a.Adjust
	var adj plan.Settings
	set := 0
	i := func(dst, cdst *int, v *int) {
		if v != nil {
			*dst, *cdst = *v, *v
			set++
		}
	}
	f := func(dst, cdst *float64, v *float64) {
		if v != nil {
			*dst, *cdst = *v, *v
			set++
		}
	}
	pf := func(dst, cdst **float64, v *float64) {
		if v != nil {
			x, y := *v, *v
			*dst, *cdst = &x, &y
			set++
		}
	}
	i(&adj.LoRARank, &cur.LoRARank, j.LoRARank)
	i(&adj.LoRAAlpha, &cur.LoRAAlpha, j.LoRAAlpha)
	pf(&adj.LoRADropout, &cur.LoRADropout, j.LoRADropout)
	if j.TargetModules != nil {
		adj.TargetModules, cur.TargetModules = slices.Clone(j.TargetModules), slices.Clone(j.TargetModules)
		set++
	}
	i(&adj.GroupSize, &cur.GroupSize, j.GroupSize)
	i(&adj.GroupsPerIteration, &cur.GroupsPerIteration, j.GroupsPerIteration)
	i(&adj.Iterations, &cur.Iterations, j.Iterations)
	f(&adj.LearningRate, &cur.LearningRate, j.LearningRate)
	f(&adj.Temperature, &cur.Temperature, j.Temperature)
	pf(&adj.KLCoef, &cur.KLCoef, j.KLCoef)
	f(&adj.ClipEpsilon, &cur.ClipEpsilon, j.ClipEpsilon)
	f(&adj.MaxGradNorm, &cur.MaxGradNorm, j.MaxGradNorm)
	pf(&adj.HintRatio, &cur.HintRatio, j.HintRatio)
	if j.Advantage != nil {
		adj.Advantage, cur.Advantage = *j.Advantage, *j.Advantage
		set++
	}
	i(&adj.EvalSeeds, &cur.EvalSeeds, j.EvalSeeds)
	i(&adj.EvalRollouts, &cur.EvalRollouts, j.EvalRollouts)
	pf(&adj.SuccessThreshold, &cur.SuccessThreshold, j.SuccessThreshold)
	if err := cur.Validate(""); err != nil {
		return nil, &RejectedError{Fields: plan.ErrorFields(err), Err: err}
	}
	if set == 0 {
		return nil, nil
	}
	return &adj, nil
}

// SettingsOf returns a job's plan as settings (the inverse of plan.Build's
// mapping).
func SettingsOf(j *schemas.TrainingJob) plan.Settings {
	f := func(v float64) *float64 { return &v }
	return plan.Settings{
		BaseModel: j.BaseModel, LoRARank: j.LoRA.Rank, LoRAAlpha: j.LoRA.Alpha, LoRADropout: f(j.LoRA.Dropout),
		TargetModules: slices.Clone(j.LoRA.TargetModules), GroupSize: j.GRPO.GroupSize, GroupsPerIteration: j.GRPO.GroupsPerIteration,
		Iterations: j.GRPO.Iterations, LearningRate: j.GRPO.LearningRate, Temperature: j.GRPO.Temperature, KLCoef: f(j.GRPO.KLCoef),
		ClipEpsilon: j.GRPO.ClipEpsilon, MaxGradNorm: j.GRPO.MaxGradNorm, HintRatio: f(j.GRPO.HintRatio), Advantage: j.GRPO.Advantage,
		EvalSeeds: len(j.Eval.Seeds), EvalRollouts: j.Eval.RolloutsPerSeed, SuccessThreshold: f(j.Eval.SuccessThreshold),
	}
}

// BoundsText lists the bounds of the settings an agent may set, one line
// each (the prompt shows them).
func BoundsText() []string {
	b := plan.Bounds
	ints := []struct {
		n string
		v [2]int
	}{{"lora_rank", b.LoRARank}, {"lora_alpha", b.LoRAAlpha}, {"group_size", b.GroupSize}, {"groups_per_iteration", b.GroupsPerIteration},
		{"iterations", b.Iterations}, {"eval_seeds", b.EvalSeeds}, {"eval_rollouts", b.EvalRollouts}}
	floats := []struct {
		n string
		v [2]float64
	}{{"lora_dropout", b.LoRADropout}, {"learning_rate", b.LearningRate}, {"temperature", b.Temperature}, {"kl_coef", b.KLCoef},
		{"clip_epsilon", b.ClipEpsilon}, {"max_grad_norm", b.MaxGradNorm}, {"hint_ratio", b.HintRatio}, {"success_threshold", b.SuccessThreshold}}
	var out []string
	for _, x := range ints {
		out = append(out, fmt.Sprintf("%s: integer in [%d, %d]", x.n, x.v[0], x.v[1]))
	}
	for _, x := range floats {
		out = append(out, fmt.Sprintf("%s: number in [%g, %g]", x.n, x.v[0], x.v[1]))
	}
	out = append(out, "target_modules: a non-empty subset of "+strings.Join(plan.AllTargets, ", "),
		fmt.Sprintf("advantage: %s or %s", schemas.AdvantageGroupStd, schemas.AdvantageGroupMean))
	return out
}

func passAtK(m map[string]float64) string {
	if len(m) == 0 {
		return "(not available)"
	}
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b string) int { return cmp.Or(cmp.Compare(len(a), len(b)), cmp.Compare(a, b)) })
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = fmt.Sprintf("pass@%s=%.3g", esc(k), m[k])
	}
	return strings.Join(parts, ", ")
}

func esc(s string) string { return strings.NewReplacer("<", "&lt;", ">", "&gt;").Replace(s) }

func oneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}
