package envserver_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/gcpace"
	"github.com/traceops/trace/synthesizer/envclient"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/envserver"
	"github.com/traceops/trace/synthesizer/examples"
	"github.com/traceops/trace/synthesizer/openenv"
)

func TestMain(m *testing.M) {
	envprog.RunWorkerIfRequested()
	if addr := os.Getenv("TRACE_BENCH_SERVE"); addr != "" {
		os.Exit(serveForBench(addr, os.Getenv("TRACE_BENCH_SANDBOXED") == "1"))
	}
	testenv.Main(m)
	os.Exit(0)
}

// serveForBench serves the example environment on addr until killed: the
// benchmark runs trace's server as a process of its own, as it runs
// openenv-core's, so that both get the machine on the same terms.
func serveForBench(addr string, sandboxed bool) int {
	// The collector target of `trace run --roles serve` (env.gogc, 400,
	// unless GOGC is in the environment, as for the benchmark's Go's-GOGC
	// row).
	cfg := envserver.DefaultConfig()
	p, _ := (config.Config{Roles: []string{"serve"}, Env: cfg}).GCPolicy(os.Getenv("GOGC"))
	gcpace.Start(p) // the process ends when the benchmark kills it
	var env envprog.Env
	if dir := os.Getenv("TRACE_BENCH_PROFILE_DIR"); dir != "" {
		// CPU profiles of the server process (server-inproc.prof,
		// server-sandboxed.prof, and -gogc100 before .prof for the
		// servers at Go's GOGC), written when the benchmark ends it
		// (SIGTERM), and of the sandbox worker (worker.prof, written when
		// its parent goes).
		name, suffix := "server-inproc", ".prof"
		if g := os.Getenv("GOGC"); g != "" { // the benchmark's Go's-GOGC servers
			suffix = "-gogc" + g + suffix
		}
		if sandboxed {
			name = "server-sandboxed"
			os.Setenv("TRACE_ENVPROG_WORKER_CPUPROFILE", filepath.Join(dir, "worker"+suffix))
		}
		name += suffix
		if f, err := os.Create(filepath.Join(dir, name)); err == nil && pprof.StartCPUProfile(f) == nil {
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGTERM)
			go func() {
				<-sig
				pprof.StopCPUProfile()
				f.Close()
				if env != nil {
					env.Close() // the worker writes its profile as it exits
				}
				os.Exit(0)
			}()
		}
	}
	load := envprog.Load
	if sandboxed {
		load = envprog.LoadSandboxed
	}
	var err error
	env, err = load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cat := envserver.NewStaticCatalog()
	cat.Add(exampleID, env, envserver.Entry{})
	cfg.MaxSessions = 128
	srv, err := envserver.New(cfg, envserver.Options{Catalog: cat})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintln(os.Stderr, http.ListenAndServe(addr, srv.Handler()))
	return 1
}

const exampleID = "precondition_airline"

func loadExample(t testing.TB) envprog.Env {
	t.Helper()
	env, err := envprog.Load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		t.Fatalf("load the example environment: %v", err)
	}
	return env
}

type fixture struct {
	srv  *envserver.Server
	http *httptest.Server
	reg  *prometheus.Registry
	base string // the example environment's base URL
}

// start serves the example environment (plus extra programs) on 127.0.0.1.
func start(t testing.TB, cfg envserver.Config, w envserver.EpisodeWriter, extra map[string]envprog.Env) *fixture {
	t.Helper()
	cat := envserver.NewStaticCatalog()
	if err := cat.Add(exampleID, loadExample(t), envserver.Entry{}); err != nil {
		t.Fatal(err)
	}
	for id, env := range extra {
		if err := cat.Add(id, env, envserver.Entry{}); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	srv, err := envserver.New(cfg, envserver.Options{Catalog: cat, Writer: w, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("server close: %v", err)
		}
	})
	return &fixture{srv: srv, http: hs, reg: reg, base: hs.URL + "/v1/environments/" + exampleID}
}

func (f *fixture) client(token string) *envclient.Client { return envclient.New(f.base, token) }

// local plays the example's reference solution for seed in-process and
// returns the actions, the tool results of each and the reward: what the
// server must reproduce through the protocol.
type localPlay struct {
	actions []openenv.ChatMessage
	results [][]envprog.Message
	reward  envprog.Reward
	start   envprog.Start
}

func playLocal(t testing.TB, seed int64) localPlay {
	t.Helper()
	ctx := context.Background()
	env := loadExample(t)
	defer env.Close()
	ep, err := env.Reset(ctx, seed)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	ref, err := ep.Reference(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lp := localPlay{start: ep.Start()}
	for i, a := range ref {
		for j := range a.ToolCalls {
			a.ToolCalls[j].ID = callID(i, j)
		}
		res, err := ep.Step(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		lp.actions = append(lp.actions, chat(a))
		lp.results = append(lp.results, res.ToolResults)
		if res.Done {
			break
		}
	}
	if lp.reward, err = ep.Reward(ctx); err != nil {
		t.Fatal(err)
	}
	return lp
}

func callID(turn, i int) string { return "call_" + string(rune('a'+turn)) + string(rune('0'+i)) }

func chat(a envprog.Action) openenv.ChatMessage {
	m := openenv.ChatMessage{Role: "assistant", Content: a.Content}
	for _, c := range a.ToolCalls {
		m.ToolCalls = append(m.ToolCalls, openenv.ChatToolCall{ID: c.ID, Type: "function",
			Function: openenv.ChatFunction{Name: c.Name, Arguments: string(c.Arguments)}})
	}
	return m
}

func testConfig() envserver.Config {
	c := envserver.DefaultConfig()
	c.RecordFlush = 50 * time.Millisecond
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// counter sums the samples of metric whose labels include want.
func counter(t testing.TB, f *fixture, metric string, want map[string]string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}
