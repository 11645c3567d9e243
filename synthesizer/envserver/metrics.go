package envserver

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's Prometheus metrics, labelled by environment id.
type metrics struct {
	sessions  *prometheus.GaugeVec     // trace_env_sessions_open
	steps     *prometheus.CounterVec   // trace_env_steps_total
	errors    *prometheus.CounterVec   // trace_env_errors_total{code}
	evicted   *prometheus.CounterVec   // trace_env_sessions_evicted_total
	stepTime  *prometheus.HistogramVec // trace_env_step_seconds
	reward    *prometheus.HistogramVec // trace_env_episode_reward
	episodes  *prometheus.CounterVec   // trace_env_episodes_total{done_reason}
	resets    *prometheus.CounterVec   // trace_env_resets_total{reset_cache}
	recorded  prometheus.Counter       // trace_env_episodes_recorded_total
	dropped   *prometheus.CounterVec   // trace_env_episodes_dropped_total{reason}
	queueSize prometheus.GaugeFunc
}

func newMetrics(reg prometheus.Registerer, queueLen func() float64) *metrics {
	m := &metrics{
		sessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "trace_env_sessions_open",
			Help: "Open environment sessions (WebSocket connections and stateful HTTP sessions)."}, []string{"environment"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trace_env_steps_total",
			Help: "Environment steps played (assistant turns and MCP tool calls); rate() gives steps/s."}, []string{"environment"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trace_env_errors_total",
			Help: "Protocol errors answered, by OpenEnv error code."}, []string{"environment", "code"}),
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trace_env_sessions_evicted_total",
			Help: "Sessions evicted after the idle timeout."}, []string{"environment"}),
		stepTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "trace_env_step_seconds",
			Help: "Time to execute one step in the environment program.", Buckets: prometheus.ExponentialBuckets(1e-5, 4, 10)}, []string{"environment"}),
		reward: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "trace_env_episode_reward",
			Help: "Reward of finished episodes.", Buckets: []float64{0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99, 1}}, []string{"environment"}),
		episodes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trace_env_episodes_total",
			Help: "Finished episodes, by why they ended."}, []string{"environment", "done_reason"}),
		resets: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trace_env_resets_total",
			Help: "Episodes started: reset_cache=hit when the program's reset cache answered (a copy of the seed's state), miss when reset ran."}, []string{"environment", "reset_cache"}),
		recorded: prometheus.NewCounter(prometheus.CounterOpts{Name: "trace_env_episodes_recorded_total",
			Help: "Episodes written to ClickHouse env_episodes."}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trace_env_episodes_dropped_total",
			Help: "Sampled episodes not recorded: queue_full (the writer fell behind), write_failed (ClickHouse refused them after retries) or shutdown (not written within the shutdown's drain budget)."}, []string{"reason"}),
	}
	m.queueSize = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "trace_env_episodes_queued",
		Help: "Episodes waiting to be written to ClickHouse."}, queueLen)
	if reg != nil {
		for _, c := range []prometheus.Collector{m.sessions, m.steps, m.errors, m.evicted, m.stepTime, m.reward, m.episodes, m.resets, m.recorded, m.dropped, m.queueSize} {
			if err := reg.Register(c); err != nil {
				// A second server on the same registry (tests): keep its
				// own unregistered collectors.
				continue
			}
		}
	}
	return m
}
