package config

import (
	"strings"
	"testing"
	"time"
)

func TestPlannerAndServingConfig(t *testing.T) {
	c, err := Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Adapter.Planner.Enabled || c.Adapter.Serving.Enabled || c.Adapter.AutoActivate {
		t.Fatalf("planner, serving and auto-activation must be off by default: %+v", c.Adapter)
	}
	if c.Adapter.Serving.ReconcileEvery != time.Minute {
		t.Errorf("adapter.serving.reconcile_every: %s by default, want 1m", c.Adapter.Serving.ReconcileEvery)
	}
	if off, err := Load("", []string{"adapter.serving.reconcile_every=0"}); err != nil || off.Adapter.Serving.ReconcileEvery != 0 {
		t.Errorf("adapter.serving.reconcile_every=0 (off): %v", err)
	}
	for _, tc := range []struct {
		sets []string
		want string
	}{
		{[]string{"adapter.planner.enabled=true"}, "adapter.planner.enabled: needs llm.base_url"},
		{[]string{"adapter.planner.enabled=true", "llm.base_url=http://x/v1"}, "adapter.planner.model: required"},
		{[]string{"adapter.planner.max_tokens=4"}, "adapter.planner.max_tokens: must be in [16, 32768], got 4"},
		{[]string{"adapter.serving.enabled=true"}, `adapter.serving.base_url: "" is not an http(s) URL`},
		{[]string{"adapter.serving.enabled=true", "adapter.serving.base_url=vllm:8000"}, "adapter.serving.base_url"},
		{[]string{"adapter.serving.engine=tgi"}, `adapter.serving.engine: "tgi" is not vllm`},
		{[]string{"adapter.serving.path_map=nothing"}, `adapter.serving.path_map: "nothing" is not FROM=TO`},
		{[]string{"adapter.serving.retry_for=0s"}, "adapter.serving.retry_for: must be positive"},
		{[]string{"adapter.serving.reconcile_every=-1m"}, "adapter.serving.reconcile_every: must be 0 (off) or at least 1s, got -1m0s"},
		{[]string{"adapter.serving.reconcile_every=10ms"}, "adapter.serving.reconcile_every: must be 0 (off) or at least 1s, got 10ms"},
	} {
		_, err := Load("", tc.sets)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.sets, err, tc.want)
		}
	}
	c, err = Load("", []string{"adapter.planner.enabled=true", "llm.base_url=http://x/v1", "adapter.planner.model=planner",
		"adapter.serving.enabled=true", "adapter.serving.base_url=http://vllm:8000/v1", "adapter.serving.token=s3cret",
		"adapter.serving.path_map=file:///var/lib/trace/adapters=/models", "adapter.auto_activate=true"})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := PathMapOf(c.Adapter.Serving.PathMap)
	if !c.Adapter.AutoActivate || m["file:///var/lib/trace/adapters"] != "/models" || c.Adapter.Planner.Model != "planner" {
		t.Errorf("%+v", c.Adapter)
	}
	if r := c.Redacted(); r.Adapter.Serving.Token != "[REDACTED]" {
		t.Error("the serving token is not redacted")
	}
}
