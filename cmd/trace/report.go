package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
)

// reportRow is one capability of one cohort in `trace report`.
type reportRow struct {
	Environment       string   `json:"environment"`
	AgentVersion      string   `json:"agent_version"`
	DictionaryVersion uint32   `json:"dictionary_version"`
	Capability        string   `json:"capability"`
	Cov               float64  `json:"cov"`
	ERFailed          float64  `json:"er_failed"`
	ERPassed          float64  `json:"er_passed"`
	Delta             float64  `json:"delta"`
	RunsPassed        int      `json:"runs_passed"`
	RunsTotal         int      `json:"runs_total"`
	Decision          string   `json:"decision"`
	Reasons           []string `json:"reasons,omitempty"`
	Rollouts          int      `json:"window_rollouts"`
	Failures          int      `json:"window_failures"`
	// Synthesis is the newest environment the synthesize role made for the
	// capability of this cohort (none until a trigger fired).
	Synthesis *reportEnvironment `json:"synthesis,omitempty"`
}

// reportEnvironment is an environment's status in `trace report`.
type reportEnvironment struct {
	ID        string   `json:"environment_id"`
	Status    string   `json:"status"`
	Attempts  int      `json:"attempts"`
	Reason    string   `json:"reason,omitempty"`
	Mean      *float64 `json:"mean_reward,omitempty"`
	Success   *float64 `json:"success_rate,omitempty"`
	Simulated bool     `json:"simulated"`
}

func init() {
	var (
		cf     configFlags
		env    string
		format string
	)
	cmd := &cobra.Command{
		Use:   "report",
		Short: "Per-capability statistics and decisions, read from ClickHouse",
		Long: `report evaluates the configured window (analyzer.window, analyzer.window_rollouts)
of every cohort (environment, agent version, dictionary version) stored in
ClickHouse and prints, per capability: mean Cov, ER-, ER+ and gap over the
labeling runs, runs passed, the decision and the reasons for a rejection, and
the status of the environment the synthesize role made for a selected one
(PENDING … DONE, FAILED, WAITING_FOR_LLM; see trace env list).`,
		Example: "  trace report --env sim-airline --format table",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch format {
			case "table", "json", "csv":
			default:
				return fmt.Errorf("--format must be table, json or csv, got %q", format)
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			st, err := openStore(ctx, cfg)
			if err != nil {
				return err
			}
			defer st.Close()
			ac := cfg.Analyzer.EvalConfig
			since := time.Now().Add(-ac.Window)
			cohorts, err := st.Cohorts(ctx, since)
			if err != nil {
				return err
			}
			reg := analyzer.NewRegistry()
			if err := reg.Load(ctx, st); err != nil {
				return err
			}
			envs, err := synthesizer.SinkStore{Rows: st}.List(ctx, sink.EnvironmentFilter{Environment: env})
			if err != nil {
				return err
			}
			synth := map[string]*reportEnvironment{}
			for _, e := range envs { // newest first: keep the first of each capability
				key := fmt.Sprintf("%s/%s/%d/%s", e.Environment, e.AgentVersion, e.DictionaryVersion, e.Capability)
				if synth[key] != nil {
					continue
				}
				re := &reportEnvironment{ID: e.ID, Status: string(e.Status), Attempts: e.Attempt, Reason: e.Reason}
				if c := e.Calibration; c != nil && e.Status == synthesizer.StatusDone {
					re.Mean, re.Success, re.Simulated = &c.MeanReward, &c.SuccessRate, c.Simulated
				}
				synth[key] = re
			}
			var rows []reportRow
			for _, c := range cohorts {
				if env != "" && c.Environment != env {
					continue
				}
				spec := sink.WindowSpec{Cohort: c, Since: since, LastRollouts: ac.WindowRollouts, Runs: ac.N}
				info, err := st.WindowInfo(ctx, spec)
				if err != nil {
					return err
				}
				counts, err := st.WindowCounts(ctx, spec)
				if err != nil {
					return err
				}
				inputs, runs := analyzer.CohortInputs(counts, reg.Version(c.Environment, c.AgentVersion, c.DictionaryVersion))
				for _, r := range analyzer.Select(inputs, analyzer.Thresholds{Rho: ac.Rho, Delta: ac.Delta, K: ac.K}) {
					row := reportRow{Environment: c.Environment, AgentVersion: c.AgentVersion, DictionaryVersion: c.DictionaryVersion,
						Capability: r.Name, Cov: r.MeanCov, ERFailed: r.MeanERFail, ERPassed: r.MeanERPass, Delta: r.MeanDelta,
						RunsPassed: r.RunsPassed, RunsTotal: r.RunsTotal, Rollouts: info.Rollouts, Failures: info.Failures, Reasons: r.Rejection}
					switch {
					case info.Failures < ac.MinFailures:
						row.Decision = "undecided"
						row.Reasons = []string{fmt.Sprintf("%d failures in the window, needs %d", info.Failures, ac.MinFailures)}
					case runs < ac.N:
						row.Decision = "undecided"
						row.Reasons = []string{fmt.Sprintf("%d complete labeling runs, needs %d", runs, ac.N)}
					case r.Selected:
						row.Decision = "selected"
					default:
						row.Decision = "rejected"
					}
					row.Synthesis = synth[fmt.Sprintf("%s/%s/%d/%s", c.Environment, c.AgentVersion, c.DictionaryVersion, r.Name)]
					rows = append(rows, row)
				}
			}
			return writeReport(cmd.OutOrStdout(), format, rows)
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&env, "env", "", "only this environment")
	cmd.Flags().StringVar(&format, "format", "table", "table, json or csv")
	rootCmd.AddCommand(cmd)
}

func writeReport(w io.Writer, format string, rows []reportRow) error {
	switch format {
	case "json":
		if rows == nil {
			rows = []reportRow{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	case "csv":
		cw := csv.NewWriter(w)
		cw.Write([]string{"environment", "agent_version", "dictionary_version", "capability", "cov", "er_failed", "er_passed", "delta", "runs_passed", "runs_total", "decision", "reasons",
			"environment_id", "environment_status"})
		for _, r := range rows {
			id, status := "", ""
			if r.Synthesis != nil {
				id, status = r.Synthesis.ID, r.Synthesis.Status
			}
			cw.Write([]string{r.Environment, r.AgentVersion, fmt.Sprint(r.DictionaryVersion), r.Capability, f4(r.Cov), f4(r.ERFailed), f4(r.ERPassed), f4(r.Delta),
				fmt.Sprint(r.RunsPassed), fmt.Sprint(r.RunsTotal), r.Decision, strings.Join(r.Reasons, "; "), id, status})
		}
		cw.Flush()
		return cw.Error()
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "no labeled rollouts in the window yet")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "environment\tagent\tdict\tcapability\tCov\tER-\tER+\tΔ\truns\tdecision\tsynthesis\treasons")
	var synth []reportRow
	for _, r := range rows {
		st := "-"
		if r.Synthesis != nil {
			st = r.Synthesis.Status
			synth = append(synth, r)
		}
		fmt.Fprintf(tw, "%s\t%s\tv%d\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", r.Environment, r.AgentVersion, r.DictionaryVersion, r.Capability,
			f4(r.Cov), f4(r.ERFailed), f4(r.ERPassed), f4(r.Delta), r.RunsPassed, r.RunsTotal, r.Decision, st, strings.Join(r.Reasons, "; "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(synth) > 0 {
		fmt.Fprintln(w, "\nenvironments (trace env show ID for one):")
		for _, r := range synth {
			e := r.Synthesis
			line := fmt.Sprintf("  %s  %s/%s %s  %s  attempt %d", e.ID, r.Environment, r.AgentVersion, r.Capability, e.Status, e.Attempts)
			if e.Mean != nil {
				line += fmt.Sprintf("  mean %.3f  success %.3f", *e.Mean, *e.Success)
				if e.Simulated {
					line += "  [SIMULATED policy]"
				}
			}
			if e.Reason != "" {
				line += "  — " + cutText(e.Reason, 200)
			}
			fmt.Fprintln(w, line)
		}
	}
	return nil
}

func f4(f float64) string { return fmt.Sprintf("%.4f", f) }
