package schemas

// parseJSONText: the rollout parser on jsontext, the reference for
// scanRollout (scan.go), which production uses. Both are checked against the
// JSON Schema library (checkParser) and against each other; BenchmarkParsers
// compares their cost.

import (
	"bytes"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/go-json-experiment/json/jsontext"
)

// parseJSONText is the rolloutParser on jsontext.
func parseJSONText(data []byte) (*RawRollout, string) {
	p := getParser(data)
	defer putParser(p)
	r := new(RawRollout)
	if !p.rollout(r) {
		return nil, p.why
	}
	if _, err := p.dec.ReadToken(); err != io.EOF {
		return nil, "trailing data after the JSON value"
	}
	return r, ""
}

// fail records why the document is not accepted and returns false.
func (p *parser) fail(why string) bool {
	if p.why == "" {
		p.why = why
	}
	return false
}

func (p *parser) read() (jsontext.Value, bool) {
	v, err := p.dec.ReadValue()
	if err != nil {
		return nil, p.fail(err.Error())
	}
	return v, true
}

// delim reads a '{', '}', '[' or ']'.
func (p *parser) delim() bool {
	if _, err := p.dec.ReadToken(); err != nil {
		return p.fail(err.Error())
	}
	return true
}

func (p *parser) skip() bool {
	if err := p.dec.SkipValue(); err != nil {
		return p.fail(err.Error())
	}
	return true
}

// object reads an object, calling fn at each member's value with the
// member's name (valid until the next read).
func (p *parser) object(what string, fn func(name []byte) bool) bool {
	if p.dec.PeekKind() != '{' {
		return p.fail(what + " is not an object")
	}
	if !p.delim() {
		return false
	}
	for p.dec.PeekKind() != '}' {
		v, ok := p.read()
		if !ok {
			return false
		}
		name := v[1 : len(v)-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			p.name, _ = jsontext.AppendUnquote(p.name[:0], v)
			name = p.name
		}
		if !fn(name) {
			return false
		}
	}
	return p.delim()
}

// array reads an array, calling fn at each element.
func (p *parser) array(what string, fn func() bool) bool {
	if p.dec.PeekKind() != '[' {
		return p.fail(what + " is not an array")
	}
	if !p.delim() {
		return false
	}
	for p.dec.PeekKind() != ']' {
		if !fn() {
			return false
		}
	}
	return p.delim()
}

// span returns the text of the value read since offset start (the input
// offset before it), without the ':' and whitespace before the value.
func (p *parser) span(start int64) jsontext.Value {
	v := p.data[start:p.dec.InputOffset()]
	for len(v) > 0 && (v[0] == ':' || v[0] == ' ' || v[0] == '\t' || v[0] == '\r' || v[0] == '\n') {
		v = v[1:]
	}
	return v[:len(v):len(v)]
}

func (p *parser) str(what string) (string, bool) {
	if p.dec.PeekKind() != '"' {
		return "", p.fail(what + " is not a string")
	}
	v, ok := p.read()
	return UnquoteString(v), ok
}

func (p *parser) boundedStr(what string, minRunes, maxRunes int) (string, bool) {
	s, ok := p.str(what)
	if ok && !lenOK(s, minRunes, maxRunes) {
		return s, p.fail(what + " length out of bounds")
	}
	return s, ok
}

// enumStr reads a string that must be one of values, and returns that
// value (no copy of the input).
func (p *parser) enumStr(what string, values ...string) (string, bool) {
	if p.dec.PeekKind() != '"' {
		return "", p.fail(what + " is not a string")
	}
	v, ok := p.read()
	if !ok {
		return "", false
	}
	text := v[1 : len(v)-1]
	if bytes.IndexByte(text, '\\') >= 0 {
		text = []byte(UnquoteString(v))
	}
	for _, s := range values {
		if string(text) == s {
			return s, true
		}
	}
	return "", p.fail(what + " is not one of the allowed values")
}

// checkStr checks that the next value is a string of at least minRunes
// characters (0 or 1), without keeping it.
func (p *parser) checkStr(what string, minRunes int) bool {
	_, ok := p.strText(what, minRunes)
	return ok
}

// strText reads a string of at least minRunes characters (0 or 1) and
// returns its JSON text.
func (p *parser) strText(what string, minRunes int) (jsontext.Value, bool) {
	if p.dec.PeekKind() != '"' {
		return nil, p.fail(what + " is not a string")
	}
	v, ok := p.read()
	if ok && minRunes > 0 && len(v) == 2 {
		return nil, p.fail(what + " is empty")
	}
	return v, ok
}

func (p *parser) boolean(what string) (bool, bool) {
	switch p.dec.PeekKind() {
	case 't', 'f':
		tok, err := p.dec.ReadToken()
		if err != nil {
			return false, p.fail(err.Error())
		}
		return tok.Bool(), true
	}
	return false, p.fail(what + " is not a boolean")
}

// number reads a number's text.
func (p *parser) number(what string) (string, bool) {
	if p.dec.PeekKind() != '0' {
		return "", p.fail(what + " is not a number")
	}
	v, ok := p.read()
	return string(v), ok
}

// float reads a number that must fit a float64.
func (p *parser) float(what string) (float64, bool) {
	tok, ok := p.number(what)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(tok, 64)
	if err != nil {
		return 0, p.fail(what + " " + tok + " does not fit a float64")
	}
	return f, true
}

// strOrNull reads a string's text, or null (nil).
func (p *parser) strOrNull(what string) (jsontext.Value, bool) {
	switch p.dec.PeekKind() {
	case '"':
		return p.read()
	case 'n':
		return nil, p.skip()
	}
	return nil, p.fail(what + " is neither a string nor null")
}

// free checks a free-form value: valid JSON whose numbers fit a float64.
func (p *parser) free() bool {
	switch p.dec.PeekKind() {
	case '{':
		return p.object("value", func([]byte) bool { return p.free() })
	case '[':
		return p.array("value", p.free)
	case '0':
		_, ok := p.float("a number")
		return ok
	}
	return p.skip()
}

// freeObject checks a free-form object and returns its text.
func (p *parser) freeObject(what string) (jsontext.Value, bool) {
	if p.dec.PeekKind() != '{' {
		return nil, p.fail(what + " is not an object")
	}
	start := p.dec.InputOffset()
	if !p.free() {
		return nil, false
	}
	return p.span(start), true
}

func (p *parser) rollout(r *RawRollout) bool {
	h := &r.Head
	var seen uint32
	var reward string
	ok := p.object("the rollout", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "schema":
			h.Schema, ok = p.str("schema")
			if ok && h.Schema != "rollout/v1" {
				return p.fail("schema is not rollout/v1")
			}
		case "rollout_id":
			h.RolloutID, ok = p.boundedStr("rollout_id", 1, 256)
			seen |= fRolloutID
		case "environment":
			h.Environment, ok = p.str("environment")
			if ok && !validEnvironment(h.Environment) {
				return p.fail("environment does not match its pattern or length")
			}
			seen |= fEnvironment
		case "agent":
			ok = p.agent(&h.Agent)
			seen |= fAgent
		case "task_id":
			h.TaskID, ok = p.boundedStr("task_id", 1, 256)
			seen |= fTaskID
		case "start_time":
			h.StartTime, ok = p.dateTime("start_time")
		case "end_time":
			h.EndTime, ok = p.dateTime("end_time")
		case "outcome":
			reward, ok = p.outcome(&h.Outcome)
			seen |= fOutcome
		case "messages":
			ok = p.messages(r)
			seen |= fMessages
		case "tools":
			start := p.dec.InputOffset()
			if ok = p.array("tools", p.tool); ok {
				r.Tools = p.span(start)
			}
		case "grader":
			start := p.dec.InputOffset()
			if ok = p.grader(); ok {
				r.Grader = p.span(start)
			}
		case "metadata":
			r.Metadata, ok = p.freeObject("metadata")
		case "conversation_id":
			h.ConversationID, ok = p.boundedStr("conversation_id", 1, 256)
		case "routing":
			h.Routing = &Routing{}
			ok = p.routing(h.Routing)
		default:
			ok = p.skip()
		}
		return ok
	})
	if !ok {
		return false
	}
	if seen&fRequired != fRequired {
		return p.fail("a required property is missing")
	}
	f, err := strconv.ParseFloat(reward, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return p.fail("reward " + reward + " is not a finite float64")
	}
	h.Outcome.Reward = f
	return true
}

func (p *parser) agent(a *Agent) bool {
	var seen int
	ok := p.object("agent", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "name":
			a.Name, ok = p.boundedStr("agent.name", 1, 256)
			seen |= 1
		case "version":
			a.Version, ok = p.boundedStr("agent.version", 1, 128)
			seen |= 2
		default:
			ok = p.skip()
		}
		return ok
	})
	if ok && seen != 3 {
		return p.fail("agent: a required property is missing")
	}
	return ok
}

func (p *parser) routing(rt *Routing) bool {
	var seen bool
	ok := p.object("routing", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "decision_id":
			rt.DecisionID, ok = p.boundedStr("routing.decision_id", 1, 128)
			seen = true
		case "adapter":
			if p.dec.PeekKind() == 'n' {
				rt.Adapter, ok = "", p.skip()
			} else {
				rt.Adapter, ok = p.boundedStr("routing.adapter", 0, 256)
			}
		default:
			ok = p.skip()
		}
		return ok
	})
	if ok && !seen {
		return p.fail("routing.decision_id is missing")
	}
	return ok
}

// outcome returns the reward's text (checked for finiteness last).
func (p *parser) outcome(o *Outcome) (reward string, ok bool) {
	ok = p.object("outcome", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "reward":
			reward, ok = p.number("outcome.reward")
		case "success":
			var v bool
			if v, ok = p.boolean("outcome.success"); ok {
				o.Success = &v
			}
		default:
			ok = p.skip()
		}
		return ok
	})
	if ok && reward == "" {
		return "", p.fail("outcome.reward is missing")
	}
	return reward, ok
}

func (p *parser) messages(r *RawRollout) bool {
	msgs := make([]RawMessage, 0, 32)
	ok := p.array("messages", func() bool {
		msgs = append(msgs, RawMessage{})
		return p.message(&msgs[len(msgs)-1])
	})
	if ok && len(msgs) == 0 {
		return p.fail("messages is empty")
	}
	r.Messages = msgs
	return ok
}

func (p *parser) message(m *RawMessage) bool {
	var role, callID bool
	ok := p.object("message", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "role":
			m.Role, ok = p.enumStr("message.role", "system", "user", "assistant", "tool")
			role = true
		case "content":
			m.Content, ok = p.strOrNull("message.content")
		case "reasoning":
			m.Reasoning, ok = p.strOrNull("message.reasoning")
		case "tool_calls":
			switch p.dec.PeekKind() {
			case 'n':
				ok = p.skip()
			default:
				calls := []RawToolCall{}
				ok = p.array("message.tool_calls", func() bool {
					calls = append(calls, RawToolCall{})
					return p.toolCall(&calls[len(calls)-1])
				})
				m.ToolCalls = calls
			}
		case "tool_call_id":
			m.ToolCallID, ok = p.strText("message.tool_call_id", 0)
			callID = true
		case "error":
			m.Error, ok = p.boolean("message.error")
		case "error_text":
			m.ErrorText, ok = p.strText("message.error_text", 0)
		case "requestor":
			m.Requestor, ok = p.enumStr("message.requestor", "assistant", "user")
		case "turn_idx":
			var v int
			if v, ok = p.integer("message.turn_idx"); ok {
				m.TurnIdx = &v
			}
		default:
			ok = p.skip()
		}
		return ok
	})
	switch {
	case !ok:
		return false
	case !role:
		return p.fail("message.role is missing")
	case m.Role == "tool" && !callID:
		return p.fail("a tool message has no tool_call_id")
	}
	return true
}

// integer reads a JSON Schema integer (1, 1.0, 1e2), which must fit an int.
func (p *parser) integer(what string) (int, bool) {
	tok, ok := p.number(what)
	if !ok {
		return 0, p.fail(what + " is not an integer")
	}
	v, integral, fits := parseIntegral(tok)
	switch {
	case !integral:
		return 0, p.fail(what + " is not an integer")
	case !fits:
		return 0, p.fail(what + " " + tok + " does not fit an int")
	}
	return v, true
}

func (p *parser) toolCall(tc *RawToolCall) bool {
	var args bool
	ok := p.object("tool call", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "id":
			tc.ID, ok = p.strText("tool_call.id", 1)
		case "name":
			tc.Name, ok = p.strText("tool_call.name", 1)
		case "arguments":
			tc.Arguments, ok = p.freeObject("tool_call.arguments")
			args = true
		case "requestor":
			tc.Requestor, ok = p.enumStr("tool_call.requestor", "assistant", "user")
		default:
			ok = p.skip()
		}
		return ok
	})
	if ok && (tc.ID == nil || tc.Name == nil || !args) {
		return p.fail("tool_call: a required property is missing")
	}
	return ok
}

func (p *parser) tool() bool {
	var typ, fn bool
	ok := p.object("tool", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "type":
			_, ok = p.enumStr("tool.type", "function")
			typ = true
		case "function":
			ok = p.function()
			fn = true
		default:
			ok = p.skip()
		}
		return ok
	})
	if ok && !(typ && fn) {
		return p.fail("tool: a required property is missing")
	}
	return ok
}

func (p *parser) function() bool {
	var name bool
	ok := p.object("tool.function", func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "name":
			ok = p.checkStr("tool.function.name", 1)
			name = true
		case "description":
			ok = p.checkStr("tool.function.description", 0)
		case "parameters":
			if p.dec.PeekKind() != '{' {
				return p.fail("tool.function.parameters is not an object")
			}
			ok = p.skip()
		default:
			ok = p.skip()
		}
		return ok
	})
	if ok && !name {
		return p.fail("tool.function.name is missing")
	}
	return ok
}

func (p *parser) grader() bool {
	return p.object("grader", func(k []byte) bool {
		switch string(k) {
		case "reasons":
			return p.array("grader.reasons", func() bool { return p.checkStr("grader.reasons item", 0) })
		case "breakdown":
			return p.object("grader.breakdown", func([]byte) bool {
				_, ok := p.float("a grader.breakdown value")
				return ok
			})
		}
		return p.skip()
	})
}

// dateTime reads a string with format date-time, as the schema library
// checks it, that time.Time can also parse.
func (p *parser) dateTime(what string) (time.Time, bool) {
	s, ok := p.str(what)
	if !ok {
		return time.Time{}, false
	}
	if !validDateTime(s) {
		return time.Time{}, p.fail(what + " is not a date-time")
	}
	t, err := parseDateTime(s)
	if err != nil {
		return time.Time{}, p.fail(what + " cannot be parsed as a time: " + err.Error())
	}
	return t, true
}
