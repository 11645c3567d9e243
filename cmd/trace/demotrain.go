package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/dev/simtrainer"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
)

// The demo's training step (TRACE step 3): the adapt role dispatches a job
// per ready environment on the nats backend, and the SIMULATED trainer
// (internal/dev/simtrainer) takes the jobs from the work queue as an
// external trainer would, reports a simulated reward curve and a sim://
// adapter, which the adapt role registers. No model is trained.

// demoStep is the simulated trainer's pause between iterations: 20
// iterations of 3 jobs take about 1.5 s.
const demoStep = 25 * time.Millisecond

// demoJob is a training job in the demo summary.
type demoJob struct {
	JobID         string  `json:"job_id"`
	EnvironmentID string  `json:"environment_id"`
	Environment   string  `json:"environment"`
	AgentVersion  string  `json:"agent_version"`
	Capability    string  `json:"capability"`
	Status        string  `json:"status"`
	Reason        string  `json:"reason,omitempty"`
	Iteration     int     `json:"iteration"`  // the last progress event's
	Iterations    int     `json:"iterations"` // planned
	BaseReward    float64 `json:"base_mean_reward"`
	FinalReward   float64 `json:"final_mean_reward"` // the last progress event's
	Adapter       string  `json:"adapter,omitempty"` // the registered adapter's name
	Simulated     bool    `json:"simulated"`
}

// demoAdapter is a registered adapter in the demo summary.
type demoAdapter struct {
	Name            string  `json:"name"`
	JobID           string  `json:"job_id"`
	Capability      string  `json:"capability"`
	URI             string  `json:"uri"`
	Status          string  `json:"status"`
	EvalMeanReward  float64 `json:"eval_mean_reward"`
	EvalSuccessRate float64 `json:"eval_success_rate"`
	Simulated       bool    `json:"simulated"`
	Trainer         string  `json:"trainer"` // from the registry's metadata
}

// simTrainerActor runs the simulated trainer on a NATS connection of its
// own; the base reward of a job is its environment's calibrated mean.
func (d *demo) simTrainerActor(a *app.App) app.Actor {
	store := synthesizer.SinkStore{Rows: a.Store}
	return app.Actor{Name: "simulated-trainer", Run: func(ctx context.Context) error {
		nc, err := nats.Connect(a.NATSURL, nats.Name("trace-simtrainer (SIMULATED)"), nats.MaxReconnects(-1))
		if err != nil {
			return fmt.Errorf("simulated trainer: %w", err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		t, err := simtrainer.New(simtrainer.Config{JS: js, Seed: d.seed, Step: demoStep, Log: d.log.With("role", "simulated-trainer"),
			Base: func(ctx context.Context, j *schemas.TrainingJob) (float64, error) {
				e, err := store.LoadEnvironment(ctx, j.EnvironmentID)
				if err != nil {
					return 0, err
				}
				if e == nil || e.Calibration == nil {
					return 0, fmt.Errorf("environment %s has no calibration", j.EnvironmentID)
				}
				return e.Calibration.MeanReward, nil
			}})
		if err != nil {
			return err
		}
		return t.Run(ctx)
	}}
}

// waitTraining follows the job of every DONE environment until it ends
// and, when it succeeded, its adapter is registered, printing each change;
// then it adds jobs and adapters to the summary. The demo is OK only when
// every environment's adapter is registered.
func (d *demo) waitTraining(ctx context.Context, a *app.App, s *demoSummary) {
	want := map[string]environmentSummary{} // job id → environment
	for _, e := range s.Environments {
		if e.Status == string(synthesizer.StatusDone) {
			want[schemas.TrainingJobID(e.ID, 1)] = e
		}
	}
	seen := map[string]string{}
	jobs := map[string]*sink.TrainingJobRow{}
	adapters := map[string]*sink.AdapterRow{} // by job id
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for len(want) > 0 {
		finished := 0
		ads, err := a.Store.Adapters(ctx, sink.AdapterFilter{})
		if err != nil && ctx.Err() == nil {
			d.log.Warn("demo: adapters", "err", err)
		}
		for i := range ads {
			if _, ok := want[ads[i].JobID]; ok {
				adapters[ads[i].JobID] = &ads[i]
			}
		}
		for id := range want {
			j, err := a.Store.TrainingJob(ctx, id)
			if err != nil {
				if ctx.Err() == nil {
					d.log.Warn("demo: training job", "err", err)
				}
				continue
			}
			if j == nil {
				continue
			}
			jobs[id] = j
			ad := adapters[id]
			if j.Status == adapter.StatusFailed || ad != nil {
				finished++
			}
			st := j.Status
			if j.Status == adapter.StatusRunning {
				st += fmt.Sprintf("/%d", j.Iteration*4/max(j.Iterations, 1)) // a line per quarter
			}
			if ad != nil {
				st += "/registered"
			}
			if seen[id] == st {
				continue
			}
			seen[id] = st
			line := fmt.Sprintf("▷ training job %s  %s %s  %s", id, j.EnvironmentID, j.Capability, j.Status)
			if j.Iteration > 0 {
				line += fmt.Sprintf("  iteration %d/%d  mean reward %.3f", j.Iteration, j.Iterations, j.MeanReward)
			}
			if j.Reason != "" {
				line += "  " + j.Reason
			}
			if j.Simulated {
				line += "  [SIMULATED trainer]"
			}
			d.logf("%s", line)
			if ad != nil {
				d.logf("▶ adapter %s registered (%s)  %s  eval mean reward %.3f  [SIMULATED: no model was trained]", ad.Name, ad.Status, ad.URI, ad.EvalMeanReward)
			}
		}
		if finished == len(want) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	s.Jobs, s.Adapters = trainingSummaries(want, jobs, adapters)
	var missing []string
	for id, e := range want {
		if adapters[id] == nil {
			missing = append(missing, e.Environment+"/"+e.AgentVersion+"/"+e.Capability)
		}
	}
	sort.Strings(missing)
	s.Counts.JobsSucceeded, s.Counts.Adapters = 0, len(s.Adapters)
	for _, j := range s.Jobs {
		if j.Status == adapter.StatusSucceeded {
			s.Counts.JobsSucceeded++
		}
	}
	if len(missing) > 0 && s.OK {
		s.OK = false
		s.Verdict = fmt.Sprintf("%s, but no adapter was registered for %v", s.Verdict, missing)
		if ctx.Err() != nil {
			s.Verdict += " before the timeout"
		}
	} else if s.OK && len(want) > 0 {
		s.Verdict += fmt.Sprintf(", and each environment's training job succeeded with its adapter registered (%d, by the SIMULATED trainer: no model was trained)", len(s.Adapters))
	}
}

func trainingSummaries(want map[string]environmentSummary, jobs map[string]*sink.TrainingJobRow, adapters map[string]*sink.AdapterRow) ([]demoJob, []demoAdapter) {
	js, as := []demoJob{}, []demoAdapter{}
	for id, e := range want {
		j := demoJob{JobID: id, EnvironmentID: e.ID, Environment: e.Environment, AgentVersion: e.AgentVersion, Capability: e.Capability, Status: "not dispatched"}
		if e.MeanReward != nil {
			j.BaseReward = *e.MeanReward
		}
		if r := jobs[id]; r != nil {
			j.Status, j.Reason, j.Iteration, j.Iterations, j.FinalReward, j.Simulated = r.Status, r.Reason, int(r.Iteration), int(r.Iterations), r.MeanReward, r.Simulated
		}
		if ad := adapters[id]; ad != nil {
			j.Adapter = ad.Name
			var meta struct {
				Trainer string `json:"trainer"`
			}
			_ = json.Unmarshal([]byte(ad.Metadata), &meta)
			as = append(as, demoAdapter{Name: ad.Name, JobID: ad.JobID, Capability: ad.Capability, URI: ad.URI, Status: ad.Status,
				EvalMeanReward: ad.EvalMeanReward, EvalSuccessRate: ad.EvalSuccessRate, Simulated: ad.Simulated, Trainer: meta.Trainer})
		}
		js = append(js, j)
	}
	sort.Slice(js, func(a, b int) bool {
		return js[a].Environment+js[a].AgentVersion+js[a].Capability < js[b].Environment+js[b].AgentVersion+js[b].Capability
	})
	sort.Slice(as, func(a, b int) bool { return as[a].Name < as[b].Name })
	return js, as
}

func printTrainingSummary(w io.Writer, s *demoSummary) {
	if len(s.Jobs) == 0 {
		return
	}
	fmt.Fprintf(w, "\ntraining jobs (adapt role, nats backend; run by the SIMULATED trainer — no model is trained, the reward curve is simulated):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  job\tenvironment\tagent\tcapability\tstatus\titerations\tbase → final mean reward\tadapter")
	for _, j := range s.Jobs {
		status := j.Status
		if j.Reason != "" {
			status += " (" + cutText(j.Reason, 80) + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d/%d\t%.3f → %.3f\t%s\n", j.JobID, j.Environment, j.AgentVersion, j.Capability, status,
			j.Iteration, j.Iterations, j.BaseReward, j.FinalReward, j.Adapter)
	}
	tw.Flush()
	if len(s.Adapters) > 0 {
		fmt.Fprintf(w, "\nadapters (the registry when training ended: candidates, until the closed loop below activates them; SIMULATED — sim:// URIs, nothing was written):\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  adapter\tstatus\tURI\teval mean\teval success\ttrainer")
		for _, a := range s.Adapters {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%.3f\t%.3f\t%s\n", a.Name, a.Status, a.URI, a.EvalMeanReward, a.EvalSuccessRate, a.Trainer)
		}
		tw.Flush()
	}
}
