package router

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

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
	// Media is the message's parts other than text (images, audio,
	// files) as their JSON: the conversation hash reads them, the
	// classifier does not (the proxy fills it up to the first user turn,
	// the turns the hash reads).
	Media string
}

// DefaultContextMaxChars bounds the text the classifier is shown
// (router.context_max_chars): ~4,000 tokens, so that a first turn that
// fills the model's context leaves room for the routing prompt instead of
// failing the classification.
const DefaultContextMaxChars = 16000

// CapContext shortens turns whose text together exceeds maxChars (< 1: no
// bound): the budget is shared out in order, and a turn over its share
// keeps its beginning (two thirds, where a request usually states the
// task) and its end, joined by a marker naming how much was left out. The
// turns are copies; the request forwarded upstream is untouched.
func CapContext(turns []Turn, maxChars int) []Turn {
	total := 0
	for _, t := range turns {
		total += utf8.RuneCountInString(t.Text)
	}
	if maxChars < 1 || total <= maxChars {
		return turns
	}
	out := make([]Turn, len(turns))
	left := maxChars
	for i, t := range turns {
		share := left / (len(turns) - i)
		if n := utf8.RuneCountInString(t.Text); n <= share {
			left -= n
		} else {
			r := []rune(t.Text) // only a turn that is cut
			head := share * 2 / 3
			tail := share - head
			t.Text = string(r[:head]) + fmt.Sprintf("\n[… %d characters left out …]\n", len(r)-share) + string(r[len(r)-tail:])
			left -= share
		}
		out[i] = t
	}
	return out
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
