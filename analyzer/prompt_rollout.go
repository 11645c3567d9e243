package analyzer

import "github.com/traceops/trace/schemas"

// PromptRolloutOf is r as the labeling and discovery prompts show it
// (compacted, escaped, the middle of a long conversation left out beyond
// maxChars); the synthesizer's generation prompt shows example failures so.
func PromptRolloutOf(r *schemas.Rollout, maxChars int) PromptRollout {
	return promptRollout(r, maxChars)
}
