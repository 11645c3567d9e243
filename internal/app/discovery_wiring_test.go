package app

import (
	"log/slog"
	"testing"

	"github.com/traceops/trace/internal/config"
)

// TestDiscoveryOnlyWithTheLLMLabeler: a discovered dictionary has no
// detectors, so only the llm labeler can label with it. With the rules
// labeler and llm.base_url set (for the synthesizer's generation agent),
// discovery must not run: its proposal would take over from the default
// dictionary, and the cohort would get no label.
func TestDiscoveryOnlyWithTheLLMLabeler(t *testing.T) {
	for _, tc := range []struct {
		labeler, baseURL string
		runs             bool
	}{
		{"llm", "http://127.0.0.1:1/v1", true},
		{"rules", "http://127.0.0.1:1/v1", false},
		{"rules", "", false},
		{"none", "http://127.0.0.1:1/v1", false},
	} {
		sets := []string{"analyzer.labeler=" + tc.labeler, "llm.model=m"}
		if tc.baseURL != "" {
			sets = append(sets, "llm.base_url="+tc.baseURL)
		}
		cfg, err := config.Load("", sets)
		if err != nil {
			t.Fatalf("%v: %v", sets, err)
		}
		a := &App{Cfg: cfg, Log: slog.New(slog.DiscardHandler)}
		dr, err := a.discoveryRunner()
		if err != nil {
			t.Fatalf("%v: %v", sets, err)
		}
		if got := dr != nil; got != tc.runs {
			t.Errorf("labeler %s, llm.base_url %q: discovery runs %v, want %v", tc.labeler, tc.baseURL, got, tc.runs)
		}
	}
}
