package calibrate

import (
	"strings"

	"github.com/traceops/trace/synthesizer/envprog"
)

// hintSep separates the system prompt from the hint block WithHint appends.
const hintSep = "\n\n"

// WithHint appends hint to a system prompt inside the expert-guidance tags
// (envprog.HintOpen … envprog.HintClose), as hinted rollouts see it. An
// empty hint leaves the prompt unchanged. StripHint undoes it exactly.
func WithHint(system, hint string) string {
	hint = strings.TrimSpace(hint)
	if hint == "" {
		return system
	}
	return system + hintSep + envprog.HintOpen + "\n" + hint + "\n" + envprog.HintClose
}

// StripHint removes every expert-guidance block from a system prompt,
// tags included, with the blank line WithHint put before it, so
// StripHint(WithHint(s, h)) == s. Trainers call it before the gradient
// step (TRACE-METHOD.md step 2). A block opened and never closed is
// removed to the end of the prompt: a cut-off hint must not leak into
// training either.
func StripHint(system string) string {
	if !strings.Contains(system, envprog.HintOpen) {
		return system
	}
	var b strings.Builder
	rest := system
	for {
		i := strings.Index(rest, envprog.HintOpen)
		if i < 0 {
			b.WriteString(rest)
			break
		}
		b.WriteString(strings.TrimSuffix(rest[:i], hintSep))
		rest = rest[i+len(envprog.HintOpen):]
		j := strings.Index(rest, envprog.HintClose)
		if j < 0 {
			break
		}
		rest = rest[j+len(envprog.HintClose):]
	}
	return b.String()
}

// StripHints returns msgs with the hint block removed from every system
// message (a copy; msgs is not changed).
func StripHints(msgs []envprog.Message) []envprog.Message {
	out := make([]envprog.Message, len(msgs))
	copy(out, msgs)
	for i := range out {
		if out[i].Role == "system" {
			out[i].Content = StripHint(out[i].Content)
		}
	}
	return out
}
