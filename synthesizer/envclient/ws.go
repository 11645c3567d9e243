package envclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/coder/websocket"

	"github.com/traceops/trace/synthesizer/openenv"
)

// Session is one WebSocket session (/ws): one environment instance on the
// server for as long as the connection lives. It is used by one goroutine
// at a time (frames are request/response).
type Session struct {
	c *websocket.Conn
}

// Dial opens a session.
func (c *Client) Dial(ctx context.Context) (*Session, error) {
	u, err := c.wsURL("/ws")
	if err != nil {
		return nil, err
	}
	opts := &websocket.DialOptions{HTTPClient: c.HTTP, CompressionMode: websocket.CompressionDisabled}
	if c.Token != "" {
		opts.HTTPHeader = http.Header{"Authorization": {"Bearer " + c.Token}}
	}
	conn, resp, err := websocket.Dial(ctx, u, opts)
	if err != nil {
		if resp != nil {
			return nil, &Error{Status: resp.StatusCode, Message: err.Error()}
		}
		return nil, err
	}
	conn.SetReadLimit(100 << 20) // openenv's client default, 100 MB
	return &Session{c: conn}, nil
}

// Send writes one raw frame and reads the answer (for frames the typed
// methods do not make, such as malformed ones in tests).
func (s *Session) Send(ctx context.Context, frame []byte) (openenv.Frame, error) {
	if err := s.c.Write(ctx, websocket.MessageText, frame); err != nil {
		return openenv.Frame{}, err
	}
	_, b, err := s.c.Read(ctx)
	if err != nil {
		return openenv.Frame{}, err
	}
	var f openenv.Frame
	if err := json.Unmarshal(b, &f); err != nil {
		return openenv.Frame{}, fmt.Errorf("envclient: frame %q: %w", truncate(b), err)
	}
	return f, nil
}

// roundTrip sends {"type": typ, "data": data} and decodes the answer's data
// into out; an error frame is returned as *Error.
func (s *Session) roundTrip(ctx context.Context, typ string, data any, want string, out any) error {
	frame := map[string]any{"type": typ}
	if data != nil {
		frame["data"] = data
	}
	b, err := json.Marshal(frame)
	if err != nil {
		return err
	}
	f, err := s.Send(ctx, b)
	if err != nil {
		return err
	}
	if f.Type == openenv.FrameError {
		var d openenv.ErrorData
		json.Unmarshal(f.Data, &d)
		return &Error{Code: d.Code, Message: d.Message, Data: d}
	}
	if f.Type != want {
		return fmt.Errorf("envclient: %s answered with a %q frame, want %q", typ, f.Type, want)
	}
	return json.Unmarshal(f.Data, out)
}

// Reset starts an episode.
func (s *Session) Reset(ctx context.Context, r openenv.ResetRequest) (openenv.StepResponse, error) {
	var out openenv.StepResponse
	err := s.roundTrip(ctx, openenv.FrameReset, r, openenv.FrameObservation, &out)
	return out, err
}

// Step plays one assistant message (its tool calls, or the final answer).
func (s *Session) Step(ctx context.Context, action openenv.ChatMessage) (openenv.StepResponse, error) {
	var out openenv.StepResponse
	err := s.roundTrip(ctx, openenv.FrameStep, assistant(action), openenv.FrameObservation, &out)
	return out, err
}

// StepRaw plays any action (e.g. a model's message as it came) and returns
// the observation frame's data.
func (s *Session) StepRaw(ctx context.Context, action any) (json.RawMessage, error) {
	var out json.RawMessage
	err := s.roundTrip(ctx, openenv.FrameStep, action, openenv.FrameObservation, &out)
	return out, err
}

// State returns the session's state.
func (s *Session) State(ctx context.Context) (openenv.State, error) {
	var out openenv.State
	err := s.roundTrip(ctx, openenv.FrameState, nil, openenv.FrameState, &out)
	return out, err
}

// MCP sends a JSON-RPC request in an mcp frame, within the session.
func (s *Session) MCP(ctx context.Context, method string, params any) (openenv.RPCResponse, error) {
	if params == nil {
		params = map[string]any{}
	}
	var out openenv.RPCResponse
	err := s.roundTrip(ctx, openenv.FrameMCP, map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": 1}, openenv.FrameMCP, &out)
	return out, err
}

// Close sends a close frame and closes the connection.
func (s *Session) Close() error {
	s.c.Write(context.Background(), websocket.MessageText, []byte(`{"type":"close"}`))
	return s.c.Close(websocket.StatusNormalClosure, "")
}

// Conn is the underlying connection (tests).
func (s *Session) Conn() *websocket.Conn { return s.c }
