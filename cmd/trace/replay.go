package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/traceops/trace/ingest"
)

func init() { rootCmd.AddCommand(newReplayCmd()) }

func newReplayCmd() *cobra.Command {
	var (
		cf      configFlags
		format  string
		brokers []string
		topic   string
	)
	cmd := &cobra.Command{
		Use:   "replay [--format auto|rollout-jsonl|rollout-json|tau2] [--config FILE] [--set key=value]... [--brokers HOST:PORT,...] [--topic NAME] FILE...",
		Short: "Publish rollout files (rollout JSONL or τ²-bench results) to Kafka",
		Long: `replay reads rollout files and publishes every rollout on the Kafka rollout
topic, as a producer in production would.

Kafka is set by trace's configuration, loaded as for trace run (--config or
TRACE_CONFIG, TRACE_* environment variables, --set): kafka.brokers (none: the
embedded broker of a running trace run, kafka.embedded_addr, 127.0.0.1:9092
by default), kafka.rollouts_topic, kafka.tls, kafka.sasl and
kafka.max_message_bytes (the largest rollout sent; a larger one is rejected
as too_large, as the ingest stage would dead-letter it). A bad setting fails
at start, naming it. --brokers and --topic override kafka.brokers and
kafka.rollouts_topic.

Input formats (--format):
  auto           (default) a file that is a single JSON object with a
                 "simulations" key is a τ²-bench result file; one that starts
                 with '[', or whose first object spans several lines, is
                 rollout-json; anything else is rollout JSONL
  rollout-jsonl  one rollout/v1 JSON object per line (schemas/rollout.v1.schema.json);
                 blank lines are skipped
  rollout-json   a JSON array of rollout/v1 objects, or rollout/v1 objects one
                 after another, indented or not (as jq prints them); read one
                 element at a time, so the file may be of any size. A syntax
                 error in the file stops it (its line is named) after the
                 rollouts before it were sent.
  tau2           a τ²-bench result file; each simulation becomes one rollout in
                 environment "tau2-<domain>" (see ingest.ConvertTau2). Read
                 twice with a streaming decoder (first its "info" and tool
                 names, then the simulations, a batch at a time), so the file
                 may be of any size.

A FILE of "-" is standard input. A pipe (standard input, a FIFO, a process
substitution) is read once: with --format auto it is first copied to a
temporary file (in TMPDIR), since telling its format reads its start; with
--format given it is read as it comes (but for tau2, which is read twice, so
copied too).

Files are read as UTF-8. A UTF-8 byte order mark at the start of a file is
skipped and CRLF line endings are read as LF; a file in UTF-16 or UTF-32
(a byte order mark of those) is refused as a whole: convert it first.

Every rollout is validated against the rollout/v1 schema before it is sent.
Invalid records are not published; they are counted by reason (too_large,
invalid_utf8, not_json, schema, non_finite_reward, duplicate_key, tau2_invalid)
and the first few are listed with their line numbers (and element numbers in
an array). Messages are keyed by
"<environment>/<agent version>", zstd-compressed, and acknowledged by all
in-sync replicas; the topic is created if the broker allows it.

A progress bar is drawn on stderr when stderr is a terminal; otherwise (a log
file, a CI job) a progress line is written to stderr every 10 s. The summary
goes to stdout.

Exit status: 0 when rollouts were sent (rejected records alone are reported,
not fatal); 1 on a Kafka or read error (the summary shows what was sent
before it); 2 when nothing could be sent.`,
		Example: `  # replay the τ²-bench result files kept beside the repository clone
  # (into the embedded broker of a running trace run, or kafka.brokers)
  trace replay ../shared/data/tau2/*.json

  # into the cluster of trace's configuration file, with its TLS and SASL
  trace replay --config trace.yaml rollouts.jsonl

  # a rollout JSONL file to another cluster and topic
  trace replay --brokers kafka-1:9092,kafka-2:9092 --topic trace.rollouts.staging rollouts.jsonl
  TRACE_KAFKA__BROKERS=kafka-1:9092 trace replay --set kafka.rollouts_topic=trace.rollouts.staging rollouts.jsonl

  # a JSON array of rollouts (or jq's indented output)
  trace replay export.json

  # a compressed export, from standard input
  zcat rollouts.jsonl.gz | trace replay --format rollout-jsonl -

  # force the format when auto-detection is not wanted
  trace replay --format rollout-jsonl export.json`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, files []string) error {
			if !slices.Contains(ingest.ReplayFormats, format) {
				return fmt.Errorf("--format %q: want one of %s", format, strings.Join(ingest.ReplayFormats, ", "))
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			p, err := newRolloutProducer(cmd, cfg, brokers, topic)
			if err != nil {
				return err
			}
			w, err := kafkaWriter(cfg, p.brokers, p.topic)
			if err != nil {
				return err
			}
			r := &ingest.Replayer{Writer: w, Format: format, Progress: os.Stderr, MaxBytes: cfg.Kafka.MaxBytes}
			sum, err := r.Replay(cmd.Context(), files)
			if cerr := w.Close(); err == nil && cerr != nil {
				err = fmt.Errorf("kafka: %w", cerr)
			}
			fmt.Fprintln(cmd.OutOrStdout(), sum)
			if err != nil {
				if sum.Sent == 0 {
					err = p.hint(err)
				}
				return &exitError{code: 1, err: fmt.Errorf("replay to %s on %s: %w", p.topic, strings.Join(p.brokers, ","), err)}
			}
			if sum.Sent == 0 {
				return &exitError{code: 2, err: fmt.Errorf("replay: nothing sent (%d records rejected)", sum.Rejected)}
			}
			return nil
		},
	}
	cf.add(cmd)
	f := cmd.Flags()
	f.StringVar(&format, "format", ingest.FormatAuto, "input format: "+strings.Join(ingest.ReplayFormats, " | "))
	f.StringSliceVar(&brokers, "brokers", nil, "Kafka bootstrap brokers, comma separated (default kafka.brokers, or the embedded broker on kafka.embedded_addr)")
	f.StringVar(&topic, "topic", "", "Kafka topic to publish rollouts on (default kafka.rollouts_topic)")
	return cmd
}
