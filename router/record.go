package router

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/traceops/trace/sink"
)

// DecisionWriter stores decision rows (*sink.Store).
type DecisionWriter interface {
	InsertRouteDecisions(ctx context.Context, rows []sink.RouteDecisionRow) error
}

// Recorder buffers decision rows and writes them to route_decisions in
// batches (sink.Batcher: every FlushEvery, default 1s, or at 1,000 rows),
// so recording never adds to a request's latency: Record only appends
// under a mutex. When ClickHouse is down the buffer keeps up to 100,000
// rows, then drops the oldest and says so in the log.
type Recorder struct {
	W          DecisionWriter
	Log        *slog.Logger
	FlushEvery time.Duration

	once sync.Once
	b    *sink.Batcher[sink.RouteDecisionRow]
}

func (r *Recorder) batcher() *sink.Batcher[sink.RouteDecisionRow] {
	r.once.Do(func() {
		r.b = &sink.Batcher[sink.RouteDecisionRow]{Insert: r.W.InsertRouteDecisions, Name: "router: decisions", Log: r.Log, Every: r.FlushEvery}
	})
	return r.b
}

// Record queues a row; it never blocks on I/O.
func (r *Recorder) Record(row sink.RouteDecisionRow) { r.batcher().Add(row) }

// Run flushes until ctx ends, then flushes what is left (within 5s).
func (r *Recorder) Run(ctx context.Context) error { return r.batcher().Run(ctx) }

// Flush writes the buffered rows now; on failure they stay buffered.
func (r *Recorder) Flush(ctx context.Context) { r.batcher().Flush(ctx) }

// Pending is the number of rows not yet written.
func (r *Recorder) Pending() int { return r.batcher().Pending() }

// Row is the route_decisions row of one request served with decision d.
func Row(d Decision, requestID, endpoint string, cached bool) sink.RouteDecisionRow {
	row := sink.RouteDecisionRow{At: time.Now().UTC(), RequestID: requestID, DecisionID: d.ID, ConversationID: d.ConversationID,
		ConversationSource: d.ConversationSource, Environment: d.Environment, AgentVersion: d.AgentVersion, Endpoint: endpoint,
		Cached: cached, Adapter: d.Adapter, Capability: d.Capability, Model: d.Model, Label: d.Label, Reason: d.Reason, Error: cutText(d.Error, 500),
		ClassifierModel: d.ClassifierModel}
	if !cached {
		row.ClassifyMS = uint32(min(d.ClassifyLatency.Milliseconds(), math.MaxUint32))
	}
	for _, l := range d.Labels {
		row.Labels = append(row.Labels, l.Name)
		row.LabelCapabilities = append(row.LabelCapabilities, l.Capability())
		row.LabelAdapters = append(row.LabelAdapters, l.Candidate.Adapter)
		if d.Probabilities != nil {
			row.Probabilities = append(row.Probabilities, d.Probabilities[l.Name])
		}
	}
	for _, w := range d.Weights {
		row.WeightAdapters = append(row.WeightAdapters, w.Adapter)
		row.Weights = append(row.Weights, w.Weight)
	}
	return row
}
