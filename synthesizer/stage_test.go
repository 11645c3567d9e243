package synthesizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/schemas"
)

// memStore keeps records as ClickHouse's ReplacingMergeTree would: the
// highest version per id wins. (sink's Store is tested against ClickHouse.)
type memStore struct {
	mu    sync.Mutex
	rows  map[string][]Environment
	fail  error
	saves int
}

func newMemStore() *memStore { return &memStore{rows: map[string][]Environment{}} }

func (m *memStore) SaveEnvironment(_ context.Context, e *Environment) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	b, _ := json.Marshal(e) // store a copy, as a database would
	var c Environment
	_ = json.Unmarshal(b, &c)
	m.rows[e.ID] = append(m.rows[e.ID], c)
	m.saves++
	return nil
}

func (m *memStore) LoadEnvironment(_ context.Context, id string) (*Environment, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var best *Environment
	for i, r := range m.rows[id] {
		if best == nil || r.Version > best.Version {
			best = &m.rows[id][i]
		}
	}
	if best == nil {
		return nil, nil
	}
	c := *best
	return &c, nil
}

func (m *memStore) ids() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for id := range m.rows {
		out = append(out, id)
	}
	return out
}

// markerValidator stands in for envprog's checks in the stage's own tests:
// a program fails to load when it contains "!!syntax", and fails the reward
// check when it contains "BAD_REWARD". The generation path against the real
// runtime is tested in pipeline_test.go (TestGenerationPathOnTheRuntime).
type markerValidator struct{ calls atomic.Int32 }

func (v *markerValidator) Validate(_ context.Context, d Draft, target []schemas.Tool) (*Validation, error) {
	v.calls.Add(1)
	program := d.Program
	switch {
	case strings.Contains(program, "!!syntax"):
		return &Validation{Checks: []Check{{Name: "load", Verdict: Fail, Message: "load: prog.star:3:5: got '!', want newline"}}}, nil
	case strings.Contains(program, "BAD_REWARD"):
		return &Validation{Checks: []Check{{Name: "load", Verdict: Pass}, {Name: "reward_range", Verdict: Fail, Message: "reward_range: seed 7: reward 1.5 is outside [0, 1]"}}}, nil
	}
	return &Validation{OK: true, Checks: []Check{{Name: "load", Verdict: Pass}}, Tools: []string{"get_reservation_details", "cancel_reservation", "respond"},
		Rationale: "Practising this transfers."}, nil
}

// seqCalibrator returns its scripted verdicts in order, then accepts.
type seqCalibrator struct {
	mu       sync.Mutex
	verdicts []string // "" accepts, "too_easy", "too_hard"
	programs []string
	err      error
}

func (c *seqCalibrator) Calibrate(_ context.Context, d Draft, _ func(done, total int)) (*Calibration, error) {
	program := d.Program
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	c.programs = append(c.programs, program)
	v := ""
	if len(c.verdicts) > 0 {
		v, c.verdicts = c.verdicts[0], c.verdicts[1:]
	}
	cal := &Calibration{Accepted: v == "", Verdict: "accepted", Policy: "scripted", Simulated: true, Seeds: 4, RolloutsPerSeed: 4, Temperature: 0.7,
		MeanReward: 0.4, StdReward: 0.3, SuccessRate: 0.35, InformativeGroups: 0.75, PassAtK: map[string]float64{"1": 0.35, "4": 0.75},
		Histogram: []int{3, 0, 1, 0, 2, 0, 4, 0, 0, 6}}
	if v != "" {
		cal.Verdict, cal.Diagnosis = v, v+": success rate 0.95 is above 0.6"
		cal.SuccessRate, cal.MeanReward = 0.95, 0.97
	}
	return cal, nil
}

type memPublisher struct {
	mu   sync.Mutex
	msgs []*schemas.EnvironmentReady
}

func (p *memPublisher) PublishEnvironmentReady(_ context.Context, m *schemas.EnvironmentReady) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if _, err := schemas.DecodeEnvironmentReady(b); err != nil { // what a consumer would accept
		return fmt.Errorf("published an invalid message: %w", err)
	}
	p.mu.Lock()
	p.msgs = append(p.msgs, m)
	p.mu.Unlock()
	return nil
}

func testRequest(trigger string) *schemas.SynthesisRequest {
	return &schemas.SynthesisRequest{
		TriggerID: trigger, Environment: "sim-airline", AgentVersion: "1.4.0", DictionaryVersion: 1, Epoch: 1, Rank: 1,
		Capability: schemas.SelectedCapability{Skill: "precondition_verification", Description: "Before a write the agent reads the record it changes.",
			MeanDelta: 0.41, NRunsPassed: 1, NRunsTotal: 1, PassesConsistency: true, Status: "selected", ExampleFailedCases: []string{}},
		Tools: []schemas.Tool{
			{Type: "function", Function: schemas.FunctionDef{Name: "get_reservation_details", Parameters: json.RawMessage(`{"type":"object","properties":{"reservation_id":{"type":"string"}},"required":["reservation_id"]}`)}},
			{Type: "function", Function: schemas.FunctionDef{Name: "cancel_reservation", Parameters: json.RawMessage(`{"type":"object","properties":{"reservation_id":{"type":"string"}},"required":["reservation_id"]}`)}},
		},
		FiredAt: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC),
	}
}

const goodProgram = `"""Good."""
def tools():
    return []
def reset(seed):
    return {"system": "s", "user": "u", "state": {}}
def step(state, call):
    return {"result": "", "state": state, "done": True}
def reward(state, transcript):
    return {"reward": 0.5, "components": {}}
`

func fenced(p string) string { return "Here is the environment.\n```python\n" + p + "```\n" }

func newTestGenerator(t *testing.T, srv *llmtest.Server) (*Generator, *llm.BufferRecorder) {
	t.Helper()
	rec := &llm.BufferRecorder{}
	client, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "gen-model", Timeout: 5 * time.Second, MaxAttempts: 2,
		BackoffInitial: time.Millisecond, BackoffMax: 2 * time.Millisecond, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGenerator(client, GeneratorConfig{MaxTokens: 4000})
	if err != nil {
		t.Fatal(err)
	}
	return g, rec
}

type stageKit struct {
	stage *Stage
	store *memStore
	val   *markerValidator
	cal   *seqCalibrator
	pub   *memPublisher
}

func newKit(t *testing.T, mut func(c *Config)) *stageKit {
	t.Helper()
	k := &stageKit{store: newMemStore(), val: &markerValidator{}, cal: &seqCalibrator{}, pub: &memPublisher{}}
	cfg := Config{Validator: k.val, Calibrators: func(*Job) (Calibrator, error) { return k.cal, nil }, Store: k.store, Publisher: k.pub}
	if mut != nil {
		mut(&cfg)
	}
	s, err := NewStage(cfg)
	if err != nil {
		t.Fatal(err)
	}
	k.stage = s
	return k
}

func TestGenerationRepairLoopCarriesEveryDiagnosis(t *testing.T) {
	srv := llmtest.New(t)
	broken := strings.Replace(goodProgram, "def step", "!!syntax\ndef step", 1)
	invalid := strings.Replace(goodProgram, "0.5", "1.5 # BAD_REWARD", 1)
	srv.Enqueue(
		llmtest.Text("I would rather describe the environment in words."), // no program
		llmtest.Text(fenced(broken)),
		llmtest.Text(fenced(invalid)),
		llmtest.Text(fenced(goodProgram)), // valid, but calibration finds it too easy
		llmtest.Text("```starlark\n"+strings.Replace(goodProgram, `"""Good."""`, `"""Good, harder."""`, 1)+"```"),
	)
	gen, rec := newTestGenerator(t, srv)
	k := newKit(t, func(c *Config) { c.LLM = gen })
	k.cal.verdicts = []string{"too_easy"}
	e, err := k.stage.Synthesize(context.Background(), testRequest("trig-repair"))
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != StatusDone || len(e.Attempts) != 5 || e.Attempt != 5 {
		t.Fatalf("status %s after %d attempts: %+v", e.Status, len(e.Attempts), e.Diagnoses)
	}
	wantStages := []string{StageGenerate, StageValidate, StageValidate, StageCalibrate, StageCalibrate}
	for i, a := range e.Attempts {
		if a.Stage != wantStages[i] || a.Accepted != (i == 4) || a.Origin != schemas.OriginLLM || a.Model != "gen-model" || a.LLM == nil || a.LLM.Calls != 1 {
			t.Errorf("attempt %d: %+v", i+1, a)
		}
	}
	reqs := srv.Requests()
	if len(reqs) != 5 {
		t.Fatalf("%d generation requests, want 5", len(reqs))
	}
	// Each repair prompt carries every diagnosis so far, and the last program.
	diagnoses := []string{
		"attempt 1: generation: the answer contains no program: no code block",
		"load: prog.star:3:5: got '!', want newline",
		"reward_range: seed 7: reward 1.5 is outside [0, 1]",
		"too_easy: success rate 0.95 is above 0.6",
	}
	for i, r := range reqs {
		p := r.Chat.Messages[0].Content
		if i == 0 && strings.Contains(p, "Your earlier attempts failed") {
			t.Error("the first prompt talks of earlier attempts")
		}
		for j := 0; j < i; j++ {
			if !strings.Contains(p, diagnoses[j]) && !strings.Contains(p, strings.TrimPrefix(diagnoses[j], "attempt 1: ")) {
				t.Errorf("prompt %d lacks diagnosis %d %q", i+1, j+1, diagnoses[j])
			}
		}
		if i > 0 && !strings.Contains(p, fmt.Sprintf("This is attempt %d of 5", i+1)) {
			t.Errorf("prompt %d does not say which attempt it is", i+1)
		}
	}
	if p := reqs[2].Chat.Messages[0].Content; !strings.Contains(p, "!!syntax") {
		t.Error("the repair of the broken program does not show it")
	}
	if testing.Verbose() {
		t.Logf("the last repair prompt:\n%s", reqs[4].Chat.Messages[0].Content)
	}
	for _, want := range []string{"name: precondition_verification", "Before a write the agent reads the record it changes.",
		`"name": "get_reservation_details"`, "never by a language model", "never spells out a tool call", "docstring of 3 to 5 sentences"} {
		if !strings.Contains(reqs[0].Chat.Messages[0].Content, want) {
			t.Errorf("first prompt lacks %q", want)
		}
	}
	calls := rec.Drain()
	if len(calls) != 5 {
		t.Fatalf("%d audit rows, want 5", len(calls))
	}
	for _, c := range calls {
		if c.Purpose != PurposeGenerate || c.Outcome != llm.OutcomeOK || c.RolloutID != e.ID {
			t.Errorf("audit row %+v", c)
		}
	}
	if len(k.pub.msgs) != 1 || k.pub.msgs[0].EnvironmentID != e.ID || k.pub.msgs[0].Program.Attempts != 5 || k.pub.msgs[0].Program.Hash != ProgramHash(e.Program) {
		t.Fatalf("published %+v", k.pub.msgs)
	}
	if !strings.Contains(e.Program, "Good, harder.") {
		t.Fatalf("DONE with program %q", e.Program)
	}
}

func TestGenerationFailsAfterFiveAttemptsNeverDone(t *testing.T) {
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply {
		return llmtest.Text(fenced(strings.Replace(goodProgram, "0.5", "2 # BAD_REWARD", 1)))
	})
	gen, _ := newTestGenerator(t, srv)
	k := newKit(t, func(c *Config) { c.LLM = gen })
	e, err := k.stage.Synthesize(context.Background(), testRequest("trig-fail"))
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != StatusFailed || len(e.Attempts) != 5 || len(srv.Requests()) != 5 || !strings.Contains(e.Reason, "5 attempts, none accepted") {
		t.Fatalf("%s after %d attempts, %d requests: %s", e.Status, len(e.Attempts), len(srv.Requests()), e.Reason)
	}
	if len(k.pub.msgs) != 0 || len(k.cal.programs) != 0 {
		t.Fatal("a failed environment was calibrated or announced")
	}
	// Redelivered: nothing more is asked of the model.
	if e2, err := k.stage.Synthesize(context.Background(), testRequest("trig-fail")); err != nil || e2.Status != StatusFailed || len(srv.Requests()) != 5 {
		t.Fatalf("redelivery: %v %s, %d requests", err, e2.Status, len(srv.Requests()))
	}
}

func TestRedeliveredRequestMakesOneEnvironment(t *testing.T) {
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(fenced(goodProgram)) })
	gen, _ := newTestGenerator(t, srv)
	k := newKit(t, func(c *Config) { c.LLM = gen })
	for range 3 {
		e, err := k.stage.Synthesize(context.Background(), testRequest("trig-dup"))
		if err != nil || e.Status != StatusDone {
			t.Fatalf("%v %+v", err, e)
		}
	}
	if ids := k.store.ids(); len(ids) != 1 || ids[0] != schemas.EnvironmentID("trig-dup") {
		t.Fatalf("environments %v", ids)
	}
	if len(srv.Requests()) != 1 || len(k.cal.programs) != 1 {
		t.Fatalf("%d generations, %d calibrations for one environment", len(srv.Requests()), len(k.cal.programs))
	}
	// DONE is announced again on each delivery (the bus dedups by Msg-Id = id).
	for _, m := range k.pub.msgs {
		if m.EnvironmentID != schemas.EnvironmentID("trig-dup") {
			t.Fatal(m.EnvironmentID)
		}
	}
}

func TestTransientFailureResumesTheAttempt(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.ServerError(), llmtest.ServerError()) // the client's two attempts
	gen, _ := newTestGenerator(t, srv)
	k := newKit(t, func(c *Config) { c.LLM = gen })
	e, err := k.stage.Synthesize(context.Background(), testRequest("trig-transient"))
	if !errors.Is(err, ErrTransient) {
		t.Fatalf("err %v, want transient", err)
	}
	if e.Status != StatusGenerating || len(e.Attempts) != 0 {
		t.Fatalf("after an unreachable model: %s with %d attempts", e.Status, len(e.Attempts))
	}
	stored, _ := k.store.LoadEnvironment(context.Background(), e.ID)
	if stored.Status != StatusGenerating || stored.Attempt != 1 {
		t.Fatalf("stored %s attempt %d", stored.Status, stored.Attempt)
	}
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(fenced(goodProgram)) })
	e, err = k.stage.Synthesize(context.Background(), testRequest("trig-transient"))
	if err != nil || e.Status != StatusDone || e.Attempt != 1 || len(e.Attempts) != 1 {
		t.Fatalf("resumed: %v %s attempt %d (%d recorded)", err, e.Status, e.Attempt, len(e.Attempts))
	}
	// A calibration whose policy server is down is transient too.
	k.cal.err = errors.New("policy unreachable")
	if _, err := k.stage.Synthesize(context.Background(), testRequest("trig-transient-2")); !errors.Is(err, ErrTransient) {
		t.Fatalf("calibration failure: %v", err)
	}
	k.store.fail = errors.New("clickhouse down")
	if _, err := k.stage.Synthesize(context.Background(), testRequest("trig-transient-3")); !errors.Is(err, ErrTransient) {
		t.Fatalf("store failure: %v", err)
	}
}

func TestRefusedRequestIsAFailedAttempt(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.Status(400, "context length exceeded"), llmtest.Text(fenced(goodProgram)))
	gen, _ := newTestGenerator(t, srv)
	k := newKit(t, func(c *Config) { c.LLM = gen })
	e, err := k.stage.Synthesize(context.Background(), testRequest("trig-400"))
	if err != nil || e.Status != StatusDone || len(e.Attempts) != 2 || !strings.Contains(e.Attempts[0].Diagnosis, "context length exceeded") {
		t.Fatalf("%v %s %+v", err, e.Status, e.Attempts)
	}
}

// tuneAuthor is a template author: it tunes a difficulty knob after a
// calibration miss, and cannot adapt to a target without a read tool.
type tuneAuthor struct{ knobs []int }

func (a *tuneAuthor) Write(_ context.Context, job *Job, n, _ int, prior []Attempt) (Draft, error) {
	hasRead := false
	for _, t := range job.Request.Tools {
		hasRead = hasRead || strings.HasPrefix(t.Function.Name, "get_")
	}
	if !hasRead {
		return Draft{}, &WriteError{Reason: "family " + job.Family + " needs a read tool (get_*), the target has none", Final: true}
	}
	level := 1
	if len(prior) > 0 {
		var k struct{ Level int }
		_ = json.Unmarshal(prior[len(prior)-1].Knobs, &k)
		level = k.Level + 1
	}
	a.knobs = append(a.knobs, level)
	return Draft{Program: strings.Replace(goodProgram, "Good.", fmt.Sprintf("Level %d.", level), 1), Family: job.Family,
		Knobs: json.RawMessage(fmt.Sprintf(`{"Level":%d}`, level))}, nil
}

type families map[string]string // definition word → family

func (f families) Match(name, def string) (string, string, bool) {
	for w, fam := range f {
		if strings.Contains(name+" "+def, w) {
			return fam, "the definition has " + w, true
		}
	}
	return "", "no keyword", false
}
func (f families) Known(fam string) bool {
	for _, v := range f {
		if v == fam {
			return true
		}
	}
	return false
}

type dicts map[string]CapabilityInfo

func (d dicts) Capability(_, _ string, _ uint32, name string) (CapabilityInfo, bool) {
	c, ok := d[name]
	return c, ok
}

func TestTemplatePathTunesOnAMiss(t *testing.T) {
	ta := &tuneAuthor{}
	k := newKit(t, func(c *Config) {
		c.Templates, c.Families = ta, families{"reads the record": "precondition_verification"}
	})
	k.cal.verdicts = []string{"too_easy", "too_easy"}
	e, err := k.stage.Synthesize(context.Background(), testRequest("trig-template"))
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != StatusDone || e.Path != PathTemplate || e.Family != "precondition_verification" || e.FamilySource != FamilyMatched {
		t.Fatalf("%s %s %q %q", e.Status, e.Path, e.Family, e.FamilySource)
	}
	if fmt.Sprint(ta.knobs) != "[1 2 3]" || len(e.Attempts) != 3 || e.Attempts[2].Origin != schemas.OriginTemplate || !strings.Contains(e.Program, "Level 3.") {
		t.Fatalf("knobs %v, attempts %d, program %q", ta.knobs, len(e.Attempts), e.Program)
	}
	if m := k.pub.msgs[0]; m.Program.Origin != schemas.OriginTemplate || m.Program.Family != "precondition_verification" || !m.Calibration.Simulated {
		t.Fatalf("ready %+v", m)
	}
}

func TestFamilyFromTheDictionary(t *testing.T) {
	tests := []struct {
		name       string
		dict       dicts
		wantFamily string
		wantSource string
		wantStatus Status
	}{
		{"named by the dictionary", dicts{"precondition_verification": {Definition: "Look first, a long definition.", Family: "user_confirmation"}}, "user_confirmation", FamilyFromDictionary, StatusDone},
		{"other means no template", dicts{"precondition_verification": {Definition: "Look first, reads the record.", Family: "other"}}, "", FamilyFromDictionary, StatusWaitingForLLM},
		{"unknown family falls back to matching", dicts{"precondition_verification": {Definition: "It reads the record.", Family: "cooking"}}, "precondition_verification", FamilyMatched, StatusDone},
		{"not in the dictionary: matched on the request", dicts{}, "precondition_verification", FamilyMatched, StatusDone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newKit(t, func(c *Config) {
				c.Templates, c.Dictionaries = &tuneAuthor{}, tt.dict
				c.Families = families{"reads the record": "precondition_verification", "confirm": "user_confirmation"}
			})
			e, err := k.stage.Synthesize(context.Background(), testRequest("trig-"+tt.name))
			if err != nil {
				t.Fatal(err)
			}
			if e.Family != tt.wantFamily || e.FamilySource != tt.wantSource || e.Status != tt.wantStatus {
				t.Fatalf("family %q (%q) status %s", e.Family, e.FamilySource, e.Status)
			}
		})
	}
}

func TestWaitingForLLMResumesWhenAModelIsConfigured(t *testing.T) {
	store := newMemStore()
	req := testRequest("trig-wait")
	req.Capability.Skill, req.Capability.Description = "handling_concurrent_user_intents", "The agent handles several requests of the user in one conversation."
	k := newKit(t, func(c *Config) {
		c.Store = store
		c.Templates, c.Families = &tuneAuthor{}, families{"reads the record": "precondition_verification"}
	})
	e, err := k.stage.Synthesize(context.Background(), req)
	if err != nil || e.Status != StatusWaitingForLLM || !strings.Contains(e.Reason, "no template family matches") || len(e.Attempts) != 0 {
		t.Fatalf("%v %s %q", err, e.Status, e.Reason)
	}
	saves := store.saves
	if e, _ = k.stage.Synthesize(context.Background(), req); e.Status != StatusWaitingForLLM || store.saves != saves {
		t.Fatalf("redelivered while waiting: %s, %d saves", e.Status, store.saves-saves)
	}
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(fenced(goodProgram)) })
	gen, _ := newTestGenerator(t, srv)
	k2 := newKit(t, func(c *Config) { c.Store = store; c.LLM = gen })
	e, err = k2.stage.Synthesize(context.Background(), req)
	if err != nil || e.Status != StatusDone || e.Path != PathLLM || e.Reason != "" {
		t.Fatalf("resumed: %v %s %q", err, e.Status, e.Reason)
	}
}

func TestTemplateThatCannotAdaptWaitsForAModel(t *testing.T) {
	req := testRequest("trig-notools")
	req.Tools = req.Tools[1:] // no get_* tool
	k := newKit(t, func(c *Config) {
		c.Templates, c.Families = &tuneAuthor{}, families{"reads the record": "precondition_verification"}
	})
	e, err := k.stage.Synthesize(context.Background(), req)
	if err != nil || e.Status != StatusWaitingForLLM || !strings.Contains(e.Reason, "needs a read tool") || len(e.Attempts) != 1 {
		t.Fatalf("%v %s %q %d", err, e.Status, e.Reason, len(e.Attempts))
	}
}

func TestAbortRecordsFailed(t *testing.T) {
	k := newKit(t, nil)
	e, err := k.stage.Abort(context.Background(), testRequest("trig-abort"), "delivered 5 times; last error: clickhouse down")
	if err != nil || e.Status != StatusFailed || !strings.Contains(e.Reason, "delivered 5 times") {
		t.Fatalf("%v %+v", err, e)
	}
	stored, _ := k.store.LoadEnvironment(context.Background(), e.ID)
	if stored == nil || stored.Status != StatusFailed {
		t.Fatalf("stored %+v", stored)
	}
}

// TestModelRemovedMidAttemptWaits: an environment left mid-attempt on the
// generation model's path (the model was unreachable) is delivered again to
// a stage without a model (llm.base_url removed, or a replica configured
// without it). It waits for a model, keeping its attempt and diagnoses, and
// resumes that attempt once one is configured. (It panicked on the nil
// author, and the process crashed on every redelivery.)
func TestModelRemovedMidAttemptWaits(t *testing.T) {
	store := newMemStore()
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.Text("no program here"), llmtest.ServerError(), llmtest.ServerError())
	gen, _ := newTestGenerator(t, srv)
	req := testRequest("trig-model-removed")
	k := newKit(t, func(c *Config) { c.Store = store; c.LLM = gen })
	if e, err := k.stage.Synthesize(context.Background(), req); !errors.Is(err, ErrTransient) || e.Status != StatusGenerating || e.Attempt != 2 {
		t.Fatalf("with an unreachable model: %v %s attempt %d", err, e.Status, e.Attempt)
	}
	noModel := newKit(t, func(c *Config) { c.Store = store })
	e, err := noModel.stage.Synthesize(context.Background(), req)
	if err != nil || e.Status != StatusWaitingForLLM || !strings.Contains(e.Reason, "no generation model") {
		t.Fatalf("without a model: %v %s %q", err, e.Status, e.Reason)
	}
	if stored, _ := store.LoadEnvironment(context.Background(), e.ID); stored.Status != StatusWaitingForLLM || stored.Attempt != 2 || len(stored.Diagnoses) != 1 {
		t.Fatalf("stored %s attempt %d diagnoses %q", stored.Status, stored.Attempt, stored.Diagnoses)
	}
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(fenced(goodProgram)) })
	e, err = k.stage.Synthesize(context.Background(), req)
	if err != nil || e.Status != StatusDone || e.Attempt != 2 || len(e.Attempts) != 2 {
		t.Fatalf("resumed with a model: %v %s attempt %d (%d recorded)", err, e.Status, e.Attempt, len(e.Attempts))
	}
	if p := srv.Requests()[len(srv.Requests())-1].Chat.Messages[0].Content; !strings.Contains(p, "This is attempt 2 of 5") {
		t.Error("the resumed attempt's prompt lost the earlier diagnosis")
	}
}

// TestModelThatRefusesTraceWaits: a generation model or a calibration
// policy that refuses trace itself (HTTP 401, 403, 404: a wrong API key or
// model name) makes the environment wait for a working model instead of
// spending its attempts on it (it ended FAILED after five refused
// attempts, and a FAILED environment never comes back); it resumes once the
// model answers.
func TestModelThatRefusesTraceWaits(t *testing.T) {
	for _, status := range []int{401, 403, 404} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			store := newMemStore()
			srv := llmtest.New(t)
			srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Status(status, "no such key or model") })
			gen, _ := newTestGenerator(t, srv)
			req := testRequest(fmt.Sprint("trig-refuses-", status))
			k := newKit(t, func(c *Config) { c.Store = store; c.LLM = gen })
			e, err := k.stage.Synthesize(context.Background(), req)
			if err != nil || e.Status != StatusWaitingForLLM || !strings.Contains(e.Reason, fmt.Sprint(status)) || len(e.Attempts) != 0 || len(srv.Requests()) != 1 {
				t.Fatalf("generation refused: %v %s %q, %d attempts, %d requests", err, e.Status, e.Reason, len(e.Attempts), len(srv.Requests()))
			}
			srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(fenced(goodProgram)) })
			refused := &llm.Error{Purpose: "calibrate", Attempts: 1, Outcomes: []string{"http_4xx"}, Status: status, Err: errors.New("no such key or model")}
			k.cal.err = fmt.Errorf("calibration: seed 0 rollout 3: policy, turn 0: %w", refused)
			e, err = k.stage.Synthesize(context.Background(), req)
			if err != nil || e.Status != StatusWaitingForLLM || !strings.Contains(e.Reason, "calibrat") || e.Attempt != 1 || len(e.Attempts) != 0 {
				t.Fatalf("policy refused: %v %s %q attempt %d, %d recorded", err, e.Status, e.Reason, e.Attempt, len(e.Attempts))
			}
			k.cal.err = nil
			e, err = k.stage.Synthesize(context.Background(), req)
			if err != nil || e.Status != StatusDone || e.Attempt != 1 || len(e.Attempts) != 1 {
				t.Fatalf("resumed: %v %s attempt %d (%d recorded)", err, e.Status, e.Attempt, len(e.Attempts))
			}
		})
	}
}

// TestGenerationHasItsOwnTimeout: a program of thousands of tokens takes
// minutes on a self-hosted model; the generation request is bounded by
// the generator's timeout (synthesizer.generation_timeout), not by the
// client's (llm.timeout, sized for a label), which timed every such
// answer out, attempt after attempt, until the request was FAILED.
func TestGenerationHasItsOwnTimeout(t *testing.T) {
	srv := llmtest.New(t)
	srv.Enqueue(llmtest.Slow(600*time.Millisecond, llmtest.Text(fenced(goodProgram))))
	client, err := llm.New(llm.Config{BaseURL: srv.URL, Model: "gen-model", Timeout: 200 * time.Millisecond, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGenerator(client, GeneratorConfig{MaxTokens: 4000, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	job := &Job{ID: "env-0000000000000001", Request: testRequest("trig-slow")}
	d, err := g.Write(context.Background(), job, 1, 5, nil)
	if err != nil || d.Program == "" {
		t.Fatalf("a slow answer within the generation timeout: %v", err)
	}
	// Past it, the attempt times out with the generation timeout named.
	g.cfg.Timeout = 100 * time.Millisecond
	srv.Enqueue(llmtest.Slow(600*time.Millisecond, llmtest.Text(fenced(goodProgram))))
	if _, err := g.Write(context.Background(), job, 1, 5, nil); !errors.Is(err, ErrTransient) || !strings.Contains(err.Error(), "within 100ms") {
		t.Fatalf("past the generation timeout: %v", err)
	}
}

// racingCalibrator ends the environment as another run of the request
// would (a second replica given it after this one's acks lapsed) while
// this run calibrates, then accepts: status DONE with another program, or
// FAILED.
type racingCalibrator struct {
	store  *memStore
	status Status
}

func (c *racingCalibrator) Calibrate(ctx context.Context, d Draft, _ func(done, total int)) (*Calibration, error) {
	other, err := c.store.LoadEnvironment(ctx, schemas.EnvironmentID("trig-race"))
	if err != nil || other == nil {
		return nil, fmt.Errorf("no record to race: %v", err)
	}
	other.Status, other.Version = c.status, other.Version+1_000_000
	cal, _ := (&seqCalibrator{}).Calibrate(ctx, d, nil)
	if c.status == StatusDone {
		other.Program = d.Program + "\n# the other run's program\n"
		other.ProgramHash = ProgramHash(other.Program)
		other.Calibration = cal
		other.Attempts = append(other.Attempts, Attempt{N: 1, Origin: schemas.OriginLLM, Program: other.Program, ProgramHash: other.ProgramHash,
			Stage: StageCalibrate, Accepted: true, Calibration: cal})
	} else {
		other.Reason = "the other run failed it"
	}
	if err := c.store.SaveEnvironment(ctx, other); err != nil {
		return nil, err
	}
	return cal, nil
}

// TestRunEndedElsewhereKeepsTheOtherRecord: a run whose environment another
// run of the same request ended while it calibrated does not overwrite
// that record; a DONE one is announced as stored (its program's hash), a
// FAILED one is not announced; the worker's Abort and NoteTransient leave
// it too.
func TestRunEndedElsewhereKeepsTheOtherRecord(t *testing.T) {
	for _, status := range []Status{StatusDone, StatusFailed} {
		t.Run(string(status), func(t *testing.T) {
			srv := llmtest.New(t)
			srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(fenced(goodProgram)) })
			gen, _ := newTestGenerator(t, srv)
			rc := &racingCalibrator{status: status}
			k := newKit(t, func(c *Config) {
				c.LLM = gen
				c.Calibrators = func(*Job) (Calibrator, error) { return rc, nil }
			})
			rc.store = k.store
			ctx := context.Background()
			e, err := k.stage.Synthesize(ctx, testRequest("trig-race"))
			if err != nil || e.Status != status {
				t.Fatalf("Synthesize: %v, %+v; want the other run's %s", err, e, status)
			}
			stored, _ := k.store.LoadEnvironment(ctx, e.ID)
			if stored.Status != status || (status == StatusDone && !strings.Contains(stored.Program, "the other run's program")) {
				t.Fatalf("stored %s %q, want the other run's record", stored.Status, stored.Program)
			}
			switch {
			case status == StatusDone && (len(k.pub.msgs) != 1 || k.pub.msgs[0].Program.Hash != stored.ProgramHash):
				t.Fatalf("announced %+v, want the stored program's hash %s", k.pub.msgs, stored.ProgramHash)
			case status == StatusFailed && len(k.pub.msgs) != 0:
				t.Fatalf("announced %+v for a FAILED environment", k.pub.msgs)
			}
			saves := k.store.saves
			if _, err := k.stage.Abort(ctx, testRequest("trig-race"), "deliveries ran out"); err != nil {
				t.Fatal(err)
			}
			if _, err := k.stage.NoteTransient(ctx, testRequest("trig-race")); err != nil {
				t.Fatal(err)
			}
			if k.store.saves != saves {
				t.Fatalf("%d saves after the end, want none", k.store.saves-saves)
			}
		})
	}
}

// TestEndedRecordOutranksALateWrite: an ended record's version sorts above
// any unended one's, so a save of another run that passed its check just
// before the end was stored, and lands after it with a later time as its
// version, does not replace the end.
func TestEndedRecordOutranksALateWrite(t *testing.T) {
	srv := llmtest.New(t)
	srv.Handle(func(llmtest.Request) llmtest.Reply { return llmtest.Text(fenced(goodProgram)) })
	gen, _ := newTestGenerator(t, srv)
	k := newKit(t, func(c *Config) { c.LLM = gen })
	ctx := context.Background()
	e, err := k.stage.Synthesize(ctx, testRequest("trig-late"))
	if err != nil || e.Status != StatusDone {
		t.Fatalf("%v %+v", err, e)
	}
	late := *e
	late.Status, late.Version = StatusCalibrating, uint64(time.Now().Add(time.Hour).UnixNano())
	if err := k.store.SaveEnvironment(ctx, &late); err != nil {
		t.Fatal(err)
	}
	if stored, _ := k.store.LoadEnvironment(ctx, e.ID); stored.Status != StatusDone {
		t.Fatalf("stored %s (version %d) after a late write, want DONE (version %d)", stored.Status, stored.Version, e.Version)
	}
}
