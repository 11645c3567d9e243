package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/simpolicy"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
	"github.com/traceops/trace/synthesizer/calibrate"
)

func simulatedFleet(env, agentVersion, capability string) (calibrate.Policy, error) {
	return simpolicy.SimulatedFleetPolicy(simulate.DefaultFleet(), env, agentVersion, capability)
}

// TestSynthesizeRole runs `trace run --roles synthesize` on real NATS and
// ClickHouse, with templates and the simulated policy: a synthesis request
// delivered twice (two messages, as a publisher that missed the duplicate
// window would send), then the process restarted and the request delivered
// once more, yields one environment, DONE, announced once on
// trace.environments.ready.
func TestSynthesizeRole(t *testing.T) {
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	cfg, err := config.Load("", []string{"data_dir=" + t.TempDir(), "roles=synthesize", "http.addr=127.0.0.1:0",
		"clickhouse.addr=" + ch.Addr, "clickhouse.database=" + ch.Database, "nats.url=" + ns.URL(),
		"synthesizer.policy=simulated", "synthesizer.calibration.seeds=30", "synthesizer.calibration.rollouts=8"})
	if err != nil {
		t.Fatal(err)
	}
	start := func() func() {
		ctx, cancel := context.WithCancel(context.Background())
		a, err := app.Start(ctx, cfg, slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
		if err != nil {
			t.Fatal(err)
		}
		a.Simulated = simulatedFleet
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
			a.Close()
		}
	}
	ctx := context.Background()
	b, err := bus.Connect(ctx, bus.Config{URL: ns.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	req := &schemas.SynthesisRequest{TriggerID: "sim-airline/1.4.0/v1/precondition_verification/1", Environment: simulate.Airline, AgentVersion: "1.4.0",
		DictionaryVersion: 1, Epoch: 1, Rank: 1, Tools: simulate.Tools(simulate.Airline), FiredAt: time.Now().UTC(),
		Capability: schemas.SelectedCapability{Skill: "precondition_verification", Description: "Look before a write.", MeanDelta: 0.4,
			NRunsPassed: 1, NRunsTotal: 1, PassesConsistency: true, ExampleFailedCases: []string{}, Status: "selected"}}
	again := func(msgID string) {
		data, _ := json.Marshal(req)
		if _, err := b.JS.Publish(ctx, bus.SynthesisSubject(req.Environment, req.Capability.Skill), data, jetstream.WithMsgID(msgID)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.PublishSynthesis(ctx, req); err != nil {
		t.Fatal(err)
	}
	again("late-duplicate-1")
	stop := start()
	store := synthesizer.SinkStore{Rows: ch.Store()}
	id := schemas.EnvironmentID(req.TriggerID)
	waitEnv := func(what string, ok func(es []*synthesizer.Environment) bool) []*synthesizer.Environment {
		deadline := time.Now().Add(60 * time.Second)
		for {
			es, err := store.List(ctx, sink.EnvironmentFilter{Full: true})
			if err == nil && ok(es) {
				return es
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %v %+v", what, err, es)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	es := waitEnv("DONE", func(es []*synthesizer.Environment) bool {
		return len(es) == 1 && es[0].Status == synthesizer.StatusDone
	})
	stop()
	stop = start()
	again("late-duplicate-2")
	// Wait until the restarted role has handled (acknowledged) everything,
	// the late duplicate included, before stopping it.
	handled := time.Now().Add(60 * time.Second)
	for {
		c, err := b.JS.Consumer(ctx, bus.StreamSynthesis, bus.DurableSynthesizer)
		if err == nil {
			if info, err := c.Info(ctx); err == nil && info.NumAckPending == 0 && info.NumPending == 0 && info.Delivered.Stream >= 3 {
				break
			}
		}
		if time.Now().After(handled) {
			t.Fatal("the restarted synthesize role did not handle the late duplicate within 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	es = waitEnv("still one", func(es []*synthesizer.Environment) bool { return len(es) == 1 })
	e := es[0]
	if e.ID != id || e.Status != synthesizer.StatusDone || e.Path != synthesizer.PathTemplate || e.Calibration == nil || !e.Calibration.Simulated {
		t.Fatalf("%+v", e)
	}
	accepted := 0
	for _, a := range e.Attempts {
		if a.Accepted {
			accepted++
		}
	}
	if accepted != 1 {
		t.Fatalf("%d accepted attempts", accepted)
	}
	ready, err := b.ReadyEnvironments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ready) != 1 || ready[0].EnvironmentID != id || ready[0].Program.Hash != e.ProgramHash || !ready[0].Calibration.Simulated ||
		ready[0].Fetch.Path != "/api/environments/"+id+"/program" {
		t.Fatalf("ready %+v", ready)
	}
	c, err := b.SynthesisConsumer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.NumAckPending != 0 || info.NumPending != 0 {
		t.Fatalf("requests left unacknowledged: %+v %v", info, err)
	}
}

// TestSynthesizeRolePolicyCallsAudited: with a cohort's policy model
// (synthesizer.policies) and no other LLM in the process (rules labeler,
// no llm.base_url: the templates write the environments), every call of
// the calibration is audited in llm_calls.
func TestSynthesizeRolePolicyCallsAudited(t *testing.T) {
	ch := testenv.ClickHouse(t)
	policy := llmtest.New(t)
	policy.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text("I cannot help with that.") })
	f := filepath.Join(t.TempDir(), "trace.yaml")
	if err := os.WriteFile(f, []byte(fmt.Sprintf("synthesizer:\n  policies:\n    - {environment: %q, agent_version: \"*\", base_url: %q, model: %q}\n",
		simulate.Airline, policy.URL, policy.Model)), 0o644); err != nil {
		t.Fatal(err)
	}
	synthesizeOne(t, ch, f, "synthesizer.calibration.seeds=2", "synthesizer.calibration.rollouts=2", "synthesizer.max_attempts=1")
	var n uint64
	if err := testenv.StoreConn(t, ch.Store()).QueryRow(context.Background(), "SELECT count() FROM llm_calls WHERE model = ?", policy.Model).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if calls := len(policy.Requests()); calls == 0 || n != uint64(calls) {
		t.Fatalf("llm_calls has %d rows for the policy's %d calls", n, calls)
	}
}

// TestSynthesizeRoleProgramLimits: the synthesize role validates programs
// under the programs: limits. At programs.max_steps 500, fewer than the
// template's reset takes, its attempt fails on the step limit (at 50,000
// it passes validation).
func TestSynthesizeRoleProgramLimits(t *testing.T) {
	ch := testenv.ClickHouse(t)
	e := synthesizeOne(t, ch, "", "programs.max_steps=500", "synthesizer.policy=simulated", "synthesizer.max_attempts=1")
	// The template path failed; without a generation model the LLM path
	// waits for one.
	if e.Status != synthesizer.StatusWaitingForLLM || len(e.Attempts) != 1 {
		t.Fatalf("status %s after %d attempts, want WAITING_FOR_LLM after 1", e.Status, len(e.Attempts))
	}
	for _, a := range e.Attempts {
		if !strings.Contains(a.Diagnosis, "more than 500 execution steps") {
			t.Errorf("attempt %d (stage %s): diagnosis %.300q, want the step limit", a.N, a.Stage, a.Diagnosis)
		}
	}
}

// synthesizeOne runs the synthesize role (configuration file f, if any,
// and sets) on one synthesis request until the role is done with its
// environment (DONE, FAILED, or WAITING_FOR_LLM), and returns it.
func synthesizeOne(t *testing.T, ch *testenv.CH, f string, sets ...string) *synthesizer.Environment {
	t.Helper()
	ns := testenv.NATS(t)
	cfg, err := config.Load(f, append([]string{"data_dir=" + t.TempDir(), "roles=synthesize", "http.addr=127.0.0.1:0",
		"clickhouse.addr=" + ch.Addr, "clickhouse.database=" + ch.Database, "nats.url=" + ns.URL()}, sets...))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := app.Start(ctx, cfg, slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.Simulated = simulatedFleet
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	b, err := bus.Connect(ctx, bus.Config{URL: ns.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.PublishSynthesis(ctx, &schemas.SynthesisRequest{TriggerID: "sim-airline/1.4.0/v1/precondition_verification/1",
		Environment: simulate.Airline, AgentVersion: "1.4.0", DictionaryVersion: 1, Epoch: 1, Rank: 1, Tools: simulate.Tools(simulate.Airline),
		FiredAt: time.Now().UTC(), Capability: schemas.SelectedCapability{Skill: "precondition_verification", Description: "Look before a write.",
			MeanDelta: 0.4, NRunsPassed: 1, NRunsTotal: 1, PassesConsistency: true, ExampleFailedCases: []string{}, Status: "selected"}}); err != nil {
		t.Fatal(err)
	}
	// Wait for the environment to end, then stop: every call of its
	// calibration is in llm_calls.
	store := synthesizer.SinkStore{Rows: ch.Store()}
	deadline := time.Now().Add(60 * time.Second)
	var e *synthesizer.Environment
	for {
		es, err := store.List(ctx, sink.EnvironmentFilter{Full: true})
		if err == nil && len(es) == 1 && slices.Contains([]synthesizer.Status{synthesizer.StatusDone, synthesizer.StatusFailed, synthesizer.StatusWaitingForLLM}, es[0].Status) {
			e = es[0]
			break
		}
		if time.Now().After(deadline) {
			for _, e := range es {
				t.Logf("%s %s: %d attempts", e.ID, e.Status, len(e.Attempts))
			}
			t.Fatalf("the environment did not end within 60 s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	return e
}
