package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/spf13/cobra"
	"golang.org/x/time/rate"

	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

func init() { rootCmd.AddCommand(newSimulateCmd()) }

func newSimulateCmd() *cobra.Command {
	var (
		cf         configFlags
		kafkaFlag  bool
		seed       uint64
		rollouts   int
		out        string
		brokers    []string
		topic      string
		rateFlag   string
		fleetFile  string
		printFleet bool
		startFlag  string
		interval   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "simulate [--seed N] [--rollouts N] [--out FILE.jsonl | --kafka | --brokers HOST:PORT,... [--topic NAME]] [--config FILE] [--set key=value]... [--rate N/s] [--fleet FILE.yaml]",
		Short: "Generate rollouts of a simulated agent fleet with planted capability deficits",
		Long: `simulate generates realistic rollouts of customer-service agents on two
τ²-style tool environments, sim-airline and sim-retail: multi-turn
conversations with a system policy, read tools (user, reservation / order,
flight search, product catalog), a confirmation with the user, write tools
(cancel, update, book, return, exchange, …), tool results as JSON text with
realistic ids, and graded rewards with the grader's reasons.

Each agent version of the fleet has capability deficits planted at a rate:
precondition_verification (writes without reading the record first),
argument_grounding (an identifier argument that appears nowhere before),
multi_step_completion (stops before all required writes are done),
tool_error_recovery (gives up after a tool error) and user_confirmation
(writes without asking). An episode that exercises a planted deficit fails
with probability 0.9; any other fails with probability 0.1. Every rollout
carries its ground truth in metadata.sim (needed, drawn, planted, lacking,
labels), and metadata.required_actions lists the task's gold tool calls.

The default fleet (see --print-fleet) is support-bot 1.4.0 on sim-airline
(precondition_verification 0.45, multi_step_completion 0.5), 1.5.0 on
sim-retail (argument_grounding 0.5) and 1.5.0 on sim-airline (no deficit).
--fleet reads another fleet in the same YAML format.

Output: rollout JSONL (one rollout/v1 object per line) to --out (default
"-", standard output), or, with --kafka or --brokers, Kafka messages on the
rollouts topic keyed by "<environment>/<agent version>", zstd-compressed
and acknowledged by all in-sync replicas. Kafka is set by trace's
configuration, loaded as for trace run (--config or TRACE_CONFIG, TRACE_*
environment variables, --set; a bad setting fails at start, naming it): kafka.brokers
(none: the embedded broker of a running trace run, kafka.embedded_addr),
kafka.rollouts_topic, kafka.tls and kafka.sasl; --brokers and --topic
override kafka.brokers and kafka.rollouts_topic. --rate limits the output to N rollouts per second (also
"N/s", "N/m", "N/h"); by default rollouts are produced as fast as possible.

The output is a pure function of the seed and the flags: the same seed gives
byte-identical JSONL. Rollout i starts at --start + i × --interval (plus up
to 20 s of jitter); --start now uses the current time instead.

A summary (rollouts per cohort, success rate, planted deficits) goes to
standard error.`,
		Example: `  # 1,000 rollouts of the default fleet to a file
  trace simulate --seed 1 --rollouts 1000 --out rollouts.jsonl

  # then replay the file onto Kafka (trace replay validates every line)
  trace replay rollouts.jsonl

  # stream to Kafka (kafka.brokers, or a running trace run's embedded broker)
  # at 20 rollouts per second until interrupted
  trace simulate --kafka --rollouts 0 --rate 20/s --start now --interval 50ms

  # to the cluster and topic of a configuration file, with its TLS and SASL
  trace simulate --kafka --config trace.yaml --rollouts 5000

  # to other brokers and topic than the configuration's
  trace simulate --brokers kafka-1:9092 --topic trace.rollouts.staging --rollouts 5000

  # a custom fleet
  trace simulate --print-fleet > fleet.yaml   # edit it, then
  trace simulate --fleet fleet.yaml --rollouts 5000 --out custom.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fleet := simulate.DefaultFleet()
			if fleetFile != "" {
				b, err := os.ReadFile(fleetFile)
				if err != nil {
					return fmt.Errorf("--fleet: %w", err)
				}
				if fleet, err = simulate.ParseFleet(b); err != nil {
					return fmt.Errorf("--fleet %s: %w", fleetFile, err)
				}
			}
			if printFleet {
				b, err := simulate.MarshalFleet(fleet)
				if err != nil {
					return err
				}
				_, err = cmd.OutOrStdout().Write(b)
				return err
			}
			if rollouts < 0 {
				return fmt.Errorf("--rollouts must be >= 0 (0 means until interrupted), got %d", rollouts)
			}
			perSec, err := parseRate(rateFlag)
			if err != nil {
				return fmt.Errorf("--rate: %w", err)
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			toKafka := kafkaFlag || cmd.Flags().Changed("brokers")
			if toKafka && cmd.Flags().Changed("out") {
				return errors.New("--out and --kafka (or --brokers) are exclusive: write a file or publish to Kafka")
			}
			var p rolloutProducer
			if toKafka {
				if p, err = newRolloutProducer(cmd, cfg, brokers, topic); err != nil {
					return err
				}
			}
			sim := simulate.Config{Seed: seed, Fleet: fleet, Rollouts: rollouts, Interval: interval}
			switch startFlag {
			case "", "default":
			case "now":
				sim.Start = time.Now().UTC().Truncate(time.Millisecond)
			default:
				t, err := time.Parse(time.RFC3339, startFlag)
				if err != nil {
					return fmt.Errorf("--start: want now or an RFC 3339 time: %w", err)
				}
				sim.Start = t
			}
			if err := sim.Validate(); err != nil {
				return err
			}
			// Rollouts outside the times the store holds would all be
			// dead-lettered by ingest.
			if last := sim.Start.Add(time.Duration(max(sim.Rollouts, 1)) * sim.Interval); !sim.Start.IsZero() &&
				(!sink.InDateTimeRange(sim.Start) || !sink.InDateTimeRange(last)) {
				return fmt.Errorf("--start: the rollouts would run from %s to %s, outside %s..%s, the times the store holds",
					sim.Start.Format(time.RFC3339), last.Format(time.RFC3339), sink.MinDateTime.Format(time.RFC3339), sink.MaxDateTime.Format(time.RFC3339))
			}

			var sink rolloutSink
			dest := ""
			if toKafka {
				w, err := kafkaWriter(cfg, p.brokers, p.topic)
				if err != nil {
					return err
				}
				sink = &kafkaSink{w: w}
				dest = fmt.Sprintf("Kafka %s on %s", p.topic, strings.Join(p.brokers, ","))
			} else {
				var f io.WriteCloser = nopCloser{cmd.OutOrStdout()}
				dest = "standard output"
				if out != "-" {
					if f, err = os.Create(out); err != nil {
						return err
					}
					dest = out
				}
				sink = &fileSink{f: f, w: bufio.NewWriterSize(f, 1<<20)}
			}
			sum, err := runSimulation(cmd.Context(), simulate.New(sim), sink, perSec)
			if cerr := sink.Close(); err == nil && cerr != nil {
				err = cerr
			}
			sum.delivered = sum.written
			if ks, ok := sink.(*kafkaSink); ok {
				sum.delivered = ks.sent // acknowledged by Kafka, not just generated
			}
			sum.print(cmd.ErrOrStderr(), dest)
			if err != nil && !errors.Is(err, context.Canceled) {
				if sum.delivered == 0 {
					err = p.hint(err)
				}
				return &exitError{code: 1, err: fmt.Errorf("simulate: %w", err)}
			}
			return nil
		},
	}
	cf.add(cmd)
	f := cmd.Flags()
	f.Uint64Var(&seed, "seed", 1, "random seed; the same seed gives the same rollouts")
	f.IntVar(&rollouts, "rollouts", 1000, "rollouts to generate; 0 means until interrupted")
	f.StringVar(&out, "out", "-", `rollout JSONL file to write ("-" is standard output)`)
	f.BoolVar(&kafkaFlag, "kafka", false, "publish to Kafka (kafka.brokers, or the embedded broker on kafka.embedded_addr) instead of writing JSONL")
	f.StringSliceVar(&brokers, "brokers", nil, "publish to these Kafka bootstrap brokers (comma separated) instead of kafka.brokers; implies --kafka")
	f.StringVar(&topic, "topic", "", "Kafka topic, with --kafka or --brokers (default kafka.rollouts_topic)")
	f.StringVar(&rateFlag, "rate", "", `at most this many rollouts per second ("20", "20/s", "600/m", "1000/h"); empty means unlimited`)
	f.StringVar(&fleetFile, "fleet", "", "fleet YAML file (default: the built-in demo fleet; see --print-fleet)")
	f.BoolVar(&printFleet, "print-fleet", false, "print the fleet as YAML and exit")
	f.StringVar(&startFlag, "start", "", `start time of rollout 0: an RFC 3339 time or "now" (default `+simulate.DefaultStart.Format(time.RFC3339)+`)`)
	f.DurationVar(&interval, "interval", 30*time.Second, "time between the starts of consecutive rollouts")
	return cmd
}

// parseRate reads "N", "N/s", "N/m" or "N/h" as rollouts per second; ""
// and "0" mean unlimited (0).
func parseRate(s string) (float64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	num, unit, _ := strings.Cut(s, "/")
	n, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil || !(n >= 0) || math.IsInf(n, 0) { // NaN fails n >= 0
		return 0, fmt.Errorf("%q: want a non-negative number of rollouts per second, e.g. 20 or 20/s", s)
	}
	switch strings.TrimSpace(unit) {
	case "", "s", "sec":
	case "m", "min":
		n /= 60
	case "h":
		n /= 3600
	default:
		return 0, fmt.Errorf("%q: unknown unit %q (want s, m or h)", s, unit)
	}
	return n, nil
}

// rolloutSink receives encoded rollouts.
type rolloutSink interface {
	Write(ctx context.Context, r *schemas.Rollout, b []byte) error
	Flush(ctx context.Context) error
	Close() error
}

type fileSink struct {
	f io.WriteCloser
	w *bufio.Writer
}

func (s *fileSink) Write(_ context.Context, _ *schemas.Rollout, b []byte) error {
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	return s.w.WriteByte('\n')
}

func (s *fileSink) Flush(context.Context) error { return s.w.Flush() }

func (s *fileSink) Close() error {
	err := s.w.Flush()
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return err
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// kafkaSink batches messages: a batch is written when it holds 500
// messages or when Flush is called (the rate limiter flushes before it
// waits, so a slow stream is not held back). sent counts the messages
// Kafka acknowledged.
type kafkaSink struct {
	w     *kafka.Writer
	batch []kafka.Message
	sent  int
}

func (s *kafkaSink) Write(ctx context.Context, r *schemas.Rollout, b []byte) error {
	s.batch = append(s.batch, kafka.Message{Key: []byte(r.Key()), Value: b,
		Headers: []kafka.Header{{Key: "source", Value: []byte("simulate")}}})
	if len(s.batch) >= 500 {
		return s.Flush(ctx)
	}
	return nil
}

func (s *kafkaSink) Flush(ctx context.Context) error {
	if len(s.batch) == 0 {
		return nil
	}
	err := s.w.WriteMessages(ctx, s.batch...)
	var werrs kafka.WriteErrors
	switch {
	case err == nil:
		s.sent += len(s.batch)
	case errors.As(err, &werrs) && len(werrs) == len(s.batch):
		s.sent += len(werrs) - werrs.Count()
	}
	s.batch = s.batch[:0]
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	return nil
}

func (s *kafkaSink) Close() error {
	err := s.Flush(context.Background())
	if cerr := s.w.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("kafka: %w", cerr)
	}
	return err
}

type simCohort struct {
	rollouts, successes int
	planted             map[string]int
}

type simSummary struct {
	written   int // generated and handed to the sink
	delivered int // of them, written out (to Kafka: acknowledged)
	cohorts   map[string]*simCohort
	elapsed   time.Duration
}

func runSimulation(ctx context.Context, g *simulate.Generator, sink rolloutSink, perSec float64) (*simSummary, error) {
	sum := &simSummary{cohorts: map[string]*simCohort{}}
	began := time.Now()
	defer func() { sum.elapsed = time.Since(began) }()
	var lim *rate.Limiter
	if perSec > 0 {
		lim = rate.NewLimiter(rate.Limit(perSec), max(1, int(perSec/10)))
	}
	for r := g.Next(); r != nil; r = g.Next() {
		if err := ctx.Err(); err != nil {
			return sum, errors.Join(err, sink.Flush(context.Background()))
		}
		if lim != nil && !lim.Allow() {
			// Out of tokens: send what is pending, then wait for one.
			if err := sink.Flush(ctx); err != nil {
				return sum, err
			}
			if err := lim.Wait(ctx); err != nil {
				return sum, errors.Join(context.Canceled, sink.Flush(context.Background()))
			}
		}
		b, err := json.Marshal(r)
		if err != nil {
			return sum, err
		}
		werr := sink.Write(ctx, r, b)
		sum.written++
		c := sum.cohorts[r.Key()]
		if c == nil {
			c = &simCohort{planted: map[string]int{}}
			sum.cohorts[r.Key()] = c
		}
		c.rollouts++
		if r.Succeeded() {
			c.successes++
		}
		if t, ok := simulate.TruthOf(r); ok {
			for _, p := range t.Planted {
				c.planted[p]++
			}
		}
		if werr != nil {
			return sum, werr
		}
	}
	return sum, sink.Flush(ctx)
}

func (s *simSummary) print(w io.Writer, dest string) {
	if s.delivered == s.written {
		fmt.Fprintf(w, "simulate: %d rollouts to %s in %s\n", s.written, dest, s.elapsed.Round(time.Millisecond))
	} else {
		fmt.Fprintf(w, "simulate: %d of %d rollouts to %s in %s\n", s.delivered, s.written, dest, s.elapsed.Round(time.Millisecond))
	}
	keys := make([]string, 0, len(s.cohorts))
	for k := range s.cohorts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		c := s.cohorts[k]
		caps := make([]string, 0, len(c.planted))
		for p := range c.planted {
			caps = append(caps, p)
		}
		sort.Strings(caps)
		var planted []string
		for _, p := range caps {
			planted = append(planted, fmt.Sprintf("%s %d", p, c.planted[p]))
		}
		if len(planted) == 0 {
			planted = []string{"none"}
		}
		fmt.Fprintf(w, "  %-22s %5d rollouts, success %.3f, planted: %s\n", k, c.rollouts, float64(c.successes)/float64(c.rollouts), strings.Join(planted, ", "))
	}
}
