package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/spf13/cobra"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/sink"
)

// openStore connects to the configured ClickHouse, or to the embedded one of
// a running `trace run`.
func openStore(ctx context.Context, cfg config.Config) (*sink.Store, error) {
	c := cfg.ClickHouse
	c.Addr = cfg.ClickHouseAddr()
	st, err := sink.Open(ctx, c, slog.Default())
	if err != nil {
		if len(cfg.ClickHouse.Addr) == 0 {
			return nil, fmt.Errorf("%w\n(no clickhouse.addr configured: is `trace run` running with its embedded ClickHouse on %s?)", err, c.Addr[0])
		}
		return nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// connectBus connects to the configured NATS, or the embedded one.
func connectBus(ctx context.Context, cfg config.Config) (*bus.Bus, error) {
	n := cfg.NATS
	n.URL = cfg.NATSURL()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := bus.Connect(cctx, n, "trace-cli")
	if err != nil && cfg.NATS.URL == "" {
		return nil, fmt.Errorf("%w\n(no nats.url configured: is `trace run` running with its embedded NATS on %s?)", err, n.URL)
	}
	return b, err
}

// rolloutProducer is where trace replay and trace simulate publish rollouts:
// the brokers and topic of their --brokers and --topic flags when given
// (cmd's flags of those names), else the configured ones (kafka.brokers, or
// the embedded broker's kafka.embedded_addr; kafka.rollouts_topic).
type rolloutProducer struct {
	brokers []string
	topic   string
	// embedded: the brokers are kafka.embedded_addr, a running `trace
	// run`'s broker, for the hint of a failure to reach it.
	embedded bool
}

func newRolloutProducer(cmd *cobra.Command, cfg config.Config, brokers []string, topic string) (rolloutProducer, error) {
	p := rolloutProducer{brokers: cfg.KafkaBrokers(), topic: cfg.Kafka.RolloutsTopic, embedded: len(cfg.Kafka.Brokers) == 0}
	if cmd.Flags().Changed("brokers") {
		if len(brokers) == 0 {
			return p, errors.New("--brokers: at least one broker is needed")
		}
		p.brokers, p.embedded = brokers, false
	}
	if cmd.Flags().Changed("topic") {
		if topic == "" {
			return p, errors.New("--topic must not be empty")
		}
		if err := config.CheckTopic("--topic", topic); err != nil {
			return p, err
		}
		p.topic = topic
	}
	return p, nil
}

// kafkaWriter is the producer of trace's client commands (replay,
// simulate, labels import) on brokers and topic: ingest.NewKafkaWriter with
// the batch size of trace's other producers (kafka.max_message_bytes:
// WriterBatchBytes) and the configured TLS and SASL (kafka.tls,
// kafka.sasl). The caller closes it.
func kafkaWriter(cfg config.Config, brokers []string, topic string) (*kafka.Writer, error) {
	d, err := app.KafkaDialer(cfg.Kafka)
	if err != nil {
		return nil, err
	}
	w := ingest.NewKafkaWriter(brokers, topic)
	w.BatchBytes = int64(cfg.Kafka.WriterBatchBytes())
	w.Transport = app.KafkaTransport(d)
	return w, nil
}

// hint explains a failure to reach the embedded broker's address (no
// kafka.brokers is configured): trace run may not be running, or its broker
// listen elsewhere.
func (p rolloutProducer) hint(err error) error {
	var ne *net.OpError
	if !p.embedded || !errors.As(err, &ne) {
		return err
	}
	return fmt.Errorf("%w\n(no kafka.brokers configured: is `trace run` running with its embedded broker on %s? or set kafka.brokers, or kafka.embedded_addr if it listens elsewhere)", err, p.brokers[0])
}

// dictWriter is what a command needs to store and announce dictionaries: the
// store, the bus, and the stored versions. Close releases them.
type dictWriter struct {
	st  *sink.Store
	bus *bus.Bus
	reg *analyzer.Registry
}

func openDictWriter(ctx context.Context, cfg config.Config) (*dictWriter, error) {
	st, err := openStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	b, err := connectBus(ctx, cfg)
	if err != nil {
		st.Close()
		return nil, err
	}
	reg := analyzer.NewRegistry()
	if err := reg.Load(ctx, st); err != nil {
		b.Close()
		st.Close()
		return nil, err
	}
	return &dictWriter{st: st, bus: b, reg: reg}, nil
}

// apply stores and announces d (see analyzer.Registry.Apply).
func (w *dictWriter) apply(ctx context.Context, d *analyzer.Dictionary) (*analyzer.Dictionary, error) {
	return w.reg.Apply(ctx, w.st, w.bus, d)
}

// applyAt stores and announces d under its own version, unchanged: label
// imports name the dictionary version their events carry.
func (w *dictWriter) applyAt(ctx context.Context, d *analyzer.Dictionary) error {
	if err := d.Validate(); err != nil {
		return err
	}
	if d.CreatedAt.IsZero() {
		d.CreatedAt = time.Now().UTC()
	}
	if err := w.st.SaveDictionary(ctx, analyzer.DictionaryRow(d)); err != nil {
		return err
	}
	w.reg.Put(d)
	return w.bus.AnnounceDictionary(ctx, d.Environment, d.AgentVersion, d.Version)
}

func (w *dictWriter) Close() {
	w.bus.Close()
	w.st.Close()
}

// knownEnvironment fails when env has neither stored rollouts nor labels
// (an import of external labels stores no rollouts) while others have,
// naming them: a mistyped --env is told, not answered "nothing to
// report". An empty store passes (nothing is stored yet at all).
func knownEnvironment(ctx context.Context, st *sink.Store, env string) error {
	if env == "" {
		return nil
	}
	keys, err := st.RolloutKeys(ctx)
	if err != nil {
		return err
	}
	labeled, err := st.Watermarks(ctx, nil)
	if err != nil {
		return err
	}
	return checkEnvironment(env, keys, labeled)
}

// checkEnvironment is knownEnvironment's check on what it read: the
// (environment, agent version)s with rollouts and the labeled cohorts.
func checkEnvironment(env string, keys [][2]string, labeled map[sink.Cohort]time.Time) error {
	if env == "" {
		return nil
	}
	var envs []string
	for _, k := range keys {
		envs = append(envs, k[0])
	}
	for c := range labeled {
		envs = append(envs, c.Environment)
	}
	if slices.Contains(envs, env) {
		return nil
	}
	if len(envs) == 0 {
		return nil
	}
	slices.Sort(envs)
	return fmt.Errorf("nothing stored for environment %q (no rollouts, no labels); the environments with data: %s", env, strings.Join(slices.Compact(envs), ", "))
}

// addJSONFlag gives a command with --format the --json of the commands
// without one (train list, adapters list, env show): the same as
// --format json.
func addJSONFlag(cmd *cobra.Command) {
	cmd.Flags().Bool("json", false, "the same as --format json")
}

// formatOrJSON is the output format: json when --json was given, else
// --format's.
func formatOrJSON(cmd *cobra.Command, format string) string {
	if j, _ := cmd.Flags().GetBool("json"); j {
		return "json"
	}
	return format
}
