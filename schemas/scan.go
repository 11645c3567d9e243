package schemas

// The hand-written rollout parser: the one DecodeRawRollout uses.
//
// It reads a rollout in one pass over the bytes and checks exactly what
// parseJSONText (codec.go, on jsontext) checks: the same documents are
// accepted, with the same raw values (FuzzParserMatchesSchema runs both
// against the JSON Schema library). It exists because it costs about half
// the CPU per rollout, and the ingest stage is CPU-bound on a machine it
// shares with ClickHouse: docs/ARCHITECTURE.md ("The rollout codec") has the
// measurements. Long strings, which are most of a rollout's bytes, are
// validated 64 bytes at a time (masks_amd64.s, SSE2; masks_other.go
// elsewhere); everything else is plain Go: no unsafe, no panics, strings
// copied out of the input, values handed out as slices of it.
//
// Strictness, as jsontext's: a repeated member name in any object (compared
// after unescaping), an escaped lone surrogate and nesting deeper than
// 10,000 levels are refused; UTF-8 is checked before (utf8.Valid).

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// scanMaxDepth is encoding/json's and jsontext's nesting limit.
const scanMaxDepth = 10000

// scanMaxLinearKeys: objects with more names than this check repeats with a
// map instead of comparing each new name with every earlier one.
const scanMaxLinearKeys = 16

type scanner struct {
	b     []byte
	i     int
	depth int
	why   string
	names [][]byte // the names of the objects being read, innermost last
}

// scanRollout parses a rollout; nil and why when it is not accepted.
func scanRollout(data []byte) (*RawRollout, string) {
	if !utf8.Valid(data) {
		return nil, "invalid UTF-8"
	}
	s := scanners.Get().(*scanner)
	defer func() {
		clear(s.names[:cap(s.names)])
		*s = scanner{names: s.names[:0]}
		scanners.Put(s)
	}()
	*s = scanner{b: data, names: s.names[:0]}
	r := new(RawRollout)
	if !s.rollout(r) {
		return nil, s.why
	}
	s.ws()
	if s.i != len(s.b) {
		return nil, "trailing data after the JSON value"
	}
	return r, ""
}

var scanners = sync.Pool{New: func() any { return new(scanner) }}

func (s *scanner) fail(why string) bool {
	if s.why == "" {
		s.why = why
	}
	return false
}

func (s *scanner) syntax() bool { return s.fail("JSON syntax error at byte " + strconv.Itoa(s.i)) }

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte, 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

// strText reads the string at s.i and returns its JSON text, quotes
// included, as a slice of the input.
func (s *scanner) strText() ([]byte, bool) {
	start := s.i
	end, noLone, ok := skipStr(s.b, start+1)
	if !ok {
		s.i = end
		return nil, s.syntax()
	}
	if !noLone {
		return nil, s.fail("a string escapes a lone surrogate")
	}
	s.i = end
	return s.b[start:end:end], true
}

// stringValue reads a string and returns it unescaped (a copy).
func (s *scanner) stringValue(what string) (string, bool) {
	if s.peek() != '"' {
		return "", s.fail(what + " is not a string")
	}
	text, ok := s.strText()
	if !ok {
		return "", false
	}
	return UnquoteString(text), true
}

func (s *scanner) literal(lit string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
		return s.syntax()
	}
	s.i += len(lit)
	return true
}

// numberText reads a number token with JSON's grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) numberText() ([]byte, bool) {
	b, i, start := s.b, s.i, s.i
	digits := func() bool {
		n := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return i > n
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		s.i = i
		return nil, s.syntax()
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			s.i = i
			return nil, s.syntax()
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			s.i = i
			return nil, s.syntax()
		}
	}
	s.i = i
	return b[start:i:i], true
}

func isNumberStart(c byte) bool { return c == '-' || ('0' <= c && c <= '9') }

func (s *scanner) push() bool {
	s.depth++
	if s.depth > scanMaxDepth {
		return s.fail("nesting deeper than " + strconv.Itoa(scanMaxDepth))
	}
	s.i++ // the '{' or '['
	return true
}

// object reads an object, calling fn at each member's value with the
// member's name (valid until fn returns). A repeated name is refused.
func (s *scanner) object(what string, fn func(name []byte) bool) bool {
	if s.peek() != '{' {
		return s.fail(what + " is not an object")
	}
	if !s.push() {
		return false
	}
	base := len(s.names)
	var set map[string]struct{} // once the object has many names
	defer func() { s.names = s.names[:base] }()
	if s.peek() == '}' {
		s.i++
		s.depth--
		return true
	}
	for {
		if s.peek() != '"' {
			return s.syntax()
		}
		text, ok := s.strText()
		if !ok {
			return false
		}
		name := text[1 : len(text)-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			name, _ = jsontext.AppendUnquote(nil, text)
		}
		switch {
		case set != nil:
			if _, dup := set[string(name)]; dup {
				return s.fail("a repeated member name")
			}
			set[string(name)] = struct{}{}
		default:
			for _, n := range s.names[base:] {
				if string(n) == string(name) {
					return s.fail("a repeated member name")
				}
			}
			s.names = append(s.names, name)
			if len(s.names)-base > scanMaxLinearKeys {
				set = make(map[string]struct{}, 2*scanMaxLinearKeys)
				for _, n := range s.names[base:] {
					set[string(n)] = struct{}{}
				}
			}
		}
		if s.peek() != ':' {
			return s.syntax()
		}
		s.i++
		if !fn(name) {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			s.depth--
			return true
		default:
			return s.syntax()
		}
	}
}

// array reads an array, calling fn at each element.
func (s *scanner) array(what string, fn func() bool) bool {
	if s.peek() != '[' {
		return s.fail(what + " is not an array")
	}
	if !s.push() {
		return false
	}
	if s.peek() == ']' {
		s.i++
		s.depth--
		return true
	}
	for {
		if !fn() {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			s.depth--
			return true
		default:
			return s.syntax()
		}
	}
}

// value checks any value; with float, its numbers must fit a float64
// (free-form values, which decode to float64).
func (s *scanner) value(float bool) bool {
	switch c := s.peek(); c {
	case '"':
		_, ok := s.strText()
		return ok
	case '{':
		return s.object("value", func([]byte) bool { return s.value(float) })
	case '[':
		return s.array("value", func() bool { return s.value(float) })
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	case 0:
		return s.syntax()
	default:
		tok, ok := s.numberText()
		if ok && float {
			if _, err := strconv.ParseFloat(string(tok), 64); err != nil {
				return s.fail("number " + string(tok) + " does not fit a float64")
			}
		}
		return ok
	}
}

func (s *scanner) skip() bool { return s.value(false) }

// freeObject checks a free-form object and returns its text.
func (s *scanner) freeObject(what string) (jsontext.Value, bool) {
	if s.peek() != '{' {
		return nil, s.fail(what + " is not an object")
	}
	start := s.i
	if !s.value(true) {
		return nil, false
	}
	return s.b[start:s.i:s.i], true
}

func (s *scanner) boundedStr(what string, minRunes, maxRunes int) (string, bool) {
	v, ok := s.stringValue(what)
	if ok && !lenOK(v, minRunes, maxRunes) {
		return v, s.fail(what + " length out of bounds")
	}
	return v, ok
}

// enumStr reads a string that must be one of values and returns that value.
func (s *scanner) enumStr(what string, values ...string) (string, bool) {
	if s.peek() != '"' {
		return "", s.fail(what + " is not a string")
	}
	text, ok := s.strText()
	if !ok {
		return "", false
	}
	body := text[1 : len(text)-1]
	if bytes.IndexByte(body, '\\') >= 0 {
		body = []byte(UnquoteString(text))
	}
	for _, v := range values {
		if string(body) == v {
			return v, true
		}
	}
	return "", s.fail(what + " is not one of the allowed values")
}

// checkStr checks a string of at least minRunes (0 or 1) characters.
func (s *scanner) checkStr(what string, minRunes int) bool {
	_, ok := s.text(what, minRunes)
	return ok
}

// text reads a string of at least minRunes (0 or 1) characters and returns
// its JSON text.
func (s *scanner) text(what string, minRunes int) (jsontext.Value, bool) {
	if s.peek() != '"' {
		return nil, s.fail(what + " is not a string")
	}
	text, ok := s.strText()
	if ok && minRunes > 0 && len(text) == 2 {
		return nil, s.fail(what + " is empty")
	}
	return text, ok
}

func (s *scanner) boolean(what string) (bool, bool) {
	switch s.peek() {
	case 't':
		return true, s.literal("true")
	case 'f':
		return false, s.literal("false")
	}
	return false, s.fail(what + " is not a boolean")
}

func (s *scanner) number(what string) ([]byte, bool) {
	if !isNumberStart(s.peek()) {
		return nil, s.fail(what + " is not a number")
	}
	return s.numberText()
}

func (s *scanner) float(what string) (float64, bool) {
	tok, ok := s.number(what)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(tok), 64)
	if err != nil {
		return 0, s.fail(what + " " + string(tok) + " does not fit a float64")
	}
	return f, true
}

func (s *scanner) integer(what string) (int, bool) {
	tok, ok := s.number(what)
	if !ok {
		return 0, false
	}
	if len(tok) <= 18 && tok[0] != '-' { // the usual case: digits only
		v := 0
		for _, c := range tok {
			if c < '0' || c > '9' {
				v = -1
				break
			}
			v = v*10 + int(c-'0')
		}
		if v >= 0 {
			return v, true
		}
	}
	v, integral, fits := parseIntegral(string(tok))
	switch {
	case !integral:
		return 0, s.fail(what + " is not an integer")
	case !fits:
		return 0, s.fail(what + " " + string(tok) + " does not fit an int")
	}
	return v, true
}

// strOrNull reads a string's text, or null (nil).
func (s *scanner) strOrNull(what string) (jsontext.Value, bool) {
	switch s.peek() {
	case '"':
		return s.strText()
	case 'n':
		return nil, s.literal("null")
	}
	return nil, s.fail(what + " is neither a string nor null")
}

func (s *scanner) dateTime(what string) (time.Time, bool) {
	v, ok := s.stringValue(what)
	if !ok {
		return time.Time{}, false
	}
	if !validDateTime(v) {
		return time.Time{}, s.fail(what + " is not a date-time")
	}
	t, err := parseDateTime(v)
	if err != nil {
		return time.Time{}, s.fail(what + " cannot be parsed as a time: " + err.Error())
	}
	return t, true
}

// ---- the rollout: the same checks as parser's in codec.go ----

func (s *scanner) rollout(r *RawRollout) bool {
	h := &r.Head
	var seen uint32
	var reward string
	ok := s.object("the rollout", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "schema":
			if h.Schema, ok = s.enumStr("schema", "rollout/v1"); !ok {
				return false
			}
		case "rollout_id":
			h.RolloutID, ok = s.boundedStr("rollout_id", 1, 256)
			seen |= fRolloutID
		case "environment":
			h.Environment, ok = s.stringValue("environment")
			if ok && !validEnvironment(h.Environment) {
				return s.fail("environment does not match its pattern or length")
			}
			seen |= fEnvironment
		case "agent":
			ok = s.agent(&h.Agent)
			seen |= fAgent
		case "task_id":
			h.TaskID, ok = s.boundedStr("task_id", 1, 256)
			seen |= fTaskID
		case "start_time":
			h.StartTime, ok = s.dateTime("start_time")
		case "end_time":
			h.EndTime, ok = s.dateTime("end_time")
		case "outcome":
			reward, ok = s.outcome(&h.Outcome)
			seen |= fOutcome
		case "messages":
			ok = s.messages(r)
			seen |= fMessages
		case "tools":
			s.ws()
			start := s.i
			if n := validTools.lookup(s.b[start:]); n > 0 {
				s.i += n
				r.Tools, ok = s.b[start:s.i:s.i], true
			} else if ok = s.array("tools", s.tool); ok {
				r.Tools = s.b[start:s.i:s.i]
				validTools.add(r.Tools)
			}
		case "grader":
			s.ws()
			start := s.i
			if ok = s.grader(); ok {
				r.Grader = s.b[start:s.i:s.i]
			}
		case "metadata":
			r.Metadata, ok = s.freeObject("metadata")
		case "conversation_id":
			h.ConversationID, ok = s.boundedStr("conversation_id", 1, 256)
		case "routing":
			h.Routing = &Routing{}
			ok = s.routing(h.Routing)
		default:
			ok = s.skip()
		}
		return ok
	})
	if !ok {
		return false
	}
	if seen&fRequired != fRequired {
		return s.fail("a required property is missing")
	}
	f, err := strconv.ParseFloat(reward, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return s.fail("reward " + reward + " is not a finite float64")
	}
	h.Outcome.Reward = f
	return true
}

func (s *scanner) agent(a *Agent) bool {
	var seen int
	ok := s.object("agent", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "name":
			a.Name, ok = s.boundedStr("agent.name", 1, 256)
			seen |= 1
		case "version":
			a.Version, ok = s.boundedStr("agent.version", 1, 128)
			seen |= 2
		default:
			ok = s.skip()
		}
		return ok
	})
	if ok && seen != 3 {
		return s.fail("agent: a required property is missing")
	}
	return ok
}

func (s *scanner) routing(rt *Routing) bool {
	var seen bool
	ok := s.object("routing", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "decision_id":
			rt.DecisionID, ok = s.boundedStr("routing.decision_id", 1, 128)
			seen = true
		case "adapter":
			if s.peek() == 'n' {
				rt.Adapter, ok = "", s.literal("null")
			} else {
				rt.Adapter, ok = s.boundedStr("routing.adapter", 0, 256)
			}
		default:
			ok = s.skip()
		}
		return ok
	})
	if ok && !seen {
		return s.fail("routing.decision_id is missing")
	}
	return ok
}

func (s *scanner) outcome(o *Outcome) (reward string, ok bool) {
	ok = s.object("outcome", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "reward":
			var tok []byte
			tok, ok = s.number("outcome.reward")
			reward = string(tok)
		case "success":
			var v bool
			if v, ok = s.boolean("outcome.success"); ok {
				o.Success = &v
			}
		default:
			ok = s.skip()
		}
		return ok
	})
	if ok && reward == "" {
		return "", s.fail("outcome.reward is missing")
	}
	return reward, ok
}

func (s *scanner) messages(r *RawRollout) bool {
	msgs := make([]RawMessage, 0, 32)
	ok := s.array("messages", func() bool {
		msgs = append(msgs, RawMessage{})
		return s.message(&msgs[len(msgs)-1])
	})
	if ok && len(msgs) == 0 {
		return s.fail("messages is empty")
	}
	r.Messages = msgs
	return ok
}

func (s *scanner) message(m *RawMessage) bool {
	var role, callID bool
	ok := s.object("message", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "role":
			m.Role, ok = s.enumStr("message.role", "system", "user", "assistant", "tool")
			role = true
		case "content":
			m.Content, ok = s.strOrNull("message.content")
		case "reasoning":
			m.Reasoning, ok = s.strOrNull("message.reasoning")
		case "tool_calls":
			if s.peek() == 'n' {
				return s.literal("null")
			}
			calls := []RawToolCall{}
			ok = s.array("message.tool_calls", func() bool {
				calls = append(calls, RawToolCall{})
				return s.toolCall(&calls[len(calls)-1])
			})
			m.ToolCalls = calls
		case "tool_call_id":
			m.ToolCallID, ok = s.text("message.tool_call_id", 0)
			callID = true
		case "error":
			m.Error, ok = s.boolean("message.error")
		case "error_text":
			m.ErrorText, ok = s.text("message.error_text", 0)
		case "requestor":
			m.Requestor, ok = s.enumStr("message.requestor", "assistant", "user")
		case "turn_idx":
			var v int
			if v, ok = s.integer("message.turn_idx"); ok {
				m.TurnIdx = &v
			}
		default:
			ok = s.skip()
		}
		return ok
	})
	switch {
	case !ok:
		return false
	case !role:
		return s.fail("message.role is missing")
	case m.Role == "tool" && !callID:
		return s.fail("a tool message has no tool_call_id")
	}
	return true
}

func (s *scanner) toolCall(tc *RawToolCall) bool {
	var args bool
	ok := s.object("tool call", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "id":
			tc.ID, ok = s.text("tool_call.id", 1)
		case "name":
			tc.Name, ok = s.text("tool_call.name", 1)
		case "arguments":
			tc.Arguments, ok = s.freeObject("tool_call.arguments")
			args = true
		case "requestor":
			tc.Requestor, ok = s.enumStr("tool_call.requestor", "assistant", "user")
		default:
			ok = s.skip()
		}
		return ok
	})
	if ok && (tc.ID == nil || tc.Name == nil || !args) {
		return s.fail("tool_call: a required property is missing")
	}
	return ok
}

func (s *scanner) tool() bool {
	var typ, fn bool
	ok := s.object("tool", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "type":
			_, ok = s.enumStr("tool.type", "function")
			typ = true
		case "function":
			ok = s.function()
			fn = true
		default:
			ok = s.skip()
		}
		return ok
	})
	if ok && !(typ && fn) {
		return s.fail("tool: a required property is missing")
	}
	return ok
}

func (s *scanner) function() bool {
	var name bool
	ok := s.object("tool.function", func(k []byte) bool {
		switch string(k) {
		case "name":
			name = true
			return s.checkStr("tool.function.name", 1)
		case "description":
			return s.checkStr("tool.function.description", 0)
		case "parameters":
			if s.peek() != '{' {
				return s.fail("tool.function.parameters is not an object")
			}
		}
		return s.skip()
	})
	if ok && !name {
		return s.fail("tool.function.name is missing")
	}
	return ok
}

func (s *scanner) grader() bool {
	return s.object("grader", func(k []byte) bool {
		switch string(k) {
		case "reasons":
			return s.array("grader.reasons", func() bool { return s.checkStr("grader.reasons item", 0) })
		case "breakdown":
			return s.object("grader.breakdown", func([]byte) bool {
				_, ok := s.float("a grader.breakdown value")
				return ok
			})
		}
		return s.skip()
	})
}

// validTools remembers the last tool arrays that were valid, by their
// exact text: the tool definitions are the same in every rollout of an
// agent version, and input that starts with the text of a valid tools array
// holds that same array (an array ends itself), so it is not read again.
var validTools textCache

// textCache is a small set of byte strings, copied on write.
type textCache struct{ entries atomic.Pointer[[][]byte] }

const textCacheSize = 16

// lookup returns the length of the cached text b starts with, or 0.
func (c *textCache) lookup(b []byte) int {
	if e := c.entries.Load(); e != nil {
		for _, t := range *e {
			if bytes.HasPrefix(b, t) {
				return len(t)
			}
		}
	}
	return 0
}

func (c *textCache) add(t []byte) {
	t = bytes.Clone(t)
	for {
		old := c.entries.Load()
		var prev [][]byte
		if old != nil {
			prev = *old
		}
		next := append([][]byte{t}, prev[:min(len(prev), textCacheSize-1)]...)
		if c.entries.CompareAndSwap(old, &next) {
			return
		}
	}
}

// ---- strings ----

// skipStr validates the rest of a string from j, a position inside it
// between two characters, and returns the index after its closing quote;
// noLone reports that it escapes no lone surrogate. Long strings are read
// 64 bytes at a time: the string ends at the first quote that no backslash
// escapes, and only the escaped bytes before it are looked at one by one
// (and only when they are not one-byte escapes).
func skipStr(b []byte, j int) (end int, noLone, ok bool) {
	noLone = true
	if j+64 <= len(b) {
		var carry uint64 // the block before ended with an escaping backslash
		checked := j     // escapes before this index are checked already
		for j+64 <= len(b) {
			q, bs, ctl := masks64(b[j:])
			esc := escapedMask(bs, &carry)
			stop := q &^ esc
			before := ^uint64(0)
			if stop != 0 {
				before = stop&-stop - 1
			}
			if ctl&before != 0 {
				return j + bits.TrailingZeros64(ctl&before), false, false
			}
			for e := esc & before; e != 0; e &= e - 1 {
				k := j + bits.TrailingZeros64(e)
				if k < checked || simpleEscape[b[k]] {
					continue
				}
				next, lone := escapeEnd(b, k-1)
				if next < 0 {
					return k - 1, false, false
				}
				noLone = noLone && !lone
				checked = next
			}
			if stop != 0 {
				return j + bits.TrailingZeros64(stop) + 1, noLone, true
			}
			j += 64
		}
		// Resume between two characters: at an escape that straddles the
		// block end, or after the last one checked.
		if carry != 0 {
			j--
		}
		j = max(j, checked)
	}
	for {
		j = plainRun(b, j)
		if j >= len(b) {
			return j, false, false
		}
		switch c := b[j]; {
		case c == '"':
			return j + 1, noLone, true
		case c == '\\':
			next, lone := escapeEnd(b, j)
			if next < 0 {
				return j, false, false
			}
			noLone = noLone && !lone
			j = next
		default: // a control character
			return j, false, false
		}
	}
}

// plainRun returns the index of the first byte at or after i that ends a
// run of plain string bytes (a quote, a backslash or a control character),
// or len(b). It tests 8 bytes at a time.
func plainRun(b []byte, i int) int {
	for i+8 <= len(b) {
		if m := runEnd8(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	for i < len(b) && b[i] >= 0x20 && b[i] != '"' && b[i] != '\\' {
		i++
	}
	return i
}

// runEnd8 marks (high bit) the bytes of 8 string bytes that end a plain run:
// a byte < 0x20 (bytes >= 0x80 excluded by &^x), or a zero byte after XOR
// with '"' or '\\'. The lowest mark is exact (borrows only mark bytes above
// a true one): it is where the run ends.
func runEnd8(x uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	lt := (x - ones*0x20) &^ x
	q := x ^ (ones * '"')
	bs := x ^ (ones * '\\')
	return (lt | ((q - ones) &^ q) | ((bs - ones) &^ bs)) & highs
}

// simpleEscape[c]: \c is a one-byte escape.
var simpleEscape = [256]bool{'"': true, '\\': true, '/': true, 'b': true, 'f': true, 'n': true, 'r': true, 't': true}

// escapedMask returns the mask of the bytes of a 64-byte block that a
// backslash escapes, given the block's backslashes; carry is 1 when the
// block before ended with an escaping backslash, and is updated for the next
// block. (simdjson's branchless find_escaped: a run of backslashes escapes
// the byte after it when its length is odd.)
func escapedMask(backslash uint64, carry *uint64) uint64 {
	const even = 0x5555555555555555
	backslash &^= *carry
	followsEscape := backslash<<1 | *carry
	oddStarts := backslash &^ even &^ followsEscape
	seqOnEven, c := bits.Add64(oddStarts, backslash, 0)
	*carry = c
	return (even ^ seqOnEven<<1) & followsEscape
}

// escapeEnd returns the index after the escape at b[j] == '\\' (a
// surrogate pair counts as one escape), or -1 when it is not valid, and
// whether it is a lone surrogate.
func escapeEnd(b []byte, j int) (next int, lone bool) {
	if j+1 >= len(b) {
		return -1, false
	}
	switch b[j+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return j + 2, false
	case 'u':
		r := hex4(b, j+2)
		if r < 0 {
			return -1, false
		}
		if !utf16.IsSurrogate(r) {
			return j + 6, false
		}
		if j+7 < len(b) && b[j+6] == '\\' && b[j+7] == 'u' {
			if r1 := hex4(b, j+8); r1 >= 0 && utf16.DecodeRune(r, r1) != utf8.RuneError {
				return j + 12, false
			}
		}
		return j + 6, true
	}
	return -1, false
}

// hex4 reads 4 hex digits at b[i:], or -1.
func hex4(b []byte, i int) rune {
	if i+4 > len(b) {
		return -1
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}
