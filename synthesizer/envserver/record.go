package envserver

import (
	"context"
	"hash/fnv"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/traceops/trace/sink"
)

// EpisodeWriter stores finished episodes; *sink.Store implements it
// (ClickHouse env_episodes). InsertEnvEpisodes is called from one goroutine; a
// nil error means the rows are durable.
type EpisodeWriter interface {
	InsertEnvEpisodes(ctx context.Context, rows []sink.EnvEpisodeRow) error
}

// recorder queues sampled episodes and writes them in batches from its own
// goroutine, so a step never waits on ClickHouse: the queue is bounded, and
// an episode that finds it full is dropped and counted.
type recorder struct {
	w       EpisodeWriter
	cfg     Config
	m       *metrics
	log     *slog.Logger
	q       chan sink.EnvEpisodeRow
	done    chan struct{}
	maxWait time.Duration // bound of one batch's retries

	// life bounds every write; it ends when the shutdown's drain budget
	// does.
	life    context.Context
	endLife context.CancelFunc
	quit    chan struct{} // closed by stop: drain the queue and return

	// mu is held shared by offer and taken by stop to close the queue:
	// once stopped, no row enters it, and one offered is counted dropped.
	mu      sync.RWMutex
	stopped bool

	abandoned int // rows the drain budget cut off (run's goroutine; read after done)
}

func newRecorder(w EpisodeWriter, cfg Config, m *metrics, log *slog.Logger) *recorder {
	life, end := context.WithCancel(context.Background())
	return &recorder{w: w, cfg: cfg, m: m, log: log, q: make(chan sink.EnvEpisodeRow, cfg.RecordQueue),
		done: make(chan struct{}), maxWait: 30 * time.Second, life: life, endLife: end, quit: make(chan struct{})}
}

// Sampled reports whether an episode is recorded at rate: a hash of its id below
// the rate, so the choice is the same wherever it is made.
func Sampled(episodeID string, rate float64) bool {
	if rate >= 1 {
		return true
	}
	if rate <= 0 {
		return false
	}
	h := fnv.New64a()
	h.Write([]byte(episodeID))
	// FNV's high bits are poorly spread for short, similar ids: mix them
	// (splitmix64's finalizer) before comparing.
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x)/math.MaxUint64 < rate
}

// offer queues row without blocking; it reports false when the queue was
// full (the row is dropped and counted) or the recorder stopped.
func (r *recorder) offer(row sink.EnvEpisodeRow) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.stopped {
		r.m.dropped.WithLabelValues("shutdown").Inc()
		r.log.Warn("env_episodes: episode ended after the recorder stopped, not recorded", "environment", row.EnvironmentID, "episode", row.EpisodeID)
		return false
	}
	select {
	case r.q <- row:
		return true
	default:
		r.m.dropped.WithLabelValues("queue_full").Inc()
		return false
	}
}

// stop closes the queue and waits while run writes what it holds, for at
// most drain: rows still unwritten then are dropped, counted (reason
// "shutdown") and logged. It reports how many.
func (r *recorder) stop(drain time.Duration) int {
	r.mu.Lock()
	already := r.stopped
	r.stopped = true
	r.mu.Unlock()
	if !already {
		close(r.quit)
	}
	t := time.AfterFunc(drain, r.endLife)
	defer t.Stop()
	<-r.done
	return r.abandoned
}

// run writes batches until stop, then drains the queue (within the drain
// budget) and returns.
func (r *recorder) run() {
	defer close(r.done)
	defer r.endLife()
	batch := make([]sink.EnvEpisodeRow, 0, r.cfg.RecordBatch)
	t := time.NewTicker(r.cfg.RecordFlush)
	defer t.Stop()
	flush := func() {
		if len(batch) == 0 {
			return
		}
		r.write(batch)
		batch = batch[:0]
	}
	for {
		select {
		case row := <-r.q:
			batch = append(batch, row)
			if len(batch) >= r.cfg.RecordBatch {
				flush()
			}
		case <-t.C:
			flush()
		case <-r.quit:
			// Nothing enters the queue any more: write what it holds.
			for {
				select {
				case row := <-r.q:
					batch = append(batch, row)
					if len(batch) >= r.cfg.RecordBatch {
						flush()
					}
				default:
					flush()
					if r.abandoned > 0 {
						r.log.Error("env_episodes: episodes not written at shutdown (the drain budget ran out)", "episodes", r.abandoned)
					}
					return
				}
			}
		}
	}
}

// write inserts one batch, retrying with capped exponential backoff for at
// most maxWait; a batch that still fails is dropped and counted (the step
// path is never held up for it), as is one the shutdown's drain budget
// cuts off.
func (r *recorder) write(rows []sink.EnvEpisodeRow) {
	err := r.life.Err()
	if err == nil {
		b := backoff.NewExponentialBackOff()
		b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 100*time.Millisecond, 5*time.Second, r.maxWait
		err = backoff.Retry(func() error {
			ctx, cancel := context.WithTimeout(r.life, 30*time.Second)
			defer cancel()
			return r.w.InsertEnvEpisodes(ctx, rows)
		}, backoff.WithContext(b, r.life))
	}
	switch {
	case err == nil:
		r.m.recorded.Add(float64(len(rows)))
	case r.life.Err() != nil:
		r.m.dropped.WithLabelValues("shutdown").Add(float64(len(rows)))
		r.abandoned += len(rows)
	default:
		r.m.dropped.WithLabelValues("write_failed").Add(float64(len(rows)))
		r.log.Error("env_episodes: batch dropped after retries", "episodes", len(rows), "err", err)
	}
}
