package simpolicy

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/traceops/trace/internal/dev/envtest"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/synthesizer/calibrate"
	"github.com/traceops/trace/synthesizer/envprog"
)

func tc(name, args string) envprog.Action {
	return envprog.Action{ToolCalls: []envprog.ToolCall{{ID: name, Name: name, Arguments: json.RawMessage(args)}}}
}

func names(steps []envprog.Action) []string {
	var out []string
	for _, s := range steps {
		if len(s.ToolCalls) == 0 {
			out = append(out, "final")
			continue
		}
		var args map[string]any
		_ = json.Unmarshal(s.ToolCalls[0].Arguments, &args)
		out = append(out, s.ToolCalls[0].Name+":"+args["reservation_id"].(string))
	}
	return out
}

// always / never are lacking() draws.
func always() bool { return true }
func never() bool  { return false }

func TestSkipVerification(t *testing.T) {
	ref := []envprog.Action{
		tc("get_reservation_details", `{"reservation_id":"AAA111"}`),
		tc("cancel_reservation", `{"reservation_id":"AAA111"}`),
		tc("get_reservation_details", `{"reservation_id":"BBB222"}`), // its check failed: no write
		{Content: "Cancelled AAA111; BBB222 cannot be cancelled."},
	}
	if got := names(skipVerification(flatten(ref), never, true)); !reflect.DeepEqual(got, names(ref)) {
		t.Errorf("never lacking changed the plan: %v", got)
	}
	// Lacking everywhere: no reads, and BBB222 is cancelled blindly with the
	// reference's own write of AAA111.
	got := skipVerification(flatten(ref), always, true)
	want := []string{"cancel_reservation:AAA111", "cancel_reservation:BBB222", "final"}
	if !reflect.DeepEqual(names(got), want) {
		t.Errorf("lacking plan %v, want %v", names(got), want)
	}
	if !strings.HasSuffix(got[1].ToolCalls[0].ID, "-unchecked") {
		t.Errorf("the blind write's id %q", got[1].ToolCalls[0].ID)
	}
}

func TestStopEarly(t *testing.T) {
	ref := flatten([]envprog.Action{
		tc("cancel_reservation", `{"reservation_id":"A"}`),
		tc("get_reservation_details", `{"reservation_id":"B"}`),
		tc("update_reservation_baggages", `{"reservation_id":"B"}`),
		tc("cancel_reservation", `{"reservation_id":"C"}`),
		{Content: "All done."},
	})
	if got := names(stopEarly(ref, always)); !reflect.DeepEqual(got, []string{"cancel_reservation:A", "get_reservation_details:B", "final"}) {
		t.Errorf("lacking: %v (the first write stays, the rest goes, the answer stays)", got)
	}
	if got := names(stopEarly(ref, never)); len(got) != 5 {
		t.Errorf("never lacking: %v", got)
	}
}

func TestInventIDAndMutate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, id := range []string{"#W1234567", "ZFA04Y", "credit_card_7815826", "emma_kim_9957"} {
		m := mutate(rng, id)
		if m == id || len(m) != len(id) || (strings.HasPrefix(id, "#W") && !strings.HasPrefix(m, "#W")) {
			t.Errorf("mutate(%q) = %q", id, m)
		}
	}
	args := json.RawMessage(`{"order_id":"#W1234567","reason":"no longer needed"}`)
	var got map[string]any
	_ = json.Unmarshal(inventID(rng, args), &got)
	if got["order_id"] == "#W1234567" || got["reason"] != "no longer needed" {
		t.Errorf("inventID changed %v", got)
	}
	if string(inventID(rng, json.RawMessage(`{"reason":"no longer needed"}`))) != `{"reason":"no longer needed"}` {
		t.Error("inventID changed arguments without an identifier")
	}
}

func TestBotchFinalAndToolErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	steps := []envprog.Action{tc("x", `{}`), {Content: "Answer: 1250 for ZFA04Y"}}
	out := botchFinal(steps, rng)
	if out[1].Content == steps[1].Content || !strings.HasPrefix(out[1].Content, "Answer: ") || steps[1].Content != "Answer: 1250 for ZFA04Y" {
		t.Errorf("botched %q (input now %q)", out[1].Content, steps[1].Content)
	}
	if got := botchFinal([]envprog.Action{{Content: "All good."}}, rng); got[0].Content != "Done." {
		t.Errorf("an answer without ids became %q", got[0].Content)
	}
	msgs := []envprog.Message{
		{Role: "system"}, {Role: "user"},
		{Role: "assistant"}, {Role: "tool", Content: "Error: reservation not found"},
		{Role: "assistant"}, {Role: "tool", Content: `{"status":"active"}`}, {Role: "tool", Content: `{"error": "service unavailable"}`},
	}
	if n, last := toolErrors(msgs); n != 2 || !last {
		t.Errorf("toolErrors = %d, %v; want 2, true", n, last)
	}
	if n, last := toolErrors(msgs[:6]); n != 1 || last {
		t.Errorf("toolErrors = %d, %v; want 1, false", n, last)
	}
}

func TestSimulatedPolicyOnGoEnv(t *testing.T) {
	agent := simulate.AgentSpec{Name: "support-bot", Version: "1.4.0", Environments: []string{simulate.Airline},
		Deficits: map[string]float64{simulate.MultiStepCompletion: 0.5}}
	p := NewSimulatedPolicy(agent, simulate.Airline, simulate.MultiStepCompletion)
	if !strings.HasPrefix(p.String(), "simulated sim-airline/1.4.0") || !strings.Contains(p.String(), "lacking at 0.50") || !p.Simulated() {
		t.Errorf("String %q", p)
	}
	cfg := smallConfig()
	a, err := calibrate.Run(context.Background(), &envtest.Ledger{}, p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := calibrate.Run(context.Background(), &envtest.Ledger{}, p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Groups, b.Groups) {
		t.Error("two runs of the simulated policy differ")
	}
	s := a.Summary
	if !s.Simulated || !strings.HasPrefix(s.Policy, "simulated ") {
		t.Errorf("summary not labeled simulated: %s", s)
	}
	// Hints halve the deficit: hinted rollouts succeed more often.
	if s.HintedSuccessRate <= s.UnhintedSuccessRate {
		t.Errorf("hinted success %.2f ≤ unhinted %.2f", s.HintedSuccessRate, s.UnhintedSuccessRate)
	}
	// No deficit, no base failure: the reference every time.
	p.Agent.Deficits = nil
	p.BaseFailure = 0
	res, err := calibrate.Run(context.Background(), &envtest.Ledger{}, p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Summary.SuccessRate != 1 || !strings.Contains(p.String(), "not lacking") {
		t.Errorf("without a deficit: %s (%s)", res.Summary, p)
	}
	if _, err := SimulatedFleetPolicy(simulate.DefaultFleet(), simulate.Retail, "1.4.0", simulate.ArgumentGrounding); err == nil {
		t.Error("found an agent version that does not serve the environment")
	}
}

func TestUnconfirmedWriteAndSkippedReads(t *testing.T) {
	ref := flatten([]envprog.Action{
		tc("get_reservation_details", `{"reservation_id":"AAA111"}`),
		tc("cancel_reservation", `{"reservation_id":"AAA111"}`),
		tc("get_reservation_details", `{"reservation_id":"BBB222"}`), // not confirmed: left alone
		{Content: "Done: AAA111. Shall I cancel BBB222? Do you confirm?"},
	})
	got := names(skipVerification(ref, always, false))
	want := []string{"get_reservation_details:AAA111", "cancel_reservation:AAA111", "get_reservation_details:BBB222", "cancel_reservation:BBB222", "final"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("unconfirmed write: %v, want %v", got, want)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	reads := flatten([]envprog.Action{
		tc("get_user_details", `{"user_id":"emma_kim_9957"}`),
		tc("get_reservation_details", `{"reservation_id":"AAA111"}`),
		tc("get_reservation_details", `{"reservation_id":"BBB222"}`),
		{Content: "Answer: 1040"},
	})
	out := skipReads(reads, always, rng)
	if len(out) != 2 || out[1].Content == "Answer: 1040" {
		t.Errorf("skipped reads: %+v", out)
	}
	if out := skipReads(reads, never, rng); len(out) != 4 || out[3].Content != "Answer: 1040" {
		t.Errorf("never lacking: %+v", out)
	}
}

func smallConfig() calibrate.Config {
	c := calibrate.DefaultConfig()
	c.Seeds, c.Rollouts = 40, 16
	return c
}
