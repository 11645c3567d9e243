// Package envclient is a Go client of the OpenEnv protocol as trace's
// environment server (synthesizer/envserver) and openenv-core's reference
// server speak it: WebSocket sessions (Dial), stateless and session HTTP
// (Reset, Step, State), MCP JSON-RPC (CallTool, ListTools) and discovery
// (ListEnvironments). Calibration and the tests play environments with it.
package envclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/traceops/trace/synthesizer/openenv"
)

// Error is an error the server answered: an error frame's code and message,
// or an HTTP error's status, code and detail.
type Error struct {
	Code    string // OpenEnv error code, "" when the server sent none
	Message string
	Status  int // HTTP status; 0 for a WebSocket error frame
	Data    openenv.ErrorData
}

func (e *Error) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("envclient: HTTP %d %s: %s", e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("envclient: %s: %s", e.Code, e.Message)
}

// Client talks to one environment: BaseURL is its root, e.g.
// http://127.0.0.1:8090/v1/environments/precondition_airline (the
// base_url an openenv client takes too).
type Client struct {
	BaseURL string
	// Token is sent as "Authorization: Bearer Token" when set.
	Token string
	// HTTP is the client for HTTP calls (http.DefaultClient when nil).
	HTTP *http.Client

	rpcID atomic.Int64
}

// New returns a client of the environment at baseURL.
func New(baseURL, token string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token}
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// do sends one HTTP request and decodes a 200 answer into out.
func (c *Client) do(ctx context.Context, method, path string, header http.Header, body, out any) (http.Header, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return nil, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var he struct {
			Detail json.RawMessage `json:"detail"`
			Code   string          `json:"code"`
		}
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &he) == nil && he.Detail != nil {
			var s string
			if json.Unmarshal(he.Detail, &s) == nil {
				msg = s
			} else {
				msg = string(he.Detail)
			}
		}
		return resp.Header, &Error{Status: resp.StatusCode, Code: he.Code, Message: msg}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.Header, fmt.Errorf("envclient: %s %s: decoding %q: %w", method, path, truncate(b), err)
		}
	}
	return resp.Header, nil
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

func sessionHeader(id string) http.Header {
	if id == "" {
		return nil
	}
	return http.Header{"X-Session-Id": {id}}
}

// Reset is POST /reset: stateless (a fresh episode shown once), or the
// session's new episode when r.SessionID is set.
func (c *Client) Reset(ctx context.Context, r openenv.ResetRequest) (openenv.StepResponse, error) {
	var out openenv.StepResponse
	_, err := c.do(ctx, http.MethodPost, "/reset", sessionHeader(r.SessionID), r, &out)
	return out, err
}

// Step is POST /step with an assistant message; sessionID "" plays it in a
// fresh episode of seed (OpenEnv's stateless HTTP).
func (c *Client) Step(ctx context.Context, sessionID string, seed *int64, action openenv.ChatMessage) (openenv.StepResponse, error) {
	var out openenv.StepResponse
	body := map[string]any{"action": assistant(action)}
	if seed != nil {
		body["seed"] = *seed
	}
	_, err := c.do(ctx, http.MethodPost, "/step", sessionHeader(sessionID), body, &out)
	return out, err
}

// assistant is m as an action: an unset role is "assistant" and an unset
// tool-call type "function", as the server reads a message without them
// (the struct would send "", which it refuses).
func assistant(m openenv.ChatMessage) openenv.ChatMessage {
	if m.Role == "" {
		m.Role = "assistant"
	}
	copied := false
	for i, tc := range m.ToolCalls {
		if tc.Type == "" {
			if !copied { // the caller's slice stays as it was
				m.ToolCalls, copied = append([]openenv.ChatToolCall(nil), m.ToolCalls...), true
			}
			m.ToolCalls[i].Type = "function"
		}
	}
	return m
}

// State is GET /state (of a session when sessionID is set).
func (c *Client) State(ctx context.Context, sessionID string) (openenv.State, error) {
	var out openenv.State
	_, err := c.do(ctx, http.MethodGet, "/state", sessionHeader(sessionID), nil, &out)
	return out, err
}

// Schema is GET /schema.
func (c *Client) Schema(ctx context.Context) (openenv.SchemaResponse, error) {
	var out openenv.SchemaResponse
	_, err := c.do(ctx, http.MethodGet, "/schema", nil, nil, &out)
	return out, err
}

// Metadata is GET /metadata.
func (c *Client) Metadata(ctx context.Context) (openenv.Metadata, error) {
	var out openenv.Metadata
	_, err := c.do(ctx, http.MethodGet, "/metadata", nil, nil, &out)
	return out, err
}

// Health is GET /health.
func (c *Client) Health(ctx context.Context) (openenv.Health, error) {
	var out openenv.Health
	_, err := c.do(ctx, http.MethodGet, "/health", nil, nil, &out)
	return out, err
}

// MCP sends one JSON-RPC request to POST /mcp and returns its result; a
// JSON-RPC error is returned as *openenv.RPCError.
func (c *Client) MCP(ctx context.Context, method string, params any) (json.RawMessage, error) {
	if params == nil {
		params = map[string]any{}
	}
	req := map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": c.rpcID.Add(1)}
	var resp openenv.RPCResponse
	if _, err := c.do(ctx, http.MethodPost, "/mcp", nil, req, &resp); err != nil {
		return nil, err
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	raw, _ := resp.Result.(json.RawMessage)
	return raw, nil
}

// CreateSession opens a stateful HTTP session (openenv/session/create).
func (c *Client) CreateSession(ctx context.Context) (string, error) {
	raw, err := c.MCP(ctx, openenv.MethodSessionCreate, nil)
	if err != nil {
		return "", err
	}
	var r struct {
		SessionID string `json:"session_id"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.SessionID == "" {
		return "", fmt.Errorf("envclient: session/create answered %s", raw)
	}
	return r.SessionID, nil
}

// CloseSession ends a stateful HTTP session (openenv/session/close).
func (c *Client) CloseSession(ctx context.Context, id string) error {
	_, err := c.MCP(ctx, openenv.MethodSessionClose, map[string]string{"session_id": id})
	return err
}

// ListTools is tools/list.
func (c *Client) ListTools(ctx context.Context) ([]openenv.MCPTool, error) {
	raw, err := c.MCP(ctx, openenv.MethodToolsList, nil)
	if err != nil {
		return nil, err
	}
	var r openenv.ToolsListResult
	err = json.Unmarshal(raw, &r)
	return r.Tools, err
}

// CallTool is tools/call in a session (or in a fresh episode when
// sessionID is "").
func (c *Client) CallTool(ctx context.Context, sessionID, name string, args any) (openenv.ToolsCallResult, error) {
	p := map[string]any{"name": name, "arguments": args}
	if sessionID != "" {
		p["session_id"] = sessionID
	}
	var r openenv.ToolsCallResult
	raw, err := c.MCP(ctx, openenv.MethodToolsCall, p)
	if err != nil {
		return r, err
	}
	err = json.Unmarshal(raw, &r)
	return r, err
}

// Environment is one entry of GET /v1/environments.
type Environment struct {
	ID                string          `json:"id"`
	Name              string          `json:"name"`
	Doc               string          `json:"doc"`
	Capability        string          `json:"capability"`
	TargetEnvironment string          `json:"target_environment"`
	AgentVersion      string          `json:"agent_version"`
	ProgramHash       string          `json:"program_hash"`
	Status            string          `json:"status"`
	Source            string          `json:"source"`
	Tools             []openenv.Tool  `json:"tools"`
	Calibration       json.RawMessage `json:"calibration"`
	URL               string          `json:"url"`
}

// ListEnvironments is GET /v1/environments on the server at serverURL
// (scheme, host and port).
func ListEnvironments(ctx context.Context, serverURL, token string) ([]Environment, error) {
	c := New(strings.TrimRight(serverURL, "/")+"/v1/environments", token)
	var out struct {
		Environments []Environment `json:"environments"`
	}
	_, err := c.do(ctx, http.MethodGet, "", nil, nil, &out)
	return out.Environments, err
}

// wsURL turns the base URL into its /ws (or other path) WebSocket URL.
func (c *Client) wsURL(path string) (string, error) {
	u, err := url.Parse(c.BaseURL + path)
	if err != nil {
		return "", err
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	}
	return u.String(), nil
}
