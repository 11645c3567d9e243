package synthesizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/schemas"
)

// Consumer is the part of a JetStream pull consumer the worker uses (the
// durable consumer on stream TRACE_SYNTHESIS that internal/bus creates).
type Consumer interface {
	Fetch(batch int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error)
}

// WaitingLister lists the environments waiting for a generation model, to
// resume them when one is configured.
type WaitingLister interface {
	WaitingEnvironments(ctx context.Context) ([]*Environment, error)
}

// Requeuer puts a synthesis request back on its subject with a Msg-Id
// (internal/bus.Bus on TRACE_SYNTHESIS): JetStream drops a second publish
// of that Msg-Id within the stream's duplicate window, and the durable
// consumer hands the one message to one replica.
type Requeuer interface {
	RequeueSynthesis(ctx context.Context, req *schemas.SynthesisRequest, msgID string) error
}

// ResumeMsgID is the Msg-Id that requeues e to resume it: the same for
// every replica that sees this version of its record, so replicas started
// together requeue it once.
func ResumeMsgID(e *Environment) string {
	return resumePrefix + e.ID + ":" + strconv.FormatUint(e.Version, 10)
}

const resumePrefix = "resume:"

// resumeOf is the environment id and record version a resume message was
// requeued for; ok false for any other message.
func resumeOf(m jetstream.Msg) (id string, version uint64, ok bool) {
	rest, ok := strings.CutPrefix(m.Headers().Get(jetstream.MsgIDHeader), resumePrefix)
	if !ok {
		return "", 0, false
	}
	id, v, ok := strings.Cut(rest, ":")
	if !ok {
		return "", 0, false
	}
	version, err := strconv.ParseUint(v, 10, 64)
	return id, version, err == nil
}

// Defaults of WorkerConfig.
const (
	DefaultWorkerConcurrency = 2
	DefaultMaxDeliver        = 5
	DefaultNakDelay          = 5 * time.Second
	DefaultMaxNakDelay       = 5 * time.Minute
	DefaultAckWait           = 2 * time.Minute
	DefaultMaxHeld           = 64
)

// WorkerConfig configures a Worker. Zero fields take the defaults.
type WorkerConfig struct {
	// Concurrency is the number of environments synthesized at once; never
	// two of the same target environment. Default 2.
	Concurrency int
	// AckWait is the consumer's ack wait: held and running requests get an
	// in-progress ack every AckWait/3 so they are not redelivered. Default 2m.
	AckWait time.Duration
	// MaxDeliver bounds the deliveries of a request that fail transiently
	// (Environment.TransientFailures; redeliveries after a shutdown or a
	// crash are not counted); at the last one its environment is recorded
	// FAILED with the last error. Default 5. (The consumer itself redelivers without a
	// limit, so a request is never dropped before it is recorded.)
	MaxDeliver int
	// A transient failure is Nak'd with NakDelay × 2^(deliveries-1), at
	// most MaxNakDelay. Defaults 5s and 5m.
	NakDelay, MaxNakDelay time.Duration
	// MaxHeld bounds the requests fetched and not yet finished. Default 64.
	MaxHeld int
	// Waiting and Requeue, when both are set, resume the WAITING_FOR_LLM
	// environments at start: each one this worker's stage can take further
	// is requeued (ResumeMsgID) on the consumer's stream, so that one
	// replica, whichever JetStream delivers it to, resumes it. One that
	// still cannot go on stays waiting, unchanged, and is not requeued.
	Waiting WaitingLister
	Requeue Requeuer
	Log     *slog.Logger
}

func (c WorkerConfig) withDefaults() WorkerConfig {
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultWorkerConcurrency
	}
	if c.AckWait <= 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxDeliver <= 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.NakDelay <= 0 {
		c.NakDelay = DefaultNakDelay
	}
	if c.MaxNakDelay <= 0 {
		c.MaxNakDelay = DefaultMaxNakDelay
	}
	if c.MaxHeld <= 0 {
		c.MaxHeld = DefaultMaxHeld
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Worker consumes synthesis requests and runs them through the Stage.
//
// Acknowledgement contract: a request is acked once its environment is
// recorded DONE (and announced), FAILED or WAITING_FOR_LLM; Nak'd with a
// growing delay after a transient failure (its record keeps where it stood
// and the redelivery resumes it); acked after being recorded FAILED at its
// MaxDeliver-th delivery; terminated when it is not a valid synthesis
// request (logged with the reason; nothing can be built from it); acked
// without work at its first delivery when it is a requeued resume
// (ResumeMsgID) whose environment has moved on since. Every held
// request gets an in-progress ack every AckWait/3, including those queued
// behind another capability of the same environment. On shutdown the
// requests not finished are Nak'd once the worker's last pull request has
// ended, so another replica resumes them at once.
type Worker struct {
	stage *Stage
	src   Consumer
	cfg   WorkerConfig
}

// NewWorker returns a worker of stage fed by src.
func NewWorker(stage *Stage, src Consumer, cfg WorkerConfig) *Worker {
	return &Worker{stage: stage, src: src, cfg: cfg.withDefaults()}
}

// job is one request the worker holds, with its delivery.
type job struct {
	req *schemas.SynthesisRequest
	msg jetstream.Msg
}

type result struct {
	j   job
	env string
	e   *Environment
	err error
}

// Run consumes until ctx ends, then waits for its last fetch to expire (at
// most a second), Naks what it holds and returns nil.
func (w *Worker) Run(ctx context.Context) error {
	var (
		q       queue[job]
		running = map[string]job{} // environment → its running job
		results = make(chan result)
		fetched = make(chan []jetstream.Msg)
		want    = make(chan int, 1)
		workCtx context.Context
		cancel  context.CancelFunc
	)
	workCtx, cancel = context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	fetchDone := make(chan struct{})
	go func() {
		defer close(fetchDone)
		w.fetchLoop(ctx, want, fetched)
	}()
	w.requeueWaiting(ctx)
	heartbeat := time.NewTicker(w.cfg.AckWait / 3)
	defer heartbeat.Stop()
	fetching := false
	for {
		// Start what can start: one job per environment.
		for len(running) < w.cfg.Concurrency {
			j, env, ok := q.next(func(env string) bool { _, busy := running[env]; return busy })
			if !ok {
				break
			}
			running[env] = j
			go func() {
				if e := w.superseded(workCtx, j); e != nil {
					results <- result{j: j, env: env, e: e}
					return
				}
				e, err := w.stage.Synthesize(workCtx, j.req)
				results <- result{j: j, env: env, e: e, err: err}
			}()
		}
		if held := q.len() + len(running); !fetching && held < w.cfg.MaxHeld && ctx.Err() == nil {
			fetching = true
			want <- min(w.cfg.MaxHeld-held, 16)
		}
		select {
		case <-ctx.Done():
			cancel() // running jobs stop at their next I/O
			// Let the last pull request end (≤ FetchMaxWait) before handing
			// anything back: a request Nak'd while it is still open on the
			// server is redelivered into it, and once this process has
			// closed its connection that delivery sits unacknowledged for
			// a whole AckWait before another replica gets it.
			<-fetchDone
			for _, j := range q.drain() {
				nak(j, 0)
			}
			for len(running) > 0 {
				r := <-results
				delete(running, r.env)
				w.finish(context.WithoutCancel(ctx), r, true)
			}
			return nil
		case msgs := <-fetched:
			fetching = false
			for _, m := range msgs {
				req, err := schemas.DecodeSynthesisRequest(m.Data())
				if err != nil {
					w.cfg.Log.Error("synthesizer: not a synthesis request; terminated", "subject", m.Subject(), "err", err)
					_ = m.TermWithReason("invalid synthesis request: " + err.Error())
					continue
				}
				q.add(req.Environment, req.Rank, req.Capability.MeanDelta, req.FiredAt, job{req: req, msg: m})
			}
		case r := <-results:
			delete(running, r.env)
			w.finish(ctx, r, false)
		case <-heartbeat.C:
			q.each(func(j job) { inProgress(j) })
			for _, j := range running {
				inProgress(j)
			}
		}
	}
}

// requeueWaiting requeues the waiting environments this worker's stage can
// take further (see WorkerConfig.Waiting). A failure is logged: the next
// start tries again.
func (w *Worker) requeueWaiting(ctx context.Context) {
	if w.cfg.Waiting == nil || w.cfg.Requeue == nil {
		return
	}
	es, err := w.cfg.Waiting.WaitingEnvironments(ctx)
	if err != nil {
		w.cfg.Log.Warn("synthesizer: list waiting environments", "err", err)
		return
	}
	for _, e := range es {
		ok, err := w.stage.Resumable(ctx, e)
		if err != nil {
			w.cfg.Log.Warn("synthesizer: waiting environment", "id", e.ID, "err", err)
			continue
		}
		if !ok {
			continue
		}
		if err := w.cfg.Requeue.RequeueSynthesis(ctx, e.Request, ResumeMsgID(e)); err != nil {
			w.cfg.Log.Warn("synthesizer: requeue a waiting environment", "id", e.ID, "err", err)
			continue
		}
		w.cfg.Log.Info("synthesizer: requeued an environment that waited, to resume it", "id", e.ID, "capability", e.Capability)
	}
}

// superseded returns the record of a resume message's environment when it
// moved on from the version the message was requeued for, before this
// first delivery (another resume message took it further, as when a
// replica requeued it again after the duplicate window): nothing is to be
// done. A redelivery is never superseded: the record moved on in the
// delivery before, which did not finish.
func (w *Worker) superseded(ctx context.Context, j job) *Environment {
	id, version, ok := resumeOf(j.msg)
	if !ok || delivered(j) > 1 {
		return nil
	}
	e, err := w.stage.cfg.Store.LoadEnvironment(ctx, id)
	if err != nil || e == nil || e.Version == version && e.Status == StatusWaitingForLLM {
		return nil
	}
	w.cfg.Log.Info("synthesizer: a resume request found its environment moved on; acknowledged", "id", id, "status", e.Status)
	return e
}

// fetchLoop fetches up to n messages each time it is asked, until ctx ends.
// A fetch in flight when ctx ends runs to its expiry rather than being
// abandoned, so that nothing the server delivers into it is left behind;
// what it brings is Nak'd.
func (w *Worker) fetchLoop(ctx context.Context, want <-chan int, out chan<- []jetstream.Msg) {
	for {
		var n int
		select {
		case <-ctx.Done():
			return
		case n = <-want:
		}
		var msgs []jetstream.Msg
		for len(msgs) == 0 && ctx.Err() == nil {
			batch, err := w.src.Fetch(n, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				if ctx.Err() == nil {
					w.cfg.Log.Warn("synthesizer: fetch", "err", err)
					sleep(ctx, time.Second)
				}
				continue
			}
			for m := range batch.Messages() {
				msgs = append(msgs, m)
			}
			if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoHeartbeat) && ctx.Err() == nil && len(msgs) == 0 {
				if !errors.Is(err, context.DeadlineExceeded) {
					w.cfg.Log.Debug("synthesizer: fetch batch", "err", err)
				}
			}
		}
		select {
		case out <- msgs:
		case <-ctx.Done():
			for _, m := range msgs {
				_ = m.Nak()
			}
			return
		}
	}
}

// finish acknowledges a job by its outcome.
func (w *Worker) finish(ctx context.Context, r result, shuttingDown bool) {
	j := r.j
	switch {
	case r.err == nil:
		ack(j)
	case shuttingDown || errors.Is(r.err, context.Canceled):
		nak(j, 0)
	default:
		// The budget is the deliveries that failed transiently, counted in
		// the record: a request handed back at shutdown (Nak) or redelivered
		// after a crash was delivered again without failing, and counting
		// those (JetStream's delivery count) failed a long synthesis at its
		// first blip after a few restarts. Unrecorded (the store is
		// away), the delivery count stands in.
		n := delivered(j)
		if f, err := w.stage.NoteTransient(ctx, j.req); err == nil {
			n = uint64(f)
		} else {
			w.cfg.Log.Warn("synthesizer: record a transient failure; counting deliveries instead", "trigger_id", j.req.TriggerID, "err", err)
		}
		if j.msg != nil && n >= uint64(w.cfg.MaxDeliver) {
			reason := fmt.Sprintf("failed transiently %d times, the last: %v", n, r.err)
			if _, err := w.stage.Abort(ctx, j.req, reason); err != nil {
				w.cfg.Log.Error("synthesizer: record FAILED", "trigger_id", j.req.TriggerID, "err", err)
				nak(j, w.cfg.MaxNakDelay) // keep it until it is recorded
				return
			}
			w.cfg.Log.Error("synthesizer: request failed after its last delivery", "trigger_id", j.req.TriggerID, "reason", reason)
			ack(j)
			return
		}
		delay := w.cfg.NakDelay << min(max(n, 1)-1, 16)
		delay = min(delay, w.cfg.MaxNakDelay)
		w.cfg.Log.Warn("synthesizer: transient failure, retrying", "trigger_id", j.req.TriggerID, "transient_failures", n, "delay", delay, "err", r.err)
		nak(j, delay)
	}
}

func delivered(j job) uint64 {
	if j.msg == nil {
		return 1
	}
	md, err := j.msg.Metadata()
	if err != nil {
		return 1
	}
	return md.NumDelivered
}

// ack waits for the server's confirmation: a request whose ack was lost is
// redelivered, finds its environment finished and is acked again.
func ack(j job) {
	if j.msg != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = j.msg.DoubleAck(ctx)
	}
}

func nak(j job, d time.Duration) {
	if j.msg == nil {
		return
	}
	if d > 0 {
		_ = j.msg.NakWithDelay(d)
	} else {
		_ = j.msg.Nak()
	}
}

func inProgress(j job) {
	if j.msg != nil {
		_ = j.msg.InProgress()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
