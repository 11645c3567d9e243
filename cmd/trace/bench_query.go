package main

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/bench"
	"github.com/traceops/trace/sink"
)

func newBenchQueryCmd() *cobra.Command {
	var (
		opt   bench.QueryOptions
		sizes string
	)
	cmd := &cobra.Command{
		Use:   "query [--sizes 100k,1M] [--clickhouse host:port]",
		Short: "Dashboard, report and evaluator latency at 100k–10M rollouts, against the statements before the rollup",
		Long: `bench query measures the analytics at production volume. For each size it
creates a scratch database (--database; with several sizes, one per size with
the size appended, e.g. trace_bench_query_1M; dropped before and after), bulk-loads
that many SIMULATED rollouts with their labels (3 environments, 2 agent
versions, 5 capabilities, one labeling run, decided with K = N = 1, a
planted deficit; generated inside ClickHouse, not through the labelers)
spread over --days of history ending now, with the router's decisions of
the last 30 days and an adapter active for the last 7 (half of one
cohort's conversations routed to it), runs the hourly rollup, and then:

  exactness   compares every rollup-backed dashboard statement with the raw
              statement it replaces (sink.DashboardQuery.Raw), for every
              cohort and the ranges 24 h, 30 d and all, hourly and daily,
              and every cohort's decision windows (24 h and 7 d) read
              through the rollup with the raw read: any difference fails
              the run
  endpoints   times every dashboard API endpoint and page --reps times, the
              new way and the old way (the same handler reading through the
              raw statements), every endpoint the new way first, then the
              old way, and prints p50 and p95 of each
  report      times trace report (the stored decisions) and trace report
              --fresh (every cohort's decision window read now)
  evaluator   times one evaluator tick's queries over every cohort
  guard       times one guard tick's reads of the active adapter (both
              samples, the looks, the watch block), the new way and the
              old way (the routing subquery filtered by environment after
              aggregating every environment's decisions)

--keep keeps each size's database and --reuse times a kept one as it is (its
history ends when it was loaded), so a 10M load is paid once; the
TriggerLatency benchmark runs on such a database too (TRACE_BENCH_STORED_DB,
see the README).

Dashboard queries run under the default limits (clickhouse.query_timeout,
query_max_memory), so an old-way query past them shows as an error. The
machine may be shared: read each figure beside its comparison.`,
		Example: `  trace bench query --sizes 100k,1M
  trace bench query --sizes 10M --reps 5 --keep
  trace bench query --sizes 10M --reps 5 --reuse`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			for _, f := range strings.Split(sizes, ",") {
				n, err := parseSize(strings.TrimSpace(f))
				if err != nil {
					return fmt.Errorf("--sizes: %w", err)
				}
				opt.Sizes = append(opt.Sizes, n)
			}
			out := cmd.OutOrStdout()
			opt.Out = out
			opt.Log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			// The defaults as trace run resolves them, for the evaluator,
			// dashboard and report, with K = N = 1: the bulk load's labels
			// are one run, of source "simulated", which as a source trace
			// does not know would count as N = 10 (analyzer.SourceRuns),
			// leaving every cohort undecided and nothing to time.
			cfg, err := config.Load("", []string{"analyzer.k=1", "analyzer.n=1"})
			if err != nil {
				return err
			}
			opt.Eval, opt.Verify = cfg.Analyzer.EvalConfig, cfg.Verify
			opt.Report = func(ctx context.Context, st *sink.Store, now time.Time, fresh bool) ([]bench.ReportCap, error) {
				rows, _, err := buildReport(ctx, cfg, st, "", cfg.Analyzer.Window, !fresh, now)
				out := make([]bench.ReportCap, len(rows))
				for i, r := range rows {
					out[i] = bench.ReportCap{Environment: r.Environment, AgentVersion: r.AgentVersion, DictionaryVersion: r.DictionaryVersion,
						Capability: r.Capability, Cov: r.Cov, Delta: r.Delta, RunsPassed: r.RunsPassed, Decision: r.Decision,
						Rollouts: r.Rollouts, Failures: r.Failures}
				}
				return out, err
			}
			fmt.Fprintf(out, "trace bench query: %d CPUs, %s, load average %s, ClickHouse %s\n",
				runtime.NumCPU(), runtime.Version(), loadAvg(), opt.ClickHouse)
			rs, err := bench.RunQuery(ctx, opt)
			if len(rs) > 0 {
				fmt.Fprintln(out)
				fmt.Fprint(out, bench.QueryTable(rs))
			}
			fmt.Fprintf(out, "load average at the end: %s\n", loadAvg())
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&sizes, "sizes", "100k,1M", "comma-separated rollout counts (k and M suffixes)")
	f.StringVar(&opt.ClickHouse, "clickhouse", "127.0.0.1:9000", "host:port (native protocol) of the ClickHouse server")
	f.StringVar(&opt.Database, "database", "trace_bench_query", "scratch database (with several sizes: <database>_<size> each), dropped before and after")
	f.IntVar(&opt.Reps, "reps", 5, "repetitions per endpoint")
	f.IntVar(&opt.Days, "days", 90, "days of history the rollouts are spread over")
	f.BoolVar(&opt.Keep, "keep", false, "keep each size's database")
	f.BoolVar(&opt.NoCheck, "no-check", false, "skip the exactness check (a re-run of a database an earlier run checked)")
	f.BoolVar(&opt.Reuse, "reuse", false, "time a kept database that already holds the size as it is, without loading")
	return cmd
}

// parseSize reads 100k, 1M, 10M or a plain number.
func parseSize(s string) (int, error) {
	mul := 1
	switch {
	case strings.HasSuffix(s, "k"), strings.HasSuffix(s, "K"):
		mul, s = 1000, s[:len(s)-1]
	case strings.HasSuffix(s, "M"), strings.HasSuffix(s, "m"):
		mul, s = 1_000_000, s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a positive count", s)
	}
	return n * mul, nil
}
