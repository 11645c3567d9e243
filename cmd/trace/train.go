package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/plan"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
)

// trainCmd is `trace train`: the adapt role's training jobs by hand.
var trainCmd = &cobra.Command{
	Use:   "train",
	Short: "Plan, dispatch and inspect adapter training jobs (TRACE step 3)",
	Long: `The adapt role of trace run turns every ready environment into one training
job per (environment, plan revision) and dispatches it to the configured
trainer backend (adapter.backend). These commands do the same by hand and
show the jobs: their status, their event history and reward curve.

A job's id is derived from the environment id and the plan revision, so
dispatching by hand and the adapt role never dispatch the same job twice.`,
}

func init() {
	trainCmd.AddCommand(newTrainPlanCmd(), newTrainDispatchCmd(), newTrainListCmd(), newTrainShowCmd(), newTrainCancelCmd())
	rootCmd.AddCommand(trainCmd)
}

// readyEnvironment is the ready event of a DONE environment, rebuilt from
// its record in ClickHouse; an unknown or unfinished one is an exit-1 error.
func readyEnvironment(ctx context.Context, st *sink.Store, id string) (*schemas.EnvironmentReady, error) {
	e, err := synthesizer.SinkStore{Rows: st}.LoadEnvironment(ctx, id)
	if err != nil {
		return nil, err
	}
	if e == nil {
		return nil, &exitError{code: 1, err: fmt.Errorf("no environment %q (see trace env list)", id)}
	}
	if e.Status != synthesizer.StatusDone {
		return nil, &exitError{code: 1, err: fmt.Errorf("environment %s is %s, not DONE: only a ready environment is trained", id, e.Status)}
	}
	r, err := e.Ready(time.Now())
	if err != nil {
		return nil, &exitError{code: 1, err: err}
	}
	return r, nil
}

// planConfig is adapter.plan as trace run uses it (its own environment
// server unless env_server_url is set; the webhook's callback endpoint in
// every job when its trainers report by callback).
func planConfig(cfg config.Config) plan.Config {
	pc := cfg.Adapter.Plan
	pc.EnvServerURL = cfg.EnvServerURL()
	if cfg.TrainingCallback() {
		pc.CallbackURL = cfg.WebhookConfig().CallbackURL
	}
	return pc
}

// cliPlanner is the configured planning agent with its audit writer
// running until stop (nil and a no-op when adapter.planner is off or
// --no-planner is given).
func cliPlanner(ctx context.Context, cfg config.Config, st *sink.Store, off bool) (adapter.Planner, func(), error) {
	if off || !cfg.Adapter.Planner.Enabled {
		return nil, func() {}, nil
	}
	rec := app.NewAuditRecorder(st, slog.Default())
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { _ = rec.Run(actx); close(done) }()
	stop := func() { cancel(); <-done }
	p, err := app.Planner(cfg, st, rec, slog.Default())
	if err != nil {
		stop()
		return nil, nil, err
	}
	return p, stop, nil
}

func newTrainPlanCmd() *cobra.Command {
	var (
		cf        configFlags
		asJSON    bool
		revision  int
		noPlanner bool
	)
	cmd := &cobra.Command{
		Use:   "plan ENV_ID",
		Short: "Print the training job the adapt role would dispatch for an environment",
		Long: `plan builds the training job of a DONE environment (an id from trace env
list) exactly as the adapt role does: the preset, the defaults and the
overrides of adapter.plan, and — when adapter.planner is enabled — the
planning agent's adjustment with its reason (or its rejection or failure,
with the configured plan standing). Nothing is dispatched or stored; the
planning agent's calls are recorded in llm_calls. --json prints the job
spec (training_job/v1) as a trainer receives it.`,
		Example: "  trace train plan env-3f1c2a9e0b7d4c15\n  trace train plan env-3f1c2a9e0b7d4c15 --json --no-planner",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if revision < 1 {
				return fmt.Errorf("--revision must be >= 1, got %d", revision)
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
			r, err := readyEnvironment(ctx, st, args[0])
			if err != nil {
				return err
			}
			planner, stop, err := cliPlanner(ctx, cfg, st, noPlanner)
			if err != nil {
				return err
			}
			job, err := adapter.PlanJob(ctx, planConfig(cfg), planner, plan.Input{Ready: r, Revision: revision, Now: time.Now()}, slog.Default())
			stop()
			if err != nil {
				return err
			}
			prev, err := st.TrainingJob(ctx, job.JobID)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), job)
			}
			printPlan(cmd.OutOrStdout(), job)
			if prev != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "\njob %s exists already (%s): dispatching it again does nothing (see trace train show %s)\n", job.JobID, prev.Status, job.JobID)
			}
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the job spec (training_job/v1) as JSON")
	cmd.Flags().IntVar(&revision, "revision", 1, "the plan revision (a new revision is a new job)")
	cmd.Flags().BoolVar(&noPlanner, "no-planner", false, "leave the planning agent out even when adapter.planner is enabled")
	return cmd
}

func printPlan(w io.Writer, j *schemas.TrainingJob) {
	fmt.Fprintf(w, "training job %s (plan revision %d)\n", j.JobID, j.PlanRevision)
	fmt.Fprintf(w, "  environment   %s (%s, agent %s)\n", j.EnvironmentID, j.Environment, j.AgentVersion)
	fmt.Fprintf(w, "  capability    %s\n", j.Capability.Name)
	fmt.Fprintf(w, "  base model    %s\n", j.BaseModel)
	fmt.Fprintf(w, "  lora          rank %d, alpha %d, dropout %g, targets %s\n", j.LoRA.Rank, j.LoRA.Alpha, j.LoRA.Dropout, strings.Join(j.LoRA.TargetModules, ","))
	g := j.GRPO
	fmt.Fprintf(w, "  grpo          %d iterations × %d groups × %d rollouts, lr %g, temperature %g, kl %g, clip %g, max grad norm %g, advantage %s\n",
		g.Iterations, g.GroupsPerIteration, g.GroupSize, g.LearningRate, g.Temperature, g.KLCoef, g.ClipEpsilon, g.MaxGradNorm, g.Advantage)
	fmt.Fprintf(w, "  hints         on %.0f%% of rollouts, stripped from the trained prompt: %v\n", g.HintRatio*100, g.StripHints)
	if n := len(j.Eval.Seeds); n > 0 {
		fmt.Fprintf(w, "  evaluation    %d held-out seeds (%d–%d) × %d rollouts, success at reward >= %g\n", n, j.Eval.Seeds[0], j.Eval.Seeds[n-1], j.Eval.RolloutsPerSeed, j.Eval.SuccessThreshold)
	}
	fmt.Fprintf(w, "  env server    %s\n", j.EnvServer.BaseURL)
	fmt.Fprintf(w, "  adapter       %s → %s\n", j.Output.AdapterName, j.Output.URI)
	fmt.Fprintf(w, "  reports       %s (heartbeat %ds, deadline %ds)\n", j.Report.EventsSubject, j.Report.HeartbeatSeconds, j.Report.DeadlineSeconds)
	printPlanner(w, j.Planner)
	if j.Simulated {
		fmt.Fprintln(w, "  SIMULATED: the demo's simulated trainer runs it (no model is trained)")
	}
}

func printPlanner(w io.Writer, p schemas.PlannerRecord) {
	fmt.Fprintf(w, "  plan          %s (preset %s)", p.Source, p.Preset)
	if len(p.Overrides) > 0 {
		fmt.Fprintf(w, ", overrides %s", strings.Join(p.Overrides, " "))
	}
	fmt.Fprintln(w)
	if p.Agent == "" {
		return
	}
	fmt.Fprintf(w, "  planning agent %s (%s)", strings.ToUpper(p.Agent), dash(p.Model))
	if p.Reason != "" {
		fmt.Fprintf(w, ": %s", p.Reason)
	}
	fmt.Fprintln(w)
	if p.Error != "" {
		fmt.Fprintf(w, "    %s; the configured plan stands", p.Error)
		if len(p.RejectedFields) > 0 {
			fmt.Fprintf(w, " (out of bounds: %s)", strings.Join(p.RejectedFields, ", "))
		}
		fmt.Fprintln(w)
	}
}

func newTrainDispatchCmd() *cobra.Command {
	var (
		cf        configFlags
		revision  int
		noPlanner bool
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use:   "dispatch ENV_ID",
		Short: "Plan and dispatch an environment's training job once",
		Long: `dispatch plans the job of a DONE environment (see trace train plan) and
hands it to adapter.backend once, as the adapt role would: a job that is
already recorded or claimed is not dispatched again (the exit status is 0
and the output says so). A job the backend refuses for good (a webhook's
4xx answer) is recorded FAILED, and the exit status is 1. With adapter.backend: none the job is recorded as
PLANNED. The adapt role of a running trace run tracks the job's events.`,
		Example: "  trace train dispatch env-3f1c2a9e0b7d4c15\n  trace train dispatch env-3f1c2a9e0b7d4c15 --revision 2",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if revision < 1 {
				return fmt.Errorf("--revision must be >= 1, got %d", revision)
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
			r, err := readyEnvironment(ctx, st, args[0])
			if err != nil {
				return err
			}
			b, err := connectBus(ctx, cfg)
			if err != nil {
				return err
			}
			defer b.Close()
			tb, err := app.TrainingBackend(cfg, b, slog.Default())
			if err != nil {
				return err
			}
			if tb.Command != nil {
				// A command (and its exit code) is supervised by the process
				// that started it; this one exits at once.
				return fmt.Errorf("adapter.backend is command: dispatch through the adapt role (trace run), which supervises the trainer's process; `trace train dispatch` works with the nats and webhook backends")
			}
			backend := tb.Backend
			planner, stop, err := cliPlanner(ctx, cfg, st, noPlanner)
			if err != nil {
				return err
			}
			defer stop()
			stage, err := adapter.NewStage(adapter.Config{Plan: planConfig(cfg), Store: st, Claims: b, Backend: backend, Planner: planner,
				Simulated: cfg.Adapter.Simulated, Log: slog.Default()})
			if err != nil {
				return err
			}
			if tb.Webhook != nil {
				// A rejection (a 4xx) and the acceptance are recorded in the
				// job's history through the stage, as in the adapt role.
				tb.Webhook.Reporter = stage
			}
			res, job, err := stage.DispatchReady(ctx, r, revision)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			// A backend that refused the job for good (a webhook's 4xx)
			// recorded it FAILED: exit 1 naming the answer.
			var refused error
			if !res.Duplicate && !res.Planned {
				if j, err := st.TrainingJob(ctx, res.JobID); err == nil && j != nil && j.Status == adapter.StatusFailed {
					refused = &exitError{code: 1, err: fmt.Errorf("job %s: %s refused it, the job is FAILED: %s", res.JobID, backend.Name(), j.Reason)}
				}
			}
			if asJSON {
				v := map[string]any{"job_id": res.JobID, "dispatched": res.Dispatched && refused == nil, "duplicate": res.Duplicate,
					"planned": res.Planned, "backend": cfg.Adapter.Backend}
				if job != nil {
					v["adapter"], v["planner"] = job.Output.AdapterName, job.Planner
				}
				if refused != nil {
					v["refused"], v["error"] = true, refused.Error()
				}
				if err := writeJSON(out, v); err != nil {
					return err
				}
				return refused
			}
			switch {
			case res.Duplicate:
				prev, _ := st.TrainingJob(ctx, res.JobID)
				status := "claimed"
				if prev != nil {
					status = prev.Status
				}
				fmt.Fprintf(out, "job %s exists already (%s): nothing dispatched\n", res.JobID, status)
				if prev != nil && (prev.Status == adapter.StatusFailed || prev.Status == adapter.StatusSucceeded) {
					// A job is never run twice: training again is a new revision.
					next := revision + 1
					if jobs, err := st.TrainingJobs(ctx, sink.TrainingJobFilter{EnvironmentID: r.EnvironmentID}); err == nil {
						for _, j := range jobs {
							next = max(next, int(j.PlanRevision)+1)
						}
					}
					fmt.Fprintf(out, "to train %s again, dispatch a new plan revision: trace train dispatch %s --revision %d\n", r.EnvironmentID, r.EnvironmentID, next)
				}
			case res.Planned:
				fmt.Fprintf(out, "job %s recorded as PLANNED (adapter.backend: none): nothing dispatched\n", res.JobID)
			case refused != nil:
				return refused
			default:
				fmt.Fprintf(out, "dispatched job %s to %s: capability %s, adapter %s\n", res.JobID, backend.Name(), job.Capability.Name, job.Output.AdapterName)
				printPlanner(out, job.Planner)
			}
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().IntVar(&revision, "revision", 1, "the plan revision (a new revision is a new job)")
	cmd.Flags().BoolVar(&noPlanner, "no-planner", false, "leave the planning agent out even when adapter.planner is enabled")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the outcome as JSON")
	return cmd
}

var jobStatuses = []string{adapter.StatusPlanned, adapter.StatusDispatched, adapter.StatusRunning, adapter.StatusSucceeded, adapter.StatusFailed}

func newTrainListCmd() *cobra.Command {
	var (
		cf                     configFlags
		status, envID, capName string
		limit                  int
		asJSON                 bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List training jobs and their status (from ClickHouse)",
		Long: `list prints the training jobs, newest first: id, status (PLANNED,
DISPATCHED, RUNNING, SUCCEEDED, FAILED), environment, capability, the last
reported iteration of the planned ones, the last mean reward, the backend
and the adapter: the one registered for the job, as trace adapters list
names it, else the planned name marked "(not registered)". A trainer may
register another name than the planned one (the demo's simulated trainer
registers sim-<planned name>); --json keeps the planned one as
planned_adapter_name. Jobs of the demo's simulated trainer are marked
SIMULATED.`,
		Example: "  trace train list\n  trace train list --status RUNNING --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			status = strings.ToUpper(status)
			if status != "" && !contains(jobStatuses, status) {
				return fmt.Errorf("--status must be one of %s, got %q", strings.Join(jobStatuses, ", "), status)
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
			f := sink.TrainingJobFilter{Status: status, Capability: capName, Limit: limit}
			if envIDPattern.MatchString(envID) {
				f.EnvironmentID = envID
			} else {
				f.Environment = envID // a target environment, as --env means elsewhere
			}
			jobs, err := st.TrainingJobs(cmd.Context(), f)
			if err != nil {
				return err
			}
			ads, err := st.JobAdapters(cmd.Context(), jobs)
			if err != nil {
				return err
			}
			sums := make([]jobSummary, len(jobs))
			for i := range jobs {
				var a *sink.AdapterRow
				if x, ok := ads[jobs[i].JobID]; ok {
					a = &x
				}
				sums[i] = summarizeJob(&jobs[i], a)
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), sums)
			}
			if len(jobs) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no training jobs")
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "JOB\tSTATUS\tENVIRONMENT\tCAPABILITY\tITERATION\tMEAN REWARD\tBACKEND\tADAPTER\tUPDATED")
			for _, j := range sums {
				stat := j.Status
				if j.Simulated {
					stat += " SIMULATED"
				}
				if j.Status == adapter.StatusFailed && j.Reason != "" {
					stat += ": " + cutText(j.Reason, 40)
				}
				name := j.AdapterName
				if !j.AdapterRegistered {
					name += " (not registered)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%.3f\t%s\t%s\t%s\n", j.JobID, stat, j.EnvironmentID, j.Capability, j.Iteration, j.Iterations,
					j.MeanReward, j.Backend, name, j.UpdatedAt.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&status, "status", "", "only jobs in this status")
	cmd.Flags().StringVar(&envID, "env", "", "only this target environment (e.g. sim-airline), or this synthesized environment's id (env-…)")
	cmd.Flags().StringVar(&capName, "capability", "", "only this capability")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many (0: all)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the jobs as JSON")
	return cmd
}

// envIDPattern is a synthesized environment's id (schemas.EnvironmentID).
var envIDPattern = regexp.MustCompile(`^env-[0-9a-f]{16}$`)

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// jobSummary is a job in --json output.
type jobSummary struct {
	JobID         string `json:"job_id"`
	Status        string `json:"status"`
	Reason        string `json:"reason,omitempty"`
	EnvironmentID string `json:"environment_id"`
	Environment   string `json:"environment"`
	Capability    string `json:"capability"`
	PlanRevision  uint32 `json:"plan_revision"`
	Backend       string `json:"backend"`
	// AdapterName is the adapter registered for the job (the name trace
	// adapters list shows); while none is (AdapterRegistered false), the
	// planned name.
	AdapterName       string `json:"adapter_name"`
	AdapterRegistered bool   `json:"adapter_registered"`
	// PlannedAdapterName is the plan's output.adapter_name, the name the
	// trainer was asked to register; the demo's simulated trainer
	// registers sim-<planned name>.
	PlannedAdapterName string                 `json:"planned_adapter_name"`
	Iteration          uint32                 `json:"iteration"`
	Iterations         uint32                 `json:"iterations"`
	MeanReward         float64                `json:"mean_reward"`
	Simulated          bool                   `json:"simulated"`
	Planner            *schemas.PlannerRecord `json:"planner,omitempty"`
	DispatchedAt       time.Time              `json:"dispatched_at"`
	LastEventAt        time.Time              `json:"last_event_at"`
	DeadlineAt         time.Time              `json:"deadline_at"`
	UpdatedAt          time.Time              `json:"updated_at"`
}

// summarizeJob summarizes a job and the adapter it registered (nil: none).
func summarizeJob(j *sink.TrainingJobRow, a *sink.AdapterRow) jobSummary {
	s := jobSummary{JobID: j.JobID, Status: j.Status, Reason: j.Reason, EnvironmentID: j.EnvironmentID, Environment: j.Environment,
		Capability: j.Capability, PlanRevision: j.PlanRevision, Backend: j.Backend, AdapterName: j.AdapterName, PlannedAdapterName: j.AdapterName,
		Iteration: j.Iteration, Iterations: j.Iterations, MeanReward: j.MeanReward, Simulated: j.Simulated, DispatchedAt: j.DispatchedAt,
		LastEventAt: j.LastEventAt, DeadlineAt: j.DeadlineAt, UpdatedAt: j.UpdatedAt}
	if a != nil {
		s.AdapterName, s.AdapterRegistered = a.Name, true
	}
	var p schemas.PlannerRecord
	if json.Unmarshal([]byte(j.Planner), &p) == nil && p.Source != "" {
		s.Planner = &p
	}
	return s
}

// CancelWorker is the worker of the failed event trace train cancel
// publishes.
const CancelWorker = "trace train cancel"

func newTrainCancelCmd() *cobra.Command {
	var (
		cf     configFlags
		reason string
	)
	cmd := &cobra.Command{
		Use:   "cancel JOB_ID",
		Short: "Cancel a training job that has not ended: it becomes FAILED",
		Long: `cancel fails a job that is not SUCCEEDED or FAILED yet: it publishes a
failed event (worker "trace train cancel", the reason given) on the job's
events subject, which the adapt role of a running trace run applies in
order with the trainer's events, once (Msg-Id cancel:<job_id>). Then, as for
a job failed by its deadline: on the nats backend a job no trainer has
taken yet leaves the trainers' queue; on the command backend the trainer's
process group is stopped within 30 s. A trainer that took the job over
NATS already is not told: it trains on, and what it reports is recorded
but changes nothing (no adapter is registered). To train the environment
again, dispatch a new plan revision (trace train dispatch ENV --revision N).
An unknown or finished job exits 1 naming it.`,
		Example: "  trace train cancel job-8c2d41f09a3b7e65\n  trace train cancel job-8c2d41f09a3b7e65 --reason \"wrong base model\"",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			st, j, err := openJob(ctx, cfg, args[0])
			if err != nil {
				return err
			}
			defer st.Close()
			if adapter.Terminal(j.Status) {
				return &exitError{code: 1, err: fmt.Errorf("job %s is %s already: nothing to cancel", j.JobID, j.Status)}
			}
			b, err := connectBus(ctx, cfg)
			if err != nil {
				return err
			}
			defer b.Close()
			why := "cancelled by hand (trace train cancel)"
			if strings.TrimSpace(reason) != "" {
				why += ": " + strings.TrimSpace(reason)
			}
			e := &schemas.TrainingEvent{JobID: j.JobID, Type: schemas.EventFailed, At: time.Now().UTC(), Worker: CancelWorker, Reason: why}
			if err := b.PublishTrainingEventID(ctx, e, "cancel:"+j.JobID); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "job %s (%s): cancel requested; the adapt role of trace run applies it (trace train show %s)\n", j.JobID, j.Status, j.JobID)
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded in the job's failure reason")
	return cmd
}

// openJob opens the store and reads the training job id; an unknown job
// is an error that exits 1.
func openJob(ctx context.Context, cfg config.Config, id string) (*sink.Store, *sink.TrainingJobRow, error) {
	st, err := openStore(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	j, err := st.TrainingJob(ctx, id)
	if err == nil && j == nil {
		err = &exitError{code: 1, err: fmt.Errorf("no training job %q (see trace train list)", id)}
	}
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return st, j, nil
}

func newTrainShowCmd() *cobra.Command {
	var (
		cf     configFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "show JOB_ID",
		Short: "Show a training job: status, plan, event history and reward curve",
		Long: `show prints one job (an id from trace train list): its status and reason,
its plan's planner record, every event its trainer reported (and trace's
own: dispatched, deadline, activation) in order, the reward curve of its
progress events (mean reward per iteration, ± its std), and the adapter it
registered. --json prints the job, the events and the adapter.`,
		Example: "  trace train show job-8c2d41f09a3b7e65\n  trace train show job-8c2d41f09a3b7e65 --json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			st, j, err := openJob(ctx, cfg, args[0])
			if err != nil {
				return err
			}
			defer st.Close()
			evs, err := st.TrainingEvents(ctx, j.JobID)
			if err != nil {
				return err
			}
			a, err := jobAdapter(ctx, st, j)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				type event struct {
					Key        string          `json:"key"`
					Type       string          `json:"type"`
					At         time.Time       `json:"at"`
					Iteration  *int32          `json:"iteration,omitempty"`
					MeanReward *float64        `json:"mean_reward,omitempty"`
					RewardStd  *float64        `json:"reward_std,omitempty"`
					KL         *float64        `json:"kl,omitempty"`
					Payload    json.RawMessage `json:"payload,omitempty"`
					Raw        string          `json:"raw,omitempty"`
				}
				v := struct {
					Job     jobSummary    `json:"job"`
					Events  []event       `json:"events"`
					Adapter *adapterEntry `json:"adapter,omitempty"`
				}{Job: summarizeJob(j, a), Events: []event{}}
				for _, e := range evs {
					x := event{Key: e.Key, Type: e.Type, At: e.At}
					if e.Iteration >= 0 {
						it, mr, sd := e.Iteration, e.MeanReward, e.RewardStd
						x.Iteration, x.MeanReward, x.RewardStd = &it, &mr, &sd
					}
					if e.HasKL {
						kl := e.KL
						x.KL = &kl
					}
					if json.Valid([]byte(e.Payload)) {
						x.Payload = json.RawMessage(e.Payload)
					} else {
						x.Raw = e.Payload
					}
					v.Events = append(v.Events, x)
				}
				if a != nil {
					ae := adapterEntryOf(a)
					v.Adapter = &ae
				}
				return writeJSON(out, v)
			}
			printJob(out, j, evs, a)
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the job, its events and its adapter as JSON")
	return cmd
}

// jobAdapter is the adapter a job registered (nil for none), as trace
// train list picks it (sink.PickJobAdapters): under the planned name, or
// under the name its trainer reported (the demo's simulated trainer
// reports sim-<planned name>).
func jobAdapter(ctx context.Context, st *sink.Store, j *sink.TrainingJobRow) (*sink.AdapterRow, error) {
	ads, err := st.JobAdapters(ctx, []sink.TrainingJobRow{*j})
	if err != nil {
		return nil, err
	}
	if a, ok := ads[j.JobID]; ok {
		return &a, nil
	}
	return nil, nil
}

func printJob(w io.Writer, j *sink.TrainingJobRow, evs []sink.TrainingEventRow, a *sink.AdapterRow) {
	fmt.Fprintf(w, "training job %s: %s", j.JobID, j.Status)
	if j.Reason != "" {
		fmt.Fprintf(w, " — %s", j.Reason)
	}
	fmt.Fprintln(w)
	if j.Simulated {
		fmt.Fprintln(w, "  SIMULATED: the demo's simulated trainer reported it (no model was trained)")
	}
	fmt.Fprintf(w, "  environment   %s (%s, agent %s), capability %s\n", j.EnvironmentID, j.Environment, j.AgentVersion, j.Capability)
	fmt.Fprintf(w, "  base model    %s, plan revision %d, backend %s\n", j.BaseModel, j.PlanRevision, j.Backend)
	fmt.Fprintf(w, "  progress      iteration %d of %d, mean reward %.3f\n", j.Iteration, j.Iterations, j.MeanReward)
	fmt.Fprintf(w, "  dispatched    %s, last event %s, deadline %s\n", j.DispatchedAt.Format(time.RFC3339), j.LastEventAt.Format(time.RFC3339), j.DeadlineAt.Format(time.RFC3339))
	var p schemas.PlannerRecord
	if json.Unmarshal([]byte(j.Planner), &p) == nil && p.Source != "" {
		printPlanner(w, p)
	}
	fmt.Fprintf(w, "\nevents (%d)\n", len(evs))
	for _, e := range evs {
		line := fmt.Sprintf("  %s  %-17s", e.At.Format("2006-01-02 15:04:05.000"), e.Type)
		if e.Iteration >= 0 {
			line += fmt.Sprintf(" iteration %d  mean %.3f  std %.3f", e.Iteration, e.MeanReward, e.RewardStd)
			if e.HasKL {
				line += fmt.Sprintf("  kl %.4f", e.KL)
			}
		} else if d := eventDetail(e); d != "" {
			line += " " + d
		}
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	fmt.Fprintln(w)
	printRewardCurve(w, evs)
	if a != nil {
		fmt.Fprintf(w, "\nadapter %s: %s, eval mean reward %.3f, success rate %.3f, %s\n", a.Name, a.Status, a.EvalMeanReward, a.EvalSuccessRate, a.URI)
	}
}

// eventDetail is the short text of an event without an iteration: a
// failure's reason, a success's adapter, a malformed line's error.
func eventDetail(e sink.TrainingEventRow) string {
	if e.Type == "malformed" {
		if i := strings.LastIndex(e.Payload, "\n# "); i >= 0 {
			return cutText(e.Payload[i+3:], 100)
		}
		return ""
	}
	var v struct {
		Reason  string `json:"reason"`
		Error   string `json:"error"`
		Backend string `json:"backend"`
		Adapter any    `json:"adapter"`
		Eval    *struct {
			MeanReward  float64 `json:"mean_reward"`
			SuccessRate float64 `json:"success_rate"`
		} `json:"eval"`
	}
	if json.Unmarshal([]byte(e.Payload), &v) != nil {
		return ""
	}
	var parts []string
	if v.Backend != "" {
		parts = append(parts, "backend "+v.Backend)
	}
	switch a := v.Adapter.(type) {
	case string:
		parts = append(parts, "adapter "+a)
	case map[string]any:
		if n, _ := a["name"].(string); n != "" {
			parts = append(parts, "adapter "+n)
		}
	}
	if v.Eval != nil {
		parts = append(parts, fmt.Sprintf("eval mean %.3f success %.3f", v.Eval.MeanReward, v.Eval.SuccessRate))
	}
	for _, s := range []string{v.Reason, v.Error} {
		if s != "" {
			parts = append(parts, cutText(s, 120))
		}
	}
	return strings.Join(parts, ", ")
}

// printRewardCurve draws the mean reward of each iteration as a bar over
// [0, 1], 40 characters wide, with ± the std as a range on the same line.
// The last report of an iteration counts (a redelivered one replaces itself).
func printRewardCurve(w io.Writer, evs []sink.TrainingEventRow) {
	type point struct {
		it        int32
		mean, std float64
	}
	var pts []point
	idx := map[int32]int{}
	for _, e := range evs {
		if e.Type != schemas.EventProgress || e.Iteration < 0 {
			continue
		}
		p := point{e.Iteration, e.MeanReward, e.RewardStd}
		if i, ok := idx[e.Iteration]; ok {
			pts[i] = p
			continue
		}
		idx[e.Iteration] = len(pts)
		pts = append(pts, p)
	}
	if len(pts) == 0 {
		fmt.Fprintln(w, "reward curve: no progress reported yet")
		return
	}
	fmt.Fprintln(w, "reward curve (mean reward per iteration over [0, 1]; ± std)")
	const width = 40
	for _, p := range pts {
		m := math.Max(0, math.Min(1, p.mean))
		n := int(math.Round(m * width))
		bar := strings.Repeat("█", n) + strings.Repeat("·", width-n)
		fmt.Fprintf(w, "  %4d │%s│ %.3f ± %.3f\n", p.it, bar, p.mean, p.std)
	}
}
