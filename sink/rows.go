package sink

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/traceops/trace/schemas"
)

// Compaction limits, as TRACE compacts trajectories for its analysts.
const (
	MaxContentChars   = 300
	MaxArgumentsChars = 200
)

// Coord is where a record was read from Kafka ("" / -1 when not from Kafka).
type Coord struct {
	Topic     string
	Partition int
	Offset    int64
}

// RolloutRow is one row of the rollouts table.
type RolloutRow struct {
	RolloutID, Environment, AgentName, AgentVersion, TaskID string
	Success                                                 bool
	Reward                                                  float64
	StartTime, EndTime                                      time.Time
	NMessages, NToolCalls, NToolErrors                      uint32
	Messages, Tools, Grader, Metadata                       string // JSON
	Coord                                                   Coord
}

// size is the row's data in bytes, about what it weighs in a block.
func (r *RolloutRow) size() int {
	return len(r.RolloutID) + len(r.Environment) + len(r.AgentName) + len(r.AgentVersion) + len(r.TaskID) +
		len(r.Messages) + len(r.Tools) + len(r.Grader) + len(r.Metadata) + len(r.Coord.Topic) + 64
}

// CompactMessage is one message as stored: content cut to 300 characters and
// tool arguments (as JSON text) cut to 200.
type CompactMessage struct {
	Role       string            `json:"role"`
	Content    string            `json:"content,omitempty"`
	ToolCalls  []CompactToolCall `json:"tool_calls,omitempty"`
	ToolCallID string            `json:"tool_call_id,omitempty"`
	Error      bool              `json:"error,omitempty"`
	Requestor  string            `json:"requestor,omitempty"`
}

// CompactToolCall is a tool call with its arguments as truncated JSON text.
type CompactToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Requestor string `json:"requestor,omitempty"`
}

// Truncate cuts s to at most n characters (runes), marking the cut with "…".
func Truncate(s string, n int) string {
	if cut, ok := truncCut(s, n); ok {
		return s[:cut] + "…"
	}
	return s
}

// truncCut reports whether s has more than n runes and, if so, the byte
// length of its first n-1 runes (what Truncate keeps before the "…"). It
// reads no further than rune n+1.
func truncCut[S string | []byte](s S, n int) (int, bool) {
	if len(s) <= n {
		return 0, false
	}
	if n < 1 {
		return truncCutSlow(string(s), n)
	}
	cut, count := 0, 0
	for i := 0; i < len(s); {
		// 8 ASCII bytes are 8 runes; stop short of the cut (rune n-1) so
		// that the loop below sees it.
		for count+8 < n && i+8 <= len(s) && ascii8(s, i) {
			i += 8
			count += 8
		}
		if i >= len(s) {
			break
		}
		if count == n-1 {
			cut = i
		}
		if count == n {
			return cut, true
		}
		if s[i] < utf8.RuneSelf {
			i++
		} else {
			_, size := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
			i += size
		}
		count++
	}
	return 0, false
}

// ascii8 reports whether s[i:i+8] is all ASCII.
func ascii8[S string | []byte](s S, i int) bool {
	return (s[i]|s[i+1]|s[i+2]|s[i+3]|s[i+4]|s[i+5]|s[i+6]|s[i+7])&0x80 == 0
}

// truncCutSlow is the original rule, for n < 1.
func truncCutSlow(s string, n int) (int, bool) {
	if len(s) <= n || utf8.RuneCountInString(s) <= n {
		return 0, false
	}
	i, count := 0, 0
	for i = range s {
		if count == n-1 {
			break
		}
		count++
	}
	return i, true
}

// CompactMessages applies TRACE's compaction to a conversation.
func CompactMessages(msgs []schemas.Message) []CompactMessage {
	out := make([]CompactMessage, len(msgs))
	buf := getBuf()
	defer putBuf(buf)
	for i, m := range msgs {
		cm := CompactMessage{Role: m.Role, Content: Truncate(m.Content, MaxContentChars), ToolCallID: m.ToolCallID, Error: m.Error, Requestor: m.Requestor}
		if len(m.ToolCalls) > 0 {
			cm.ToolCalls = make([]CompactToolCall, 0, len(m.ToolCalls))
		}
		for _, tc := range m.ToolCalls {
			*buf = appendArguments((*buf)[:0], tc.Arguments)
			cm.ToolCalls = append(cm.ToolCalls, CompactToolCall{ID: tc.ID, Name: tc.Name, Arguments: string(truncateBytes(*buf, MaxArgumentsChars)), Requestor: tc.Requestor})
		}
		out[i] = cm
	}
	return out
}

// RolloutRowFrom compacts a rollout into its row.
//
// The JSON columns are written by hand into a pooled buffer, byte for byte
// what encoding/json.Marshal produces for the same values (the compacted
// messages as []CompactMessage, the tools, the grader, the metadata); a value
// the hand-written encoder does not cover is handed to encoding/json. Values
// a decoder handed over as JSON text (schemas.DecodeOptions.RawJSON:
// contents, tool-call arguments, the metadata) are written from that text,
// whitespace dropped: the same JSON values, spelled as the producer spelled
// them (its escapes, key order and number forms). A content text is stored as
// it is: decode with ContentCut = MaxContentChars (ingest.DecodeRolloutRow).
func RolloutRowFrom(r *schemas.Rollout, c Coord) RolloutRow {
	// The identifiers are copied: a decoder may hand out strings that are
	// views of one buffer per rollout, which the row must not keep alive.
	row := RolloutRow{
		RolloutID: strings.Clone(r.RolloutID), Environment: strings.Clone(r.Environment),
		AgentName: strings.Clone(r.Agent.Name), AgentVersion: strings.Clone(r.Agent.Version),
		TaskID: strings.Clone(r.TaskID), Success: r.Succeeded(), Reward: r.Outcome.Reward,
		StartTime: r.StartTime, EndTime: r.EndTime, NMessages: uint32(len(r.Messages)), Coord: c,
	}
	for _, m := range r.Messages {
		row.NToolCalls += uint32(len(m.ToolCalls))
		if m.Role == "tool" && m.Error {
			row.NToolErrors++
		}
	}
	buf, args := getBuf(), getBuf()
	defer putBuf(buf)
	defer putBuf(args)
	*buf, *args = appendCompactMessages((*buf)[:0], (*args)[:0], r.Messages)
	row.Messages = string(*buf)
	if len(r.Tools) > 0 {
		row.Tools = toolsJSON(buf, r.Tools)
	}
	if r.Grader != nil {
		row.Grader = marshalString(buf, r.Grader, appendGrader)
	}
	switch {
	case r.MetadataJSON != "": // raw JSON (schemas.DecodeOptions.RawJSON)
		*buf = appendCompactJSON((*buf)[:0], bytesOf(r.MetadataJSON))
		if string(*buf) != "{}" {
			row.Metadata = string(*buf)
		}
	case len(r.Metadata) > 0:
		row.Metadata = marshalString(buf, r.Metadata, func(b []byte, m map[string]any) ([]byte, bool) { return appendMap(b, m) })
	}
	return row
}

// toolsJSON is the tools column. The JSON of a decoder-shared tool array
// (schemas.SharedTools: immutable, the same slice for the same definitions)
// is remembered by the slice's identity, so an agent's tool definitions are
// encoded once rather than with every rollout.
func toolsJSON(buf *[]byte, tools []schemas.Tool) string {
	// Only shared slices are cached, and a shared slice is never modified:
	// a hit needs no SharedTools check.
	if c := toolsJSONCache.Load(); c != nil {
		for _, e := range *c {
			if e.first == &tools[0] && e.n == len(tools) {
				return e.json
			}
		}
	}
	j := marshalString(buf, tools, appendTools)
	if schemas.SharedTools(tools) {
		e := toolsJSONEntry{first: &tools[0], n: len(tools), json: j}
		for {
			old := toolsJSONCache.Load()
			var entries []toolsJSONEntry
			if old != nil {
				entries = *old
			}
			next := append([]toolsJSONEntry{e}, entries[:min(len(entries), toolsJSONCacheSize-1)]...)
			if toolsJSONCache.CompareAndSwap(old, &next) {
				break
			}
		}
	}
	return j
}

const toolsJSONCacheSize = 16

type toolsJSONEntry struct {
	first *schemas.Tool
	n     int
	json  string
}

var toolsJSONCache atomic.Pointer[[]toolsJSONEntry] // copy on write

// marshalString encodes v with the hand-written appender, or with
// encoding/json when the appender does not cover a value (an error there
// gives "", as it always did).
func marshalString[T any](buf *[]byte, v T, appendFn func([]byte, T) ([]byte, bool)) string {
	b, ok := appendFn((*buf)[:0], v)
	*buf = b
	if ok {
		return string(b)
	}
	j, _ := json.Marshal(v)
	return string(j)
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) <= 1<<20 {
		bufPool.Put(b)
	}
}

// truncateBytes is Truncate on bytes: at most n runes, the cut marked "…".
func truncateBytes(b []byte, n int) []byte {
	if cut, ok := truncCut(b, n); ok {
		return append(b[:cut:cut], "…"...)
	}
	return b
}

// appendTruncated appends the JSON string of Truncate(s, n) without building it.
func appendTruncated(b []byte, s string, n int) []byte {
	cut, ok := truncCut(s, n)
	if !ok {
		return appendString(b, s)
	}
	b = appendString(b, s[:cut])
	return append(b[:len(b)-1], "…\""...) // "…" needs no escaping
}

// appendCompactMessages writes json.Marshal(CompactMessages(msgs)) without
// building the intermediate structs. args is scratch space. A message
// decoded as raw JSON (schemas.DecodeOptions.RawJSON) is written from its
// text: the same values, with the input's escapes and, in the arguments
// text, the input's key order and number spelling.
func appendCompactMessages(b, args []byte, msgs []schemas.Message) ([]byte, []byte) {
	b = append(b, '[')
	for i := range msgs {
		m := &msgs[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"role":`...)
		b = appendString(b, m.Role)
		switch {
		case m.ContentJSON != "": // cut by the decoder (ContentCut)
			b = append(b, `,"content":"`...)
			b = append(b, m.ContentJSON...)
			b = append(b, '"')
		case m.Content != "":
			b = append(b, `,"content":`...)
			b = appendTruncated(b, m.Content, MaxContentChars)
		}
		if len(m.ToolCalls) > 0 {
			b = append(b, `,"tool_calls":[`...)
			for j := range m.ToolCalls {
				tc := &m.ToolCalls[j]
				if j > 0 {
					b = append(b, ',')
				}
				b = append(b, `{"id":`...)
				b = appendString(b, tc.ID)
				b = append(b, `,"name":`...)
				b = appendString(b, tc.Name)
				b = append(b, `,"arguments":`...)
				if tc.ArgumentsJSON != "" {
					args = appendCompactJSON(args[:0], bytesOf(tc.ArgumentsJSON))
				} else {
					args = appendArguments(args[:0], tc.Arguments)
				}
				b = appendQuoted(b, truncateBytes(args, MaxArgumentsChars))
				if tc.Requestor != "" {
					b = append(b, `,"requestor":`...)
					b = appendString(b, tc.Requestor)
				}
				b = append(b, '}')
			}
			b = append(b, ']')
		}
		if m.ToolCallID != "" {
			b = append(b, `,"tool_call_id":`...)
			b = appendString(b, m.ToolCallID)
		}
		if m.Error {
			b = append(b, `,"error":true`...)
		}
		if m.Requestor != "" {
			b = append(b, `,"requestor":`...)
			b = appendString(b, m.Requestor)
		}
		b = append(b, '}')
	}
	return append(b, ']'), args
}

// appendArguments appends json.Marshal(args), or nothing when that fails
// (the old code ignored the error and kept "").
func appendArguments(b []byte, args map[string]any) []byte {
	start := len(b)
	b, ok := appendMap(b, args)
	if ok {
		return b
	}
	j, err := json.Marshal(args)
	if err != nil {
		return b[:start]
	}
	return append(b[:start], j...)
}

// appendTools appends json.Marshal(tools); false when a value needs
// encoding/json (parameters that are not valid JSON).
func appendTools(b []byte, tools []schemas.Tool) ([]byte, bool) {
	b = append(b, '[')
	for i := range tools {
		t := &tools[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"type":`...)
		b = appendString(b, t.Type)
		b = append(b, `,"function":{"name":`...)
		b = appendString(b, t.Function.Name)
		if t.Function.Description != "" {
			b = append(b, `,"description":`...)
			b = appendString(b, t.Function.Description)
		}
		if p := t.Function.Parameters; len(p) > 0 {
			if !json.Valid(p) {
				return b, false
			}
			b = append(b, `,"parameters":`...)
			b = appendCompactJSON(b, p)
		}
		b = append(b, "}}"...)
	}
	return append(b, ']'), true
}

// appendGrader appends json.Marshal(g); false for a non-finite float.
func appendGrader(b []byte, g *schemas.Grader) ([]byte, bool) {
	b = append(b, '{')
	comma := false
	if len(g.Reasons) > 0 {
		b = append(b, `"reasons":[`...)
		for i, s := range g.Reasons {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, s)
		}
		b = append(b, ']')
		comma = true
	}
	if len(g.Breakdown) > 0 {
		if comma {
			b = append(b, ',')
		}
		b = append(b, `"breakdown":`...)
		var ok bool
		if b, ok = appendObject(b, g.Breakdown, appendFloat); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

// appendMap appends json.Marshal(m) for the values JSON decoding produces
// (string, float64, bool, nil, []any, map[string]any); false for anything
// else or a non-finite float.
func appendMap(b []byte, m map[string]any) ([]byte, bool) {
	if m == nil {
		return append(b, "null"...), true
	}
	return appendObject(b, m, appendValue)
}

// appendObject appends m as a JSON object with its keys sorted, as
// encoding/json writes maps, each value by value; false when a value
// cannot be written.
func appendObject[V any](b []byte, m map[string]V, value func([]byte, V) ([]byte, bool)) ([]byte, bool) {
	b = append(b, '{')
	var small [16]string
	keys := small[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		var ok bool
		if b, ok = value(b, m[k]); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

func appendValue(b []byte, v any) ([]byte, bool) {
	switch v := v.(type) {
	case string:
		return appendString(b, v), true
	case float64:
		return appendFloat(b, v)
	case int:
		return strconv.AppendInt(b, int64(v), 10), true
	case int64:
		return strconv.AppendInt(b, v, 10), true
	case bool:
		if v {
			return append(b, "true"...), true
		}
		return append(b, "false"...), true
	case nil:
		return append(b, "null"...), true
	case map[string]any:
		return appendMap(b, v)
	case []any:
		if v == nil {
			return append(b, "null"...), true
		}
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendValue(b, e); !ok {
				return b, false
			}
		}
		return append(b, ']'), true
	}
	return b, false
}

// appendFloat formats like encoding/json (ES6 number formatting).
func appendFloat(b []byte, f float64) ([]byte, bool) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return b, false
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// clean up e-09 to e-9
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}

const hexDigits = "0123456789abcdef"

// jsonSafe[c] is true for the ASCII bytes encoding/json writes as they are
// (with HTML escaping on: not <, > or &).
var jsonSafe = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// special8 marks (high bit of the byte) the bytes of x that encoding/json
// does not write as they are: >= 0x80 (checked one rune at a time), < 0x20,
// '"', '\\', '<', '>' and '&'. Bytes above a marked one may be marked
// wrongly (borrows), but the lowest mark is always exact: it is the first
// byte to look at.
func special8(x uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(v uint64) uint64 { return (v - ones) &^ v }
	bad := x | (x - ones*0x20) // high bit: >= 0x80, or (for ASCII) < 0x20
	bad |= zero(x^(ones*'"')) | zero(x^(ones*'\\')) | zero(x^(ones*'<')) | zero(x^(ones*'>')) | zero(x^(ones*'&'))
	return bad & highs
}

// appendString quotes s exactly like encoding/json (HTML-safe escapes,
// U+2028/U+2029 escaped, invalid UTF-8 as \ufffd).
func appendString(b []byte, s string) []byte {
	return appendQuoted(b, bytesOf(s))
}

// bytesOf views s as bytes, for functions that only read them.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// appendQuoted is appendString on bytes (src is only read). Plain ASCII is
// skipped 8 bytes at a time, and the first byte to look at in a word is
// found from its special8 mask.
func appendQuoted(dst, src []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(src); {
		if i+8 <= len(src) {
			m := special8(binary.LittleEndian.Uint64(src[i:]))
			if m == 0 {
				i += 8
				continue
			}
			i += bits.TrailingZeros64(m) >> 3
		}
		c := src[i]
		if c < utf8.RuneSelf {
			if jsonSafe[c] {
				i++
				continue
			}
			dst = append(dst, src[start:i]...)
			switch c {
			case '\\', '"':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(src[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, src[start:i]...)
			dst = append(dst, `\ufffd`...)
			start = i + size
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, src[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			start = i + size
		}
		i += size
	}
	dst = append(dst, src[start:]...)
	return append(dst, '"')
}

// appendCompactJSON is encoding/json's compaction of a json.RawMessage (valid
// JSON) with HTML escaping: whitespace outside strings dropped, <, >, & and
// U+2028/U+2029 escaped.
func appendCompactJSON(dst, src []byte) []byte {
	inString, escaped := false, false
	start := 0
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '<' || c == '>' || c == '&':
			dst = append(dst, src[start:i]...)
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			start = i + 1
		case c == 0xE2 && i+2 < len(src) && src[i+1] == 0x80 && src[i+2]&^1 == 0xA8:
			dst = append(dst, src[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[src[i+2]&0xF])
			i += 2
			start = i + 1
			escaped = false
			continue
		}
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			dst = append(dst, src[start:i]...)
			start = i + 1
		}
	}
	return append(dst, src[start:]...)
}

// LabelRow is one row of capability_labels.
type LabelRow struct {
	schemas.LabelEvent
}

// LabelRowFrom wraps a label event.
func LabelRowFrom(l *schemas.LabelEvent) LabelRow { return LabelRow{*l} }

// LLMCall is one audited call to an LLM endpoint.
type LLMCall struct {
	TS                             time.Time
	Purpose, Model, Endpoint       string // purpose: label | discover | ...
	PromptHash, RolloutID          string
	Run                            uint16
	Attempt                        uint8
	PromptTokens, CompletionTokens uint32
	LatencyMS                      uint32
	Outcome                        string // ok | http_429 | http_5xx | timeout | invalid_json | schema | error
	Error                          string
}

// TriggerEvent is one transition of a capability's trigger.
type TriggerEvent struct {
	TriggerID, Environment, AgentVersion string
	DictionaryVersion                    uint32
	Capability                           string
	Epoch                                uint32
	Event                                string // fired | deselected | rearmed
	At                                   time.Time
	MeanCov, MeanDelta                   float64
	RunsPassed, RunsTotal                uint16
	Window                               schemas.Window
	Payload                              string
}
