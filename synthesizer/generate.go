package synthesizer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/template"
	"time"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/prompts"
	"github.com/traceops/trace/schemas"
)

// PurposeGenerate labels the generation agent's calls in llm_calls.
const PurposeGenerate = "generate_environment"

// ChatClient is what the generation agent needs of internal/llm's Client:
// every call goes through it (retries, rate limit, llm_calls audit).
type ChatClient interface {
	Chat(ctx context.Context, req llm.Request) (llm.Response, error)
	Model() string
}

// Defaults of GeneratorConfig.
const (
	DefaultGenerateMaxTokens = 8192
	// DefaultGenerateTimeout bounds one generation request: an answer of
	// thousands of tokens takes minutes on a self-hosted model, where
	// llm.timeout (60 s by default) is sized for a label.
	DefaultGenerateTimeout         = 10 * time.Minute
	DefaultGenerateExamples        = 3
	DefaultGenerateTranscriptChars = 3000
	DefaultSystemPromptChars       = 1500
	DefaultRepairProgramChars      = 16000
	// Tools a program may use (TRACE-METHOD.md step 2: "only the 3–5 tools
	// the capability needs").
	MinProgramTools = 3
	MaxProgramTools = 5
)

// GeneratorConfig configures the generation agent.
type GeneratorConfig struct {
	// Prompts resolves prompts/generate_environment.md. Nil: embedded.
	Prompts *prompts.Set
	// MaxTokens of an answer. Default 8192.
	MaxTokens int
	// Timeout bounds each HTTP attempt of a generation request (instead
	// of the client's own timeout). Default DefaultGenerateTimeout.
	Timeout time.Duration
	// Temperature of the generation calls; nil: the client's.
	Temperature *float64
	// MaxExamples example failed rollouts shown (default 3), each cut to
	// MaxTranscriptChars (default 3000).
	MaxExamples        int
	MaxTranscriptChars int
	// MaxSystemPromptChars of the target's system prompt shown. Default 1500.
	MaxSystemPromptChars int
	// MaxRepairProgramChars of the previous attempt's program shown to a
	// repair. Default 16000.
	MaxRepairProgramChars int
}

// Generator is the generation agent: an LLM that writes an environment
// program for a capability, repaired from the diagnoses of earlier attempts.
// It is an Author for PathLLM. Safe for concurrent use.
type Generator struct {
	client ChatClient
	cfg    GeneratorConfig
	tmpl   *template.Template
}

// NewGenerator parses the generation prompt.
func NewGenerator(client ChatClient, cfg GeneratorConfig) (*Generator, error) {
	if client == nil {
		return nil, errors.New("synthesizer: generator without an LLM client")
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&cfg.MaxTokens, DefaultGenerateMaxTokens)
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultGenerateTimeout
	}
	def(&cfg.MaxExamples, DefaultGenerateExamples)
	def(&cfg.MaxTranscriptChars, DefaultGenerateTranscriptChars)
	def(&cfg.MaxSystemPromptChars, DefaultSystemPromptChars)
	def(&cfg.MaxRepairProgramChars, DefaultRepairProgramChars)
	if cfg.Prompts == nil {
		cfg.Prompts = prompts.Default()
	}
	t, err := cfg.Prompts.Template(prompts.GenerateEnvironment)
	if err != nil {
		return nil, fmt.Errorf("synthesizer: %w", err)
	}
	return &Generator{client: client, cfg: cfg, tmpl: t}, nil
}

// GeneratePromptData is what prompts/generate_environment.md is rendered
// with. Strings from rollouts and requests are escaped so they cannot close
// a delimited block.
type GeneratePromptData struct {
	Environment, AgentVersion string
	Capability, Definition    string
	Family                    string
	MinTools, MaxTools        int
	Tools                     string // the target's tool schemas, indented JSON
	SystemPrompt              string
	Examples                  []analyzer.PromptRollout
	Attempt, MaxAttempts      int
	Previous                  []PromptAttempt
}

// PromptAttempt is an earlier attempt as a repair prompt shows it: every
// attempt's diagnosis, and the program of the last one.
type PromptAttempt struct {
	N         int
	Diagnosis string
	Program   string
}

// Prompt renders the generation prompt for attempt n of job, after the
// earlier attempts prior: one user message.
func (g *Generator) Prompt(job *Job, n, maxAttempts int, prior []Attempt) ([]llm.Message, error) {
	req := job.Request
	tools, err := json.MarshalIndent(req.Tools, "", "  ")
	if err != nil {
		return nil, err
	}
	if len(req.Tools) == 0 {
		tools = []byte("[] (the request carries no tool schemas: use the tools the trajectories below call, with the arguments they pass)")
	}
	data := GeneratePromptData{
		Environment: esc(req.Environment), AgentVersion: esc(req.AgentVersion),
		Capability: esc(req.Capability.Skill), Definition: esc(oneLine(job.Definition)), Family: esc(job.Family),
		MinTools: MinProgramTools, MaxTools: MaxProgramTools,
		Tools:        esc(string(tools)),
		SystemPrompt: esc(cut(systemPrompt(job.Examples), g.cfg.MaxSystemPromptChars)),
		Attempt:      n, MaxAttempts: maxAttempts,
	}
	if data.SystemPrompt == "" {
		data.SystemPrompt = "(not available: write a short customer-service policy in the usual style of tool-using agents)"
	}
	for i, r := range job.Examples {
		if i == g.cfg.MaxExamples {
			break
		}
		data.Examples = append(data.Examples, analyzer.PromptRolloutOf(r, g.cfg.MaxTranscriptChars))
	}
	for i, a := range prior {
		p := PromptAttempt{N: a.N, Diagnosis: esc(a.Diagnosis)}
		if i == len(prior)-1 && a.Program != "" {
			p.Program = strings.TrimRight(cut(a.Program, g.cfg.MaxRepairProgramChars), "\n")
		}
		data.Previous = append(data.Previous, p)
	}
	var b bytes.Buffer
	if err := g.tmpl.Execute(&b, data); err != nil {
		return nil, fmt.Errorf("synthesizer: rendering %s: %w", prompts.GenerateEnvironment, err)
	}
	return []llm.Message{{Role: "user", Content: b.String()}}, nil
}

// Write asks the model for attempt n's program. An answer without a program
// and a request the server refuses (a 4xx) are failed attempts (*WriteError),
// except a server that refuses trace itself (401, 403, 404: the error wraps
// ErrModelRefusesTrace); a server that stays unreachable through the
// client's retries is a transient error, returned as is, and the request is
// retried later.
func (g *Generator) Write(ctx context.Context, job *Job, n, maxAttempts int, prior []Attempt) (Draft, error) {
	msgs, err := g.Prompt(job, n, maxAttempts, prior)
	if err != nil {
		return Draft{}, err
	}
	d := Draft{Origin: schemas.OriginLLM, Family: job.Family, Model: g.client.Model()}
	resp, err := g.client.Chat(ctx, llm.Request{Purpose: PurposeGenerate, RolloutID: job.ID, Run: n, Messages: msgs,
		MaxTokens: g.cfg.MaxTokens, Temperature: g.cfg.Temperature, Timeout: g.cfg.Timeout})
	d.LLM = &LLMUsage{Calls: resp.Attempts, PromptTokens: resp.TotalPromptTokens, CompletionTokens: resp.TotalCompletionTokens, FinishReason: resp.FinishReason}
	if err != nil {
		if ctx.Err() != nil {
			return d, ctx.Err()
		}
		if RefusesTrace(err) {
			return d, fmt.Errorf("%w: %w", ErrModelRefusesTrace, err)
		}
		var le *llm.Error
		if errors.As(err, &le) && !le.Retryable {
			return d, &WriteError{Reason: "the model refused the request: " + err.Error()}
		}
		return d, fmt.Errorf("%w: %w", ErrTransient, err)
	}
	prog, err := ExtractProgram(resp.Raw)
	if err != nil {
		reason := err.Error()
		if resp.FinishReason == "length" {
			reason += fmt.Sprintf(" (the answer was cut at max_tokens = %d)", g.cfg.MaxTokens)
		}
		return d, &WriteError{Reason: reason}
	}
	d.Program = prog
	return d, nil
}

// systemPrompt is the first system message of the examples.
func systemPrompt(rs []*schemas.Rollout) string {
	for _, r := range rs {
		for _, m := range r.Messages {
			if m.Role == "system" && strings.TrimSpace(m.Content) != "" {
				return m.Content
			}
		}
	}
	return ""
}

func esc(s string) string { return strings.NewReplacer("<", "&lt;", ">", "&gt;").Replace(s) }

func oneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}

// Draft is one attempt's program as an Author wrote it.
type Draft struct {
	Program string
	// Name is the program's file name in error messages ("program.star").
	Name   string
	Origin string // schemas.OriginLLM | schemas.OriginTemplate
	Family string
	Model  string
	Knobs  json.RawMessage
	// Trusted programs (the built-in templates) run in-process; others
	// (written by a model) run sandboxed.
	Trusted bool
	// HintShare, when set, is the share [min, max] of each calibration
	// group that gets the hint (a template's knobs).
	HintShare []float64
	LLM       *LLMUsage
}

// WriteError is an attempt that produced no program: the model's answer
// held none, or a template cannot adapt to the target. Final: another
// attempt on the same path cannot help.
type WriteError struct {
	Reason string
	Final  bool
}

func (e *WriteError) Error() string { return e.Reason }

// ErrModelRefusesTrace marks a model server that refuses trace itself
// rather than one request: HTTP 401, 403 or 404 (a wrong API key, a key
// without access, a wrong model name or base URL). No attempt can succeed
// until the configuration is fixed, so the environment waits
// (WAITING_FOR_LLM, resumed at the next start) instead of spending its
// attempts, or its deliveries, on it.
var ErrModelRefusesTrace = errors.New("the model server refuses trace (check its API key, model name and base URL)")

// RefusesTrace reports whether err is a model server's refusal of trace
// itself (an *llm.Error, not retried, with HTTP status 401, 403 or 404).
func RefusesTrace(err error) bool {
	var le *llm.Error
	if !errors.As(err, &le) || le.Retryable {
		return false
	}
	switch le.Status {
	case 401, 403, 404:
		return true
	}
	return false
}

// ErrTransient marks a failure outside the program (an unreachable model,
// ClickHouse or NATS): the request is retried later, the attempt not counted.
var ErrTransient = errors.New("transient")

// Author writes the program of attempt n (1-based) of an environment, told
// the earlier attempts of the same path (their diagnoses and programs).
// A *WriteError is a failed attempt; any other error is transient.
type Author interface {
	Write(ctx context.Context, job *Job, n, maxAttempts int, prior []Attempt) (Draft, error)
}

// Job is one synthesis request with what the stage resolved for it.
type Job struct {
	ID      string // the environment id
	Request *schemas.SynthesisRequest
	// Definition is the capability's definition (the dictionary's, or the
	// request's description).
	Definition string
	// Family is the template family, "" for none; FamilySource says how it
	// was found.
	Family, FamilySource string
	// Examples are the request's example failed rollouts, read from ClickHouse.
	Examples []*schemas.Rollout
	// Started is when this run of the job began.
	Started time.Time
}
