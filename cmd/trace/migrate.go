package main

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/traceops/trace/sink"
)

func init() {
	var cf configFlags
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply ClickHouse schema migrations (also done at every start)",
		Long: `migrate applies every versioned schema migration that the configured
ClickHouse database has not recorded yet. Migrations are idempotent and safe to
run from several processes at once. Optional features (LowCardinality, ZSTD
codecs, TTL retention) are used when the server's version has them.`,
		Example: `  trace migrate --set clickhouse.addr=clickhouse:9000
  trace migrate --config trace.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			if len(cfg.ClickHouse.Addr) == 0 {
				return fmt.Errorf("clickhouse.addr: set it (--set clickhouse.addr=host:9000); migrate does not start an embedded server")
			}
			st, err := sink.Open(cmd.Context(), cfg.ClickHouse, slog.Default())
			if err != nil {
				return err
			}
			defer st.Close()
			if err := st.Migrate(cmd.Context()); err != nil {
				return err
			}
			applied, err := st.AppliedMigrations(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "clickhouse %s database %s: %d of %d migrations applied (features %+v)\n",
				st.Version(), st.Database(), len(applied), len(sink.Migrations), st.Features())
			return nil
		},
	}
	cf.add(cmd)
	rootCmd.AddCommand(cmd)
}
