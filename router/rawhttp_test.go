package router_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The benchmark's load generator and upstream speak HTTP/1.1 over raw
// connections with buffers made once, as wrk and a static server would:
// they share the process with the proxy, and net/http on their side made
// three of every five bytes of the process's garbage (61 allocations per
// request in the client, 25 in the upstream's server), so the collector
// ran for their sake on the proxy's time. In production the proxy's
// process collects only its own garbage. Their buffers are net/http's
// size (4 kB), so that the live heap they add, which spaces the
// collector's cycles out, stays small. The proxy itself is served
// exactly as `trace route` serves it (net/http, its own transport).

// rawConn is one client's kept-alive connection to one server.
type rawConn struct {
	addr string // host:port
	c    net.Conn
	br   *bufio.Reader
	req  []byte // the request being sent, reused
}

func dialRaw(addr string) (*rawConn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	// net/http's buffer size: the live heap the load generator adds (which
	// spaces the collector's cycles out) stays small beside the proxy's.
	return &rawConn{addr: addr, c: c, br: bufio.NewReaderSize(c, 4<<10)}, nil
}

// post sends body to path and reads the whole answer; it returns the
// times to the first body byte and to the end of the body. The response
// must be 200 with a Content-Length or chunked body, as both the upstream
// and the proxy send.
func (rc *rawConn) post(path, body string) (ttfb, total time.Duration, err error) {
	rc.req = append(rc.req[:0], "POST "...)
	rc.req = append(rc.req, path...)
	rc.req = append(rc.req, " HTTP/1.1\r\nHost: "...)
	rc.req = append(rc.req, rc.addr...)
	rc.req = append(rc.req, "\r\nContent-Type: application/json\r\nContent-Length: "...)
	rc.req = strconv.AppendInt(rc.req, int64(len(body)), 10)
	rc.req = append(rc.req, "\r\n\r\n"...)
	rc.req = append(rc.req, body...)
	start := time.Now()
	if _, err := rc.c.Write(rc.req); err != nil {
		return 0, 0, err
	}
	status, length, chunked, err := readHead(rc.br)
	if err != nil {
		return 0, 0, err
	}
	if status != 200 {
		return 0, 0, fmt.Errorf("%s%s: status %d", rc.addr, path, status)
	}
	if chunked {
		first := true
		for {
			line, err := rc.br.ReadSlice('\n')
			if err != nil {
				return 0, 0, err
			}
			if i := bytes.IndexByte(line, ';'); i >= 0 { // chunk extensions
				line = line[:i]
			}
			n, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 64) // no allocation: strconv copies the string only for an error
			if err != nil {
				return 0, 0, fmt.Errorf("chunk size %q: %w", line, err)
			}
			if n == 0 {
				break
			}
			if first {
				if _, err := rc.br.Peek(1); err != nil {
					return 0, 0, err
				}
				ttfb, first = time.Since(start), false
			}
			if _, err := rc.br.Discard(int(n) + 2); err != nil { // data and CRLF
				return 0, 0, err
			}
		}
		for { // trailers, up to the blank line
			line, err := rc.br.ReadSlice('\n')
			if err != nil {
				return 0, 0, err
			}
			if len(bytes.TrimSpace(line)) == 0 {
				break
			}
		}
		return ttfb, time.Since(start), nil
	}
	if length <= 0 {
		return 0, 0, errors.New("a response without Content-Length or chunked body")
	}
	if _, err := rc.br.Peek(1); err != nil {
		return 0, 0, err
	}
	ttfb = time.Since(start)
	if _, err := rc.br.Discard(length); err != nil {
		return 0, 0, err
	}
	return ttfb, time.Since(start), nil
}

func (rc *rawConn) Close() error { return rc.c.Close() }

// readHead reads a status line or request line and the headers; it
// returns the status code (0 for a request), Content-Length and whether
// the body is chunked.
func readHead(br *bufio.Reader) (status, length int, chunked bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, 0, false, err
	}
	if bytes.HasPrefix(line, []byte("HTTP/1.1 ")) && len(line) >= 12 {
		status, err = strconv.Atoi(string(line[9:12]))
		if err != nil {
			return 0, 0, false, fmt.Errorf("status line %q", line)
		}
	}
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return 0, 0, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			return status, length, chunked, nil
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return 0, 0, false, fmt.Errorf("Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		}
	}
}

// Answers of the instant upstream: a chat completion, and a stream of one
// SSE event and [DONE] in two chunks (the second sent after the first is
// flushed, as a streaming engine sends them).
var (
	upJSON = []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(benchAnswer)) + "\r\n\r\n" + benchAnswer)
	upSSE1 = []byte(chunk("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
		`data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"ok"}}]}`+"\n\n"))
	upSSE2 = []byte(chunk("", "data: [DONE]\n\n") + "0\r\n\r\n")
)

func chunk(prefix, data string) string {
	return prefix + strconv.FormatInt(int64(len(data)), 16) + "\r\n" + data + "\r\n"
}

// instantUpstream answers every chat completion at once, on a loopback
// listener, and counts the connections it accepted.
func instantUpstream(b testing.TB) (string, *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ln.Close() })
	conns := new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go serveInstant(c)
		}
	}()
	return "http://" + ln.Addr().String(), conns
}

func serveInstant(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 4<<10)
	var body []byte
	for {
		_, length, _, err := readHead(br)
		if err != nil {
			return
		}
		if cap(body) < length {
			body = make([]byte, length)
		}
		body = body[:length]
		if _, err := io.ReadFull(br, body); err != nil {
			return
		}
		if bytes.Contains(body, []byte(`"stream":true`)) {
			if _, err := c.Write(upSSE1); err != nil {
				return
			}
			_, err = c.Write(upSSE2)
		} else {
			_, err = c.Write(upJSON)
		}
		if err != nil {
			return
		}
	}
}

// The load generator and the upstream make no garbage of their own once
// warm (the benchmark's B/proxied and allocs/proxied count the process's
// allocations as the proxy's), for a JSON answer and a chunked stream.
func TestRawHTTPAllocatesNothing(t *testing.T) {
	url, _ := instantUpstream(t)
	rc, err := dialRaw(strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	for _, body := range []string{`{"model":"m","stream":false}`, `{"model":"m","stream":true}`} {
		post := func() {
			ttfb, total, err := rc.post("/v1/chat/completions", body)
			if err != nil || ttfb <= 0 || total < ttfb {
				t.Fatalf("%s: ttfb %v, total %v, %v", body, ttfb, total, err)
			}
		}
		post() // grows the request buffer once
		if n := testing.AllocsPerRun(200, post); n > 0 {
			t.Errorf("%s: %.2f allocations per request, want 0", body, n)
		}
	}
}
