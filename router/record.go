package router

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

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

// Row is the route_decisions row of one request served with decision d.
// Its slices are the decision's, shared by every row of the decision:
// they must not be modified.
func Row(d Decision, requestID, endpoint string, cached bool) sink.RouteDecisionRow {
	w := wireOf(d)
	row := sink.RouteDecisionRow{At: time.Now().UTC(), RequestID: requestID, DecisionID: d.ID, ConversationID: d.ConversationID,
		ConversationSource: d.ConversationSource, Environment: d.Environment, AgentVersion: d.AgentVersion, Endpoint: endpoint,
		Cached: cached, Adapter: d.Adapter, Capability: d.Capability, Model: d.Model, Label: d.Label, Reason: d.Reason, Error: cutText(d.Error, 500),
		ClassifierModel: d.ClassifierModel, Labels: w.labels, LabelCapabilities: w.labelCapabilities, LabelAdapters: w.labelAdapters,
		Probabilities: w.probabilities, WeightAdapters: w.weightAdapters, Weights: w.weights}
	if !cached {
		row.ClassifyMS = uint32(min(d.ClassifyLatency.Milliseconds(), math.MaxUint32))
	}
	return row
}

// wire is what every request served with a decision records and sends
// alike: the route_decisions row's slices, the response headers' values
// and the model as a JSON string. A cached decision serves every request
// of its conversation, so the router makes its wire form once, when it
// caches it, instead of once per request (less garbage on the proxy's hot
// path, and the collector's cycles are what its tail latency follows).
// Read-only once made; each header value slice has no spare capacity, so
// that an append to a response header copies it.
type wire struct {
	labels, labelCapabilities, labelAdapters []string
	probabilities                            []float64
	weightAdapters                           []string
	weights                                  []float64
	model                                    []byte
	hAdapter, hDecision, hModel, hConv       []string
}

func newWire(d Decision) *wire {
	w := &wire{hAdapter: []string{cmpOr(d.Adapter, "none")}, hDecision: []string{d.ID}, hModel: []string{d.Model}, hConv: []string{headerValue(d.ConversationID)}}
	w.model, _ = json.Marshal(d.Model)
	ls := d.labels // classify's, shared by the decisions of one list
	if ls == nil {
		ls = newLabelSet(nil, d.Labels)
	}
	w.labels, w.labelCapabilities, w.labelAdapters = ls.names, ls.caps, ls.adapters
	if d.Probabilities != nil {
		w.probabilities = make([]float64, len(d.Labels))
		for i, l := range d.Labels {
			w.probabilities[i] = d.Probabilities[l.Name]
		}
	}
	for _, wt := range d.Weights {
		w.weightAdapters = append(w.weightAdapters, wt.Adapter)
		w.weights = append(w.weights, wt.Weight)
	}
	return w
}

// wireOf is d's wire form: the one made when it was cached, else a new one.
func wireOf(d Decision) *wire {
	if d.wire != nil {
		return d.wire
	}
	return newWire(d)
}

// headerValue is v as a response header's value: v when it is one, else v
// with its control characters (which no header may carry: Go's, Node's and
// Python's HTTP clients refuse the whole response) percent-encoded. A
// conversation id from the body's metadata may be any JSON string; made
// once per decision, not per request.
func headerValue(v string) string {
	if httpguts.ValidHeaderFieldValue(v) {
		return v
	}
	var b strings.Builder
	for i := range len(v) {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}
