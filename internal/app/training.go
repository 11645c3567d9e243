package app

import (
	"cmp"
	"fmt"
	"log/slog"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/dispatch"
	"github.com/traceops/trace/adapter/serving"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/sink"
)

// TrainingBackend is the trainer backend of adapter.backend (nil for
// none: jobs are recorded as PLANNED).
func TrainingBackend(cfg config.Config, b *bus.Bus) (adapter.Backend, error) {
	switch cfg.Adapter.Backend {
	case "nats":
		return dispatch.NATS{Pub: b}, nil
	case "none":
		return nil, nil
	default:
		return nil, fmt.Errorf("adapter.backend: %q is not supported", cfg.Adapter.Backend)
	}
}

// AdapterRegistry is the adapter registry of cfg: with adapter.serving
// enabled it loads active adapters into the serving engine, else it only
// records statuses.
func AdapterRegistry(cfg config.Config, st *sink.Store, log *slog.Logger) (*adapter.Registry, error) {
	s := cfg.Adapter.Serving
	pm, err := config.PathMapOf(s.PathMap)
	if err != nil {
		return nil, err
	}
	reg := &adapter.Registry{Store: st, PathMap: pm, Log: log}
	if s.Enabled {
		reg.Engine = &serving.VLLM{BaseURL: s.BaseURL, Token: s.Token, Timeout: s.Timeout, MaxElapsed: s.RetryFor}
	}
	return reg, nil
}

// Planner is the planning agent of cfg (nil when adapter.planner is off),
// on an LLM client that shares llm's settings with the planner's model
// and records its calls through rec.
func Planner(cfg config.Config, st *sink.Store, rec llm.Recorder, log *slog.Logger) (adapter.Planner, error) {
	p := cfg.Adapter.Planner
	if !p.Enabled {
		return nil, nil
	}
	lc := cfg.LLM
	lc.Model = cmp.Or(p.Model, lc.Model)
	client, err := LLMClient(lc, rec, log)
	if err != nil {
		return nil, fmt.Errorf("adapter.planner: llm: %w", err)
	}
	temp := p.Temperature
	return adapter.NewLLMPlanner(client, adapter.LLMPlannerConfig{MaxTokens: p.MaxTokens, Temperature: &temp, Environments: st})
}
