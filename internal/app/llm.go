package app

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// LLMClient builds the OpenAI-compatible client from the configuration.
func LLMClient(c config.LLM, rec llm.Recorder, log *slog.Logger) (*llm.Client, error) {
	extra, err := c.Body()
	if err != nil {
		return nil, err
	}
	return llm.New(llm.Config{
		BaseURL: llm.NormalizeBaseURL(c.BaseURL), Model: c.Model, APIKey: llm.Secret(c.APIKey), Timeout: c.Timeout,
		Concurrency: c.Concurrency, RatePerSecond: c.RatePerSecond,
		StructuredOutput: llm.StructuredOutput(c.Structured), ExtraBody: extra, Recorder: rec, Logger: log,
	})
}

// llmBatchRows caps the analyze stage's batches under the llm labeler: 16
// rounds of analyzer.concurrency rollouts. A rollout takes the LLM seconds
// (llm.runs calls), so a batch of the stream's 10,000 would hold its
// offsets, and the consumer lag, still for hours, keep that many rollouts
// decoded in memory meanwhile, and be read again whole after a restart or
// a rebalance. Not fewer: the next batch waits for the slowest rollout of
// this one (a run in its retries), with the LLM's slots idle meanwhile.
func llmBatchRows(concurrency int) int {
	if concurrency <= 0 {
		concurrency = 8 // LabelingSink's default
	}
	return 16 * concurrency
}

// llmClient is the process's one LLM client (shared concurrency bound, rate
// limit and audit writer), created on first use.
func (a *App) llmClient() (*llm.Client, error) {
	if a.llm != nil {
		return a.llm, nil
	}
	c, err := LLMClient(a.Cfg.LLM, a.auditRecorder(), a.Log)
	if err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	a.llm = c
	return c, nil
}

// auditRecorder is the process's one llm_calls writer (every LLM client's
// Recorder), created on first use.
func (a *App) auditRecorder() *AuditRecorder {
	if a.audit == nil {
		a.audit = NewAuditRecorder(a.Store, a.Log)
		if a.Registry != nil {
			a.audit.RegisterMetrics(a.Registry)
		}
		a.background = append(a.background, Actor{Name: "llm-audit", Run: a.audit.Run})
	}
	return a.audit
}

// discoveryRunner returns the discovery agent's runner, or nil when no LLM
// endpoint is configured or the labeler is not the llm labeler: a
// discovered dictionary has no detectors, and taking over from the default
// (rules) dictionary it would leave the cohort without labels.
func (a *App) discoveryRunner() (*analyzer.DiscoveryRunner, error) {
	if a.Cfg.LLM.BaseURL == "" || a.Cfg.Analyzer.Labeler != "llm" {
		return nil, nil
	}
	client, err := a.llmClient()
	if err != nil {
		return nil, err
	}
	disc, err := analyzer.NewDiscoverer(client, analyzer.DiscoverConfig{})
	if err != nil {
		return nil, err
	}
	an := a.Cfg.Analyzer
	return &analyzer.DiscoveryRunner{Discoverer: disc, Store: a.Store, Registry: a.Dicts, Log: a.Log,
		Threshold: an.UnexplainedThreshold, MinFailures: an.MinFailures, Window: an.Window, Cooldown: an.DiscoveryCooldown,
		Sample: an.DiscoverySample,
		Apply: func(ctx context.Context, d *analyzer.Dictionary) error {
			_, err := a.Dicts.Apply(ctx, a.Store, announcer(a.Bus), d)
			return err
		}}, nil
}

func newLLMLabeler(a *App) (analyzer.Labeler, error) {
	client, err := a.llmClient()
	if err != nil {
		return nil, err
	}
	st := a.Store
	return analyzer.NewLLMLabeler(client, analyzer.LLMLabelerConfig{
		Runs:               a.Cfg.LLM.Runs,
		MaxTranscriptChars: a.Cfg.LLM.MaxTranscriptChars,
		SampleRate:         analyzer.SampleRate{Failed: a.Cfg.Analyzer.SampleFailed, Passed: a.Cfg.Analyzer.SamplePassed},
		AlreadyLabeled: func(ctx context.Context, r *schemas.Rollout, v uint32) (map[int]bool, error) {
			return st.StoredRuns(ctx, r.Environment, r.Agent.Version, r.RolloutID, v)
		},
	})
}

// AuditRecorder buffers LLM audit rows and writes them to ClickHouse
// llm_calls in batches (sink.Batcher: every second, or at 1,000 rows).
// RecordLLMCall never blocks; when ClickHouse is down the buffer keeps up
// to 100,000 rows and then drops the oldest, counting them in the log (the
// audit must never stall labeling). With RegisterMetrics, every row is
// also counted in trace_llm_requests_total and trace_llm_tokens_total.
type AuditRecorder struct {
	b        sink.Batcher[sink.LLMCall]
	requests *prometheus.CounterVec // nil until RegisterMetrics
	tokens   *prometheus.CounterVec
}

// RegisterMetrics counts every recorded HTTP attempt by purpose, model and
// outcome, and its tokens by purpose, model and kind (prompt, completion),
// in reg: what llm_calls holds, on /metrics, so that a storm of 429s or
// time-outs, a wrong key and the token spend show without a query (and
// while ClickHouse, where llm_calls lives, is away). Call it before the
// recorder is in use.
func (r *AuditRecorder) RegisterMetrics(reg prometheus.Registerer) {
	r.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "trace", Subsystem: "llm", Name: "requests_total",
		Help: "HTTP attempts to LLM endpoints, by purpose, model and outcome (ok, http_429, http_5xx, http_4xx, timeout, network, invalid_json, schema, canceled)."},
		[]string{"purpose", "model", "outcome"})
	r.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "trace", Subsystem: "llm", Name: "tokens_total",
		Help: "Tokens of LLM attempts as the endpoint reported them (usage), by purpose, model and kind (prompt, completion); failed attempts' included."},
		[]string{"purpose", "model", "kind"})
	reg.MustRegister(r.requests, r.tokens)
}

// NewAuditRecorder returns a recorder; Run writes its rows.
func NewAuditRecorder(st *sink.Store, log *slog.Logger) *AuditRecorder {
	return &AuditRecorder{b: sink.Batcher[sink.LLMCall]{Insert: st.InsertLLMCalls, Name: "llm audit", Log: log}}
}

// RecordLLMCall implements llm.Recorder.
func (r *AuditRecorder) RecordLLMCall(_ context.Context, rec llm.AuditRecord) {
	r.b.Add(sink.LLMCall(rec))
	if r.requests != nil {
		r.requests.WithLabelValues(rec.Purpose, rec.Model, rec.Outcome).Inc()
		if rec.PromptTokens > 0 {
			r.tokens.WithLabelValues(rec.Purpose, rec.Model, "prompt").Add(float64(rec.PromptTokens))
		}
		if rec.CompletionTokens > 0 {
			r.tokens.WithLabelValues(rec.Purpose, rec.Model, "completion").Add(float64(rec.CompletionTokens))
		}
	}
}

// Run flushes until ctx ends, then flushes once more.
func (r *AuditRecorder) Run(ctx context.Context) error { return r.b.Run(ctx) }
