package router

import (
	"context"
	"sync"
	"time"

	"github.com/traceops/trace/sink"
)

// AdapterRows reads the adapter registry (*sink.Store).
type AdapterRows interface {
	Adapters(ctx context.Context, f sink.AdapterFilter) ([]sink.AdapterRow, error)
}

// Registry is the AdapterSource over the registry's rows: an environment's
// adapters with status active, whatever their agent version (an adapter is
// a LoRA of the base model, which every agent version of the environment
// shares). Lists are kept for TTL (default 10s) so that routing does not
// query ClickHouse per conversation; an adapter activated, retired or
// rolled back is seen within TTL. When a refresh fails, the last list is
// used while it is younger than 10 × TTL, and the error is returned after.
type Registry struct {
	Rows AdapterRows
	// Describe returns a capability's description for the prompt (the
	// dictionary's definition); nil or "" uses the capability name.
	Describe func(environment, agentVersion, capability string) string
	TTL      time.Duration

	mu    sync.Mutex
	cache map[string]registryEntry
}

type registryEntry struct {
	rows []sink.AdapterRow
	at   time.Time
}

// ActiveAdapters implements AdapterSource.
func (g *Registry) ActiveAdapters(ctx context.Context, environment, agentVersion string) ([]Candidate, error) {
	ttl := g.TTL
	if ttl <= 0 {
		ttl = 10 * time.Second
	}
	g.mu.Lock()
	e, ok := g.cache[environment]
	g.mu.Unlock()
	if !ok || time.Since(e.at) >= ttl {
		rows, err := g.Rows.Adapters(ctx, sink.AdapterFilter{Status: "active", Environment: environment})
		if err != nil {
			if !ok || time.Since(e.at) >= 10*ttl {
				return nil, err
			}
		} else {
			e = registryEntry{rows: rows, at: time.Now()}
			g.mu.Lock()
			if g.cache == nil {
				g.cache = map[string]registryEntry{}
			}
			g.cache[environment] = e
			g.mu.Unlock()
		}
	}
	out := make([]Candidate, 0, len(e.rows))
	for _, r := range e.rows {
		c := Candidate{Adapter: r.Name, Capability: r.Capability}
		if g.Describe != nil {
			c.Description = g.Describe(environment, agentVersion, r.Capability)
		}
		out = append(out, c)
	}
	return out, nil
}
