package envserver

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/traceops/trace/synthesizer/openenv"
)

// act plays a decoded step action in a session (whose mu the caller holds)
// and returns the step response's body: the chat observation for an
// assistant message, or the shapes openenv's MCPToolClient parses for its
// list_tools and call_tool actions.
func (s *session) act(ctx context.Context, a openenv.Action, timeout time.Duration) (any, *openenv.Error) {
	switch a.Kind {
	case openenv.ActionListTools:
		tools := make([]map[string]any, len(s.env.mcp))
		for i, t := range s.env.mcp {
			tools[i] = map[string]any{"name": t.Name, "description": t.Description, "input_schema": t.InputSchema}
		}
		return map[string]any{"observation": map[string]any{"tools": tools}, "reward": nil, "done": false}, nil
	case openenv.ActionCallTool:
		// As tools/call: a session without an episode starts one (a
		// random seed), since MCPToolClient calls tools without a reset.
		if s.play == nil {
			if e := s.env.validate(a); e != nil {
				return nil, e
			}
			if _, e := s.reset(ctx, openenv.ResetRequest{}); e != nil {
				return nil, e
			}
		}
		res, e := s.callTool(ctx, a, timeout)
		if e != nil {
			return nil, e
		}
		return map[string]any{
			"observation": map[string]any{"tool_name": a.ToolCalls[0].Name, "result": res, "error": nil},
			"reward":      res.Meta.Reward, "done": res.Meta.Done,
		}, nil
	}
	obs, perr := s.step(ctx, a, timeout)
	if perr != nil {
		return nil, perr
	}
	return obs, nil
}

// callTool plays one tool call as an assistant turn with that one call and
// returns it as MCP's CallToolResult.
func (s *session) callTool(ctx context.Context, a openenv.Action, timeout time.Duration) (openenv.ToolsCallResult, *openenv.Error) {
	if _, e := s.step(ctx, a, timeout); e != nil {
		return openenv.ToolsCallResult{}, e
	}
	p := s.play
	text := ""
	if n := len(p.results); n > 0 {
		text = p.results[n-1].Content
	}
	data := json.RawMessage(text)
	if !json.Valid(data) {
		data, _ = json.Marshal(text)
	}
	meta := &openenv.CallMeta{EpisodeID: p.id, Seed: p.seed, StepCount: p.steps, Done: p.done}
	if p.reward != nil {
		v := p.reward.Value
		meta.Reward, meta.RewardComponents = &v, p.reward.Components
	}
	return openenv.ToolsCallResult{Content: []openenv.TextContent{{Type: "text", Text: text}}, Data: data, Meta: meta}, nil
}

// mcp answers one JSON-RPC request. ws is the WebSocket session the request
// came on (nil over HTTP, where params.session_id names a session, and a
// request without one plays a fresh episode).
func (s *Server) mcp(ctx context.Context, e *served, ws *session, req openenv.RPCRequest) openenv.RPCResponse {
	resp := openenv.RPCResponse{ID: req.ID}
	fail := func(code int, msg string, data any) openenv.RPCResponse {
		resp.Error = openenv.NewRPCError(code, msg, data)
		s.m.errors.WithLabelValues(e.id, fmt.Sprintf("JSONRPC_%d", code)).Inc()
		return resp
	}
	var params map[string]json.RawMessage
	if err := json.Unmarshal(req.Params, &params); err != nil {
		return fail(openenv.RPCInvalidParams, "Params must be an object", nil)
	}
	str := func(k string) (string, bool) {
		raw, has := params[k]
		if !has || string(raw) == "null" {
			return "", true
		}
		var v string
		err := json.Unmarshal(raw, &v)
		return v, err == nil
	}
	sid, ok := str("session_id")
	if !ok && req.Method != openenv.MethodSessionCreate { // create takes no session_id: ignored, as openenv does
		return fail(openenv.RPCInvalidParams, "Invalid params - 'session_id' must be a string", nil)
	}
	switch req.Method {
	case openenv.MethodSessionCreate:
		if ws != nil {
			resp.Result = map[string]string{"session_id": ws.id}
			return resp
		}
		sess, perr := e.acquire("http", nil)
		if perr != nil {
			s.m.errors.WithLabelValues(e.id, perr.Code).Inc()
			resp.Error = openenv.NewRPCError(openenv.RPCServerError, perr.Message, map[string]int{"active_sessions": perr.Active, "max_sessions": perr.Max})
			return resp
		}
		resp.Result = map[string]string{"session_id": sess.id}
		return resp
	case openenv.MethodSessionClose:
		if sid == "" {
			return fail(openenv.RPCInvalidParams, "Invalid params - 'session_id' is required", nil)
		}
		if ws != nil && sid == ws.id {
			return fail(openenv.RPCInvalidRequest, "Cannot close active WebSocket-managed session via MCP method", nil)
		}
		sess := e.lookup(sid)
		if sess == nil {
			return fail(openenv.RPCInvalidParams, "Unknown session_id: "+sid, nil)
		}
		e.release(sess)
		sess.leave()
		resp.Result = map[string]any{"session_id": sid, "closed": true}
		return resp
	case openenv.MethodToolsList:
		// A named session must exist, and the call counts as its activity
		// (an idle session is evicted), as openenv's.
		if ws == nil && sid != "" {
			sess := e.lookup(sid)
			if sess == nil {
				return fail(openenv.RPCInvalidParams, "Unknown session_id: "+sid, nil)
			}
			sess.leave()
		}
		resp.Result = openenv.ToolsListResult{Tools: e.mcp}
		return resp
	case openenv.MethodToolsCall:
	default:
		return fail(openenv.RPCMethodNotFound, "Method not found: "+req.Method, nil)
	}

	name, ok := str("name")
	if !ok || name == "" {
		return fail(openenv.RPCInvalidParams, "Missing 'name' in params", nil)
	}
	if _, known := e.params[name]; !known {
		return fail(openenv.RPCInvalidParams, "Tool not found: "+name, nil)
	}
	args := params["arguments"]
	if args == nil || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	action, perr := openenv.DecodeAction(mustJSON(map[string]any{"type": "call_tool", "tool_name": name, "arguments": args}))
	if perr != nil {
		return fail(openenv.RPCInvalidParams, perr.Message, perr.Fields)
	}
	var seed *int64
	if raw, has := params["seed"]; has && string(raw) != "null" {
		v, perr := openenv.Seed(raw, []any{"params", "seed"})
		if perr != nil {
			return fail(openenv.RPCInvalidParams, perr.Message, perr.Fields)
		}
		seed = &v
	}

	sess := ws // its frame holds it busy
	switch {
	case sess != nil:
	case sid != "":
		if sess = e.lookup(sid); sess == nil {
			return fail(openenv.RPCInvalidParams, "Unknown session_id: "+sid, nil)
		}
		defer sess.leave()
	default:
		sess = e.ephemeral()
		defer sess.discard()
	}
	res, perr := use(sess, func() (openenv.ToolsCallResult, *openenv.Error) {
		if sess.play == nil {
			if _, perr := sess.reset(ctx, openenv.ResetRequest{Seed: seed}); perr != nil {
				return openenv.ToolsCallResult{}, perr
			}
		}
		return sess.callTool(ctx, action, s.cfg.StepTimeout)
	})
	if perr != nil {
		return s.rpcFail(e, &resp, perr)
	}
	resp.Result = res
	return resp
}

// rpcFail maps a protocol error to JSON-RPC: a validation error is invalid
// params, anything else an internal error with its message (as openenv).
func (s *Server) rpcFail(e *served, resp *openenv.RPCResponse, perr *openenv.Error) openenv.RPCResponse {
	s.m.errors.WithLabelValues(e.id, perr.Code).Inc()
	code := openenv.RPCInternalError
	var data any
	switch perr.Code {
	case openenv.CodeValidation, openenv.CodeInvalidJSON:
		code, data = openenv.RPCInvalidParams, perr.Fields
	case openenv.CodeSession: // closed or evicted while the request waited
		code = openenv.RPCInvalidParams
	}
	resp.Error = openenv.NewRPCError(code, perr.Message, data)
	return *resp
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// ephemeral is a session for one stateless request (OpenEnv's HTTP reset
// and step play a fresh environment each time); it takes no slot.
func (e *served) ephemeral() *session {
	return &session{id: newID(), env: e, transport: "http", stateless: true, evicted: make(chan struct{})}
}

// discard ends an ephemeral session.
func (s *session) discard() {
	s.mu.Lock()
	s.play.close()
	s.play = nil
	if s.w != nil {
		s.w.stop()
		s.w = nil
	}
	s.mu.Unlock()
}
