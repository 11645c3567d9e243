package router_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/gcpace"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/router"
	"github.com/traceops/trace/sink"
)

// staticAdapters is a fixed registry for the benchmark (no ClickHouse on
// the measured path: decisions are cached).
type staticAdapters []router.Candidate

func (s staticAdapters) ActiveAdapters(context.Context, string, string) ([]router.Candidate, error) {
	return s, nil
}

// discard is a DecisionWriter that drops rows: the benchmark measures what
// recording costs a request (Recorder.Record), not ClickHouse.
// It keeps each row's overhead_us: the proxy's own time from the request's
// arrival to forwarding it.
type discard struct {
	mu       sync.Mutex
	overhead []time.Duration
}

func (d *discard) InsertRouteDecisions(_ context.Context, rows []sink.RouteDecisionRow) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range rows {
		d.overhead = append(d.overhead, time.Duration(r.OverheadUS)*time.Microsecond)
	}
	return nil
}

func (d *discard) take() []time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	o := d.overhead
	d.overhead = nil
	return o
}

const benchAnswer = `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`

// serve runs h on a loopback listener with a plain http.Server, as `trace
// route` serves the proxy (httptest.Server would add a mutex of its own
// to every request's state changes), and counts the connections accepted.
func serve(b *testing.B, h http.Handler) (url string, conns *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	conns = new(atomic.Int64)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			panic(err)
		}
	}()
	b.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String(), conns
}

func pct(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func mean(xs []time.Duration) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	var t time.Duration
	for _, x := range xs {
		t += x
	}
	return t / time.Duration(len(xs))
}

// cpuTime is the process's user + system CPU time so far (load generator,
// proxy and upstream all run in this process).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runqWait is the time this process's threads have spent ready to run
// but waiting for a CPU (Linux schedstat, summed over the threads; 0
// where unavailable): on a shared machine, the wait behind other
// processes.
func runqWait() time.Duration {
	dirs, _ := os.ReadDir("/proc/self/task")
	var t time.Duration
	for _, d := range dirs {
		raw, err := os.ReadFile("/proc/self/task/" + d.Name() + "/schedstat")
		if err != nil {
			continue
		}
		var run, wait int64
		if _, err := fmt.Sscan(string(raw), &run, &wait); err == nil {
			t += time.Duration(wait)
		}
	}
	return t
}

// load1 is the machine's one-minute load average (0 when unknown).
func load1() float64 {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	_, _ = fmt.Sscan(string(raw), &l)
	return l
}

// BenchmarkProxyOverhead measures the routing proxy's latency beyond the
// upstream's own, against a local upstream that answers at once, with the
// conversation's decision cached (the steady state: one classification per
// conversation). Load generator, proxy and upstream share this process and
// the machine's cores. The proxy is served as `trace route` serves it
// (net/http, its own transport to the upstream); the load generator and
// the upstream speak HTTP/1.1 on raw connections with buffers made once
// (rawhttp_test.go), so that next to all of the process's garbage is the
// proxy's and the collector runs as often as it would in a proxy process
// of its own. (Separate processes were measured too: on these 2-core
// VMs waking another process's threads cost the proxy 290–340 µs of CPU
// per request at low load against ~120 µs in one process, and its added
// p99 grew, so the one process is kept.) Two ways of loading it:
//
// Closed loop (clients=1, clients=64, sse-ttfb/clients=1): every client
// makes one request straight to the upstream and one through the proxy,
// alternately, as fast as it can, so both columns come from the same run
// under the same load. With 64 clients this saturates the CPU, and the
// latency is then mostly waiting for a core (Little's law: the proxied
// request, a second loopback HTTP exchange, waits in the same queue).
//
// Open loop (open=F/clients=64, open=F/sse-ttfb/clients=64), wrk2-style:
// the direct path's closed-loop throughput with 64 clients is measured
// first in the same run (capacity, req/s); then 64 clients send requests on
// a fixed schedule at F × capacity in total, alternating direct and
// proxied (half the rate each, interleaved in time), and each latency is
// counted from the request's scheduled send time, not from when it was
// sent, so a client that falls behind does not hide the delay
// (coordinated omission). Reported: offered and achieved rates, the
// process's CPU use (% of all cores), in-flight requests (Little's law),
// how late sends started (late-p99), the CPU time a proxied request costs
// beyond a direct one (proxy-cpu-µs/req, from the process's CPU time in
// the two capacity runs: 2 × mix − 2 × direct per request, since half the
// mix is direct), and how long, per request, the
// process's threads were ready to run but waited for a CPU (runq-µs/req,
// Linux schedstat: the machine's other work shows here).
//
// Every row: direct/proxy p50 and p99 in µs and the added latency
// (proxy − direct at the same quantile, both from the same run), and the
// proxy's own time before forwarding (own-p50/p99: parsing, the cached
// decision, the rewrite, as recorded in route_decisions.overhead_us; µs
// resolution). sse-ttfb rows time the first byte of a streamed answer;
// the others the whole response. new-conns counts TCP connections the
// proxy and the upstream accepted during the measurement (0: every request
// reused a kept-alive connection). noise-p99 is how far the p99 of two
// interleaved halves of the direct requests lie apart: a p99 difference
// of that size is chance (the machine's other work, above all).
// B/proxied and allocs/proxied are the process's heap allocations per
// proxied request, gc-cycles the collector's cycles during the
// measurement, heap-goal-MB the heap size the collector let the process
// reach: the proxy's tail at 64 clients follows the cycles. The process
// paces its collector as a route-only `trace route` does (router.gogc
// 100 with router.gc_headroom_mb 128, internal/gcpace; GOGC in the
// environment wins, GOGC=off is a diagnostic of the tail without the
// collector); the go-default-gc and gogc-400 rows repeat the open loop at
// a quarter of capacity with Go's own 100 and with the ratio 400 alone.
// TRACE_BENCH_TRANSPORT=caller, another diagnostic, has the proxy reach
// the upstream through callerTransport instead of its own transport.
//
//	go test -run '^$' -bench ProxyOverhead -benchtime 4000x ./router/
func BenchmarkProxyOverhead(b *testing.B) {
	// The collector pacing of a route-only `trace route` process
	// (router.gogc and router.gc_headroom_mb, unless GOGC is in the
	// environment); the go-default-gc and gogc-400 rows set Go's 100 and
	// the ratio 400 alone (the route role's default before the headroom)
	// for comparison.
	routeGC, _ := config.Config{Roles: []string{"route"}, Router: config.DefaultRouter()}.GCPolicy(os.Getenv("GOGC"))
	prevGC := debug.SetGCPercent(-1)
	debug.SetGCPercent(prevGC)
	stopPacing := func() {}
	pace := func(p gcpace.Policy) {
		stopPacing()
		debug.SetGCPercent(prevGC)
		stopPacing = gcpace.Start(p)
	}
	pace(routeGC)
	b.Cleanup(func() { stopPacing(); debug.SetGCPercent(prevGC) })
	upURL, upConns := instantUpstream(b)
	cls := llmtest.New(b)
	cls.Handle(func(llmtest.Request) llmtest.Reply {
		return llmtest.Classification(map[string]float64{"A": 0.9, "B": 0.1})
	})
	client, err := llm.New(llm.Config{BaseURL: cls.URL, Model: "base"})
	if err != nil {
		b.Fatal(err)
	}
	r, err := router.New(router.Config{BaseModel: "base"}, client, staticAdapters{{Adapter: "lora-1", Capability: "c"}})
	if err != nil {
		b.Fatal(err)
	}
	w := &discard{}
	rec := &router.Recorder{W: w}
	ctx, cancel := context.WithCancel(context.Background())
	go rec.Run(ctx)
	b.Cleanup(cancel)
	pcfg := router.ProxyConfig{UpstreamURL: upURL + "/v1", DefaultEnvironment: "bench"}
	switch tr := os.Getenv("TRACE_BENCH_TRANSPORT"); tr {
	case "": // the proxy's own
	case "caller": // a diagnostic, see callerTransport
		pcfg.Transport = &callerTransport{}
	default:
		b.Fatalf("TRACE_BENCH_TRANSPORT=%q: the choices are caller, or unset for the proxy's own transport", tr)
	}
	p, err := router.NewProxy(pcfg, r, rec)
	if err != nil {
		b.Fatal(err)
	}
	pxURL, pxConns := serve(b, p.Handler())
	// Each client has its own kept-alive connection to the upstream and
	// one to the proxy, as separate agents would (rawhttp_test.go).
	const maxClients = 64
	type clientConns struct{ direct, proxy *rawConn }
	clients := make([]clientConns, maxClients)
	for i := range clients {
		var err error
		if clients[i].direct, err = dialRaw(strings.TrimPrefix(upURL, "http://")); err != nil {
			b.Fatal(err)
		}
		if clients[i].proxy, err = dialRaw(strings.TrimPrefix(pxURL, "http://")); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { clients[i].direct.Close(); clients[i].proxy.Close() })
	}

	const conversations = 64
	// The request bodies, made once (the load generator's garbage is
	// collected on the proxy's time too).
	var bodies [2][conversations]string
	for c := range conversations {
		for i, stream := range []bool{false, true} {
			bodies[i][c] = fmt.Sprintf(`{"model":"m","stream":%v,"metadata":{"conversation_id":"conv-%d"},"messages":[{"role":"system","content":"You are an airline agent."},{"role":"user","content":"I need to change my flight to Boston tomorrow morning."}]}`, stream, c)
		}
	}
	body := func(conv int, stream bool) string {
		if stream {
			return bodies[1][conv]
		}
		return bodies[0][conv]
	}
	// do returns the time to the response's first body byte (ttfb) and to
	// its end, of one request from client g, straight to the upstream or
	// through the proxy.
	do := func(g int, proxied bool, payload string) (ttfb, total time.Duration) {
		rc := clients[g].direct
		if proxied {
			rc = clients[g].proxy
		}
		ttfb, total, err := rc.post("/v1/chat/completions", payload)
		if err != nil {
			b.Fatalf("proxied=%v: %v", proxied, err)
		}
		return ttfb, total
	}
	for c := range conversations { // warm the decision cache: the measured requests are cached decisions
		do(0, true, body(c, false))
	}
	classified := len(cls.Requests())
	if classified != conversations {
		b.Fatalf("%d classifications for %d conversations", classified, conversations)
	}
	// Warm every connection pool to 64 kept-alive connections per hop.
	var warm sync.WaitGroup
	for g := range maxClients {
		warm.Add(1)
		go func() {
			defer warm.Done()
			for range 20 {
				do(g, false, body(g, false))
				do(g, true, body(g, false))
			}
		}()
	}
	warm.Wait()

	type result struct {
		direct, proxied []time.Duration
		halves          [2][]time.Duration // the direct requests, every other one of each client
	}
	keep := func(res *result, d, pr []time.Duration) {
		res.direct, res.proxied = append(res.direct, d...), append(res.proxied, pr...)
		for i, x := range d {
			res.halves[i%2] = append(res.halves[i%2], x)
		}
	}
	// count reads the connection and collector counters (between
	// measurements: ReadMemStats stops the world).
	type counters struct {
		conns          int64
		gc             uint32
		bytes, mallocs uint64
		heapGoal       uint64
	}
	count := func() counters {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return counters{upConns.Load() + pxConns.Load(), ms.NumGC, ms.TotalAlloc, ms.Mallocs, ms.NextGC}
	}
	// report prints one row; c0 are the counters before the measurement.
	report := func(b *testing.B, res result, c0 counters) {
		c1 := count()
		own := w.take()
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		b.ReportMetric(us(pct(res.direct, 0.5)), "direct-p50-µs")
		b.ReportMetric(us(pct(res.direct, 0.99)), "direct-p99-µs")
		b.ReportMetric(us(pct(res.proxied, 0.5)), "proxy-p50-µs")
		b.ReportMetric(us(pct(res.proxied, 0.99)), "proxy-p99-µs")
		b.ReportMetric(us(pct(res.proxied, 0.5)-pct(res.direct, 0.5)), "added-p50-µs")
		b.ReportMetric(us(pct(res.proxied, 0.99)-pct(res.direct, 0.99)), "added-p99-µs")
		// noise-p99: how far the p99 of two interleaved halves of the
		// direct requests lie apart, i.e. how much a p99 column moves by
		// chance in this run (with half the samples).
		b.ReportMetric(us((pct(res.halves[0], 0.99) - pct(res.halves[1], 0.99)).Abs()), "noise-p99-µs")
		b.ReportMetric(us(pct(own, 0.5)), "own-p50-µs")
		b.ReportMetric(us(pct(own, 0.99)), "own-p99-µs")
		b.ReportMetric(float64(c1.conns-c0.conns), "new-conns")
		// The process's garbage per proxied request (the load generator
		// and the upstream make next to none, so it is the proxy's) and
		// the collector's cycles during the measurement.
		n := float64(max(1, len(res.proxied)))
		b.ReportMetric(float64(c1.bytes-c0.bytes)/n, "B/proxied")
		b.ReportMetric(float64(c1.mallocs-c0.mallocs)/n, "allocs/proxied")
		b.ReportMetric(float64(c1.gc-c0.gc), "gc-cycles")
		b.ReportMetric(float64(c1.heapGoal)/(1<<20), "heap-goal-MB") // the collector target's memory price
		b.ReportMetric(0, "ns/op")
	}
	pick := func(stream bool, ttfb, total time.Duration) time.Duration {
		if stream {
			return ttfb
		}
		return total
	}

	// longBody is an agent's request late in a conversation (~25 KB): a
	// system prompt, 8 tool definitions and 120 turns with tool calls.
	longBody := func(conv int) string {
		var sb strings.Builder
		fmt.Fprintf(&sb, `{"model":"m","stream":false,"temperature":0.2,"metadata":{"conversation_id":"conv-%d"},"tools":[`, conv)
		for t := range 8 {
			if t > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"type":"function","function":{"name":"tool_%d","description":"Looks up a reservation by its id and returns the flights, passengers and payment methods on it.","parameters":{"type":"object","properties":{"reservation_id":{"type":"string","description":"six characters"},"user_id":{"type":"string"}},"required":["reservation_id"]}}}`, t)
		}
		sb.WriteString(`],"messages":[{"role":"system","content":"You are an airline customer service agent. Follow the policy: verify the user, never change a basic economy flight, ask before every booking action, and transfer to a human when the request is outside the policy."}`)
		for k := range 120 {
			switch k % 3 {
			case 0:
				fmt.Fprintf(&sb, `,{"role":"user","content":"Turn %d: I would like to change my reservation ABC%03d to the morning flight on the same day, and keep the same seat class and payment method please."}`, k, k)
			case 1:
				fmt.Fprintf(&sb, `,{"role":"assistant","content":null,"tool_calls":[{"id":"call_%d","type":"function","function":{"name":"tool_%d","arguments":"{\"reservation_id\":\"ABC%03d\",\"user_id\":\"mia_li_3668\"}"}}]}`, k, k%8, k)
			default:
				fmt.Fprintf(&sb, `,{"role":"tool","tool_call_id":"call_%d","content":"{\"reservation_id\":\"ABC%03d\",\"flights\":[{\"flight_number\":\"HAT%03d\",\"date\":\"2024-05-%02d\",\"price\":%d}],\"cabin\":\"economy\",\"payment\":\"credit_card_4421\"}"}`, k-1, k, k, 1+k%28, 100+k)
			}
		}
		sb.WriteString(`]}`)
		return sb.String()
	}
	if n := len(longBody(0)); n < 16<<10 {
		b.Fatalf("the long body is only %d bytes", n)
	}
	var longBodies [conversations]string
	for c := range longBodies {
		longBodies[c] = longBody(c)
	}

	closed := func(b *testing.B, clients int, stream bool, long bool) {
		rec.Flush(ctx)
		w.take()
		c0 := count()
		var mu sync.Mutex
		var res result
		var next atomic.Int64
		b.ResetTimer()
		runq0 := runqWait()
		var wg sync.WaitGroup
		for g := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var d, pr []time.Duration
				for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
					payload := body((g+int(i))%conversations, stream)
					if long {
						payload = longBodies[(g+int(i))%conversations]
					}
					dt, dtot := do(g, false, payload)
					pt, ptot := do(g, true, payload)
					d, pr = append(d, pick(stream, dt, dtot)), append(pr, pick(stream, pt, ptot))
				}
				mu.Lock()
				keep(&res, d, pr)
				mu.Unlock()
			}()
		}
		wg.Wait()
		b.StopTimer()
		b.ReportMetric(float64((runqWait()-runq0).Nanoseconds())/1e3/float64(2*b.N), "runq-µs/req")
		rec.Flush(ctx)
		report(b, res, c0)
	}

	// capacity is the closed-loop throughput (req/s) of n requests from
	// clients clients, each alternating direct and proxied requests when
	// mixed (the open loop's mix), else direct only: the rate at which
	// this machine saturates now.
	// It also returns the process's CPU time per request.
	capacity := func(clients, n int, stream, mixed bool) (rate float64, cpu time.Duration) {
		var next atomic.Int64
		var wg sync.WaitGroup
		start, cpu0 := time.Now(), cpuTime()
		for g := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := next.Add(1); i <= int64(n); i = next.Add(1) {
					do(g, mixed && i%2 == 0, body((g+int(i))%conversations, stream))
				}
			}()
		}
		wg.Wait()
		return float64(n) / time.Since(start).Seconds(), (cpuTime() - cpu0) / time.Duration(n)
	}

	open := func(b *testing.B, clients int, stream bool, fraction float64) {
		const calibration = 4000
		directCap, directCPU := capacity(clients, calibration, stream, false)
		mixCap, mixCPU := capacity(clients, calibration, stream, true)
		// The CPU a proxied request costs beyond a direct one: the
		// proxy's server side, handler and upstream client (a direct
		// request costs the load generator and the upstream only).
		proxyCPU := 2*mixCPU - 2*directCPU
		rate := fraction * mixCap // in total, half direct and half proxied
		period := time.Duration(float64(time.Second) / rate)
		slots := 2 * b.N // b.N requests on each path
		rec.Flush(ctx)
		w.take()
		c0 := count()
		var mu sync.Mutex
		var res result
		var late []time.Duration
		var done, behind atomic.Int64
		b.ResetTimer()
		cpu0, load0, runq0 := cpuTime(), load1(), runqWait()
		t0 := time.Now().Add(10 * time.Millisecond)
		var wg sync.WaitGroup
		for g := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var d, pr, lt []time.Duration
				prevEnd := t0
				// Client g sends slots g, g+clients, g+2·clients, …;
				// slot j is due at t0 + j·period, and goes direct or
				// through the proxy by turns.
				for k := 0; ; k++ {
					j := g + k*clients
					if j >= slots {
						break
					}
					due := t0.Add(time.Duration(j) * period)
					if wait := time.Until(due); wait > 0 {
						time.Sleep(wait)
					}
					sent := time.Now()
					lt = append(lt, sent.Sub(due))
					// A client still waiting for its previous answer when
					// this one was due counts from the due time (no
					// coordinated omission); an idle one, woken by its
					// timer, from the send (Go's timers wake up to ~1 ms
					// late: the poller sleeps in whole milliseconds).
					from := sent
					if prevEnd.After(due) {
						from = due
						behind.Add(1)
					}
					proxied := (k+g)%2 != 0
					ttfb, total := do(g, proxied, body((g+k)%conversations, stream))
					prevEnd = sent.Add(total)
					l := sent.Sub(from) + pick(stream, ttfb, total)
					if !proxied {
						d = append(d, l)
					} else {
						pr = append(pr, l)
					}
					done.Add(1)
				}
				mu.Lock()
				keep(&res, d, pr)
				late = append(late, lt...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		elapsed := time.Since(t0)
		cpu, runq := cpuTime()-cpu0, runqWait()-runq0
		b.StopTimer()
		rec.Flush(ctx)
		report(b, res, c0)
		achieved := float64(done.Load()) / elapsed.Seconds()
		all := append(slices.Clone(res.direct), res.proxied...)
		cpuPct := 100 * cpu.Seconds() / elapsed.Seconds() / float64(runtime.NumCPU())
		b.ReportMetric(mixCap, "capacity-req/s")
		b.ReportMetric(float64(proxyCPU.Nanoseconds())/1e3, "proxy-cpu-µs/req")
		b.ReportMetric(rate, "offered-req/s")
		b.ReportMetric(achieved, "achieved-req/s")
		b.ReportMetric(cpuPct, "cpu-%")
		b.ReportMetric(achieved*mean(all).Seconds(), "in-flight")
		b.ReportMetric(100*float64(behind.Load())/float64(max(1, done.Load())), "behind-%")
		b.ReportMetric(float64(pct(late, 0.99).Nanoseconds())/1e3, "late-p99-µs")
		b.ReportMetric(float64(runq.Nanoseconds())/1e3/float64(max(1, done.Load())), "runq-µs/req")
		if b.N == 1 { // the framework's first, trial run
			return
		}
		b.Logf("open loop, %d clients: capacity %.0f req/s (closed loop, direct and proxied alternating, %d requests; direct only: %.0f req/s); "+
			"offered %.0f req/s = %.2f × capacity (%d direct + %d proxied, interleaved); achieved %.0f req/s; process CPU %.0f %% of %d cores; "+
			"%.1f %% of requests due while their client still waited for the previous answer; load average %.1f before",
			clients, mixCap, calibration, directCap, rate, fraction, b.N, b.N, achieved, cpuPct, runtime.NumCPU(),
			100*float64(behind.Load())/float64(max(1, done.Load())), load0)
	}

	b.Run("clients=1", func(b *testing.B) { closed(b, 1, false, false) })
	b.Run(fmt.Sprintf("clients=1/body=%dKB", len(longBody(0))>>10), func(b *testing.B) { closed(b, 1, false, true) })
	b.Run("clients=64", func(b *testing.B) { closed(b, 64, false, false) })
	b.Run("sse-ttfb/clients=1", func(b *testing.B) { closed(b, 1, true, false) })
	loads := []float64{0.25, 0.5}
	if v := os.Getenv("TRACE_BENCH_OPEN_LOADS"); v != "" { // e.g. 0.1,0.25,0.5
		loads = nil
		for _, f := range strings.Split(v, ",") {
			var x float64
			if _, err := fmt.Sscan(f, &x); err != nil || x <= 0 {
				b.Fatalf("TRACE_BENCH_OPEN_LOADS: %q is not a positive fraction", f)
			}
			loads = append(loads, x)
		}
	}
	for _, f := range loads {
		b.Run(fmt.Sprintf("open=%.2f/clients=64", f), func(b *testing.B) { open(b, 64, false, f) })
	}
	b.Run(fmt.Sprintf("open=%.2f/sse-ttfb/clients=64", loads[0]), func(b *testing.B) { open(b, 64, true, loads[0]) })
	// The same load with Go's own collector target, and with the ratio
	// 400 alone, for comparison.
	for _, row := range []struct {
		name string
		p    gcpace.Policy
	}{{"go-default-gc", gcpace.Policy{Percent: 100}}, {"gogc-400", gcpace.Policy{Percent: 400}}} {
		b.Run(fmt.Sprintf("open=%.2f/clients=64/%s", loads[0], row.name), func(b *testing.B) {
			pace(row.p)
			defer pace(routeGC)
			open(b, 64, false, loads[0])
		})
	}
	if n := len(cls.Requests()); n != classified {
		b.Fatalf("%d classifications during the measurement: decisions were not cached", n-classified)
	}
}

// BenchmarkCachedDecisionMemory measures the heap one cached decision
// holds (the Decision, its labels and probabilities, its wire form, the
// cache entry), classified by a local OpenAI-protocol server with two
// active adapters, and what router.cache_max's default of conversations
// then costs: the live heap, and the heap goal a route-only process lets
// it reach (the route role's pacing beside the ratio 400 alone). The heap
// is read with the router alive and after it is dropped, so the
// classifier server's records cancel out.
//
//	go test -run '^$' -bench CachedDecisionMemory -benchtime 1x ./router/
func BenchmarkCachedDecisionMemory(b *testing.B) {
	cls := llmtest.New(b)
	cls.Handle(func(llmtest.Request) llmtest.Reply {
		return llmtest.Classification(map[string]float64{"A": 0.7, "B": 0.2, "C": 0.1})
	})
	client, err := llm.New(llm.Config{BaseURL: cls.URL, Model: "base"})
	if err != nil {
		b.Fatal(err)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	const conversations = 20000
	var perDecision float64
	for range b.N {
		r, err := router.New(router.Config{BaseModel: "base"}, client, staticAdapters{
			{Adapter: "lora-airline-refunds-v3", Capability: "refund-policy-lookup"},
			{Adapter: "lora-airline-baggage-v2", Capability: "baggage-allowance-rules"}})
		if err != nil {
			b.Fatal(err)
		}
		for i := range conversations {
			d, cached := r.Route(context.Background(), router.Input{ConversationID: fmt.Sprintf("conv-%08d-4f1c9a2e", i), ConversationSource: "header",
				Environment: "airline", AgentVersion: "v1", Turns: []router.Turn{{Role: "user", Text: "I need to change my flight to Boston tomorrow morning."}}})
			if cached || d.Adapter == "" {
				b.Fatalf("conversation %d: adapter %q, cached %v", i, d.Adapter, cached)
			}
		}
		alive := heap()
		if _, cached := r.Route(context.Background(), router.Input{ConversationID: "conv-00000000-4f1c9a2e", Environment: "airline", AgentVersion: "v1"}); !cached {
			b.Fatal("the first conversation's decision was not cached")
		}
		r = nil
		perDecision = (float64(alive) - float64(heap())) / conversations
	}
	full := config.DefaultRouter().CacheMax
	live := uint64(perDecision*float64(full)) + 8<<20 // plus the few MB of a router with an empty cache
	route, _ := config.Config{Roles: []string{"route"}, Router: config.DefaultRouter()}.GCPolicy("")
	b.ReportMetric(perDecision, "B/cached-decision")
	b.ReportMetric(float64(live)/(1<<20), "full-cache-live-MB")
	b.ReportMetric(float64(route.Goal(live))/(1<<20), "full-cache-goal-MB")
	b.ReportMetric(float64(gcpace.Policy{Percent: 400}.Goal(live))/(1<<20), "full-cache-goal-gogc400-MB")
	b.Logf("%.0f bytes per cached decision; router.cache_max's %d conversations: ~%d MB live, a heap goal of %d MB with the route role's pacing (%d MB at GOGC 400 alone)",
		perDecision, full, live>>20, route.Goal(live)>>20, gcpace.Policy{Percent: 400}.Goal(live)>>20)
}
