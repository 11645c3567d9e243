package router

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

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
// rolled back is seen within TTL. Concurrent reads of one environment's
// list share one query, which has its own timeout (QueryTimeout). A
// failed read is remembered: the next is tried a TTL later, not per
// conversation; meanwhile the last list is used while it is younger than
// 10 × TTL, and the read's error is returned after (or when there is no
// list yet).
type Registry struct {
	Rows AdapterRows
	// Describe returns a capability's description for the prompt (the
	// dictionary's definition); nil or "" uses the capability name.
	Describe func(environment, agentVersion, capability string) string
	TTL      time.Duration
	// QueryTimeout bounds one read of the registry (default 5s).
	QueryTimeout time.Duration

	mu    sync.Mutex
	cache map[string]registryEntry
	group singleflight.Group
}

type registryEntry struct {
	rows  []sink.AdapterRow
	at    time.Time // when rows were read (zero: never)
	tried time.Time // the last read, successful or not
	err   error     // the last read's error; nil after a success
}

const defaultRegistryQueryTimeout = 5 * time.Second

func (g *Registry) ttl() time.Duration {
	if g.TTL <= 0 {
		return 10 * time.Second
	}
	return g.TTL
}

// ActiveAdapters implements AdapterSource.
func (g *Registry) ActiveAdapters(ctx context.Context, environment, agentVersion string) ([]Candidate, error) {
	c, _, err := g.ActiveAdaptersAt(ctx, environment, agentVersion)
	return c, err
}

// ActiveAdaptersAt implements ListedAdapterSource: the list and when it
// was read from the registry.
func (g *Registry) ActiveAdaptersAt(ctx context.Context, environment, agentVersion string) ([]Candidate, time.Time, error) {
	rows, at, err := g.list(ctx, environment)
	if err != nil {
		return nil, time.Time{}, err
	}
	out := make([]Candidate, 0, len(rows))
	for _, r := range rows {
		c := Candidate{Adapter: r.Name, Capability: r.Capability}
		if g.Describe != nil {
			c.Description = g.Describe(environment, agentVersion, r.Capability)
		}
		out = append(out, c)
	}
	return out, at, nil
}

// list returns the environment's active rows and when they were read,
// reading them again when the last read is TTL old.
func (g *Registry) list(ctx context.Context, environment string) ([]sink.AdapterRow, time.Time, error) {
	ttl := g.ttl()
	g.mu.Lock()
	e, ok := g.cache[environment]
	g.mu.Unlock()
	if !ok || time.Since(e.tried) >= ttl {
		ch := g.group.DoChan(environment, func() (any, error) { return g.read(ctx, environment), nil })
		select {
		case res := <-ch:
			e = res.Val.(registryEntry)
		case <-ctx.Done(): // the read goes on for the callers after this one
			if e.err == nil {
				e.err = ctx.Err()
			}
		}
	}
	if e.at.IsZero() || time.Since(e.at) >= 10*ttl {
		if e.at.IsZero() {
			return nil, time.Time{}, e.err
		}
		return nil, time.Time{}, fmt.Errorf("the last list of active adapters is %s old: %w", time.Since(e.at).Round(time.Second), e.err)
	}
	return e.rows, e.at, nil
}

// read queries the environment's active adapters within QueryTimeout and
// records the outcome. It is not cancelled with the caller that started
// it: other callers share it.
func (g *Registry) read(ctx context.Context, environment string) registryEntry {
	qt := g.QueryTimeout
	if qt <= 0 {
		qt = defaultRegistryQueryTimeout
	}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), qt)
	defer cancel()
	rows, err := g.Rows.Adapters(qctx, sink.AdapterFilter{Status: "active", Environment: environment})
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cache == nil {
		g.cache = map[string]registryEntry{}
	}
	e := g.cache[environment]
	e.tried = now
	if err != nil {
		e.err = fmt.Errorf("adapter registry: %w", err)
	} else {
		e.rows, e.at, e.err = rows, now, nil
	}
	g.cache[environment] = e
	return e
}
