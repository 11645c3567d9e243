// Package app assembles trace's roles into one process: it starts the
// embedded servers a configuration asks for, opens ClickHouse and NATS, and
// runs every enabled role as an actor (a run function and an interrupt
// function, as Prometheus does with oklog/run), so one failing role stops the
// others. Shutdown interrupts every actor at once (oklog/run gives no order):
// each consumer drains and commits its batch in flight within its drain
// timeout (the analyze stage under the llm labeler gives it up, uncommitted,
// once its calls in flight have answered: stream.ErrStopped) while the
// evaluator and the HTTP server stop; the LLM audit writer
// stops, with its last flush, after all of them; Run returns when all have
// returned, and only then does Close stop the store, the bus and the
// embedded servers, in reverse start order.
package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"golang.org/x/sync/singleflight"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/chserver"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/datadir"
	"github.com/traceops/trace/internal/embedded"
	"github.com/traceops/trace/internal/gcpace"
	"github.com/traceops/trace/internal/httpauth"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer/envserver"
	"github.com/traceops/trace/verify"
)

// App is a running trace process.
type App struct {
	Cfg       config.Config
	Log       *slog.Logger
	Registry  *prometheus.Registry
	Store     *sink.Store
	Bus       *bus.Bus
	Dicts     *analyzer.Registry
	Evaluator *analyzer.Evaluator
	Adapt     *adapter.Stage  // with the adapt role, after Run started
	Verify    *verify.Checker // the closed loop's guard, with the adapt role
	Brokers   []string
	NATSURL   string
	Dialer    *kafka.Dialer

	kfake *kfake.Cluster
	// stopGC ends the collector's pacing (gcpace) Start began.
	stopGC func()
	nats   *server.Server
	ch     *chserver.Server
	// lock holds data_dir while embedded servers keep their data there
	// (LockDataDir); Close releases it last.
	lock *datadir.Lock

	ready      sync.Once
	readyCh    chan struct{}
	background []Actor // actors the roles need (e.g. the LLM audit writer)
	llm        *llm.Client
	audit      *AuditRecorder
	httpAddr   string
	envSrv     *envserver.Server // the serve role's environment server
	envAddr    string
	envHTTP    *http.Server // env.addr's server, when set
	routerAddr string       // the route role's listener

	readyRound  singleflight.Group // /readyz's round of checks in flight (ready.go)
	consumersMu sync.Mutex
	consumers   []consumerState // the roles' Kafka consumers, for /readyz

	// Simulated, when set before Run, provides the simulated policy for
	// synthesizer.policy: simulated (trace demo).
	Simulated SimulatedPolicies
}

// ClickHouseAddr is the native address of the ClickHouse in use (the
// embedded server's when none is configured).
func (a *App) ClickHouseAddr() string {
	if a.ch != nil {
		return a.ch.Addr()
	}
	return a.Cfg.ClickHouse.Addr[0]
}

// HTTPAddr is the address the serve role listens on (after Ready).
func (a *App) HTTPAddr() string { return a.httpAddr }

// EnvAddr is the address of the dedicated env.addr listener (after Ready),
// "" without one.
func (a *App) EnvAddr() string { return a.envAddr }

// EmbeddedClickHouse is the local ClickHouse server trace started (nil when
// clickhouse.addr is configured). Run supervises it.
func (a *App) EmbeddedClickHouse() *chserver.Server { return a.ch }

// Start brings up the infrastructure (embedded where nothing is configured),
// migrates ClickHouse, connects NATS and loads the dictionaries. Close undoes it.
// When it starts an embedded server it first takes the data directory
// (LockDataDir), and fails at once when another process holds it.
func Start(ctx context.Context, cfg config.Config, log *slog.Logger) (*App, error) {
	return StartLocked(ctx, cfg, log, nil)
}

// StartLocked is Start with the data directory already taken by
// LockDataDir (trace demo takes it before it resets the directory); the
// App releases lock at Close, or at once when it fails to start. With a
// nil lock it is Start.
func StartLocked(ctx context.Context, cfg config.Config, log *slog.Logger, lock *datadir.Lock) (*App, error) {
	a := &App{Cfg: cfg, Log: log, Registry: prometheus.NewRegistry(), Dicts: analyzer.NewRegistry(), readyCh: make(chan struct{}), lock: lock}
	a.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ok := false
	defer func() {
		if !ok {
			a.Close()
		}
	}()
	if a.lock == nil && embedsServers(cfg) {
		// Before any server starts: a second process on the directory
		// killed the first one's ClickHouse as "left running" and shared
		// its broker's files.
		var err error
		if a.lock, err = LockDataDir(cfg); err != nil {
			return nil, err
		}
	}
	if p, setting := cfg.GCPolicy(os.Getenv("GOGC")); p != (gcpace.Policy{}) {
		a.stopGC = gcpace.Start(p)
		log.Info("one role alone: garbage collector paced", "gogc", cmp.Or(p.Percent, 100), "headroom_mib", p.Headroom>>20,
			"from", setting+" (GOGC in the environment overrides)")
	}
	var err error
	a.Brokers = cfg.Kafka.Brokers
	if len(a.Brokers) == 0 {
		if a.kfake, err = embedded.Kafka(cfg.Kafka.EmbeddedAddr, cfg.Path("kafka"), 4, cfg.Kafka.TopicMaxBytes(), log,
			cfg.Kafka.RolloutsTopic, cfg.Kafka.LabelsTopic, cfg.Kafka.DLQTopic); err != nil {
			return nil, err
		}
		a.Brokers = a.kfake.ListenAddrs()
	}
	if a.Dialer, err = KafkaDialer(cfg.Kafka); err != nil {
		return nil, err
	}
	chCfg := cfg.ClickHouse
	if len(chCfg.Addr) == 0 {
		if a.ch, err = embedded.ClickHouse(ctx, cfg.Path("clickhouse"), cfg.Embedded.ClickHousePort, cfg.Embedded.ClickHouseHTTPPort, log); err != nil {
			return nil, err
		}
		chCfg.Addr = []string{a.ch.Addr()}
	}
	if a.Store, err = openStore(ctx, chCfg, log); err != nil {
		return nil, err
	}
	if err := a.Store.RegisterMetrics(a.Registry); err != nil {
		return nil, err
	}
	if err := a.Store.Migrate(ctx); err != nil {
		return nil, err
	}
	// NATS and the dictionaries serve the analyze, synthesize, adapt and
	// serve roles; an ingest-only replica neither needs nor waits for them.
	if needsNATS(cfg) {
		natsCfg := cfg.NATS
		if natsCfg.URL == "" {
			if a.nats, natsCfg.URL, err = embedded.NATS(cfg.Path("nats"), cfg.Embedded.NATSPort, log); err != nil {
				return nil, err
			}
		}
		a.NATSURL = natsCfg.URL
		if a.Bus, err = openBus(ctx, natsCfg, log); err != nil {
			return nil, err
		}
		if err := a.loadDictionaries(ctx); err != nil {
			return nil, err
		}
	}
	ok = true
	return a, nil
}

// needsNATS: the roles that use NATS and the dictionaries are enabled.
func needsNATS(cfg config.Config) bool {
	return cfg.Has("analyze") || cfg.Has("synthesize") || cfg.Has("adapt") || cfg.Has("serve")
}

// embedsServers: Start starts an embedded server, which keeps its data
// under cfg.DataDir (a process whose servers are all configured does not
// take the directory).
func embedsServers(cfg config.Config) bool {
	return len(cfg.Kafka.Brokers) == 0 || len(cfg.ClickHouse.Addr) == 0 || (needsNATS(cfg) && cfg.NATS.URL == "")
}

// LockDataDir takes cfg's data directory for this process until the lock
// is released (at the latest when the process exits, however it exits).
// When another process holds it, the error names the directory, that
// process's pid and the two ways out.
func LockDataDir(cfg config.Config) (*datadir.Lock, error) {
	l, err := datadir.Acquire(cfg.DataDir)
	var busy *datadir.BusyError
	if errors.As(err, &busy) {
		return nil, fmt.Errorf("%w: stop that process, or give this one a data directory of its own (data_dir: --set data_dir=<dir>, or TRACE_DATA_DIR)", err)
	}
	return l, err
}

// How Start waits for ClickHouse: for up to storeWait in all, retrying a
// retryable error with capped exponential backoff (storeRetryFirst,
// doubling, jittered, to storeRetryMax: about 16 attempts in a minute,
// where a fixed second made 60), with a warning at most every
// storeWarnEvery.
const (
	storeWait       = 60 * time.Second
	storeRetryFirst = 250 * time.Millisecond
	storeRetryMax   = 5 * time.Second
	storeWarnEvery  = 5 * time.Second
)

// openStore connects to ClickHouse, retrying for a while: a server that is
// still starting (compose, Kubernetes) is not a configuration error.
func openStore(ctx context.Context, cfg sink.Config, log *slog.Logger) (*sink.Store, error) {
	return openStoreWithin(ctx, cfg, log, storeWait)
}

// openStoreWithin is openStore waiting for at most within in all (each
// attempt too is bounded by it). The warning while it waits names the
// address, the attempts so far and the last error; the error after within
// names the address too.
func openStoreWithin(ctx context.Context, cfg sink.Config, log *slog.Logger, within time.Duration) (*sink.Store, error) {
	dep := dependency{name: "ClickHouse", key: "addr", addr: strings.Join(cfg.Addr, ","), retryable: sink.IsRetryable}
	return waitFor(ctx, log, dep, within, func(ctx context.Context) (*sink.Store, error) { return sink.Open(ctx, cfg, log) })
}

// dependency is a server Start waits for: its name in messages (in lower
// case in the log's), the log key and value of its address, how long one
// attempt may take (0: until the overall deadline), and which errors mean
// "not reachable yet" (others are returned at once).
type dependency struct {
	name, key, addr string
	attempt         time.Duration
	retryable       func(error) bool
}

// waitFor opens dep with open, retrying a retryable error for up to within
// in all with capped exponential backoff (storeRetryFirst doubling to
// storeRetryMax) and a warning at most every storeWarnEvery; it says when
// the server became reachable after a wait.
func waitFor[T any](ctx context.Context, log *slog.Logger, dep dependency, within time.Duration, open func(context.Context) (T, error)) (T, error) {
	var zero T
	lower := strings.ToLower(dep.name)
	deadline := time.Now().Add(within)
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(storeRetryFirst), backoff.WithMultiplier(2),
		backoff.WithMaxInterval(storeRetryMax), backoff.WithMaxElapsedTime(0))
	var warned time.Time
	for attempt := 1; ; attempt++ {
		end := deadline
		if t := time.Now().Add(dep.attempt); dep.attempt > 0 && t.Before(end) {
			end = t
		}
		actx, cancel := context.WithDeadline(ctx, end)
		v, err := open(actx)
		cancel()
		if err == nil {
			if attempt > 1 {
				log.Info(lower+" reachable", dep.key, dep.addr, "attempts", attempt)
			}
			return v, nil
		}
		if ctx.Err() != nil {
			return zero, fmt.Errorf("stopped while waiting for %s at %s (%w): %w", dep.name, dep.addr, ctx.Err(), err)
		}
		if !dep.retryable(err) {
			return zero, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return zero, fmt.Errorf("%s at %s not reachable within %s (%d attempts): %w", lower, dep.addr, within, attempt, err)
		}
		wait := min(b.NextBackOff(), left)
		if warned.IsZero() || time.Since(warned) >= storeWarnEvery {
			warned = time.Now()
			log.Warn(lower+" not reachable yet, retrying", dep.key, dep.addr, "attempts", attempt,
				"next_in", wait.Round(time.Millisecond), "gives_up_in", left.Round(time.Second), "err", err)
		}
		select {
		case <-ctx.Done():
			return zero, fmt.Errorf("stopped while waiting for %s at %s (%w): %w", dep.name, dep.addr, ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// How Start waits for NATS: as for ClickHouse, up to busWait in all, each
// attempt at most busAttempt, with capped exponential backoff between them
// and a warning at most every storeWarnEvery.
const (
	busWait    = 60 * time.Second
	busAttempt = 2 * time.Second
)

// openBus connects to NATS, waiting for a server that is not reachable yet
// (still starting under compose or Kubernetes) as openStore waits for
// ClickHouse. It failed after 5 s with "nats: stream TRACE_SYNTHESIS:
// context deadline exceeded", which named neither the server nor the cause.
func openBus(ctx context.Context, cfg bus.Config, log *slog.Logger) (*bus.Bus, error) {
	return openBusWithin(ctx, cfg, log, busWait)
}

// openBusWithin is openBus waiting for at most within in all. Only a
// server not reachable is waited for (bus.ErrNotConnected); other errors
// (JetStream disabled, a stream refused) are returned at once.
func openBusWithin(ctx context.Context, cfg bus.Config, log *slog.Logger, within time.Duration) (*bus.Bus, error) {
	dep := dependency{name: "NATS", key: "url", addr: bus.RedactURLs(cfg.URL), attempt: busAttempt,
		retryable: func(err error) bool { return errors.Is(err, bus.ErrNotConnected) }}
	return waitFor(ctx, log, dep, within, func(ctx context.Context) (*bus.Bus, error) { return bus.ConnectLogged(ctx, cfg, "trace", log) })
}

// loadDictionaries stores the built-in default dictionary (unless
// analyzer.default_dictionary is false) and every
// configured file (as new versions when their content changed), announces
// them, and loads every stored version into the registry.
func (a *App) loadDictionaries(ctx context.Context) error {
	var ds []*analyzer.Dictionary
	if a.Cfg.Analyzer.DefaultDictionary {
		var err error
		if ds, err = analyzer.BuiltinDictionaries(); err != nil {
			return err
		}
	}
	for _, f := range a.Cfg.Dictionary {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("dictionaries: %w", err)
		}
		more, err := analyzer.ParseDictionaries(f, data)
		if err != nil {
			return err
		}
		ds = append(ds, more...)
	}
	if err := a.Dicts.Load(ctx, a.Store); err != nil {
		return err
	}
	for _, d := range ds {
		if _, err := a.Dicts.Apply(ctx, a.Store, announcer(a.Bus), d); err != nil {
			return err
		}
	}
	return nil
}

// Ready is closed when every role has started.
func (a *App) Ready() <-chan struct{} { return a.readyCh }

// Run runs the configured roles until ctx ends or one role fails. It returns
// nil after a clean shutdown: every actor interrupted at once, each returned.
func (a *App) Run(ctx context.Context, extra ...Actor) error {
	var g run.Group
	im := stream.NewMetrics(a.Registry)
	am := analyzer.NewMetrics(a.Registry)
	a.Evaluator = analyzer.NewEvaluator(a.Cfg.Analyzer.EvalConfig, a.Store, BusPublisher{Bus: a.Bus}, a.Dicts, a.Log, am)

	if a.Cfg.Has("ingest") {
		c, err := stream.NewConsumer(a.consumerConfig(a.Cfg.Kafka.IngestGroup, a.Cfg.Kafka.RolloutsTopic, "ingest"),
			ingest.DecodeRolloutRow(a.Cfg.Kafka.MaxBytes), &ingest.RowSink{Store: a.Store}, a.Log, im)
		if err != nil {
			return err
		}
		a.addConsumer(c)
		addActor(&g, ctx, "ingest", c.Run)
	}
	if a.Cfg.Has("analyze") {
		if err := a.Evaluator.Recover(ctx); err != nil {
			return err
		}
		lab, err := a.labeler()
		if err != nil {
			return err
		}
		if lab != nil {
			ls := &analyzer.LabelingSink{Labeler: lab, Registry: a.Dicts, Store: a.Store, Evaluator: a.Evaluator,
				Concurrency: a.Cfg.Analyzer.Concurrency, Log: a.Log, Metrics: am}
			if dr, err := a.discoveryRunner(); err != nil {
				return err
			} else if dr != nil {
				ls.OnMissingDictionary = dr.Request
				addActor(&g, ctx, "discovery", dr.Run)
			}
			cc := a.consumerConfig(a.Cfg.Kafka.AnalyzeGroup, a.Cfg.Kafka.RolloutsTopic, "analyze")
			cc.SkipInvalid = !a.Cfg.Kafka.AnalyzeDeadLetters
			if a.Cfg.Analyzer.Labeler == "llm" {
				cc.BatchRows = min(cc.BatchRows, llmBatchRows(a.Cfg.Analyzer.Concurrency))
			}
			c, err := stream.NewConsumer(cc, ingest.DecodeRollout(a.Cfg.Kafka.MaxBytes), ls, a.Log, im)
			if err != nil {
				return err
			}
			a.addConsumer(c)
			addActor(&g, ctx, "analyze", c.Run)
		}
		lc := a.consumerConfig(a.Cfg.Kafka.LabelsGroup, a.Cfg.Kafka.LabelsTopic, "labels")
		lc.DLQTopic = a.Cfg.Kafka.LabelsTopic + ".dlq"
		c, err := stream.NewConsumer(lc, ingest.DecodeLabel, &analyzer.LabelEventSink{Store: a.Store, Evaluator: a.Evaluator, Metrics: am}, a.Log, im)
		if err != nil {
			return err
		}
		a.addConsumer(c)
		addActor(&g, ctx, "labels", c.Run)
		addActor(&g, ctx, "evaluate", a.Evaluator.Run)
		addActor(&g, ctx, "rollup", a.runRollup)
		addActor(&g, ctx, "dictionaries", func(ctx context.Context) error {
			return a.Bus.WatchDictionaries(ctx, func(string) {
				if err := a.Dicts.Load(ctx, a.Store); err != nil {
					a.Log.Warn("analyzer: reload dictionaries", "err", err)
				}
			})
		})
	}
	if a.ch != nil {
		a.superviseClickHouse(ctx, &g)
	}
	if a.Cfg.Has("synthesize") {
		if err := a.addSynthesize(ctx, &g); err != nil {
			return err
		}
		if !a.Cfg.Has("analyze") { // the analyze role's watcher serves both
			addActor(&g, ctx, "dictionaries", func(ctx context.Context) error {
				return a.Bus.WatchDictionaries(ctx, func(string) {
					if err := a.Dicts.Load(ctx, a.Store); err != nil {
						a.Log.Warn("synthesizer: reload dictionaries", "err", err)
					}
				})
			})
		}
	}
	if a.Cfg.Has("adapt") {
		if err := a.addAdapt(ctx, &g); err != nil {
			return err
		}
	}
	if a.Cfg.Has("route") {
		if err := a.addRoute(ctx, &g); err != nil {
			return err
		}
	}
	if err := a.addHTTP(&g); err != nil {
		return err
	}
	for _, x := range extra {
		addActor(&g, ctx, x.Name, x.Run)
	}
	// The background actors (the LLM audit writer) serve the others, which
	// still use them while they drain (the LLM calls of the batch in
	// flight): they stop, with their last flush, once every other actor has
	// returned. One that fails stops the group.
	bgCtx, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	var bg sync.WaitGroup
	bgFailed := make(chan error, len(a.background))
	for _, x := range a.background {
		bg.Go(func() {
			if err := x.Run(bgCtx); err != nil && !errors.Is(err, context.Canceled) {
				bgFailed <- fmt.Errorf("%s: %w", x.Name, err)
			}
		})
	}
	// The group ends when ctx ends (SIGTERM) or any actor returns.
	stop := make(chan struct{})
	g.Add(func() error {
		select {
		case <-ctx.Done():
		case <-stop:
		case err := <-bgFailed:
			return err
		}
		return nil
	}, func(error) { close(stop) })
	a.ready.Do(func() { close(a.readyCh) })
	err := g.Run()
	stopBG()
	bg.Wait()
	return err
}

// consumerState is what /readyz asks a Kafka consumer: its stage and why it
// makes no progress (stream.Consumer.Problem).
type consumerState interface {
	Config() stream.Config
	Problem() error
}

func (a *App) addConsumer(c consumerState) {
	a.consumersMu.Lock()
	defer a.consumersMu.Unlock()
	a.consumers = append(a.consumers, c)
}

// Actor is an extra role (the demo adds its simulator and watcher).
type Actor struct {
	Name string
	Run  func(ctx context.Context) error
}

func addActor(g *run.Group, parent context.Context, name string, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	g.Add(func() error {
		if err := fn(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}, func(error) { cancel() })
}

// superviseClickHouse restarts the embedded ClickHouse server when its
// process dies (chserver.Supervise: logged with the exit status, capped
// backoff); meanwhile the consumers back off and /readyz fails. Counted in
// trace_embedded_clickhouse_exits_total and _restarts_total.
func (a *App) superviseClickHouse(ctx context.Context, g *run.Group) {
	exits := prometheus.NewCounter(prometheus.CounterOpts{Name: "trace_embedded_clickhouse_exits_total",
		Help: "Unexpected exits of the embedded ClickHouse server (crash, kill -9, OOM killer)."})
	restarts := prometheus.NewCounter(prometheus.CounterOpts{Name: "trace_embedded_clickhouse_restarts_total",
		Help: "Restarts of the embedded ClickHouse server after an unexpected exit."})
	for _, c := range []*prometheus.Counter{&exits, &restarts} {
		if err := a.Registry.Register(*c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				*c = are.ExistingCollector.(prometheus.Counter) // Run called again
			}
		}
	}
	addActor(g, ctx, "clickhouse-supervisor", func(ctx context.Context) error {
		return a.ch.Supervise(ctx, chserver.SuperviseOptions{
			OnExit: func(error) { exits.Inc() }, OnRestart: restarts.Inc})
	})
}

// addHTTP listens on http.addr and adds the HTTP server (health, metrics,
// and with the serve role the dashboard and API) to g.
func (a *App) addHTTP(g *run.Group) error {
	if a.Cfg.Has("serve") {
		es, err := a.newEnvServer()
		if err != nil {
			return err
		}
		a.envSrv = es
	}
	srv := a.httpServer()
	ln, err := net.Listen("tcp", a.Cfg.HTTP.Addr)
	if err != nil {
		return fmt.Errorf("http.addr %s: %w", a.Cfg.HTTP.Addr, err)
	}
	a.httpAddr = ln.Addr().String()
	if httpauth.Exposed(ln.Addr(), a.Cfg.HTTP.BearerToken) {
		a.Log.Warn("http.addr listens beyond this machine without a token: anyone who can reach it reads the dashboard, the API and the metrics"+
			" and, with the serve role, plays the environments; set http.bearer_token", "addr", a.httpAddr)
	}
	g.Add(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http %s: %w", a.httpAddr, err)
		}
		return nil
	}, func(error) {
		// Both listeners first (env.addr's too: no session starts while
		// the sessions end), at once; then the environment server, on a
		// budget of its own for its sessions (the episodes still queued
		// get the recorder's drain budget on top of it).
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		wg.Go(func() { _ = srv.Shutdown(sctx) })
		if a.envHTTP != nil {
			wg.Go(func() { _ = a.envHTTP.Shutdown(sctx) })
		}
		wg.Wait()
		if a.envSrv != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := a.envSrv.Close(cctx); err != nil {
				a.Log.Warn("env server: shutdown", "err", err)
			}
		}
	})
	if a.envSrv != nil && a.Cfg.Env.Addr != "" {
		if err := a.addEnvHTTP(g); err != nil {
			return err
		}
	}
	if a.Cfg.Has("serve") {
		a.Log.Info("serving dashboard, API and metrics", "url", "http://"+a.httpAddr+"/", "metrics", "http://"+a.httpAddr+"/metrics")
	} else {
		a.Log.Info("serving metrics and health checks", "metrics", "http://"+a.httpAddr+"/metrics", "ready", "http://"+a.httpAddr+"/readyz")
	}
	return nil
}

// addEnvHTTP serves the environment server on its dedicated env.addr.
func (a *App) addEnvHTTP(g *run.Group) error {
	ln, err := net.Listen("tcp", a.Cfg.Env.Addr)
	if err != nil {
		return fmt.Errorf("env.addr %s: %w", a.Cfg.Env.Addr, err)
	}
	a.envAddr = ln.Addr().String()
	if httpauth.Exposed(ln.Addr(), cmp.Or(a.Cfg.Env.BearerToken, a.Cfg.HTTP.BearerToken)) {
		a.Log.Warn("env.addr listens beyond this machine without a token: anyone who can reach it plays the environments; set env.bearer_token (or http.bearer_token)", "addr", a.envAddr)
	}
	srv := &http.Server{Handler: a.envSrv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	a.envHTTP = srv
	g.Add(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("env %s: %w", a.envAddr, err)
		}
		return nil
	}, func(error) {
		// addHTTP's interrupt, which runs first, shut it down before
		// closing the environment server; this one is for a Serve that
		// fails first.
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	a.Log.Info("serving environments (OpenEnv)", "url", "http://"+a.envAddr+"/v1/environments")
	return nil
}

// consumerConfig is the consumer configuration of a stage. kafka.batch_* size
// the ingest stage's batches, which stream into ClickHouse and cost no memory;
// the other stages hold their batches in memory, so their batches are capped
// at stream.DefaultBatchRows and stream.DefaultBatchBytes. The fetch size
// covers the largest message the topics hold, and dead letters keep up to
// kafka.max_message_bytes of their value (config.Kafka.TopicMaxBytes).
func (a *App) consumerConfig(group, topic, stage string) stream.Config {
	k := a.Cfg.Kafka
	rows, bytes := k.BatchRows, k.BatchBytes
	if stage != "ingest" {
		rows, bytes = min(rows, stream.DefaultBatchRows), min(bytes, stream.DefaultBatchBytes)
	}
	return stream.Config{Brokers: a.Brokers, Topic: topic, GroupID: group, DLQTopic: k.DLQTopic, Stage: stage,
		BatchRows: rows, BatchBytes: bytes, BatchTimeout: k.BatchTimeout,
		MaxMessageBytes: k.TopicMaxBytes(), DLQMaxValueBytes: k.MaxBytes, Dialer: a.Dialer,
		SessionTimeout: k.SessionTimeout, RebalanceTimeout: k.RebalanceTimeout}
}

func (a *App) labeler() (analyzer.Labeler, error) {
	switch a.Cfg.Analyzer.Labeler {
	case "rules":
		return analyzer.NewRulesLabeler(analyzer.RulesOptions{}), nil
	case "llm":
		return newLLMLabeler(a)
	default:
		return nil, nil
	}
}

// Close stops everything Start started, in reverse order.
func (a *App) Close() {
	if a.stopGC != nil {
		a.stopGC()
	}
	if a.Bus != nil {
		a.Bus.Close()
	}
	if a.nats != nil {
		a.nats.Shutdown()
		a.nats.WaitForShutdown()
	}
	if a.Store != nil {
		a.Store.Close()
	}
	if a.ch != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := a.ch.Stop(ctx); err != nil {
			a.Log.Warn("embedded clickhouse: stop", "err", err)
		}
	}
	if a.kfake != nil {
		a.kfake.Close()
	}
	if err := a.lock.Release(); err != nil {
		a.Log.Warn("data directory: release its lock", "dir", a.Cfg.DataDir, "err", err)
	}
}

// addAdapt adds the adapt role (TRACE step 3): the durable consumer of
// trace.environments.ready (plan → dispatch), the consumer of the
// trainers' events (status, history, registry), the deadline check,
// with adapter.auto_activate the consumer of activation requests, and
// with adapter.serving the serving reconciliation.
func (a *App) addAdapt(ctx context.Context, g *run.Group) error {
	log := a.Log.With("role", "adapt")
	tb, err := TrainingBackend(a.Cfg, a.Bus, log)
	if err != nil {
		return err
	}
	backend, command, webhook := tb.Backend, tb.Command, tb.Webhook
	pc := a.Cfg.Adapter.Plan
	pc.EnvServerURL = a.Cfg.EnvServerURL()
	pc.CallbackURL = tb.CallbackURL
	var rec llm.Recorder
	if a.Cfg.Adapter.Planner.Enabled {
		rec = a.auditRecorder()
	}
	planner, err := Planner(a.Cfg, a.Store, rec, log)
	if err != nil {
		return err
	}
	reg, err := AdapterRegistry(a.Cfg, a.Store, log)
	if err != nil {
		return err
	}
	st, err := adapter.NewStage(adapter.Config{Plan: pc, Store: a.Store, Claims: a.Bus, Backend: backend, Planner: planner,
		Registry: reg, AutoActivate: a.Cfg.Adapter.AutoActivate, Queue: a.Bus, Simulated: a.Cfg.Adapter.Simulated, Log: log})
	if err != nil {
		return err
	}
	// The command and webhook backends report what they learn (a command's
	// exit, an HTTP rejection) to the stage; a command's events (on its
	// stdout) are relayed to the job's events subject, applied in order by
	// the events consumer.
	if command != nil {
		command.Reporter, command.Relay = st, a.Bus
		// Stopping interrupts the running commands (SIGTERM to their
		// process groups, SIGKILL after kill_grace) and records them FAILED.
		addActor(g, ctx, "adapt-command", command.Run)
	}
	if webhook != nil {
		webhook.Reporter = st
	}
	rc, err := a.Bus.ReadyConsumer(ctx, 0)
	if err != nil {
		return err
	}
	ec, err := a.Bus.TrainingEventsConsumer(ctx, 0)
	if err != nil {
		return err
	}
	a.Adapt = st
	addActor(g, ctx, "adapt", func(ctx context.Context) error { return st.RunReady(ctx, rc) })
	addActor(g, ctx, "adapt-events", func(ctx context.Context) error { return st.RunEvents(ctx, ec) })
	if a.Cfg.Adapter.AutoActivate {
		// Activations (loads into the serving engine) are their own work,
		// off the ordered events consumer.
		ac, err := a.Bus.ActivationsConsumer(ctx, 0)
		if err != nil {
			return err
		}
		addActor(g, ctx, "adapt-activations", func(ctx context.Context) error { return st.RunActivations(ctx, ac) })
	}
	every := a.Cfg.Adapter.DeadlineCheck
	addActor(g, ctx, "adapt-deadlines", func(ctx context.Context) error { return st.RunDeadlines(ctx, every) })
	a.addGuard(ctx, g, reg)
	// The serving engine forgets its runtime-loaded adapters when it
	// restarts: every reconcile_every the active ones it does not serve
	// are loaded again (and the retired ones it still serves unloaded),
	// on the same Registry, so its transitions stay serialised.
	reconcile := a.Cfg.Adapter.Serving.ReconcileEvery
	if reg.Engine == nil {
		reconcile = 0
	}
	if reconcile > 0 {
		sr := &adapter.Reconciler{Registry: reg, Metrics: adapter.NewReconcileMetrics(a.Registry), Log: log.With("component", "serving-reconcile")}
		addActor(g, ctx, "adapt-serving-reconcile", func(ctx context.Context) error { return sr.Run(ctx, reconcile) })
	}
	a.Log.Info("adapt role: training jobs from ready environments", "backend", a.Cfg.Adapter.Backend, "preset", a.Cfg.Adapter.Plan.Preset,
		"env_server", pc.EnvServerURL, "planner", planner != nil, "serving", a.Cfg.Adapter.Serving.Enabled, "reconcile_every", reconcile,
		"auto_activate", a.Cfg.Adapter.AutoActivate)
	return nil
}

// rollupInterval is how often the analyze role brings the hourly rollup up
// to date (sink.Store.Rollup; reads are exact whatever its progress, only
// slower while hours wait).
const rollupInterval = 30 * time.Second

// rollupLogKeep is how much of rollup_log, before the watermark, the
// hourly prune keeps (sink.Store.PruneRollupLog): far more than a
// reader's cached watermark lags.
const rollupLogKeep = time.Hour

// runRollup rolls up the closed hours every rollupInterval until ctx ends,
// and once an hour prunes the changes no read needs from rollup_log.
func (a *App) runRollup(ctx context.Context) error {
	t := time.NewTicker(rollupInterval)
	defer t.Stop()
	var pruned time.Time
	for {
		st, err := a.Store.RollupAll(ctx, time.Now())
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			a.Log.Warn("rollup of closed hours", "err", err)
		case st.Hours > 0:
			a.Log.Debug("rollup of closed hours", "hours", st.Hours, "statements", st.Statements)
		}
		if err == nil && time.Since(pruned) >= time.Hour {
			if _, err := a.Store.PruneRollupLog(ctx, rollupLogKeep); err != nil && ctx.Err() == nil {
				a.Log.Warn("rollup log prune", "err", err)
			} else {
				pruned = time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
