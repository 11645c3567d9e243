package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
	"github.com/traceops/trace/verify"
)

// reportRow is one capability of one cohort in `trace report`, or, with
// Decision "no labels" and no capability, a cohort that has stored rollouts
// but no labels, with the reason.
type reportRow struct {
	// Source is "evaluator" (its latest stored evaluation) or "computed"
	// (from the window now: --fresh, another --window, or not evaluated).
	Source            string    `json:"source,omitempty"`
	Environment       string    `json:"environment"`
	AgentVersion      string    `json:"agent_version"`
	DictionaryVersion uint32    `json:"dictionary_version"`
	Dictionary        string    `json:"dictionary,omitempty"` // its scope, e.g. "*/*" for the default
	DefaultDictionary bool      `json:"default_dictionary,omitempty"`
	Capability        string    `json:"capability"`
	Cov               float64   `json:"cov"`
	ERFailed          float64   `json:"er_failed"`
	ERPassed          float64   `json:"er_passed"`
	Delta             float64   `json:"delta"`
	RunsPassed        int       `json:"runs_passed"`
	RunsTotal         int       `json:"runs_total"`
	Decision          string    `json:"decision"`
	Reasons           []string  `json:"reasons,omitempty"`
	Rollouts          int       `json:"window_rollouts"`
	Failures          int       `json:"window_failures"`
	Watermark         time.Time `json:"as_of,omitzero"` // the cohort's newest rollout's end time: the window ends here
	// K and N: the cohort's selection rule, at least K of N runs passed
	// (analyzer.k and analyzer.n, or its labels' source's); absent without
	// labels.
	K int `json:"k,omitempty"`
	N int `json:"n,omitempty"`
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

// attachEnvironments sets each row's Synthesis to the newest environment
// made for its capability.
func attachEnvironments(ctx context.Context, st *sink.Store, env string, rows []reportRow) error {
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
	for i := range rows {
		r := &rows[i]
		r.Synthesis = synth[fmt.Sprintf("%s/%s/%d/%s", r.Environment, r.AgentVersion, r.DictionaryVersion, r.Capability)]
	}
	return nil
}

// reportWindow parses --window: a duration, or "all" for every rollout.
func reportWindow(s string, def time.Duration) (time.Duration, error) {
	switch s {
	case "":
		return def, nil
	case "all":
		return time.Duration(math.MaxInt64), nil
	}
	d, err := config.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("--window %q: want a positive duration (24h, 7d) or all", s)
	}
	return d, nil
}

func init() {
	var (
		cf      configFlags
		env     string
		format  string
		window  string
		loop    bool
		fresh   bool
		adapter string
	)
	cmd := &cobra.Command{
		Use:   "report",
		Short: "Per-capability statistics and decisions, read from ClickHouse",
		Long: `report evaluates the configured window (analyzer.window, analyzer.window_rollouts)
of every cohort (environment, agent version, dictionary version) stored in
ClickHouse and prints, per capability: mean Cov, ER-, ER+ and gap over the
labeling runs, runs passed, the decision and the reasons for a rejection, and
the status of the environment the synthesize role made for a selected one
(PENDING … DONE, FAILED, WAITING_FOR_LLM; see trace env list).

Windows follow event time, as the analyzer's do: each cohort's window ends
at its watermark, the end time of its newest labeled rollout ("as of"), so
replayed history reports as it did live. --window all takes every rollout
(analyzer.window_rollouts does not apply then); a duration replaces
analyzer.window, and analyzer.window_rollouts still keeps the last M.

A cohort the analyze role's evaluator has evaluated shows its latest stored
evaluation (the decision as it made it, at most analyzer.interval old; the
json field source says "evaluator"); --fresh, or another --window, computes
every decision from its window now ("computed").
A watermark in the future (clock skew) is reported with a warning.

A cohort with stored rollouts but no labels is listed with the reason (no
dictionary and no LLM, a labeler failing, rollouts stored before their
dictionary) and the setting or command that changes it; a cohort without
a decision says why (too few failures: analyzer.min_failures).

The closed loop (TRACE step 4) follows in the table, and alone with --loop
(table, json or csv): for every adapter that was activated, its
capability's Δ, ER-, ER+, Cov and pass rate on the base model's rollouts
before activation beside the rollouts routed to it, with 95 % intervals,
the verdict (gap_closed, improved, no_change, worse, not_enough_data; see
verify.*), the routing share per adapter per hour, and the tokens of the
proxied requests per day and adapter (the upstream's usage; json field
tokens).

--loop --adapter NAME reports that one adapter and exits with its verdict,
for CI and scripts: 0 gap_closed; 2 not closed (improved, no_change,
worse); 3 undecided (not_enough_data); 1 an error (no such adapter in the
closed loop, its check could not be read).`,
		Example: `  trace report --env sim-airline --format table
  trace report --window all --format json
  trace report --loop --format json
  trace report --loop --adapter sim-precondition-verification-8f8e61e2 --format json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format = formatOrJSON(cmd, format)
			switch format {
			case "table", "json", "csv":
			default:
				return fmt.Errorf("--format must be table, json or csv, got %q", format)
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			win, err := reportWindow(window, cfg.Analyzer.Window)
			if err != nil {
				return err
			}
			if window == "all" {
				// Every rollout: not the last analyzer.window_rollouts either.
				cfg.Analyzer.WindowRollouts = 0
			}
			ctx := cmd.Context()
			st, err := openStore(ctx, cfg)
			if err != nil {
				return err
			}
			defer st.Close()
			if adapter != "" && !loop {
				return errors.New("--adapter needs --loop: it selects one adapter of the closed loop")
			}
			if loop {
				if err := knownEnvironment(ctx, st, env); err != nil {
					return err
				}
				rep, err := loopReport(ctx, cfg, st, env, loopShareWindow(window))
				if err != nil {
					return err
				}
				var ac *verify.AdapterCheck
				if adapter != "" {
					a, err := onlyAdapter(rep, adapter)
					if err != nil {
						return &exitError{code: 1, err: err}
					}
					ac = &a
				}
				if format == "csv" { // the table and JSON carry them; CSV has no place for them
					for _, e := range rep.Errors {
						fmt.Fprintln(cmd.ErrOrStderr(), "warning: closed loop: left out, could not be read:", e)
					}
				}
				if err := writeLoop(cmd.OutOrStdout(), format, rep); err != nil || ac == nil {
					return err
				}
				return verdictExit(*ac)
			}
			rows, warnings, err := buildReport(ctx, cfg, st, env, win, !fresh, time.Now())
			if err != nil {
				return err
			}
			if err := attachEnvironments(ctx, st, env, rows); err != nil {
				return err
			}
			for _, w := range warnings {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
			}
			if err := writeReport(cmd.OutOrStdout(), format, rows); err != nil || format != "table" {
				return err
			}
			rep, err := loopReport(ctx, cfg, st, env, loopShareWindow(window))
			if err != nil {
				return err
			}
			if len(rep.Capabilities) == 0 {
				return nil
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return writeLoop(cmd.OutOrStdout(), format, rep)
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&env, "env", "", "only this environment")
	cmd.Flags().StringVar(&format, "format", "table", "table, json or csv")
	addJSONFlag(cmd)
	cmd.Flags().BoolVar(&fresh, "fresh", false, "compute every decision from its window now, not the evaluator's latest evaluation")
	cmd.Flags().BoolVar(&loop, "loop", false, "only the closed loop: each activated adapter's before/after, verdict, routing share and tokens")
	cmd.Flags().StringVar(&adapter, "adapter", "", "with --loop: only this adapter, and exit with its verdict (0 gap_closed, 2 not closed, 3 not_enough_data, 1 error)")
	cmd.Flags().StringVar(&window, "window", "", "the window back from each cohort's watermark: a duration (24h, 7d), or all (default analyzer.window)")
	rootCmd.AddCommand(cmd)
}

// buildReport evaluates every cohort's event-time window and explains the
// stored (environment, agent version)s that have no labels.
//
// With stored, a cohort the evaluator has evaluated over the same window
// shows that evaluation (its decision as made); the others, and every cohort
// without stored, are computed from their windows now.
func buildReport(ctx context.Context, cfg config.Config, st *sink.Store, env string, window time.Duration, stored bool, now time.Time) ([]reportRow, []string, error) {
	ac := cfg.Analyzer.EvalConfig
	marks, err := st.Watermarks(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	keys, err := st.RolloutKeys(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := checkEnvironment(env, keys, marks); err != nil {
		return nil, nil, err
	}
	reg := analyzer.NewRegistry()
	if err := reg.Load(ctx, st); err != nil {
		return nil, nil, err
	}
	var cohorts []sink.Cohort
	for c := range marks {
		if env == "" || c.Environment == env {
			cohorts = append(cohorts, c)
		}
	}
	sort.Slice(cohorts, func(i, j int) bool {
		a, b := cohorts[i], cohorts[j]
		if a.Environment != b.Environment {
			return a.Environment < b.Environment
		}
		if a.AgentVersion != b.AgentVersion {
			return a.AgentVersion < b.AgentVersion
		}
		return a.DictionaryVersion < b.DictionaryVersion
	})
	// The evaluator's stored evaluations, when the window is its own and
	// not asked for fresh: what it decided, without reading the windows
	// again. The other cohorts are computed from their windows.
	type decided struct {
		results []analyzer.Result
		info    sink.WindowInfo
		runs    int
		kn      analyzer.KOfN // the cohort's K of N
		source  string
	}
	got := map[sink.Cohort]decided{}
	need := cohorts
	if stored && window == ac.Window {
		evs, err := st.LatestEvaluations(ctx, cohorts)
		if err != nil {
			return nil, nil, err
		}
		need = nil
		for _, c := range cohorts {
			if s, ok := evs[c]; ok {
				// One stored without its K of N (before it was recorded)
				// is computed again.
				if ev, err := analyzer.ParseEvaluation(s.Payload); err == nil && ev.N > 0 {
					got[c] = decided{ev.Results, sink.WindowInfo{Rollouts: ev.Rollouts, Failures: ev.Failures}, ev.Runs, ev.KOfN, "evaluator"}
					marks[c] = ev.AsOf
					continue
				}
			}
			need = append(need, c)
		}
	}
	if len(need) > 0 {
		wc := ac
		wc.Window = window
		w, err := analyzer.ReadWindows(ctx, st, need, wc)
		if err != nil {
			return nil, nil, err
		}
		for _, c := range need {
			inputs, runs := analyzer.CohortInputs(w.Counts[c], reg.Version(c.Environment, c.AgentVersion, c.DictionaryVersion))
			kn := w.KOfN[c]
			got[c] = decided{analyzer.Select(inputs, analyzer.Thresholds{Rho: ac.Rho, Delta: ac.Delta, K: kn.K}), w.Infos[c], runs, kn, "computed"}
		}
	}
	var (
		rows     []reportRow
		warnings []string
	)
	labeled := map[sink.Cohort]bool{}
	labeledAny := map[[2]string]bool{}
	for _, c := range cohorts {
		labeled[c], labeledAny[[2]string{c.Environment, c.AgentVersion}] = true, true
		d := got[c]
		info, wm, runs := d.info, marks[c], d.runs
		if ahead := wm.Sub(now); ahead > analyzer.FutureSkew {
			warnings = append(warnings, fmt.Sprintf("%s: its newest rollout ends %s in the future (%s; clock skew?); its window ends there", c, ahead.Round(time.Second), wm.Format(time.RFC3339)))
		}
		dict := reg.Version(c.Environment, c.AgentVersion, c.DictionaryVersion)
		if len(d.results) == 0 {
			// Labeled, but no statistics: with N > 1 no rollout of the
			// window is labeled in every run. Listed, not left out.
			row := reportRow{Source: d.source, Environment: c.Environment, AgentVersion: c.AgentVersion, DictionaryVersion: c.DictionaryVersion,
				Decision: "undecided", Rollouts: info.Rollouts, Failures: info.Failures, Watermark: wm, K: d.kn.K, N: d.kn.N, Reasons: []string{whyEmptyWindow(d.kn.N)}}
			if dict != nil {
				row.Dictionary, row.DefaultDictionary = dict.Scope(), dict.IsDefault()
			}
			rows = append(rows, row)
			continue
		}
		undecided := analyzer.WhyUndecided(info.Failures, ac.MinFailures, runs, d.kn.N)
		for _, r := range d.results {
			row := reportRow{Source: d.source, Environment: c.Environment, AgentVersion: c.AgentVersion, DictionaryVersion: c.DictionaryVersion,
				Capability: r.Name, Cov: r.MeanCov, ERFailed: r.MeanERFail, ERPassed: r.MeanERPass, Delta: r.MeanDelta,
				RunsPassed: r.RunsPassed, RunsTotal: r.RunsTotal, Rollouts: info.Rollouts, Failures: info.Failures, Reasons: r.Rejection, Watermark: wm, K: d.kn.K, N: d.kn.N}
			if dict != nil {
				row.Dictionary, row.DefaultDictionary = dict.Scope(), dict.IsDefault()
			}
			switch {
			case undecided != "":
				row.Decision = "undecided"
				row.Reasons = []string{undecided}
			case r.Selected:
				row.Decision = "selected"
			default:
				row.Decision = "rejected"
			}
			rows = append(rows, row)
		}
	}
	// Stored rollouts whose current dictionary labeled none of them: the
	// (environment, agent version)s from the small aggregate, then the
	// exact counts of the unlabeled ones only.
	var unlabeled [][2]string
	for _, k := range keys {
		if env != "" && k[0] != env {
			continue
		}
		d := reg.Resolve(k[0], k[1])
		c := sink.Cohort{Environment: k[0], AgentVersion: k[1]}
		if d != nil {
			c.DictionaryVersion = d.Version
		}
		if !((d != nil && labeled[c]) || (d == nil && labeledAny[k])) {
			unlabeled = append(unlabeled, k)
		}
	}
	scopes, err := st.RolloutScopesOf(ctx, unlabeled)
	if err != nil {
		return nil, nil, err
	}
	failed, err := st.FailedLabelRuns(ctx)
	if err != nil {
		return nil, nil, err
	}
	failedBy := map[sink.Cohort]sink.FailedRuns{}
	for _, f := range failed {
		failedBy[f.Cohort] = f
	}
	setup := analyzer.LabelingSetup{Labeler: cfg.Analyzer.Labeler, LLM: cfg.LLM.BaseURL != "" && cfg.Analyzer.Labeler == "llm"}
	for _, sc := range scopes {
		if env != "" && sc.Environment != env {
			continue
		}
		d := reg.Resolve(sc.Environment, sc.AgentVersion)
		c := sink.Cohort{Environment: sc.Environment, AgentVersion: sc.AgentVersion}
		if d != nil {
			c.DictionaryVersion = d.Version
		}
		// Labeled under its current dictionary, or (no dictionary stored:
		// external labels) under any version: not a cohort without labels.
		if (d != nil && labeled[c]) || (d == nil && labeledAny[[2]string{sc.Environment, sc.AgentVersion}]) {
			continue
		}
		row := reportRow{Environment: sc.Environment, AgentVersion: sc.AgentVersion, DictionaryVersion: c.DictionaryVersion,
			Decision: "no labels", Rollouts: sc.Rollouts, Failures: sc.Failures, Watermark: sc.Watermark,
			Reasons: []string{analyzer.WhyNoLabels(setup, sc.Environment, sc.AgentVersion, d, failedBy[c])}}
		if d != nil {
			row.Dictionary, row.DefaultDictionary = d.Scope(), d.IsDefault()
		}
		rows = append(rows, row)
	}
	return rows, warnings, nil
}

// whyEmptyWindow is why a labeled cohort's window has no statistics: its
// window counts only the rollouts labeled in every one of the n runs.
func whyEmptyWindow(n int) string {
	if n > 1 {
		return fmt.Sprintf("no rollout in the window is labeled in all %d runs (analyzer.n, llm.runs): a decision counts only rollouts labeled in every run", n)
	}
	return "no labels in the window"
}

// cohortOnly is a row that stands for its cohort, without a capability
// (no labels, or labels without statistics): the table prints its reason
// under the cohort's line.
func cohortOnly(r reportRow) bool { return r.Capability == "" }

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
		cw.Write([]string{"environment", "agent_version", "dictionary_version", "capability", "cov", "er_failed", "er_passed", "delta", "runs_passed", "runs_total", "decision", "reasons", "as_of",
			"environment_id", "environment_status"})
		for _, r := range rows {
			id, status := "", ""
			if r.Synthesis != nil {
				id, status = r.Synthesis.ID, r.Synthesis.Status
			}
			cw.Write([]string{r.Environment, r.AgentVersion, fmt.Sprint(r.DictionaryVersion), r.Capability, f4(r.Cov), f4(r.ERFailed), f4(r.ERPassed), f4(r.Delta),
				fmt.Sprint(r.RunsPassed), fmt.Sprint(r.RunsTotal), r.Decision, strings.Join(r.Reasons, "; "), r.Watermark.UTC().Format(time.RFC3339), id, status})
		}
		cw.Flush()
		return cw.Error()
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "no rollouts stored yet (nothing labeled, nothing to report)")
		return nil
	}
	// One line per cohort first: its dictionary, its watermark and window.
	seen := map[string]bool{}
	for _, r := range rows {
		k := fmt.Sprintf("%s/%s v%d", r.Environment, r.AgentVersion, r.DictionaryVersion)
		if seen[k] {
			continue
		}
		seen[k] = true
		dict := "no dictionary"
		if r.Dictionary != "" {
			dict = fmt.Sprintf("dictionary %s v%d", r.Dictionary, r.DictionaryVersion)
			if r.DefaultDictionary {
				dict += " (the default)"
			}
		}
		// A cohort without labels has no window: its counts are of every
		// rollout stored.
		where := "in the window"
		if r.Decision == "no labels" {
			where = "stored"
		}
		kofn := ""
		if r.N > 0 {
			kofn = fmt.Sprintf("; selection: %d of %d runs", r.K, r.N)
		}
		fmt.Fprintf(w, "%s/%s: %s, as of %s: %d rollouts, %d failures %s%s\n", r.Environment, r.AgentVersion, dict,
			r.Watermark.UTC().Format("2006-01-02 15:04:05 UTC"), r.Rollouts, r.Failures, where, kofn)
		if cohortOnly(r) {
			fmt.Fprintf(w, "  %s: %s\n", r.Decision, strings.Join(r.Reasons, "; "))
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "environment\tagent\tdict\tcapability\tCov\tER-\tER+\tΔ\truns\tdecision\tsynthesis\treasons")
	n := 0
	var synth []reportRow
	for _, r := range rows {
		if cohortOnly(r) {
			continue
		}
		n++
		st := "-"
		if r.Synthesis != nil {
			st = r.Synthesis.Status
			synth = append(synth, r)
		}
		fmt.Fprintf(tw, "%s\t%s\tv%d\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", r.Environment, r.AgentVersion, r.DictionaryVersion, r.Capability,
			f4(r.Cov), f4(r.ERFailed), f4(r.ERPassed), f4(r.Delta), r.RunsPassed, r.RunsTotal, r.Decision, st, strings.Join(r.Reasons, "; "))
	}
	if n == 0 {
		fmt.Fprintln(w, "no capability statistics yet (reasons above)")
		return nil
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
