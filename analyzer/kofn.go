package analyzer

import (
	"cmp"

	"github.com/traceops/trace/schemas"
)

// KOfN is the selection rule's K of N for one cohort: a capability is
// selected when it passes in at least K of N labeling runs, and the cohort
// is decided only with N complete runs in its window (a rollout takes part
// only when it is labeled in all N, see sink.WindowSpec.Runs).
type KOfN struct {
	K int `json:"k"`
	N int `json:"n"`
}

// DefaultRuns is TRACE's N: K = 8 of N = 10 (TRACE-METHOD.md, selection).
const DefaultRuns = 10

// SourceRuns is how many labeling runs labels of a source come in, the N
// of their cohort when analyzer.n is unset: the rules labeler is
// deterministic and runs once; the llm labeler makes llm.runs (llmRuns; 0:
// DefaultRuns); external labels (the labels topic, `trace labels import`),
// like any source not known, DefaultRuns.
func SourceRuns(source string, llmRuns int) int {
	switch source {
	case schemas.SourceRules:
		return 1
	case schemas.SourceLLM:
		return cmp.Or(llmRuns, DefaultRuns)
	default:
		return DefaultRuns
	}
}

// LabelerSource is the source of the labels a configured labeler
// (analyzer.labeler) writes; with none, only external labels come in.
func LabelerSource(labeler string) string {
	switch labeler {
	case schemas.SourceRules, schemas.SourceLLM:
		return labeler
	default:
		return schemas.SourceExternal
	}
}

// ScaledK is K for N runs when analyzer.k is unset: 8/10 of N rounded up,
// at least 1 (8 of 10, 4 of 5, 1 of 1).
func ScaledK(n int) int { return max(1, (8*n+9)/10) }

// KOfN is the K of N of a cohort whose labels came from sources (as
// sink.Store.LabelSources reads them). analyzer.k and analyzer.n, when set,
// apply to every cohort. Unset, N is the largest N of the cohort's sources
// (SourceRuns) and K is ScaledK of it: a cohort labeled by two sources (an
// llm relabel of rules labels, an import beside a labeler) is decided on
// its rollouts labeled in every run of the source with the most runs, never
// on one run of a source that makes several.
func (c EvalConfig) KOfN(sources []string) KOfN {
	n := c.N
	if n == 0 {
		for _, s := range sources {
			n = max(n, SourceRuns(s, c.LLMRuns))
		}
		n = cmp.Or(n, DefaultRuns) // no labels: no window to decide on either
	}
	return KOfN{K: cmp.Or(c.K, ScaledK(n)), N: n}
}
