package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/traceops/trace/analyzer"
)

func init() {
	dict := &cobra.Command{
		Use:   "dict",
		Short: "Manage capability dictionaries",
		Long: `A capability dictionary is a frozen, versioned set of capabilities scoped to an
(environment, agent version); agent_version "*" covers every version of the
environment. Labelers never invent or rename capabilities: a changed
dictionary becomes a new version, which running analyzers pick up without a
restart (announced on the NATS KV bucket trace_dictionaries).`,
	}
	var (
		cf          configFlags
		bf          backfillFlags
		backfillNow bool
	)
	apply := &cobra.Command{
		Use:   "apply FILE... [--backfill [--since T] [--yes]]",
		Short: "Validate and store dictionaries from YAML files",
		Long: `apply validates dictionaries and stores each as a version in ClickHouse,
announced on NATS: running analyzers label new rollouts with it without a
restart. A dictionary scoped to an environment (or an agent version) wins
over the default (environment "*") and gets a version above it.

Nothing is stored unless every file is valid: an unknown key, or a detector
that does not compile, names a variable or field the rules labeler does not
have, or does not return a string ("NA", "PRESENT" or "LACKING"), is an
error naming the capability (docs/dictionary.md).

The version in the file is the one stored when it is above every version
of its scope and of the broader dictionaries that label its cohorts;
otherwise apply assigns the next free version, and says so. Content that is
already the current version of its scope is not stored again.

--backfill also labels the rollouts already stored in ClickHouse that the
new version now labels (see trace relabel: the same labeler, never a run
labeled twice, resumable, --yes for the llm labeler's cost), then evaluates
their cohorts.`,
		Example: `  trace dict apply analyzer/dictionaries/tau-tools.yaml
  trace dict apply tau2-airline.yaml --backfill`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, files []string) error {
			var ds []*analyzer.Dictionary
			for _, f := range files {
				data, err := os.ReadFile(f)
				if err != nil {
					return err
				}
				d, err := analyzer.ParseDictionaries(f, data)
				if err != nil {
					return err
				}
				ds = append(ds, d...)
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
			if cfg.Analyzer.Labeler == "rules" {
				for _, d := range ds {
					if missing := d.WithoutDetector(); len(missing) > 0 {
						fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s/%s: no detector for %s: the rules labeler (analyzer.labeler: rules) fails every labeling run with this dictionary; add detectors, or label with analyzer.labeler: llm\n",
							d.Environment, d.AgentVersion, strings.Join(missing, ", "))
					}
				}
			}
			var applied []*analyzer.Dictionary
			for _, d := range ds {
				asked := d.Version
				stored, err := w.apply(ctx, d)
				if err != nil {
					return err
				}
				applied = append(applied, stored)
				fmt.Fprintf(cmd.OutOrStdout(), "%s/%s: version %d (%d capabilities)%s\n", stored.Environment, stored.AgentVersion, stored.Version, len(stored.Capabilities), versionNote(asked, stored, stored != d))
			}
			if !backfillNow {
				return nil
			}
			since, err := bf.sinceTime()
			if err != nil {
				return err
			}
			for _, d := range applied {
				if err := backfill(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), cfg, w, analyzer.BackfillFilter{Since: since, Dictionary: d}, bf.yes); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cf.add(apply)
	bf.add(apply)
	apply.Flags().BoolVar(&backfillNow, "backfill", false, "also label the rollouts already stored that the new versions label")
	var scf configFlags
	var all bool
	show := &cobra.Command{
		Use:   "show",
		Short: "Print the stored dictionaries",
		Example: `  trace dict show
  trace dict show --all --set clickhouse.addr=clickhouse:9000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := scf.load()
			if err != nil {
				return err
			}
			st, err := openStore(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer st.Close()
			rows, err := st.LatestDictionaries(cmd.Context())
			if all {
				rows, err = st.AllDictionaries(cmd.Context())
			}
			if err != nil {
				return err
			}
			if len(rows) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no dictionaries stored yet (trace dict apply FILE)")
			}
			w := cmd.OutOrStdout()
			for _, r := range rows {
				d, err := analyzer.DictionaryFromRow(r)
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "%s / agent %s — version %d (%s, %s)\n", d.Environment, d.AgentVersion, d.Version, d.Source, d.CreatedAt.Format("2006-01-02 15:04"))
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				for _, c := range d.Capabilities {
					fmt.Fprintf(tw, "  %s\t%s\n", c.Name, oneLine(c.Definition, 100))
				}
				tw.Flush()
				fmt.Fprintln(w)
			}
			return nil
		},
	}
	scf.add(show)
	show.Flags().BoolVar(&all, "all", false, "every version, not only the newest")
	dict.AddCommand(apply, show)
	rootCmd.AddCommand(dict)
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

// versionNote says how the version stored for a dictionary relates to the
// one its file gives: "" when they are the same and it was stored.
func versionNote(asked uint32, stored *analyzer.Dictionary, unchanged bool) string {
	switch {
	case unchanged && asked == stored.Version:
		return ": unchanged, already stored"
	case unchanged:
		return fmt.Sprintf(": unchanged, these capabilities are already stored as version %d; the file's version %d is not used", stored.Version, asked)
	case asked != stored.Version:
		return fmt.Sprintf(": the file says version %d, but versions up to %d are taken by %s or a broader dictionary that labels its cohorts", asked, stored.Version-1, stored.Scope())
	}
	return ""
}
