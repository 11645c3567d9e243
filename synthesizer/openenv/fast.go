package openenv

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// The fast path of DecodeFrame and DecodeAction. The general decoders
// above decode each level of a frame with its own json.Unmarshal, and
// json.Unmarshal scans all of its input before decoding it, so a step's
// frame was scanned five or six times over and decoded through reflection
// into maps. The fast path checks the frame once (json.Valid) and walks it
// once, for the shapes a trainer sends: plain keys (no escapes), none
// twice, nothing the general decoder would report. Whenever it meets
// anything else it gives up and the general decoder decides, errors and
// all; so it only ever returns what the general decoder returns for the
// same input (FuzzFastDecode checks that).

// walker reads values of a text already known to be valid JSON.
type walker struct {
	b []byte
	i int
}

func (w *walker) space() {
	for w.i < len(w.b) {
		switch w.b[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

func (w *walker) peek() byte {
	w.space()
	if w.i < len(w.b) {
		return w.b[w.i]
	}
	return 0
}

// str reads a string at w.i and returns its raw body and whether it has
// escapes.
func (w *walker) str() (body []byte, escaped bool) {
	w.i++ // the opening quote
	start := w.i
	for {
		switch w.b[w.i] {
		case '"':
			body = w.b[start:w.i]
			w.i++
			return body, escaped
		case '\\':
			escaped = true
			w.i += 2
		default:
			w.i++
		}
	}
}

// value skips the value at w.i and returns its text.
func (w *walker) value() []byte {
	w.space()
	start := w.i
	switch w.b[w.i] {
	case '"':
		w.str()
	case '{', '[':
		depth := 0
		for {
			switch w.b[w.i] {
			case '"':
				w.str()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			w.i++
			if depth == 0 {
				break
			}
		}
	default: // a number, true, false or null
		for w.i < len(w.b) {
			switch w.b[w.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return w.b[start:w.i]
			}
			w.i++
		}
	}
	return w.b[start:w.i]
}

// members calls f with each member of the object at w.i (the key's raw
// body, which has no escapes, and the value's text); it stops and returns
// false when a key has escapes or f returns false.
func (w *walker) members(f func(key, val []byte) bool) bool {
	if w.peek() != '{' {
		return false
	}
	w.i++
	if w.peek() == '}' {
		w.i++
		return true
	}
	for {
		w.space()
		key, escaped := w.str()
		if escaped {
			return false
		}
		w.space()
		w.i++ // the colon
		if !f(key, w.value()) {
			return false
		}
		if w.peek() == ',' {
			w.i++
			continue
		}
		w.i++ // the closing brace
		return true
	}
}

// plainString returns the string val holds when it is a string without
// escapes.
func plainString(val []byte) (string, bool) {
	if len(val) < 2 || val[0] != '"' {
		return "", false
	}
	body := val[1 : len(val)-1]
	if bytes.IndexByte(body, '\\') >= 0 || !utf8.Valid(body) {
		return "", false // json.Unmarshal decodes escapes and invalid UTF-8
	}
	return string(body), true
}

// stringValue returns the string val holds (escapes decoded).
func stringValue(val []byte) (string, bool) {
	if s, ok := plainString(val); ok {
		return s, true
	}
	if len(val) < 2 || val[0] != '"' {
		return "", false
	}
	if s, ok := unescapeSimple(val[1 : len(val)-1]); ok {
		return s, true
	}
	var s string
	return s, json.Unmarshal(val, &s) == nil
}

// unescapeSimple decodes a string body whose escapes are all of one
// character (\" \\ \/ \b \f \n \r \t), in valid UTF-8: the arguments
// string of a tool call, typically. Anything else (\u escapes) is left to
// encoding/json.
func unescapeSimple(body []byte) (string, bool) {
	if !utf8.Valid(body) {
		return "", false
	}
	out := make([]byte, 0, len(body))
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		switch body[i] {
		case '"', '\\', '/':
			out = append(out, body[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		default:
			return "", false
		}
	}
	return string(out), true
}

// lowerKey reports a key of lower-case ASCII letters, digits and
// underscores. The general decoder reads tool calls into structs, whose
// fields encoding/json matches case-insensitively (with Unicode folding):
// the fast path leaves any other key to it.
func lowerKey(key []byte) bool {
	for i := 0; i < len(key); i++ {
		if c := key[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func decodeFrameFast(b []byte) (Frame, bool) {
	if !json.Valid(b) {
		return Frame{}, false
	}
	w := walker{b: b}
	var typ string
	var data []byte
	seen := 0
	ok := w.members(func(key, val []byte) bool {
		switch string(key) {
		case "type":
			if seen&1 != 0 {
				return false
			}
			s, ok := plainString(val)
			typ, seen = s, seen|1
			return ok
		case "data":
			if seen&2 != 0 {
				return false
			}
			data, seen = val, seen|2
			return true
		}
		return false
	})
	spec, known := frameFields[typ]
	if !ok || !known || w.peek() != 0 {
		return Frame{}, false
	}
	f := Frame{Type: typ}
	switch {
	case data == nil && spec.data && spec.required:
		return Frame{}, false
	case data == nil && spec.data:
		f.Data = json.RawMessage("{}")
	case data != nil && (!spec.data || data[0] != '{'):
		return Frame{}, false
	case data != nil:
		f.Data = data
	}
	return f, true
}

// decodeActionFast decodes an assistant message (never an MCP action).
func decodeActionFast(b []byte) (Action, bool) {
	if !json.Valid(b) {
		return Action{}, false
	}
	w := walker{b: b}
	var role, content, calls []byte
	ok := w.members(func(key, val []byte) bool {
		switch string(key) {
		case "type":
			return false // an MCP action, or a type the general decoder checks
		case "role":
			role = val
		case "content":
			content = val
		case "tool_calls":
			calls = val
		default:
			// A call where trace does not read one: the general
			// decoder names it.
			return !misplacedCall(key) || string(val) == "null"
		}
		return true
	})
	if !ok || w.peek() != 0 {
		return Action{}, false
	}
	if role != nil && string(role) != "null" && string(role) != `"assistant"` {
		return Action{}, false
	}
	if role == nil && content == nil && calls == nil {
		return Action{}, false // not a message: the general decoder says so
	}
	a := Action{Kind: ActionMessage}
	if content != nil && string(content) != "null" {
		s, ok := stringValue(content)
		if !ok {
			return Action{}, false // a list of parts, or an error
		}
		a.Content = s
	}
	if calls == nil || string(calls) == "null" {
		return a, true
	}
	if calls[0] != '[' {
		return Action{}, false
	}
	cw := walker{b: calls, i: 1}
	if cw.peek() == ']' {
		return a, true
	}
	for {
		c, ok := toolCallFast(cw.value())
		if !ok {
			return Action{}, false
		}
		a.ToolCalls = append(a.ToolCalls, c)
		if cw.peek() == ',' {
			cw.i++
			continue
		}
		return a, true
	}
}

func toolCallFast(rc []byte) (Call, bool) {
	var c Call
	var id, typ, fn []byte
	w := walker{b: rc}
	ok := w.members(func(key, val []byte) bool {
		switch string(key) {
		case "id":
			id = val
		case "type":
			typ = val
		case "function":
			fn = val
		default:
			return lowerKey(key)
		}
		return true
	})
	if !ok {
		return Call{}, false
	}
	if id != nil && string(id) != "null" {
		s, ok := stringValue(id)
		if !ok {
			return Call{}, false
		}
		c.ID = s
	}
	if typ != nil && string(typ) != "null" && string(typ) != `"function"` {
		return Call{}, false
	}
	if fn == nil || fn[0] != '{' {
		return Call{}, false
	}
	var name, args []byte
	fw := walker{b: fn}
	ok = fw.members(func(key, val []byte) bool {
		switch string(key) {
		case "name":
			name = val
		case "arguments":
			args = val
		default:
			return lowerKey(key)
		}
		return true
	})
	if !ok || name == nil {
		return Call{}, false
	}
	if c.Name, ok = stringValue(name); !ok || c.Name == "" {
		return Call{}, false
	}
	switch {
	case args == nil || string(args) == "null":
		c.Arguments = []byte("{}")
	case args[0] == '"':
		s, ok := stringValue(args)
		if !ok {
			return Call{}, false
		}
		if strings.TrimSpace(s) == "" {
			c.Arguments = []byte("{}")
			break
		}
		if c.Arguments, ok = compactObject([]byte(s)); !ok {
			return Call{}, false
		}
	case args[0] == '{':
		if c.Arguments, ok = compactObject(args); !ok {
			return Call{}, false
		}
	default:
		return Call{}, false
	}
	return c, true
}

// compactObject is text compacted, when it is a valid JSON object.
func compactObject(text []byte) ([]byte, bool) {
	if !isObject(text) {
		return nil, false
	}
	var buf bytes.Buffer
	buf.Grow(len(text))
	if json.Compact(&buf, text) != nil {
		return nil, false
	}
	return buf.Bytes(), true
}

// decodeResetFast decodes reset data of plain members: seed a
// non-negative integer literal, episode_id a string, hint a boolean.
func decodeResetFast(b []byte) (ResetRequest, bool) {
	if !json.Valid(b) {
		return ResetRequest{}, false
	}
	var r ResetRequest
	w := walker{b: b}
	ok := w.members(func(key, val []byte) bool {
		switch string(key) {
		case "seed":
			if len(val) > 18 || r.Seed != nil {
				return false
			}
			var s int64
			for _, c := range val {
				if c < '0' || c > '9' {
					return false // null, a sign, a fraction or an exponent
				}
				s = s*10 + int64(c-'0')
			}
			r.Seed = &s
		case "episode_id":
			id, ok := plainString(val)
			if !ok || r.EpisodeID != nil || utf8.RuneCountInString(id) > 255 {
				return false
			}
			r.EpisodeID = &id
		case "hint":
			switch string(val) {
			case "true":
				r.Hint = true
			case "false":
				r.Hint = false
			default:
				return false
			}
		default:
			return false
		}
		return true
	})
	return r, ok && w.peek() == 0
}

// SchemaValue decodes b, a valid JSON text, into the values
// jsonschema.UnmarshalJSON makes of it (map[string]any, []any, string,
// json.Number, bool, nil), without its decoder's reflection; ok is false
// when b is not valid JSON (the caller then reports the error the general
// path gives).
func SchemaValue(b []byte) (v any, ok bool) {
	if !json.Valid(b) {
		return nil, false
	}
	w := walker{b: b}
	return w.schemaValue()
}

func (w *walker) schemaValue() (any, bool) {
	switch w.peek() {
	case '{':
		m := map[string]any{}
		ok := true
		w.i++
		if w.peek() == '}' {
			w.i++
			return m, true
		}
		for ok {
			w.space()
			start := w.i
			w.str()
			key, kok := stringValue(w.b[start:w.i])
			w.space()
			w.i++ // the colon
			var v any
			v, ok = w.schemaValue()
			m[key] = v
			ok = ok && kok
			if w.peek() == ',' {
				w.i++
				continue
			}
			w.i++ // the closing brace
			break
		}
		return m, ok
	case '[':
		a := []any{}
		w.i++
		if w.peek() == ']' {
			w.i++
			return a, true
		}
		for {
			v, ok := w.schemaValue()
			if !ok {
				return nil, false
			}
			a = append(a, v)
			if w.peek() == ',' {
				w.i++
				continue
			}
			w.i++ // the closing bracket
			return a, true
		}
	case '"':
		return stringValue(w.value())
	}
	switch lit := w.value(); string(lit) {
	case "true":
		return true, true
	case "false":
		return false, true
	case "null":
		return nil, true
	default:
		return json.Number(lit), true
	}
}
