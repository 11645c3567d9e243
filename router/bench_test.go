package router_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/llmtest"
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

// instantUpstream answers every chat completion at once: JSON, or with
// stream: true one SSE event and [DONE].
func instantUpstream(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"ok"}}]}`+"\n\n")
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, benchAnswer)
	}))
	b.Cleanup(srv.Close)
	return srv
}

func pct(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// BenchmarkProxyOverhead measures the routing proxy's latency beyond the
// upstream's own, against a local upstream that answers at once, with the
// conversation's decision cached (the steady state: one classification per
// conversation). Every iteration makes one request straight to the
// upstream and one through the proxy, alternately, so both figures come
// from the same run under the same load; reported per request:
// direct/proxy p50 and p99 in µs and the added latency (proxy − direct at
// the same quantile), and the proxy's own time before forwarding
// (own-p50/p99: parsing, the cached decision, the rewrite, as recorded in
// route_decisions.overhead_us; µs resolution). clients=1 and clients=64 are concurrent callers;
// sse-ttfb is the time to the first byte of a streamed answer.
//
//	go test -run '^$' -bench ProxyOverhead -benchtime 4000x ./router/
func BenchmarkProxyOverhead(b *testing.B) {
	up := instantUpstream(b)
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
	p, err := router.NewProxy(router.ProxyConfig{UpstreamURL: up.URL + "/v1", DefaultEnvironment: "bench"}, r, rec)
	if err != nil {
		b.Fatal(err)
	}
	px := httptest.NewServer(p.Handler())
	b.Cleanup(px.Close)
	tr := &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512, DisableCompression: true}
	hc := &http.Client{Transport: tr}
	b.Cleanup(tr.CloseIdleConnections)

	body := func(conv int, stream bool) string {
		return fmt.Sprintf(`{"model":"m","stream":%v,"metadata":{"conversation_id":"conv-%d"},"messages":[{"role":"system","content":"You are an airline agent."},{"role":"user","content":"I need to change my flight to Boston tomorrow morning."}]}`, stream, conv)
	}
	// do returns the time to the response's first body byte (ttfb) and to its end.
	do := func(url, payload string) (ttfb, total time.Duration) {
		start := time.Now()
		resp, err := hc.Post(url, "application/json", strings.NewReader(payload))
		if err != nil {
			b.Fatal(err)
		}
		var one [1]byte
		if _, err := io.ReadFull(resp.Body, one[:]); err != nil {
			b.Fatal(err)
		}
		ttfb = time.Since(start)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("%s: %s", url, resp.Status)
		}
		return ttfb, time.Since(start)
	}
	const conversations = 64
	for c := range conversations { // warm the decision cache: the measured requests are cached decisions
		do(px.URL+"/v1/chat/completions", body(c, false))
	}
	classified := len(cls.Requests())
	if classified != conversations {
		b.Fatalf("%d classifications for %d conversations", classified, conversations)
	}

	run := func(b *testing.B, clients int, stream bool) {
		rec.Flush(ctx)
		w.take()
		var mu sync.Mutex
		var direct, proxied []time.Duration
		var next atomic.Int64
		b.ResetTimer()
		var wg sync.WaitGroup
		for g := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var d, pr []time.Duration
				for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
					payload := body((g+int(i))%conversations, stream)
					dt, dtot := do(up.URL+"/v1/chat/completions", payload)
					pt, ptot := do(px.URL+"/v1/chat/completions", payload)
					if stream {
						d, pr = append(d, dt), append(pr, pt)
					} else {
						d, pr = append(d, dtot), append(pr, ptot)
					}
				}
				mu.Lock()
				direct, proxied = append(direct, d...), append(proxied, pr...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		b.StopTimer()
		rec.Flush(ctx)
		own := w.take()
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		b.ReportMetric(us(pct(direct, 0.5)), "direct-p50-µs")
		b.ReportMetric(us(pct(direct, 0.99)), "direct-p99-µs")
		b.ReportMetric(us(pct(proxied, 0.5)), "proxy-p50-µs")
		b.ReportMetric(us(pct(proxied, 0.99)), "proxy-p99-µs")
		b.ReportMetric(us(pct(proxied, 0.5)-pct(direct, 0.5)), "added-p50-µs")
		b.ReportMetric(us(pct(proxied, 0.99)-pct(direct, 0.99)), "added-p99-µs")
		b.ReportMetric(us(pct(own, 0.5)), "own-p50-µs")
		b.ReportMetric(us(pct(own, 0.99)), "own-p99-µs")
		b.ReportMetric(0, "ns/op")
	}
	b.Run("clients=1", func(b *testing.B) { run(b, 1, false) })
	b.Run("clients=64", func(b *testing.B) { run(b, 64, false) })
	b.Run("sse-ttfb/clients=1", func(b *testing.B) { run(b, 1, true) })
	if n := len(cls.Requests()); n != classified {
		b.Fatalf("%d classifications during the measurement: decisions were not cached", n-classified)
	}
}
