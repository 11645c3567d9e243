package router

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/traceops/trace/sink"
)

// proxyMetrics are the proxy's Prometheus metrics. Every routed request
// ends in Proxy.record, which counts it; route_decisions holds the same
// facts per request for analytics, these are for alerts and dashboards.
type proxyMetrics struct {
	fallbacks *prometheus.CounterVec // by the missing adapter
	requests  *prometheus.CounterVec // by endpoint, adapter ("none": the base model) and outcome
	tokens    *prometheus.CounterVec // by adapter and kind (prompt, completion)
	overhead  prometheus.Histogram   // the proxy's own time before forwarding
	// passthrough counts the requests for the upstream's other /v1/ paths,
	// by endpoint and outcome.
	passthrough *prometheus.CounterVec
}

func newProxyMetrics(reg prometheus.Registerer) (*proxyMetrics, error) {
	m := &proxyMetrics{
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trace_router_adapter_fallbacks_total",
			Help: "Requests routed to an adapter that the upstream answered 404 (it does not serve it) and the base model served (router.fallback_on_missing_adapter)."},
			[]string{"adapter"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trace_router_requests_total",
			Help: "Routed requests by endpoint (proxy, route), the adapter that served them (none: the base model) and outcome (ok, upstream_error, stream_error, unreachable, canceled, routed)."},
			[]string{"endpoint", "adapter", "outcome"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trace_router_tokens_total",
			Help: "Tokens of proxied requests as the upstream reported them (its usage; a stream reports it only with stream_options.include_usage), by adapter (none: the base model) and kind (prompt, completion)."},
			[]string{"adapter", "kind"}),
		overhead: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "trace_router_overhead_seconds",
			Help:    "The proxy's own time per proxied request before forwarding it (reading and scanning the body, the decision: the classifier's call for a conversation's first request)",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 10e-3, 50e-3, 0.25, 1, 5}}),
		passthrough: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trace_router_passthrough_total",
			Help: "Requests for router.passthrough's endpoints (models, embeddings, completions, responses, …), passed through unrouted and unrecorded, by endpoint (the router.passthrough pattern it matched, e.g. \"POST /v1/embeddings\") and outcome (ok, upstream_error, stream_error, unreachable, canceled, refused)."},
			[]string{"endpoint", "outcome"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	m.fallbacks = register(reg, m.fallbacks, &errs)
	m.requests = register(reg, m.requests, &errs)
	m.tokens = register(reg, m.tokens, &errs)
	m.overhead = register(reg, m.overhead, &errs)
	m.passthrough = register(reg, m.passthrough, &errs)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("router: metrics: %w", err)
	}
	return m, nil
}

// register registers c, or returns the collector registered already in
// its place (a second proxy in the process shares it).
func register[C prometheus.Collector](reg prometheus.Registerer, c C, errs *[]error) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	*errs = append(*errs, err)
	return c
}

// count counts a routed request's row.
func (m *proxyMetrics) count(row *sink.RouteDecisionRow) {
	adapter := cmpOr(row.Adapter, "none")
	m.requests.WithLabelValues(row.Endpoint, adapter, row.Outcome).Inc()
	if row.Usage {
		m.tokens.WithLabelValues(adapter, "prompt").Add(float64(row.PromptTokens))
		m.tokens.WithLabelValues(adapter, "completion").Add(float64(row.CompletionTokens))
	}
	if row.Endpoint == "proxy" && row.OverheadUS > 0 {
		m.overhead.Observe(float64(row.OverheadUS) / 1e6)
	}
}
