package sink

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

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
	// ConversationID, RouteDecisionID and Adapter come from the rollout's
	// optional conversation_id and routing fields ("" when absent; Adapter
	// "" with a decision id: routed to the base model).
	ConversationID, RouteDecisionID, Adapter string
	Coord                                    Coord
}

// size is the row's data in bytes, about what it weighs in a block.
func (r *RolloutRow) size() int {
	return len(r.RolloutID) + len(r.Environment) + len(r.AgentName) + len(r.AgentVersion) + len(r.TaskID) +
		len(r.Messages) + len(r.Tools) + len(r.Grader) + len(r.Metadata) + len(r.Coord.Topic) +
		len(r.ConversationID) + len(r.RouteDecisionID) + len(r.Adapter) + 64
}

// CompactMessage is one message as stored: content, reasoning and error
// text cut to 300 characters and tool arguments (as JSON text) cut to 200.
type CompactMessage struct {
	Role       string            `json:"role"`
	Content    string            `json:"content,omitempty"`
	Reasoning  string            `json:"reasoning,omitempty"`
	ToolCalls  []CompactToolCall `json:"tool_calls,omitempty"`
	ToolCallID string            `json:"tool_call_id,omitempty"`
	Error      bool              `json:"error,omitempty"`
	ErrorText  string            `json:"error_text,omitempty"`
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
		return 0, false // every rune takes a byte at least
	}
	cut, count := 0, 0
	for i := 0; i < len(s); count++ {
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
	}
	return 0, false
}

// CompactMessages applies TRACE's compaction to a conversation. Arguments
// are written as encoding/json writes a map (keys sorted).
func CompactMessages(msgs []schemas.Message) []CompactMessage {
	out := make([]CompactMessage, len(msgs))
	for i, m := range msgs {
		cm := CompactMessage{Role: m.Role, Content: Truncate(m.Content, MaxContentChars), Reasoning: Truncate(m.Reasoning, MaxContentChars),
			ToolCallID: m.ToolCallID, Error: m.Error, ErrorText: Truncate(m.ErrorText, MaxContentChars), Requestor: m.Requestor}
		if len(m.ToolCalls) > 0 {
			cm.ToolCalls = make([]CompactToolCall, 0, len(m.ToolCalls))
		}
		for _, tc := range m.ToolCalls {
			args, _ := json.Marshal(tc.Arguments)
			cm.ToolCalls = append(cm.ToolCalls, CompactToolCall{ID: tc.ID, Name: tc.Name, Arguments: Truncate(string(args), MaxArgumentsChars), Requestor: tc.Requestor})
		}
		out[i] = cm
	}
	return out
}

// RolloutRowFrom compacts a decoded rollout into its row (for rollouts that
// were not read from the wire; the ingest stage uses RawRolloutRow).
func RolloutRowFrom(r *schemas.Rollout, c Coord) RolloutRow {
	row := RolloutRow{
		RolloutID: r.RolloutID, Environment: r.Environment, AgentName: r.Agent.Name, AgentVersion: r.Agent.Version,
		TaskID: r.TaskID, Success: r.Succeeded(), Reward: r.Outcome.Reward,
		StartTime: r.StartTime, EndTime: r.EndTime, NMessages: uint32(len(r.Messages)), Coord: c,
		ConversationID: r.ConversationID,
	}
	if r.Routing != nil {
		row.RouteDecisionID, row.Adapter = r.Routing.DecisionID, r.Routing.Adapter
	}
	for _, m := range r.Messages {
		row.NToolCalls += uint32(len(m.ToolCalls))
		if m.Role == "tool" && m.Error {
			row.NToolErrors++
		}
	}
	row.Messages = string(appendMessages(nil, CompactMessages(r.Messages)))
	if len(r.Tools) > 0 {
		b, _ := json.Marshal(r.Tools)
		row.Tools = string(b)
	}
	if r.Grader != nil {
		b, _ := json.Marshal(r.Grader)
		row.Grader = string(b)
	}
	if len(r.Metadata) > 0 {
		b, _ := json.Marshal(r.Metadata)
		row.Metadata = string(b)
	}
	return row
}

// RawRolloutRow compacts a rollout read from the wire into its row: the
// ingest stage's compaction. Contents, reasoning and error texts are cut to
// MaxContentChars characters and the arguments' JSON text to
// MaxArgumentsChars, as in RolloutRowFrom; the arguments, tools, grader and
// metadata keep the producer's text (its key order and number spelling),
// less the whitespace between tokens, instead of being decoded and encoded
// again.
func RawRolloutRow(r *schemas.RawRollout, c Coord) RolloutRow {
	h := &r.Head
	row := RolloutRow{
		RolloutID: h.RolloutID, Environment: h.Environment, AgentName: h.Agent.Name, AgentVersion: h.Agent.Version,
		TaskID: h.TaskID, Success: h.Succeeded(), Reward: h.Outcome.Reward,
		StartTime: h.StartTime, EndTime: h.EndTime, NMessages: uint32(len(r.Messages)), Coord: c,
		ConversationID: h.ConversationID,
	}
	if h.Routing != nil {
		row.RouteDecisionID, row.Adapter = h.Routing.DecisionID, h.Routing.Adapter
	}
	w := writers.Get().(*rowWriter)
	defer writers.Put(w)
	b := append(w.out[:0], '[')
	for i := range r.Messages {
		m := &r.Messages[i]
		row.NToolCalls += uint32(len(m.ToolCalls))
		if m.Role == "tool" && m.Error {
			row.NToolErrors++
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = appendMember(b, `{"role":`, m.Role)
		b = w.appendCut(b, `,"content":`, m.Content)
		b = w.appendCut(b, `,"reasoning":`, m.Reasoning)
		if len(m.ToolCalls) > 0 {
			b = append(b, `,"tool_calls":[`...)
			for j := range m.ToolCalls {
				tc := &m.ToolCalls[j]
				if j > 0 {
					b = append(b, ',')
				}
				b = append(append(b, `{"id":`...), tc.ID...)
				b = append(append(b, `,"name":`...), tc.Name...)
				w.tmp = appendCompact(w.tmp[:0], tc.Arguments)
				b = appendMember(b, `,"arguments":`, truncateBytes(w.tmp, MaxArgumentsChars))
				if tc.Requestor != "" {
					b = appendMember(b, `,"requestor":`, tc.Requestor)
				}
				b = append(b, '}')
			}
			b = append(b, ']')
		}
		if len(m.ToolCallID) > 2 {
			b = append(append(b, `,"tool_call_id":`...), m.ToolCallID...)
		}
		if m.Error {
			b = append(b, `,"error":true`...)
		}
		b = w.appendCut(b, `,"error_text":`, m.ErrorText)
		if m.Requestor != "" {
			b = appendMember(b, `,"requestor":`, m.Requestor)
		}
		b = append(b, '}')
	}
	b = append(b, ']')
	row.Messages = string(b)
	w.out = b
	row.Tools = compactTools(w, r.Tools)
	row.Grader = w.compactString(r.Grader, "")
	row.Metadata = w.compactString(r.Metadata, "{}")
	return row
}

// compactTools is the tools column. An agent's tool definitions are the
// same in every one of its rollouts, so the last few are remembered by
// their text, with the column they give.
func compactTools(w *rowWriter, tools []byte) string {
	if e := toolsColumns.Load(); e != nil {
		for _, c := range *e {
			if string(c.text) == string(tools) {
				return c.column
			}
		}
	}
	col := w.compactString(tools, "[]")
	c := toolsColumn{text: append([]byte(nil), tools...), column: col}
	for {
		old := toolsColumns.Load()
		var prev []toolsColumn
		if old != nil {
			prev = *old
		}
		next := append([]toolsColumn{c}, prev[:min(len(prev), 15)]...)
		if toolsColumns.CompareAndSwap(old, &next) {
			return col
		}
	}
}

type toolsColumn struct {
	text   []byte
	column string
}

var toolsColumns atomic.Pointer[[]toolsColumn] // copied on write

// rowWriter holds RawRolloutRow's scratch buffers.
type rowWriter struct{ out, tmp []byte }

var writers = sync.Pool{New: func() any { return &rowWriter{out: make([]byte, 0, 16<<10)} }}

// appendCut appends key and the JSON string text v cut to MaxContentChars
// characters, in v's own spelling (its escapes kept); nothing for a nil or
// empty v.
func (w *rowWriter) appendCut(b []byte, key string, v jsontext.Value) []byte {
	if len(v) <= 2 {
		return b
	}
	b = append(b, key...)
	body := v[1 : len(v)-1]
	keep := prefixEnd(body, MaxContentChars-1)
	if rest := body[keep:]; prefixEnd(rest, 1) == len(rest) {
		return append(b, v...) // at most MaxContentChars characters
	}
	b = append(b, '"')
	b = append(b, body[:keep]...)
	return append(b, "…\""...)
}

// prefixEnd returns the length of the shortest prefix of body, the text
// between the quotes of a valid JSON string, that stands for n characters
// (len(body) when it stands for fewer). An escape is one character, and so
// is an escaped surrogate pair (a lone surrogate is not valid).
func prefixEnd(body []byte, n int) int {
	i := 0
	for c := 0; c < n && i < len(body); c++ {
		// 8 ASCII bytes without a backslash are 8 characters.
		for c+8 <= n && i+8 <= len(body) {
			x := binary.LittleEndian.Uint64(body[i:])
			bs := x ^ 0x5c5c5c5c5c5c5c5c // zero bytes where x has a backslash
			if (x|(bs-0x0101010101010101)&^bs)&0x8080808080808080 != 0 {
				break
			}
			i += 8
			c += 8
		}
		if c >= n || i >= len(body) {
			break
		}
		switch b := body[i]; {
		case b == '\\' && body[i+1] == 'u':
			if h := body[i+2]; (h == 'd' || h == 'D') && strings.IndexByte("89abAB", body[i+3]) >= 0 {
				i += 12 // a high surrogate escape, then its low one
			} else {
				i += 6
			}
		case b == '\\':
			i += 2
		case b < utf8.RuneSelf:
			i++
		case b >= 0xF0: // valid UTF-8: the leading byte gives the length
			i += 4
		case b >= 0xE0:
			i += 3
		default:
			i += 2
		}
	}
	return i
}

// compactString is the value's text without whitespace between tokens, ""
// for nil or for empty (the text of an empty value).
func (w *rowWriter) compactString(v jsontext.Value, empty string) string {
	if v == nil {
		return ""
	}
	w.tmp = appendCompact(w.tmp[:0], v)
	if string(w.tmp) == empty {
		return ""
	}
	return string(w.tmp)
}

// appendCompact appends valid JSON without the whitespace between tokens.
func appendCompact(dst []byte, v jsontext.Value) []byte {
	inString := false
	start := 0
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case inString && c == '\\':
			i++ // the escaped byte (a quote, a backslash or u)
		case c == '"':
			inString = !inString
		case !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			dst = append(dst, v[start:i]...)
			start = i + 1
		}
	}
	return append(dst, v[start:]...)
}

// appendMember appends key (the JSON text before a value) and s as a JSON
// string. s is valid UTF-8 (validated input, or cut at a rune boundary).
func appendMember[S string | []byte](b []byte, key string, s S) []byte {
	b = append(b, key...)
	b, _ = jsontext.AppendQuote(b, s)
	return b
}

// truncateBytes is Truncate on bytes: at most n runes, the cut marked "…".
// It may write into b's spare capacity.
func truncateBytes(b []byte, n int) []byte {
	if cut, ok := truncCut(b, n); ok {
		return append(b[:cut:cut], "…"...)
	}
	return b
}

// appendMessages writes compacted messages as RawRolloutRow does.
func appendMessages(b []byte, msgs []CompactMessage) []byte {
	b = append(b, '[')
	for i := range msgs {
		m := &msgs[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = appendMember(b, `{"role":`, m.Role)
		if m.Content != "" {
			b = appendMember(b, `,"content":`, m.Content)
		}
		if m.Reasoning != "" {
			b = appendMember(b, `,"reasoning":`, m.Reasoning)
		}
		if len(m.ToolCalls) > 0 {
			b = append(b, `,"tool_calls":[`...)
			for j, tc := range m.ToolCalls {
				if j > 0 {
					b = append(b, ',')
				}
				b = appendMember(b, `{"id":`, tc.ID)
				b = appendMember(b, `,"name":`, tc.Name)
				b = appendMember(b, `,"arguments":`, tc.Arguments)
				if tc.Requestor != "" {
					b = appendMember(b, `,"requestor":`, tc.Requestor)
				}
				b = append(b, '}')
			}
			b = append(b, ']')
		}
		if m.ToolCallID != "" {
			b = appendMember(b, `,"tool_call_id":`, m.ToolCallID)
		}
		if m.Error {
			b = append(b, `,"error":true`...)
		}
		if m.ErrorText != "" {
			b = appendMember(b, `,"error_text":`, m.ErrorText)
		}
		if m.Requestor != "" {
			b = appendMember(b, `,"requestor":`, m.Requestor)
		}
		b = append(b, '}')
	}
	return append(b, ']')
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
