package synthesizer

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/calibrate"
)

func TestSettingsValidateNamesTheField(t *testing.T) {
	if err := DefaultSettings().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c := DefaultSettings().CalibrationConfig(); c.Seeds != 100 || c.Rollouts != 16 || c.Temperature != 0.7 || c.Bands != calibrate.DefaultBands() {
		t.Fatalf("defaults are not the release's: %+v", c)
	}
	tests := []struct {
		mut  func(s *Settings)
		want string
	}{
		{func(s *Settings) { s.MaxAttempts = 6 }, "synthesizer.max_attempts: must be 1 to 5"},
		{func(s *Settings) { s.Concurrency = 0 }, "synthesizer.concurrency"},
		{func(s *Settings) { s.AckWait = 0 }, "synthesizer.ack_wait"},
		{func(s *Settings) { s.MaxDeliver = 0 }, "synthesizer.max_deliver"},
		{func(s *Settings) { s.NakDelay = -1 }, "synthesizer.nak_delay"},
		{func(s *Settings) { s.MaxTokens = 10 }, "synthesizer.max_tokens"},
		{func(s *Settings) { s.GenerationTimeout = 0 }, "synthesizer.generation_timeout"},
		{func(s *Settings) { s.Policy = "oracle" }, `synthesizer.policy: must be "model" or "simulated"`},
		{func(s *Settings) { s.NakDelay = 10 * time.Minute }, "synthesizer.nak_delay: must be positive and at most 5m0s"},
		{func(s *Settings) { s.Calibration.Seeds = 0 }, "synthesizer.calibration.seeds = 0"},
		{func(s *Settings) { s.Calibration.Temperature = 3 }, "synthesizer.calibration.temperature = 3"},
		{func(s *Settings) { s.Calibration.Bands.MeanMin = 0.7 }, "synthesizer.calibration.bands.mean_min = 0.7 is above synthesizer.calibration.bands.mean_max"},
		{func(s *Settings) { s.Calibration.Bands.MaxConstant = 2 }, "synthesizer.calibration.bands.max_constant = 2"},
		{func(s *Settings) {
			s.Policies = []PolicySettings{{Environment: "e", AgentVersion: "*", BaseURL: "http://x/v1"}}
		}, "synthesizer.policies[0].model: is required"},
		{func(s *Settings) {
			s.Policies = []PolicySettings{{Environment: "e", BaseURL: "http://x/v1", Model: "m"}}
		}, "synthesizer.policies[0].agent_version"},
	}
	for _, tt := range tests {
		s := DefaultSettings()
		tt.mut(&s)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("error %v, want %q", err, tt.want)
		}
	}
}

func TestPolicyFor(t *testing.T) {
	s := DefaultSettings()
	s.Policies = []PolicySettings{
		{Environment: "air", AgentVersion: "1.4.0", BaseURL: "http://a/v1", Model: "agent-1.4"},
		{Environment: "air", AgentVersion: "*", BaseURL: "http://a/v1", Model: "agent-any"},
	}
	def := PolicySettings{BaseURL: "http://label/v1", Model: "labeler"}
	for _, tt := range []struct {
		env, av, want string
		ok            bool
	}{{"air", "1.4.0", "agent-1.4", true}, {"air", "2.0", "agent-any", true}, {"retail", "1.5.0", "labeler", true}} {
		if p, ok := s.PolicyFor(tt.env, tt.av, def); p.Model != tt.want || ok != tt.ok {
			t.Errorf("%s/%s: %s %v", tt.env, tt.av, p.Model, ok)
		}
	}
	if _, ok := s.PolicyFor("retail", "1", PolicySettings{}); ok {
		t.Error("a policy without a model")
	}
}

// TestNoPolicyWaits: with neither a policy for the cohort nor a labeling
// model, nothing can calibrate: the environment waits with the reason, and
// no program is written.
func TestNoPolicyWaits(t *testing.T) {
	store := newMemStore()
	stage, err := Build(DefaultSettings(), Deps{Store: store,
		PolicyClient: func(p PolicySettings) (*llm.Client, error) {
			return llm.New(llm.Config{BaseURL: p.BaseURL, Model: p.Model})
		}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := stage.Synthesize(context.Background(), airlineRequest("trig-no-policy"))
	if err != nil || e.Status != StatusWaitingForLLM || !strings.Contains(e.Reason, "no policy model to calibrate with for sim-airline/1.4.0") || len(e.Attempts) != 0 {
		t.Fatalf("%v %s %q", err, e.Status, e.Reason)
	}
	// A policy configured later: the template path goes on.
	s := DefaultSettings()
	s.Calibration.Seeds, s.Calibration.Rollouts = 30, 8
	s.Policy = PolicySimulated
	stage, err = Build(s, Deps{Store: store, Simulated: simulatedFleet})
	if err != nil {
		t.Fatal(err)
	}
	if e, err = stage.Synthesize(context.Background(), airlineRequest("trig-no-policy")); err != nil || e.Path != PathTemplate || len(e.Attempts) == 0 {
		t.Fatalf("resumed: %v %s %s %d attempts", err, e.Status, e.Path, len(e.Attempts))
	}
	if _, err := Build(s, Deps{Store: store}); err == nil || !strings.Contains(err.Error(), "only available in trace demo") {
		t.Fatalf("simulated without the fleet: %v", err)
	}
	s.Policy = PolicyModel
	if _, err := Build(s, Deps{Store: store}); err == nil {
		t.Fatal("model policy without a client maker")
	}
}

// TestPolicyClientsByKey: cohorts whose agent models share a URL and a
// model name but not an API key get a client each (they shared the first
// one made, and its key); the same policy reuses its client.
func TestPolicyClientsByKey(t *testing.T) {
	s := DefaultSettings()
	s.Policies = []PolicySettings{
		{Environment: "air", AgentVersion: "*", BaseURL: "http://gw/v1", Model: "agent", APIKey: "key-air"},
		{Environment: "retail", AgentVersion: "*", BaseURL: "http://gw/v1", Model: "agent", APIKey: "key-retail"},
	}
	var made []string
	stage, err := Build(s, Deps{Store: newMemStore(), PolicyClient: func(p PolicySettings) (*llm.Client, error) {
		made = append(made, p.APIKey)
		return llm.New(llm.Config{BaseURL: p.BaseURL, Model: p.Model, APIKey: llm.Secret(p.APIKey)})
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range []string{"air", "retail", "air"} {
		if _, err := stage.cfg.Calibrators(&Job{ID: "env-1", Request: &schemas.SynthesisRequest{Environment: env, AgentVersion: "1.0"}}); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(made, []string{"key-air", "key-retail"}) {
		t.Fatalf("clients made with keys %v, want one per key, reused", made)
	}
}
