package analyzer_test

import (
	"strings"
	"testing"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/schemas"
)

// TestKOfN: a cohort's K of N follows the sources of its labels unless
// analyzer.k and analyzer.n are set, which apply to every cohort.
func TestKOfN(t *testing.T) {
	const (
		rules    = schemas.SourceRules
		llm      = schemas.SourceLLM
		external = schemas.SourceExternal
	)
	tests := []struct {
		name    string
		cfg     analyzer.EvalConfig
		sources []string
		want    analyzer.KOfN
	}{
		{"rules: one deterministic run", analyzer.EvalConfig{}, []string{rules}, analyzer.KOfN{K: 1, N: 1}},
		{"external: TRACE's 8 of 10", analyzer.EvalConfig{}, []string{external}, analyzer.KOfN{K: 8, N: 10}},
		{"llm: llm.runs unset is 10", analyzer.EvalConfig{}, []string{llm}, analyzer.KOfN{K: 8, N: 10}},
		{"llm: 8/10 of llm.runs, rounded up", analyzer.EvalConfig{LLMRuns: 5}, []string{llm}, analyzer.KOfN{K: 4, N: 5}},
		{"llm: 3 runs", analyzer.EvalConfig{LLMRuns: 3}, []string{llm}, analyzer.KOfN{K: 3, N: 3}},
		{"llm: 1 run", analyzer.EvalConfig{LLMRuns: 1}, []string{llm}, analyzer.KOfN{K: 1, N: 1}},
		{"llm: 20 runs", analyzer.EvalConfig{LLMRuns: 20}, []string{llm}, analyzer.KOfN{K: 16, N: 20}},
		{"llm.runs does not touch external labels", analyzer.EvalConfig{LLMRuns: 5}, []string{external}, analyzer.KOfN{K: 8, N: 10}},
		{"an unknown source counts as external", analyzer.EvalConfig{}, []string{"human"}, analyzer.KOfN{K: 8, N: 10}},
		{"no labels: TRACE's default", analyzer.EvalConfig{}, nil, analyzer.KOfN{K: 8, N: 10}},
		{"rules and external: the most runs", analyzer.EvalConfig{}, []string{external, rules}, analyzer.KOfN{K: 8, N: 10}},
		{"rules and llm: the most runs", analyzer.EvalConfig{LLMRuns: 5}, []string{llm, rules}, analyzer.KOfN{K: 4, N: 5}},
		{"llm above external", analyzer.EvalConfig{LLMRuns: 20}, []string{external, llm}, analyzer.KOfN{K: 16, N: 20}},
		{"explicit k and n apply to rules", analyzer.EvalConfig{K: 8, N: 10}, []string{rules}, analyzer.KOfN{K: 8, N: 10}},
		{"explicit k and n apply to external", analyzer.EvalConfig{K: 1, N: 1}, []string{external}, analyzer.KOfN{K: 1, N: 1}},
		{"explicit k and n apply to llm", analyzer.EvalConfig{K: 2, N: 3, LLMRuns: 5}, []string{llm}, analyzer.KOfN{K: 2, N: 3}},
		{"explicit k alone, n by source", analyzer.EvalConfig{K: 9}, []string{external}, analyzer.KOfN{K: 9, N: 10}},
		{"explicit n alone, k 8/10 of it", analyzer.EvalConfig{N: 5}, []string{external}, analyzer.KOfN{K: 4, N: 5}},
		{"explicit n alone, rules too", analyzer.EvalConfig{N: 10}, []string{rules}, analyzer.KOfN{K: 8, N: 10}},
	}
	for _, tt := range tests {
		if got := tt.cfg.KOfN(tt.sources); got != tt.want {
			t.Errorf("%s: KOfN(%v) with k=%d n=%d llm.runs=%d = %+v, want %+v", tt.name, tt.sources, tt.cfg.K, tt.cfg.N, tt.cfg.LLMRuns, got, tt.want)
		}
	}
}

func TestScaledK(t *testing.T) {
	for n, k := range map[int]int{1: 1, 2: 2, 3: 3, 4: 4, 5: 4, 6: 5, 7: 6, 8: 7, 9: 8, 10: 8, 11: 9, 20: 16} {
		if got := analyzer.ScaledK(n); got != k {
			t.Errorf("ScaledK(%d) = %d, want %d", n, got, k)
		}
	}
}

func TestLabelerSource(t *testing.T) {
	for labeler, src := range map[string]string{"rules": schemas.SourceRules, "llm": schemas.SourceLLM, "none": schemas.SourceExternal} {
		if got := analyzer.LabelerSource(labeler); got != src {
			t.Errorf("LabelerSource(%q) = %q, want %q", labeler, got, src)
		}
	}
}

// TestEvalConfigKAndNValidate: 0 is "each cohort's"; set, n must be at
// least k.
func TestEvalConfigKAndNValidate(t *testing.T) {
	for _, tt := range []struct {
		k, n int
		want string // "" valid
	}{
		{0, 0, ""}, {8, 10, ""}, {1, 1, ""}, {9, 0, ""}, {0, 3, ""},
		{-1, 0, "analyzer.k"}, {0, -1, "analyzer.n"}, {11, 10, "analyzer.n"},
	} {
		err := analyzer.EvalConfig{K: tt.k, N: tt.n}.WithDefaults().Validate()
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("k=%d n=%d: %v, want %q", tt.k, tt.n, err, tt.want)
		}
	}
}
