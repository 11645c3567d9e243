package router

import (
	"bytes"
	"math"
)

// Token usage of proxied completions. The proxy passes the upstream's body
// through as it arrives and keeps only its last usageTail bytes; once the
// body has ended, the last "usage" object there is the request's usage:
// a completion's (OpenAI, vLLM, llama.cpp and Ollama put it at or near
// the end of the body) or, for a stream, that of the chunk the upstream
// sends last when the request asked for it (stream_options.include_usage;
// vLLM's continuous usage stats put a running total in every chunk, and
// the last is the whole). A usage the tail does not hold is not reported.

// usageTail is how much of a body's end is kept to find its usage:
// llama.cpp follows the usage with its timings (~400 bytes), a stream
// with include_usage ends with the usage chunk and "data: [DONE]".
const usageTail = 4 << 10

// Usage is the token usage an upstream reported for a completion.
type Usage struct {
	PromptTokens, CompletionTokens uint32
}

// keepTail appends p to tail, keeping at most usageTail bytes (the last);
// tail's capacity is usageTail.
func keepTail(tail, p []byte) []byte {
	if len(p) >= usageTail {
		return append(tail[:0], p[len(p)-usageTail:]...)
	}
	if over := len(tail) + len(p) - usageTail; over > 0 {
		tail = tail[:copy(tail, tail[over:])]
	}
	return append(tail, p...)
}

var usageKey = []byte(`"usage"`)

// parseUsage finds the last "usage" object in b, a body's end, with its
// prompt_tokens and completion_tokens counts. A quoted "usage" inside a
// string is escaped in JSON (\"usage\"), so it never matches; "usage":
// null (a stream's chunks before the last) is passed over. It allocates
// nothing: it runs once per proxied request.
func parseUsage(b []byte) (Usage, bool) {
	for end := len(b); end > 0; {
		i := bytes.LastIndex(b[:end], usageKey)
		if i < 0 {
			return Usage{}, false
		}
		end = i
		rest, ok := memberValue(b[i+len(usageKey):])
		if !ok || len(rest) == 0 || rest[0] != '{' {
			continue
		}
		if u, ok := usageCounts(rest); ok {
			return u, true
		}
	}
	return Usage{}, false
}

// usageCounts reads prompt_tokens and completion_tokens from the members
// of the JSON object b starts with; false unless both are there as
// non-negative integers (every OpenAI-compatible server sends both) and
// the object ends within b.
func usageCounts(b []byte) (Usage, bool) {
	var u Usage
	found, depth := 0, 0
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			j := stringEnd(b, i)
			if j < 0 {
				return Usage{}, false
			}
			key := b[i+1 : j-1]
			i = j - 1
			if depth != 1 {
				continue
			}
			var dst *uint32
			var bit int
			switch string(key) { // no allocation: the compiler compares in place
			case "prompt_tokens":
				dst, bit = &u.PromptTokens, 1
			case "completion_tokens":
				dst, bit = &u.CompletionTokens, 2
			default:
				continue
			}
			v, ok := memberValue(b[j:])
			if !ok {
				continue // a string value, not a member's name
			}
			if n, l := count(v); l > 0 {
				*dst, found = n, found|bit
				i = len(b) - len(v) + l - 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return u, found == 3
			}
		}
	}
	return Usage{}, false // cut off: the body ended inside it
}

// memberValue is what follows a member's name (b starts after it): the
// value after the colon and the white space around it; false when no colon
// follows (the name was a string value).
func memberValue(b []byte) ([]byte, bool) {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 || b[0] != ':' {
		return nil, false
	}
	return bytes.TrimLeft(b[1:], " \t\r\n"), true
}

// stringEnd is the index after the closing quote of the JSON string that
// starts at b[i], or -1 when b ends inside it.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++ // the escaped byte
		case '"':
			return j + 1
		}
	}
	return -1
}

// count is the non-negative integer b starts with (clamped to uint32) and
// its length; length 0 when b does not start with one that ends there (a
// fraction, an exponent or a sign is not a token count).
func count(b []byte) (uint32, int) {
	var n uint64
	l := 0
	for l < len(b) && b[l] >= '0' && b[l] <= '9' {
		n = min(n*10+uint64(b[l]-'0'), math.MaxUint32)
		l++
	}
	if l == 0 || (l < len(b) && (b[l] == '.' || b[l] == 'e' || b[l] == 'E')) {
		return 0, 0
	}
	return uint32(n), l
}
