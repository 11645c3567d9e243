package router

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/llm"
)

func TestAssignLabels(t *testing.T) {
	labels, dropped := AssignLabels([]Candidate{
		{Adapter: "lora-b", Capability: "policy_lookup"},
		{Adapter: "lora-a", Capability: "id_verification"},
		{Adapter: "lora-a", Capability: "id_verification"}, // listed twice
	})
	if len(dropped) != 0 {
		t.Fatalf("dropped %v", dropped)
	}
	got := []string{}
	for _, l := range labels {
		got = append(got, l.Name+"="+l.Capability()+"/"+l.Candidate.Adapter)
	}
	if want := "A=id_verification/lora-a B=policy_lookup/lora-b C=none/"; strings.Join(got, " ") != want {
		t.Fatalf("labels %q, want %q", strings.Join(got, " "), want)
	}
	if !labels[2].NoAdapter {
		t.Fatal("the last label is not 'no adapter'")
	}
	var many []Candidate
	for i := range 30 {
		many = append(many, Candidate{Adapter: string(rune('a'+i%26)) + strings.Repeat("x", i/26), Capability: "c"})
	}
	labels, dropped = AssignLabels(many)
	if len(labels) != MaxCandidates+1 || len(dropped) != 30-MaxCandidates || labels[MaxCandidates].Name != "Z" {
		t.Fatalf("%d labels (last %s), %d dropped", len(labels), labels[len(labels)-1].Name, len(dropped))
	}
}

func lp(tok string, l float64, top ...llm.TopLogprob) []llm.TokenLogprob {
	return []llm.TokenLogprob{{Token: tok, Logprob: l, TopLogprobs: top}}
}

func TestProbabilities(t *testing.T) {
	ln := math.Log
	labels := []string{"A", "B", "C"}
	cases := []struct {
		name   string
		lps    []llm.TokenLogprob
		temp   float64
		want   map[string]float64
		reason string
	}{
		{"no logprobs", nil, 1, nil, ReasonNoLogprobs},
		{"no label among tokens", lp("Hello", ln(0.9), llm.TopLogprob{Token: "Hi", Logprob: ln(0.1)}), 1, nil, ReasonNoLabel},
		{"sampled repeated in top, renormalised over labels", lp("A", ln(0.5),
			llm.TopLogprob{Token: "A", Logprob: ln(0.5)}, llm.TopLogprob{Token: "B", Logprob: ln(0.25)}, llm.TopLogprob{Token: "x", Logprob: ln(0.25)}), 1,
			map[string]float64{"A": 2.0 / 3, "B": 1.0 / 3, "C": 0}, ReasonClassified},
		{"sampled not in top is merged", lp("B", ln(0.2), llm.TopLogprob{Token: "A", Logprob: ln(0.6)}), 1,
			map[string]float64{"A": 0.75, "B": 0.25, "C": 0}, ReasonClassified},
		{"whitespace stripped, variants add", lp(" A", ln(0.3), llm.TopLogprob{Token: "A", Logprob: ln(0.3)}, llm.TopLogprob{Token: "C\n", Logprob: ln(0.4)}), 1,
			map[string]float64{"A": 0.6, "B": 0, "C": 0.4}, ReasonClassified},
		{"temperature 2 flattens", lp("A", ln(0.64), llm.TopLogprob{Token: "B", Logprob: ln(0.16)}), 2,
			map[string]float64{"A": 2.0 / 3, "B": 1.0 / 3, "C": 0}, ReasonClassified},
		{"temperature 0.5 sharpens", lp("A", ln(0.5), llm.TopLogprob{Token: "B", Logprob: ln(0.25)}), 0.5,
			map[string]float64{"A": 0.8, "B": 0.2, "C": 0}, ReasonClassified},
		{"lowercase is not a label", lp("a", ln(0.9)), 1, nil, ReasonNoLabel},
		// vLLM's V1 engine (its 2025 releases) names chat logprob tokens by
		// their vocabulary strings: byte-level BPE marks a leading space
		// "Ġ" (a newline "Ċ"), SentencePiece "▁".
		{"byte-level BPE space marker stripped", lp("ĠA", ln(0.5), llm.TopLogprob{Token: "ĠA", Logprob: ln(0.5)}, llm.TopLogprob{Token: "ĠB", Logprob: ln(0.3)},
			llm.TopLogprob{Token: "B", Logprob: ln(0.1)}, llm.TopLogprob{Token: "ĊC", Logprob: ln(0.1)}), 1,
			map[string]float64{"A": 0.5, "B": 0.4, "C": 0.1}, ReasonClassified},
		{"SentencePiece space marker stripped", lp("▁B", ln(0.6), llm.TopLogprob{Token: "▁A", Logprob: ln(0.2)}, llm.TopLogprob{Token: "▁", Logprob: ln(0.2)}), 1,
			map[string]float64{"A": 0.25, "B": 0.75, "C": 0}, ReasonClassified},
		{"trailing markers stripped too, as whitespace is", lp("AĊ", ln(0.5), llm.TopLogprob{Token: "Bĉ", Logprob: ln(0.5)}), 1,
			map[string]float64{"A": 0.5, "B": 0.5, "C": 0}, ReasonClassified},
		{"a marker inside a token is kept", lp("AĠB", ln(0.5), llm.TopLogprob{Token: "ÄA", Logprob: ln(0.5)}), 1, nil, ReasonNoLabel},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, reason := Probabilities(c.lps, labels, c.temp)
			if reason != c.reason {
				t.Fatalf("reason %q, want %q", reason, c.reason)
			}
			if c.want == nil {
				if got != nil {
					t.Fatalf("probabilities %v, want none", got)
				}
				return
			}
			sum := 0.0
			for _, l := range labels {
				if math.Abs(got[l]-c.want[l]) > 1e-9 {
					t.Errorf("p(%s) = %v, want %v", l, got[l], c.want[l])
				}
				sum += got[l]
			}
			if math.Abs(sum-1) > 1e-9 || len(got) != len(labels) {
				t.Errorf("probabilities %v sum to %v over %d labels", got, sum, len(got))
			}
		})
	}
}

func TestDecide(t *testing.T) {
	labels, _ := AssignLabels([]Candidate{{Adapter: "la", Capability: "a"}, {Adapter: "lb", Capability: "b"}, {Adapter: "lc", Capability: "c"}})
	// A, B, C adapters; D = no adapter.
	cases := []struct {
		name    string
		probs   map[string]float64
		topP    float64
		adapter string
		weights string
	}{
		{"no adapter wins", map[string]float64{"A": 0.3, "B": 0.1, "C": 0.1, "D": 0.5}, 0.95, "", ""},
		{"top adapter alone reaches p", map[string]float64{"A": 0.97, "D": 0.03}, 0.95, "la", "la=1.000"},
		{"top-p keeps two adapters", map[string]float64{"A": 0.6, "B": 0.38, "D": 0.02}, 0.95, "la", "la=0.612 lb=0.388"},
		{"no adapter counts towards p, gets no weight", map[string]float64{"A": 0.6, "D": 0.39, "B": 0.01}, 0.95, "la", "la=1.000"},
		{"top_p off records the top adapter", map[string]float64{"B": 0.5, "A": 0.4, "D": 0.1}, -1, "lb", "lb=1.000"},
		{"adapters with 0 left out", map[string]float64{"C": 0.9, "D": 0.02}, 0.95, "lc", "lc=1.000"},
		{"tie breaks by label order", map[string]float64{"A": 0.4, "B": 0.4, "D": 0.2}, 0.5, "la", "la=0.500 lb=0.500"},
		{"a tie with no adapter is the base model", map[string]float64{"B": 0.45, "D": 0.45, "A": 0.1}, 0.95, "", ""},
		{"all zero is the base model", map[string]float64{}, 0.95, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ch := Decide(labels, c.probs, c.topP)
			sum := 0.0
			for _, w := range ch.Weights {
				sum += w.Weight
			}
			if ch.Adapter != c.adapter {
				t.Fatalf("adapter %q, want %q", ch.Adapter, c.adapter)
			}
			if got := fmtWeights(ch.Weights); got != c.weights {
				t.Fatalf("weights %q, want %q", got, c.weights)
			}
			if len(ch.Weights) > 0 && (math.Abs(sum-1) > 1e-9 || ch.Weights[0].Adapter != ch.Adapter) {
				t.Fatalf("weights %v: sum %v, first must be the served adapter", ch.Weights, sum)
			}
			if c.adapter == "" && ch.Label != "D" {
				t.Fatalf("label %q, want the no-adapter label D", ch.Label)
			}
		})
	}
}

func fmtWeights(ws []Weight) string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Adapter+"="+strconv.FormatFloat(w.Weight, 'f', 3, 64))
	}
	return strings.Join(out, " ")
}

func TestSelectContext(t *testing.T) {
	turns := []Turn{{Role: "system", Text: "be nice"}, {Role: "user", Text: "  "}, {Role: "user", Text: "refund my order"}, {Role: "assistant", Text: "which order?"}, {Role: "tool", Text: "{}"}, {Role: "user", Text: "the last one"}}
	cases := []struct {
		mode string
		n    int
		want string
	}{
		{ContextFirstUser, 0, "user:refund my order"},
		{ContextLastN, 2, "assistant:which order?|user:the last one"},
		{ContextLastN, 10, "user:refund my order|assistant:which order?|user:the last one"},
		{ContextLastN, 0, "user:the last one"},
	}
	for _, c := range cases {
		var got []string
		for _, t := range SelectContext(turns, c.mode, c.n) {
			got = append(got, t.Role+":"+t.Text)
		}
		if strings.Join(got, "|") != c.want {
			t.Errorf("%s/%d: %q, want %q", c.mode, c.n, strings.Join(got, "|"), c.want)
		}
	}
	if got := SelectContext([]Turn{{Role: "system", Text: "x"}, {Role: "assistant", Text: "hi"}}, ContextLastN, 3); got != nil {
		t.Errorf("no user turn: %v, want nothing", got)
	}
}

func TestCacheTTLAndBound(t *testing.T) {
	now := time.Unix(1000, 0)
	c := NewCache(time.Minute, 2, func() time.Time { return now })
	c.Put("a", Decision{ID: "1"})
	c.Put("b", Decision{ID: "2"})
	if d, ok := c.Get("a"); !ok || d.ID != "1" {
		t.Fatalf("a: %v %v", d, ok)
	}
	c.Put("c", Decision{ID: "3"}) // evicts b, the least recently used
	if _, ok := c.Get("b"); ok {
		t.Fatal("b survived the bound of 2")
	}
	now = now.Add(59 * time.Second)
	if _, ok := c.Get("c"); !ok {
		t.Fatal("c expired before its TTL")
	}
	now = now.Add(2 * time.Second)
	if _, ok := c.Get("a"); ok {
		t.Fatal("a is served after its TTL")
	}
	// From 1,024 entries the cache is sharded: the bound holds in total,
	// and the most recent entries survive.
	big := NewCache(time.Minute, 2048, func() time.Time { return now })
	for i := range 10000 {
		big.Put(strconv.Itoa(i), Decision{ID: strconv.Itoa(i)})
	}
	if n := big.Len(); n > 2048 || n < 2048-cacheShards {
		t.Fatalf("sharded cache holds %d entries, want at most 2048 (and all but a shard's rounding)", n)
	}
	for i := 10000 - 64; i < 10000; i++ {
		if d, ok := big.Get(strconv.Itoa(i)); !ok || d.ID != strconv.Itoa(i) {
			t.Fatalf("recent entry %d: %v %v", i, d, ok)
		}
	}
	if _, ok := big.Get("0"); ok {
		t.Fatal("the oldest entry survived the bound")
	}
	// A TTL of an entry's own: shorter applies, longer is the cache's.
	c.PutTTL("short", Decision{ID: "s"}, time.Second)
	c.PutTTL("long", Decision{ID: "l"}, time.Hour)
	now = now.Add(2 * time.Second)
	if _, ok := c.Get("short"); ok {
		t.Fatal("an entry served past its own TTL")
	}
	if _, ok := c.Get("long"); !ok {
		t.Fatal("an entry with a long TTL expired early")
	}
	now = now.Add(time.Minute)
	if _, ok := c.Get("long"); ok {
		t.Fatal("an entry served past the cache's TTL")
	}
	off := NewCache(0, 0, nil)
	off.Put("a", Decision{ID: "1"})
	if _, ok := off.Get("a"); ok {
		t.Fatal("a cache with TTL 0 serves entries")
	}
}

// TestCacheOff: a negative CacheTTL turns the cache off (router.cache_ttl
// 0, "classify every request", which the route role passes as -1): the
// router starts, and each request of a conversation is classified anew.
func TestCacheOff(t *testing.T) {
	srv, cls := classifierA(t, 0)
	r, err := New(Config{BaseModel: "base", CacheTTL: -1}, cls, staticSource{{Adapter: "a", Capability: "c"}})
	if err != nil {
		t.Fatal(err)
	}
	in := Input{ConversationID: "c1", Environment: "e", Turns: []Turn{{Role: "user", Text: "hi"}}}
	for i := range 2 {
		if d, cached := r.Route(context.Background(), in); cached || d.Adapter != "a" {
			t.Fatalf("request %d: adapter %q, cached %v; want a, not cached", i, d.Adapter, cached)
		}
	}
	if n := len(srv.Requests()); n != 2 {
		t.Fatalf("%d classifications for 2 requests with the cache off", n)
	}
}

// TestRouteConcurrentFirstRequests: concurrent first requests of one
// conversation share one classification; exactly one of them reports it
// as new (cached false).
func TestRouteConcurrentFirstRequests(t *testing.T) {
	srv, cls := classifierA(t, 300*time.Millisecond)
	r, err := New(Config{BaseModel: "base"}, cls, staticSource{{Adapter: "a", Capability: "c"}})
	if err != nil {
		t.Fatal(err)
	}
	in := Input{ConversationID: "c1", Environment: "e", Turns: []Turn{{Role: "user", Text: "hi"}}}
	const n = 8
	results := make(chan Decision, n)
	fresh := make(chan bool, n)
	for range n {
		go func() { d, cached := r.Route(context.Background(), in); results <- d; fresh <- !cached }()
	}
	nFresh, id := 0, ""
	for range n {
		d := <-results
		if id != "" && d.ID != id {
			t.Fatalf("two decisions %s and %s for one conversation", id, d.ID)
		}
		id = d.ID
		if <-fresh {
			nFresh++
		}
	}
	if nFresh != 1 || len(srv.Requests()) != 1 {
		t.Fatalf("%d fresh decisions, %d classifications; want 1 and 1", nFresh, len(srv.Requests()))
	}
}

// TestErrorDecisionsCachedBriefly: a decision that records an error
// (classifier or registry), or had no text to classify, is kept for AdaptersRefresh, the others for
// CacheTTL, so that a passing failure does not pin a conversation to the
// base model for an hour. Real scripted classifier; the registry's failure
// is a source that fails.
func TestErrorDecisionsCachedBriefly(t *testing.T) {
	for _, tc := range []struct {
		name   string
		src    AdapterSource
		reply  llmtest.Reply
		reason string
		short  bool
		turns  []Turn // nil: a user turn "hi"
	}{
		{"classified", staticSource{{Adapter: "a", Capability: "c"}}, llmtest.Classification(map[string]float64{"A": 0.9, "B": 0.1}), ReasonClassified, false, nil},
		{"no adapters", staticSource{}, llmtest.Reply{}, ReasonNoAdapters, false, nil},
		{"no logprobs", staticSource{{Adapter: "a", Capability: "c"}}, llmtest.Text("A"), ReasonNoLogprobs, false, nil},
		{"classifier error", staticSource{{Adapter: "a", Capability: "c"}}, llmtest.Status(400, "bad request"), ReasonClassifierError, true, nil},
		{"registry error", failingSource{}, llmtest.Reply{}, ReasonRegistryError, true, nil},
		// A named conversation whose first request had no text (audio or
		// images only): its next request may have some.
		{"no user text", staticSource{{Adapter: "a", Capability: "c"}}, llmtest.Reply{}, ReasonNoMessages, true, []Turn{{Role: "user", Media: `{"type":"input_audio"}`}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Handle(func(llmtest.Request) llmtest.Reply { return tc.reply })
			cls, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "base"})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Unix(1000, 0)
			r, err := New(Config{BaseModel: "base", CacheTTL: time.Hour, AdaptersRefresh: 10 * time.Second, Now: func() time.Time { return now }}, cls, tc.src)
			if err != nil {
				t.Fatal(err)
			}
			turns := tc.turns
			if turns == nil {
				turns = []Turn{{Role: "user", Text: "hi"}}
			}
			in := Input{ConversationID: "c1", Environment: "e", Turns: turns}
			d, cached := r.Route(context.Background(), in)
			if cached || d.Reason != tc.reason {
				t.Fatalf("decision %q (cached %v), want %q", d.Reason, cached, tc.reason)
			}
			now = now.Add(9 * time.Second)
			if _, ok := r.Lookup("e", "c1"); !ok {
				t.Fatal("not cached for AdaptersRefresh")
			}
			now = now.Add(2 * time.Second)
			if _, ok := r.Lookup("e", "c1"); ok == tc.short {
				t.Fatalf("cached after AdaptersRefresh: %v, want %v", ok, !tc.short)
			}
			now = now.Add(time.Hour)
			if _, ok := r.Lookup("e", "c1"); ok {
				t.Fatal("cached after CacheTTL")
			}
		})
	}
}

// TestDecisionTimeout: a new decision is bounded as a whole. A classifier
// whose only slot is taken (Concurrency 1, a slow call in flight) makes a
// decision wait in the queue; past DecisionTimeout it is the base model
// with classifier_error and the deadline in its error, without reaching
// the classifier. A slow answer is cut the same way, although the
// per-attempt timeout is longer.
func TestDecisionTimeout(t *testing.T) {
	srv := llmtest.New(t)
	srv.Handle(func(req llmtest.Request) llmtest.Reply {
		if strings.Contains(req.Chat.Prompt(), "hold the slot") {
			return llmtest.Slow(time.Minute, llmtest.Text("held")) // until the caller goes away
		}
		return llmtest.Slow(5*time.Second, llmtest.Classification(map[string]float64{"A": 0.9, "B": 0.1}))
	})
	cls, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "base", Timeout: 30 * time.Second, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{BaseModel: "base", DecisionTimeout: 200 * time.Millisecond}, cls, staticSource{{Adapter: "a", Capability: "c"}})
	if err != nil {
		t.Fatal(err)
	}
	check := func(d Decision, wantRequests int) {
		t.Helper()
		if d.Reason != ReasonClassifierError || d.Adapter != "" || d.Model != "base" || !strings.Contains(d.Error, "decision timeout (200ms)") {
			t.Fatalf("decision %+v, want the base model for the deadline", d)
		}
		if n := len(srv.Requests()); n != wantRequests {
			t.Fatalf("%d classifier requests, want %d", n, wantRequests)
		}
	}

	// A slow classifier: the attempt is cut at the decision's deadline.
	d, _ := r.Route(context.Background(), Input{ConversationID: "slow", Environment: "e", Turns: []Turn{{Role: "user", Text: "hi"}}})
	check(d, 1)

	// An overloaded classifier: the only slot is held by another call.
	hold, stop := context.WithCancel(context.Background())
	held := make(chan struct{})
	go func() {
		_, _ = cls.Chat(hold, llm.Request{Purpose: "hold", Messages: []llm.Message{{Role: "user", Content: "hold the slot"}}, MaxAttempts: 1})
		close(held)
	}()
	t.Cleanup(func() { stop(); <-held })
	for len(srv.Requests()) < 2 { // the holding call is in the server: the slot is taken
		time.Sleep(5 * time.Millisecond)
	}
	d, _ = r.Route(context.Background(), Input{ConversationID: "queued", Environment: "e", Turns: []Turn{{Role: "user", Text: "hi"}}})
	check(d, 2) // never sent: it timed out in the queue
}

// switchingSource is an adapter source whose list or failure the test sets,
// counting the reads.
type switchingSource struct {
	mu    sync.Mutex
	list  []Candidate
	err   error
	reads int
}

func (s *switchingSource) ActiveAdapters(context.Context, string, string) ([]Candidate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	return s.list, s.err
}

func (s *switchingSource) set(list []Candidate, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list, s.err = list, err
}

func (s *switchingSource) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// TestCachedDecisionAdapterCheck: a cached decision's adapter is checked
// against the source's list, read again at most once per AdaptersRefresh
// however many requests come; a failed read keeps the decision; once the
// adapter is gone from the list the decision is dropped and the
// conversation classified again, to an adapter still active.
func TestCachedDecisionAdapterCheck(t *testing.T) {
	srv, cls := classifierA(t, 0)
	now := time.Unix(1000, 0)
	src := &switchingSource{list: []Candidate{{Adapter: "lora-a", Capability: "a"}}}
	r, err := New(Config{BaseModel: "base", AdaptersRefresh: 10 * time.Second, Now: func() time.Time { return now }}, cls, src)
	if err != nil {
		t.Fatal(err)
	}
	in := Input{ConversationID: "c1", Environment: "e", Turns: []Turn{{Role: "user", Text: "hi"}}}
	first, _ := r.Route(context.Background(), in)
	if first.Adapter != "lora-a" {
		t.Fatalf("first decision %+v", first)
	}
	lookup := func(times int) (Decision, bool) {
		var d Decision
		var ok bool
		for range times {
			d, ok = r.Lookup("e", "c1")
		}
		return d, ok
	}
	if d, ok := lookup(5); !ok || d.ID != first.ID || src.count() != 1 {
		t.Fatalf("within the interval: %v %v, %d reads", d.ID, ok, src.count())
	}
	now = now.Add(10 * time.Second)
	src.set(nil, errors.New("registry down"))
	if d, ok := lookup(5); !ok || d.ID != first.ID {
		t.Fatalf("a failed read dropped the decision: %v %v", d.ID, ok)
	}
	if n := src.count(); n != 2 {
		t.Fatalf("%d reads, want 2: one per interval, not per request", n)
	}
	now = now.Add(10 * time.Second)
	src.set([]Candidate{{Adapter: "lora-b", Capability: "b"}}, nil)
	if d, ok := lookup(1); ok {
		t.Fatalf("a decision naming a retired adapter served: %+v", d)
	}
	d, cached := r.Route(context.Background(), in)
	if cached || d.ID == first.ID || d.Adapter != "lora-b" {
		t.Fatalf("after the adapter left: %+v (cached %v)", d, cached)
	}
	if n := len(srv.Requests()); n != 2 {
		t.Fatalf("%d classifications, want 2", n)
	}
}

type failingSource struct{}

func (failingSource) ActiveAdapters(context.Context, string, string) ([]Candidate, error) {
	return nil, errors.New("adapter registry: connection refused")
}

type staticSource []Candidate

func (s staticSource) ActiveAdapters(context.Context, string, string) ([]Candidate, error) {
	return s, nil
}

// TestNewProxyRejectsQuery: /chat/completions is appended to the upstream
// URL, so one with a query or fragment is refused, naming the field and
// without its user information.
func TestNewProxyRejectsQuery(t *testing.T) {
	for _, u := range []string{"https://u:secret@h.example/openai/v1?api-version=1", "http://127.0.0.1:8000/v1#f"} {
		_, err := NewProxy(ProxyConfig{UpstreamURL: u}, nil, nil)
		if err == nil || !strings.HasPrefix(err.Error(), "router.upstream_url: ") || strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: %v", u, err)
		}
	}
	if _, err := NewProxy(ProxyConfig{UpstreamURL: "http://127.0.0.1:8000/v1/"}, nil, nil); err != nil {
		t.Fatal(err)
	}
}

// classifierA is a scripted classifier that answers "A" (0.9, "B" 0.1)
// after delay, and a client of it.
func classifierA(t *testing.T, delay time.Duration) (*llmtest.Server, *llm.Client) {
	t.Helper()
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply {
		return llmtest.Slow(delay, llmtest.Classification(map[string]float64{"A": 0.9, "B": 0.1}))
	})
	cls, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "base"})
	if err != nil {
		t.Fatal(err)
	}
	return srv, cls
}

// TestOldLogprobLayoutsClassify: a classifier server that sends its chat
// logprobs in an older layout (vLLM's and llama-cpp-python's Completions
// layout, llama.cpp's completion_probabilities; see internal/llm's
// readLogprobs) gets a classification, not no_logprobs for every
// conversation.
func TestOldLogprobLayoutsClassify(t *testing.T) {
	choice := func(logprobs, extra string) string {
		return `{"id":"x","object":"chat.completion","model":"base","choices":[{"index":0,"message":{"role":"assistant","content":"A"},` +
			`"logprobs":` + logprobs + `,"finish_reason":"length"}]` + extra + `}`
	}
	for _, tc := range []struct {
		name, body string
		pA         float64
	}{
		{"completions layout", choice(`{"text_offset":[0],"token_logprobs":[-0.2231435513],"tokens":["A"],"top_logprobs":[{"A":-0.2231435513,"B":-1.6094379124}]}`, ""), 0.8},
		{"llama.cpp completion_probabilities", choice(`null`, `,"completion_probabilities":[{"content":"A","probs":[{"tok_str":"A","prob":1},{"tok_str":"B","prob":0}]}]`), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Reply{Body: tc.body} })
			cls, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "base"})
			if err != nil {
				t.Fatal(err)
			}
			r, err := New(Config{BaseModel: "base"}, cls, staticSource{{Adapter: "a", Capability: "c"}})
			if err != nil {
				t.Fatal(err)
			}
			d, _ := r.Route(context.Background(), Input{ConversationID: "c1", Environment: "e", Turns: []Turn{{Role: "user", Text: "hi"}}})
			if d.Reason != ReasonClassified || d.Label != "A" || d.Model != "a" || math.Abs(d.Probabilities["A"]-tc.pA) > 1e-6 {
				t.Fatalf("decision %s (label %q, model %q, probabilities %v, error %q), want classified, A (adapter a) at %v",
					d.Reason, d.Label, d.Model, d.Probabilities, d.Error, tc.pA)
			}
		})
	}
}

// TestClassifierExtraBody: a reasoning classifier (Qwen3 in thinking mode,
// scripted: it answers "<think>" unless the request's
// chat_template_kwargs.enable_thinking is false, as Qwen3's chat template
// does on vLLM and llama.cpp) gives no_label for every conversation; with
// Config.ClassifierExtraBody the server receives the fields (beside
// structured_outputs when the label constraint adds it) and the
// conversation is classified. A field the router sets itself is refused at
// New, naming it.
func TestClassifierExtraBody(t *testing.T) {
	noThinking := map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": false}}
	for _, tc := range []struct {
		name       string
		extra      map[string]any
		constraint string
		reason     string
	}{
		{"thinking on", nil, "", ReasonNoLabel},
		{"enable_thinking false", noThinking, "", ReasonClassified},
		{"enable_thinking false and structured_outputs", noThinking, ConstraintStructuredOutputs, ReasonClassified},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Handle(func(req llmtest.Request) llmtest.Reply {
				var body struct {
					Kwargs struct {
						EnableThinking *bool `json:"enable_thinking"`
					} `json:"chat_template_kwargs"`
				}
				_ = json.Unmarshal(req.Body, &body)
				if body.Kwargs.EnableThinking == nil || *body.Kwargs.EnableThinking {
					return llmtest.Reply{Content: "<think>", FinishReason: "length", Logprobs: []llmtest.Logprob{{Token: "<think>", Logprob: -0.001,
						TopLogprobs: []llmtest.Logprob{{Token: "<think>", Logprob: -0.001}, {Token: "Okay", Logprob: -9}}}}}
				}
				return llmtest.Classification(map[string]float64{"A": 0.9, "B": 0.1})
			})
			cls, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "qwen3"})
			if err != nil {
				t.Fatal(err)
			}
			r, err := New(Config{BaseModel: "base", ClassifierExtraBody: tc.extra, LabelConstraint: tc.constraint}, cls, staticSource{{Adapter: "a", Capability: "c"}})
			if err != nil {
				t.Fatal(err)
			}
			d, _ := r.Route(context.Background(), Input{ConversationID: "c1", Environment: "e", Turns: []Turn{{Role: "user", Text: "hi"}}})
			if d.Reason != tc.reason {
				t.Fatalf("decision %s (%s), want %s", d.Reason, d.Error, tc.reason)
			}
			var sent map[string]any
			if err := json.Unmarshal(srv.Requests()[0].Body, &sent); err != nil {
				t.Fatal(err)
			}
			if got, _ := json.Marshal(sent["chat_template_kwargs"]); tc.extra != nil && string(got) != `{"enable_thinking":false}` {
				t.Fatalf("chat_template_kwargs sent %s", got)
			}
			if so, _ := json.Marshal(sent["structured_outputs"]); (tc.constraint != "") != (string(so) == `{"choice":["A","B"]}`) {
				t.Fatalf("structured_outputs sent %s with label_constraint %q", so, tc.constraint)
			}
			if sent["max_tokens"] != 1.0 || sent["logprobs"] != true || sent["model"] != "qwen3" {
				t.Fatalf("the router's own fields changed: %s", srv.Requests()[0].Body)
			}
		})
	}
	for _, key := range []string{"max_tokens", "logprobs", "top_logprobs", "model", "messages", "structured_outputs"} {
		_, err := New(Config{BaseModel: "base", ClassifierExtraBody: map[string]any{"top_k": 1, key: 5}}, nil, staticSource{})
		if err == nil || !strings.Contains(err.Error(), "router.classifier_extra_body."+key+":") {
			t.Errorf("extra body setting %s: %v", key, err)
		}
	}
}

// TestDecisionsShareTheirListsLabels: the decisions made from one list of
// active adapters share its labels and their route_decisions columns
// (a cached conversation holds no copy of them); a changed list gets new
// ones, and each decision's row still names its own labels.
func TestDecisionsShareTheirListsLabels(t *testing.T) {
	_, cls := classifierA(t, 0)
	now := time.Unix(1000, 0)
	src := &switchingSource{list: []Candidate{{Adapter: "lora-a", Capability: "a"}, {Adapter: "lora-b", Capability: "b"}}}
	r, err := New(Config{BaseModel: "base", AdaptersRefresh: time.Second, Now: func() time.Time { return now }}, cls, src)
	if err != nil {
		t.Fatal(err)
	}
	route := func(conv string) Decision {
		d, cached := r.Route(context.Background(), Input{ConversationID: conv, Environment: "e", Turns: []Turn{{Role: "user", Text: "hi"}}})
		if cached || len(d.Labels) == 0 {
			t.Fatalf("%s: %+v (cached %v)", conv, d, cached)
		}
		return d
	}
	row := func(d Decision) string {
		w := newWire(d)
		return strings.Join(w.labels, ",") + "|" + strings.Join(w.labelCapabilities, ",") + "|" + strings.Join(w.labelAdapters, ",")
	}
	d1, d2 := route("c1"), route("c2")
	if &d1.Labels[0] != &d2.Labels[0] {
		t.Fatal("two decisions from one list hold two copies of its labels")
	}
	w1, w2 := newWire(d1), newWire(d2)
	if &w1.labels[0] != &w2.labels[0] || &w1.labelCapabilities[0] != &w2.labelCapabilities[0] || &w1.labelAdapters[0] != &w2.labelAdapters[0] {
		t.Fatal("two decisions from one list hold two copies of its label columns")
	}
	if got, want := row(d1), "A,B,C|a,b,none|lora-a,lora-b,"; got != want {
		t.Fatalf("row columns %q, want %q", got, want)
	}
	if p := newWire(d1).probabilities; len(p) != 3 || p[0] != d1.Probabilities["A"] {
		t.Fatalf("probabilities column %v for %v", p, d1.Probabilities)
	}

	now = now.Add(2 * time.Second) // the list is read again, and has changed
	src.set([]Candidate{{Adapter: "lora-c", Capability: "c"}}, nil)
	d3 := route("c3")
	if &d3.Labels[0] == &d1.Labels[0] {
		t.Fatal("a changed list's decision shares the old list's labels")
	}
	if got, want := row(d3), "A,B|c,none|lora-c,"; got != want {
		t.Fatalf("after the change: row columns %q, want %q", got, want)
	}
	if got, want := row(d1), "A,B,C|a,b,none|lora-a,lora-b,"; got != want {
		t.Fatalf("the first decision's columns changed with the list: %q, want %q", got, want)
	}
}

// TestCapContext: turns over the budget keep their beginning and end with
// a marker naming what was left out; within it they are unchanged.
func TestCapContext(t *testing.T) {
	long := strings.Repeat("a", 600) + strings.Repeat("z", 600)
	for _, tc := range []struct {
		name  string
		turns []Turn
		max   int
		check func([]Turn) bool
	}{
		{"within the budget", []Turn{{Role: "user", Text: "short"}}, 100, func(o []Turn) bool { return o[0].Text == "short" }},
		{"no bound", []Turn{{Role: "user", Text: long}}, -1, func(o []Turn) bool { return o[0].Text == long }},
		{"one long turn", []Turn{{Role: "user", Text: long}}, 300, func(o []Turn) bool {
			return strings.HasPrefix(o[0].Text, strings.Repeat("a", 200)+"\n[… 900 characters left out …]\n") &&
				strings.HasSuffix(o[0].Text, strings.Repeat("z", 100)) && len([]rune(o[0].Text)) < 340
		}},
		{"shared out in order", []Turn{{Role: "user", Text: "tiny"}, {Role: "assistant", Text: long}}, 304, func(o []Turn) bool {
			return o[0].Text == "tiny" && strings.Contains(o[1].Text, "[… 900 characters left out …]")
		}},
		{"runes, not bytes", []Turn{{Role: "user", Text: strings.Repeat("é", 400)}}, 300, func(o []Turn) bool {
			return utf8.ValidString(o[0].Text) && strings.Contains(o[0].Text, "[… 100 characters left out …]")
		}},
	} {
		in := slices.Clone(tc.turns)
		if out := CapContext(tc.turns, tc.max); !tc.check(out) {
			t.Errorf("%s: %q", tc.name, out)
		}
		if !slices.Equal(in, tc.turns) {
			t.Errorf("%s: the input turns changed", tc.name)
		}
	}
}

// TestClassifierSeesACappedTurn: a first turn longer than
// router.context_max_chars reaches the classifier shortened, so that it
// still fits the model's context with the routing prompt.
func TestClassifierSeesACappedTurn(t *testing.T) {
	srv, cls := classifierA(t, 0)
	r, err := New(Config{BaseModel: "base", ContextMaxChars: 1000}, cls, staticSource{{Adapter: "a", Capability: "c"}})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 50000)
	if d, _ := r.Route(context.Background(), Input{ConversationID: "c1", Environment: "e", Turns: []Turn{{Role: "user", Text: long}}}); d.Adapter != "a" {
		t.Fatalf("decision %+v", d)
	}
	body := string(srv.Requests()[0].Body)
	if len(body) > 10000 || !strings.Contains(body, "49000 characters left out") {
		t.Fatalf("the classifier was sent %d bytes: %.300s", len(body), body)
	}
}

// TestHashConversation: the id of a conversation that names none covers
// the turns up to the first user turn, their text and their other parts:
// later requests repeating them share it; first turns of one text with
// other images, or with images only, do not.
func TestHashConversation(t *testing.T) {
	msgs := func(content string) []wireMessage {
		return []wireMessage{{Role: "system", Content: json.RawMessage(`"be brief"`)}, {Role: "user", Content: json.RawMessage(content)}}
	}
	img := func(url string) string {
		return `[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"` + url + `"}}]`
	}
	id := func(ms []wireMessage) string { return HashConversation("e", turnsOf(ms)) }
	cat, dog := id(msgs(img("https://x/cat.png"))), id(msgs(img("https://x/dog.png")))
	if cat == dog {
		t.Error("one text with other images: one id")
	}
	later := append(msgs(img("https://x/cat.png")), wireMessage{Role: "assistant", Content: json.RawMessage(`"a cat"`)}, wireMessage{Role: "user", Content: json.RawMessage(`"and?"`)})
	if id(later) != cat {
		t.Error("a later request of the conversation: another id")
	}
	a, b := id(msgs(`[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]`)), id(msgs(`[{"type":"input_audio","input_audio":{"data":"BBBB","format":"wav"}}]`))
	if a == b {
		t.Error("two audio-only first turns: one id")
	}
	if id(msgs(`"what is this?"`)) != id(msgs(`[{"type":"text","text":"what is this?"}]`)) {
		t.Error("the same text as a string and as a part: other ids")
	}
	if got := turnsOf(msgs(img("https://x/cat.png")))[1].Text; got != "what is this?" {
		t.Errorf("the classifier's text %q", got)
	}
}
