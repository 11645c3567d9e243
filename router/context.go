package router

import "strings"

// Context modes (router.context): what the classifier reads.
const (
	ContextFirstUser = "first_user" // the first user turn (TRACE's default)
	ContextLastN     = "last_n"     // the last N user and assistant turns
)

// Turn is one message of a conversation as the router reads it: a role and
// its text (array content parts joined).
type Turn struct {
	Role string
	Text string
}

// SelectContext returns the turns the classifier is shown: the first user
// turn, or the last n user/assistant turns (system and tool messages are
// left out; n < 1 means 1). Empty when there is no user turn.
func SelectContext(turns []Turn, mode string, n int) []Turn {
	hasUser := false
	for _, t := range turns {
		if t.Role == "user" && strings.TrimSpace(t.Text) != "" {
			hasUser = true
			break
		}
	}
	if !hasUser {
		return nil
	}
	if mode == ContextLastN {
		n = max(n, 1)
		var out []Turn
		for i := len(turns) - 1; i >= 0 && len(out) < n; i-- {
			if t := turns[i]; (t.Role == "user" || t.Role == "assistant") && strings.TrimSpace(t.Text) != "" {
				out = append(out, t)
			}
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
		return out
	}
	for _, t := range turns {
		if t.Role == "user" && strings.TrimSpace(t.Text) != "" {
			return []Turn{t}
		}
	}
	return nil
}
