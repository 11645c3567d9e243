package analyzer

import (
	"fmt"
	"strings"

	"github.com/traceops/trace/sink"
)

// LabelingSetup is the part of the configuration that decides whether a
// cohort gets labels.
type LabelingSetup struct {
	Labeler string // analyzer.labeler: rules | llm | none
	LLM     bool   // discovery runs: llm.base_url is set and Labeler is llm
}

// WhyNoLabels explains why an (environment, agent version) that has stored
// rollouts has no labels under d, the dictionary that labels it now (nil:
// none), naming the setting or command that changes it. failed is its
// cohort's failed labeling runs (zero Runs: none).
func WhyNoLabels(s LabelingSetup, env, agentVersion string, d *Dictionary, failed sink.FailedRuns) string {
	switch {
	case s.Labeler == "none":
		return "analyzer.labeler is none: only external label events (the Kafka labels topic) label rollouts; set analyzer.labeler: rules or llm"
	case d == nil && !s.LLM:
		return fmt.Sprintf("no dictionary for %s/%s and no LLM for discovery: apply one (trace dict apply FILE --backfill), keep analyzer.default_dictionary: true, or set analyzer.labeler: llm and llm.base_url", env, agentVersion)
	case d == nil:
		return fmt.Sprintf("no dictionary for %s/%s yet: discovery (llm.base_url) has not proposed one; the log says why (discovery failed ...)", env, agentVersion)
	case failed.Runs > 0:
		return fmt.Sprintf("the %s labeler failed on %d labeling runs (%s): fix dictionary %s v%d (trace dict apply) or the labeler's settings (analyzer.labeler, llm.*), then trace relabel --env %s",
			failed.Labeler, failed.Runs, oneLineCut(failed.Reason, 160), d.Scope(), d.Version, env)
	}
	if s.Labeler == "rules" {
		if missing := d.WithoutDetector(); len(missing) > 0 {
			return fmt.Sprintf("dictionary %s v%d has no detector for %s: the rules labeler cannot label with it; add detectors or set analyzer.labeler: llm", d.Scope(), d.Version, strings.Join(missing, ", "))
		}
	}
	return fmt.Sprintf("dictionary %s v%d labels it, but its stored rollouts are not labeled: they arrived before the dictionary (label them: trace relabel --env %s), no analyze role is running (trace run --roles analyze), or the one running has analyzer.labeler: none (its dashboard says which)", d.Scope(), d.Version, env)
}

// WhyUndecided explains a cohort with labels but no decision, naming the
// setting; "" when it is decided.
func WhyUndecided(failures, minFailures, runs, n int) string {
	switch {
	case failures < minFailures:
		return fmt.Sprintf("%d failures in the window, needs %d (analyzer.min_failures; or a longer analyzer.window)", failures, minFailures)
	case runs < n:
		return fmt.Sprintf("%d complete labeling runs, needs %d (analyzer.n, llm.runs)", runs, n)
	}
	return ""
}

func oneLineCut(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
