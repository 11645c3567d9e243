package openenv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

func sprintf(format string, args ...any) string {
	if len(args) == 0 {
		return format
	}
	return fmt.Sprintf(format, args...)
}

// object decodes b as a JSON object into its members; ok is false when b is
// valid JSON of another type.
func object(b []byte) (m map[string]json.RawMessage, ok bool, err error) {
	if i := bytes.IndexFunc(b, func(r rune) bool { return r != ' ' && r != '\t' && r != '\n' && r != '\r' }); i >= 0 && b[i] == '{' {
		// json.Unmarshal checks the whole text before decoding any of
		// it, so invalid JSON fails here with the message it would give
		// below, and a valid object always decodes into m.
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, false, err
		}
		return m, true, nil
	}
	if !json.Valid(b) {
		// json.Unmarshal's message names the offending byte.
		var v any
		err = json.Unmarshal(b, &v)
		if err == nil {
			err = fmt.Errorf("invalid JSON")
		}
		return nil, false, err
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return nil, false, nil
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, false, err
	}
	return m, true, nil
}

func isNull(r json.RawMessage) bool { return r == nil || string(bytes.TrimSpace(r)) == "null" }

func isObject(r json.RawMessage) bool {
	r = bytes.TrimSpace(r)
	return len(r) > 0 && r[0] == '{'
}

func jsonKind(r json.RawMessage) string {
	r = bytes.TrimSpace(r)
	if len(r) == 0 {
		return "nothing"
	}
	switch r[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// frameFields are the members each client frame type may have (openenv's
// WS*Message models forbid extra fields), and whether data is required.
var frameFields = map[string]struct {
	data, required bool
}{
	FrameReset: {data: true},
	FrameStep:  {data: true, required: true},
	FrameState: {},
	FrameClose: {},
	FrameMCP:   {data: true, required: true},
}

// DecodeFrame decodes one client frame as openenv's server does: invalid JSON
// is INVALID_JSON, an unknown or missing type UNKNOWN_TYPE, a frame that does
// not fit its type's model (a member it does not have, data that is not an
// object, step data missing) VALIDATION_ERROR. A reset frame without data has
// Data {}.
//
// The frame's Data may share b's memory.
func DecodeFrame(b []byte) (Frame, *Error) {
	if f, ok := decodeFrameFast(b); ok {
		return f, nil
	}
	return decodeFrame(b)
}

// decodeFrame is DecodeFrame without its fast path (fast.go).
func decodeFrame(b []byte) (Frame, *Error) {
	m, ok, err := object(b)
	if err != nil {
		return Frame{}, &Error{Code: CodeInvalidJSON, Message: "Invalid JSON: " + err.Error()}
	}
	if !ok {
		return Frame{}, Validation([]any{}, "model_type", "a frame must be a JSON object, got %s", jsonKind(b))
	}
	var typ string
	if raw, has := m["type"]; has {
		if err := json.Unmarshal(raw, &typ); err != nil {
			return Frame{}, &Error{Code: CodeUnknownType, Message: "Unknown message type: " + truncate(string(raw), 64)}
		}
	}
	spec, known := frameFields[typ]
	if !known {
		return Frame{}, &Error{Code: CodeUnknownType, Message: "Unknown message type: " + truncate(typ, 64)}
	}
	var fields []FieldError
	for k := range m {
		if k == "type" || (k == "data" && spec.data) {
			continue
		}
		fields = append(fields, FieldError{Type: "extra_forbidden", Loc: []any{k}, Msg: "Extra inputs are not permitted"})
	}
	f := Frame{Type: typ}
	if spec.data {
		raw, has := m["data"]
		switch {
		case !has && spec.required:
			fields = append(fields, FieldError{Type: "missing", Loc: []any{"data"}, Msg: "Field required"})
		case !has:
			f.Data = json.RawMessage("{}")
		case !isObject(raw):
			fields = append(fields, FieldError{Type: "dict_type", Loc: []any{"data"}, Msg: "Input should be a valid dictionary, got " + jsonKind(raw)})
		default:
			f.Data = raw
		}
	}
	if len(fields) > 0 {
		sortFields(fields)
		return Frame{}, &Error{Code: CodeValidation, Message: "Invalid message: " + fields[0].Msg + " (" + locString(fields[0].Loc) + ")", Fields: fields}
	}
	return f, nil
}

func sortFields(fs []FieldError) {
	// Deterministic order for messages and tests (map iteration is not).
	for i := 1; i < len(fs); i++ {
		for j := i; j > 0 && locString(fs[j].Loc) < locString(fs[j-1].Loc); j-- {
			fs[j], fs[j-1] = fs[j-1], fs[j]
		}
	}
}

func locString(loc []any) string {
	parts := make([]string, len(loc))
	for i, l := range loc {
		parts[i] = fmt.Sprint(l)
	}
	return strings.Join(parts, ".")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// DecodeReset decodes reset data (a reset frame's data or POST /reset's
// body; empty means {}) with openenv's ResetRequest rules: seed an integer
// ≥ 0, episode_id a string of at most 255 characters, other members allowed
// (hint and session_id are trace's; the rest are ignored).
func DecodeReset(b []byte) (ResetRequest, *Error) {
	if r, ok := decodeResetFast(b); ok {
		return r, nil
	}
	return decodeReset(b)
}

// decodeReset is DecodeReset without its fast path (fast.go).
func decodeReset(b []byte) (ResetRequest, *Error) {
	var r ResetRequest
	if len(bytes.TrimSpace(b)) == 0 {
		return r, nil
	}
	m, ok, err := object(b)
	if err != nil {
		return r, &Error{Code: CodeInvalidJSON, Message: "Invalid JSON: " + err.Error()}
	}
	if !ok {
		return r, Validation([]any{}, "model_type", "reset data must be an object, got %s", jsonKind(b))
	}
	if raw, has := m["seed"]; has && !isNull(raw) {
		s, e := Seed(raw, []any{"seed"})
		if e != nil {
			return r, e
		}
		r.Seed = &s
	}
	if raw, has := m["episode_id"]; has && !isNull(raw) {
		var id string
		if err := json.Unmarshal(raw, &id); err != nil {
			return r, Validation([]any{"episode_id"}, "string_type", "episode_id: Input should be a valid string")
		}
		if utf8.RuneCountInString(id) > 255 {
			return r, Validation([]any{"episode_id"}, "string_too_long", "episode_id: String should have at most 255 characters")
		}
		r.EpisodeID = &id
	}
	if raw, has := m["hint"]; has && !isNull(raw) {
		if err := json.Unmarshal(raw, &r.Hint); err != nil {
			return r, Validation([]any{"hint"}, "bool_type", "hint: Input should be a valid boolean")
		}
	}
	if raw, has := m["session_id"]; has && !isNull(raw) {
		if err := json.Unmarshal(raw, &r.SessionID); err != nil {
			return r, Validation([]any{"session_id"}, "string_type", "session_id: Input should be a valid string")
		}
	}
	return r, nil
}

// Seed reads a seed at loc: an integer from 0 to 2⁶³−1 (an integral float
// such as 3.0 too, see integer), as reset, a stateless step and tools/call
// take it.
func Seed(raw json.RawMessage, loc []any) (int64, *Error) {
	s, e := integer(raw, loc)
	if e != nil {
		return 0, e
	}
	if s < 0 {
		return 0, Validation(loc, "greater_than_equal", "seed: Input should be greater than or equal to 0")
	}
	return s, nil
}

// integer reads a JSON integer (an integral float such as 3.0 too, as
// pydantic's lax mode does) that fits an int64. pydantic takes integers of
// any size: one past int64 (an unsigned 64-bit seed) is refused as such,
// not as "not a valid integer".
func integer(raw json.RawMessage, loc []any) (int64, *Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		// Text holding a whole number in decimal digits ("42"), as
		// pydantic's lax mode takes; "1e3" or "4.0" as text is not one.
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0, Validation(loc, "int_type", "%s: Input should be a valid integer", locString(loc))
		}
		i, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(strings.TrimSpace(s), "-") {
			return 0, Validation(loc, "less_than_equal", "%s: Input should be less than or equal to %d", locString(loc), int64(math.MaxInt64))
		}
		if err != nil {
			return 0, Validation(loc, "int_parsing", "%s: Input should be a valid integer, unable to parse string as an integer", locString(loc))
		}
		return i, nil
	}
	var f json.Number
	if err := json.Unmarshal(raw, &f); err != nil {
		return 0, Validation(loc, "int_type", "%s: Input should be a valid integer", locString(loc))
	}
	i, err := f.Int64()
	if err == nil {
		return i, nil
	}
	if errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(string(f), "-") {
		return 0, Validation(loc, "less_than_equal", "%s: Input should be less than or equal to %d", locString(loc), int64(math.MaxInt64))
	}
	x, err := f.Float64()
	if err != nil || x != math.Trunc(x) || math.Abs(x) > 1<<53 {
		return 0, Validation(loc, "int_from_float", "%s: Input should be a valid integer", locString(loc))
	}
	return int64(x), nil
}

// DecodeStep decodes POST /step's body (openenv's StepRequest: action an
// object, timeout_s > 0, request_id at most 255 characters, other members
// allowed; seed and session_id are trace's).
func DecodeStep(b []byte) (StepRequest, *Error) {
	var r StepRequest
	m, ok, err := object(b)
	if err != nil {
		return r, &Error{Code: CodeInvalidJSON, Message: "Invalid JSON: " + err.Error()}
	}
	if !ok {
		return r, Validation([]any{"body"}, "model_type", "the step body must be an object, got %s", jsonKind(b))
	}
	raw, has := m["action"]
	switch {
	case !has:
		return r, Validation([]any{"body", "action"}, "missing", "action: Field required")
	case !isObject(raw):
		return r, Validation([]any{"body", "action"}, "dict_type", "action: Input should be a valid dictionary, got %s", jsonKind(raw))
	}
	r.Action = raw
	if raw, has := m["timeout_s"]; has && !isNull(raw) {
		var t float64
		if err := json.Unmarshal(raw, &t); err != nil {
			return r, Validation([]any{"body", "timeout_s"}, "float_type", "timeout_s: Input should be a valid number")
		}
		if !(t > 0) {
			return r, Validation([]any{"body", "timeout_s"}, "greater_than", "timeout_s: Input should be greater than 0")
		}
		r.TimeoutS = &t
	}
	if raw, has := m["request_id"]; has && !isNull(raw) {
		var id string
		if err := json.Unmarshal(raw, &id); err != nil || utf8.RuneCountInString(id) > 255 {
			return r, Validation([]any{"body", "request_id"}, "string_type", "request_id: a string of at most 255 characters")
		}
		r.RequestID = &id
	}
	if raw, has := m["seed"]; has && !isNull(raw) {
		s, e := Seed(raw, []any{"body", "seed"})
		if e != nil {
			return r, e
		}
		r.Seed = &s
	}
	if raw, has := m["session_id"]; has && !isNull(raw) {
		if err := json.Unmarshal(raw, &r.SessionID); err != nil {
			return r, Validation([]any{"body", "session_id"}, "string_type", "session_id: Input should be a valid string")
		}
	}
	return r, nil
}

// DecodeAction decodes a step action: the policy's assistant message in
// OpenAI chat format ({"role": "assistant", "content", "tool_calls": [{"id",
// "type": "function", "function": {"name", "arguments"}}]}, arguments as a
// JSON string or an object; members it does not use, such as
// reasoning_content, are ignored so that a trainer can pass a model's
// message through unchanged), or one of openenv's MCP actions ({"type":
// "list_tools"}, {"type": "call_tool", "tool_name", "arguments"}).
func DecodeAction(b []byte) (Action, *Error) {
	if a, ok := decodeActionFast(b); ok {
		return a, nil
	}
	return decodeAction(b)
}

// decodeAction is DecodeAction without its fast path (fast.go).
func decodeAction(b []byte) (Action, *Error) {
	m, ok, err := object(b)
	if err != nil {
		return Action{}, &Error{Code: CodeInvalidJSON, Message: "Invalid JSON: " + err.Error()}
	}
	if !ok {
		return Action{}, Validation([]any{"data"}, "model_type", "an action must be an object, got %s", jsonKind(b))
	}
	if raw, has := m["type"]; has && !isNull(raw) {
		var typ string
		if json.Unmarshal(raw, &typ) == nil && (typ == ActionListTools || typ == ActionCallTool) {
			return decodeMCPAction(typ, m)
		}
		return Action{}, Validation([]any{"data", "type"}, "literal_error",
			`type: %s is not an action type; an action is the policy's assistant message (without "type") or an MCP action ("type": "list_tools" or "call_tool")`, truncate(string(raw), 40))
	}
	if raw, has := m["role"]; has && !isNull(raw) {
		var role string
		if err := json.Unmarshal(raw, &role); err != nil || role != "assistant" {
			return Action{}, Validation([]any{"data", "role"}, "literal_error", `role: an action is the policy's assistant message, role must be "assistant", got %s`, truncate(string(raw), 40))
		}
	}
	keys := slices.Sorted(maps.Keys(m)) // the first of several, always the same one
	for _, k := range keys {
		if misplacedCall([]byte(k)) && !isNull(m[k]) {
			return Action{}, Validation([]any{"data", k}, "extra_forbidden",
				`%s: not read; a tool call goes in "tool_calls" ([{"id", "type": "function", "function": {"name", "arguments"}}]), and a message without one is the final answer`, k)
		}
	}
	if m["role"] == nil && m["content"] == nil && m["tool_calls"] == nil {
		return Action{}, Validation([]any{"data"}, "missing",
			`an action is the policy's assistant message ("role": "assistant" with "content", the final answer, or "tool_calls"); this one has none of the three`)
	}
	a := Action{Kind: ActionMessage}
	if raw, has := m["content"]; has && !isNull(raw) {
		c, e := content(raw)
		if e != nil {
			return Action{}, e
		}
		a.Content = c
	}
	raw, has := m["tool_calls"]
	if !has || isNull(raw) {
		return a, nil
	}
	var calls []json.RawMessage
	if err := json.Unmarshal(raw, &calls); err != nil {
		return Action{}, Validation([]any{"data", "tool_calls"}, "list_type", "tool_calls: Input should be a valid list, got %s", jsonKind(raw))
	}
	for i, rc := range calls {
		c, e := toolCall(rc, i)
		if e != nil {
			return Action{}, e
		}
		a.ToolCalls = append(a.ToolCalls, c)
	}
	return a, nil
}

// misplacedCall reports a member of an assistant message that looks like
// a tool call but is not one trace reads: OpenAI's deprecated
// function_call, and misspellings of tool_calls (tool_call, toolCalls…).
// Ignored like other unused members, it would make the message the final
// answer and end the episode on the call the policy meant to make.
func misplacedCall(key []byte) bool {
	if string(key) == "tool_calls" {
		return false
	}
	var n [16]byte
	j := 0
	for _, c := range key {
		switch {
		case c == '_' || c == '-':
			continue
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		if j == len(n) {
			return false
		}
		n[j] = c
		j++
	}
	switch string(n[:j]) {
	case "toolcall", "toolcalls", "functioncall", "functioncalls":
		return true
	}
	return false
}

// content reads a message content: a string, or OpenAI's list of content
// parts of which the text parts are joined.
func content(raw json.RawMessage) (string, *Error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", Validation([]any{"data", "content"}, "string_type", "content: Input should be a string or a list of text parts, got %s", jsonKind(raw))
	}
	var sb strings.Builder
	for i, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", Validation([]any{"data", "content", i}, "content_part", "content[%d]: only text parts are supported", i)
		}
		sb.WriteString(*p.Text)
	}
	return sb.String(), nil
}

func toolCall(rc json.RawMessage, i int) (Call, *Error) {
	loc := func(k ...any) []any { return append([]any{"data", "tool_calls", i}, k...) }
	var tc struct {
		ID       json.RawMessage `json:"id"`
		Type     json.RawMessage `json:"type"`
		Function json.RawMessage `json:"function"`
	}
	if !isObject(rc) || json.Unmarshal(rc, &tc) != nil {
		return Call{}, Validation(loc(), "dict_type", "tool_calls[%d]: Input should be a valid dictionary, got %s", i, jsonKind(rc))
	}
	var c Call
	if !isNull(tc.ID) {
		if err := json.Unmarshal(tc.ID, &c.ID); err != nil {
			return Call{}, Validation(loc("id"), "string_type", "tool_calls[%d].id: Input should be a valid string", i)
		}
	}
	if !isNull(tc.Type) {
		var t string
		if json.Unmarshal(tc.Type, &t) != nil || t != "function" {
			return Call{}, Validation(loc("type"), "literal_error", `tool_calls[%d].type: Input should be "function"`, i)
		}
	}
	var fn struct {
		Name      json.RawMessage `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if !isObject(tc.Function) || json.Unmarshal(tc.Function, &fn) != nil {
		return Call{}, Validation(loc("function"), "dict_type", "tool_calls[%d].function: Input should be a valid dictionary, got %s", i, jsonKind(tc.Function))
	}
	if json.Unmarshal(fn.Name, &c.Name) != nil || c.Name == "" {
		return Call{}, Validation(loc("function", "name"), "string_type", "tool_calls[%d].function.name: a non-empty string is required", i)
	}
	args, e := arguments(fn.Arguments, loc("function", "arguments"), fmt.Sprintf("tool_calls[%d].function.arguments", i))
	if e != nil {
		return Call{}, e
	}
	c.Arguments = args
	return c, nil
}

// arguments normalizes a tool call's arguments to a compact JSON object
// text: a JSON string holding an object (as OpenAI sends them; "" is {}),
// an object, or absent/null ({}).
func arguments(raw json.RawMessage, loc []any, name string) ([]byte, *Error) {
	if isNull(raw) {
		return []byte("{}"), nil
	}
	text := []byte(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if strings.TrimSpace(s) == "" {
			return []byte("{}"), nil
		}
		text = []byte(s)
		if !json.Valid(text) {
			var v any
			err := json.Unmarshal(text, &v)
			return nil, Validation(loc, "json_invalid", "%s: not valid JSON: %v", name, err)
		}
	}
	if !isObject(text) {
		return nil, Validation(loc, "dict_type", "%s: must be a JSON object, got %s", name, jsonKind(text))
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, text); err != nil {
		return nil, Validation(loc, "json_invalid", "%s: %v", name, err)
	}
	return buf.Bytes(), nil
}

func decodeMCPAction(typ string, m map[string]json.RawMessage) (Action, *Error) {
	allowed := map[string]bool{"type": true, "metadata": true}
	if typ == ActionCallTool {
		allowed["tool_name"], allowed["arguments"] = true, true
	}
	var fields []FieldError
	for k := range m {
		if !allowed[k] {
			fields = append(fields, FieldError{Type: "extra_forbidden", Loc: []any{k}, Msg: "Extra inputs are not permitted"})
		}
	}
	if len(fields) > 0 {
		sortFields(fields)
		return Action{}, &Error{Code: CodeValidation, Message: "Invalid message: " + fields[0].Msg + " (" + locString(fields[0].Loc) + ")", Fields: fields}
	}
	if typ == ActionListTools {
		return Action{Kind: ActionListTools}, nil
	}
	var c Call
	if json.Unmarshal(m["tool_name"], &c.Name) != nil || c.Name == "" {
		return Action{}, Validation([]any{"tool_name"}, "string_type", "tool_name: a non-empty string is required")
	}
	raw := m["arguments"]
	if !isNull(raw) && !isObject(raw) {
		return Action{}, Validation([]any{"arguments"}, "dict_type", "arguments: Input should be a valid dictionary, got %s", jsonKind(raw))
	}
	args, e := arguments(raw, []any{"arguments"}, "arguments")
	if e != nil {
		return Action{}, e
	}
	c.Arguments = args
	return Action{Kind: ActionCallTool, ToolCalls: []Call{c}}, nil
}
