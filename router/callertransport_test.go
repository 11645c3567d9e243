package router_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
)

// callerTransport is a diagnostic for BenchmarkProxyOverhead
// (TRACE_BENCH_TRANSPORT=caller), not shipped: it does the upstream
// exchange in the caller's goroutine, with net/http's own request writer
// and response parser over a pool of kept-alive connections, where
// http.Transport hands each request to a connection's write goroutine and
// takes the response from its read goroutine. Measured beside the default
// transport, it shows what those two hand-offs (and the transport's own
// allocations) cost the proxy's tail. It knows only what the benchmark's
// upstream needs: plain HTTP/1.1, no proxies, no retry of a request on a
// connection the upstream closed while idle, no cancellation.
type callerTransport struct {
	mu   sync.Mutex
	idle []*callerConn
}

type callerConn struct {
	c  net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

func (t *callerTransport) conn(addr string) (*callerConn, error) {
	t.mu.Lock()
	if n := len(t.idle); n > 0 {
		pc := t.idle[n-1]
		t.idle = t.idle[:n-1]
		t.mu.Unlock()
		return pc, nil
	}
	t.mu.Unlock()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	// net/http's buffer sizes.
	return &callerConn{c: c, br: bufio.NewReaderSize(c, 4<<10), bw: bufio.NewWriterSize(c, 4<<10)}, nil
}

func (t *callerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	pc, err := t.conn(req.URL.Host)
	if err != nil {
		return nil, err
	}
	if err := req.Write(pc.bw); err == nil {
		err = pc.bw.Flush()
	}
	if err != nil {
		pc.c.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(pc.br, req)
	if err != nil {
		pc.c.Close()
		return nil, err
	}
	resp.Body = &callerBody{ReadCloser: resp.Body, t: t, pc: pc, reuse: !resp.Close}
	return resp, nil
}

// callerBody gives its connection back to the pool at the body's end, or
// closes it if the body is closed before its end.
type callerBody struct {
	io.ReadCloser
	t     *callerTransport
	pc    *callerConn
	reuse bool
	done  bool
}

func (b *callerBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		if !b.reuse {
			b.pc.c.Close()
			return n, err
		}
		b.t.mu.Lock()
		b.t.idle = append(b.t.idle, b.pc)
		b.t.mu.Unlock()
	}
	return n, err
}

func (b *callerBody) Close() error {
	if !b.done {
		b.done = true
		b.pc.c.Close()
	}
	return nil
}
