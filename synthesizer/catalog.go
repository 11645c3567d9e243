package synthesizer

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/envserver"
)

// CatalogStore is what Catalog reads: the registry of environments
// (SinkStore over ClickHouse `environments`).
type CatalogStore interface {
	List(ctx context.Context, f sink.EnvironmentFilter) ([]*Environment, error)
	LoadEnvironment(ctx context.Context, id string) (*Environment, error)
}

// Catalog serves the registry's DONE environments to the environment server
// (envserver.Catalog), so that trainers find every environment the
// synthesize role accepted at GET /v1/environments. Programs come out of a
// database, so they always run sandboxed (envprog.LoadSandboxed), whoever
// wrote them. It is safe for concurrent use.
type Catalog struct {
	Store  CatalogStore
	Limits envprog.Limits
	// Limit bounds the environments listed (default 1,000).
	Limit int
}

var _ envserver.Catalog = Catalog{}

// List implements envserver.Catalog: the DONE environments, newest first.
func (c Catalog) List(ctx context.Context) ([]envserver.Entry, error) {
	list, err := c.Store.List(ctx, sink.EnvironmentFilter{Status: string(StatusDone), Limit: cmp.Or(c.Limit, 1000)})
	if err != nil {
		return nil, fmt.Errorf("synthesizer catalog: list: %w", err)
	}
	out := make([]envserver.Entry, 0, len(list))
	for _, e := range list {
		en := entry(e)
		en.MaxTurns = c.Limits.MaxTurns // what Open loads it with
		out = append(out, en)
	}
	return out, nil
}

// Open implements envserver.Catalog: the environment's accepted program,
// loaded sandboxed; envserver.ErrNotFound unless it is DONE.
func (c Catalog) Open(ctx context.Context, id string) (envprog.Env, error) {
	e, err := c.Store.LoadEnvironment(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("synthesizer catalog: load %s: %w", id, err)
	}
	if e == nil || e.Status != StatusDone || e.Program == "" {
		return nil, envserver.ErrNotFound
	}
	return envprog.LoadSandboxed(ctx, id, []byte(e.Program), c.Limits)
}

// entry is what the listing shows of e: the target's schemas of the tools
// the program uses, and the accepted calibration (the registry's record:
// the summary, pass@k and the reward histogram).
func entry(e *Environment) envserver.Entry {
	en := envserver.Entry{ID: e.ID, Name: e.Capability, Doc: e.Rationale, Capability: e.Capability,
		TargetEnvironment: e.Environment, AgentVersion: e.AgentVersion, ProgramHash: e.ProgramHash,
		Status: string(e.Status), Source: "registry", Tools: []schemas.Tool{}, Version: e.Version}
	if e.Request != nil {
		for _, t := range e.Request.Tools {
			if slices.Contains(e.Tools, t.Function.Name) {
				en.Tools = append(en.Tools, t)
			}
		}
	}
	if e.Calibration != nil {
		en.Calibration, _ = json.Marshal(e.Calibration)
	}
	return en
}
