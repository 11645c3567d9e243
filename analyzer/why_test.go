package analyzer

import (
	"strings"
	"testing"

	"github.com/traceops/trace/sink"
)

// TestWhyNoLabels: each reason a cohort gets no labels names the setting or
// command that changes it.
func TestWhyNoLabels(t *testing.T) {
	withDetector := &Dictionary{Environment: "airline", AgentVersion: "*", Version: 2,
		Capabilities: []Capability{{Name: "precondition_verification", Definition: "d", Detector: "'NA'"}}}
	noDetector := &Dictionary{Environment: "airline", AgentVersion: "*", Version: 3,
		Capabilities: []Capability{{Name: "precondition_verification", Definition: "d"}}}
	failed := sink.FailedRuns{Labeler: "llm", Runs: 4, Reason: "the endpoint\nanswered 500"}
	for _, tc := range []struct {
		name   string
		setup  LabelingSetup
		d      *Dictionary
		failed sink.FailedRuns
		want   []string
	}{
		{"labeler none", LabelingSetup{Labeler: "none"}, withDetector, sink.FailedRuns{}, []string{"analyzer.labeler is none", "analyzer.labeler: rules or llm"}},
		{"no dictionary, no LLM", LabelingSetup{Labeler: "rules"}, nil, sink.FailedRuns{}, []string{"no dictionary for airline/1.0", "trace dict apply FILE --backfill", "analyzer.default_dictionary", "llm.base_url"}},
		{"no dictionary yet, discovery on", LabelingSetup{Labeler: "llm", LLM: true}, nil, sink.FailedRuns{}, []string{"discovery (llm.base_url) has not proposed one"}},
		{"failed runs", LabelingSetup{Labeler: "llm", LLM: true}, withDetector, failed, []string{"the llm labeler failed on 4 labeling runs (the endpoint answered 500)", "trace relabel --env airline"}},
		{"rules without detectors", LabelingSetup{Labeler: "rules"}, noDetector, sink.FailedRuns{}, []string{"no detector for precondition_verification", "analyzer.labeler: llm"}},
		{"labels it, not labeled", LabelingSetup{Labeler: "rules"}, withDetector, sink.FailedRuns{}, []string{"trace relabel --env airline", "trace run --roles analyze", "analyzer.labeler: none"}},
	} {
		got := WhyNoLabels(tc.setup, "airline", "1.0", tc.d, tc.failed)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.name, got, w)
			}
		}
	}
}
