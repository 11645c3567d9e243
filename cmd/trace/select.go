package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/schemas"
)

func init() {
	var (
		runsGlob, candidates, format string
		th                           = analyzer.DefaultThresholds
	)
	cmd := &cobra.Command{
		Use:   "select --runs 'DIR/run_*.json' --candidates FILE",
		Short: "Offline capability selection from TRACE labeling run files",
		Long: `select applies TRACE's contrastive capability selection to labeling runs in the
six-list schema of the TRACE release (run_NN.json) and prints which candidate
capabilities are selected for targeted training.

Per capability and run: ER- = L-/(L-+P-), ER+ = L+/(L++P+), gap = ER- - ER+,
Cov = L-/|failed|. A run passes when Cov >= rho and gap >= delta; a capability is
selected when at least k runs pass. Selected capabilities are ranked by mean gap.

The JSON format prints the selected capabilities with the selection's fields of
the release's selected_capabilities.json (status PENDING: no environment exists
yet; the release's environment_path, environment_module and reward_distribution
come from synthesis, which select does not run); the table format also lists
the rejected candidates and why.`,
		Example: `  trace select --runs '../shared/data/trace-release/pipeline/run_*.json' \
    --candidates ../shared/data/trace-release/pipeline/candidate_capabilities.json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 { // the shell expanded an unquoted --runs glob
				return fmt.Errorf("unexpected argument %q: quote the --runs pattern ('DIR/run_*.json') so that trace, not the shell, expands it", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := th.Validate(); err != nil {
				return err
			}
			format = formatOrJSON(cmd, format)
			if format != "table" && format != "json" {
				return fmt.Errorf("--format must be table or json, got %q", format)
			}
			data, err := os.ReadFile(candidates)
			if err != nil {
				return fmt.Errorf("--candidates: %w", err)
			}
			cands, err := analyzer.ParseCandidates(candidates, data)
			if err != nil {
				return err
			}
			runs, err := analyzer.LoadRuns(runsGlob)
			if err != nil {
				return err
			}
			if th.K > len(runs) {
				return fmt.Errorf("--k %d exceeds the %d run files found", th.K, len(runs))
			}
			inputs, err := analyzer.RunsToInputs(cands, runs)
			if err != nil {
				return err
			}
			results := analyzer.Select(inputs, th)
			if format == "json" {
				return writeSelectedJSON(cmd.OutOrStdout(), results)
			}
			writeSelectionTable(cmd.OutOrStdout(), results, th)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&runsGlob, "runs", "", "glob of run files in the six-list schema (quote it)")
	f.StringVar(&candidates, "candidates", "", "candidate_capabilities.json")
	f.Float64Var(&th.Rho, "rho", th.Rho, "minimum coverage per run")
	f.Float64Var(&th.Delta, "delta", th.Delta, "minimum contrastive gap per run")
	f.IntVar(&th.K, "k", th.K, "runs that must pass for a capability to be selected")
	f.StringVar(&format, "format", "table", "output format: table or json")
	addJSONFlag(cmd)
	_ = cmd.MarkFlagRequired("runs")
	_ = cmd.MarkFlagRequired("candidates")
	rootCmd.AddCommand(cmd)
}

// writeSelectedJSON prints the selected capabilities as the TRACE release does.
func writeSelectedJSON(w io.Writer, results []analyzer.Result) error {
	out := []schemas.SelectedCapability{}
	for _, r := range results {
		if r.Selected {
			out = append(out, r.Record())
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

func writeSelectionTable(w io.Writer, results []analyzer.Result, th analyzer.Thresholds) {
	fmt.Fprintf(w, "thresholds: Cov >= %.2f and gap >= %.2f in at least %d runs\n\n", th.Rho, th.Delta, th.K)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "rank\tcapability\tmean Cov\tstd Cov\tmean Δ\tstd Δ\truns passed\tdecision\t")
	rank := 0
	for _, r := range results {
		decision := "rejected"
		rk := "-"
		if r.Selected {
			rank++
			rk = fmt.Sprint(rank)
			decision = "SELECTED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.4f\t%.4f\t%.4f\t%.4f\t%d/%d\t%s\t\n", rk, r.Name, r.MeanCov, r.StdCov, r.MeanDelta, r.StdDelta, r.RunsPassed, r.RunsTotal, decision)
	}
	tw.Flush()
	var rejected []string
	for _, r := range results {
		if !r.Selected {
			rejected = append(rejected, fmt.Sprintf("  %s: %s", r.Name, r.RejectionText()))
		}
	}
	if len(rejected) > 0 {
		fmt.Fprintf(w, "\nrejected:\n%s\n", strings.Join(rejected, "\n"))
	}
}
