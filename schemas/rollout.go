package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"time"
	"unicode/utf8"
)

// DefaultMaxBytes is the default size limit of one encoded rollout.
const DefaultMaxBytes = 4 << 20

// Rollout is one finished agent episode (schema rollout/v1).
type Rollout struct {
	Schema      string         `json:"schema,omitempty"`
	RolloutID   string         `json:"rollout_id"`
	Environment string         `json:"environment"`
	Agent       Agent          `json:"agent"`
	TaskID      string         `json:"task_id"`
	StartTime   time.Time      `json:"start_time,omitzero"`
	EndTime     time.Time      `json:"end_time,omitzero"`
	Outcome     Outcome        `json:"outcome"`
	Messages    []Message      `json:"messages"`
	Tools       []Tool         `json:"tools,omitempty"`
	Grader      *Grader        `json:"grader,omitempty"`
	Metadata    map[string]any `json:"metadata,omitempty"`
	// ConversationID is the producer's id of the conversation (optional):
	// the routing proxy keys its decisions by it, so rollouts that do not
	// carry Routing are joined to their decision through it.
	ConversationID string `json:"conversation_id,omitempty"`
	// Routing is set by producers whose conversation went through trace's
	// routing proxy (optional).
	Routing *Routing `json:"routing,omitempty"`
}

// Routing names the routing decision that served a conversation and the
// adapter it chose ("" or null: the base model).
type Routing struct {
	DecisionID string `json:"decision_id"`
	Adapter    string `json:"adapter,omitempty"`
}

// Agent identifies the agent that produced a rollout. Statistics are kept per
// (environment, agent version): a new version is a new cohort.
type Agent struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// Outcome is the graded result of an episode. Success, when absent, is
// reward == 1.0 (TRACE-METHOD.md: any lower reward is a failure).
type Outcome struct {
	Reward  float64 `json:"reward"`
	Success *bool   `json:"success,omitempty"`
}

// Message is one turn of the conversation.
type Message struct {
	Role       string     `json:"role"` // system | user | assistant | tool
	Content    string     `json:"content"`
	Reasoning  string     `json:"reasoning,omitempty"` // the model's reasoning text, when the producer kept it
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"` // on role=tool: the call it answers
	Error      bool       `json:"error,omitempty"`        // on role=tool: the tool failed; else the turn failed
	ErrorText  string     `json:"error_text,omitempty"`   // what failed, when the producer said
	Requestor  string     `json:"requestor,omitempty"`    // assistant | user (user-side tools, e.g. τ² telecom)
	TurnIdx    *int       `json:"turn_idx,omitempty"`
}

// ToolCall is one function call requested in a message.
type ToolCall struct {
	ID        string         `json:"id"`
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
	Requestor string         `json:"requestor,omitempty"`
}

// Tool is an OpenAI function schema the agent had available.
type Tool struct {
	Type     string      `json:"type"`
	Function FunctionDef `json:"function"`
}

// FunctionDef is the function part of an OpenAI tool schema.
type FunctionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// Grader carries the grader's explanation when the environment has one.
type Grader struct {
	Reasons   []string           `json:"reasons,omitempty"`
	Breakdown map[string]float64 `json:"breakdown,omitempty"`
}

// Succeeded reports the binary outcome TRACE uses.
func (r *Rollout) Succeeded() bool {
	if r.Outcome.Success != nil {
		return *r.Outcome.Success
	}
	return r.Outcome.Reward == 1.0
}

// Key is the Kafka partitioning key: rollouts of one cohort stay in one
// partition, in order.
func (r *Rollout) Key() string { return r.Environment + "/" + r.Agent.Version }

// DecodeOptions bound what a decoder accepts.
type DecodeOptions struct {
	MaxBytes int // 0 means DefaultMaxBytes
}

var nonFiniteLiteral = regexp.MustCompile(`"reward"\s*:\s*[-+]?(NaN|nan|Infinity|inf|Inf)`)

// DecodeRollout decodes and validates one rollout. It never panics; every
// rejection is an *Error with a Reason code. The checks run cheapest first:
// size, UTF-8, JSON syntax (strict: a repeated member name anywhere is
// ReasonDuplicateKey), schema, then the finite reward.
//
// It is DecodeRawRollout followed by RawRollout.Decode: one strict parser
// (codec.go) checks the schema's constraints while it reads; only a message
// it refuses goes through the schema library, which names the precise error.
func DecodeRollout(data []byte, opt DecodeOptions) (*Rollout, error) {
	raw, err := DecodeRawRollout(data, opt)
	if err != nil {
		return nil, err
	}
	return raw.Decode()
}

// DecodeRawRollout decodes and validates one rollout like DecodeRollout,
// but keeps its free-form values (message contents and reasoning, tool-call
// arguments, tools, grader, metadata) as their JSON text: views of data,
// valid while data is not modified. For a caller that stores them as JSON
// anyway.
func DecodeRawRollout(data []byte, opt DecodeOptions) (*RawRollout, error) {
	if err := checkSize(data, opt); err != nil {
		return nil, err
	}
	// The parser rejects invalid UTF-8 itself (jsontext does), so UTF-8 is
	// checked on its own only to name a rejection.
	r, why := parseRollout(data)
	if r != nil {
		return r, nil
	}
	if err := checkUTF8(data); err != nil {
		return nil, err
	}
	return nil, explainRollout(data, why)
}

// explainRollout names why a rollout the parser refused is not accepted:
// the first syntax error (a repeated name is ReasonDuplicateKey), else the
// schema's first error, else the non-finite reward, else why (a value the
// schema accepts and the Go types cannot hold: a turn_idx beyond an int, a
// number beyond a float64, a time that time.Time cannot parse).
func explainRollout(data []byte, why string) error {
	doc, err := parseDoc(data)
	if err != nil {
		return err
	}
	if err := Validate(KindRollout, doc); err != nil {
		return err
	}
	reward := doc.(map[string]any)["outcome"].(map[string]any)["reward"].(json.Number)
	if f, err := strconv.ParseFloat(string(reward), 64); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return &Error{Reason: ReasonNonFiniteReward, Path: "/outcome/reward", Msg: fmt.Sprintf("reward %s is not a finite float64", reward)}
	}
	return &Error{Reason: ReasonSchema, Msg: why}
}

// decodeDoc performs the checks shared by every message kind up to a generic
// JSON value with json.Number numbers.
// decodeStrict validates data against kind's schema and decodes it into a
// T, refusing fields the Go type does not know.
func decodeStrict[T any](data []byte, kind Kind, opt DecodeOptions) (*T, error) {
	doc, err := decodeDoc(data, opt)
	if err != nil {
		return nil, err
	}
	if err := Validate(kind, doc); err != nil {
		return nil, err
	}
	var v T
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return nil, &Error{Reason: ReasonSchema, Msg: err.Error()}
	}
	return &v, nil
}

func decodeDoc(data []byte, opt DecodeOptions) (any, error) {
	if err := precheck(data, opt); err != nil {
		return nil, err
	}
	return parseDoc(data)
}

// precheck rejects a message that is too large, empty, or not UTF-8.
func precheck(data []byte, opt DecodeOptions) error {
	if err := checkSize(data, opt); err != nil {
		return err
	}
	return checkUTF8(data)
}

// checkSize rejects a message that is too large or empty.
func checkSize(data []byte, opt DecodeOptions) error {
	limit := opt.MaxBytes
	if limit <= 0 {
		limit = DefaultMaxBytes
	}
	if len(data) > limit {
		return &Error{Reason: ReasonTooLarge, Msg: fmt.Sprintf("%d bytes exceeds the limit of %d", len(data), limit)}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return &Error{Reason: ReasonEmpty, Msg: "empty message"}
	}
	return nil
}

func checkUTF8(data []byte) error {
	if !utf8.Valid(data) {
		return &Error{Reason: ReasonInvalidUTF8, Msg: fmt.Sprintf("invalid UTF-8 at byte %d", firstInvalidUTF8(data)) + framingHint(data)}
	}
	return nil
}

// framingHint names a framing a producer may have put before the JSON, for
// the error of a message that is not JSON: the Confluent Schema Registry
// wire format (a 0 byte and a 4-byte big-endian schema id, then the
// payload) is what Confluent's serializers write, and what a team moving
// its producers onto trace's topic is most likely to send.
//
// A UTF-8 byte order mark before the JSON (what some Windows and .NET
// writers put first) is named too: RFC 8259 lets a parser refuse it, and
// trace's does, as its JSON Schema oracle does.
func framingHint(data []byte) string {
	if bytes.HasPrefix(data, []byte("\xef\xbb\xbf")) {
		return " (the message starts with a UTF-8 byte order mark, U+FEFF: produce the JSON without it)"
	}
	if len(data) < 6 || data[0] != 0 {
		return ""
	}
	id := uint32(data[1])<<24 | uint32(data[2])<<16 | uint32(data[3])<<8 | uint32(data[4])
	return fmt.Sprintf(" (the message starts with a 0 byte and a schema id, %d: the Confluent Schema Registry wire format; trace reads plain JSON values, so produce rollouts with a plain JSON or string serializer)", id)
}

// parseDoc checks the syntax of valid UTF-8 strictly (checkSyntax) and
// decodes it into a generic JSON value with json.Number numbers.
func parseDoc(data []byte) (any, error) {
	if err := checkSyntax(data); err != nil {
		if e, ok := err.(*Error); ok && e.Reason == ReasonNotJSON && nonFiniteLiteral.Match(data) {
			return nil, &Error{Reason: ReasonNonFiniteReward, Path: "/outcome/reward", Msg: "reward is NaN or Infinity"}
		}
		if e, ok := err.(*Error); ok && e.Reason == ReasonNotJSON {
			e.Msg += framingHint(data)
		}
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, &Error{Reason: ReasonNotJSON, Msg: err.Error()}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, &Error{Reason: ReasonNotJSON, Msg: "trailing data after the JSON value"}
	}
	return doc, nil
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}
