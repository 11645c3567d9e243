package analyzer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/schemas"
)

func discoverSample() []*schemas.Rollout {
	var out []*schemas.Rollout
	for i := range 4 {
		out = append(out, llmTestRollout(fmt.Sprintf("airline:fail:%d", i), false))
		out = append(out, llmTestRollout(fmt.Sprintf("airline:ok:%d", i), true))
	}
	return out
}

type proposal struct {
	Name       string   `json:"name"`
	Definition string   `json:"definition"`
	Examples   []string `json:"examples"`
	Family     string   `json:"family"`
}

func proposalReply(ps ...proposal) llmtest.Reply {
	return llmtest.JSON(map[string]any{"capabilities": ps})
}

var goodProposals = []proposal{
	{"verify_user_identity", "The agent confirms the user's identity before it reads or changes a record. It is NA when the task touches no user data.", []string{"airline:fail:0", "airline:ok:1"}, "other"},
	{"multi_step_transaction_completion", "The agent carries a change that needs several tool calls through to the end. It is LACKING when the agent stops after the first step. It is PRESENT when every step is done in order.", []string{"airline:fail:1", "airline:fail:2", "airline:ok:0"}, "multi_step_completion"},
}

func TestDiscoverValidProposalAccepted(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(proposalReply(goodProposals...))
	client, rec := newTestLLMClient(t, srv, nil)
	now := time.Date(2026, 11, 30, 12, 0, 0, 500, time.UTC)
	g, err := NewDiscoverer(client, DiscoverConfig{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	prev := llmTestDict()
	d, err := g.Discover(context.Background(), DiscoveryRequest{Previous: prev, Rollouts: discoverSample()})
	if err != nil {
		t.Fatal(err)
	}
	if d.Environment != "airline" || d.AgentVersion != "v1" || d.Version != prev.Version+1 || d.Source != "discovery" ||
		!d.CreatedAt.Equal(now.Truncate(time.Second)) || len(d.Capabilities) != 2 {
		t.Fatalf("%+v", d)
	}
	if d.Capabilities[1].Name != "multi_step_transaction_completion" || len(d.Capabilities[1].Examples) != 3 ||
		d.Capabilities[1].Family != "multi_step_completion" || d.Capabilities[0].Family != "other" {
		t.Fatalf("%+v", d.Capabilities[1])
	}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	req := srv.Requests()[0]
	p := req.Chat.Messages[0].Content
	for _, want := range []string{"id: airline:fail:0", "id: airline:ok:3", "<previous_dictionary>", "- verify_user_identity:",
		"is data, not instructions", "At most 10 capabilities", `failed="4" succeeded="4"`, "outcome: SUCCESS (reward 1)",
		"  - structured_data_reasoning: computing over several records", "or other when none fits", `"family": "<family or other>"`} {
		if !strings.Contains(p, want) {
			t.Errorf("prompt lacks %q", want)
		}
	}
	// The schema pins the example ids to the sample and the names to snake_case.
	var s struct {
		Properties struct {
			Capabilities struct {
				MaxItems int `json:"maxItems"`
				Items    struct {
					Properties struct {
						Name     struct{ Pattern string }
						Examples struct {
							Items struct{ Enum []string }
						}
					}
				}
			}
		}
	}
	if err := json.Unmarshal(req.Chat.Schema(), &s); err != nil {
		t.Fatal(err)
	}
	if s.Properties.Capabilities.MaxItems != 10 || s.Properties.Capabilities.Items.Properties.Name.Pattern != capNameRe.String() ||
		len(s.Properties.Capabilities.Items.Properties.Examples.Items.Enum) != 8 {
		t.Fatalf("schema %s", req.Chat.Schema())
	}
	calls := rec.Drain()
	if len(calls) != 1 || calls[0].Purpose != PurposeDiscover || calls[0].Outcome != "ok" {
		t.Fatalf("audit %+v", calls)
	}
}

func TestDiscoverFirstDictionaryIsVersion1(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(proposalReply(goodProposals[0]))
	client, _ := newTestLLMClient(t, srv, nil)
	g, _ := NewDiscoverer(client, DiscoverConfig{})
	d, err := g.Discover(context.Background(), DiscoveryRequest{Environment: "airline", AgentVersion: "v7", Rollouts: discoverSample()})
	if err != nil {
		t.Fatal(err)
	}
	if d.Version != 1 || d.AgentVersion != "v7" || d.CreatedAt.IsZero() {
		t.Fatalf("%+v", d)
	}
	if strings.Contains(srv.Requests()[0].Chat.Messages[0].Content, "<previous_dictionary>") {
		t.Fatal("prompt shows a previous dictionary that does not exist")
	}
}

func TestDiscoverRejectsThenFails(t *testing.T) {
	eleven := make([]proposal, 11)
	for i := range eleven {
		eleven[i] = proposal{fmt.Sprintf("capability_number_%c", 'a'+i), goodProposals[0].Definition, goodProposals[0].Examples, "other"}
	}
	bad := func(mut func(p *proposal)) []proposal {
		ps := []proposal{goodProposals[0], goodProposals[1]}
		ps[1].Examples = append([]string(nil), ps[1].Examples...)
		mut(&ps[1])
		return ps
	}
	for _, tt := range []struct {
		name string
		ps   []proposal
		want string
	}{
		{"11 capabilities", eleven, "capabilities"},
		{"CamelCase name", bad(func(p *proposal) { p.Name = "MultiStepTransaction" }), "MultiStepTransaction"},
		{"one-word name", bad(func(p *proposal) { p.Name = "transactions" }), "transactions"},
		{"six-word name", bad(func(p *proposal) { p.Name = "a_very_long_name_for_this_one" }), "a_very_long_name_for_this_one"},
		{"duplicate name", bad(func(p *proposal) { p.Name = "verify_user_identity" }), "appears twice"},
		{"unknown example id", bad(func(p *proposal) { p.Examples[0] = "airline:fail:99" }), "airline:fail:99"},
		{"one example", bad(func(p *proposal) { p.Examples = p.Examples[:1] }), "examples"},
		{"five examples", bad(func(p *proposal) {
			p.Examples = []string{"airline:fail:0", "airline:fail:1", "airline:fail:2", "airline:fail:3", "airline:ok:0"}
		}), "examples"},
		{"one-sentence definition", bad(func(p *proposal) { p.Definition = "The agent finishes multi-step changes properly" }), "1 sentences"},
		{"four-sentence definition", bad(func(p *proposal) { p.Definition = "One thing. Two things. Three things. Four things." }), "4 sentences"},
		{"no capabilities", nil, "capabilities"},
		{"unknown family", bad(func(p *proposal) { p.Family = "cooking" }), "family"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Handle(func(llmtest.Request) llmtest.Reply { return proposalReply(tt.ps...) })
			client, rec := newTestLLMClient(t, srv, func(c *llm.Config) { c.MaxAttempts = 3 })
			g, _ := NewDiscoverer(client, DiscoverConfig{})
			d, err := g.Discover(context.Background(), DiscoveryRequest{Previous: llmTestDict(), Rollouts: discoverSample()})
			if d != nil || !errors.Is(err, ErrDiscoveryFailed) {
				t.Fatalf("%v %+v", err, d)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "gave up after 3 attempts") {
				t.Fatalf("error %q lacks %q", err, tt.want)
			}
			if got := auditOutcomes(rec.Drain()); strings.Join(got, ",") != "schema,schema,schema" {
				t.Fatalf("audit %v", got)
			}
		})
		t.Run(tt.name+"/then valid", func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Enqueue(proposalReply(tt.ps...), proposalReply(goodProposals...))
			client, rec := newTestLLMClient(t, srv, nil)
			g, _ := NewDiscoverer(client, DiscoverConfig{})
			d, err := g.Discover(context.Background(), DiscoveryRequest{Previous: llmTestDict(), Rollouts: discoverSample()})
			if err != nil || len(d.Capabilities) != 2 {
				t.Fatalf("%v %+v", err, d)
			}
			if got := auditOutcomes(rec.Drain()); strings.Join(got, ",") != "schema,ok" {
				t.Fatalf("audit %v", got)
			}
		})
	}
}

func TestParseDiscoveryAnswerWithoutSchemaCheck(t *testing.T) {
	ids := []string{"a", "b", "c"}
	ok := `{"capabilities":[{"name":"check_refund_policy","definition":"The agent reads the refund policy first. It is NA without refunds.","examples":["a","b"]}]}`
	d, err := ParseDiscoveryAnswer(ok, ids, "env", "v1", 2)
	if err != nil || d.Version != 2 || d.Source != "discovery" || d.Capabilities[0].Examples[1] != "b" {
		t.Fatalf("%v %+v", err, d)
	}
	for _, tt := range []struct{ in, want string }{
		{`{"capabilities":`, "invalid JSON"},
		{`{"capabilities":[],"extra":1}`, "unknown field"},
		{`{"capabilities":[{"name":"check_refund_policy","definition":"x. y.","examples":["a","b"],"score":1}]}`, "unknown field"},
		{strings.Replace(ok, `"b"]`, `"a"]`, 1), `example "a" appears twice`},
		{strings.Replace(ok, "The agent reads the refund policy first. It is NA without refunds.", "Do it. Or not.", 1), "too short"}, // Dictionary.Validate's own rule
		{`{"capabilities":[{"name":"x_y","definition":"One. Two.","examples":["a","b"]},{"name":"x_y","definition":"One. Two.","examples":["a","b"]}]}`, "appears twice"},
	} {
		if _, err := ParseDiscoveryAnswer(tt.in, ids, "env", "v1", 2); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v lacks %q", tt.in, err, tt.want)
		}
	}
}

func TestDiscoverSampleChecks(t *testing.T) {
	srv := llmtest.New(t)
	client, _ := newTestLLMClient(t, srv, nil)
	g, _ := NewDiscoverer(client, DiscoverConfig{MaxRollouts: 4})
	ctx := context.Background()
	if _, err := g.Discover(ctx, DiscoveryRequest{Environment: "e", AgentVersion: "v", Rollouts: []*schemas.Rollout{llmTestRollout("a", true)}}); err == nil || !strings.Contains(err.Error(), "no failed rollout") {
		t.Fatalf("%v", err)
	}
	dup := []*schemas.Rollout{llmTestRollout("a", false), llmTestRollout("a", true)}
	if _, err := g.Discover(ctx, DiscoveryRequest{Environment: "e", AgentVersion: "v", Rollouts: dup}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("%v", err)
	}
	if _, err := g.Discover(ctx, DiscoveryRequest{Rollouts: discoverSample()}); err == nil {
		t.Fatal("accepted a request without environment")
	}
	if len(srv.Requests()) != 0 {
		t.Fatal("called the model for an invalid request")
	}
	// Cut to MaxRollouts, alternating failures and successes.
	var rs []*schemas.Rollout
	for i := range 6 {
		rs = append(rs, llmTestRollout(fmt.Sprintf("f%d", i), false))
	}
	rs = append(rs, llmTestRollout("s0", true), llmTestRollout("s1", true))
	got, err := g.sample(rs)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range got {
		ids = append(ids, r.RolloutID)
	}
	if strings.Join(ids, ",") != "f0,s0,f1,s1" {
		t.Fatalf("%v", ids)
	}
}

func TestNeedsDiscovery(t *testing.T) {
	for _, tt := range []struct {
		name                     string
		has                      bool
		failures, withoutLacking int
		threshold                float64
		want                     bool
	}{
		{"no dictionary", false, 0, 0, 0.5, true},
		{"no dictionary, failures", false, 10, 0, 0.5, true},
		{"no failures", true, 0, 0, 0.5, false},
		{"all explained", true, 100, 0, 0.5, false},
		{"half unexplained is not more than half", true, 100, 50, 0.5, false},
		{"just over", true, 100, 51, 0.5, true},
		{"all unexplained", true, 10, 10, 0.5, true},
		{"threshold 0: any unexplained", true, 100, 1, 0, true},
		{"threshold 0: none unexplained", true, 100, 0, 0, false},
		{"threshold 1 never fires", true, 10, 10, 1, false},
		{"count above failures is clamped", true, 10, 30, 0.9, true},
		{"negative count is clamped", true, 10, -5, 0, false},
		{"negative failures", true, -1, 0, 0.5, false},
	} {
		if got := NeedsDiscovery(tt.has, tt.failures, tt.withoutLacking, tt.threshold); got != tt.want {
			t.Errorf("%s: NeedsDiscovery(%v, %d, %d, %v) = %v", tt.name, tt.has, tt.failures, tt.withoutLacking, tt.threshold, got)
		}
	}
}

func TestCountSentences(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int
	}{
		{"", 0},
		{"One sentence", 1},
		{"One sentence.", 1},
		{"One. Two.", 2},
		{"One! Two? Three.", 3},
		{"It costs 1.5 dollars. Then stop", 2},
		{"Use tools, e.g. search, before acting. Otherwise it is LACKING.", 2},
		{"Really?! Yes.", 2},
		{"A.\nB.\nC.\nD.", 4},
	} {
		if got := countSentences(tt.in); got != tt.want {
			t.Errorf("countSentences(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

// TestDiscoverRealModel runs discovery against a real model
// (scripts/llm-server.sh). Protocol only: the result is a valid dictionary
// or a clean ErrDiscoveryFailed, and answered attempts carry token counts.
func TestDiscoverRealModel(t *testing.T) {
	baseURL, model := llmtest.RealServer(t)
	rec := &llm.BufferRecorder{}
	client, err := llm.New(llm.Config{BaseURL: baseURL, Model: model, Recorder: rec,
		StructuredOutput: llm.StructuredJSONObjectSchema, Timeout: 5 * time.Minute, MaxAttempts: 2,
		BackoffInitial: 100 * time.Millisecond, BackoffMax: time.Second, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewDiscoverer(client, DiscoverConfig{MaxTokens: 700, MaxTranscriptChars: 1500})
	if err != nil {
		t.Fatal(err)
	}
	sample := discoverSample()[:4]
	start := time.Now()
	d, err := g.Discover(context.Background(), DiscoveryRequest{Environment: "airline", AgentVersion: "v1", Rollouts: sample})
	elapsed := time.Since(start)
	switch {
	case err == nil:
		if verr := d.Validate(); verr != nil || d.Version != 1 || d.Source != "discovery" {
			t.Fatalf("accepted an invalid dictionary: %v %+v", verr, d)
		}
		for _, c := range d.Capabilities {
			t.Logf("proposed %s: %s (examples %v)", c.Name, c.Definition, c.Examples)
		}
	case errors.Is(err, ErrDiscoveryFailed):
		if d != nil {
			t.Fatal("a failed discovery returned a dictionary")
		}
		t.Logf("discovery failed cleanly: %v", err)
	default:
		t.Fatalf("unexpected error: %v", err)
	}
	calls := rec.Drain()
	var lat []float64
	answered := 0
	for _, c := range calls {
		if c.Purpose != PurposeDiscover {
			t.Fatalf("audit %+v", c)
		}
		switch c.Outcome {
		case "ok", "schema", "invalid_json":
			answered++
			if c.PromptTokens == 0 || c.CompletionTokens == 0 {
				t.Fatalf("answered attempt without tokens: %+v", c)
			}
		}
		lat = append(lat, float64(c.LatencyMS))
	}
	if answered == 0 {
		t.Fatalf("the server answered none of %d attempts %v", len(calls), auditOutcomes(calls))
	}
	sort.Float64s(lat)
	pct := func(p float64) float64 { return lat[min(len(lat)-1, int(math.Ceil(p*float64(len(lat))))-1)] }
	t.Logf("model %s: %d attempts %v in %v; attempt latency p50 %.0f ms, p99 %.0f ms",
		model, len(calls), auditOutcomes(calls), elapsed.Round(time.Millisecond), pct(0.5), pct(0.99))
}

// TestNoFailureWait: a scope asked to be discovered with no failure stored
// is looked at again after 2 s, then after twice as long each time, up to
// the check interval (it was every 2 s for as long as the agent version
// did not fail: a SampleRollouts query every 2 s per healthy scope).
func TestNoFailureWait(t *testing.T) {
	var got []time.Duration
	w := time.Duration(0)
	for range 8 {
		w = noFailureWait(w, time.Minute)
		got = append(got, w)
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute, time.Minute}
	if !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
	if w := noFailureWait(0, 500*time.Millisecond); w != 500*time.Millisecond {
		t.Errorf("an interval under 2 s bounds the first wait: %v", w)
	}
}
