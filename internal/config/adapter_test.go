package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAdapterPlanOverridesLoad(t *testing.T) {
	f := filepath.Join(t.TempDir(), "trace.yaml")
	os.WriteFile(f, []byte(`
adapter:
  plan:
    preset: release
    deadline: 2h
    defaults:
      base_model: Qwen/Qwen3-8B
    environments:
      sim-airline:
        iterations: 30
    capabilities:
      precondition_verification:
        hint_ratio: 0.5
        kl_coef: 0.01
`), 0o644)
	c, err := Load(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := c.Adapter.Plan
	if p.Preset != "release" || p.Deadline != 2*time.Hour || p.Defaults.BaseModel != "Qwen/Qwen3-8B" || p.Environments["sim-airline"].Iterations != 30 {
		t.Fatalf("plan %+v", p)
	}
	cp := p.Capabilities["precondition_verification"]
	if cp.HintRatio == nil || *cp.HintRatio != 0.5 || cp.KLCoef == nil || *cp.KLCoef != 0.01 || cp.LoRADropout != nil {
		t.Fatalf("capability override %+v", cp)
	}
	s, set, err := p.Resolve("sim-airline", "precondition_verification")
	if err != nil || s.Iterations != 30 || *s.HintRatio != 0.5 || s.ClipEpsilon != 0.28 || len(set) != 4 {
		t.Fatalf("resolved %+v %v %v", s, set, err)
	}
	if c.Adapter.Backend != "nats" || !c.Has("adapt") {
		t.Fatalf("adapt role and nats backend are the defaults: %v %q", c.Roles, c.Adapter.Backend)
	}
}

func TestAdapterValidateNamesTheField(t *testing.T) {
	for _, tt := range []struct {
		yaml, want string
	}{
		{"adapter:\n  backend: slurm\n", `adapter.backend: "slurm"`},
		{"adapter:\n  plan:\n    capabilities:\n      x:\n        lora_rank: 999\n", "adapter.plan.capabilities.x.lora_rank: must be in [1, 256], got 999"},
		{"adapter:\n  plan:\n    environments:\n      sim-retail:\n        temperature: 9\n", "adapter.plan.environments.sim-retail.temperature"},
		{"adapter:\n  plan:\n    preset: fast\n", "adapter.plan.preset"},
		{"adapter:\n  plan:\n    env_server_url: nope\n", "adapter.plan.env_server_url"},
	} {
		f := filepath.Join(t.TempDir(), "trace.yaml")
		os.WriteFile(f, []byte(tt.yaml), 0o644)
		_, err := Load(f, nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want %q", tt.yaml, err, tt.want)
		}
	}
}
