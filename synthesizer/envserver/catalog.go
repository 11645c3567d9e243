package envserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/envprog"
)

// ErrNotFound is returned by Catalog.Open for an id it does not serve.
var ErrNotFound = errors.New("envserver: no such environment")

// Entry describes one environment a catalog serves, as GET /v1/environments
// lists it.
type Entry struct {
	ID string `json:"id"`
	// Name and Doc are the program's (its docstring is the rationale).
	Name string `json:"name,omitempty"`
	Doc  string `json:"doc,omitempty"`
	// Capability, TargetEnvironment and AgentVersion are the synthesis
	// request's; empty for a program served from a file.
	Capability        string `json:"capability,omitempty"`
	TargetEnvironment string `json:"target_environment,omitempty"`
	AgentVersion      string `json:"agent_version,omitempty"`
	ProgramHash       string `json:"program_hash,omitempty"`
	// Status is the registry's (DONE for what it lists); empty for a file.
	Status string         `json:"status,omitempty"`
	Source string         `json:"source"` // registry | file
	Tools  []schemas.Tool `json:"tools"`
	// Calibration is the calibration summary as the registry stores it
	// (environment_ready.v1's calibration object); null for a file, which
	// is served as it is, uncalibrated.
	Calibration json.RawMessage `json:"calibration"`
	// MaxTurns is the turn limit the catalog loads the program with
	// (envprog.Limits.MaxTurns; 0: envprog's default), so that an episode
	// its limit ends is recorded as max_turns. Not listed.
	MaxTurns int `json:"-"`
	// Version is the registry record's (0 for a file): an environment that
	// failed to open is tried again when a listing shows another. Not
	// listed.
	Version uint64 `json:"-"`
}

// Catalog is where the server finds environments: the synthesizer's
// registry (ClickHouse environments with status DONE) or a static set.
type Catalog interface {
	// List returns the environments served, in a stable order.
	List(ctx context.Context) ([]Entry, error)
	// Open loads environment id, or returns ErrNotFound. The server opens
	// an id once, keeps the Env while it serves it and closes it on Close.
	Open(ctx context.Context, id string) (envprog.Env, error)
}

// StaticCatalog serves a fixed set of loaded programs (`trace env serve
// FILE...` and tests). It is safe for concurrent use.
type StaticCatalog struct {
	mu      sync.Mutex
	entries map[string]Entry
	envs    map[string]envprog.Env
	opened  map[string]bool
}

// NewStaticCatalog returns an empty catalog.
func NewStaticCatalog() *StaticCatalog {
	return &StaticCatalog{entries: map[string]Entry{}, envs: map[string]envprog.Env{}, opened: map[string]bool{}}
}

// Add serves env under id; e carries what the listing shows beyond the
// program's own Info (its ID, Name, Doc, ProgramHash and Tools are filled
// from env.Info() when empty).
func (c *StaticCatalog) Add(id string, env envprog.Env, e Entry) error {
	if !validID(id) {
		return fmt.Errorf("envserver: environment id %q: use letters, digits, '.', '_' and '-' (at most 128)", id)
	}
	info := env.Info()
	e.ID = id
	if e.Name == "" {
		e.Name = info.Name
	}
	if e.Doc == "" {
		e.Doc = info.Doc
	}
	if e.ProgramHash == "" {
		e.ProgramHash = info.Hash
	}
	if e.Tools == nil {
		e.Tools = info.Tools
	}
	if e.Source == "" {
		e.Source = "file"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.entries[id]; dup {
		return fmt.Errorf("envserver: environment id %q twice", id)
	}
	c.entries[id], c.envs[id] = e, env
	return nil
}

// List implements Catalog.
func (c *StaticCatalog) List(context.Context) ([]Entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Entry, 0, len(c.entries))
	for _, e := range c.entries {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Open implements Catalog.
func (c *StaticCatalog) Open(_ context.Context, id string) (envprog.Env, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	env, ok := c.envs[id]
	if !ok {
		return nil, ErrNotFound
	}
	c.opened[id] = true
	return env, nil
}

// Close closes the environments no server opened (a server closes those
// it opened).
func (c *StaticCatalog) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for id, env := range c.envs {
		if !c.opened[id] {
			if err := env.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	c.envs = map[string]envprog.Env{}
	return errors.Join(errs...)
}

func validID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}
