package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/traceops/trace/internal/dev/simpolicy"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
	"github.com/traceops/trace/synthesizer/calibrate"
)

// The synthesizer stage's `trace env` subcommands: list and show the
// synthesized environments stored in ClickHouse, and calibrate a program
// with a policy model (env.go holds validate and play).

func init() {
	envCmd.AddCommand(newEnvListCmd(), newEnvShowCmd(), newEnvCalibrateCmd())
}

func newEnvListCmd() *cobra.Command {
	var (
		cf                         configFlags
		status, env, agent, format string
		limit                      int
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the synthesized environments and their status (from ClickHouse)",
		Long: `list prints every environment the synthesize role made from a synthesis
request (newest first): its id, cohort, capability, status (PENDING,
GENERATING, VALIDATING, CALIBRATING, DONE, FAILED, WAITING_FOR_LLM),
attempts, template family, tools, and the accepted calibration's mean
reward, success rate and pass@k. Calibrations played by the simulated
policy (trace demo) are marked SIMULATED.`,
		Example: "  trace env list\n  trace env list --status FAILED --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format = formatOrJSON(cmd, format)
			status = strings.ToUpper(status) // as trace train list, in any case
			if format != "table" && format != "json" {
				return fmt.Errorf("--format must be table or json, got %q", format)
			}
			if status != "" && !validStatus(status) {
				return fmt.Errorf("--status must be one of %s, got %q", statusList(), status)
			}
			if limit < 0 {
				return fmt.Errorf("--limit %d: want 0 (all) or more", limit)
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			st, err := openStore(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer st.Close()
			es, err := synthesizer.SinkStore{Rows: st}.List(cmd.Context(), sink.EnvironmentFilter{Status: status, Environment: env, AgentVersion: agent, Limit: limit})
			if err != nil {
				return err
			}
			if format == "json" {
				return writeJSON(cmd.OutOrStdout(), environmentSummaries(es))
			}
			printEnvironments(cmd.OutOrStdout(), es)
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&status, "status", "", "only environments in this status")
	cmd.Flags().StringVar(&env, "env", "", "only this target environment")
	cmd.Flags().StringVar(&agent, "agent-version", "", "only this agent version")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many (0: all)")
	cmd.Flags().StringVar(&format, "format", "table", "table | json")
	addJSONFlag(cmd)
	return cmd
}

func newEnvShowCmd() *cobra.Command {
	var (
		cf     configFlags
		asJSON bool
		noProg bool
	)
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one synthesized environment: its program, attempts and calibration",
		Long: `show prints one environment (an id from trace env list): the request it was
made for, its status, every attempt with where it ended and its diagnosis
(what the repair loop was told), the accepted calibration with its reward
histogram and pass@k, and the program. --json prints the whole record.`,
		Example: "  trace env show env-3f1c2a9e0b7d4c15\n  trace env show env-3f1c2a9e0b7d4c15 --json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			st, err := openStore(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer st.Close()
			e, err := synthesizer.SinkStore{Rows: st}.LoadEnvironment(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if e == nil {
				return &exitError{code: 1, err: fmt.Errorf("no environment %q (see trace env list)", args[0])}
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), e)
			}
			printEnvironment(cmd.OutOrStdout(), e, !noProg)
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the whole record as JSON")
	cmd.Flags().BoolVar(&noProg, "no-program", false, "leave the program out")
	return cmd
}

func newEnvCalibrateCmd() *cobra.Command {
	var (
		ef                       envFlags
		policyURL, model, apiKey string
		flagCfg                  = calibrate.DefaultConfig()
		asJSON                   bool
		timeout                  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "calibrate FILE --policy URL --model M",
		Short: "Calibrate an environment program with a policy model",
		Long: `calibrate plays FILE's environment with a policy over the OpenAI-compatible
chat API with tool calling (--policy is the API root, e.g.
http://127.0.0.1:8000/v1 for vLLM; the key is $TRACE_LLM_API_KEY or
$OPENAI_API_KEY) — by default the release's 100 seeds × 16 rollouts at
temperature 0.7, with the hint on 25–50 % of each group — and judges the
rewards against the bands: mean reward and success rate in [0.2, 0.6],
reward std ≥ 0.05, all-success and all-zero groups ≤ 20 %, constant groups
≤ 50 %, informative groups ≥ 50 %. It prints the summary, pass@{1,4,8,16}
and the reward histogram; the exit status is 1 when the environment is not
accepted (too easy, too hard, uninformative).

--policy simulated:ENV/VERSION/CAPABILITY plays the simulated fleet's agent
version instead of a model (as trace demo does); its results are labeled
SIMULATED.`,
		Example: `  trace env calibrate example:precondition_airline --policy http://127.0.0.1:8000/v1 --model Qwen/Qwen3-30B-A3B-Instruct-2507
  trace env calibrate my_env.star --policy simulated:sim-airline/1.4.0/precondition_verification --seeds 20 --rollouts 8`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg := flagCfg // this run's copy (Progress is set per run)
			if err := ef.check(); err != nil {
				return err
			}
			if policyURL == "" {
				return fmt.Errorf("--policy is required (an OpenAI-compatible API root, or simulated:ENV/VERSION/CAPABILITY)")
			}
			name, src, err := readProgram(args[0])
			if err != nil {
				return err
			}
			var policy calibrate.Policy
			if spec, ok := strings.CutPrefix(policyURL, "simulated:"); ok {
				parts := strings.Split(spec, "/")
				if len(parts) != 3 {
					return fmt.Errorf("--policy simulated:%s: want simulated:ENV/VERSION/CAPABILITY", spec)
				}
				p, err := simpolicy.SimulatedFleetPolicy(simulate.DefaultFleet(), parts[0], parts[1], parts[2])
				if err != nil {
					return fmt.Errorf("--policy: %v", err)
				}
				policy = p
			} else {
				if model == "" {
					return fmt.Errorf("--model is required with a policy URL")
				}
				if timeout < 0 {
					return fmt.Errorf("--timeout %s: want a positive duration (0: the default, %s)", timeout, llm.DefaultTimeout)
				}
				client, err := llm.New(llm.Config{BaseURL: policyURL, Model: model, APIKey: llm.Secret(apiKey), Timeout: timeout})
				if err != nil {
					return fmt.Errorf("--policy/--model: %v", err)
				}
				policy = calibrate.NewOpenAIPolicy(client, "trace-env-calibrate")
			}
			if err := cfg.Check(calibrateFlag); err != nil {
				return err
			}
			ctx := cmd.Context()
			env, err := ef.load(ctx, name, src)
			if err != nil {
				return err
			}
			defer env.Close()
			out := cmd.OutOrStdout()
			if !asJSON {
				fmt.Fprintf(out, "calibrating %s: %d seeds × %d rollouts at temperature %.2f with %s\n", name, cfg.Seeds, cfg.Rollouts, cfg.Temperature, policy)
				last := time.Now()
				cfg.Progress = func(p calibrate.Progress) {
					if time.Since(last) > 10*time.Second || p.Done == p.Total {
						fmt.Fprintf(cmd.ErrOrStderr(), "… %d/%d rollouts\n", p.Done, p.Total)
						last = time.Now()
					}
				}
			}
			res, err := calibrate.Run(ctx, env, policy, cfg)
			if err != nil {
				return err
			}
			c := synthesizer.FromSummary(res.Summary, cfg)
			if asJSON {
				if err := writeJSON(out, c); err != nil {
					return err
				}
			} else {
				printCalibration(out, c)
			}
			if !c.Accepted {
				return &exitError{code: 1, err: fmt.Errorf("%s not accepted: %s", name, c.Verdict)}
			}
			return nil
		},
	}
	ef.add(cmd)
	f := cmd.Flags()
	f.StringVar(&policyURL, "policy", "", "policy server: OpenAI-compatible API root (…/v1), or simulated:ENV/VERSION/CAPABILITY")
	f.StringVar(&model, "model", "", "policy model name")
	f.StringVar(&apiKey, "api-key", "", "API key (default $TRACE_LLM_API_KEY, then $OPENAI_API_KEY)")
	f.DurationVar(&timeout, "timeout", llm.DefaultTimeout, "time limit of one policy call")
	f.IntVar(&flagCfg.Seeds, "seeds", flagCfg.Seeds, "seeds 0..N-1")
	f.IntVar(&flagCfg.Rollouts, "rollouts", flagCfg.Rollouts, "rollouts per seed (the group size)")
	f.Float64Var(&flagCfg.Temperature, "temperature", flagCfg.Temperature, "policy sampling temperature")
	f.IntVar(&flagCfg.Concurrency, "concurrency", flagCfg.Concurrency, "rollouts played at once")
	f.Float64Var(&flagCfg.HintShareMin, "hint-min", flagCfg.HintShareMin, "least share of each group that gets the hint")
	f.Float64Var(&flagCfg.HintShareMax, "hint-max", flagCfg.HintShareMax, "largest share of each group that gets the hint")
	f.Float64Var(&flagCfg.Bands.MeanMin, "mean-min", flagCfg.Bands.MeanMin, "accepted mean reward, lower bound")
	f.Float64Var(&flagCfg.Bands.MeanMax, "mean-max", flagCfg.Bands.MeanMax, "accepted mean reward, upper bound")
	f.Float64Var(&flagCfg.Bands.SuccessMin, "success-min", flagCfg.Bands.SuccessMin, "accepted success rate, lower bound")
	f.Float64Var(&flagCfg.Bands.SuccessMax, "success-max", flagCfg.Bands.SuccessMax, "accepted success rate, upper bound")
	f.BoolVar(&asJSON, "json", false, "print the calibration as JSON")
	return cmd
}

// calibrateFlag names a calibration setting (calibrate.Config.Check's key)
// by trace env calibrate's flag.
func calibrateFlag(key string) string {
	if f, ok := map[string]string{
		"seeds": "--seeds", "rollouts": "--rollouts", "temperature": "--temperature", "concurrency": "--concurrency",
		"hint_share_min": "--hint-min", "hint_share_max": "--hint-max",
		"bands.mean_min": "--mean-min", "bands.mean_max": "--mean-max", "bands.success_min": "--success-min", "bands.success_max": "--success-max",
	}[key]; ok {
		return f
	}
	return "calibration setting " + key // not a flag: its default
}

func validStatus(s string) bool {
	for _, st := range synthesizer.Statuses {
		if string(st) == s {
			return true
		}
	}
	return false
}

func statusList() string {
	var out []string
	for _, st := range synthesizer.Statuses {
		out = append(out, string(st))
	}
	return strings.Join(out, ", ")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// environmentSummary is one environment in `trace env list --format json`
// and in the demo's and the report's summaries.
type environmentSummary struct {
	ID           string             `json:"id"`
	Environment  string             `json:"environment"`
	AgentVersion string             `json:"agent_version"`
	Capability   string             `json:"capability"`
	Status       string             `json:"status"`
	Reason       string             `json:"reason,omitempty"`
	Attempts     int                `json:"attempts"`
	Family       string             `json:"family,omitempty"`
	Tools        []string           `json:"tools"`
	MeanReward   *float64           `json:"mean_reward,omitempty"`
	SuccessRate  *float64           `json:"success_rate,omitempty"`
	PassAtK      map[string]float64 `json:"pass_at_k,omitempty"`
	Simulated    bool               `json:"simulated"`
	// Progress is the calibration's: the running one's while the status
	// is CALIBRATING, else the last one's as it ended.
	Progress  *synthesizer.CalibrationProgress `json:"calibration_progress,omitempty"`
	UpdatedAt time.Time                        `json:"updated_at"`
}

func environmentSummaries(es []*synthesizer.Environment) []environmentSummary {
	out := make([]environmentSummary, 0, len(es))
	for _, e := range es {
		s := environmentSummary{ID: e.ID, Environment: e.Environment, AgentVersion: e.AgentVersion, Capability: e.Capability,
			Status: string(e.Status), Reason: e.Reason, Attempts: e.Attempt, Family: e.Family, Tools: e.Tools, Progress: e.Progress, UpdatedAt: e.UpdatedAt}
		if s.Tools == nil {
			s.Tools = []string{}
		}
		if c := e.Calibration; c != nil {
			s.MeanReward, s.SuccessRate, s.PassAtK, s.Simulated = &c.MeanReward, &c.SuccessRate, c.PassAtK, c.Simulated
		}
		out = append(out, s)
	}
	return out
}

// passAtText is "pass@1 0.38 pass@4 0.80 …".
func passAtText(p map[string]float64) string {
	c := &synthesizer.Calibration{PassAtK: p}
	var parts []string
	for _, k := range c.PassAtKeys() {
		parts = append(parts, fmt.Sprintf("@%s %.2f", k, p[k]))
	}
	return strings.Join(parts, " ")
}

func printEnvironments(w io.Writer, es []*synthesizer.Environment) {
	if len(es) == 0 {
		fmt.Fprintln(w, "no environments yet (the synthesize role makes one per synthesis request)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "id\tenvironment\tagent\tcapability\tstatus\tattempts\tfamily\ttools\tmean\tsuccess\tpass@k")
	for _, e := range es {
		mean, succ, pass := "-", "-", "-"
		if c := e.Calibration; c != nil && e.Status == synthesizer.StatusDone {
			mean, succ, pass = fmt.Sprintf("%.3f", c.MeanReward), fmt.Sprintf("%.3f", c.SuccessRate), passAtText(c.PassAtK)
			if c.Simulated {
				pass += " SIMULATED"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.Environment, e.AgentVersion, e.Capability, e.StatusText(),
			e.Attempt, dash(e.Family), dash(strings.Join(e.Tools, ",")), mean, succ, pass)
	}
	tw.Flush()
	for _, e := range es {
		if e.Reason != "" && (e.Status == synthesizer.StatusFailed || e.Status == synthesizer.StatusWaitingForLLM) {
			fmt.Fprintf(w, "  %s %s: %s\n", e.ID, e.Status, cutText(e.Reason, 240))
		}
	}
}

func printEnvironment(w io.Writer, e *synthesizer.Environment, program bool) {
	fmt.Fprintf(w, "environment %s: %s\n", e.ID, e.StatusText())
	if e.Reason != "" {
		fmt.Fprintf(w, "  reason: %s\n", e.Reason)
	}
	if p := e.CalibratingProgress(); p != nil {
		fmt.Fprintf(w, "  calibrating attempt %d: %d of %d rollouts played (%d %%) at %s, started %s\n", p.Attempt, p.Done, p.Total, p.Percent(),
			p.At.Format(time.RFC3339), p.StartedAt.Format(time.RFC3339))
	}
	fmt.Fprintf(w, "  target: %s/%s, dictionary v%d, trigger %s\n", e.Environment, e.AgentVersion, e.DictionaryVersion, e.TriggerID)
	fmt.Fprintf(w, "  capability: %s (mean Δ %.3f, rank %d): %s\n", e.Capability, e.MeanDelta, e.Rank, e.Definition)
	if e.Family != "" || e.FamilyWhy != "" {
		fmt.Fprintf(w, "  family: %s (%s)\n", dash(e.Family), e.FamilyWhy)
	}
	fmt.Fprintf(w, "  path: %s, attempt %d; created %s, updated %s\n", dash(string(e.Path)), e.Attempt,
		e.CreatedAt.Format(time.RFC3339), e.UpdatedAt.Format(time.RFC3339))
	if len(e.Tools) > 0 {
		fmt.Fprintf(w, "  tools: %s\n", strings.Join(e.Tools, ", "))
	}
	if e.ProgramHash != "" {
		fmt.Fprintf(w, "  program: sha256 %s\n", e.ProgramHash)
	}
	fmt.Fprintf(w, "\nattempts:\n")
	if len(e.Attempts) == 0 {
		fmt.Fprintln(w, "  none yet")
	}
	for _, a := range e.Attempts {
		verdict := "failed at " + a.Stage
		if a.Accepted {
			verdict = "ACCEPTED"
		}
		who := a.Origin
		if a.Model != "" {
			who += " " + a.Model
		}
		if a.Family != "" {
			who += " " + a.Family
		}
		if len(a.Knobs) > 0 {
			who += " knobs " + string(a.Knobs)
		}
		fmt.Fprintf(w, "  %d. %s — %s (%s)\n", a.N, verdict, who, a.EndedAt.Sub(a.StartedAt).Round(time.Millisecond))
		if a.Diagnosis != "" {
			for _, l := range strings.Split(strings.TrimSpace(a.Diagnosis), "\n") {
				fmt.Fprintf(w, "     %s\n", cutText(l, 300))
			}
		}
		if c := a.Calibration; c != nil && !a.Accepted {
			fmt.Fprintf(w, "     calibration: %s\n", calibrationLine(c))
		}
	}
	if c := e.Calibration; c != nil {
		fmt.Fprintln(w)
		printCalibration(w, c)
	}
	if program && e.Program != "" {
		fmt.Fprintf(w, "\nprogram:\n%s", e.Program)
		if !strings.HasSuffix(e.Program, "\n") {
			fmt.Fprintln(w)
		}
	}
}

func calibrationLine(c *synthesizer.Calibration) string {
	s := fmt.Sprintf("%s: mean %.3f, success %.3f, std %.3f, informative %.2f, %s", c.Verdict, c.MeanReward, c.SuccessRate, c.StdReward,
		c.InformativeGroups, passAtText(c.PassAtK))
	if c.Simulated {
		s = "[SIMULATED] " + s
	}
	return s
}

func printCalibration(w io.Writer, c *synthesizer.Calibration) {
	label := ""
	if c.Simulated {
		label = " [SIMULATED: played by a simulated policy, not a model]"
	}
	fmt.Fprintf(w, "calibration%s: %s, policy %s, %d seeds × %d rollouts at temperature %.2f\n", label, strings.ToUpper(c.Verdict), c.Policy,
		c.Seeds, c.RolloutsPerSeed, c.Temperature)
	if c.Diagnosis != "" {
		fmt.Fprintf(w, "  %s\n", c.Diagnosis)
	}
	fmt.Fprintf(w, "  mean reward %.3f  std %.3f  success rate %.3f\n", c.MeanReward, c.StdReward, c.SuccessRate)
	fmt.Fprintf(w, "  groups: all-success %.2f  all-zero %.2f  constant %.2f  informative %.2f\n", c.AllSuccessGroups, c.AllZeroGroups,
		c.ConstantGroups, c.InformativeGroups)
	if len(c.PassAtK) > 0 {
		fmt.Fprintf(w, "  pass%s\n", passAtText(c.PassAtK))
	}
	total := 0
	for _, n := range c.Histogram {
		total += n
	}
	if total == 0 {
		return
	}
	fmt.Fprintln(w, "  reward histogram:")
	for i, n := range c.Histogram {
		lo, hi := float64(i)/float64(len(c.Histogram)), float64(i+1)/float64(len(c.Histogram))
		closer := ")"
		if i == len(c.Histogram)-1 {
			closer = "]"
		}
		bar := strings.Repeat("█", (n*40+total-1)/total)
		fmt.Fprintf(w, "    [%.1f, %.1f%s %5d %s\n", lo, hi, closer, n, bar)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func cutText(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}

// sortEnvironments orders environments by cohort and capability (demo, report).
func sortEnvironments(es []*synthesizer.Environment) {
	sort.Slice(es, func(i, j int) bool {
		a, b := es[i], es[j]
		if a.Environment != b.Environment {
			return a.Environment < b.Environment
		}
		if a.AgentVersion != b.AgentVersion {
			return a.AgentVersion < b.AgentVersion
		}
		return a.Capability < b.Capability
	})
}
