package calibrate

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/envtest"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/synthesizer/envprog"
)

var askRE = regexp.MustCompile(`(T\d{4}) to (low|high)`)

// ledgerModel is a scripted model for the ledger environment served over
// the OpenAI protocol: on the user's message it calls set_todo_priority for
// each requested change (all in one turn, or only the first when lazy is
// set), and after tool results it answers naming the to-dos.
func ledgerModel(t *testing.T, lazy func(req llmtest.Request) bool) llmtest.Handler {
	return func(req llmtest.Request) llmtest.Reply {
		c, err := req.ToolsChat()
		if err != nil || len(c.Messages) < 2 || len(c.Tools) != 2 {
			return llmtest.Status(http.StatusBadRequest, "not a tools conversation")
		}
		last := c.Messages[len(c.Messages)-1]
		user := *c.Messages[1].Content
		asks := askRE.FindAllStringSubmatch(user, -1)
		if last.Role == "tool" {
			var ids []string
			for _, a := range asks {
				ids = append(ids, a[1])
			}
			return llmtest.Text("Done: " + strings.Join(ids, ", "))
		}
		var calls []llmtest.Call
		for i, a := range asks {
			calls = append(calls, llmtest.Call{ID: "c" + a[1], Name: "set_todo_priority", Arguments: map[string]string{"todo_id": a[1], "priority": a[2]}})
			if i == 0 && lazy != nil && lazy(req) {
				break
			}
		}
		return llmtest.ToolCalls("", calls...)
	}
}

func TestOpenAIPolicyCalibrates(t *testing.T) {
	srv := llmtest.New(t)
	var mu sync.Mutex
	hinted := 0
	// The model does the whole job when the hint is in its system prompt,
	// and only the first change otherwise.
	srv.Handle(ledgerModel(t, func(req llmtest.Request) bool {
		c, _ := req.ToolsChat()
		h := strings.Contains(*c.Messages[0].Content, envprog.HintOpen)
		if h {
			mu.Lock()
			hinted++
			mu.Unlock()
		}
		return !h
	}))
	rec := &llm.BufferRecorder{}
	client, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "policy-model", Recorder: rec, BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Seeds, cfg.Rollouts = 8, 8
	res, err := Run(context.Background(), &envtest.Ledger{}, NewOpenAIPolicy(client, "ledger"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := res.Summary
	if s.Simulated || s.Policy != "openai policy-model" || strings.Contains(s.String(), "SIMULATED") {
		t.Errorf("a model's calibration is labeled %q (simulated %v)", s.Policy, s.Simulated)
	}
	// Hinted rollouts succeed (reward 1), the others do one of 2–3 changes.
	for gi, g := range res.Groups {
		for ri, r := range g.Rewards {
			if g.Hinted[ri] != (r == 1) {
				t.Errorf("seed %d rollout %d: hinted %v, reward %v", g.Seed, ri, g.Hinted[ri], r)
			}
			if res.Rollouts[gi][ri].Turns != 2 {
				t.Errorf("seed %d rollout %d: %d turns, want 2 (calls, then the answer)", g.Seed, ri, res.Rollouts[gi][ri].Turns)
			}
		}
	}
	if s.HintedRollouts == 0 || hinted != s.HintedRollouts {
		t.Errorf("%d hinted first turns for %d hinted rollouts", hinted, s.HintedRollouts)
	}
	reqs := srv.Requests()
	if len(reqs) != 2*cfg.Seeds*cfg.Rollouts {
		t.Fatalf("%d requests, want %d", len(reqs), 2*cfg.Seeds*cfg.Rollouts)
	}
	withHint := 0
	for _, r := range reqs {
		c, _ := r.ToolsChat()
		if strings.Contains(*c.Messages[0].Content, envprog.HintOpen) {
			withHint++
		}
		if c.Temperature == nil || *c.Temperature != 0.7 || c.Model != "policy-model" {
			t.Fatalf("request temperature %v model %q", c.Temperature, c.Model)
		}
		if len(c.Messages) == 4 && (c.Messages[2].Role != "assistant" || len(c.Messages[2].ToolCalls) == 0 || c.Messages[3].Role != "tool" || c.Messages[3].ToolCallID == "") {
			t.Fatalf("second turn did not carry the first turn's calls and results: %+v", c.Messages)
		}
	}
	if withHint != 2*s.HintedRollouts {
		t.Errorf("%d requests carried the hint, want both turns of %d hinted rollouts", withHint, s.HintedRollouts)
	}
	calls := rec.Drain()
	if len(calls) != len(reqs) || calls[0].Purpose != "calibrate" || !strings.HasPrefix(calls[0].RolloutID, "ledger/") {
		t.Errorf("%d audit rows for %d requests; first %+v", len(calls), len(reqs), calls[0])
	}
}

func TestOpenAIPolicyFailureStopsCalibration(t *testing.T) {
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.ServerError() })
	client, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "m", MaxAttempts: 2, BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Seeds, cfg.Rollouts = 2, 2
	_, err = Run(context.Background(), &envtest.Ledger{}, NewOpenAIPolicy(client, "x"), cfg)
	var le *llm.Error
	var re *RolloutError
	if !errors.As(err, &le) || !errors.As(err, &re) || le.Attempts != 2 {
		t.Fatalf("error %v, want a RolloutError wrapping the client's llm.Error", err)
	}
}

// The shipped example environment played over the protocol: the policy's
// calls reach the Starlark program and its answers come back as tool
// results.
func TestOpenAIPolicyOnExampleEnvironment(t *testing.T) {
	env := loadExample(t)
	srv := llmtest.New(t)
	srv.Handle(func(req llmtest.Request) llmtest.Reply {
		c, _ := req.ToolsChat()
		last := c.Messages[len(c.Messages)-1]
		if last.Role == "tool" {
			if last.Content == nil || !strings.Contains(*last.Content, "Error: reservation not found") {
				return llmtest.Status(http.StatusBadRequest, "unexpected tool result")
			}
			return llmtest.Text("I could not find it.")
		}
		return llmtest.ToolCalls("", llmtest.Call{ID: "x", Name: "get_reservation_details", Arguments: map[string]string{"reservation_id": "NOPE00"}})
	})
	client, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Seeds, cfg.Rollouts = 3, 2
	res, err := Run(context.Background(), env, NewOpenAIPolicy(client, "example"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Summary.Verdict != TooHard || len(srv.Requests()) != 12 {
		t.Errorf("%s after %d requests", res.Summary, len(srv.Requests()))
	}
}
