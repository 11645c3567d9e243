package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/datadir"
	"github.com/traceops/trace/internal/dev/simpolicy"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/internal/dev/simupstream"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
	"github.com/traceops/trace/synthesizer/calibrate"
)

// demoSummary is what `trace demo --json` prints.
type demoSummary struct {
	OK           bool             `json:"ok"`
	Verdict      string           `json:"verdict"`
	Counts       demoCounts       `json:"counts"`
	Planted      []string         `json:"planted"`   // env/agent_version/capability
	Triggered    []string         `json:"triggered"` // env/agent_version/capability
	Capabilities []demoCapability `json:"capabilities"`
	Triggers     []demoTrigger    `json:"triggers"`
	// Environments are what the synthesize role made of the triggers:
	// templates calibrated by the simulated policy (labeled simulated).
	Environments []environmentSummary `json:"environments"`
	// Jobs are the adapt role's training jobs of the DONE environments and
	// Adapters what the registry registered: both from the SIMULATED
	// trainer (no model is trained).
	Jobs     []demoJob     `json:"training_jobs"`
	Adapters []demoAdapter `json:"adapters"`

	// Loop is the closed loop: adapters activated, traffic routed, the
	// verdicts and the guard (SIMULATED parts labeled as such).
	Loop      *demoLoop           `json:"closed_loop,omitempty"`
	Dashboard string              `json:"dashboard"`
	Elapsed   string              `json:"elapsed"`
	Brokers   []string            `json:"kafka_brokers"`
	NATS      string              `json:"nats_url"`
	Extra     map[string]any      `json:"extra,omitempty"`
	byKey     map[string]struct{} `json:"-"`
	printed   bool                // printed before lingering
	lingered  time.Duration       // how long it lingered (until --linger or Ctrl-C)
}

type demoCounts struct {
	Published     int    `json:"rollouts_published"`
	Malformed     int    `json:"malformed_published"`
	Stored        uint64 `json:"rollouts_stored"`
	Labeled       uint64 `json:"rollouts_labeled"`
	Labels        uint64 `json:"labels_stored"`
	DeadLettered  int64  `json:"dead_lettered"`
	SynthesisMsgs int    `json:"synthesis_requests"`
	TriggerEvents int    `json:"trigger_events"`
	EnvsDone      int    `json:"environments_done"`
	JobsSucceeded int    `json:"training_jobs_succeeded"`
	Adapters      int    `json:"adapters_registered"`
}

type demoCapability struct {
	Environment  string  `json:"environment"`
	AgentVersion string  `json:"agent_version"`
	Capability   string  `json:"capability"`
	Cov          float64 `json:"cov"`
	Delta        float64 `json:"delta"`
	RunsPassed   int     `json:"runs_passed"`
	RunsTotal    int     `json:"runs_total"`
	Decision     string  `json:"decision"`
	Planted      bool    `json:"planted"`
}

type demoTrigger struct {
	Subject string                    `json:"subject"`
	Request *schemas.SynthesisRequest `json:"request"`
}

func init() {
	var (
		cf       configFlags
		rollouts int
		seed     uint64
		rate     float64
		asJSON   bool
		timeout  time.Duration
		keep     bool
		linger   time.Duration
		loopN    int
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole loop on embedded servers with a simulated agent fleet",
		Long: `demo starts everything embedded (a Kafka-protocol broker, NATS with JetStream,
a local ClickHouse server) and runs trace's loop for real:

  simulated fleet → Kafka trace.rollouts → ingest + labels (rules labeler with
  the shipped example dictionary, or the LLM labeler when llm.base_url is set)
  → statistics in ClickHouse → synthesis requests on NATS JetStream
  → environments: each request gets a training environment from a built-in
  template (or the generation agent when llm.base_url is set), validated and
  calibrated by the SIMULATED policy (the fleet's agent version with its
  planted deficits, not a model) → trace.environments.ready
  → training jobs: the adapt role dispatches one per ready environment on
  the JetStream work queue trace.training.jobs; a SIMULATED trainer takes
  them as an external trainer would, reports a simulated reward curve on
  trace.training.events.<job_id> and a sim:// adapter, which the adapt role
  registers as a candidate (no model is trained)
  → the closed loop: the adapters are activated, one HARMFUL adapter is
  planted, and --loop-rollouts more conversations go through the routing
  proxy (route role) in front of a SIMULATED upstream (classifier and
  answers); a conversation routed to an adapter loses that adapter's planted
  deficit — the simulation's stand-in for a trained adapter — and the adapt
  role's guard rolls the harmful adapter back

The fleet has capability deficits planted per agent version (see
internal/dev/simulate DefaultFleet). The demo succeeds (exit 0) only when a trigger
fired for exactly the planted deficits and for no other capability, each
planted deficit's environment reached DONE, each DONE environment's
training job succeeded with its adapter registered, and, in the closed
loop, every planted deficit's gap closed on the traffic routed to its
adapter and the guard rolled the harmful adapter back (--loop-rollouts 0
stops before the loop). One malformed message per thousand rollouts (up to
three) is published too and ends in the dead-letter topic.

Data lives under ./data/demo and is reset at every start (--keep keeps it).`,
		Example: `  trace demo
  trace demo --json --timeout 5m
  trace demo --linger 10m     # keep the dashboard up afterwards`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The simulator reads 0 as "until interrupted": the demo would
			// publish until its timeout and fail.
			if rollouts < 1 {
				return fmt.Errorf("--rollouts: %d, want at least 1 (the demo needs a fleet's worth, e.g. 3000)", rollouts)
			}
			if !(rate >= 0) {
				return fmt.Errorf("--rate: %v, want a non-negative number of rollouts per second (0: as fast as possible)", rate)
			}
			sets := []string{"data_dir=./data/demo", "kafka.batch_timeout=200ms", "analyzer.interval=1s",
				"analyzer.min_failures=20", "analyzer.window=720h", "synthesizer.policy=simulated", "synthesizer.concurrency=3"}
			// The closed loop: the route role in front of the SIMULATED
			// upstream (classifier and answers), the guard every 2 s.
			up := simupstream.New()
			var upSrv *http.Server
			if loopN > 0 {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					return fmt.Errorf("simulated upstream: %w", err)
				}
				upSrv = &http.Server{Handler: up, ReadHeaderTimeout: 10 * time.Second}
				go upSrv.Serve(ln)
				defer upSrv.Close()
				sets = append(sets, "roles="+strings.Join(append(slices.Clone(config.DefaultRoles), "route"), ","), "router.addr=127.0.0.1:0",
					"router.upstream_url=http://"+ln.Addr().String()+"/v1", "router.base_model=sim-base", "router.adapters_refresh=1s",
					"verify.interval=2s")
			}
			sets = append(sets, cf.sets...)
			cfg, err := config.Load(cf.file, sets)
			if err != nil {
				return err
			}
			if cfg.LLM.BaseURL != "" && cfg.Analyzer.Labeler == "rules" {
				cfg.Analyzer.Labeler = "llm"
			}
			cfg.Adapter.Simulated = true // jobs go to the simulated trainer (no model is trained)
			// The directory is this process's before it is reset (another
			// demo or trace run on it fails here instead); the App holds
			// it from there.
			lock, err := app.LockDataDir(cfg)
			if err != nil {
				return err
			}
			defer lock.Release()
			if !keep {
				if err := lock.Clear(); err != nil {
					return fmt.Errorf("reset %s: %w", cfg.DataDir, err)
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			out := cmd.OutOrStdout()
			d := &demo{cfg: cfg, rollouts: rollouts, seed: seed, rate: rate, out: out, json: asJSON,
				tty: !asJSON && isTerminal(out), log: slog.Default(), loopN: loopN, upstream: up, lock: lock}
			sum, err := d.run(ctx, cmd.Context(), linger)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(sum); err != nil {
					return err
				}
			} else if sum.printed { // before lingering: not again, stale
				mark := "FAIL"
				if sum.OK {
					mark = "OK"
				}
				fmt.Fprintf(out, "\nstopped after lingering for %s (the summary above is as it was before)\n%s: %s\n", sum.lingered.Round(time.Second), mark, sum.Verdict)
			} else {
				printDemoSummary(out, sum)
			}
			if !sum.OK {
				return &exitError{code: 1, err: errors.New(sum.Verdict)}
			}
			return nil
		},
	}
	cf.add(cmd)
	f := cmd.Flags()
	f.IntVar(&rollouts, "rollouts", 3000, "simulated rollouts to publish")
	f.Uint64Var(&seed, "seed", 1, "simulation seed (the run is deterministic per seed)")
	f.Float64Var(&rate, "rate", 1500, "publish rate in rollouts per second (0 = as fast as possible)")
	f.BoolVar(&asJSON, "json", false, "print a machine-readable summary")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "give up after this long")
	f.BoolVar(&keep, "keep", false, "keep ./data/demo from a previous run")
	f.DurationVar(&linger, "linger", 0, "keep running (dashboard up) this long after the summary")
	f.IntVar(&loopN, "loop-rollouts", 3000, "closed loop: simulated conversations sent through the routing proxy after the adapters are activated (0: stop before the loop)")
	rootCmd.AddCommand(cmd)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

type demo struct {
	cfg      config.Config
	rollouts int
	seed     uint64
	rate     float64
	out      io.Writer
	json     bool
	tty      bool
	log      *slog.Logger

	loopN    int                 // the closed loop's conversations (0: no loop)
	upstream *simupstream.Server // the loop's SIMULATED upstream
	lock     *datadir.Lock       // the data directory, taken before its reset

	mu        sync.Mutex
	published int
	malformed int
	triggers  []demoTrigger
}

// training: the adapt role runs with the nats backend, so the simulated
// trainer gets the jobs.
func (d *demo) training() bool { return d.cfg.Has("adapt") && d.cfg.Adapter.Backend == "nats" }

func (d *demo) logf(format string, args ...any) {
	if !d.json {
		fmt.Fprintf(d.out, format+"\n", args...)
	}
}

func (d *demo) run(ctx, parent context.Context, linger time.Duration) (*demoSummary, error) {
	start := time.Now()
	a, err := app.StartLocked(ctx, d.cfg, d.log, d.lock)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	fleet := simulate.DefaultFleet()
	a.Simulated = func(env, agentVersion, capability string) (calibrate.Policy, error) {
		return simpolicy.SimulatedFleetPolicy(fleet, env, agentVersion, capability)
	}
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	runErr := make(chan error, 1)
	actors := []app.Actor{
		{Name: "simulator", Run: func(ctx context.Context) error { return d.publish(ctx, a, fleet) }},
		{Name: "synthesis-watcher", Run: func(ctx context.Context) error { return d.watch(ctx, a) }},
	}
	if d.training() {
		actors = append(actors, d.simTrainerActor(a))
	}
	go func() { runErr <- a.Run(runCtx, actors...) }()
	stop := func() error {
		stopRun()
		return <-runErr
	}
	select {
	case <-a.Ready():
	case err := <-runErr:
		return nil, err
	}
	dash := "http://" + a.HTTPAddr() + "/"
	d.logf("trace demo: %d simulated rollouts from %d agent cohorts → Kafka %s → ClickHouse → NATS %s", d.rollouts, len(fleet), strings.Join(a.Brokers, ","), a.NATSURL)
	d.logf("dashboard: %s", dash)

	sum, err := d.wait(ctx, a, fleet)
	if err != nil {
		stop()
		return nil, err
	}
	if d.cfg.Has("synthesize") {
		d.waitEnvironments(ctx, a, sum)
		if d.training() {
			d.waitTraining(ctx, a, sum)
		}
	}
	if d.loopN > 0 && d.cfg.Has("route") && sum.OK {
		d.closedLoop(ctx, a, fleet, sum)
	}
	sum.Dashboard, sum.Brokers, sum.NATS = dash, a.Brokers, a.NATSURL
	sum.Elapsed = time.Since(start).Round(time.Millisecond).String()
	if linger > 0 {
		if !d.json {
			printDemoSummary(d.out, sum)
			sum.printed = true
			d.logf("\nlingering for %s: the dashboard stays at %s (Ctrl-C to stop)", linger, dash)
		}
		began := time.Now()
		select {
		case <-parent.Done():
		case <-time.After(linger):
		}
		sum.lingered = time.Since(began)
	}
	if err := stop(); err != nil {
		return nil, err
	}
	return sum, nil
}

// publish sends the simulated fleet's rollouts (and a few malformed
// messages, to show the dead-letter path) to the rollouts topic.
func (d *demo) publish(ctx context.Context, a *app.App, fleet []simulate.AgentSpec) error {
	interval := 2 * time.Second
	gen := simulate.New(simulate.Config{Seed: d.seed, Fleet: fleet, Rollouts: d.rollouts,
		Start: time.Now().Add(-time.Duration(d.rollouts) * interval), Interval: interval})
	w := &kafka.Writer{Addr: kafka.TCP(a.Brokers...), Topic: d.cfg.Kafka.RolloutsTopic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, Compression: kafka.Zstd, BatchSize: 500, BatchTimeout: 10 * time.Millisecond,
		BatchBytes: int64(d.cfg.Kafka.WriterBatchBytes()), Transport: a.Transport()}
	defer w.Close()
	malformed := [][]byte{[]byte(`{"rollout_id": "broken`), []byte(`{"rollout_id":"x","environment":"sim-airline"}`),
		[]byte(`{"rollout_id":"nan","environment":"sim-airline","agent":{"name":"a","version":"1"},"task_id":"t","outcome":{"reward":NaN},"messages":[{"role":"user","content":"hi"}]}`)}
	batch := make([]kafka.Message, 0, 200)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := w.WriteMessages(ctx, batch...); err != nil {
			return fmt.Errorf("publish simulated rollouts: %w", err)
		}
		batch = batch[:0]
		return nil
	}
	began := time.Now()
	for i, r := 0, gen.Next(); r != nil; i, r = i+1, gen.Next() {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		batch = append(batch, kafka.Message{Key: []byte(r.Key()), Value: b})
		if i%1000 == 500 && i/1000 < len(malformed) {
			batch = append(batch, kafka.Message{Key: []byte("sim-airline/1.4.0"), Value: malformed[i/1000]})
			d.mu.Lock()
			d.malformed++
			d.mu.Unlock()
		}
		if len(batch) >= 200 {
			if err := flush(); err != nil {
				return err
			}
		}
		d.mu.Lock()
		d.published = i + 1
		d.mu.Unlock()
		if d.rate > 0 {
			if ahead := time.Duration(float64(i+1)/d.rate*float64(time.Second)) - time.Since(began); ahead > 0 {
				if err := flush(); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(ahead):
				}
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	<-ctx.Done() // stay up until the demo ends
	return nil
}

// watch shows synthesis requests as they arrive on JetStream.
func (d *demo) watch(ctx context.Context, a *app.App) error {
	cons, err := a.Bus.JS.OrderedConsumer(ctx, bus.StreamSynthesis, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		req, err := schemas.DecodeSynthesisRequest(m.Data())
		if err != nil {
			d.log.Error("demo: invalid synthesis request on NATS", "subject", m.Subject(), "err", err)
			return
		}
		d.mu.Lock()
		d.triggers = append(d.triggers, demoTrigger{Subject: m.Subject(), Request: req})
		d.mu.Unlock()
		d.logf("◆ NATS %s  %s/%s %s  Cov %.3f  Δ %.3f  runs %d/%d  examples %d",
			m.Subject(), req.Environment, req.AgentVersion, req.Capability.Skill, req.Capability.MeanCov, req.Capability.MeanDelta,
			req.Capability.NRunsPassed, req.Capability.NRunsTotal, len(req.ExampleFailedRolloutIDs))
	})
	if err != nil {
		return err
	}
	<-ctx.Done()
	cc.Stop()
	return nil
}

// wait follows the loop until every published rollout is stored and
// labeled and the evaluator has settled, then builds the summary.
func (d *demo) wait(ctx context.Context, a *app.App, fleet []simulate.AgentSpec) (*demoSummary, error) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var c demoCounts
	settledAt := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return d.summary(context.Background(), a, fleet, c, "timed out before the loop settled")
		case <-tick.C:
		}
		var err error
		if c, err = d.counts(ctx, a); err != nil {
			d.log.Warn("demo: counts", "err", err)
			continue
		}
		if d.tty || !d.json {
			d.logf("… published %d/%d  stored %d  labeled %d  dead-lettered %d  synthesis requests %d",
				c.Published, d.rollouts, c.Stored, c.Labeled, c.DeadLettered, c.SynthesisMsgs)
		}
		done := c.Published == d.rollouts && c.Stored >= uint64(d.rollouts) && c.Labeled >= uint64(d.rollouts) && c.DeadLettered >= int64(c.Malformed)
		if !done {
			settledAt = time.Time{}
			continue
		}
		if settledAt.IsZero() {
			settledAt = time.Now()
			for _, coh := range cohortsOf(ctx, a) {
				a.Evaluator.Touch(coh)
			}
			continue
		}
		// Two evaluation intervals after everything is labeled, the
		// decisions are final for this stream.
		if time.Since(settledAt) >= 2*d.cfg.Analyzer.Interval+time.Second {
			return d.summary(ctx, a, fleet, c, "")
		}
	}
}

func cohortsOf(ctx context.Context, a *app.App) []sink.Cohort {
	cs, _ := a.Store.Cohorts(ctx, time.Time{})
	return cs
}

func (d *demo) counts(ctx context.Context, a *app.App) (demoCounts, error) {
	var c demoCounts
	d.mu.Lock()
	c.Published, c.Malformed, c.SynthesisMsgs = d.published, d.malformed, len(d.triggers)
	d.mu.Unlock()
	var err error
	if c.Stored, _, err = a.Store.CountDistinctRollouts(ctx); err != nil {
		return c, err
	}
	if c.Labeled, c.Labels, err = a.Store.CountLabels(ctx); err != nil {
		return c, err
	}
	c.DeadLettered = topicSize(ctx, a.Brokers, d.cfg.Kafka.DLQTopic)
	return c, nil
}

// topicSize sums the last offsets of a topic's partitions (0 when missing).
func topicSize(ctx context.Context, brokers []string, topic string) int64 {
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return 0
	}
	defer conn.Close()
	parts, err := conn.ReadPartitions(topic)
	if err != nil {
		return 0
	}
	var n int64
	for _, p := range parts {
		pc, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, p.ID)
		if err != nil {
			continue
		}
		last, err := pc.ReadLastOffset()
		pc.Close()
		if err == nil {
			n += last
		}
	}
	return n
}

func (d *demo) summary(ctx context.Context, a *app.App, fleet []simulate.AgentSpec, c demoCounts, problem string) (*demoSummary, error) {
	s := &demoSummary{Counts: c, byKey: map[string]struct{}{}}
	planted := map[string]bool{}
	for _, ag := range fleet {
		for _, env := range ag.Environments {
			for capName, rate := range ag.Deficits {
				if rate > 0 {
					planted[env+"/"+ag.Version+"/"+capName] = true
				}
			}
		}
	}
	for k := range planted {
		s.Planted = append(s.Planted, k)
	}
	sort.Strings(s.Planted)
	d.mu.Lock()
	s.Triggers = append(s.Triggers, d.triggers...)
	d.mu.Unlock()
	triggered := map[string]bool{}
	for _, t := range s.Triggers {
		triggered[t.Request.Environment+"/"+t.Request.AgentVersion+"/"+t.Request.Capability.Skill] = true
	}
	for k := range triggered {
		s.Triggered = append(s.Triggered, k)
	}
	sort.Strings(s.Triggered)
	if hist, err := a.Store.TriggerHistory(ctx); err == nil {
		s.Counts.TriggerEvents = len(hist)
	}
	snap := a.Evaluator.Snapshot()
	// A selection counts only when the window could decide (enough
	// failures and runs), as the evaluator's stored evaluation says.
	cohorts := make([]sink.Cohort, 0, len(snap))
	for coh := range snap {
		cohorts = append(cohorts, coh)
	}
	undecided := map[sink.Cohort]string{}
	if stored, err := a.Store.LatestEvaluations(ctx, cohorts); err == nil {
		for coh, se := range stored {
			ev, err := analyzer.ParseEvaluation(se.Payload)
			switch {
			case err != nil || ev.Decided:
			case ev.Failures < d.cfg.Analyzer.MinFailures:
				undecided[coh] = fmt.Sprintf("undecided (%d failures < %d)", ev.Failures, d.cfg.Analyzer.MinFailures)
			default:
				undecided[coh] = fmt.Sprintf("undecided (%d complete runs)", ev.Runs)
			}
		}
	}
	for coh, results := range snap {
		for _, r := range results {
			key := coh.Environment + "/" + coh.AgentVersion + "/" + r.Name
			dec := "rejected"
			switch {
			case undecided[coh] != "":
				dec = undecided[coh]
			case r.Selected:
				dec = "SELECTED"
			}
			s.Capabilities = append(s.Capabilities, demoCapability{Environment: coh.Environment, AgentVersion: coh.AgentVersion,
				Capability: r.Name, Cov: r.MeanCov, Delta: r.MeanDelta, RunsPassed: r.RunsPassed, RunsTotal: r.RunsTotal,
				Decision: dec, Planted: planted[key]})
		}
	}
	sort.Slice(s.Capabilities, func(i, j int) bool {
		a, b := s.Capabilities[i], s.Capabilities[j]
		if a.Environment+a.AgentVersion != b.Environment+b.AgentVersion {
			return a.Environment+a.AgentVersion < b.Environment+b.AgentVersion
		}
		return a.Delta > b.Delta
	})
	s.OK = problem == "" && strings.Join(s.Planted, ",") == strings.Join(s.Triggered, ",")
	switch {
	case problem != "":
		s.Verdict = problem
	case s.OK:
		s.Verdict = fmt.Sprintf("triggers fired for exactly the %d planted deficits", len(s.Planted))
	default:
		s.Verdict = fmt.Sprintf("triggers %v differ from the planted deficits %v", s.Triggered, s.Planted)
		if len(undecided) > 0 {
			s.Verdict += fmt.Sprintf("; %d of %d cohorts could not decide (too few failures or labeling runs in the window: publish more with --rollouts)", len(undecided), len(cohorts))
		}
	}
	return s, nil
}

func printDemoSummary(w io.Writer, s *demoSummary) {
	fmt.Fprintf(w, "\ncapabilities (window statistics, rules labeler):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  environment\tagent\tcapability\tCov\tΔ\truns passed\tdecision\tplanted")
	for _, c := range s.Capabilities {
		p := ""
		if c.Planted {
			p = "yes"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%.3f\t%.3f\t%d/%d\t%s\t%s\n", c.Environment, c.AgentVersion, c.Capability, c.Cov, c.Delta, c.RunsPassed, c.RunsTotal, c.Decision, p)
	}
	tw.Flush()
	fmt.Fprintf(w, "\ntriggers (synthesis requests on NATS JetStream):\n")
	for _, t := range s.Triggers {
		r := t.Request
		fmt.Fprintf(w, "  %s\n    trigger %s epoch %d  window %d rollouts / %d failures  tools %d  examples %s\n",
			t.Subject, r.TriggerID, r.Epoch, r.Window.Rollouts, r.Window.Failures, len(r.Tools), strings.Join(first(r.ExampleFailedRolloutIDs, 3), ", "))
	}
	c := s.Counts
	if len(s.Environments) > 0 {
		fmt.Fprintf(w, "\nenvironments (built-in templates, calibrated by the SIMULATED policy — the fleet's agent version, not a model):\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  environment\tagent\tcapability\tstatus\tattempts\ttools\tmean\tsuccess\tpass@1/4/8/16")
		for _, e := range s.Environments {
			mean, succ, pass := "-", "-", "-"
			if e.MeanReward != nil {
				mean, succ = fmt.Sprintf("%.3f", *e.MeanReward), fmt.Sprintf("%.3f", *e.SuccessRate)
				var ps []string
				for _, k := range []string{"1", "4", "8", "16"} {
					if v, ok := e.PassAtK[k]; ok {
						ps = append(ps, fmt.Sprintf("%.2f", v))
					}
				}
				pass = strings.Join(ps, "/")
				if e.Simulated {
					pass += " (simulated)"
				}
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", e.Environment, e.AgentVersion, e.Capability, e.Status, e.Attempts,
				strings.Join(e.Tools, ","), mean, succ, pass)
		}
		tw.Flush()
		for _, e := range s.Environments {
			if e.Status != string(synthesizer.StatusDone) && e.Reason != "" {
				fmt.Fprintf(w, "  %s %s/%s %s: %s\n", e.ID, e.Environment, e.AgentVersion, e.Status, cutText(e.Reason, 300))
			}
		}
	}
	printTrainingSummary(w, s)
	printDemoLoop(w, s.Loop)
	requests := strconv.Itoa(c.SynthesisMsgs)
	if s.Loop != nil && len(s.Loop.Triggers) > 0 {
		requests += fmt.Sprintf(" (+%d during the closed loop)", len(s.Loop.Triggers))
	}
	fmt.Fprintf(w, "\ncounts: published %d (+%d malformed), stored %d, labeled %d (%d labels), dead-lettered %d, synthesis requests %s, environments DONE %d, training jobs SUCCEEDED %d, adapters %d (simulated)\n",
		c.Published, c.Malformed, c.Stored, c.Labeled, c.Labels, c.DeadLettered, requests, c.EnvsDone, c.JobsSucceeded, c.Adapters)
	fmt.Fprintf(w, "dashboard: %s (up while the demo runs; --linger keeps it up after the summary)   elapsed: %s\n", s.Dashboard, s.Elapsed)
	mark := "FAIL"
	if s.OK {
		mark = "OK"
	}
	fmt.Fprintf(w, "%s: %s\n", mark, s.Verdict)
}

func first(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// waitEnvironments follows the synthesize role until the environment of
// every trigger is finished (DONE or FAILED) or waits for a model, printing
// each status change, then adds the environments to the summary: the demo
// is OK only when every planted deficit's environment is DONE.
func (d *demo) waitEnvironments(ctx context.Context, a *app.App, s *demoSummary) {
	store := synthesizer.SinkStore{Rows: a.Store}
	want := map[string]string{} // environment id → env/agent/capability
	for _, t := range s.Triggers {
		want[schemas.EnvironmentID(t.Request.TriggerID)] = t.Request.Environment + "/" + t.Request.AgentVersion + "/" + t.Request.Capability.Skill
	}
	seen := map[string]string{}
	var es []*synthesizer.Environment
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		all, err := store.List(ctx, sink.EnvironmentFilter{})
		if err != nil && ctx.Err() == nil {
			d.log.Warn("demo: environments", "err", err)
		}
		es = es[:0]
		finished := 0
		for _, e := range all {
			if _, ok := want[e.ID]; !ok {
				continue
			}
			es = append(es, e)
			if e.Status.Terminal() || e.Status == synthesizer.StatusWaitingForLLM {
				finished++
			}
			if st := fmt.Sprintf("%s/%d", e.Status, e.Attempt); seen[e.ID] != st {
				seen[e.ID] = st
				line := fmt.Sprintf("◇ environment %s  %s/%s %s  %s  attempt %d", e.ID, e.Environment, e.AgentVersion, e.Capability, e.Status, e.Attempt)
				if c := e.Calibration; c != nil && e.Status == synthesizer.StatusDone {
					line += fmt.Sprintf("  mean %.3f  success %.3f  %s", c.MeanReward, c.SuccessRate, passAtText(c.PassAtK))
					if c.Simulated {
						line += "  [SIMULATED policy]"
					}
				}
				d.logf("%s", line)
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
	sortEnvironments(es)
	s.Environments = environmentSummaries(es)
	done := map[string]bool{}
	for _, e := range es {
		if e.Status == synthesizer.StatusDone {
			done[want[e.ID]] = true
			s.Counts.EnvsDone++
		}
	}
	var missing []string
	for _, p := range s.Planted {
		if !done[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 && s.OK {
		s.OK = false
		s.Verdict = fmt.Sprintf("%s, but the environments of %v did not reach DONE", s.Verdict, missing)
		if ctx.Err() != nil {
			s.Verdict += " before the timeout"
		}
	} else if s.OK {
		s.Verdict += fmt.Sprintf(", and each got an environment that reached DONE (calibrated by the simulated policy)")
	}
}
