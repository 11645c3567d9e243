package sink

import (
	"encoding/json"
	"time"
	"unicode/utf8"

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
	if len(s) <= n || utf8.RuneCountInString(s) <= n {
		return s
	}
	i, count := 0, 0
	for i = range s {
		if count == n-1 {
			break
		}
		count++
	}
	return s[:i] + "…"
}

// CompactMessages applies TRACE's compaction to a conversation.
func CompactMessages(msgs []schemas.Message) []CompactMessage {
	out := make([]CompactMessage, len(msgs))
	for i, m := range msgs {
		cm := CompactMessage{Role: m.Role, Content: Truncate(m.Content, MaxContentChars), ToolCallID: m.ToolCallID, Error: m.Error, Requestor: m.Requestor}
		for _, tc := range m.ToolCalls {
			args, _ := json.Marshal(tc.Arguments)
			cm.ToolCalls = append(cm.ToolCalls, CompactToolCall{ID: tc.ID, Name: tc.Name, Arguments: Truncate(string(args), MaxArgumentsChars), Requestor: tc.Requestor})
		}
		out[i] = cm
	}
	return out
}

// RolloutRowFrom compacts a rollout into its row.
func RolloutRowFrom(r *schemas.Rollout, c Coord) RolloutRow {
	row := RolloutRow{
		RolloutID: r.RolloutID, Environment: r.Environment, AgentName: r.Agent.Name, AgentVersion: r.Agent.Version,
		TaskID: r.TaskID, Success: r.Succeeded(), Reward: r.Outcome.Reward,
		StartTime: r.StartTime, EndTime: r.EndTime, NMessages: uint32(len(r.Messages)), Coord: c,
	}
	for _, m := range r.Messages {
		row.NToolCalls += uint32(len(m.ToolCalls))
		if m.Role == "tool" && m.Error {
			row.NToolErrors++
		}
	}
	b, _ := json.Marshal(CompactMessages(r.Messages))
	row.Messages = string(b)
	if len(r.Tools) > 0 {
		b, _ = json.Marshal(r.Tools)
		row.Tools = string(b)
	}
	if r.Grader != nil {
		b, _ = json.Marshal(r.Grader)
		row.Grader = string(b)
	}
	if len(r.Metadata) > 0 {
		b, _ = json.Marshal(r.Metadata)
		row.Metadata = string(b)
	}
	return row
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
