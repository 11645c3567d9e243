package main

import (
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

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
		Short: "Run the streaming roles: ingest, analyze, synthesize, adapt, serve, route",
		Long: `run starts trace's long-running roles in one process:

  ingest   consume trace.rollouts, validate (invalid → trace.rollouts.dlq), store in ClickHouse
  analyze  label rollouts (rules or llm), consume external labels (trace.labels),
           keep the window statistics and publish synthesis requests on NATS JetStream
  synthesize  turn each synthesis request into a training environment: the
           generation agent (llm.*) or a built-in template writes a Starlark program,
           it is validated and calibrated (synthesizer.*), recorded in ClickHouse
           environments, and announced on trace.environments.ready when DONE
  adapt    turn each ready environment into a training job (adapter.*: nats,
           command or webhook backend), track its trainer's events, register
           the adapter it produces, activate adapters (adapter.auto_activate)
           and roll back the ones the closed loop finds worse (verify.*)
  serve    the dashboard, JSON API, /metrics, /healthz and /readyz
  route    (not a default role) the router and its OpenAI-compatible proxy on
           router.addr: POST /v1/route and POST /v1/chat/completions, forwarded
           to router.upstream_url with the chosen adapter (or router.base_model)
           as model; decisions in ClickHouse route_decisions

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
			app.SetMemoryLimit(slog.Default())
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
				if ctx.Err() != nil {
					// SIGTERM or Ctrl-C during start-up (waiting for a
					// server): nothing ran, nothing to drain; exit 0 as
					// after a drain, saying what it was waiting for.
					slog.Default().Warn("stopped during start-up", "err", err)
					return nil
				}
				return err
			}
			defer a.Close()
			return a.Run(ctx)
		},
	}
	cf.add(cmd)
	cmd.Flags().StringSliceVar(&roles, "roles", nil, "roles to run (default all but route): ingest,analyze,synthesize,adapt,serve,route")
	rootCmd.AddCommand(cmd)

	var pcf configFlags
	var printRoles []string
	cfgCmd := &cobra.Command{Use: "config", Short: "Inspect the configuration"}
	printCmd := &cobra.Command{
		Use:   "print",
		Short: "Print the effective configuration with secrets redacted",
		Long: `print loads the configuration as trace run does (the YAML file, then TRACE_*
variables, then --set flags), checks it, and prints it with secrets redacted.
A bad value or an unknown key fails with a message naming the field, so it
also checks a configuration before a deployment. A role's own settings
(router.* for route) are checked when it is among the roles: give the
deployment's with --roles, as to trace run.`,
		Example: `  trace config print
  trace config print --config trace.yaml
  trace config print --config trace.yaml --roles route
  TRACE_CLICKHOUSE__PASSWORD=secret trace config print --set kafka.brokers=k1:9092,k2:9092`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(printRoles) > 0 {
				pcf.sets = append(pcf.sets, "roles="+joinComma(printRoles))
			}
			cfg, err := pcf.load()
			if err != nil {
				return err
			}
			m, err := cfg.Redacted().Map()
			if err != nil {
				return err
			}
			b, err := yaml.Marshal(m)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	pcf.add(printCmd)
	printCmd.Flags().StringSliceVar(&printRoles, "roles", nil, "the roles to check the configuration for, as trace run --roles (default: the configuration's)")
	cfgCmd.AddCommand(printCmd)
	rootCmd.AddCommand(cfgCmd)
}

func joinComma(s []string) string { return strings.Join(s, ",") }
