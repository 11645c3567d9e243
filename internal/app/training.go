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

// Backends is the trainer backend of adapter.backend, with the concrete
// command or webhook backend when that one is chosen (the adapt role runs
// the command backend's process supervisor and feeds both its reports).
type Backends struct {
	Backend adapter.Backend // nil for none: jobs are recorded as PLANNED
	Command *dispatch.Command
	Webhook *dispatch.Webhook
	// CallbackURL is the base URL webhook trainers report to when
	// adapter.webhook.events is callback ("" otherwise).
	CallbackURL string
}

// TrainingBackend builds the trainer backend of adapter.backend.
func TrainingBackend(cfg config.Config, b *bus.Bus, log *slog.Logger) (Backends, error) {
	var out Backends
	var err error
	switch cfg.Adapter.Backend {
	case "nats":
		out.Backend = dispatch.NATS{Pub: b}
	case "command":
		if out.Command, err = dispatch.NewCommand(cfg.CommandConfig(), log.With("backend", "command")); err != nil {
			return out, err
		}
		out.Backend = out.Command
	case "webhook":
		if out.Webhook, err = dispatch.NewWebhook(cfg.WebhookConfig(), log.With("backend", "webhook")); err != nil {
			return out, err
		}
		if cfg.TrainingCallback() {
			out.CallbackURL = out.Webhook.Config().CallbackURL
		}
		out.Backend = out.Webhook
	case "none":
	default:
		return out, fmt.Errorf("adapter.backend: %q is not supported", cfg.Adapter.Backend)
	}
	return out, nil
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
