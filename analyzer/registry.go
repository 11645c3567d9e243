package analyzer

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/traceops/trace/sink"
)

// AnyVersion scopes a dictionary to every agent version of an environment.
const AnyVersion = "*"

// AnyEnvironment scopes a dictionary to every environment: the default
// dictionary (the built-in analyzer/dictionaries/tau-tools.yaml) labels
// every (environment, agent version) that has no dictionary of its own.
const AnyEnvironment = "*"

// scopes is the resolution order of a cohort's dictionary, most specific
// first: its exact (environment, agent version), its environment for every
// version, every environment for its version, the default.
func scopes(env, agentVersion string) [4][2]string {
	return [4][2]string{{env, agentVersion}, {env, AnyVersion}, {AnyEnvironment, agentVersion}, {AnyEnvironment, AnyVersion}}
}

// Registry holds the newest dictionary of every scope. It is safe for
// concurrent use; Reload swaps the whole set, so a labeling batch sees one
// consistent dictionary.
type Registry struct {
	mu    sync.RWMutex
	dicts map[[2]string]*Dictionary
	byVer map[[2]string]map[uint32]*Dictionary
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{dicts: map[[2]string]*Dictionary{}, byVer: map[[2]string]map[uint32]*Dictionary{}}
}

// Put adds a dictionary; a newer version of the same scope replaces the current one.
func (g *Registry) Put(d *Dictionary) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := [2]string{d.Environment, d.AgentVersion}
	if cur, ok := g.dicts[k]; !ok || d.Version >= cur.Version {
		g.dicts[k] = d
	}
	if g.byVer[k] == nil {
		g.byVer[k] = map[uint32]*Dictionary{}
	}
	g.byVer[k][d.Version] = d
}

// Resolve returns the dictionary for a rollout's cohort, the most specific
// that exists: the one scoped to its exact agent version, else its
// environment's for every version ("*"), else one for every environment
// (environment "*": the default), else nil.
func (g *Registry) Resolve(env, agentVersion string) *Dictionary {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, k := range scopes(env, agentVersion) {
		if d, ok := g.dicts[k]; ok {
			return d
		}
	}
	return nil
}

// Version returns a specific version for a cohort, if known, looked up in
// the order of Resolve.
func (g *Registry) Version(env, agentVersion string, v uint32) *Dictionary {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, k := range scopes(env, agentVersion) {
		if d := g.byVer[k][v]; d != nil {
			return d
		}
	}
	return nil
}

// Exact returns version v of exactly the scope (env, agentVersion), without
// falling back to broader dictionaries.
func (g *Registry) Exact(env, agentVersion string, v uint32) *Dictionary {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.byVer[[2]string{env, agentVersion}][v]
}

// IsDefault reports whether d is scoped to every environment (a default
// dictionary rather than one of the cohort's own).
func (d *Dictionary) IsDefault() bool { return d.Environment == AnyEnvironment }

// Scope is "environment/agent_version" of the dictionary, e.g. "*/*" for
// the default.
func (d *Dictionary) Scope() string { return d.Environment + "/" + d.AgentVersion }

// PrepareApply decides how d is stored, given the dictionaries already in
// reg: it returns the current dictionary of d's own scope when it has the
// same content (nothing to store), else nil after setting d.Version so that
// it supersedes both its own scope's current version and every broader
// dictionary that labels its cohorts now. A cohort is keyed by (environment,
// agent version, dictionary version), so an environment's own dictionary
// that takes over from the default (version 1) becomes version 2, and the
// two sets of labels never share a cohort.
func (g *Registry) PrepareApply(d *Dictionary) *Dictionary {
	g.mu.RLock()
	defer g.mu.RUnlock()
	floor := uint32(0)
	for i, k := range scopes(d.Environment, d.AgentVersion) {
		cur, ok := g.dicts[k]
		if !ok {
			continue
		}
		if i == 0 && cur.Fingerprint() == d.Fingerprint() {
			return cur
		}
		floor = max(floor, cur.Version)
		// Every version ever stored for the scope, not only the newest.
		for v := range g.byVer[k] {
			floor = max(floor, v)
		}
	}
	if d.Version <= floor {
		d.Version = floor + 1
	}
	return nil
}

// All returns the current dictionaries.
func (g *Registry) All() []*Dictionary {
	g.mu.RLock()
	defer g.mu.RUnlock()
	out := make([]*Dictionary, 0, len(g.dicts))
	for _, d := range g.dicts {
		out = append(out, d)
	}
	return out
}

// DictionaryStore is where dictionaries are kept (sink.Store).
type DictionaryStore interface {
	AllDictionaries(ctx context.Context) ([]sink.DictionaryRow, error)
	SaveDictionary(ctx context.Context, d sink.DictionaryRow) error
}

// Announcer tells the other replicas that a scope has a new dictionary
// version (internal/bus's Bus, over a NATS KV bucket).
type Announcer interface {
	AnnounceDictionary(ctx context.Context, env, agentVersion string, version uint32) error
}

// Apply stores d unless the same content is already the current version of
// its scope, announces it through ann (nil: no announcement), and adds it to
// g. A dictionary whose content changed but whose version did not is stored
// as the next version (capabilities are never renamed within a version),
// and one that takes over from a broader dictionary (the default) gets a
// version above it (PrepareApply). It returns the dictionary now current
// for d's scope.
func (g *Registry) Apply(ctx context.Context, st DictionaryStore, ann Announcer, d *Dictionary) (*Dictionary, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	if cur := g.PrepareApply(d); cur != nil {
		return cur, nil
	}
	if d.CreatedAt.IsZero() {
		d.CreatedAt = time.Now().UTC()
	}
	d.Source = cmp.Or(d.Source, "file")
	if err := st.SaveDictionary(ctx, DictionaryRow(d)); err != nil {
		return nil, err
	}
	g.Put(d)
	if ann != nil {
		if err := ann.AnnounceDictionary(ctx, d.Environment, d.AgentVersion, d.Version); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Load reads every stored dictionary version from st.
func (g *Registry) Load(ctx context.Context, st DictionaryStore) error {
	rows, err := st.AllDictionaries(ctx)
	if err != nil {
		return err
	}
	for _, r := range rows {
		d, err := DictionaryFromRow(r)
		if err != nil {
			return err
		}
		g.Put(d)
	}
	return nil
}

// DictionaryFromRow decodes a stored dictionary.
func DictionaryFromRow(r sink.DictionaryRow) (*Dictionary, error) {
	var d Dictionary
	if err := json.Unmarshal([]byte(r.Body), &d); err != nil {
		return nil, fmt.Errorf("stored dictionary %s/%s v%d: %w", r.Environment, r.AgentVersion, r.Version, err)
	}
	d.Environment, d.AgentVersion, d.Version, d.Source, d.CreatedAt = r.Environment, r.AgentVersion, r.Version, r.Source, r.CreatedAt
	return &d, nil
}

// DictionaryRow encodes a dictionary for storage.
func DictionaryRow(d *Dictionary) sink.DictionaryRow {
	b, _ := json.Marshal(d)
	return sink.DictionaryRow{Environment: d.Environment, AgentVersion: d.AgentVersion, Version: d.Version, CreatedAt: d.CreatedAt, Source: d.Source, Body: string(b)}
}
