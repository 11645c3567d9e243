package ingest

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/traceops/trace/schemas"
)

// RegisterMetrics registers the rollout decoder's instruments on reg (nil:
// nothing): trace_schema_fast_path_fallbacks_total, the valid rollouts the
// one-pass parser failed on by a bug of its own (schemas.FastPathFallbacks).
// The consumer runtime's instruments are stream.NewMetrics'.
func RegisterMetrics(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "trace", Subsystem: "schema",
		Name: "fast_path_fallbacks_total", Help: "Valid rollouts the one-pass parser failed on by a bug of its own, " +
			"decoded with encoding/json instead (schemas.FastPathFallbacks). Should stay 0."},
		func() float64 { return float64(schemas.FastPathFallbacks()) }))
}
