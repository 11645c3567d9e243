package analyzer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// OriginalReader reads rollouts as they were published, by their Kafka
// coordinates (the rollouts table keeps each row's topic, partition and
// offset). Read calls fn with the value of every offset of the list that
// the partition still holds, in offset order, and returns the offsets it no
// longer holds (retention). Offsets are sorted ascending.
type OriginalReader interface {
	Read(ctx context.Context, topic string, partition int, offsets []int64, fn func(offset int64, value []byte) error) (missing []int64, err error)
}

// ErrOriginals marks a failure to read rollouts' original messages from
// Kafka (the broker is unreachable, for example).
var ErrOriginals = errors.New("cannot read the original rollouts from kafka")

// Backfill labels rollouts already stored in ClickHouse with the dictionary
// that labels their cohort now — after `trace dict apply --backfill` or
// `trace relabel` — through the stream's own labeling sink (LabelingSink):
// the same labeler, the same label_runs records, the same rule that a
// (rollout, dictionary version, run) is never labeled twice. Progress is
// what ClickHouse holds, so an interrupted backfill resumes where it
// stopped when run again.
//
// Each rollout is labeled from its original message, read again from Kafka
// by its stored coordinates, exactly as the stream labeled it. A rollout
// that Kafka no longer holds is labeled from its stored, compacted form
// (contents cut to 300 characters, tool arguments to 200) and counted in
// BackfillResult.Compacted: the llm labeler sees the same (its prompt is
// compacted anyway), rules detectors that read long tool results can label
// differently.
type Backfill struct {
	Store     BackfillStore
	Registry  *Registry
	Labeler   Labeler
	Originals OriginalReader                         // nil: label the stored (compacted) rollouts
	Decode    func([]byte) (*schemas.Rollout, error) // the stream's decoder (ingest.DecodeRollout)
	Evaluator *Evaluator                             // touched with the backfilled cohorts; may be nil
	Log       *slog.Logger
	Metrics   *Metrics
	// Batch is the rollouts labeled and written at once (default 200);
	// Concurrency the rollouts labeled in parallel (default 8).
	Batch, Concurrency int
}

// BackfillFilter selects the rollouts to backfill: an environment (empty:
// every one), an agent version (empty: every one), rollouts that ended at
// or after Since (zero: all), and, when Dictionary is set, only the cohorts
// that this dictionary labels now.
type BackfillFilter struct {
	Environment, AgentVersion string
	Since                     time.Time
	Dictionary                *Dictionary
}

// BackfillTarget is the work on one (environment, agent version).
type BackfillTarget struct {
	Environment, AgentVersion string
	Dictionary                *Dictionary
	Stored                    int                  // rollouts stored in the filter
	Done                      int                  // of them, with every run already labeled
	Todo                      []sink.StoredRollout // the others, oldest first
	Runs                      int                  // labeling runs still to do (model calls for the llm labeler)
	doneRuns                  map[string]int       // runs already done per rollout id
}

// Cohort is the target's cohort key.
func (t BackfillTarget) Cohort() sink.Cohort {
	return sink.Cohort{Environment: t.Environment, AgentVersion: t.AgentVersion, DictionaryVersion: t.Dictionary.Version}
}

// Plan lists what a backfill would label, without labeling anything.
func (b *Backfill) Plan(ctx context.Context, f BackfillFilter) ([]BackfillTarget, error) {
	scopes, err := b.Store.RolloutScopes(ctx)
	if err != nil {
		return nil, err
	}
	n := b.Labeler.Runs()
	var out []BackfillTarget
	for _, sc := range scopes {
		if (f.Environment != "" && sc.Environment != f.Environment) || (f.AgentVersion != "" && sc.AgentVersion != f.AgentVersion) {
			continue
		}
		d := b.Registry.Resolve(sc.Environment, sc.AgentVersion)
		if d == nil || (f.Dictionary != nil && (d.Scope() != f.Dictionary.Scope() || d.Version != f.Dictionary.Version)) {
			continue
		}
		t := BackfillTarget{Environment: sc.Environment, AgentVersion: sc.AgentVersion, Dictionary: d}
		stored, err := b.Store.StoredRollouts(ctx, sc.Environment, sc.AgentVersion, f.Since)
		if err != nil {
			return nil, err
		}
		done, err := b.Store.LabeledRuns(ctx, t.Cohort())
		if err != nil {
			return nil, err
		}
		t.Stored, t.doneRuns = len(stored), done
		for _, r := range stored {
			if k := done[r.RolloutID]; k >= n {
				t.Done++
			} else {
				t.Todo = append(t.Todo, r)
				t.Runs += n - k
			}
		}
		out = append(out, t)
	}
	return out, nil
}

// BackfillResult counts what a backfill did.
type BackfillResult struct {
	Labeled   int // rollouts handed to the labeler
	Compacted int // of them, labeled from their stored compacted form (no longer in Kafka)
	Cohorts   []sink.Cohort
}

// Run labels the planned rollouts, Batch at a time, each batch written
// before the next is read; progress is called with the rollouts handled so
// far. A cancelled ctx stops between (or inside) batches: what was written
// stays, and the next run skips it.
func (b *Backfill) Run(ctx context.Context, targets []BackfillTarget, progress func(done int)) (BackfillResult, error) {
	batch := b.Batch
	if batch <= 0 {
		batch = 200
	}
	ls := &LabelingSink{Labeler: b.Labeler, Registry: b.Registry, Store: b.Store, Evaluator: b.Evaluator,
		Concurrency: b.Concurrency, Log: b.Log, Metrics: b.Metrics}
	var res BackfillResult
	for _, t := range targets {
		if len(t.Todo) == 0 {
			continue
		}
		res.Cohorts = append(res.Cohorts, t.Cohort())
		for i := 0; i < len(t.Todo); i += batch {
			chunk := t.Todo[i:min(i+batch, len(t.Todo))]
			rs, compacted, err := b.load(ctx, t, chunk)
			if err != nil {
				return res, err
			}
			recs := make([]stream.Record[*schemas.Rollout], len(rs))
			for j, r := range rs {
				recs[j] = stream.Record[*schemas.Rollout]{Value: r}
			}
			if err := ls.Write(ctx, recs); err != nil {
				return res, fmt.Errorf("backfill %s/%s: %w", t.Environment, t.AgentVersion, err)
			}
			res.Labeled += len(rs)
			res.Compacted += compacted
			if progress != nil {
				progress(res.Labeled)
			}
		}
	}
	return res, nil
}

// load returns the chunk's rollouts, from Kafka where it still holds them,
// else from ClickHouse; the second result counts the latter.
func (b *Backfill) load(ctx context.Context, t BackfillTarget, chunk []sink.StoredRollout) ([]*schemas.Rollout, int, error) {
	byID := map[string]*schemas.Rollout{}
	var fallback []string
	if b.Originals != nil && b.Decode != nil {
		type tp struct {
			topic string
			part  int
		}
		want := map[tp]map[int64]string{}
		for _, r := range chunk {
			if r.Coord.Topic == "" {
				fallback = append(fallback, r.RolloutID)
				continue
			}
			k := tp{r.Coord.Topic, r.Coord.Partition}
			if want[k] == nil {
				want[k] = map[int64]string{}
			}
			want[k][r.Coord.Offset] = r.RolloutID
		}
		keys := make([]tp, 0, len(want))
		for k := range want {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			return keys[i].topic < keys[j].topic || (keys[i].topic == keys[j].topic && keys[i].part < keys[j].part)
		})
		for _, k := range keys {
			offs := make([]int64, 0, len(want[k]))
			for o := range want[k] {
				offs = append(offs, o)
			}
			sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
			missing, err := b.Originals.Read(ctx, k.topic, k.part, offs, func(off int64, v []byte) error {
				id := want[k][off]
				r, err := b.Decode(v)
				if err != nil || r.RolloutID != id || r.Environment != t.Environment || r.Agent.Version != t.AgentVersion {
					fallback = append(fallback, id) // not the message the row was stored from
					return nil
				}
				byID[id] = r
				return nil
			})
			if err != nil {
				if ctx.Err() != nil {
					return nil, 0, err
				}
				return nil, 0, fmt.Errorf("backfill: %w %s/%d: %w", ErrOriginals, k.topic, k.part, err)
			}
			for _, o := range missing {
				fallback = append(fallback, want[k][o])
			}
		}
	} else {
		for _, r := range chunk {
			fallback = append(fallback, r.RolloutID)
		}
	}
	if len(fallback) > 0 {
		stored, err := b.Store.CompactedRollouts(ctx, t.Environment, t.AgentVersion, fallback)
		if err != nil {
			return nil, 0, err
		}
		for id, r := range stored {
			byID[id] = r
		}
	}
	out := make([]*schemas.Rollout, 0, len(chunk))
	for _, r := range chunk {
		if v := byID[r.RolloutID]; v != nil {
			if v.EndTime.IsZero() {
				// Read from Kafka without end_time: the time the ingest
				// stage stored it at (its start, else the message's
				// timestamp, which the decoded value lacks), so that the
				// labels go in the row's hour, as the stream's do.
				v.EndTime = r.EndTime
			}
			out = append(out, v)
		}
	}
	return out, len(fallback), nil
}

// Estimate is what the llm labeler would spend on the planned rollouts:
// model calls (one per run still to do; retries come on top) and tokens,
// prompt tokens counted as a quarter of the rendered prompt's characters
// and completion tokens at the answer's cap. Rollouts outside the labeler's
// sample cost nothing. The prompt shows rollouts compacted, so the stored
// rows render the same prompt as the originals.
type Estimate struct {
	Rollouts, Calls                   int
	PromptTokens, MaxCompletionTokens int
}

// EstimateLLM renders the prompts of the planned rollouts (read from
// ClickHouse) and adds up their cost.
func (b *Backfill) EstimateLLM(ctx context.Context, l *LLMLabeler, targets []BackfillTarget) (Estimate, error) {
	var e Estimate
	for _, t := range targets {
		for i := 0; i < len(t.Todo); i += 500 {
			chunk := t.Todo[i:min(i+500, len(t.Todo))]
			ids := make([]string, len(chunk))
			for j, r := range chunk {
				ids[j] = r.RolloutID
			}
			stored, err := b.Store.CompactedRollouts(ctx, t.Environment, t.AgentVersion, ids)
			if err != nil {
				return e, err
			}
			for _, id := range ids {
				r := stored[id]
				if r == nil || !l.ShouldLabel(r) {
					continue
				}
				p, c, err := l.Estimate(t.Dictionary, r)
				if err != nil {
					return e, err
				}
				runs := l.Runs() - t.doneRuns[id]
				e.Rollouts++
				e.Calls += runs
				e.PromptTokens += runs * p
				e.MaxCompletionTokens += runs * c
			}
		}
	}
	return e, nil
}
