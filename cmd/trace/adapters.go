package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/sink"
)

var adaptersCmd = &cobra.Command{
	Use:   "adapters",
	Short: "List, activate and retire trained LoRA adapters (the registry)",
	Long: `A succeeded training job registers its adapter as a candidate. Activating
it makes it the adapter of its (target environment, capability) — at most
one is active; the one active before is retired — and, with
adapter.serving enabled, loads it into the serving engine first (vLLM's
runtime LoRA API), so that requests with model: <adapter name> use it.
Retiring unloads it. The closed loop rolls back an active adapter whose
effect in production is bad (status rolled_back, unloaded; never activated
again); rollback does the same by hand.

An activation whose load fails changes nothing; a retirement whose unload
fails is retired in the registry (no longer routed to) and says that the
engine still serves it: retiring again retries the unload.`,
}

func init() {
	adaptersCmd.AddCommand(newAdaptersListCmd(), newAdaptersActivateCmd(), newAdaptersRetireCmd(), newAdaptersRollbackCmd())
	rootCmd.AddCommand(adaptersCmd)
}

var adapterStatuses = []string{adapter.AdapterCandidate, adapter.AdapterActive, adapter.AdapterRetired, adapter.AdapterRolledBack}

// adapterEntry is an adapter in --json output.
type adapterEntry struct {
	Name            string           `json:"name"`
	Status          string           `json:"status"`
	Capability      string           `json:"capability"`
	Environment     string           `json:"environment"`
	AgentVersion    string           `json:"agent_version"`
	EnvironmentID   string           `json:"environment_id"`
	JobID           string           `json:"job_id"`
	BaseModel       string           `json:"base_model"`
	URI             string           `json:"uri"`
	EvalMeanReward  float64          `json:"eval_mean_reward"`
	EvalSuccessRate float64          `json:"eval_success_rate"`
	Eval            json.RawMessage  `json:"eval,omitempty"`
	Serving         *adapter.Serving `json:"serving,omitempty"`
	Simulated       bool             `json:"simulated"`
	Metadata        json.RawMessage  `json:"metadata,omitempty"`
	CreatedAt       time.Time        `json:"created_at"`
	UpdatedAt       time.Time        `json:"updated_at"`
}

func adapterEntryOf(a *sink.AdapterRow) adapterEntry {
	e := adapterEntry{Name: a.Name, Status: a.Status, Capability: a.Capability, Environment: a.Environment, AgentVersion: a.AgentVersion,
		EnvironmentID: a.EnvironmentID, JobID: a.JobID, BaseModel: a.BaseModel, URI: a.URI, EvalMeanReward: a.EvalMeanReward,
		EvalSuccessRate: a.EvalSuccessRate, Serving: adapter.ServingOf(a), Simulated: a.Simulated, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt}
	if json.Valid([]byte(a.Eval)) && a.Eval != "null" {
		e.Eval = json.RawMessage(a.Eval)
	}
	if json.Valid([]byte(a.Metadata)) {
		e.Metadata = json.RawMessage(a.Metadata)
	}
	return e
}

func servedText(a *sink.AdapterRow) string {
	sv := adapter.ServingOf(a)
	switch {
	case sv == nil:
		return "-"
	case sv.Loaded && sv.Error != "":
		return "loaded (unload failed)"
	case sv.Loaded:
		return "loaded"
	default:
		return "unloaded"
	}
}

func newAdaptersListCmd() *cobra.Command {
	var (
		cf                      configFlags
		status, capName, target string
		asJSON                  bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List registered adapters with their status and evaluation",
		Long: `list prints every registered adapter, newest first: its served name, status
(candidate, active, retired, rolled_back), capability, target environment,
base model, held-out evaluation (mean reward, success rate), whether the
serving engine has it loaded, and its URI. Adapters of the demo's
simulated trainer are marked SIMULATED (no model was trained).`,
		Example: "  trace adapters list\n  trace adapters list --status active --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			status = strings.ToLower(status)
			if status != "" && !contains(adapterStatuses, status) {
				return fmt.Errorf("--status must be one of %s, got %q", strings.Join(adapterStatuses, ", "), status)
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
			as, err := st.Adapters(cmd.Context(), sink.AdapterFilter{Status: status, Capability: capName, Environment: target})
			if err != nil {
				return err
			}
			if asJSON {
				out := make([]adapterEntry, len(as))
				for i := range as {
					out[i] = adapterEntryOf(&as[i])
				}
				return writeJSON(cmd.OutOrStdout(), out)
			}
			printAdapters(cmd.OutOrStdout(), as)
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&status, "status", "", "only adapters in this status")
	cmd.Flags().StringVar(&capName, "capability", "", "only this capability")
	cmd.Flags().StringVar(&target, "env", "", "only this target environment (e.g. sim-airline)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the adapters as JSON")
	return cmd
}

func printAdapters(w io.Writer, as []sink.AdapterRow) {
	if len(as) == 0 {
		fmt.Fprintln(w, "no adapters registered")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tCAPABILITY\tENVIRONMENT\tBASE MODEL\tEVAL MEAN\tEVAL SUCCESS\tSERVING\tURI")
	for i := range as {
		a := &as[i]
		stat := a.Status
		if a.Simulated {
			stat += " SIMULATED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.3f\t%.3f\t%s\t%s\n", a.Name, stat, a.Capability, a.Environment, a.BaseModel,
			a.EvalMeanReward, a.EvalSuccessRate, servedText(a), a.URI)
	}
	tw.Flush()
}

// registryCommand runs a registry transition on the configured registry
// and prints its changes; an unknown adapter or a disallowed transition
// exits 1 naming it.
func registryCommand(cmd *cobra.Command, cf *configFlags, asJSON bool, do func(*adapter.Registry) ([]adapter.Change, error)) error {
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
	reg, err := app.AdapterRegistry(cfg, st, slog.Default())
	if err != nil {
		return err
	}
	changes, err := do(reg)
	out := cmd.OutOrStdout()
	if asJSON {
		v := map[string]any{"changes": changes, "serving": reg.Engine != nil}
		if err != nil {
			v["error"] = err.Error()
		}
		if jerr := writeJSON(out, v); jerr != nil {
			return jerr
		}
	} else {
		for _, c := range changes {
			line := fmt.Sprintf("%s: %s → %s", c.Name, c.From, c.To)
			if c.From == c.To {
				line = fmt.Sprintf("%s: %s (unchanged)", c.Name, c.To)
			}
			switch {
			case c.Loaded:
				line += fmt.Sprintf(", loaded into %s (model: %s)", reg.Engine.Endpoint(), c.Name)
			case c.Unloaded:
				line += ", unloaded from " + reg.Engine.Endpoint()
			}
			fmt.Fprintln(out, line)
		}
		if reg.Engine == nil && len(changes) > 0 {
			fmt.Fprintln(out, "(adapter.serving is off: the registry is updated, no serving engine was told)")
		}
	}
	if errors.Is(err, adapter.ErrUnknownAdapter) {
		return &exitError{code: 1, err: fmt.Errorf("%w (see trace adapters list)", err)}
	}
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	return nil
}

func newAdaptersActivateCmd() *cobra.Command {
	var (
		cf     configFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "activate NAME",
		Short: "Make an adapter the active one of its environment and capability",
		Long: `activate moves a candidate (or retired) adapter to active. With
adapter.serving enabled it is loaded into the serving engine first; when
the load fails, nothing changes and the exit status is 1. The adapter that
was active for the same target environment and capability is retired and
unloaded. Activating the active adapter loads it again (after an engine
restart) without changing any status; the adapt role also does that by
itself every adapter.serving.reconcile_every (default 1m).`,
		Example: "  trace adapters activate precondition-verification-3f1c2a9e",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return registryCommand(cmd, &cf, asJSON, func(r *adapter.Registry) ([]adapter.Change, error) {
				return r.Activate(cmd.Context(), args[0])
			})
		},
	}
	cf.add(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the changes as JSON")
	return cmd
}

func newAdaptersRetireCmd() *cobra.Command {
	return newAdapterTransitionCmd(&cobra.Command{
		Use:   "retire NAME",
		Short: "Take an adapter out of use (retired, unloaded from the serving engine)",
		Long: `retire moves an active or candidate adapter to retired, recording the
reason in its metadata, and then unloads it from the serving engine. If the
unload fails the adapter is still retired (no longer routed to), the exit
status is 1, and retiring it again retries the unload.`,
		Example: "  trace adapters retire precondition-verification-3f1c2a9e --reason 'superseded by r2'",
	}, (*adapter.Registry).Retire)
}

func newAdaptersRollbackCmd() *cobra.Command {
	return newAdapterTransitionCmd(&cobra.Command{
		Use:   "rollback NAME",
		Short: "Roll back an active adapter (rolled_back, unloaded; never activated again)",
		Long: `rollback is the closed loop guard's transition by hand: it moves an active
adapter to rolled_back, recording the reason in its metadata, and then
unloads it from the serving engine. A rolled-back adapter is never
activated again (a new training run registers a new one). If the unload
fails the adapter is still rolled back (no longer routed to), the exit
status is 1, and rolling it back again retries the unload (also after the
guard's rollback).`,
		Example: "  trace adapters rollback precondition-verification-3f1c2a9e --reason 'pass rate fell'",
	}, (*adapter.Registry).RollBack)
}

// newAdapterTransitionCmd completes cmd (Use, Short, Long, Example set) as
// a command that moves the adapter NAME with a --reason through do.
func newAdapterTransitionCmd(cmd *cobra.Command, do func(*adapter.Registry, context.Context, string, string) (*adapter.Change, error)) *cobra.Command {
	var (
		cf     configFlags
		reason string
		asJSON bool
	)
	cmd.Args = cobra.ExactArgs(1)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return registryCommand(cmd, &cf, asJSON, func(r *adapter.Registry) ([]adapter.Change, error) {
			c, err := do(r, cmd.Context(), args[0], reason)
			if c == nil {
				return nil, err
			}
			return []adapter.Change{*c}, err
		})
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the adapter's metadata)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the change as JSON")
	return cmd
}
