// Package verifytest stores constructed closed-loop data in ClickHouse for
// tests: an adapter in the registry, its cohort's labeled rollouts before
// activation and the labeled rollouts routed to it. It is test support,
// never used by trace itself.
package verifytest

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// Mix is a sample's composition: rollouts per (outcome, label), the same
// label in every run. L/P/N = LACKING/PRESENT/NA, F/P = failed/passed.
type Mix struct{ LF, PF, NF, LP, PP, NP int }

// Adapter is one adapter with its before and after samples.
type Adapter struct {
	Name, Capability, Environment, AgentVersion string
	ActivatedAt                                 time.Time
	Before, After                               Mix
	Runs                                        int // labeling runs (0 = 10, TRACE's N)
	Dictionary                                  uint32
	Simulated                                   bool
	Source                                      string // the labels' source (default "verifytest": external)
}

// Seed stores the adapter (status active, updated at ActivatedAt), its
// before rollouts (base model, ending in the hour before activation) and
// its after rollouts (routed to it, in the hour after), each with its
// labels, one a second in a shuffled order of outcomes and labels.
func Seed(ctx context.Context, st *sink.Store, a Adapter) error {
	if err := st.SaveAdapter(ctx, sink.AdapterRow{Name: a.Name, JobID: "job-" + a.Name, EnvironmentID: "env-" + a.Name, Capability: a.Capability, Environment: a.Environment,
		AgentVersion: a.AgentVersion, BaseModel: "base", URI: "file:///adapters/" + a.Name, Status: "active", Simulated: a.Simulated,
		Metadata: `{"trainer":"verifytest"}`, CreatedAt: a.ActivatedAt.Add(-time.Hour), UpdatedAt: a.ActivatedAt,
		Version: uint64(a.ActivatedAt.UnixNano())}); err != nil {
		return err
	}
	if err := seed(ctx, st, a, "before", a.Before, a.ActivatedAt.Add(-time.Hour), ""); err != nil {
		return err
	}
	return seed(ctx, st, a, "after", a.After, a.ActivatedAt.Add(time.Minute), a.Name)
}

// SeedRouted stores more rollouts routed to the adapter (Seed stored it),
// of composition m, one a second from start on, in a shuffled order, each
// with its labels; side names them (rollout ids <adapter>-<side>-NNNN).
func SeedRouted(ctx context.Context, st *sink.Store, a Adapter, side string, m Mix, start time.Time) error {
	return seed(ctx, st, a, side, m, start, a.Name)
}

func seed(ctx context.Context, st *sink.Store, a Adapter, side string, m Mix, start time.Time, adapter string) error {
	runs := a.Runs
	if runs == 0 {
		runs = analyzer.DefaultRuns
	}
	dv := a.Dictionary
	if dv == 0 {
		dv = 1
	}
	var rows []sink.RolloutRow
	var labels []sink.LabelRow
	type kind struct {
		ok    bool
		label string
	}
	var kinds []kind
	for _, k := range []struct {
		n int
		kind
	}{{m.LF, kind{false, "LACKING"}}, {m.PF, kind{false, "PRESENT"}}, {m.NF, kind{false, "NA"}},
		{m.LP, kind{true, "LACKING"}}, {m.PP, kind{true, "PRESENT"}}, {m.NP, kind{true, "NA"}}} {
		for range k.n {
			kinds = append(kinds, k.kind)
		}
	}
	// Outcomes and labels interleaved in time, as real traffic's are
	// (the guard's looks take the earliest rollouts): a shuffle with a
	// fixed seed, so a test's data are the same at every run.
	rand.New(rand.NewPCG(uint64(len(kinds)), 7)).Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	for i, k := range kinds {
		ok, label := k.ok, k.label
		id := fmt.Sprintf("%s-%s-%04d", a.Name, side, i)
		end := start.Add(time.Duration(i) * time.Second)
		r := sink.RolloutRow{RolloutID: id, Environment: a.Environment, AgentName: "bot", AgentVersion: a.AgentVersion, TaskID: id,
			Success: ok, StartTime: end.Add(-time.Minute), EndTime: end, Messages: "[]", Tools: "[]", Grader: "{}", Metadata: "{}", Adapter: adapter}
		if ok {
			r.Reward = 1
		}
		if adapter != "" {
			r.ConversationID, r.RouteDecisionID = "conv-"+id, "dec-"+id
		}
		rows = append(rows, r)
		for run := range runs {
			labels = append(labels, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: id, Environment: a.Environment,
				AgentVersion: a.AgentVersion, DictionaryVersion: dv, Capability: a.Capability, Run: uint16(run), Label: label,
				Success: ok, Reward: r.Reward, Source: cmp.Or(a.Source, "verifytest"), TS: end}})
		}
	}
	if err := st.InsertRollouts(ctx, rows); err != nil {
		return err
	}
	return st.InsertLabels(ctx, labels)
}
