package main

import (
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/config"
)

// configFlags are the flags every command that reads the configuration has.
type configFlags struct {
	file string
	sets []string
}

func (f *configFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.file, "config", "c", os.Getenv("TRACE_CONFIG"), "YAML configuration file (env TRACE_CONFIG)")
	cmd.Flags().StringArrayVar(&f.sets, "set", nil, "override one setting, e.g. --set kafka.brokers=k1:9092,k2:9092 (repeatable)")
}

func (f *configFlags) load() (config.Config, error) { return config.Load(f.file, f.sets) }

func init() {
	var cf configFlags
	var roles []string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the streaming roles: ingest, analyze, serve",
		Long: `run starts trace's long-running roles in one process:

  ingest   consume trace.rollouts, validate (invalid → trace.rollouts.dlq), store in ClickHouse
  analyze  label rollouts (rules or llm), consume external labels (trace.labels),
           keep the window statistics and publish synthesis requests on NATS JetStream
  serve    the dashboard, JSON API, /metrics, /healthz and /readyz

Nothing configured means everything embedded: a Kafka-protocol broker on
127.0.0.1:9092 and NATS with JetStream under ./data, and a local ClickHouse
server started from PATH. Production points kafka.brokers, clickhouse.addr and
nats.url at real clusters and runs roles as separate replicas.

Configuration: a YAML file (--config), then TRACE_* environment variables with
"__" between levels (TRACE_CLICKHOUSE__PASSWORD=...), then --set flags.
SIGTERM drains every role (the batch in flight is committed) and exits 0.`,
		Example: `  trace run
  trace run --roles ingest --set kafka.brokers=kafka:9092 --set clickhouse.addr=clickhouse:9000
  trace config print`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(roles) > 0 {
				cf.sets = append(cf.sets, "roles="+joinComma(roles))
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			a, err := app.Start(ctx, cfg, slog.Default())
			if err != nil {
				return err
			}
			defer a.Close()
			return a.Run(ctx)
		},
	}
	cf.add(cmd)
	cmd.Flags().StringSliceVar(&roles, "roles", nil, "roles to run (default all): ingest,analyze,serve")
	rootCmd.AddCommand(cmd)

	var pcf configFlags
	cfgCmd := &cobra.Command{Use: "config", Short: "Inspect the configuration"}
	printCmd := &cobra.Command{
		Use:   "print",
		Short: "Print the effective configuration with secrets redacted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := pcf.load()
			if err != nil {
				return err
			}
			b, err := yaml.Marshal(configYAML(cfg.Redacted()))
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	pcf.add(printCmd)
	cfgCmd.AddCommand(printCmd)
	rootCmd.AddCommand(cfgCmd)
}

func joinComma(s []string) string { return strings.Join(s, ",") }

// configYAML renders the config with its koanf key names.
func configYAML(c config.Config) map[string]any {
	k := map[string]any{}
	k["data_dir"] = c.DataDir
	k["roles"] = c.Roles
	k["kafka"] = map[string]any{
		"brokers": c.Kafka.Brokers, "embedded_addr": c.Kafka.EmbeddedAddr, "rollouts_topic": c.Kafka.RolloutsTopic,
		"labels_topic": c.Kafka.LabelsTopic, "dlq_topic": c.Kafka.DLQTopic, "ingest_group": c.Kafka.IngestGroup,
		"analyze_group": c.Kafka.AnalyzeGroup, "labels_group": c.Kafka.LabelsGroup, "batch_rows": c.Kafka.BatchRows,
		"batch_timeout": c.Kafka.BatchTimeout.String(), "max_message_bytes": c.Kafka.MaxBytes, "analyze_dead_letters": c.Kafka.AnalyzeDeadLetters,
		"tls":  map[string]any{"enabled": c.Kafka.TLS.Enabled, "ca_file": c.Kafka.TLS.CAFile, "cert_file": c.Kafka.TLS.CertFile, "key_file": c.Kafka.TLS.KeyFile, "skip_verify": c.Kafka.TLS.SkipVerify},
		"sasl": map[string]any{"mechanism": c.Kafka.SASL.Mechanism, "username": c.Kafka.SASL.Username, "password": c.Kafka.SASL.Password},
	}
	ch := c.ClickHouse
	k["clickhouse"] = map[string]any{"addr": ch.Addr, "database": ch.Database, "user": ch.User, "password": ch.Password,
		"tls": ch.TLS, "tls_skip_verify": ch.TLSSkipVerify, "dial_timeout": ch.DialTimeout.String(), "max_open_conns": ch.MaxOpenConns, "retention_days": ch.RetentionDays}
	n := c.NATS
	k["nats"] = map[string]any{"url": n.URL, "creds_file": n.CredsFile, "token": n.Token, "tls_ca": n.TLSCA, "tls_cert": n.TLSCert, "tls_key": n.TLSKey, "duplicates": n.Duplicates.String()}
	an := c.Analyzer
	k["analyzer"] = map[string]any{"labeler": an.Labeler, "rho": an.Rho, "delta": an.Delta, "k": an.K, "n": an.N, "window": an.Window.String(),
		"window_rollouts": an.WindowRollouts, "min_failures": an.MinFailures, "rearm_after": an.RearmAfter.String(), "interval": an.Interval.String(),
		"sample_failed": an.SampleFailed, "sample_passed": an.SamplePassed, "concurrency": an.Concurrency,
		"settle": an.Settle.String(), "max_delay": an.MaxDelay.String(), "unexplained_threshold": an.UnexplainedThreshold,
		"discovery_cooldown": an.DiscoveryCooldown.String(), "discovery_sample": an.DiscoverySample}
	l := c.LLM
	k["llm"] = map[string]any{"base_url": l.BaseURL, "model": l.Model, "api_key": l.APIKey, "timeout": l.Timeout.String(), "concurrency": l.Concurrency,
		"rate_per_second": l.RatePerSecond, "runs": l.Runs, "structured_output": l.Structured}
	k["http"] = map[string]any{"addr": c.HTTP.Addr, "bearer_token": c.HTTP.BearerToken}
	k["dictionaries"] = c.Dictionary
	k["embedded"] = map[string]any{"clickhouse_port": c.Embedded.ClickHousePort, "clickhouse_http_port": c.Embedded.ClickHouseHTTPPort, "nats_port": c.Embedded.NATSPort}
	return k
}
