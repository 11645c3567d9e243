package analyzer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// BenchmarkTriggerLatency measures the time from producing the label event
// that makes a capability cross the thresholds to the synthesis request on
// NATS, while label events stream at a sustained 2,000 per second through
// Kafka → ClickHouse → evaluator. Each cohort receives 10 successes (PRESENT)
// and then failures (LACKING); its 20th failure reaches min_failures and
// makes the capability cross. Run:
//
//	go test -run '^$' -bench TriggerLatency -benchtime 1x ./analyzer/
//
// With TRACE_BENCH_STORED_DB=name it runs on that existing database of the
// test server, as it is (e.g. trace_bench_query, kept by `trace bench
// query --sizes 10M --keep`: 10M simulated rollouts and 50M labels over 90
// days), with the evaluator's periodic tick over every stored cohort at the
// production interval (10 s) in the same run; the benchmark's own cohorts
// (environment "bench-<time>") are added to it.
func BenchmarkTriggerLatency(b *testing.B) {
	const (
		rate        = 2000 // labels per second
		seconds     = 20
		perCohort   = 30 // 10 successes + 20 failures
		active      = 40 // cohorts interleaved at any time
		minFailures = 20
	)
	for range b.N {
		brokers := testenv.Kafka(b)
		ch := testenv.ClickHouse(b)
		database, interval, env := ch.Database, time.Minute, "bench"
		if db := os.Getenv("TRACE_BENCH_STORED_DB"); db != "" {
			database, interval = db, 10*time.Second
			env = fmt.Sprintf("bench-%d", time.Now().Unix())
		}
		ns := testenv.NATS(b)
		topic := testenv.UniqueTopic(b, "labels")
		testenv.CreateTopic(b, brokers, topic, 4)
		testenv.CreateTopic(b, brokers, topic+".dlq", 1)
		ctx, cancel := context.WithCancel(context.Background())
		st, err := sink.Open(ctx, sink.Config{Addr: []string{ch.Addr}, Database: database}, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Migrate(ctx); err != nil {
			b.Fatal(err)
		}
		stored, err := st.CountRollouts(ctx)
		if err != nil {
			b.Fatal(err)
		}
		_, storedLabels, err := st.CountLabels(ctx)
		if err != nil {
			b.Fatal(err)
		}
		bs, err := bus.Connect(ctx, bus.Config{URL: ns.URL()}, "bench")
		if err != nil {
			b.Fatal(err)
		}
		ev := analyzer.NewEvaluator(analyzer.EvalConfig{K: 1, N: 1, MinFailures: minFailures, Interval: interval,
			Settle: 100 * time.Millisecond, MaxDelay: 400 * time.Millisecond}, st, app.BusPublisher{Bus: bs}, analyzer.NewRegistry(), nil, nil)
		cons, err := stream.NewConsumer(stream.Config{Brokers: brokers, Topic: topic, GroupID: "bench", Stage: "labels",
			BatchRows: 2000, BatchTimeout: 100 * time.Millisecond}, ingest.DecodeLabel, &analyzer.LabelEventSink{Store: st, Evaluator: ev}, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		// As the analyze role starts: the trigger state of what is stored.
		if err := ev.Recover(ctx); err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); cons.Run(ctx) }()
		go func() { defer wg.Done(); ev.Run(ctx) }()

		// The stream: cohort c's events in order; `active` cohorts interleaved.
		total := rate * seconds
		cohorts := total / perCohort
		type item struct {
			ev      schemas.LabelEvent
			cohort  int
			crosses bool
		}
		stream := make([]item, 0, total)
		next := make([]int, cohorts)
		for base := 0; base < cohorts; base += active {
			for step := 0; step < perCohort; step++ {
				for c := base; c < min(base+active, cohorts); c++ {
					i := next[c]
					next[c]++
					ok := i < 10
					l := schemas.LabelLacking
					if ok {
						l = schemas.LabelPresent
					}
					stream = append(stream, item{cohort: c, crosses: i == 10+minFailures-1, ev: schemas.LabelEvent{
						RolloutID: fmt.Sprintf("r%d-%d", c, i), Environment: env, AgentVersion: fmt.Sprintf("v%d", c),
						DictionaryVersion: 1, Capability: "cap_crossing", Run: 0, Label: l, Success: ok, Reward: map[bool]float64{true: 1}[ok],
						Source: schemas.SourceExternal, TS: time.Now()}})
				}
			}
		}
		var mu sync.Mutex
		produced := map[string]time.Time{} // agent version -> time its crossing event was produced
		latencies := map[string]time.Duration{}
		oc, err := bs.JS.OrderedConsumer(ctx, bus.StreamSynthesis, jetstream.OrderedConsumerConfig{})
		if err != nil {
			b.Fatal(err)
		}
		cc, err := oc.Consume(func(m jetstream.Msg) {
			now := time.Now()
			var req schemas.SynthesisRequest
			if json.Unmarshal(m.Data(), &req) != nil {
				return
			}
			// Only this run's cohorts: on a kept database the cohorts of
			// earlier runs (other environments, the same agent versions)
			// are evaluated too, and their requests are not this run's.
			if req.Environment != env {
				return
			}
			mu.Lock()
			if _, done := latencies[req.AgentVersion]; !done {
				if t0, ok := produced[req.AgentVersion]; ok {
					latencies[req.AgentVersion] = now.Sub(t0)
				}
			}
			mu.Unlock()
		})
		if err != nil {
			b.Fatal(err)
		}
		w := &kafka.Writer{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{}, Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
			BatchTimeout: time.Millisecond, BatchSize: 100}
		b.ResetTimer()
		start := time.Now()
		const chunk = 20 // 20 events every 10 ms = 2,000/s
		for i := 0; i < len(stream); i += chunk {
			if d := time.Until(start.Add(time.Duration(i) * time.Second / rate)); d > 0 {
				time.Sleep(d)
			}
			end := min(i+chunk, len(stream))
			msgs := make([]kafka.Message, 0, chunk)
			t0 := time.Now()
			for _, it := range stream[i:end] {
				v, _ := json.Marshal(it.ev)
				msgs = append(msgs, kafka.Message{Key: []byte(it.ev.Key()), Value: v})
				if it.crosses {
					mu.Lock()
					produced[it.ev.AgentVersion] = t0
					mu.Unlock()
				}
			}
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				b.Fatal(err)
			}
		}
		elapsed := time.Since(start)
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			n := len(latencies)
			mu.Unlock()
			if n >= cohorts || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		b.StopTimer()
		cc.Stop()
		w.Close()
		cancel()
		wg.Wait()
		bs.Close()
		st.Close()

		var ls []time.Duration
		for _, l := range latencies {
			ls = append(ls, l)
		}
		sort.Slice(ls, func(i, j int) bool { return ls[i] < ls[j] })
		if len(ls) < cohorts {
			b.Fatalf("%d of %d capabilities fired", len(ls), cohorts)
		}
		pct := func(p float64) time.Duration { return ls[min(len(ls)-1, int(p*float64(len(ls))))] }
		b.ReportMetric(float64(pct(0.50).Milliseconds()), "p50-ms")
		b.ReportMetric(float64(pct(0.99).Milliseconds()), "p99-ms")
		b.ReportMetric(float64(len(stream))/elapsed.Seconds(), "labels/s")
		fmt.Printf("trigger latency at %.0f labels/s sustained for %s, %d rollouts and %d labels stored before: %d triggers, p50 %s, p99 %s, max %s (target p99 < 2s)\n",
			float64(len(stream))/elapsed.Seconds(), elapsed.Round(time.Millisecond), stored, storedLabels, len(ls), pct(0.5).Round(time.Millisecond),
			pct(0.99).Round(time.Millisecond), ls[len(ls)-1].Round(time.Millisecond))
	}
}
