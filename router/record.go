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
// batches (every FlushEvery, default 1s, or at 1,000 rows), so recording
// never adds to a request's latency: Record only appends under a mutex.
// When ClickHouse is down the buffer keeps up to 100,000 rows, then drops
// the oldest and says so in the log.
type Recorder struct {
	W          DecisionWriter
	Log        *slog.Logger
	FlushEvery time.Duration

	mu      sync.Mutex
	buf     []sink.RouteDecisionRow
	dropped int
	kick    chan struct{}
	once    sync.Once
}

const recorderMax = 100000

func (r *Recorder) init() { r.once.Do(func() { r.kick = make(chan struct{}, 1) }) }

// Record queues a row; it never blocks on I/O.
func (r *Recorder) Record(row sink.RouteDecisionRow) {
	r.init()
	r.mu.Lock()
	if len(r.buf) >= recorderMax {
		r.buf = r.buf[1:]
		r.dropped++
	}
	r.buf = append(r.buf, row)
	full := len(r.buf) >= 1000
	r.mu.Unlock()
	if full {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

// Run flushes until ctx ends, then flushes what is left (within 5s).
func (r *Recorder) Run(ctx context.Context) error {
	r.init()
	every := r.FlushEvery
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			r.Flush(fctx)
			return nil
		case <-t.C:
		case <-r.kick:
		}
		r.Flush(ctx)
	}
}

// Flush writes the buffered rows now; on failure they stay buffered.
func (r *Recorder) Flush(ctx context.Context) {
	r.mu.Lock()
	rows, dropped := r.buf, r.dropped
	r.buf, r.dropped = nil, 0
	r.mu.Unlock()
	log := r.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if dropped > 0 {
		log.Warn("router: decision buffer full while ClickHouse was unavailable; oldest rows dropped", "dropped", dropped)
	}
	if len(rows) == 0 {
		return
	}
	if err := r.W.InsertRouteDecisions(ctx, rows); err != nil {
		log.Warn("router: recording decisions failed; will retry", "rows", len(rows), "err", err)
		r.mu.Lock()
		r.buf = append(rows, r.buf...)
		if over := len(r.buf) - recorderMax; over > 0 {
			r.buf = r.buf[over:]
			r.dropped += over
		}
		r.mu.Unlock()
	}
}

// Pending is the number of rows not yet written.
func (r *Recorder) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.buf)
}

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
