package synthesizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/simpolicy"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer/calibrate"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/examples"
	"github.com/traceops/trace/synthesizer/templates"
)

// airlineRequest is a synthesis request of the simulated airline fleet
// for precondition_verification, with the simulated airline tools (the
// τ²-bench airline names, parameters and types).
func airlineRequest(trigger string) *schemas.SynthesisRequest {
	r := testRequest(trigger)
	r.Environment = simulate.Airline
	r.Tools = simulate.Tools(simulate.Airline)
	return r
}

// TestGenerationPathOnTheRuntime is the generation path of issue 13 on the
// real runtime, validation and calibration: the model first answers a
// program with a syntax error, then one that fails a validation check (a
// tool the target does not have), then the shipped example environment.
// The repair prompts carry each diagnosis as envprog worded it, the
// programs run sandboxed, and the accepted one is calibrated by a scripted
// policy of 40 % skill.
func TestGenerationPathOnTheRuntime(t *testing.T) {
	example := string(examples.PreconditionAirline)
	broken := strings.Replace(example, "def _z(n, width):", "def _z(n, width)", 1)
	foreign := strings.Replace(example, `"cancel_reservation"`, `"cancel_booking"`, -1)
	if broken == example || foreign == example {
		t.Fatal("the example changed: the test's edits no longer apply")
	}
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.Text(fenced(broken)), llmtest.Text(fenced(foreign)), llmtest.Text("```starlark\n"+example+"```"))
	gen, rec := newTestGenerator(t, srv)
	cfg := calibrate.DefaultConfig()
	store, pub := newMemStore(), &memPublisher{}
	stage, err := NewStage(Config{LLM: gen, Validator: EnvValidator{}, Store: store, Publisher: pub,
		Calibrators: func(*Job) (Calibrator, error) {
			return PolicyCalibrator{Policy: calibrate.SkillPolicy{Skill: 0.4}, Config: cfg}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e, err := stage.Synthesize(context.Background(), airlineRequest("trig-runtime"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("three attempts, sandboxed validation and a 100 × 16 calibration in %v", time.Since(start).Round(time.Millisecond))
	if e.Status != StatusDone || len(e.Attempts) != 3 {
		t.Fatalf("%s after %d attempts: %q", e.Status, len(e.Attempts), e.Diagnoses)
	}
	a1, a2, a3 := e.Attempts[0], e.Attempts[1], e.Attempts[2]
	if a1.Stage != StageValidate || a1.Validation.OK || a1.Validation.Checks[0].Name != envprog.CheckLoad || a1.Validation.Checks[0].Verdict != Fail {
		t.Fatalf("attempt 1: %+v", a1.Validation)
	}
	if a2.Stage != StageValidate || a2.Validation.OK || !strings.Contains(a2.Diagnosis, envprog.CheckTools) || !strings.Contains(a2.Diagnosis, "cancel_booking") {
		t.Fatalf("attempt 2: %s", a2.Diagnosis)
	}
	if !a3.Accepted || !a3.Validation.OK || a3.Calibration == nil || !a3.Calibration.Accepted || !a3.Calibration.Simulated {
		t.Fatalf("attempt 3: %+v", a3)
	}
	reqs := srv.Requests()
	if len(reqs) != 3 {
		t.Fatalf("%d generation requests", len(reqs))
	}
	if p := reqs[1].Chat.Messages[0].Content; !strings.Contains(p, a1.Validation.Diagnosis()) || !strings.Contains(p, "does not load") {
		t.Errorf("the second prompt lacks the load diagnosis %q", a1.Validation.Diagnosis())
	}
	if p := reqs[2].Chat.Messages[0].Content; !strings.Contains(p, esc(strings.TrimPrefix(a2.Diagnosis, "validation: "))) || !strings.Contains(p, esc(a1.Validation.Diagnosis())) {
		t.Errorf("the third prompt lacks a diagnosis:\n%s", p)
	}
	c := e.Calibration
	if c.Seeds != 100 || c.RolloutsPerSeed != 16 || c.PassAtK["16"] < c.PassAtK["1"] || len(c.Histogram) != HistogramBins || c.Policy != "scripted-skill-0.40" {
		t.Fatalf("calibration %+v", c)
	}
	sum := 0
	for _, n := range c.Histogram {
		sum += n
	}
	if sum != 1600 {
		t.Fatalf("histogram counts %d rollouts", sum)
	}
	if len(e.Tools) != 4 || e.Rationale == "" || len(rec.Drain()) != 3 {
		t.Fatalf("tools %v, rationale %q", e.Tools, e.Rationale)
	}
	if m := pub.msgs[0]; m.Program.Hash != ProgramHash(example+"\n") && m.Program.Hash != e.ProgramHash {
		t.Fatalf("announced hash %s", m.Program.Hash)
	}
}

// TestTemplatePathWithTheSimulatedPolicy: no model; the capability's family
// template is instantiated for the simulated airline tools, validated, and
// calibrated by the simulated policy of the fleet's agent version that
// lacks the capability, tuned until it lands in the bands.
func TestTemplatePathWithTheSimulatedPolicy(t *testing.T) {
	cfg := calibrate.DefaultConfig()
	cfg.Seeds, cfg.Rollouts = 50, 8
	store, pub := newMemStore(), &memPublisher{}
	stage, err := NewStage(Config{Templates: TemplateAuthor{Bands: cfg.Bands}, Families: TemplateFamilies{}, Validator: EnvValidator{},
		Store: store, Publisher: pub,
		Calibrators: func(j *Job) (Calibrator, error) {
			p, err := simpolicy.SimulatedFleetPolicy(simulate.DefaultFleet(), j.Request.Environment, j.Request.AgentVersion, j.Request.Capability.Skill)
			if err != nil {
				return nil, err
			}
			return PolicyCalibrator{Policy: p, Config: cfg}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := stage.Synthesize(context.Background(), airlineRequest("trig-template-sim"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range e.Attempts {
		t.Logf("attempt %d knobs %s: %s", a.N, a.Knobs, a.Diagnosis)
	}
	if e.Status != StatusDone || e.Path != PathTemplate || e.Family != templates.PreconditionVerification || !e.Calibration.Simulated ||
		!strings.HasPrefix(e.Calibration.Policy, "simulated") {
		t.Fatalf("%s %s %q: %q; %+v", e.Status, e.Path, e.Family, e.Reason, e.Calibration)
	}
	if e.FamilySource != FamilyMatched || !strings.Contains(e.FamilyWhy, "named after the precondition_verification family") {
		t.Errorf("family found by %q: %q", e.FamilySource, e.FamilyWhy)
	}
	if m := pub.msgs[0]; m.Program.Origin != schemas.OriginTemplate || !m.Calibration.Simulated {
		t.Fatalf("%+v", m)
	}
}

func TestDictionaryFamiliesAreTheTemplates(t *testing.T) {
	if got, want := strings.Join(templates.Names(), ","), strings.Join(analyzer.TemplateFamilies, ","); got != want {
		t.Fatalf("templates %s, analyzer.TemplateFamilies %s", got, want)
	}
}

// simulatedFleet is Deps.Simulated over the simulated fleet.
func simulatedFleet(env, agentVersion, capability string) (calibrate.Policy, error) {
	return simpolicy.SimulatedFleetPolicy(simulate.DefaultFleet(), env, agentVersion, capability)
}

// TestCalibrationLogsItsProgress: a calibration that runs longer than
// ProgressEvery logs how far it is (rollouts played of all) for its
// environment, as the stage saves it in the record, so the log too shows
// a model's hours-long calibration move.
func TestCalibrationLogsItsProgress(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	skill := calibrate.SkillPolicy{Skill: 0.4}
	slow := calibrate.PolicyFunc(func(ctx context.Context, turn calibrate.Turn) (envprog.Action, error) {
		time.Sleep(2 * time.Millisecond)
		return skill.Act(ctx, turn)
	})
	cfg := calibrate.DefaultConfig()
	cfg.Seeds, cfg.Rollouts = 8, 4
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(fenced(string(examples.PreconditionAirline))) })
	gen, _ := newTestGenerator(t, srv)
	stage, err := NewStage(Config{LLM: gen, Validator: EnvValidator{}, Store: newMemStore(), Log: log, ProgressEvery: 20 * time.Millisecond,
		Calibrators: func(*Job) (Calibrator, error) { return PolicyCalibrator{Policy: slow, Config: cfg}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	e, err := stage.Synthesize(context.Background(), airlineRequest("trig-progress-log"))
	if err != nil || e.Calibration == nil || e.Calibration.Seeds != 8 {
		t.Fatalf("calibration %+v: %v", e, err)
	}
	out := buf.String()
	if !strings.Contains(out, "synthesizer: calibrating") || !strings.Contains(out, "id="+e.ID) || !strings.Contains(out, "/32") {
		t.Fatalf("no progress logged:\n%s", out)
	}
	if strings.Contains(out, "rollouts=32/32") {
		t.Errorf("the end is logged as progress:\n%s", out)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCalibrationPolicyRefusalIsAFailedAttempt: a calibration policy that
// refuses the program's play with a 400 (here: the conversation exceeds
// its context) fails the attempt with the refusal as its diagnosis, which
// the repair prompt carries; it is not a transient error, which would
// replay the same program into the same refusal at every delivery and end
// FAILED as "delivered 5 times". A 500 stays transient.
func TestCalibrationPolicyRefusalIsAFailedAttempt(t *testing.T) {
	example := string(examples.PreconditionAirline)
	gen := llmtest.New(t)
	gen.Enqueue(llmtest.Text(fenced(example)), llmtest.Text(fenced(example)))
	g, _ := newTestGenerator(t, gen)
	pol := llmtest.New(t)
	status := 400
	pol.Handle(func(llmtest.Request) llmtest.Reply {
		return llmtest.Status(status, "This model's maximum context length is 2048 tokens; your request has 2301 tokens.")
	})
	client, err := llm.New(llm.Config{BaseURL: pol.URL, Model: "policy-model", MaxAttempts: 2, BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cfg := calibrate.DefaultConfig()
	cfg.Seeds, cfg.Rollouts = 4, 2
	store, pub := newMemStore(), &memPublisher{}
	stage, err := NewStage(Config{LLM: g, Validator: EnvValidator{}, Store: store, Publisher: pub, MaxAttempts: 2,
		Calibrators: func(j *Job) (Calibrator, error) {
			return PolicyCalibrator{Policy: calibrate.NewOpenAIPolicy(client, j.ID), Config: cfg}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := stage.Synthesize(context.Background(), airlineRequest("trig-policy-400"))
	if err != nil {
		t.Fatalf("a refused calibration is a transient error: %v", err)
	}
	if e.Status != StatusFailed || len(e.Attempts) != 2 {
		t.Fatalf("%s after %d attempts: %q", e.Status, len(e.Attempts), e.Diagnoses)
	}
	a := e.Attempts[0]
	if a.Stage != StageCalibrate || a.Calibration == nil || a.Calibration.Verdict != VerdictPolicyRefused ||
		!strings.Contains(a.Diagnosis, "maximum context length") {
		t.Fatalf("attempt 1: stage %s, diagnosis %q", a.Stage, a.Diagnosis)
	}
	if p := gen.Requests()[1].Chat.Messages[0].Content; !strings.Contains(p, "refused a request while playing the program") {
		t.Errorf("the repair prompt lacks the refusal:\n%s", p)
	}

	// A server error is still transient: the request is retried later.
	status = 500
	gen.Enqueue(llmtest.Text(fenced(example)))
	if _, err := stage.Synthesize(context.Background(), airlineRequest("trig-policy-500")); !errors.Is(err, ErrTransient) {
		t.Fatalf("a policy answering 500: %v, want a transient error", err)
	}
}

// recordingStore is a Store that keeps a copy of every record it saves,
// in front of the real one.
type recordingStore struct {
	Store
	mu    sync.Mutex
	saved []Environment
}

func (r *recordingStore) SaveEnvironment(ctx context.Context, e *Environment) error {
	c := *e
	if e.Progress != nil {
		p := *e.Progress
		c.Progress = &p
	}
	r.mu.Lock()
	r.saved = append(r.saved, c)
	r.mu.Unlock()
	return r.Store.SaveEnvironment(ctx, e)
}

func (r *recordingStore) calibrating() []Environment {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Environment
	for _, e := range r.saved {
		if e.Status == StatusCalibrating && e.CalibratingProgress() != nil {
			out = append(out, e)
		}
	}
	return out
}

// TestCalibrationProgressIsInTheRecord: a running calibration's progress
// (rollouts played of all) is saved in the environment's record every
// ProgressEvery, so that trace env list / show and the dashboard show
// more than CALIBRATING for hours; the record in ClickHouse (its details
// column) carries it, listed or loaded, and the DONE record keeps the
// calibration's end. A progress save that finds the environment ended by
// another run stops the calibration there and keeps that run's record.
func TestCalibrationProgressIsInTheRecord(t *testing.T) {
	example := string(examples.PreconditionAirline)
	skill := calibrate.SkillPolicy{Skill: 0.4}
	cfg := calibrate.DefaultConfig()
	cfg.Seeds, cfg.Rollouts, cfg.Concurrency = 8, 4, 2
	var fullTurns int64 // of the calibration that ran to its end
	run := func(t *testing.T, trigger string, onTurn func(*recordingStore)) (*Environment, *recordingStore, SinkStore, int64) {
		var turns atomic.Int64
		srv := llmtest.New(t)
		srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(fenced(example)) })
		gen, _ := newTestGenerator(t, srv)
		sinkStore := chStore(t)
		store := &recordingStore{Store: sinkStore}
		slow := calibrate.PolicyFunc(func(ctx context.Context, turn calibrate.Turn) (envprog.Action, error) {
			turns.Add(1)
			if onTurn != nil {
				onTurn(store)
			}
			time.Sleep(3 * time.Millisecond)
			return skill.Act(ctx, turn)
		})
		stage, err := NewStage(Config{LLM: gen, Validator: EnvValidator{}, Store: store, ProgressEvery: 25 * time.Millisecond,
			Calibrators: func(*Job) (Calibrator, error) { return PolicyCalibrator{Policy: slow, Config: cfg}, nil }})
		if err != nil {
			t.Fatal(err)
		}
		e, err := stage.Synthesize(context.Background(), airlineRequest(trigger))
		if err != nil {
			t.Fatal(err)
		}
		return e, store, sinkStore, turns.Load()
	}

	t.Run("saved", func(t *testing.T) {
		e, store, sinkStore, n := run(t, "trig-progress", nil)
		fullTurns = n
		if e.Status != StatusDone {
			t.Fatalf("%s: %q", e.Status, e.Diagnoses)
		}
		during := store.calibrating()
		if len(during) == 0 {
			t.Fatalf("no CALIBRATING record with progress among %d saves", len(store.saved))
		}
		last := 0
		for _, r := range during {
			p := r.Progress
			if p.Total != 32 || p.Done <= last || p.Done > 32 || p.At.IsZero() || p.At.Before(p.StartedAt) || p.Attempt != 1 {
				t.Fatalf("progress %+v after %d", p, last)
			}
			last = p.Done
			want := fmt.Sprintf("CALIBRATING %d/32 (%d %%)", p.Done, 100*p.Done/32)
			if got := r.StatusText(); got != want {
				t.Fatalf("StatusText %q, want %q", got, want)
			}
		}
		stored, err := sinkStore.LoadEnvironment(context.Background(), e.ID)
		if err != nil || stored == nil {
			t.Fatal(stored, err)
		}
		if p := stored.Progress; p == nil || p.Done != 32 || p.Total != 32 || stored.StatusText() != "DONE" {
			t.Fatalf("stored DONE record's progress %+v, status text %q", p, stored.StatusText())
		}
		// A CALIBRATING row as ClickHouse lists and loads it.
		mid := during[0]
		mid.ID, mid.TriggerID, mid.Version = "env-00000000progress", "trig-progress-mid", 1
		if err := sinkStore.SaveEnvironment(context.Background(), &mid); err != nil {
			t.Fatal(err)
		}
		listed, err := sinkStore.List(context.Background(), sink.EnvironmentFilter{Status: string(StatusCalibrating)})
		if err != nil || len(listed) != 1 || listed[0].StatusText() != mid.StatusText() {
			t.Fatalf("listed %v: %v, want one %q", listed, err, mid.StatusText())
		}
		loaded, _ := sinkStore.LoadEnvironment(context.Background(), mid.ID)
		if loaded.Progress == nil || *loaded.Progress != *mid.Progress {
			t.Fatalf("loaded progress %+v, want %+v", loaded.Progress, mid.Progress)
		}
	})

	t.Run("ended elsewhere", func(t *testing.T) {
		var (
			once    sync.Once
			turns   atomic.Int64
			racedAt atomic.Int64 // saves of this run before the other ended it
		)
		id := schemas.EnvironmentID("trig-progress-race")
		e, store, _, played := run(t, "trig-progress-race", func(store *recordingStore) {
			if turns.Add(1) < 20 {
				return
			}
			once.Do(func() { // another run of the request fails it meanwhile
				other, err := store.Store.LoadEnvironment(context.Background(), id)
				if err != nil || other == nil {
					t.Errorf("no record to race: %v", err)
					return
				}
				other.Status, other.Reason, other.Version = StatusFailed, "the other run failed it", uint64(time.Now().Add(time.Hour).UnixNano())
				store.mu.Lock()
				racedAt.Store(int64(len(store.saved)))
				store.mu.Unlock()
				if err := store.Store.SaveEnvironment(context.Background(), other); err != nil {
					t.Error(err)
				}
			})
		})
		if e.Status != StatusFailed || e.Reason != "the other run failed it" {
			t.Fatalf("%s %q, want the other run's FAILED record", e.Status, e.Reason)
		}
		// One progress save may have read the record just before the other
		// run ended it; the next one finds it ended.
		after := store.saved[racedAt.Load():]
		if len(after) > 1 {
			t.Fatalf("this run saved %d records after the other ended it", len(after))
		}
		for _, r := range after {
			if r.Status != StatusCalibrating {
				t.Fatalf("this run saved a %s record after the other ended it", r.Status)
			}
		}
		if fullTurns > 0 && played >= fullTurns {
			t.Fatalf("the calibration played %d turns, as many as one that ran to its end (%d)", played, fullTurns)
		}
		t.Logf("stopped after %d of %d turns", played, fullTurns)
	})
}
