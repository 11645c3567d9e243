package envserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/traceops/trace/synthesizer/openenv"
)

// SessionHeader names a stateful HTTP session on /reset, /step and /state
// (as does the body's session_id, or ?session_id= on GET /state). A session
// is created by the JSON-RPC method openenv/session/create on /mcp (as
// openenv's MCPToolClient does) and ends with openenv/session/close or the
// idle timeout. Responses of a stateful request carry the header back.
const SessionHeader = "X-Session-Id"

// nosniff is X-Content-Type-Options' value on every answer, one slice
// shared by all (net/http only reads a header's values): an answer
// carries text a program wrote (its docstring, tool results, the
// transcript), which a browser must take as the JSON it is, never sniff
// into HTML or a script.
var nosniff = []string{"nosniff"}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var b []byte
	var err error
	if raw, ok := v.(json.RawMessage); ok {
		b = raw // encoded by the server itself
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"detail":"encoding the response failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header()["X-Content-Type-Options"] = nosniff
	w.WriteHeader(status)
	w.Write(b)
}

// httpError answers a protocol error with FastAPI's shapes: 422 with the
// validation errors as detail, else the message; trace adds the code.
func (s *Server) httpError(w http.ResponseWriter, e *served, perr *openenv.Error) {
	s.m.errors.WithLabelValues(e.id, perr.Code).Inc()
	status := http.StatusInternalServerError
	var detail any = perr.Message
	switch perr.Code {
	case openenv.CodeValidation, openenv.CodeInvalidJSON:
		status = http.StatusUnprocessableEntity
		if len(perr.Fields) > 0 {
			fs := make([]map[string]any, len(perr.Fields))
			for i, f := range perr.Fields {
				fs[i] = map[string]any{"type": f.Type, "loc": f.Loc, "msg": f.Msg}
			}
			detail = fs
		}
	case openenv.CodeCapacityReached: // no HTTP path takes a slot but session/create, which answers JSON-RPC
		status = http.StatusServiceUnavailable
	case openenv.CodeSession:
		status = http.StatusNotFound
	}
	writeJSON(w, status, openenv.HTTPError{Detail: detail, Code: perr.Code})
}

// body reads a request body up to the message limit.
func (s *Server) body(w http.ResponseWriter, r *http.Request, e *served) ([]byte, bool) {
	return s.readBody(w, r, e, false)
}

// readBody reads a request body up to the message limit; one over it is
// answered 413, or with rpc (POST /mcp) a JSON-RPC error, as WS /mcp
// answers an oversized frame.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, e *served, rpc bool) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.cfg.MaxMessageBytes)))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		s.m.errors.WithLabelValues(e.id, openenv.CodeValidation).Inc()
		msg := fmt.Sprintf("the body exceeds the %d-byte limit (%s)", s.cfg.MaxMessageBytes, s.name("max_message_bytes"))
		if rpc {
			writeJSON(w, http.StatusOK, openenv.RPCResponse{Error: openenv.NewRPCError(openenv.RPCInvalidRequest, "Invalid request: "+msg, nil)})
			return nil, false
		}
		writeJSON(w, http.StatusRequestEntityTooLarge, openenv.HTTPError{Detail: msg, Code: openenv.CodeValidation})
		return nil, false
	case err != nil:
		writeJSON(w, http.StatusBadRequest, openenv.HTTPError{Detail: "reading the body: " + err.Error()})
		return nil, false
	}
	return b, true
}

// stateful returns the HTTP session a request names, held busy (the
// caller calls leave), or nil for a stateless request; a name that matches
// no session is answered.
func (s *Server) stateful(w http.ResponseWriter, r *http.Request, e *served, bodyID string) (*session, bool) {
	id := r.Header.Get(SessionHeader)
	if id == "" {
		id = bodyID
	}
	if id == "" {
		id = r.URL.Query().Get("session_id")
	}
	if id == "" {
		return nil, true
	}
	sess := e.lookup(id)
	if sess == nil {
		s.httpError(w, e, &openenv.Error{Code: openenv.CodeSession,
			Message: fmt.Sprintf("Unknown session_id: %s (create one with openenv/session/create on /mcp; idle sessions are evicted after %s)", id, s.cfg.IdleTimeout)})
		return nil, false
	}
	w.Header().Set(SessionHeader, sess.id)
	return sess, true
}

// use runs f on a session, holding its lock; the lock is released and a
// panic in f answered EXECUTION_ERROR whatever f does (see guard).
//
// A session closed or evicted while the request waited for the lock is
// answered SESSION_ERROR: the request found it before release took it out
// of the map, and playing on would start an episode nothing ever closes.
func use[T any](sess *session, f func() (T, *openenv.Error)) (v T, perr *openenv.Error) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	select {
	case <-sess.evicted:
		return v, &openenv.Error{Code: openenv.CodeSession, Message: fmt.Sprintf("Unknown session_id: %s (it was closed or evicted while this request waited for it)", sess.id)}
	default:
	}
	defer sess.guard(&perr)
	return f()
}

// stepTimeout is a step's deadline: the server's step timeout, lowered by
// the request's timeout_s. The comparison is made in seconds, before
// converting: a huge timeout_s (1e10) would overflow a Duration. A value
// that is not a positive number (the decoder refuses those) leaves the
// server's.
func stepTimeout(server time.Duration, timeoutS *float64) time.Duration {
	if timeoutS == nil {
		return server
	}
	t := *timeoutS
	if !(t > 0) || t >= server.Seconds() { // NaN fails t > 0
		return server
	}
	return time.Duration(t * float64(time.Second))
}

// httpReset is POST /reset: a fresh episode, or the named session's.
func (s *Server) httpReset(w http.ResponseWriter, r *http.Request, e *served) {
	b, ok := s.body(w, r, e)
	if !ok {
		return
	}
	req, perr := openenv.DecodeReset(b)
	if perr != nil {
		s.httpError(w, e, resetInBody(perr))
		return
	}
	sess, ok := s.stateful(w, r, e, req.SessionID)
	if !ok {
		return
	}
	if sess == nil {
		sess = e.ephemeral()
		defer sess.discard()
	} else {
		defer sess.leave()
	}
	resp, perr := use(sess, func() (json.RawMessage, *openenv.Error) { return sess.reset(r.Context(), req) })
	if perr != nil {
		s.httpError(w, e, perr)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// httpStep is POST /step. Stateless (no session): the action is played in a
// fresh episode of the body's seed (random when absent), as OpenEnv's HTTP
// step plays a fresh environment.
func (s *Server) httpStep(w http.ResponseWriter, r *http.Request, e *served) {
	b, ok := s.body(w, r, e)
	if !ok {
		return
	}
	req, perr := openenv.DecodeStep(b)
	if perr != nil {
		s.httpError(w, e, perr)
		return
	}
	a, perr := openenv.DecodeAction(req.Action)
	if perr != nil {
		s.httpError(w, e, inBody(perr))
		return
	}
	timeout := stepTimeout(s.cfg.StepTimeout, req.TimeoutS)
	sess, ok := s.stateful(w, r, e, req.SessionID)
	if !ok {
		return
	}
	fresh := sess == nil
	if fresh {
		sess = e.ephemeral()
		defer sess.discard()
	} else {
		defer sess.leave()
	}
	resp, perr := use(sess, func() (any, *openenv.Error) {
		if fresh {
			if _, perr := sess.reset(r.Context(), openenv.ResetRequest{Seed: req.Seed}); perr != nil {
				return nil, perr
			}
		}
		return sess.act(r.Context(), a, timeout)
	})
	if perr != nil {
		s.httpError(w, e, inBody(perr))
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// inBody places an action's validation errors (located in the WebSocket
// frame's "data") in POST /step's body: ["body", "action", …], as FastAPI
// locates them.
func inBody(perr *openenv.Error) *openenv.Error {
	if perr.Code != openenv.CodeValidation {
		return perr
	}
	for i, f := range perr.Fields {
		if len(f.Loc) > 0 && f.Loc[0] == "body" {
			continue
		}
		perr.Fields[i].Loc = append([]any{"body", "action"}, f.Loc[min(1, len(f.Loc)):]...)
	}
	return perr
}

// resetInBody places reset data's validation errors (located in the
// WebSocket frame's data: ["seed"]) in POST /reset's body: ["body", "seed"],
// as FastAPI locates them.
func resetInBody(perr *openenv.Error) *openenv.Error {
	if perr.Code != openenv.CodeValidation {
		return perr
	}
	for i, f := range perr.Fields {
		perr.Fields[i].Loc = append([]any{"body"}, f.Loc...)
	}
	return perr
}

// httpState is GET /state: a fresh environment's state, or the session's.
func (s *Server) httpState(w http.ResponseWriter, r *http.Request, e *served) {
	sess, ok := s.stateful(w, r, e, "")
	if !ok {
		return
	}
	if sess == nil {
		writeJSON(w, http.StatusOK, openenv.State{Environment: e.id})
		return
	}
	defer sess.leave()
	st, perr := use(sess, func() (openenv.State, *openenv.Error) { return sess.state(), nil })
	if perr != nil {
		s.httpError(w, e, perr)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) httpSchema(w http.ResponseWriter, _ *http.Request, e *served) {
	writeJSON(w, http.StatusOK, e.schemas)
}

// httpOpenAPI is GET /openapi.json: the environment's OpenAPI document,
// where `openenv validate --url` looks for the API's version and endpoints.
func (s *Server) httpOpenAPI(w http.ResponseWriter, _ *http.Request, e *served) {
	writeJSON(w, http.StatusOK, json.RawMessage(e.openapi))
}

func (s *Server) httpMetadata(w http.ResponseWriter, _ *http.Request, e *served) {
	name := e.info.Name
	if name == "" {
		name = e.id
	}
	md := openenv.Metadata{Name: name, Description: e.info.Doc}
	if e.info.Hash != "" {
		v := "sha256:" + e.info.Hash
		md.Version = &v
	}
	writeJSON(w, http.StatusOK, md)
}

// httpMCP is POST /mcp: one JSON-RPC request (openenv answers every error
// with HTTP 200 and a JSON-RPC error).
func (s *Server) httpMCP(w http.ResponseWriter, r *http.Request, e *served) {
	b, ok := s.readBody(w, r, e, true)
	if !ok {
		return
	}
	req, rerr := openenv.DecodeRPC(b)
	if rerr != nil {
		writeJSON(w, http.StatusOK, openenv.RPCResponse{Error: rerr})
		return
	}
	writeJSON(w, http.StatusOK, s.mcp(r.Context(), e, nil, req))
}
