package openenv

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
)

// JSON-RPC 2.0 error codes (openenv's JsonRpcErrorCode).
const (
	RPCParseError     = -32700
	RPCInvalidRequest = -32600
	RPCMethodNotFound = -32601
	RPCInvalidParams  = -32602
	RPCInternalError  = -32603
	RPCServerError    = -32000
)

// MCP and openenv methods served on /mcp.
const (
	MethodToolsList     = "tools/list"
	MethodToolsCall     = "tools/call"
	MethodSessionCreate = "openenv/session/create"
	MethodSessionClose  = "openenv/session/close"
)

// RPCRequest is a JSON-RPC 2.0 request (openenv's JsonRpcRequest: jsonrpc
// "2.0", method, params an object, id a string, an integer or null; no
// other members).
type RPCRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
	ID      json.RawMessage `json:"id,omitempty"`
}

// RPCError is a JSON-RPC error object.
type RPCError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data"`
}

func (e *RPCError) Error() string { return e.Message }

// RPCResponse is a JSON-RPC response: jsonrpc, id, and result or error
// (never both; result is present, possibly null, on success).
type RPCResponse struct {
	ID     json.RawMessage
	Result any
	Error  *RPCError
}

// MarshalJSON writes {"jsonrpc": "2.0", "id", "result"|"error"}.
func (r RPCResponse) MarshalJSON() ([]byte, error) {
	id := r.ID
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	if r.Error != nil {
		return json.Marshal(struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Error   *RPCError       `json:"error"`
		}{"2.0", id, r.Error})
	}
	return json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  any             `json:"result"`
	}{"2.0", id, r.Result})
}

// UnmarshalJSON reads a response (for clients).
func (r *RPCResponse) UnmarshalJSON(b []byte) error {
	var w struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *RPCError       `json:"error"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	r.ID, r.Error = w.ID, w.Error
	if w.Result != nil {
		r.Result = w.Result
	}
	return nil
}

// defaultRPCMessages are openenv's default error messages.
var defaultRPCMessages = map[int]string{
	RPCParseError:     "Parse error",
	RPCInvalidRequest: "Invalid Request",
	RPCMethodNotFound: "Method not found",
	RPCInvalidParams:  "Invalid params",
	RPCInternalError:  "Internal error",
	RPCServerError:    "Server error",
}

// NewRPCError returns an error with code and message (openenv's default
// message for the code when message is "").
func NewRPCError(code int, message string, data any) *RPCError {
	if message == "" {
		message = defaultRPCMessages[code]
	}
	return &RPCError{Code: code, Message: message, Data: data}
}

// DecodeRPC decodes a JSON-RPC request as openenv does: invalid JSON is a
// parse error, a request that does not fit the model an invalid request.
// Params is {} when absent.
func DecodeRPC(b []byte) (RPCRequest, *RPCError) {
	m, ok, err := object(b)
	if err != nil {
		return RPCRequest{}, NewRPCError(RPCParseError, "", nil)
	}
	if !ok {
		return RPCRequest{}, NewRPCError(RPCInvalidRequest, "Invalid request: a request must be a JSON object, got "+jsonKind(b), nil)
	}
	invalid := func(msg string) (RPCRequest, *RPCError) {
		return RPCRequest{}, NewRPCError(RPCInvalidRequest, "Invalid request: "+msg, nil)
	}
	var r RPCRequest
	for k := range m {
		switch k {
		case "jsonrpc", "method", "params", "id":
		default:
			return invalid(k + ": Extra inputs are not permitted")
		}
	}
	if json.Unmarshal(m["jsonrpc"], &r.JSONRPC) != nil || r.JSONRPC != "2.0" {
		return invalid(`jsonrpc: Input should be '2.0'`)
	}
	if json.Unmarshal(m["method"], &r.Method) != nil {
		return invalid("method: Input should be a valid string")
	}
	r.Params = json.RawMessage("{}")
	if raw, has := m["params"]; has {
		if !isObject(raw) {
			return invalid("params: Input should be a valid dictionary")
		}
		r.Params = raw
	}
	if raw, has := m["id"]; has && !isNull(raw) {
		raw = bytes.TrimSpace(raw)
		var s string
		var n json.Number
		switch {
		case json.Unmarshal(raw, &s) == nil:
		case json.Unmarshal(raw, &n) == nil:
			// Any integral number, of any size and however written (1.0,
			// 1e3), as openenv's pydantic model takes; echoed as sent.
			if !integral(n.String()) {
				return invalid("id: Input should be a valid integer or string")
			}
		default:
			return invalid("id: Input should be a valid integer or string")
		}
		r.ID = raw
	}
	return r, nil
}

// MCPTool is one tool of a tools/list result (MCP's Tool).
type MCPTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

// ToolsListResult is the result of tools/list.
type ToolsListResult struct {
	Tools []MCPTool `json:"tools"`
}

// ToolsCallParams are the params of tools/call; SessionID selects a
// session, Seed the seed of the episode a session without one starts (or of
// the fresh episode of a sessionless call), random when absent.
type ToolsCallParams struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	SessionID string          `json:"session_id,omitempty"`
	Seed      *int64          `json:"seed,omitempty"`
}

// TextContent is an MCP text content item.
type TextContent struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// ToolsCallResult is the result of tools/call: MCP's CallToolResult
// (content, isError), plus data, the result's value as FastMCP's result
// carries it (openenv's MCPToolClient returns it), and the episode's state
// after the call in _meta (done, reward once done).
type ToolsCallResult struct {
	Content []TextContent   `json:"content"`
	IsError bool            `json:"isError"`
	Data    json.RawMessage `json:"data"`
	Meta    *CallMeta       `json:"_meta,omitempty"`
}

// CallMeta is the episode's state after a tools/call.
type CallMeta struct {
	EpisodeID        string             `json:"episode_id"`
	Seed             int64              `json:"seed"`
	StepCount        int                `json:"step_count"`
	Done             bool               `json:"done"`
	Reward           *float64           `json:"reward,omitempty"`
	RewardComponents map[string]float64 `json:"reward_components,omitempty"`
}

// integral reports whether a JSON number's text is an integer: exactly,
// from its digits (no float rounding, no big power of ten computed).
func integral(num string) bool {
	mant, exp, _ := strings.Cut(strings.ToLower(num), "e")
	e := 0
	if exp != "" {
		v, err := strconv.Atoi(exp)
		if err != nil { // beyond int: 1e99999999999999999999 is, 1e-… is not (unless 0)
			v = math.MaxInt32
			if strings.HasPrefix(exp, "-") {
				v = math.MinInt32
			}
		}
		e = v
	}
	mant = strings.TrimPrefix(mant, "-")
	whole, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimRight(whole+frac, "0")
	if strings.Trim(digits, "0") == "" {
		return true // zero
	}
	// value = digits × 10^(e − len(frac) + trailing zeros stripped)
	shift := e - len(frac) + (len(whole) + len(frac) - len(digits))
	return shift >= 0
}
