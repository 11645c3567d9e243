// Package simtrainer is trace demo's SIMULATED trainer: a trainer worker
// that speaks trace's nats training protocol exactly as an external trainer
// does (it takes training_job/v1 specs from the JetStream work queue
// TRACE_TRAINING_JOBS through the shared durable consumer trace-trainers,
// and reports training_event/v1 events on trace.training.events.<job_id>),
// but trains nothing: no model is loaded, no environment is played, no
// adapter file is written.
//
// What it reports is a plausible, deterministic reward curve: it rises from
// the environment's calibrated base mean reward (Config.Base) towards a
// seeded ceiling with seeded noise, one progress event per planned
// iteration (mean reward, reward std, KL), then a success whose adapter is
// named sim-<planned name> with URI sim://simtrainer/<name>. Every event
// carries simulated: true and the worker name "trace-simtrainer
// (SIMULATED, no model trained)", so the registry records the adapter as
// simulated.
package simtrainer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/schemas"
)

// Worker is the name every event of the simulated trainer carries.
const Worker = "trace-simtrainer (SIMULATED, no model trained)"

// URIScheme prefixes a simulated adapter's URI: nothing is written there.
const URIScheme = "sim://"

// NamePrefix prefixes a simulated adapter's served name.
const NamePrefix = "sim-"

// DefaultBase is the base mean reward when Config.Base is nil or fails.
const DefaultBase = 0.3

// Config configures a Trainer.
type Config struct {
	// JS is the trainer's own JetStream handle (its own NATS connection,
	// as an external worker's).
	JS jetstream.JetStream
	// Seed makes the curves deterministic: one curve per (seed, job id).
	Seed uint64
	// Step is the pause between iterations (0: none).
	Step time.Duration
	// Base returns the mean reward the base model had on the job's
	// environment (its calibration); nil or an error: DefaultBase.
	Base func(ctx context.Context, job *schemas.TrainingJob) (float64, error)
	Log  *slog.Logger
	// OnDone, when set, is called after a job's last event is published.
	OnDone func(job *schemas.TrainingJob, r Result)
}

// Trainer takes jobs until its context ends.
type Trainer struct{ cfg Config }

// New checks cfg.
func New(cfg Config) (*Trainer, error) {
	if cfg.JS == nil {
		return nil, errors.New("simtrainer: JS is required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Trainer{cfg: cfg}, nil
}

// Point is one iteration of a simulated curve.
type Point struct {
	Iteration  int
	MeanReward float64
	RewardStd  float64
	KL         float64
}

// Result is what a simulated run reported.
type Result struct {
	Curve       []Point
	Eval        schemas.EvalMetrics
	AdapterName string
	URI         string
}

// Simulate computes the run of a job from a base mean reward: pure and
// deterministic in (seed, job id, base, iterations). The mean reward rises
// as base + (ceiling − base)·(1 − e^(−3i/n)) plus noise of σ 0.015, kept in
// [0, 1]; the ceiling is base + 0.25…0.40 (seeded), at most 0.95. The std
// is that of a group of pass/fail rewards, √(r(1−r)); KL grows with i.
// Eval is the last iteration's reward on the plan's held-out episodes.
func Simulate(seed uint64, job *schemas.TrainingJob, base float64) Result {
	h := fnv.New64a()
	h.Write([]byte(job.JobID))
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	base = math.Max(0, math.Min(1, base))
	ceiling := math.Min(0.95, base+0.25+0.15*rng.Float64())
	n := max(job.GRPO.Iterations, 1)
	res := Result{AdapterName: NamePrefix + job.Output.AdapterName}
	res.URI = URIScheme + "simtrainer/" + res.AdapterName
	for i := 1; i <= n; i++ {
		r := base + (ceiling-base)*(1-math.Exp(-3*float64(i)/float64(n))) + 0.015*rng.NormFloat64()
		r = math.Round(math.Max(0, math.Min(1, r))*1e4) / 1e4
		kl := math.Round((0.002*float64(i)*(1+0.2*rng.Float64()))*1e5) / 1e5
		res.Curve = append(res.Curve, Point{Iteration: i, MeanReward: r, RewardStd: math.Round(math.Sqrt(r*(1-r))*1e4) / 1e4, KL: kl})
	}
	final := res.Curve[n-1].MeanReward
	episodes := max(len(job.Eval.Seeds)*max(job.Eval.RolloutsPerSeed, 1), 1)
	b := base
	res.Eval = schemas.EvalMetrics{MeanReward: final, Episodes: episodes, BaseMeanReward: &b,
		SuccessRate: math.Round(math.Max(0, math.Min(1, final-0.05+0.02*rng.Float64()))*1e4) / 1e4}
	return res
}

// Run consumes TRACE_TRAINING_JOBS until ctx ends, as the protocol asks of
// a trainer (docs/training-protocol.md): a job is run to its end with
// in-progress acks, then acked once its terminal event is stored, so a
// trainer that dies mid-job leaves it to be redelivered. A spec that is
// not a valid training_job/v1 is terminated and logged. The job in hand
// when ctx ends is nak'd, for another trainer at once.
func (t *Trainer) Run(ctx context.Context) error {
	cons, err := t.cfg.JS.CreateOrUpdateConsumer(ctx, bus.StreamTrainingJobs, bus.TrainerConsumerConfig(0))
	if err != nil {
		return fmt.Errorf("simtrainer: consumer: %w", err)
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			if ctx.Err() == nil {
				t.cfg.Log.Warn("simtrainer: fetch", "err", err)
				time.Sleep(200 * time.Millisecond)
			}
			continue
		}
		for m := range batch.Messages() {
			job, err := schemas.DecodeTrainingJob(m.Data())
			if err != nil {
				t.cfg.Log.Error("simtrainer: invalid training job, dropped", "err", err)
				_ = m.Term()
				continue
			}
			done := make(chan struct{})
			go inProgress(m, done)
			err = t.Train(ctx, job)
			close(done)
			switch {
			case ctx.Err() != nil:
				_ = m.Nak() // stopped: another trainer takes it
			case err != nil:
				t.cfg.Log.Warn("simtrainer: job", "job", job.JobID, "err", err) // redelivered after the ack wait
			default:
				if err := m.DoubleAck(ctx); err != nil {
					t.cfg.Log.Warn("simtrainer: ack", "job", job.JobID, "err", err)
				}
			}
		}
	}
	return nil
}

// inProgress sends m's in-progress acks every minute (a fifth of the
// consumer's ack wait) until done closes.
func inProgress(m jetstream.Msg, done <-chan struct{}) {
	tk := time.NewTicker(time.Minute)
	defer tk.Stop()
	for {
		select {
		case <-done:
			return
		case <-tk.C:
			_ = m.InProgress()
		}
	}
}

// Train reports one job's simulated run: started, one progress per
// iteration, succeeded. Each event is published with Msg-Id
// <job_id>:<seq> and retried (publish) until JetStream stores it or
// ctx ends: a NATS outage delays the run, it does not abandon the job to
// its deadline.
func (t *Trainer) Train(ctx context.Context, job *schemas.TrainingJob) error {
	base := DefaultBase
	if t.cfg.Base != nil {
		if b, err := t.cfg.Base(ctx, job); err != nil {
			t.cfg.Log.Warn("simtrainer: base reward unknown, using the default", "job", job.JobID, "default", DefaultBase, "err", err)
		} else {
			base = b
		}
	}
	res := Simulate(t.cfg.Seed, job, base)
	t.cfg.Log.Info("SIMULATED trainer: job taken (no model is trained)", "job", job.JobID, "capability", job.Capability.Name,
		"iterations", len(res.Curve), "base_mean_reward", base)
	var seq int64
	send := func(e schemas.TrainingEvent) error {
		s := seq
		seq++
		e.JobID, e.At, e.Seq, e.Worker, e.Simulated = job.JobID, time.Now().UTC(), &s, Worker, true
		data, err := e.Encode()
		if err != nil {
			return err
		}
		if err := t.publish(ctx, job.Report.EventsSubject, data, job.JobID+":"+strconv.FormatInt(s, 10)); err != nil {
			return fmt.Errorf("simtrainer: publish %s: %w", e.Type, err)
		}
		return nil
	}
	if err := send(schemas.TrainingEvent{Type: schemas.EventStarted, Iterations: len(res.Curve)}); err != nil {
		return err
	}
	for _, p := range res.Curve {
		if t.cfg.Step > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(t.cfg.Step):
			}
		}
		it, mr, sd, kl := p.Iteration, p.MeanReward, p.RewardStd, p.KL
		if err := send(schemas.TrainingEvent{Type: schemas.EventProgress, Iteration: &it, Iterations: len(res.Curve),
			MeanReward: &mr, RewardStd: &sd, KL: &kl}); err != nil {
			return err
		}
	}
	ev := res.Eval
	if err := send(schemas.TrainingEvent{Type: schemas.EventSucceeded, Adapter: &schemas.EventAdapter{Name: res.AdapterName, URI: res.URI},
		Eval: &ev}); err != nil {
		return err
	}
	t.cfg.Log.Info("SIMULATED trainer: job reported succeeded (no model was trained)", "job", job.JobID, "adapter", res.AdapterName,
		"uri", res.URI, "final_mean_reward", ev.MeanReward)
	if t.cfg.OnDone != nil {
		t.cfg.OnDone(job, res)
	}
	return nil
}

// publishTimeout bounds one attempt to publish an event (JetStream's ack
// included).
const publishTimeout = 5 * time.Second

// publish publishes data on subject with Msg-Id msgID (a retry whose first
// attempt was stored is stored once), retrying with exponential backoff
// (100 ms, at most 5 s apart) until JetStream acks it; it gives up only
// when ctx ends, with ctx's error.
func (t *Trainer) publish(ctx context.Context, subject string, data []byte, msgID string) error {
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond), backoff.WithMaxInterval(5*time.Second),
		backoff.WithMaxElapsedTime(0))
	return backoff.RetryNotify(func() error {
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		defer cancel()
		_, err := t.cfg.JS.Publish(pctx, subject, data, jetstream.WithMsgID(msgID))
		return err
	}, backoff.WithContext(b, ctx), func(err error, d time.Duration) {
		t.cfg.Log.Warn("simtrainer: publish failed, will retry", "msg_id", msgID, "in", d, "err", err)
	})
}
