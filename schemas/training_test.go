package schemas

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func sampleJob() *TrainingJob {
	env := EnvironmentID("trig-1")
	id := TrainingJobID(env, 1)
	return &TrainingJob{
		Schema: TrainingJobSchema, JobID: id, PlanRevision: 1, EnvironmentID: env, Environment: "sim-airline", AgentVersion: "1.4.0",
		Capability: JobCapability{Name: "precondition_verification", Definition: "d"}, ProgramHash: strings.Repeat("ab", 32),
		EnvServer: JobEnvServer{BaseURL: "http://127.0.0.1:8090/v1/environments/" + env}, BaseModel: "Qwen/Qwen3-8B",
		LoRA: LoRASettings{Rank: 16, Alpha: 16, TargetModules: []string{"q_proj", "v_proj"}},
		GRPO: GRPOSettings{GroupSize: 16, GroupsPerIteration: 32, Iterations: 20, LearningRate: 1e-5, Temperature: 1, ClipEpsilon: 0.2,
			MaxGradNorm: 1, HintRatio: 0.25, StripHints: true, DropConstantGroups: true, Advantage: AdvantageGroupStd},
		Eval:      EvalPlan{Seeds: []int64{1000000, 1000001}, RolloutsPerSeed: 4, SuccessThreshold: 0.6},
		Output:    JobOutput{AdapterName: "precondition-verification-1", URI: "file:///tmp/a"},
		Report:    JobReport{EventsSubject: TrainingEventsSubject(id), HeartbeatSeconds: 60, DeadlineSeconds: 1800},
		Planner:   PlannerRecord{Source: PlanDefaults, Preset: "paper"},
		CreatedAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
	}
}

func TestTrainingJobRejects(t *testing.T) {
	tests := []struct {
		name, path string
		mod        func(m map[string]any)
	}{
		{"unknown field", "/", func(m map[string]any) { m["gpus"] = 8 }},
		{"nested unknown field", "/lora", func(m map[string]any) { m["lora"].(map[string]any)["bias"] = "none" }},
		{"rank out of bounds", "/lora/rank", func(m map[string]any) { m["lora"].(map[string]any)["rank"] = 4096 }},
		{"unknown target", "/lora/target_modules/0", func(m map[string]any) { m["lora"].(map[string]any)["target_modules"] = []any{"lm_head"} }},
		{"hint ratio", "/grpo/hint_ratio", func(m map[string]any) { m["grpo"].(map[string]any)["hint_ratio"] = 0.8 }},
		{"missing eval", "/", func(m map[string]any) { delete(m, "eval") }},
		{"job id of another revision", "/job_id", func(m map[string]any) { m["plan_revision"] = 2 }},
		{"events subject of another job", "/report/events_subject", func(m map[string]any) {
			m["report"].(map[string]any)["events_subject"] = "trace.training.events.job-0000000000000000"
		}},
		{"output uri longer than a success may report", "/output/uri", func(m map[string]any) {
			m["output"].(map[string]any)["uri"] = "file:///" + strings.Repeat("u", MaxAdapterURI-7)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, _ := json.Marshal(sampleJob())
			var m map[string]any
			_ = json.Unmarshal(data, &m)
			tt.mod(m)
			data, _ = json.Marshal(m)
			_, err := DecodeTrainingJob(data)
			var se *Error
			if !errors.As(err, &se) || se.Reason != ReasonSchema {
				t.Fatalf("got %v", err)
			}
			if se.Path != tt.path && !(tt.path == "/" && se.Path == "") {
				t.Fatalf("path %q, want %q (%v)", se.Path, tt.path, err)
			}
		})
	}
	if _, err := sampleJob().Encode(); err != nil {
		t.Fatalf("valid job: %v", err)
	}
}

func TestTrainingEventRules(t *testing.T) {
	it, r, s := 3, 0.5, 0.1
	id := sampleJob().JobID
	ok := []*TrainingEvent{
		{JobID: id, Type: EventStarted, At: time.Now()},
		{JobID: id, Type: EventProgress, At: time.Now(), Iteration: &it, MeanReward: &r, RewardStd: &s},
		{JobID: id, Type: EventSucceeded, At: time.Now(), Adapter: &EventAdapter{Name: "a", URI: "file:///a"}, Eval: &EvalMetrics{MeanReward: 0.7, SuccessRate: 0.5, Episodes: 200}},
		{JobID: id, Type: EventFailed, At: time.Now(), Reason: "CUDA out of memory"},
		// The longest identifiers taken: a name as long as a job's
		// output.adapter_name may be, a URI of PATH_MAX, a worker naming a
		// host of DNS's longest name.
		{JobID: id, Type: EventSucceeded, At: time.Now(), Worker: "trace-trainer@" + strings.Repeat("h", 498),
			Adapter: &EventAdapter{Name: strings.Repeat("n", 128), URI: "file:///" + strings.Repeat("u", 4096-8)}, Eval: &EvalMetrics{MeanReward: 0.7, SuccessRate: 0.5, Episodes: 200}},
	}
	for _, e := range ok {
		data, err := e.Encode()
		if err != nil {
			t.Fatalf("%s: %v", e.Type, err)
		}
		if back, err := DecodeTrainingEvent(data); err != nil || back.Type != e.Type {
			t.Fatalf("%s: %v", e.Type, err)
		}
	}
	bad := []struct{ name, json, path string }{
		{"progress without reward", `{"schema":"training_event/v1","job_id":"` + id + `","type":"progress","at":"2026-12-01T10:00:00Z","iteration":1}`, ""},
		{"succeeded without adapter", `{"schema":"training_event/v1","job_id":"` + id + `","type":"succeeded","at":"2026-12-01T10:00:00Z"}`, ""},
		{"failed without reason", `{"schema":"training_event/v1","job_id":"` + id + `","type":"failed","at":"2026-12-01T10:00:00Z"}`, ""},
		{"unknown type", `{"schema":"training_event/v1","job_id":"` + id + `","type":"paused","at":"2026-12-01T10:00:00Z"}`, "/type"},
		{"unknown field", `{"schema":"training_event/v1","job_id":"` + id + `","type":"started","at":"2026-12-01T10:00:00Z","gpu":1}`, ""},
		{"bad job id", `{"schema":"training_event/v1","job_id":"j1","type":"started","at":"2026-12-01T10:00:00Z"}`, "/job_id"},
		{"adapter name too long", succeededWith(id, strings.Repeat("n", 129), "file:///a", "w"), "/adapter/name"},
		{"adapter name of 300 KiB", succeededWith(id, strings.Repeat("n", 300<<10), "file:///a", "w"), "/adapter/name"},
		{"adapter uri too long", succeededWith(id, "a", "file:///"+strings.Repeat("u", 4096-7), "w"), "/adapter/uri"},
		{"worker too long", succeededWith(id, "a", "file:///a", strings.Repeat("w", 513)), "/worker"},
	}
	for _, tt := range bad {
		_, err := DecodeTrainingEvent([]byte(tt.json))
		var se *Error
		if !errors.As(err, &se) || (tt.path != "" && se.Path != tt.path) {
			t.Errorf("%s: got %v", tt.name, err)
		}
	}
}

// succeededWith is a succeeded event's JSON with these identifiers.
func succeededWith(jobID, name, uri, worker string) string {
	return `{"schema":"training_event/v1","job_id":"` + jobID + `","type":"succeeded","at":"2026-12-01T10:00:00Z","worker":"` + worker +
		`","adapter":{"name":"` + name + `","uri":"` + uri + `"},"eval":{"mean_reward":0.7,"success_rate":0.5,"episodes":200}}`
}

// TestJobOutputFitsItsSuccess: the longest output.uri a job may carry is
// one its trainer's succeeded event may report back (both schemas bound
// it by MaxAdapterURI): a job whose success could never be applied is
// not sent.
func TestJobOutputFitsItsSuccess(t *testing.T) {
	for _, k := range []struct {
		kind Kind
		path []string
	}{
		{KindTrainingJob, []string{"properties", "output", "properties", "uri", "maxLength"}},
		{KindTrainingEvent, []string{"properties", "adapter", "properties", "uri", "maxLength"}},
	} {
		src, err := Source(k.kind)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(src, &v); err != nil {
			t.Fatal(err)
		}
		for _, p := range k.path {
			v, _ = v.(map[string]any)[p]
		}
		if v != float64(MaxAdapterURI) {
			t.Errorf("%s: %s = %v, want MaxAdapterURI (%d)", k.kind, strings.Join(k.path, "/"), v, MaxAdapterURI)
		}
	}
	j := sampleJob()
	j.Output.URI = "file:///" + strings.Repeat("u", MaxAdapterURI-8)
	if _, err := j.Encode(); err != nil {
		t.Fatalf("a job whose output.uri is %d characters: %v", MaxAdapterURI, err)
	}
	ev := &TrainingEvent{JobID: j.JobID, Type: EventSucceeded, At: time.Now(), Adapter: &EventAdapter{Name: j.Output.AdapterName, URI: j.Output.URI},
		Eval: &EvalMetrics{MeanReward: 0.7, SuccessRate: 0.5, Episodes: 200}}
	if _, err := ev.Encode(); err != nil {
		t.Fatalf("its success: %v", err)
	}
	j.Output.URI += "u"
	if _, err := j.Encode(); err == nil {
		t.Fatalf("a job whose output.uri is %d characters, more than its success may report, was encoded", MaxAdapterURI+1)
	}
}
