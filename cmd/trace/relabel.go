package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// backfillFlags are the flags `trace relabel` and `trace dict apply
// --backfill` share.
type backfillFlags struct {
	since string
	yes   bool
}

func (f *backfillFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.since, "since", "", "only rollouts that ended at or after this time (RFC 3339 or YYYY-MM-DD)")
	cmd.Flags().BoolVar(&f.yes, "yes", false, "spend the LLM calls the llm labeler needs (printed first without it)")
}

func (f *backfillFlags) sinceTime() (time.Time, error) {
	if f.since == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02"} {
		if t, err := time.Parse(layout, f.since); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("--since %q: want RFC 3339 (2025-06-02T09:00:00Z) or YYYY-MM-DD", f.since)
}

func init() {
	var (
		cf           configFlags
		bf           backfillFlags
		env, version string
	)
	cmd := &cobra.Command{
		Use:   "relabel --env E [--agent-version V] [--since T] [--yes]",
		Short: "Label the rollouts already stored in ClickHouse with the current dictionary",
		Long: `relabel labels the rollouts of an environment that are already stored in
ClickHouse with the dictionary that labels their cohort now (the newest of
its own, else the default), through the configured labeler (analyzer.labeler)
and the stream's own rules: a (rollout, dictionary version, run) that is
already labeled is never labeled again. Use it after applying a dictionary
to rollouts that arrived before it (or see trace dict apply --backfill), and
after fixing a labeler that failed: runs recorded as failed (no label: an
LLM endpoint that was down, a wrong llm.model) are labeled again.

Each rollout is labeled from its original message, read again from Kafka by
the coordinates stored with it; a rollout Kafka no longer holds is labeled
from its stored, compacted form (contents cut to 300 characters), and the
summary counts them. Progress lives in ClickHouse: an interrupted relabel
resumes where it stopped when run again. A progress bar is drawn on stderr
when it is a terminal; otherwise (a log file, a CI job) a progress line is
written to stderr every 10 s.

With the llm labeler, relabel first prints the model calls and tokens it
will spend and stops; run it again with --yes to spend them.

Afterwards the cohorts are evaluated as the stream evaluates them (the same
window, thresholds and exactly-once synthesis requests).`,
		Example: `  trace relabel --env tau2-airline
  trace relabel --env tau2-retail --agent-version gpt-4.1-mini --since 2025-06-01
  trace relabel --env tau2-retail --set analyzer.labeler=llm --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if env == "" {
				return errors.New("--env is required")
			}
			since, err := bf.sinceTime()
			if err != nil {
				return err
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			w, err := openDictWriter(ctx, cfg)
			if err != nil {
				return err
			}
			defer w.Close()
			if err := knownEnvironment(ctx, w.st, env); err != nil {
				return err
			}
			return backfill(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), cfg, w, analyzer.BackfillFilter{Environment: env, AgentVersion: version, Since: since}, bf.yes)
		},
	}
	cf.add(cmd)
	bf.add(cmd)
	cmd.Flags().StringVar(&env, "env", "", "the environment whose stored rollouts to label (required)")
	cmd.Flags().StringVar(&version, "agent-version", "", "only this agent version")
	rootCmd.AddCommand(cmd)
}

// backfillProgressEvery is the interval of the progress lines a backfill
// writes to a stderr that is not a terminal.
var backfillProgressEvery = 10 * time.Second

// errNeedsYes is returned when the llm labeler's cost was printed and
// --yes was not given.
var errNeedsYes = errors.New("the llm labeler would spend the calls above: run again with --yes to spend them")

// backfill plans, (for the llm labeler) prices, runs and evaluates a
// backfill, printing what it does on out and the progress bar on errw.
func backfill(ctx context.Context, out, errw io.Writer, cfg config.Config, w *dictWriter, f analyzer.BackfillFilter, yes bool) error {
	log := slog.Default()
	lab, llmLab, stop, err := backfillLabeler(ctx, cfg, w)
	if err != nil {
		return err
	}
	defer stop()
	dialer, err := app.KafkaDialer(cfg.Kafka)
	if err != nil {
		return err
	}
	b := &analyzer.Backfill{Store: w.st, Registry: w.reg, Labeler: lab, Log: log,
		Originals: &ingest.Originals{Brokers: cfg.KafkaBrokers(), Dialer: dialer, MaxMessageBytes: cfg.Kafka.MaxBytes + 64<<10},
		Decode:    ingest.DecodeRollout(cfg.Kafka.MaxBytes), Concurrency: cfg.Analyzer.Concurrency}
	targets, err := b.Plan(ctx, f)
	if err != nil {
		return err
	}
	total, runs := 0, 0
	for _, t := range targets {
		fmt.Fprintf(out, "backfill %s/%s with dictionary %s v%d (%s labeler): %d stored, %d already labeled, %d to label\n",
			t.Environment, t.AgentVersion, t.Dictionary.Scope(), t.Dictionary.Version, lab.Name(), t.Stored, t.Done, len(t.Todo))
		total += len(t.Todo)
		runs += t.Runs
	}
	if len(targets) == 0 {
		fmt.Fprintln(out, "backfill: no stored rollouts match (is the environment spelled as stored? trace report lists them)")
		return nil
	}
	if rl, ok := lab.(*analyzer.RulesLabeler); ok {
		// The labeler would fail every run of such a dictionary: say so
		// before recording them.
		for _, t := range targets {
			if err := rl.Compile(t.Dictionary); len(t.Todo) > 0 && err != nil {
				if errors.Is(err, analyzer.ErrNoDetector) {
					return fmt.Errorf("%w (add detectors and apply the dictionary again, or set analyzer.labeler: llm)", err)
				}
				// Stored before trace dict apply checked detectors.
				return fmt.Errorf("%w (fix the detector and apply the dictionary again: trace dict apply checks every detector before storing)", err)
			}
		}
	}
	if total == 0 {
		fmt.Fprintln(out, "backfill: nothing to label, every run is already stored")
	}
	if llmLab != nil && total > 0 {
		est, err := b.EstimateLLM(ctx, llmLab, targets)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "llm labeler (%s at %s): %d rollouts × up to %d runs = %d model calls (retries not counted), about %d prompt tokens and at most %d completion tokens\n",
			cfg.LLM.Model, cfg.LLM.BaseURL, est.Rollouts, llmLab.Runs(), est.Calls, est.PromptTokens, est.MaxCompletionTokens)
		if !yes {
			return errNeedsYes
		}
	}
	var bar *progressbar.ProgressBar
	if fd, ok := errw.(*os.File); ok && term.IsTerminal(int(fd.Fd())) && total > 0 {
		bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(errw), progressbar.OptionSetDescription("backfill"),
			progressbar.OptionShowCount(), progressbar.OptionSetPredictTime(true), progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(), progressbar.OptionFullWidth())
		defer bar.Exit()
	}
	start, last := time.Now(), time.Now()
	res, err := b.Run(ctx, targets, func(done int) {
		if bar != nil {
			_ = bar.Set(done)
			return
		}
		// Not a terminal (a log file, a CI job, a Kubernetes job): a
		// progress line now and then, as trace replay writes.
		if total > 0 && time.Since(last) >= backfillProgressEvery {
			last = time.Now()
			fmt.Fprintf(errw, "backfill: %d of %d rollouts labeled (%.0f%%), %s\n", done, total, 100*float64(done)/float64(total), time.Since(start).Round(time.Second))
		}
	})
	if bar != nil {
		_ = bar.Finish()
	}
	fmt.Fprintf(out, "backfill: labeled %d of %d rollouts", res.Labeled, total)
	if res.Compacted > 0 {
		fmt.Fprintf(out, " (%d no longer in Kafka, labeled from their stored compacted form)", res.Compacted)
	}
	fmt.Fprintln(out)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("backfill interrupted after %d rollouts; what was labeled is stored, run the same command again to resume: %w", res.Labeled, err)
		}
		if errors.Is(err, analyzer.ErrOriginals) {
			return fmt.Errorf("%w\n(a backfill labels each rollout from its original message on Kafka %s: is it reachable? set kafka.brokers, or keep `trace run` running for the embedded broker; run the same command again to resume)",
				err, strings.Join(cfg.KafkaBrokers(), ","))
		}
		return err
	}
	cohorts := res.Cohorts
	for _, t := range targets {
		if len(t.Todo) == 0 {
			cohorts = append(cohorts, t.Cohort())
		}
	}
	return evaluateBackfilled(ctx, out, cfg, w, cohorts)
}

// evaluateBackfilled evaluates the backfilled cohorts as the stream's
// evaluator does (trigger state recovered from ClickHouse, exactly-once
// synthesis requests: a running `trace run` that evaluates them too
// publishes nothing twice) and prints the decisions.
func evaluateBackfilled(ctx context.Context, out io.Writer, cfg config.Config, w *dictWriter, cohorts []sink.Cohort) error {
	ev := analyzer.NewEvaluator(cfg.Analyzer.EvalConfig, w.st, app.BusPublisher{Bus: w.bus}, w.reg, slog.Default(), nil)
	if err := ev.Recover(ctx); err != nil {
		return err
	}
	if err := ev.Evaluate(ctx, cohorts...); err != nil {
		return err
	}
	snap := ev.Snapshot()
	for _, c := range cohorts {
		var sel []string
		for _, r := range snap[c] {
			if r.Selected {
				sel = append(sel, fmt.Sprintf("%s (Cov %.3f, Δ %.3f)", r.Name, r.MeanCov, r.MeanDelta))
			}
		}
		if len(sel) == 0 {
			fmt.Fprintf(out, "evaluated %s: nothing selected (trace report says why)\n", c)
			continue
		}
		fmt.Fprintf(out, "evaluated %s: selected %v\n", c, sel)
	}
	return nil
}

// backfillLabeler builds the configured labeler as `trace run` does; for
// the llm labeler it also returns it as such (to price the work) and runs
// its audit writer until stop.
func backfillLabeler(ctx context.Context, cfg config.Config, w *dictWriter) (analyzer.Labeler, *analyzer.LLMLabeler, func(), error) {
	switch cfg.Analyzer.Labeler {
	case "rules":
		return analyzer.NewRulesLabeler(analyzer.RulesOptions{}), nil, func() {}, nil
	case "llm":
		rec := app.NewAuditRecorder(w.st, slog.Default())
		actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() { _ = rec.Run(actx); close(done) }()
		stop := func() { cancel(); <-done }
		client, err := app.LLMClient(cfg.LLM, rec, slog.Default())
		if err != nil {
			stop()
			return nil, nil, nil, fmt.Errorf("llm: %w", err)
		}
		st := w.st
		l, err := analyzer.NewLLMLabeler(client, analyzer.LLMLabelerConfig{
			Runs:               cfg.LLM.Runs,
			MaxTranscriptChars: cfg.LLM.MaxTranscriptChars,
			SampleRate:         analyzer.SampleRate{Failed: cfg.Analyzer.SampleFailed, Passed: cfg.Analyzer.SamplePassed},
			// Runs that failed are labeled again (the plan counts them as to
			// do); runs with labels never are.
			AlreadyLabeled: func(ctx context.Context, r *schemas.Rollout, v uint32) (map[int]bool, error) {
				return st.DoneRuns(ctx, r.Environment, r.Agent.Version, r.RolloutID, v)
			},
		})
		if err != nil {
			stop()
			return nil, nil, nil, err
		}
		return l, l, stop, nil
	default:
		return nil, nil, nil, fmt.Errorf("analyzer.labeler is %q: a backfill needs a labeler (set analyzer.labeler: rules or llm)", cfg.Analyzer.Labeler)
	}
}
