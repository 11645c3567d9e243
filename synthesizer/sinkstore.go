package synthesizer

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// EnvironmentRows is what the synthesizer needs of ClickHouse (sink.Store).
type EnvironmentRows interface {
	SaveEnvironment(ctx context.Context, r sink.EnvironmentRow) error
	Environment(ctx context.Context, id string) (*sink.EnvironmentRow, error)
	Environments(ctx context.Context, f sink.EnvironmentFilter) ([]sink.EnvironmentRow, error)
	EnvironmentStatusCounts(ctx context.Context, f sink.EnvironmentFilter) (map[string]int, error)
	RolloutsByID(ctx context.Context, env, agentVersion string, ids []string) ([]*schemas.Rollout, error)
}

var _ EnvironmentRows = (*sink.Store)(nil)

// SinkStore keeps environment records in the environments table. It is the
// Store, ExampleSource and WaitingLister of a production stage.
type SinkStore struct {
	Rows EnvironmentRows
	// Log takes the warning about a row that does not decode (see List);
	// nil: slog.Default().
	Log *slog.Logger
}

// details are the record's fields that have no column of their own.
type details struct {
	Definition   string   `json:"definition,omitempty"`
	Rank         int      `json:"rank,omitempty"`
	MeanDelta    float64  `json:"mean_delta"`
	FamilySource string   `json:"family_source,omitempty"`
	FamilyWhy    string   `json:"family_why,omitempty"`
	Path         Path     `json:"path,omitempty"`
	Attempt      int      `json:"attempt"`
	Diagnoses    []string `json:"diagnoses,omitempty"`
	Rationale    string   `json:"rationale,omitempty"`
	Transient    int      `json:"transient_failures,omitempty"`
	// Progress is the calibration's (Environment.Progress).
	Progress *CalibrationProgress `json:"calibration_progress,omitempty"`
}

// Row is e as a row of the environments table.
func Row(e *Environment) (sink.EnvironmentRow, error) {
	js := func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	}
	r := sink.EnvironmentRow{EnvironmentID: e.ID, TriggerID: e.TriggerID, Environment: e.Environment, AgentVersion: e.AgentVersion,
		DictionaryVersion: e.DictionaryVersion, Capability: e.Capability, Family: e.Family, Status: string(e.Status), Reason: e.Reason,
		Attempts: uint8(min(len(e.Attempts), 255)), Program: e.Program, ProgramHash: e.ProgramHash,
		CreatedAt: e.CreatedAt, UpdatedAt: e.UpdatedAt, Version: e.Version}
	var err error
	tools := e.Tools
	if tools == nil {
		tools = []string{}
	}
	if r.Tools, err = js(tools); err != nil {
		return r, err
	}
	pass := e.PassAtK()
	if pass == nil {
		pass = map[string]float64{}
	}
	if r.PassAtK, err = js(pass); err != nil {
		return r, err
	}
	if c := e.Calibration; c != nil {
		r.MeanReward, r.SuccessRate, r.Simulated = c.MeanReward, c.SuccessRate, c.Simulated
		if r.Calibration, err = js(c); err != nil {
			return r, err
		}
	}
	if r.Request, err = js(e.Request); err != nil {
		return r, err
	}
	attempts := e.Attempts
	if attempts == nil {
		attempts = []Attempt{}
	}
	if r.AttemptsJSON, err = js(attempts); err != nil {
		return r, err
	}
	r.Details, err = js(details{Definition: e.Definition, Rank: e.Rank, MeanDelta: e.MeanDelta, FamilySource: e.FamilySource,
		FamilyWhy: e.FamilyWhy, Path: e.Path, Attempt: e.Attempt, Diagnoses: e.Diagnoses, Rationale: e.Rationale, Transient: e.TransientFailures,
		Progress: e.Progress})
	return r, err
}

// FromRow rebuilds a record from its row. A list row (without the program
// and the attempts) gives a record without them.
func FromRow(r *sink.EnvironmentRow) (*Environment, error) {
	e := &Environment{ID: r.EnvironmentID, TriggerID: r.TriggerID, Environment: r.Environment, AgentVersion: r.AgentVersion,
		DictionaryVersion: r.DictionaryVersion, Capability: r.Capability, Family: r.Family, Status: Status(r.Status), Reason: r.Reason,
		Program: r.Program, ProgramHash: r.ProgramHash, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, Version: r.Version}
	un := func(col, s string, v any) error {
		if s == "" {
			return nil
		}
		if err := json.Unmarshal([]byte(s), v); err != nil {
			return fmt.Errorf("environment %s: stored %s: %w", r.EnvironmentID, col, err)
		}
		return nil
	}
	var d details
	for _, c := range []struct {
		col, s string
		v      any
	}{{"tools", r.Tools, &e.Tools}, {"request", r.Request, &e.Request}, {"attempts_json", r.AttemptsJSON, &e.Attempts},
		{"calibration", r.Calibration, &e.Calibration}, {"details", r.Details, &d}} {
		if err := un(c.col, c.s, c.v); err != nil {
			return nil, err
		}
	}
	if e.Calibration == nil && r.PassAtK != "" && r.PassAtK != "{}" {
		// A list row: the figures the list shows, from their columns.
		e.Calibration = &Calibration{Accepted: true, MeanReward: r.MeanReward, SuccessRate: r.SuccessRate, Simulated: r.Simulated}
		if err := un("pass_at_k", r.PassAtK, &e.Calibration.PassAtK); err != nil {
			return nil, err
		}
	}
	e.Definition, e.Rank, e.MeanDelta, e.FamilySource, e.FamilyWhy = d.Definition, d.Rank, d.MeanDelta, d.FamilySource, d.FamilyWhy
	e.Path, e.Attempt, e.Diagnoses, e.Rationale, e.TransientFailures = d.Path, d.Attempt, d.Diagnoses, d.Rationale, d.Transient
	e.Progress = d.Progress
	return e, nil
}

// SaveEnvironment implements Store.
func (s SinkStore) SaveEnvironment(ctx context.Context, e *Environment) error {
	r, err := Row(e)
	if err != nil {
		return err
	}
	return s.Rows.SaveEnvironment(ctx, r)
}

// LoadEnvironment implements Store.
func (s SinkStore) LoadEnvironment(ctx context.Context, id string) (*Environment, error) {
	r, err := s.Rows.Environment(ctx, id)
	if err != nil || r == nil {
		return nil, err
	}
	return FromRow(r)
}

// List returns the records matching f (without programs and attempts
// unless f.Full). A row that does not decode is left out (see
// ListReadable).
func (s SinkStore) List(ctx context.Context, f sink.EnvironmentFilter) ([]*Environment, error) {
	out, _, err := s.ListReadable(ctx, f)
	return out, err
}

// UnreadableRow is a row of environments whose JSON columns do not decode:
// written by an older or newer version, or damaged.
type UnreadableRow struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Version uint64 `json:"version"`
	Error   string `json:"error"`
}

// ListReadable returns the records matching f and, apart, the rows that
// do not decode, each logged as a warning once (per row version and
// process): one such row must not take the listing down, nor the
// environments it lists (the environment server's catalog, the dashboard,
// the resumption of waiting requests).
func (s SinkStore) ListReadable(ctx context.Context, f sink.EnvironmentFilter) ([]*Environment, []UnreadableRow, error) {
	rs, err := s.Rows.Environments(ctx, f)
	if err != nil {
		return nil, nil, err
	}
	out := make([]*Environment, 0, len(rs))
	var bad []UnreadableRow
	for i := range rs {
		e, err := FromRow(&rs[i])
		if err != nil {
			u := UnreadableRow{ID: rs[i].EnvironmentID, Status: rs[i].Status, Version: rs[i].Version, Error: err.Error()}
			s.warnUnreadable(u)
			bad = append(bad, u)
			continue
		}
		out = append(out, e)
	}
	return out, bad, nil
}

// unreadableWarned holds the rows (id and version) warned about, so that
// a listing read again and again warns once; it is emptied when it holds
// maxUnreadableWarned.
var unreadableWarned struct {
	sync.Mutex
	seen map[string]bool
}

const maxUnreadableWarned = 1024

func (s SinkStore) warnUnreadable(u UnreadableRow) {
	key := fmt.Sprintf("%s@%d", u.ID, u.Version)
	w := &unreadableWarned
	w.Lock()
	if w.seen[key] {
		w.Unlock()
		return
	}
	if w.seen == nil || len(w.seen) >= maxUnreadableWarned {
		w.seen = map[string]bool{}
	}
	w.seen[key] = true
	w.Unlock()
	log := s.Log
	if log == nil {
		log = slog.Default()
	}
	log.Warn("synthesizer: an environments row does not decode; left out of the listings", "environment_id", u.ID,
		"status", u.Status, "version", u.Version, "err", u.Error)
}

// StatusCounts counts the records matching f by status, all of them
// (f.Limit does not apply).
func (s SinkStore) StatusCounts(ctx context.Context, f sink.EnvironmentFilter) (map[string]int, error) {
	return s.Rows.EnvironmentStatusCounts(ctx, f)
}

// WaitingEnvironments implements WaitingLister.
func (s SinkStore) WaitingEnvironments(ctx context.Context) ([]*Environment, error) {
	return s.List(ctx, sink.EnvironmentFilter{Status: string(StatusWaitingForLLM), Full: true})
}

// ExampleRollouts implements ExampleSource.
func (s SinkStore) ExampleRollouts(ctx context.Context, env, agentVersion string, ids []string) ([]*schemas.Rollout, error) {
	return s.Rows.RolloutsByID(ctx, env, agentVersion, ids)
}

// DictionaryVersions is what RegistryDictionaries needs of analyzer.Registry.
type DictionaryVersions interface {
	Version(env, agentVersion string, v uint32) *analyzer.Dictionary
}

// RegistryDictionaries resolves capabilities in the analyzer's registry.
type RegistryDictionaries struct{ Registry DictionaryVersions }

// Capability implements Dictionaries.
func (d RegistryDictionaries) Capability(env, agentVersion string, version uint32, name string) (CapabilityInfo, bool) {
	dict := d.Registry.Version(env, agentVersion, version)
	if dict == nil {
		return CapabilityInfo{}, false
	}
	c, ok := dict.Lookup(name)
	if !ok {
		return CapabilityInfo{}, false
	}
	return CapabilityInfo{Definition: c.Definition, Family: c.Family}, true
}
