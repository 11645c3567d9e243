package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/traceops/trace/internal/dev/bench"
	"github.com/traceops/trace/internal/dev/shareddata"
)

func init() { rootCmd.AddCommand(newBenchCmd()) }

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure trace on this machine",
	}
	cmd.AddCommand(newBenchIngestCmd())
	cmd.AddCommand(newBenchQueryCmd())
	return cmd
}

func newBenchIngestCmd() *cobra.Command {
	var (
		opt          bench.Options
		set          string
		rows         int
		compactRows  int
		batchBytesMB int
		memLimitMB   int
		cpuProfile   string
	)
	cmd := &cobra.Command{
		Use:   "ingest [--rows N] [--set whole|compact|both|none] [--rss-rollouts N]",
		Short: "Kafka → decode + validate → ClickHouse throughput, against the insert ceiling",
		Long: `bench ingest measures the ingest path end to end on this machine, with an
embedded kfake broker keeping its log on disk (kfake.DataDir, on /dev/shm when
it has room) and a local ClickHouse server (or --clickhouse).

For each data set it produces the rollouts to a fresh topic, then measures:
  clickhouse-client ceiling  clickhouse-client inserting the same rows of the
                             rollouts table as JSONEachRow from a file; the
                             fastest of blocks of the consumer's batch size,
                             of 10,000 rows and of the client's default
  kafka-go bare consume      a kafka-go group reader: FetchMessage for every
                             message, CommitMessages at the end
  obvious loop               one goroutine: FetchMessage → encoding/json →
                             10,000-row PrepareBatch/Send → CommitMessages
  trace stream.Consumer      the consumer trace runs (trace run's ingest
                             defaults), streaming into ClickHouse (RowSink),
                             timed until the set's rows are durable; one more
                             batch waits in the topic so that the last batch
                             fills as in a steady stream instead of waiting
                             out the batch timeout on an idle topic
and prints trace's throughput as a ratio of the ceiling and of the loop.

Data sets, cloned from the τ²-bench simulations with fresh rollout ids:
  whole    simulations as converted (~26 KB of JSON each)
  compact  contents cut to 300 characters, tool-argument strings to 200 (~10 KB)

--rss-rollouts N produces N compact rollouts (generated on the fly) to a
fresh topic, then starts "trace run --roles ingest" in its own process against
the bench's broker and ClickHouse, lets it consume the backlog at full speed,
and prints the peak RSS (VmHWM) of that process: trace's memory as in
production, without the broker or the producer.`,
		Example: `  trace bench ingest
  trace bench ingest --rows 5000 --set compact --decode-workers 1
  trace bench ingest --set none --rss-rollouts 1000000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			ctx := cmd.Context()
			switch set {
			case "both":
				opt.Sets = []bench.Set{bench.Whole, bench.Compact}
			case "whole", "compact":
				opt.Sets = []bench.Set{bench.Set(set)}
			case "none":
			default:
				return fmt.Errorf("--set: %q is not whole, compact, both or none", set)
			}
			opt.WholeRows = rows
			opt.CompactRows = compactRows
			if compactRows == 0 {
				opt.CompactRows = 3 * rows
			}
			opt.Consumer.BatchBytes = batchBytesMB << 20
			if memLimitMB > 0 {
				opt.ChildMemoryLimit = strconv.Itoa(memLimitMB) + "MiB"
			}
			if opt.Binary, err = os.Executable(); err != nil {
				return fmt.Errorf("locate the trace executable: %w", err)
			}
			if opt.Tau2Dir == "" {
				dir, err := shareddata.Lookup("tau2")
				if err != nil {
					return fmt.Errorf("τ²-bench data: %w (use --tau2)", err)
				}
				opt.Tau2Dir = dir
			}
			opt.Log = slog.Default()
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "trace bench ingest: %d CPUs, GOMAXPROCS %d, %s, load average %s\n",
				runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), loadAvg())
			if len(opt.Sets) > 0 {
				results, err := bench.Run(ctx, opt)
				if len(results) > 0 {
					fmt.Fprintln(out)
					fmt.Fprint(out, bench.Table(results))
				}
				if err != nil {
					return err
				}
			}
			if opt.RSSRollouts > 0 {
				start := time.Now()
				res, err := bench.RunRSS(ctx, opt)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "\nRSS run (%v):\n%s", time.Since(start).Round(time.Second), res)
			}
			fmt.Fprintf(out, "load average at the end: %s\n", loadAvg())
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&rows, "rows", 20000, "rows of the whole set")
	f.IntVar(&compactRows, "compact-rows", 0, "rows of the compact set (default 3 × --rows)")
	f.StringVar(&set, "set", "both", "data sets: whole, compact, both or none")
	f.IntVar(&opt.RSSRollouts, "rss-rollouts", 0, "stream this many compact rollouts and report the peak RSS")
	f.StringVar(&opt.ClickHouse, "clickhouse", "", "host:port (native protocol) of a ClickHouse server to use instead of starting one")
	f.StringVar(&opt.WorkDir, "workdir", "", "directory for the broker log, ClickHouse data and ceiling files (default /dev/shm when it has room, else the temp directory)")
	f.StringVar(&opt.Tau2Dir, "tau2", "", "directory of τ²-bench result files (default shared/data/tau2 beside the clone)")
	f.StringVar(&opt.CHCompression, "ch-compression", "", "ClickHouse protocol compression of trace and the obvious loop: auto, lz4, zstd or none (default: clickhouse.compression's default, auto: none to the bench's local server)")
	f.IntVar(&opt.Partitions, "partitions", 4, "partitions of the bench topics")
	f.StringVar(&opt.Compression, "compression", "zstd", "compression of the produced messages: none, gzip, snappy, lz4, zstd")
	f.IntVar(&opt.Repeat, "repeat", 1, "run every step this many times, alternating, and keep each step's best run")
	f.BoolVar(&opt.SkipBaselines, "skip-baselines", false, "measure only trace's consumer")
	f.IntVar(&opt.Consumer.BatchRows, "batch-rows", 0, "consumer BatchRows (0: ingest default)")
	f.IntVar(&batchBytesMB, "batch-bytes-mb", 0, "consumer BatchBytes in MiB (0: ingest default)")
	f.DurationVar(&opt.Consumer.BatchTimeout, "batch-timeout", 0, "consumer BatchTimeout (0: ingest default)")
	f.IntVar(&opt.Consumer.DecodeWorkers, "decode-workers", 0, "consumer DecodeWorkers (0: ingest default, GOMAXPROCS)")
	f.IntVar(&memLimitMB, "memory-limit-mb", 0, "GOMEMLIMIT of the trace process of the RSS run, in MiB (0: none)")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	return cmd
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
