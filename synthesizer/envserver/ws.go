package envserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/net/http/httpguts"

	"github.com/traceops/trace/synthesizer/openenv"
)

// writeTimeout bounds writing one frame to a client that does not read.
const writeTimeout = 10 * time.Second

// discardFactor: a frame over the size limit is read and thrown away up to
// this many times the limit, so the session survives it; a larger one
// closes the connection (1009, message too big).
const discardFactor = 64

// wsConn is one WebSocket connection's writer (coder/websocket allows
// concurrent writes; the reaper writes the eviction frame).
type wsConn struct {
	c *websocket.Conn
}

func (w wsConn) send(ctx context.Context, v any) error {
	b, ok := v.([]byte) // a frame the server encoded itself
	if !ok {
		var err error
		if b, err = json.Marshal(v); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	return w.c.Write(ctx, websocket.MessageText, b)
}

// closeWait bounds how long a session's end waits for the peer's answer
// to the close handshake: a client that is not reading (a trainer busy
// between steps) never answers, and must not hold up the server's
// shutdown or the idle reaper.
const closeWait = time.Second

// closeWithin closes c with the close handshake, returning when the peer
// has answered, ctx has ended or closeWait has passed, whichever is first:
// the handshake goes on in the background, within coder/websocket's own
// bounds (5 s to write the close frame, 5 s for the peer's), and a process
// that exits meanwhile closes the socket.
func closeWithin(ctx context.Context, c *websocket.Conn, code websocket.StatusCode, reason string) {
	done := make(chan struct{})
	go func() {
		c.Close(code, reason)
		close(done)
	}()
	waitAtMost(ctx, done, closeWait)
}

// waitAtMost returns when done is closed, ctx ends or d has passed.
func waitAtMost(ctx context.Context, done <-chan struct{}, d time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

func errorFrame(e *openenv.Error) map[string]any {
	return map[string]any{"type": openenv.FrameError, "data": e.Data()}
}

// accept upgrades the connection; clients are programs, not browsers, so
// no origin check applies beyond coder/websocket's same-origin default for
// requests that carry an Origin.
func (s *Server) accept(w http.ResponseWriter, r *http.Request) (*websocket.Conn, error) {
	if !httpguts.HeaderValuesContainsToken(r.Header.Values("Connection"), "upgrade") || !httpguts.HeaderValuesContainsToken(r.Header.Values("Upgrade"), "websocket") {
		// A plain HTTP request: answered in the JSON shape of the other
		// errors (coder/websocket's own answer is text).
		w.Header().Set("Upgrade", "websocket")
		writeJSON(w, http.StatusUpgradeRequired, openenv.HTTPError{
			Detail: r.URL.Path + " speaks WebSocket only: connect with a WebSocket client (Connection: Upgrade, Upgrade: websocket)"})
		return nil, errors.New("not a WebSocket upgrade")
	}
	if canHijack(w) { // else Accept answers 501 as it would have
		w = bigWriter{w}
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled, OriginPatterns: s.cfg.WSOrigins})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(-1) // frames are limited by readFrame, which survives an oversized one
	return c, nil
}

// wsWriteBuffer is the size of a WebSocket connection's write buffer. An
// observation carries the whole transcript and the tools (3–6 kB for the
// example, growing with the episode); through net/http's 4 kB buffer a
// frame past 4 kB took two or more write calls, each a trip through the
// TCP stack.
const wsWriteBuffer = 64 << 10

// bigWriter hands coder/websocket the hijacked connection with a
// wsWriteBuffer-sized writer (net/http's own is 4 kB, empty and unused
// once the connection is hijacked), so that a frame is one write.
type bigWriter struct{ http.ResponseWriter }

func (w bigWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// canHijack reports whether w, or a writer it wraps, can be hijacked.
func canHijack(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case http.Hijacker:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}

func (w bigWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if brw.Writer.Buffered() == 0 {
		brw.Writer = bufio.NewWriterSize(c, wsWriteBuffer)
	}
	return c, brw, nil
}

// readFrame reads one message into buf; a message over limit is discarded
// (up to discardFactor × limit) and reported as tooBig.
func readFrame(ctx context.Context, c *websocket.Conn, buf *bytes.Buffer, limit int) (tooBig int64, err error) {
	_, rd, err := c.Reader(ctx)
	if err != nil {
		return 0, err
	}
	buf.Reset()
	n, err := buf.ReadFrom(io.LimitReader(rd, int64(limit)+1))
	if err != nil {
		return 0, err
	}
	if n <= int64(limit) {
		return 0, nil
	}
	m, err := io.Copy(io.Discard, io.LimitReader(rd, int64(limit)*discardFactor-n)) // n + m ≤ discardFactor × limit
	if err != nil {
		return 0, err
	}
	if more, _ := rd.Read(make([]byte, 1)); more > 0 {
		c.Close(websocket.StatusMessageTooBig, "frame too large")
		return 0, fmt.Errorf("frame over %d bytes", int64(limit)*discardFactor)
	}
	return n + m, nil
}

// refusedLinger bounds how long a connection refused at capacity waits
// for the client's first frame before it is closed; at most maxLingering
// refused connections wait at a time (a reconnect storm at capacity), the
// others are closed at once. Variables for the tests.
var (
	refusedLinger = 5 * time.Second
	maxLingering  = int32(256)
)

// refuse closes a connection refused at capacity, whose error the caller
// has sent, with 1013 once the client has sent its first frame (which is
// not answered), gone, or not sent one within refusedLinger. openenv's
// clients send their first frame (the reset) before they read: on a
// connection closed at once that send fails (Python websockets raises
// ConnectionClosedError) and the client never reads the error waiting
// for it.
func (s *Server) refuse(ctx context.Context, c *websocket.Conn) {
	defer s.lingering.Add(-1)
	if s.lingering.Add(1) > maxLingering {
		c.CloseNow() // no close handshake either: a peer need not answer it
		return
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		var buf bytes.Buffer
		readFrame(ctx, c, &buf, s.cfg.MaxMessageBytes)
	}()
	waitAtMost(ctx, read, refusedLinger)
	c.Close(websocket.StatusTryAgainLater, "capacity reached")
}

// serveWS is /ws: one session per connection, frames until close.
func (s *Server) serveWS(w http.ResponseWriter, r *http.Request, e *served) {
	c, err := s.accept(w, r)
	if err != nil {
		return
	}
	defer c.CloseNow()
	conn := wsConn{c}
	ctx := r.Context()
	sess, perr := e.acquire("ws", func(ctx context.Context, reason string) {
		conn.send(ctx, errorFrame(&openenv.Error{Code: openenv.CodeSession, Message: reason}))
		closeWithin(ctx, c, websocket.StatusPolicyViolation, "session ended")
	})
	if perr != nil {
		s.m.errors.WithLabelValues(e.id, perr.Code).Inc()
		conn.send(ctx, errorFrame(perr))
		s.refuse(ctx, c)
		return
	}
	defer e.release(sess)
	var buf bytes.Buffer
	for {
		tooBig, err := readFrame(ctx, c, &buf, s.cfg.MaxMessageBytes)
		if err != nil {
			return
		}
		live := sess.busy.Add(1) > 0 // not when the reaper evicted it (see gone)
		sess.touch()
		var resp any
		stop := false
		select {
		case <-sess.evicted:
			live = false
		default:
		}
		switch {
		case !live:
			resp, stop = errorFrame(&openenv.Error{Code: openenv.CodeSession, Message: "session evicted: idle for longer than " + s.cfg.IdleTimeout.String()}), true
		default:
			if tooBig > 0 {
				perr := &openenv.Error{Code: openenv.CodeValidation, Message: fmt.Sprintf("Invalid message: a frame of %d bytes exceeds the %d-byte limit (%s)", tooBig, s.cfg.MaxMessageBytes, s.name("max_message_bytes")),
					Fields: []openenv.FieldError{{Type: "too_long", Loc: []any{}, Msg: "frame too large"}}}
				s.m.errors.WithLabelValues(e.id, perr.Code).Inc()
				resp = errorFrame(perr)
			} else {
				resp, stop = s.frame(ctx, e, sess, buf.Bytes())
			}
		}
		if resp != nil {
			if err := conn.send(ctx, resp); err != nil {
				sess.busy.Add(-1)
				return
			}
		}
		sess.touch()
		sess.busy.Add(-1)
		if stop {
			c.Close(websocket.StatusNormalClosure, "")
			return
		}
	}
}

// frame answers one client frame; stop ends the session (a close frame).
// The session's lock is taken through use, which releases it and answers
// a panic under it (see guard).
func (s *Server) frame(ctx context.Context, e *served, sess *session, b []byte) (resp any, stop bool) {
	fail := func(perr *openenv.Error) (any, bool) {
		s.m.errors.WithLabelValues(e.id, perr.Code).Inc()
		return errorFrame(perr), false
	}
	f, perr := openenv.DecodeFrame(b)
	if perr != nil {
		return fail(perr)
	}
	switch f.Type {
	case openenv.FrameClose:
		return nil, true
	case openenv.FrameState:
		st, perr := use(sess, func() (openenv.State, *openenv.Error) { return sess.state(), nil })
		if perr != nil {
			return fail(perr)
		}
		return map[string]any{"type": openenv.FrameState, "data": st}, false
	case openenv.FrameReset:
		r, perr := openenv.DecodeReset(f.Data)
		if perr != nil {
			return fail(perr)
		}
		obs, perr := use(sess, func() (json.RawMessage, *openenv.Error) { return sess.reset(ctx, r) })
		if perr != nil {
			return fail(perr)
		}
		return sess.framed(obs), false
	case openenv.FrameStep:
		a, perr := openenv.DecodeAction(f.Data)
		if perr != nil {
			return fail(perr)
		}
		obs, perr := use(sess, func() (any, *openenv.Error) { return sess.act(ctx, a, s.cfg.StepTimeout) })
		if perr != nil {
			return fail(perr)
		}
		if raw, ok := obs.(json.RawMessage); ok {
			return sess.framed(raw), false
		}
		return map[string]any{"type": openenv.FrameObservation, "data": obs}, false
	case openenv.FrameMCP:
		req, rerr := openenv.DecodeRPC(f.Data)
		var out openenv.RPCResponse
		if rerr != nil {
			out = openenv.RPCResponse{Error: rerr}
		} else {
			out = s.mcp(ctx, e, sess, req)
		}
		return map[string]any{"type": openenv.FrameMCP, "data": out}, false
	}
	return fail(&openenv.Error{Code: openenv.CodeUnknownType, Message: "Unknown message type: " + f.Type})
}

// sessionEnded is what the WebSocket /mcp sends before it closes a session
// the server ended (idle eviction, shutdown): a JSON-RPC error without an
// id, as /ws sends its SESSION_ERROR frame, whose code is in data.
func sessionEnded(reason string) openenv.RPCResponse {
	return openenv.RPCResponse{Error: openenv.NewRPCError(openenv.RPCServerError, reason, map[string]string{"code": openenv.CodeSession})}
}

// serveMCPWS is the WebSocket /mcp: JSON-RPC requests on a session of
// their own (openenv's mcp_websocket_endpoint).
func (s *Server) serveMCPWS(w http.ResponseWriter, r *http.Request, e *served) {
	c, err := s.accept(w, r)
	if err != nil {
		return
	}
	defer c.CloseNow()
	conn := wsConn{c}
	ctx := r.Context()
	sess, perr := e.acquire("ws", func(ctx context.Context, reason string) {
		conn.send(ctx, sessionEnded(reason))
		closeWithin(ctx, c, websocket.StatusPolicyViolation, "session ended")
	})
	if perr != nil {
		s.m.errors.WithLabelValues(e.id, perr.Code).Inc()
		conn.send(ctx, openenv.RPCResponse{Error: openenv.NewRPCError(openenv.RPCServerError, perr.Message,
			map[string]int{"active_sessions": perr.Active, "max_sessions": perr.Max})})
		s.refuse(ctx, c)
		return
	}
	sess.mcpOnly = true // read only by this connection's requests
	defer e.release(sess)
	var buf bytes.Buffer
	for {
		tooBig, err := readFrame(ctx, c, &buf, s.cfg.MaxMessageBytes)
		if err != nil {
			return
		}
		if sess.busy.Add(1) < 1 { // the reaper evicted it (see gone); its onEvict closes the connection
			sess.busy.Add(-1)
			conn.send(ctx, sessionEnded("session evicted: idle for longer than "+s.cfg.IdleTimeout.String()))
			return
		}
		sess.touch()
		var out openenv.RPCResponse
		if tooBig > 0 {
			out = openenv.RPCResponse{Error: openenv.NewRPCError(openenv.RPCInvalidRequest, fmt.Sprintf("request of %d bytes exceeds the %d-byte limit", tooBig, s.cfg.MaxMessageBytes), nil)}
		} else if req, rerr := openenv.DecodeRPC(buf.Bytes()); rerr != nil {
			out = openenv.RPCResponse{Error: rerr}
		} else {
			out = s.mcp(ctx, e, sess, req)
		}
		err = conn.send(ctx, out)
		sess.touch()
		sess.busy.Add(-1)
		if err != nil {
			return
		}
	}
}
