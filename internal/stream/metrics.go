package stream

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus instruments of every Consumer of a process. One
// Metrics is shared by all consumers (they are told apart by the stage and
// topic labels). A nil *Metrics is valid and records nothing.
type Metrics struct {
	consumed     *prometheus.CounterVec   // stage, topic
	inserted     *prometheus.CounterVec   // stage, topic
	deadLettered *prometheus.CounterVec   // stage, topic, reason
	skipped      *prometheus.CounterVec   // stage, topic, reason
	sinkRetries  *prometheus.CounterVec   // stage, topic
	errors       *prometheus.CounterVec   // stage, topic, op
	batchRows    *prometheus.HistogramVec // stage, topic
	batchBytes   *prometheus.HistogramVec // stage, topic
	insertDur    *prometheus.HistogramVec // stage, topic
	commitDur    *prometheus.HistogramVec // stage, topic
	lag          *prometheus.GaugeVec     // stage, topic, partition
	lagUpdated   *prometheus.GaugeVec     // stage, topic
}

// NewMetrics creates the instruments and registers them on reg (nil: not
// registered, still usable). It panics if they are already registered on reg,
// like prometheus.MustRegister: create one Metrics per registry.
//
// Exported series (all with labels stage and topic):
//
//	trace_consumer_messages_consumed_total        messages fetched from Kafka
//	trace_consumer_records_inserted_total         records accepted by the sink
//	trace_consumer_dead_lettered_total{reason}    messages written to the DLQ
//	trace_consumer_sink_retries_total             retried Sink.Write calls
//	trace_consumer_errors_total{op}               Kafka errors, each retried: op fetch, dlq, commit, lag;
//	                                              dlq_skipped counts dead letters too large to store at all
//	trace_consumer_batch_rows                     histogram of messages per batch
//	trace_consumer_batch_bytes                    histogram of key+value bytes per batch
//	trace_consumer_insert_duration_seconds        successful Sink.Write latency
//	trace_consumer_commit_duration_seconds        offset commit latency
//	trace_consumer_lag{partition}                 high watermark minus the group's committed offset,
//	                                              polled every Config.LagInterval (aggregate with max:
//	                                              every member of a group reports every partition);
//	                                              dropped after 3 intervals without a successful read
//	trace_consumer_lag_updated_timestamp_seconds  unix time of the last successful lag read: stops
//	                                              advancing while the lag cannot be read (see lagLoop)
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "trace", "consumer"
	st := []string{"stage", "topic"}
	m := &Metrics{
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "messages_consumed_total", Help: "Messages fetched from Kafka."}, st),
		inserted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "records_inserted_total", Help: "Records the sink made durable."}, st),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "invalid_skipped_total", Help: "Invalid messages skipped without dead-lettering (Config.SkipInvalid), by reason."},
			[]string{"stage", "topic", "reason"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "dead_lettered_total", Help: "Messages written to the dead-letter topic, by reason."},
			[]string{"stage", "topic", "reason"}),
		sinkRetries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "sink_retries_total", Help: "Sink writes that failed with a retryable error and were retried."}, st),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "errors_total", Help: "Kafka errors by operation (fetch, dlq, commit, lag); each is retried."},
			[]string{"stage", "topic", "op"}),
		batchRows: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "batch_rows", Help: "Messages per batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10)}, st), // 1 .. 262144
		batchBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "batch_bytes", Help: "Key and value bytes per batch.",
			Buckets: prometheus.ExponentialBuckets(1024, 4, 10)}, st), // 1 KiB .. 256 MiB
		insertDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "insert_duration_seconds", Help: "Latency of successful Sink.Write calls.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)}, st), // 1ms .. ~60s
		commitDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "commit_duration_seconds", Help: "Latency of synchronous offset commits.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 12)}, st),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "lag", Help: "High watermark minus the group's committed offset, per partition, " +
				"polled every LagInterval. Every member of a group reports every partition: aggregate with max, not sum."},
			[]string{"stage", "topic", "partition"}),
		lagUpdated: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "lag_updated_timestamp_seconds", Help: "Unix time of the last successful read of trace_consumer_lag. " +
				"It stops advancing while the lag cannot be read (Kafka unreachable), and the lag series are dropped " +
				"after three LagIntervals without a read: alert on time() minus this."}, st),
	}
	if reg != nil {
		reg.MustRegister(m.consumed, m.inserted, m.deadLettered, m.skipped, m.sinkRetries, m.errors,
			m.batchRows, m.batchBytes, m.insertDur, m.commitDur, m.lag, m.lagUpdated)
	}
	return m
}

// consumerMetrics are the children of Metrics bound to one consumer's labels,
// looked up once so that the hot path does not hash label values. Every
// method is a no-op on a consumerMetrics created from a nil *Metrics.
type consumerMetrics struct {
	m            *Metrics
	stage, topic string
	consumed     prometheus.Counter
	inserted     prometheus.Counter
	sinkRetries  prometheus.Counter
	batchRows    prometheus.Observer
	batchBytes   prometheus.Observer
	insertDur    prometheus.Observer
	commitDur    prometheus.Observer
	lagParts     map[int]bool // partitions with a lag series; used by the lag poller only
}

func (m *Metrics) bind(stage, topic string) *consumerMetrics {
	cm := &consumerMetrics{m: m, stage: stage, topic: topic}
	if m == nil {
		return cm
	}
	cm.consumed = m.consumed.WithLabelValues(stage, topic)
	cm.inserted = m.inserted.WithLabelValues(stage, topic)
	cm.sinkRetries = m.sinkRetries.WithLabelValues(stage, topic)
	cm.batchRows = m.batchRows.WithLabelValues(stage, topic)
	cm.batchBytes = m.batchBytes.WithLabelValues(stage, topic)
	cm.insertDur = m.insertDur.WithLabelValues(stage, topic)
	cm.commitDur = m.commitDur.WithLabelValues(stage, topic)
	return cm
}

func (cm *consumerMetrics) addConsumed(n int) {
	if cm.m != nil {
		cm.consumed.Add(float64(n))
	}
}

func (cm *consumerMetrics) addInserted(n int) {
	if cm.m != nil {
		cm.inserted.Add(float64(n))
	}
}

func (cm *consumerMetrics) sinkRetry() {
	if cm.m != nil {
		cm.sinkRetries.Inc()
	}
}

func (cm *consumerMetrics) deadLettered(reason string) {
	if cm.m != nil {
		cm.m.deadLettered.WithLabelValues(cm.stage, cm.topic, reason).Inc()
	}
}

func (cm *consumerMetrics) skipped(reason string) {
	if cm.m != nil {
		cm.m.skipped.WithLabelValues(cm.stage, cm.topic, reason).Inc()
	}
}

func (cm *consumerMetrics) error(op string) {
	if cm.m != nil {
		cm.m.errors.WithLabelValues(cm.stage, cm.topic, op).Inc()
	}
}

func (cm *consumerMetrics) batch(rows, bytes int) {
	if cm.m != nil {
		cm.batchRows.Observe(float64(rows))
		cm.batchBytes.Observe(float64(bytes))
	}
}

func (cm *consumerMetrics) insert(seconds float64) {
	if cm.m != nil {
		cm.insertDur.Observe(seconds)
	}
}

func (cm *consumerMetrics) commit(seconds float64) {
	if cm.m != nil {
		cm.commitDur.Observe(seconds)
	}
}

// setLag replaces the lag series of this consumer's topic with lags
// (partition -> messages), read at at. Partitions that disappeared are
// deleted.
func (cm *consumerMetrics) setLag(lags map[int]int64, at time.Time) {
	if cm.m == nil {
		return
	}
	for p, l := range lags {
		cm.m.lag.WithLabelValues(cm.stage, cm.topic, strconv.Itoa(p)).Set(float64(l))
	}
	for p := range cm.lagParts {
		if _, ok := lags[p]; !ok {
			cm.m.lag.DeleteLabelValues(cm.stage, cm.topic, strconv.Itoa(p))
		}
	}
	cm.lagParts = make(map[int]bool, len(lags))
	for p := range lags {
		cm.lagParts[p] = true
	}
	cm.m.lagUpdated.WithLabelValues(cm.stage, cm.topic).Set(float64(at.UnixNano()) / 1e9)
}

// dropLag removes this consumer's lag series, which are no longer known
// (reads failing), and keeps the time of the last successful read.
func (cm *consumerMetrics) dropLag() {
	if cm.m == nil {
		return
	}
	for p := range cm.lagParts {
		cm.m.lag.DeleteLabelValues(cm.stage, cm.topic, strconv.Itoa(p))
	}
	cm.lagParts = nil
}

// clearLag removes this consumer's lag series and its last read's time
// (when it stops).
func (cm *consumerMetrics) clearLag() {
	if cm.m == nil {
		return
	}
	cm.dropLag()
	cm.m.lagUpdated.DeleteLabelValues(cm.stage, cm.topic)
}
