package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/schemas"
)

func ready() *schemas.EnvironmentReady {
	id := schemas.EnvironmentID("trig-1")
	hash := strings.Repeat("ab", 32)
	return &schemas.EnvironmentReady{
		Schema: schemas.EnvironmentReadySchema, EnvironmentID: id, TriggerID: "trig-1",
		Environment: "sim-airline", AgentVersion: "1.4.0", DictionaryVersion: 1,
		Capability: schemas.ReadyCapability{Name: "precondition_verification", Definition: "Look before you write."},
		Program:    schemas.ReadyProgram{Hash: hash, Origin: schemas.OriginTemplate, Tools: []string{"get_reservation_details"}, Attempts: 1},
		Calibration: schemas.ReadyCalib{Policy: "p", Seeds: 100, RolloutsPerSeed: 16, Temperature: 0.7, MeanReward: 0.45, StdReward: 0.4, SuccessRate: 0.38,
			PassAtK: map[string]float64{"1": 0.38}},
		Fetch:   schemas.ReadyFetch{Path: schemas.EnvironmentProgramPath(id), ClickHouse: schemas.ClickHouseRef{Table: "environments", EnvironmentID: id, ProgramHash: hash}},
		ReadyAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
	}
}

var now = time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC)

func TestPaperDefaults(t *testing.T) {
	j, err := DefaultConfig().Build(Input{Ready: ready(), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	l, g := j.LoRA, j.GRPO
	if l.Rank != 16 || l.Alpha != 16 || l.Dropout != 0 || !slices.Equal(l.TargetModules, AllTargets) {
		t.Errorf("lora %+v", l)
	}
	if g.GroupSize != 16 || g.GroupsPerIteration != 32 || g.LearningRate != 1e-5 || g.Temperature != 1 || g.KLCoef != 0 ||
		g.ClipEpsilon != 0.2 || g.MaxGradNorm != 1 || g.Iterations < 10 || g.Iterations > 40 || g.HintRatio < 0.25 || g.HintRatio > 0.5 ||
		!g.StripHints || !g.DropConstantGroups || g.Advantage != schemas.AdvantageGroupStd {
		t.Errorf("grpo %+v", g)
	}
	if j.Planner.Source != schemas.PlanDefaults || j.Planner.Preset != PresetPaper || len(j.Planner.Overrides) != 0 {
		t.Errorf("planner %+v", j.Planner)
	}
	if j.EnvServer.BaseURL != "http://127.0.0.1:8090/v1/environments/"+j.EnvironmentID {
		t.Errorf("env server %q", j.EnvServer.BaseURL)
	}
	if j.Report.EventsSubject != "trace.training.events."+j.JobID || j.Report.DeadlineSeconds != 1800 {
		t.Errorf("report %+v", j.Report)
	}
	if j.Output.URI != DefaultOutputURI+"/"+j.Output.AdapterName || j.Output.AdapterName != "precondition-verification-"+j.EnvironmentID[4:12] {
		t.Errorf("output %+v", j.Output)
	}
	if len(j.Eval.Seeds) != 50 || j.Eval.Seeds[0] != DefaultEvalFirstSeed || j.TrainSeeds.Count != DefaultEvalFirstSeed {
		t.Errorf("held-out seeds must not overlap training seeds: eval %v.., train %+v", j.Eval.Seeds[0], j.TrainSeeds)
	}
}

func TestReleasePreset(t *testing.T) {
	c := DefaultConfig()
	c.Preset = PresetRelease
	j, err := c.Build(Input{Ready: ready(), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(j.LoRA.TargetModules, []string{"q_proj", "k_proj", "v_proj", "o_proj"}) || j.GRPO.ClipEpsilon != 0.28 ||
		j.GRPO.GroupsPerIteration != 4 || j.GRPO.Advantage != schemas.AdvantageGroupMean || j.Planner.Preset != PresetRelease {
		t.Fatalf("release preset: %+v %+v", j.LoRA, j.GRPO)
	}
}

func TestJobIDIsPerEnvironmentAndRevision(t *testing.T) {
	c := DefaultConfig()
	a, _ := c.Build(Input{Ready: ready(), Now: now})
	b, _ := c.Build(Input{Ready: ready(), Now: now.Add(time.Hour)}) // a redelivery, later
	r2, _ := c.Build(Input{Ready: ready(), Revision: 2, Now: now})
	other := ready()
	other.EnvironmentID = schemas.EnvironmentID("trig-2")
	other.Fetch.ClickHouse.EnvironmentID = other.EnvironmentID
	o, _ := c.Build(Input{Ready: other, Now: now})
	if a.JobID != b.JobID {
		t.Fatalf("redelivered ready event: %s then %s", a.JobID, b.JobID)
	}
	if a.JobID == r2.JobID || a.JobID == o.JobID || r2.Output.AdapterName == a.Output.AdapterName {
		t.Fatalf("ids %s %s %s", a.JobID, r2.JobID, o.JobID)
	}
}

func TestOverridesByEnvironmentAndCapability(t *testing.T) {
	c := DefaultConfig()
	c.Defaults = Settings{BaseModel: "Qwen/Qwen3-8B"}
	c.Environments = map[string]Settings{"sim-airline": {Iterations: 30, LearningRate: 2e-5}}
	c.Capabilities = map[string]Settings{"precondition_verification": {Iterations: 12, HintRatio: f(0.5)}}
	if err := c.Validate("adapter.plan."); err != nil {
		t.Fatal(err)
	}
	j, err := c.Build(Input{Ready: ready(), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if j.BaseModel != "Qwen/Qwen3-8B" || j.GRPO.Iterations != 12 || j.GRPO.LearningRate != 2e-5 || j.GRPO.HintRatio != 0.5 {
		t.Fatalf("capability wins over environment over defaults: %s %+v", j.BaseModel, j.GRPO)
	}
	want := []string{"/base_model", "/hint_ratio", "/iterations", "/learning_rate"}
	if j.Planner.Source != schemas.PlanConfig || !slices.Equal(j.Planner.Overrides, want) {
		t.Fatalf("planner %+v, want overrides %v", j.Planner, want)
	}
	// Another capability in the same environment gets the environment's.
	r := ready()
	r.Capability.Name = "other_thing"
	j, _ = c.Build(Input{Ready: r, Now: now})
	if j.GRPO.Iterations != 30 || j.GRPO.HintRatio != 0.25 {
		t.Fatalf("environment override: %+v", j.GRPO)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	for _, tt := range []struct {
		name string
		mod  func(c *Config)
		want string
	}{
		{"preset", func(c *Config) { c.Preset = "fast" }, `adapter.plan.preset: "fast"`},
		{"rank", func(c *Config) { c.Defaults.LoRARank = 1024 }, "adapter.plan.defaults.lora_rank: must be in [1, 256], got 1024"},
		{"capability hint", func(c *Config) { c.Capabilities = map[string]Settings{"x": {HintRatio: f(0.9)}} }, "adapter.plan.capabilities.x.hint_ratio: must be in [0, 0.5], got 0.9"},
		{"environment lr", func(c *Config) { c.Environments = map[string]Settings{"sim-retail": {LearningRate: 0.5}} }, "adapter.plan.environments.sim-retail.learning_rate"},
		{"targets", func(c *Config) { c.Defaults.TargetModules = []string{"q_proj", "lm_head"} }, `adapter.plan.defaults.target_modules: "lm_head" is not one of`},
		{"advantage", func(c *Config) { c.Defaults.Advantage = "ppo" }, "adapter.plan.defaults.advantage"},
		{"group size", func(c *Config) { c.Defaults.GroupSize = 1 }, "adapter.plan.defaults.group_size: must be in [2, 64], got 1"},
		{"deadline", func(c *Config) { c.Deadline = time.Second }, "adapter.plan.deadline: must be at least heartbeat"},
		{"env server", func(c *Config) { c.EnvServerURL = "localhost:8090" }, "adapter.plan.env_server_url"},
		{"env server scheme", func(c *Config) { c.EnvServerURL = "tcp://10.0.0.5:8090" }, `adapter.plan.env_server_url: "tcp://10.0.0.5:8090" is not an http, https, ws or wss URL`},
		{"env server host", func(c *Config) { c.EnvServerURL = "http:///v1" }, "adapter.plan.env_server_url"},
		{"output uri length", func(c *Config) { c.OutputURI = "s3://" + strings.Repeat("b", schemas.MaxAdapterURI-MaxAdapterName-5) },
			fmt.Sprintf("adapter.plan.output_uri: %d characters; at most %d", schemas.MaxAdapterURI-MaxAdapterName, schemas.MaxAdapterURI-1-MaxAdapterName)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mod(&c)
			err := c.Validate("adapter.plan.")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
		})
	}
	if err := DefaultConfig().Validate("adapter.plan."); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

// TestLongestOutputURIFitsAJob: at the longest output_uri Validate admits,
// a job whose adapter name is as long as names go still encodes (its
// output.uri is as long as a success may report).
func TestLongestOutputURIFitsAJob(t *testing.T) {
	c := DefaultConfig()
	c.OutputURI = "s3://" + strings.Repeat("b", schemas.MaxAdapterURI-MaxAdapterName-1-5) + "/"
	if err := c.Validate("adapter.plan."); err != nil {
		t.Fatalf("output_uri at the bound: %v", err)
	}
	r := ready()
	r.Capability.Name = strings.Repeat("c", 200)
	j, err := c.Build(Input{Ready: r, Now: now, Simulated: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(j.Output.AdapterName) != MaxAdapterName || len(j.Output.URI) != schemas.MaxAdapterURI {
		t.Fatalf("adapter name %d, uri %d characters; want %d and %d", len(j.Output.AdapterName), len(j.Output.URI), MaxAdapterName, schemas.MaxAdapterURI)
	}
	if _, err := j.Encode(); err != nil {
		t.Fatalf("the longest job: %v", err)
	}
}

func TestAdjustOutOfBoundsIsRejected(t *testing.T) {
	c := DefaultConfig()
	_, err := c.Build(Input{Ready: ready(), Adjust: &Settings{Iterations: 500}, Source: schemas.PlanAgent, Now: now})
	if err == nil || !strings.Contains(err.Error(), "iterations: must be in [1, 200], got 500") {
		t.Fatalf("got %v", err)
	}
	j, err := c.Build(Input{Ready: ready(), Adjust: &Settings{Iterations: 36}, Source: schemas.PlanAgent, Model: "m", Reason: "hard environment", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if j.GRPO.Iterations != 36 || j.Planner.Source != schemas.PlanAgent || j.Planner.Reason != "hard environment" || !slices.Equal(j.Planner.Overrides, []string{"/iterations"}) {
		t.Fatalf("planner %+v", j.Planner)
	}
}

func TestBuiltJobDecodesStrictly(t *testing.T) {
	j, err := DefaultConfig().Build(Input{Ready: ready(), Now: now, Simulated: true})
	if err != nil {
		t.Fatal(err)
	}
	data, err := j.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := schemas.DecodeTrainingJob(data)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := json.Marshal(back)
	if string(again) != string(data) || !back.Simulated {
		t.Fatalf("round trip changed the job:\n%s\n%s", data, again)
	}
}

// TestBuildNeedsAnEnvServerURL: an empty URL passes Validate (the caller
// fills it in) but no job is built without one.
func TestBuildNeedsAnEnvServerURL(t *testing.T) {
	c := DefaultConfig()
	c.EnvServerURL = ""
	if err := c.Validate("adapter.plan."); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if _, err := c.Build(Input{Ready: ready(), Now: now}); err == nil || !strings.Contains(err.Error(), "env_server_url") {
		t.Fatalf("Build without a URL: %v", err)
	}
}

func TestErrorFields(t *testing.T) {
	s, _ := Preset(PresetPaper)
	s.Iterations, s.HintRatio, s.TargetModules = 0, f(0.9), []string{"q_proj", "q_proj", "lm_head"}
	got := ErrorFields(s.Validate(""))
	if strings.Join(got, ",") != "target_modules,iterations,hint_ratio" {
		t.Fatalf("fields %v of %v", got, s.Validate(""))
	}
	if ErrorFields(nil) != nil || len(ErrorFields(errors.New("plan: adapter.plan.env_server_url is not set"))) != 0 {
		t.Fatal("fields of a non-settings error")
	}
}

// TestEvalFirstSeedIsChecked: adapter.plan.eval_first_seed is refused at
// start, naming it, when no job could be planned with it or its jobs would
// hold seeds the environment server refuses (0 to 2⁶³−1): 0 or less left
// no training seed below it (every job's planning failed on train_seeds),
// and one whose held-out seeds ran past 2⁶³−1 wrapped to negative seeds.
func TestEvalFirstSeedIsChecked(t *testing.T) {
	for _, first := range []int64{0, -5, math.MaxInt64 - 10} {
		c := DefaultConfig()
		c.EvalFirstSeed = first
		if err := c.Validate("adapter.plan."); err == nil || !strings.Contains(err.Error(), "adapter.plan.eval_first_seed") {
			t.Errorf("eval_first_seed %d: Validate gave %v, want an error naming adapter.plan.eval_first_seed", first, err)
		}
	}
	c := DefaultConfig()
	c.EvalFirstSeed = math.MaxInt64 - int64(Bounds.EvalSeeds[1]) + 1 // the largest whose every held-out seed fits
	if err := c.Validate("adapter.plan."); err != nil {
		t.Fatalf("eval_first_seed %d: %v", c.EvalFirstSeed, err)
	}
	c.Defaults.EvalSeeds = Bounds.EvalSeeds[1]
	j, err := c.Build(Input{Ready: ready(), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if s := j.Eval.Seeds; s[0] != c.EvalFirstSeed || s[len(s)-1] != math.MaxInt64 {
		t.Fatalf("held-out seeds %d … %d", s[0], s[len(s)-1])
	}
}

// TestOutputURIOfAFileHasNoHost: file://var/lib/trace/adapters (two
// slashes, a common slip for file:///var/…) names the host "var": the
// reference trainer wrote the adapter to /lib/trace/adapters/<name> and the
// serving engine was told to load it from there. It is refused at start.
func TestOutputURIOfAFileHasNoHost(t *testing.T) {
	for _, u := range []string{"file://var/lib/trace/adapters", "file://adapters", "file://host.example.com/data/adapters"} {
		c := DefaultConfig()
		c.OutputURI = u
		if err := c.Validate("adapter.plan."); err == nil || !strings.Contains(err.Error(), "adapter.plan.output_uri") || !strings.Contains(err.Error(), "file:///") {
			t.Errorf("output_uri %s: Validate gave %v, want an error naming adapter.plan.output_uri and the file:/// form", u, err)
		}
	}
	for _, u := range []string{"file:///var/lib/trace/adapters", "file://localhost/var/lib/trace/adapters", "s3://bucket/adapters", "/var/lib/trace/adapters/../x://"} {
		c := DefaultConfig()
		c.OutputURI = u
		if err := c.Validate("adapter.plan."); err != nil && strings.Contains(err.Error(), "file:///") {
			t.Errorf("output_uri %s: %v", u, err)
		}
	}
}
