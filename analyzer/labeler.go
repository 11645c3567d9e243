package analyzer

import (
	"context"

	"github.com/traceops/trace/schemas"
)

// RunLabels is the outcome of one labeling run on one rollout: exactly one
// label per capability of the dictionary, or Failed with the reason (the run
// is then left out of the statistics; no label is ever invented).
type RunLabels struct {
	Run    int
	Labels map[string]string // capability -> NA | PRESENT | LACKING
	Failed string            // non-empty when the run produced no valid labels
}

// Labeler labels rollouts against a dictionary.
//
// Label runs the labeler's N runs on one rollout and returns one RunLabels per
// run, in run order. It must be safe for concurrent use. A cancelled ctx
// returns ctx.Err(); per-run failures (exhausted retries, invalid answers) are
// reported in RunLabels.Failed, not as an error.
type Labeler interface {
	Name() string // "rules" | "llm"
	Runs() int    // N
	Label(ctx context.Context, d *Dictionary, r *schemas.Rollout) ([]RunLabels, error)
}

// Events turns run labels into label events for the sink.
func Events(d *Dictionary, r *schemas.Rollout, source string, runs []RunLabels) []schemas.LabelEvent {
	var out []schemas.LabelEvent
	for _, rl := range runs {
		if rl.Failed != "" {
			continue
		}
		for _, c := range d.Capabilities {
			l, ok := rl.Labels[c.Name]
			if !ok {
				continue
			}
			out = append(out, schemas.LabelEvent{
				RolloutID: r.RolloutID, Environment: r.Environment, AgentVersion: r.Agent.Version,
				DictionaryVersion: d.Version, Capability: c.Name, Run: uint16(rl.Run), Label: l,
				Success: r.Succeeded(), Reward: r.Outcome.Reward, Source: source, TS: r.EndTime,
			})
		}
	}
	return out
}
