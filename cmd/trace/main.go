// Command trace watches LLM agents in production and turns their recurring
// failures into targeted retraining (TRACE, arXiv 2604.05336).
//
// Every subcommand lives in its own file of this package and registers itself
// on rootCmd in an init function.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/traceops/trace/synthesizer/envprog"
)

var rootCmd = &cobra.Command{
	Use:   "trace",
	Short: "Turn recurring agent failures into capability-targeted training",
	Long: `trace watches LLM agents in production and turns their recurring failures
into targeted retraining.

Rollouts stream in through Kafka, analyzers label them against a capability
dictionary (NA / PRESENT / LACKING), rolling contrastive-gap statistics live in
ClickHouse, and when a capability is lacking far more often on failures than on
successes (gap >= 0.20, coverage >= 0.10, in K of N labeling runs) a synthesis
request is published on NATS JetStream. The synthesizer builds a verifiable
training environment for the capability (served over OpenEnv), trainers play
it to train a LoRA adapter, the router sends each conversation to the adapter
it needs, and trace measures whether the gap closed.

Start here:
  trace demo               run the whole loop on embedded servers with simulated agents
  trace select --runs ...  offline capability selection from TRACE run files
  trace run                run the streaming roles (ingest, analyze, synthesize, adapt, serve, route)`,
	SilenceUsage:  true,
	SilenceErrors: true,
}

var logLevel = new(slog.LevelVar)

func init() {
	rootCmd.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error")
	rootCmd.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		lv, _ := cmd.Flags().GetString("log-level")
		if err := logLevel.UnmarshalText([]byte(lv)); err != nil {
			return fmt.Errorf("--log-level: %w", err)
		}
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel})))
		return nil
	}
}

// exitError carries a specific exit code out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func main() {
	envprog.RunWorkerIfRequested() // a sandbox worker of an environment program (synthesizer/envprog)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	groupExamples(rootCmd)
	err := rootCmd.ExecuteContext(ctx)
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "trace:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		os.Exit(ee.code)
	}
	os.Exit(1)
}

// groupExamples gives every group of subcommands without examples of its
// own the first example of each subcommand (with its continuation lines),
// so that `trace env --help` shows how its commands are used.
func groupExamples(c *cobra.Command) {
	for _, s := range c.Commands() {
		groupExamples(s)
	}
	if c == c.Root() || !c.HasSubCommands() || c.Example != "" {
		return
	}
	var out []string
	for _, s := range c.Commands() {
		if s.Hidden {
			continue
		}
		for _, line := range strings.Split(s.Example, "\n") {
			if line == "" {
				break
			}
			out = append(out, line)
			if !strings.HasSuffix(line, "\\") {
				break
			}
		}
	}
	c.Example = strings.Join(out, "\n")
}
