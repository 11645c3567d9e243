package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/traceops/trace/schemas"
)

// Command modes.
const (
	// ModeRun: the command is the trainer. It runs to its end; its standard
	// output carries the job's events, one training_event/v1 JSON object
	// per line; its exit code is mapped (ExitOutcome).
	ModeRun = "run"
	// ModeSubmit: the command hands the job to a scheduler and returns at
	// once (sbatch, kubectl apply, ray job submit, sky launch). Exit 0 means
	// accepted; the trainer then reports on trace.training.events.<job_id>.
	ModeSubmit = "submit"
)

// Defaults of CommandConfig.
const (
	DefaultRunTimeout    = 12 * time.Hour
	DefaultSubmitTimeout = 10 * time.Minute
	DefaultKillGrace     = 10 * time.Second
	DefaultSubmitRunning = 4
	// maxLine bounds one line of output: an event is at most 1 MiB
	// (schemas.DecodeTrainingEvent); a longer line is cut there.
	maxLine = 1 << 20
	// tailBytes of standard error are kept for a failure's reason.
	tailBytes = 2048
	// recordGrace is how long, after the kill grace, a stopping backend
	// keeps trying to record what its commands reported.
	recordGrace = 30 * time.Second
	// DefaultRelayFor bounds the retries of one event's relay to NATS.
	DefaultRelayFor = 2 * time.Minute
)

// Placeholders of a command template. Each is replaced wherever it occurs
// in an argument; an unknown {name} fails at start.
var Placeholders = []string{"spec", "job_id", "adapter_name", "output_uri", "events_subject", "spec_dir"}

var placeholderRe = regexp.MustCompile(`\{([a-z_]+)\}`)

// CommandConfig configures the command backend (adapter.command in
// trace's configuration).
type CommandConfig struct {
	// Argv is the command template: the program and its arguments, run
	// without a shell (write "sh", "-c", "…" to have one), with the
	// Placeholders replaced.
	Argv []string
	Mode string // run (default) | submit
	// SpecDir receives <job_id>.json, the job spec, before the command
	// starts; the file stays for inspection.
	SpecDir string
	// Dir is the command's working directory ("": trace's).
	Dir string
	// Env is added to the command's environment (KEY=value), after
	// TRACE_JOB_ID, TRACE_JOB_SPEC and TRACE_EVENTS_SUBJECT. The command
	// inherits trace's environment without trace's own TRACE_* variables
	// (ChildEnv).
	Env []string
	// Timeout bounds one command (0: 12h in run mode, 10m in submit mode);
	// at the timeout its whole process group gets SIGTERM, then SIGKILL
	// after KillGrace.
	Timeout   time.Duration
	KillGrace time.Duration
	// MaxRunning bounds the commands running at once (0: 1 in run mode,
	// one trainer per machine; 4 in submit mode). A dispatch beyond it is
	// refused and retried by the adapt role.
	MaxRunning int
	// RelayFor bounds the retries (with backoff) of the relay of one event
	// to NATS (0: DefaultRelayFor); past it the job fails (Command).
	RelayFor time.Duration
	// StatusEvery is how often a running command's job status is read
	// (0: DefaultStatusEvery), when the Reporter can read it
	// (JobStatusReader): a command whose job failed in trace meanwhile
	// (its deadline passed, a terminal event was rejected) is stopped like
	// one past its timeout. Whichever replica failed the job, the one
	// running its command sees it.
	StatusEvery time.Duration
}

// JobStatusReader reads a job's status (adapter.Stage); a Reporter that
// implements it lets the command backend stop a command whose job failed
// in trace while it ran.
type JobStatusReader interface {
	JobStatus(ctx context.Context, jobID string) (string, error)
}

// DefaultStatusEvery is CommandConfig.StatusEvery's default.
const DefaultStatusEvery = 30 * time.Second

// WithDefaults fills the zero values.
func (c CommandConfig) WithDefaults() CommandConfig {
	if c.Mode == "" {
		c.Mode = ModeRun
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultRunTimeout
		if c.Mode == ModeSubmit {
			c.Timeout = DefaultSubmitTimeout
		}
	}
	if c.KillGrace == 0 {
		c.KillGrace = DefaultKillGrace
	}
	if c.RelayFor == 0 {
		c.RelayFor = DefaultRelayFor
	}
	if c.StatusEvery == 0 {
		c.StatusEvery = DefaultStatusEvery
	}
	if c.MaxRunning == 0 {
		c.MaxRunning = 1
		if c.Mode == ModeSubmit {
			c.MaxRunning = DefaultSubmitRunning
		}
	}
	return c
}

// Validate checks the configuration without touching the system; prefix
// names the fields (e.g. "adapter.command.").
func (c CommandConfig) Validate(prefix string) error {
	var errs []error
	if len(c.Argv) == 0 || strings.TrimSpace(c.Argv[0]) == "" {
		errs = append(errs, fmt.Errorf("%sargv: a command is required (e.g. [python, -m, trace_trainer, --spec, \"{spec}\"])", prefix))
	}
	for i, a := range c.Argv {
		for _, m := range placeholderRe.FindAllStringSubmatch(a, -1) {
			if !slices.Contains(Placeholders, m[1]) {
				errs = append(errs, fmt.Errorf("%sargv[%d]: unknown placeholder {%s} (known: {%s})", prefix, i, m[1], strings.Join(Placeholders, "}, {")))
			}
		}
	}
	switch c.Mode {
	case "", ModeRun, ModeSubmit:
	default:
		errs = append(errs, fmt.Errorf("%smode: %q is not run or submit", prefix, c.Mode))
	}
	if c.SpecDir == "" {
		errs = append(errs, fmt.Errorf("%sspec_dir: must not be empty", prefix))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("%stimeout: must not be negative, got %s", prefix, c.Timeout))
	}
	if c.KillGrace < 0 {
		errs = append(errs, fmt.Errorf("%skill_grace: must not be negative, got %s", prefix, c.KillGrace))
	}
	if c.MaxRunning < 0 {
		errs = append(errs, fmt.Errorf("%smax_running: must not be negative, got %d", prefix, c.MaxRunning))
	}
	for i, e := range c.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("%senv[%d]: %q is not KEY=value", prefix, i, e))
		}
	}
	return errors.Join(errs...)
}

// Expand replaces the placeholders of argv for a job.
func Expand(argv []string, job *schemas.TrainingJob, specPath string) []string {
	vals := map[string]string{"spec": specPath, "job_id": job.JobID, "adapter_name": job.Output.AdapterName,
		"output_uri": job.Output.URI, "events_subject": job.Report.EventsSubject, "spec_dir": filepath.Dir(specPath)}
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = placeholderRe.ReplaceAllStringFunc(a, func(m string) string {
			if v, ok := vals[m[1:len(m)-1]]; ok {
				return v
			}
			return m
		})
	}
	return out
}

// ChildEnv is the environment a command inherits: trace's, without its
// own TRACE_* configuration variables (they may hold secrets: passwords,
// the webhook secret) and OPENAI_API_KEY (llm.api_key's fallback,
// llm.EnvOpenAIAPIKey), except keep, the variable the job names for the
// environment server's token (env_server.token_env). What else a trainer
// needs goes in adapter.command.env.
func ChildEnv(environ []string, keep string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if (strings.HasPrefix(k, "TRACE_") || k == "OPENAI_API_KEY") && (keep == "" || k != keep) {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// ErrBusy: every command slot is taken; the dispatch is retried later.
var ErrBusy = errors.New("command backend: every command slot is busy")

// Command runs a configured command per job. Dispatch writes the spec,
// starts the command and returns; the command's output is streamed to the
// log. Its events (run mode), and the failure trace makes of its end, are
// relayed through Relay to the job's events subject, where the adapt
// role's ordered events consumer applies them as any trainer's (applying
// them here, beside that consumer, raced a deadline's failure or another
// replica applying the same job's events); the history entries that change
// no status (a malformed line, the end) go to Reporter. A relay that fails
// past RelayFor (NATS away) fails the job through Reporter with the reason
// (then nothing else applies events: the consumer needs NATS too). Run
// must run for the backend's lifetime: when its context ends, running
// commands are stopped (their process groups get SIGTERM, then SIGKILL)
// and their jobs recorded FAILED.
type Command struct {
	cfg      CommandConfig
	Reporter Reporter   // set before the first Dispatch (the adapt stage)
	Relay    EventRelay // set before the first Dispatch (internal/bus)
	log      *slog.Logger
	slots    chan struct{}
	life     context.Context
	stop     context.CancelFunc
	// rec bounds the recording of what the commands reported: it ends
	// recordGrace after the backend stopped (a store that is away then
	// cannot be waited for forever).
	rec       context.Context
	recCancel context.CancelFunc
	wg        sync.WaitGroup
	now       func() time.Time
}

// NewCommand checks cfg and that its program can be found (an error names
// adapter.command.argv), and creates SpecDir.
func NewCommand(cfg CommandConfig, log *slog.Logger) (*Command, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate("adapter.command."); err != nil {
		return nil, err
	}
	if _, err := exec.LookPath(cfg.Argv[0]); err != nil {
		return nil, fmt.Errorf("adapter.command.argv[0]: %w", err)
	}
	if err := os.MkdirAll(cfg.SpecDir, 0o750); err != nil {
		return nil, fmt.Errorf("adapter.command.spec_dir: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	life, stop := context.WithCancel(context.Background())
	rec, recCancel := context.WithCancel(context.Background())
	return &Command{cfg: cfg, log: log, slots: make(chan struct{}, cfg.MaxRunning), life: life, stop: stop, rec: rec, recCancel: recCancel,
		now: time.Now}, nil
}

// Name is "command".
func (c *Command) Name() string { return "command" }

// Config is the effective configuration (defaults filled).
func (c *Command) Config() CommandConfig { return c.cfg }

// Run blocks until ctx ends, then stops the running commands and waits
// for them (each is given KillGrace after SIGTERM).
func (c *Command) Run(ctx context.Context) error {
	<-ctx.Done()
	c.stop()
	t := time.AfterFunc(c.cfg.KillGrace+recordGrace, c.recCancel)
	defer t.Stop()
	c.wg.Wait()
	return nil
}

// Wait waits for every command started so far to end and be reported.
func (c *Command) Wait() { c.wg.Wait() }

// Dispatch writes the spec to SpecDir/<job_id>.json and starts the
// command. It returns ErrBusy when MaxRunning commands run; a command that
// cannot be started is an error too (the dispatch is retried).
func (c *Command) Dispatch(ctx context.Context, job *schemas.TrainingJob, spec []byte) error {
	if c.Reporter == nil || c.Relay == nil {
		return errors.New("command backend: no reporter or relay")
	}
	if c.life.Err() != nil {
		return errors.New("command backend: stopping")
	}
	select {
	case c.slots <- struct{}{}:
	default:
		return fmt.Errorf("%w (%d running)", ErrBusy, cap(c.slots))
	}
	path := filepath.Join(c.cfg.SpecDir, job.JobID+".json")
	if err := writeFileAtomic(path, spec); err != nil {
		<-c.slots
		return fmt.Errorf("command backend: write spec: %w", err)
	}
	argv := Expand(c.cfg.Argv, job, path)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = c.cfg.Dir
	cmd.Env = append(ChildEnv(os.Environ(), job.EnvServer.TokenEnv), "TRACE_JOB_ID="+job.JobID, "TRACE_JOB_SPEC="+path,
		"TRACE_EVENTS_SUBJECT="+job.Report.EventsSubject)
	cmd.Env = append(cmd.Env, c.cfg.Env...)
	inGroup(cmd)
	// Output still held open by a process the command left behind is
	// closed this long after the command exits.
	cmd.WaitDelay = c.cfg.KillGrace
	started := c.now().UTC()
	r := &run{c: c, job: job, mode: c.cfg.Mode, prefix: "cmd:" + strconv.FormatInt(started.UnixNano(), 36) + ":",
		log: c.log.With("job", job.JobID, "backend", "command")}
	r.q = newLineQueue()
	r.stdout = &lineWriter{line: r.stdoutLine}
	r.stderr = &lineWriter{line: r.stderrLine}
	cmd.Stdout, cmd.Stderr = r.stdout, r.stderr
	c.wg.Add(1) // before Start: Run's Wait must see this command
	if err := cmd.Start(); err != nil {
		c.wg.Done()
		<-c.slots
		return fmt.Errorf("command backend: start %q: %w", argv[0], err)
	}
	r.log.Info("training command started", "argv", argv, "pid", cmd.Process.Pid, "mode", c.cfg.Mode, "timeout", c.cfg.Timeout)
	recorded := make(chan struct{})
	go func() {
		defer close(recorded)
		r.record()
	}()
	go func() {
		defer c.wg.Done()
		defer func() { <-c.slots }()
		r.wait(cmd, started, recorded)
	}()
	return nil
}

// run is one command's state.
type run struct {
	c              *Command
	job            *schemas.TrainingJob
	mode, prefix   string
	log            *slog.Logger
	stdout, stderr *lineWriter
	q              *lineQueue
	mu             sync.Mutex
	lines          int
	terminal       bool   // a succeeded or failed event was reported
	relayFailed    bool   // an event could not be relayed: the job was failed (record's goroutine, then wait's)
	stdoutTail     []byte // submit mode: what the scheduler answered
	stderrTail     []byte
}

func (r *run) wait(cmd *exec.Cmd, started time.Time, recorded <-chan struct{}) {
	done := make(chan struct{})
	var timedOutF, stoppedF, jobFailedF atomic.Bool
	go func() {
		t := time.NewTimer(r.c.cfg.Timeout)
		defer t.Stop()
		var status <-chan time.Time
		sr, watch := r.c.Reporter.(JobStatusReader)
		if watch && r.mode == ModeRun {
			tk := time.NewTicker(r.c.cfg.StatusEvery)
			defer tk.Stop()
			status = tk.C
		}
	wait:
		for {
			select {
			case <-done:
				return
			case <-t.C:
				timedOutF.Store(true)
				break wait
			case <-r.c.life.Done():
				stoppedF.Store(true)
				break wait
			case <-status:
				if r.jobFailed(sr) {
					jobFailedF.Store(true)
					break wait
				}
			}
		}
		r.log.Warn("stopping the training command's process group", "timed_out", timedOutF.Load(), "trace_stopping", stoppedF.Load(),
			"job_failed", jobFailedF.Load())
		_ = signalGroup(cmd, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(r.c.cfg.KillGrace):
		}
		_ = signalGroup(cmd, syscall.SIGKILL)
	}()
	err := cmd.Wait()
	close(done)
	timedOut, stopped, jobFailed := timedOutF.Load(), stoppedF.Load(), jobFailedF.Load()
	if timedOut || stopped || jobFailed {
		_ = signalGroup(cmd, syscall.SIGKILL) // whatever is left of the group
	}
	r.stdout.flush()
	r.stderr.flush()
	// Every event line is stored before the end is: the exit's outcome
	// depends on them and comes last in the history.
	r.q.close()
	<-recorded
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	r.mu.Lock()
	x := Exit{Mode: r.mode, Code: code, Signal: exitSignal(cmd), TimedOut: timedOut, Timeout: r.c.cfg.Timeout, Stopped: stopped,
		JobFailed: jobFailed, Terminal: r.terminal, StderrTail: string(r.stderrTail)}
	stdoutTail := string(r.stdoutTail)
	r.mu.Unlock()
	if err != nil && cmd.ProcessState == nil {
		x.Signal = "unknown (" + err.Error() + ")"
	}
	reason := ExitOutcome(x)
	ctx := r.c.rec
	note := map[string]any{"mode": r.mode, "exit_code": code, "duration_seconds": time.Since(started).Seconds(), "stderr_tail": x.StderrTail}
	if x.Signal != "" {
		note["signal"] = x.Signal
	}
	if timedOut {
		note["timed_out"] = r.c.cfg.Timeout.String()
	}
	if stopped {
		note["trace_stopped"] = true
	}
	if jobFailed {
		note["job_failed_in_trace"] = true
	}
	typ := "command_exited"
	if r.mode == ModeSubmit {
		note["stdout_tail"] = stdoutTail
		if reason == "" {
			typ = "submitted"
		}
	}
	payload, _ := json.Marshal(note)
	r.log.Info("training command ended", "exit_code", code, "signal", x.Signal, "timed_out", timedOut, "failure", reason)
	r.retry(ctx, "record the command's end", func(ctx context.Context) error {
		return r.c.Reporter.RecordNote(ctx, r.job.JobID, r.prefix+"exit", typ, payload)
	})
	if reason == "" {
		return
	}
	e := &schemas.TrainingEvent{JobID: r.job.JobID, Type: schemas.EventFailed, At: r.c.now().UTC(), Worker: "trace command backend", Reason: reason}
	data, err := e.Encode()
	if err != nil {
		r.log.Error("command backend: encode the failure", "err", err)
		return
	}
	r.relay(ctx, e, data, r.prefix+"failed")
}

// jobFailed reports whether the job is FAILED in trace though this run
// reported no terminal event: trace failed it (its deadline, a rejected
// event), and nothing the command does now will count. A read that fails
// is logged and counts as no.
func (r *run) jobFailed(sr JobStatusReader) bool {
	r.mu.Lock()
	terminal := r.terminal
	r.mu.Unlock()
	if terminal {
		return false
	}
	ctx, cancel := context.WithTimeout(r.c.life, 10*time.Second)
	defer cancel()
	st, err := sr.JobStatus(ctx, r.job.JobID)
	if err != nil {
		r.log.Warn("command backend: read the job's status", "err", err)
		return false
	}
	return st == "FAILED"
}

// relay publishes an event on the job's events subject (msgID as Msg-Id,
// so a publish retried within the duplicate window is stored once),
// retrying with backoff for RelayFor. Past it, the job is failed through
// the Reporter with a reason naming the event that was not applied; the
// events after it are not relayed (the job has ended).
func (r *run) relay(ctx context.Context, e *schemas.TrainingEvent, data []byte, msgID string) {
	if r.relayFailed {
		r.log.Warn("command backend: event not relayed: the job failed when an earlier one could not be", "type", e.Type)
		return
	}
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(200*time.Millisecond), backoff.WithMaxInterval(10*time.Second),
		backoff.WithMaxElapsedTime(r.c.cfg.RelayFor))
	err := backoff.RetryNotify(func() error {
		return r.c.Relay.RelayTrainingEvent(ctx, r.job.JobID, data, msgID)
	}, backoff.WithContext(b, ctx), func(err error, d time.Duration) {
		r.log.Warn("command backend: will retry", "what", "relay an event to NATS", "type", e.Type, "err", err, "in", d)
	})
	if err == nil {
		return
	}
	r.relayFailed = true
	what := "its " + e.Type + " event"
	if e.Type == schemas.EventSucceeded && e.Adapter != nil {
		what += fmt.Sprintf(" (adapter %s at %s, not registered)", e.Adapter.Name, e.Adapter.URI)
	} else if e.Type == schemas.EventFailed {
		what += " (" + e.Reason + ")"
	}
	reason := fmt.Sprintf("command backend: %s could not be relayed to NATS (%s) within %s: %v; the job's events after it are not applied",
		what, schemas.TrainingEventsSubject(r.job.JobID), r.c.cfg.RelayFor, err)
	r.log.Error("command backend: relay failed; the job fails", "type", e.Type, "err", err)
	f := &schemas.TrainingEvent{JobID: r.job.JobID, Type: schemas.EventFailed, At: r.c.now().UTC(), Worker: "trace command backend", Reason: reason}
	fdata, eerr := f.Encode()
	if eerr != nil {
		r.log.Error("command backend: encode the failure", "err", eerr)
		return
	}
	r.retry(ctx, "fail the job whose event could not be relayed", func(ctx context.Context) error {
		return r.c.Reporter.HandleEvent(ctx, f, r.prefix+"relay-failed", fdata)
	})
}

// retry runs fn until it succeeds or ctx ends: a store that is down holds
// the command's output back instead of losing its events.
func (r *run) retry(ctx context.Context, what string, fn func(context.Context) error) {
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(200*time.Millisecond), backoff.WithMaxInterval(10*time.Second),
		backoff.WithMaxElapsedTime(0))
	err := backoff.RetryNotify(func() error {
		err := fn(ctx)
		if err != nil && strings.Contains(err.Error(), unknownJob) {
			return backoff.Permanent(err) // retrying cannot help
		}
		return err
	}, backoff.WithContext(b, ctx), func(err error, d time.Duration) {
		r.log.Warn("command backend: will retry", "what", what, "err", err, "in", d)
	})
	if err != nil {
		r.log.Error("command backend: gave up", "what", what, "err", err)
	}
}

// unknownJob is adapter.ErrUnknownJob's text (dispatch does not import
// adapter).
const unknownJob = "unknown training job"

// stdoutLine runs on exec's copying goroutine: it parses and queues, and
// never waits for the store, so the command's output is read to its end
// however slow the store is (exec closes the pipes WaitDelay after the
// command exits; what is unread then would be lost).
func (r *run) stdoutLine(line []byte) {
	r.mu.Lock()
	r.lines++
	n := r.lines
	if r.mode == ModeSubmit {
		r.stdoutTail = tail(append(append(r.stdoutTail, line...), '\n'), tailBytes)
	}
	r.mu.Unlock()
	if r.mode == ModeSubmit {
		r.log.Info("command output", "stream", "stdout", "line", string(line))
		return
	}
	e, isEvent, err := ParseEventLine(r.job.JobID, line)
	if !isEvent {
		r.log.Info("command output", "stream", "stdout", "line", string(line))
		return
	}
	q := queued{n: n, key: r.prefix + strconv.Itoa(n), e: e, err: err, line: bytes.Clone(line)}
	q.msgID = q.key
	if err == nil {
		if e.Seq != nil { // as the callback's: a resent (job_id, seq) is stored once
			q.msgID = r.job.JobID + ":" + strconv.FormatInt(*e.Seq, 10)
		}
		if e.Type == schemas.EventSucceeded || e.Type == schemas.EventFailed {
			r.mu.Lock()
			r.terminal = true
			r.mu.Unlock()
		}
	}
	r.q.push(q)
}

// queued is an event line waiting to be relayed (or recorded, malformed).
type queued struct {
	n     int
	key   string // a malformed line's key in the history
	msgID string // an event's Msg-Id
	e     *schemas.TrainingEvent
	err   error // malformed
	line  []byte
}

// record relays the queued events in order (and records the malformed
// lines) until the queue is closed and empty; NATS or a store that is away
// is retried (the lines wait in memory).
func (r *run) record() {
	for {
		q, ok := r.q.pop()
		if !ok {
			return
		}
		ctx := r.c.rec
		if q.err != nil {
			r.log.Warn("command printed a malformed event line (recorded)", "line", q.n, "err", q.err)
			r.retry(ctx, "record a malformed event line", func(ctx context.Context) error {
				return r.c.Reporter.RecordMalformed(ctx, r.job.JobID, q.key, q.line, fmt.Errorf("stdout line %d: %w", q.n, q.err))
			})
			continue
		}
		r.log.Info("training event", "type", q.e.Type, "iteration", q.e.Iteration)
		r.relay(ctx, q.e, q.line, q.msgID)
	}
}

// lineQueue is an unbounded FIFO of event lines (events are small; the
// command must never block on the store).
type lineQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	items  []queued
	closed bool
}

func newLineQueue() *lineQueue {
	q := &lineQueue{}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *lineQueue) push(x queued) {
	q.mu.Lock()
	q.items = append(q.items, x)
	q.mu.Unlock()
	q.cond.Signal()
}

func (q *lineQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}

func (q *lineQueue) pop() (queued, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.closed {
		q.cond.Wait()
	}
	if len(q.items) == 0 {
		return queued{}, false
	}
	x := q.items[0]
	q.items[0] = queued{}
	q.items = q.items[1:]
	return x, true
}

func (r *run) stderrLine(line []byte) {
	r.mu.Lock()
	r.stderrTail = tail(append(append(r.stderrTail, line...), '\n'), tailBytes)
	r.mu.Unlock()
	r.log.Info("command output", "stream", "stderr", "line", string(line))
}

// ParseEventLine reads one line of a run-mode command's standard output.
// A line whose first non-blank character is not "{" is output, not an
// event (isEvent false). Any other line must be a valid training_event/v1
// object of this job; err says why it is not.
func ParseEventLine(jobID string, line []byte) (e *schemas.TrainingEvent, isEvent bool, err error) {
	t := bytes.TrimSpace(line)
	if len(t) == 0 || t[0] != '{' {
		return nil, false, nil
	}
	e, err = schemas.DecodeTrainingEvent(t)
	if err != nil {
		return nil, true, err
	}
	if e.JobID != jobID {
		return nil, true, fmt.Errorf("job_id %s is not this command's job %s", e.JobID, jobID)
	}
	return e, true, nil
}

// Exit is how a command ended.
type Exit struct {
	Mode       string
	Code       int    // -1 when killed by a signal
	Signal     string // the signal that ended it, if one did
	TimedOut   bool   // trace killed it at Timeout
	Timeout    time.Duration
	Stopped    bool // trace killed it while shutting down
	JobFailed  bool // trace killed it because its job had failed (deadline, rejection)
	Terminal   bool // it reported succeeded or failed (run mode)
	StderrTail string
}

// ExitOutcome maps a command's end to the reason its job fails, or "" when
// the job's status stands: run mode, exit 0 after a succeeded or failed
// event (the event decides); submit mode, exit 0 (accepted: the trainer
// reports over NATS). Everything else fails the job: a timeout, trace
// stopping, a signal, a non-zero exit (the code and the tail of standard
// error), and in run mode an exit 0 without a terminal event — trace
// cannot register an adapter the trainer never reported, and a job that
// nobody will report on again must not wait for its deadline. A failure
// after a terminal event is recorded but changes nothing (the job ended).
func ExitOutcome(x Exit) string {
	what := "command"
	if x.Mode == ModeSubmit {
		what = "submit command"
	}
	var reason string
	switch {
	case x.TimedOut:
		reason = fmt.Sprintf("%s timed out after %s; its process group was killed", what, x.Timeout)
	case x.Stopped:
		reason = fmt.Sprintf("trace stopped while the %s ran; its process group was killed", what)
	case x.JobFailed:
		reason = fmt.Sprintf("the job failed in trace while the %s ran (see its history); its process group was killed", what)
	case x.Signal != "":
		reason = fmt.Sprintf("%s killed by signal %s", what, x.Signal)
	case x.Code != 0:
		reason = fmt.Sprintf("%s exited with code %d", what, x.Code)
	case x.Mode != ModeSubmit && !x.Terminal:
		reason = "command exited 0 without reporting succeeded or failed"
	default:
		return ""
	}
	if s := strings.TrimSpace(lastLines(x.StderrTail, 10, 1024)); s != "" {
		reason += "; stderr: " + s
	}
	return reason
}

// lastLines is the end of s: at most n lines and max bytes.
func lastLines(s string, n, maxBytes int) string {
	s = strings.TrimRight(s, "\n")
	ls := strings.Split(s, "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	s = strings.Join(ls, "\n")
	if len(s) > maxBytes {
		s = "…" + s[len(s)-maxBytes:]
	}
	return s
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return append([]byte(nil), b[len(b)-n:]...)
	}
	return b
}

// lineWriter calls line for every line written to it (without its
// newline); a line longer than maxLine is cut there (the rest of it is
// dropped). exec's copying goroutine is its only writer.
type lineWriter struct {
	line func([]byte)
	buf  []byte
	skip bool // the line in progress was cut: drop it up to its newline
}

func (w *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk, p = p[:i], p[i+1:]
		} else {
			p = nil
		}
		if !w.skip {
			w.buf = append(w.buf, chunk...)
			if len(w.buf) >= maxLine {
				w.buf = w.buf[:maxLine]
				w.emit()
				w.skip = true
			}
		}
		if i >= 0 {
			if !w.skip {
				w.emit()
			}
			w.skip = false
		}
	}
	return n, nil
}

func (w *lineWriter) emit() {
	w.line(bytes.TrimRight(w.buf, "\r"))
	w.buf = w.buf[:0]
}

// flush emits a last line without its newline.
func (w *lineWriter) flush() {
	if len(w.buf) > 0 && !w.skip {
		w.emit()
	}
}

func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".spec-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o640); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
