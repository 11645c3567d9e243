package app

import (
	"context"
	"fmt"

	"github.com/oklog/run"

	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/synthesizer"
	"github.com/traceops/trace/synthesizer/calibrate"
)

// SimulatedPolicies makes the simulated policy of a cohort for a
// capability (synthesizer.Deps.Simulated). Only trace demo sets it (with
// the simulated fleet of internal/dev/simulate), together with
// synthesizer.policy: simulated.
type SimulatedPolicies func(environment, agentVersion, capability string) (calibrate.Policy, error)

// addSynthesize adds the synthesize role: the synthesizer's worker on the
// durable consumer of TRACE_SYNTHESIS, which every replica shares; the
// environments waiting for a model are requeued there at start, so that
// one replica resumes each. The generation model is llm.* when
// configured; calibration's policy is the cohort's agent model
// (synthesizer.policies), else the labeling model, or the simulated policy.
func (a *App) addSynthesize(ctx context.Context, g *run.Group) error {
	s := a.Cfg.Synthesizer
	store := synthesizer.SinkStore{Rows: a.Store, Log: a.Log.With("role", "synthesize")}
	// The audit writer is made now, while Run can still start it: a policy
	// model's client is made at the first calibration, and an audit writer
	// made then would never run (its rows never reach llm_calls).
	rec := a.auditRecorder()
	deps := synthesizer.Deps{
		Store: store, Examples: store, Dicts: synthesizer.RegistryDictionaries{Registry: a.Dicts}, Publisher: a.Bus, Log: a.Log,
		Limits:        a.Cfg.Programs, // the serve role's too: calibrated as served
		DefaultPolicy: synthesizer.PolicySettings{BaseURL: a.Cfg.LLM.BaseURL, Model: a.Cfg.LLM.Model, APIKey: a.Cfg.LLM.APIKey},
		PolicyClient: func(p synthesizer.PolicySettings) (*llm.Client, error) {
			if p.BaseURL == a.Cfg.LLM.BaseURL && p.Model == a.Cfg.LLM.Model && p.APIKey == a.Cfg.LLM.APIKey {
				return a.llmClient() // the labeling model: one client, one concurrency bound
			}
			c := a.Cfg.LLM
			c.BaseURL, c.Model, c.APIKey = p.BaseURL, p.Model, p.APIKey
			return LLMClient(c, rec, a.Log)
		},
	}
	if a.Simulated != nil {
		deps.Simulated = a.Simulated
	}
	if a.Cfg.LLM.BaseURL != "" {
		client, err := a.llmClient()
		if err != nil {
			return err
		}
		deps.Generator = client
	}
	stage, err := synthesizer.Build(s, deps)
	if err != nil {
		return err
	}
	consumer, err := a.Bus.SynthesisConsumer(ctx, s.AckWait)
	if err != nil {
		return err
	}
	w := synthesizer.NewWorker(stage, consumer, s.WorkerConfig(store, a.Bus, a.Log))
	a.Log.Info("synthesizer: consuming synthesis requests", "generation_model", generationModel(a.Cfg.LLM), "templates", s.Templates,
		"policy", s.Policy, "max_attempts", s.MaxAttempts)
	addActor(g, ctx, "synthesize", w.Run)
	return nil
}

func generationModel(c config.LLM) string {
	if c.BaseURL == "" {
		return "none"
	}
	return fmt.Sprintf("%s at %s", c.Model, c.BaseURL)
}
