package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"

	"github.com/segmentio/kafka-go"
	"github.com/spf13/cobra"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/sink"
)

func init() {
	labels := &cobra.Command{Use: "labels", Short: "Feed externally produced labels into the statistics"}
	var (
		cf         configFlags
		runsGlob   string
		candidates string
		scope      analyzer.ImportScope
		dictV      uint
		topic      string
	)
	imp := &cobra.Command{
		Use:   "import --runs 'run_*.json' --environment E --agent-version V",
		Short: "Publish TRACE-style labeling run files as label events on trace.labels",
		Long: `import turns labeling runs in the TRACE release's six-list schema (run_NN.json)
into label events (one per trajectory, capability and run; run index = file
order) and publishes them to the labels topic, so that offline or human
labeling feeds the same streaming statistics and triggers as the built-in
labelers. With --candidates, the candidate capabilities are also stored as the
dictionary version the events name; every capability the run files label must
be a candidate, and a version already stored for the environment and agent
version with other capabilities or definitions is refused (nothing is
published), as is the version of a broader dictionary (the default, */*)
that has already labeled rollouts of theirs: pick another
--dictionary-version.`,
		Example: `  trace labels import --runs '../shared/data/trace-release/pipeline/run_*.json' \
    --candidates ../shared/data/trace-release/pipeline/candidate_capabilities.json \
    --environment tau2-bench --agent-version qwen3-30b-a3b`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scope.DictionaryVersion = uint32(dictV)
			if err := scope.Validate(); err != nil {
				return err
			}
			if topic != "" {
				if err := config.CheckTopic("--topic", topic); err != nil {
					return err
				}
			}
			runs, err := analyzer.LoadRuns(runsGlob)
			if err != nil {
				return err
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if candidates != "" {
				data, err := os.ReadFile(candidates)
				if err != nil {
					return fmt.Errorf("--candidates: %w", err)
				}
				cands, err := analyzer.ParseCandidates(candidates, data)
				if err != nil {
					return err
				}
				d := analyzer.DictionaryFromCandidates(scope, cands)
				for _, rf := range runs {
					for capName := range rf.Labels {
						if _, ok := d.Lookup(capName); !ok {
							return fmt.Errorf("%s: capability %q is labeled but is not a candidate of %s", rf.Name, capName, candidates)
						}
					}
				}
				w, err := openDictWriter(ctx, cfg)
				if err != nil {
					return err
				}
				defer w.Close()
				// The events name their dictionary version: it is stored as
				// that version of exactly their scope. A version already
				// stored with other capabilities is not theirs: their labels
				// would join its cohort under its definitions.
				// Likewise a broader dictionary (the default, */*) of that
				// version whose labels of this scope are stored: the cohort
				// is theirs.
				cur := w.reg.Exact(scope.Environment, scope.AgentVersion, scope.DictionaryVersion)
				if broader := w.reg.Version(scope.Environment, scope.AgentVersion, scope.DictionaryVersion); cur == nil && broader != nil && broader.Fingerprint() != d.Fingerprint() {
					labeled, err := w.st.LabeledRuns(ctx, sink.Cohort{Environment: scope.Environment, AgentVersion: scope.AgentVersion, DictionaryVersion: scope.DictionaryVersion})
					if err != nil {
						return err
					}
					if len(labeled) > 0 {
						cur = broader
					}
				}
				switch {
				case cur == nil:
					if err := w.applyAt(ctx, d); err != nil {
						return err
					}
				case cur.Fingerprint() != d.Fingerprint():
					probe := *d // PrepareApply numbers it above every version of the scope, unless the newest has this content
					free := &probe
					if same := w.reg.PrepareApply(&probe); same != nil {
						free = same
					}
					return fmt.Errorf("%s/%s dictionary version %d is already stored (%s/%s, source %s) with other capabilities or definitions than %s: its labels and these would share one cohort; import under another version, e.g. --dictionary-version %d (trace dict show --all lists them)",
						scope.Environment, scope.AgentVersion, scope.DictionaryVersion, cur.Environment, cur.AgentVersion, cur.Source, candidates, free.Version)
				}
			}
			events := analyzer.RunFileEvents(scope, runs)
			topic = cmp.Or(topic, cfg.Kafka.LabelsTopic)
			w, err := kafkaWriter(cfg, cfg.KafkaBrokers(), topic)
			if err != nil {
				return err
			}
			defer w.Close()
			msgs := make([]kafka.Message, 0, len(events))
			for i := range events {
				b, err := json.Marshal(&events[i])
				if err != nil {
					return err
				}
				msgs = append(msgs, kafka.Message{Key: []byte(events[i].Key()), Value: b})
			}
			for len(msgs) > 0 {
				n := min(len(msgs), 5000)
				if err := w.WriteMessages(ctx, msgs[:n]...); err != nil {
					return fmt.Errorf("publish to %s: %w", topic, err)
				}
				msgs = msgs[n:]
			}
			fmt.Fprintf(cmd.OutOrStdout(), "published %d label events (%d runs) for %s/%s dictionary v%d to %s\n",
				len(events), len(runs), scope.Environment, scope.AgentVersion, scope.DictionaryVersion, topic)
			return nil
		},
	}
	cf.add(imp)
	f := imp.Flags()
	f.StringVar(&runsGlob, "runs", "", "glob of run files in the six-list schema (quote it)")
	f.StringVar(&candidates, "candidates", "", "candidate_capabilities.json, stored as the dictionary")
	f.StringVar(&scope.Environment, "environment", "", "environment of the labeled rollouts")
	f.StringVar(&scope.AgentVersion, "agent-version", "", "agent version of the labeled rollouts")
	f.UintVar(&dictV, "dictionary-version", 1, "dictionary version the labels refer to")
	f.StringVar(&topic, "topic", "", "labels topic (default kafka.labels_topic)")
	_ = imp.MarkFlagRequired("runs")
	labels.AddCommand(imp)
	rootCmd.AddCommand(labels)
}
