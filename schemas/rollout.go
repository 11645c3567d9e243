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
	"strings"
	"sync/atomic"
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
	Tools       []Tool         `json:"tools,omitempty"` // may be shared between decoded rollouts (SharedTools): read only
	Grader      *Grader        `json:"grader,omitempty"`
	Metadata    map[string]any `json:"metadata,omitempty"`
	// MetadataJSON is set instead of Metadata by a decoder asked for raw
	// JSON (DecodeOptions.RawJSON), like ToolCall.ArgumentsJSON.
	MetadataJSON string `json:"-"`
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
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"` // on role=tool: the call it answers
	Error      bool       `json:"error,omitempty"`        // on role=tool: the tool failed
	Requestor  string     `json:"requestor,omitempty"`    // assistant | user (user-side tools, e.g. τ² telecom)
	TurnIdx    *int       `json:"turn_idx,omitempty"`
	// ContentJSON is set instead of Content by a decoder asked for raw JSON
	// (DecodeOptions.RawJSON, ContentCut): the body of the content's JSON
	// string as it was in the input (escapes included, no quotes),
	// validated, possibly cut. Only sink.RolloutRowFrom reads it (and
	// ToolCall.ArgumentsJSON, Rollout.MetadataJSON), and stores it as it
	// is: cut to sink.MaxContentChars (ingest.DecodeRolloutRow).
	ContentJSON string `json:"-"`
}

// ToolCall is one function call requested in a message.
type ToolCall struct {
	ID        string         `json:"id"`
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
	Requestor string         `json:"requestor,omitempty"`
	// ArgumentsJSON is set instead of Arguments by a decoder asked for raw
	// JSON (DecodeOptions.RawJSON): the arguments object's JSON text as it
	// was in the input (whitespace and key order included), validated.
	ArgumentsJSON string `json:"-"`
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
	// ContentPrefix, when > 0, lets the decoder keep only a prefix of a
	// long message content: at least ContentPrefix characters (runes) of
	// it, validated to its end but not copied past that. For callers that
	// cut contents to at most ContentPrefix-1 characters themselves (the
	// ingest stage's compaction), which then get the same result as from
	// the whole content.
	ContentPrefix int
	// RawJSON hands out message contents, tool-call arguments and the
	// metadata as their JSON text from the input instead of decoding them
	// (Message.ContentJSON, ToolCall.ArgumentsJSON, Rollout.MetadataJSON),
	// for a caller that re-encodes them as JSON anyway (the ingest stage's
	// compaction): that saves unescaping and re-escaping contents and
	// building, sorting and re-encoding maps. A value whose text would not
	// say the same thing to every JSON reader is decoded as usual instead
	// (ContentPrefix applies to such a content): a content that escapes a
	// lone surrogate within its first ContentCut characters (anywhere
	// without a cut), arguments or metadata in which a string escapes one
	// or an object repeats a key (or has an escaped key, or more than 32
	// keys, to keep that check cheap). Values are validated exactly as when
	// decoded: the same documents are accepted.
	RawJSON bool
	// ContentCut, with RawJSON and when > 0, cuts a content longer than
	// ContentCut characters to its first ContentCut-1 characters and "…",
	// as TRACE's compaction does (sink.Truncate), in its JSON text. The rest
	// is validated but not copied.
	ContentCut int
}

var nonFiniteLiteral = regexp.MustCompile(`"reward"\s*:\s*[-+]?(NaN|nan|Infinity|inf|Inf)`)

// DecodeRollout decodes and validates one rollout. It never panics; every
// rejection is an *Error with a Reason code. The checks run cheapest first:
// size, UTF-8, JSON syntax, schema, then the finite reward.
//
// A one-pass parser (fast.go) decodes the struct and checks the schema's
// constraints at the same time; it accepts exactly what the schema path
// accepts. Only a message it refuses goes through the schema path
// (encoding/json, then the JSON Schema validator), which names the precise
// error.
func DecodeRollout(data []byte, opt DecodeOptions) (*Rollout, error) {
	return DecodeRolloutInto(data, opt, nil)
}

// DecodeRolloutInto is DecodeRollout that keeps the rollout's strings in
// *buf (replaced by a larger buffer when it is too small) instead of a new
// buffer per rollout: the rollout is valid only until *buf is used again,
// and nothing of it may be kept (copy what you keep). For decoders that turn
// each rollout into something else right away, with a pooled buffer. buf nil
// is DecodeRollout. Decoder-shared tools (SharedTools) never view *buf.
func DecodeRolloutInto(data []byte, opt DecodeOptions, buf *[]byte) (*Rollout, error) {
	if err := precheck(data, opt); err != nil {
		return nil, err
	}
	var arena []byte
	if buf != nil {
		arena = *buf
	}
	r, why, used := fastDecodeRolloutPrefix(data, opt, arena)
	if buf != nil {
		*buf = used[:0]
	}
	if r != nil {
		return r, nil
	}
	why = strings.Clone(why)
	doc, err := parseDoc(data)
	if err != nil {
		return nil, err
	}
	if err := Validate(KindRollout, doc); err != nil {
		return nil, err
	}
	reward := doc.(map[string]any)["outcome"].(map[string]any)["reward"].(json.Number)
	if f, err := strconv.ParseFloat(string(reward), 64); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, &Error{Reason: ReasonNonFiniteReward, Path: "/outcome/reward", Msg: fmt.Sprintf("reward %s is not a finite float64", reward)}
	}
	if strings.HasPrefix(why, fastBug) {
		// A bug of the fast path, on a rollout the schema accepts: rather
		// than refuse it, decode it with encoding/json (whose struct
		// decoding differs from the schema's view only in corner cases such
		// as keys repeated in another letter case), and count it.
		var r Rollout
		if json.Unmarshal(data, &r) == nil {
			fastPathFallbacks.Add(1)
			return &r, nil
		}
	}
	// The schema accepted it, so the fast path refused a value the Go struct
	// cannot hold (a turn_idx beyond an int, a number beyond a float64, a
	// time that time.Time cannot parse).
	return nil, &Error{Reason: ReasonSchema, Msg: why}
}

var fastPathFallbacks atomic.Uint64

// FastPathFallbacks counts the rollouts, since the process started, that the
// one-pass parser failed on by a bug of its own and encoding/json decoded
// instead (exported as trace_schema_fast_path_fallbacks_total). It should
// stay 0: anything else is a bug to report, with the rollout.
func FastPathFallbacks() uint64 { return fastPathFallbacks.Load() }

// decodeDoc performs the checks shared by every message kind up to a generic
// JSON value with json.Number numbers.
func decodeDoc(data []byte, opt DecodeOptions) (any, error) {
	if err := precheck(data, opt); err != nil {
		return nil, err
	}
	return parseDoc(data)
}

// precheck rejects a message that is too large, empty, or not UTF-8.
func precheck(data []byte, opt DecodeOptions) error {
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
	if !utf8.Valid(data) {
		return &Error{Reason: ReasonInvalidUTF8, Msg: fmt.Sprintf("invalid UTF-8 at byte %d", firstInvalidUTF8(data))}
	}
	return nil
}

// parseDoc decodes valid UTF-8 into a generic JSON value with json.Number
// numbers.
func parseDoc(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		if nonFiniteLiteral.Match(data) {
			return nil, &Error{Reason: ReasonNonFiniteReward, Path: "/outcome/reward", Msg: "reward is NaN or Infinity"}
		}
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
