package testenv

import (
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of a real server, for tests of a server
// that hangs: after Hang it still accepts connections and reads what
// clients send, but forwards nothing either way (as a server that stopped
// answering) until Resume, which passes on what was held.
type Proxy struct {
	// Addr is where clients connect, host:port.
	Addr string

	target string
	ln     net.Listener
	mu     sync.Mutex
	cond   *sync.Cond
	hung   bool
	closed bool
	conns  []net.Conn
}

// NewProxy listens on listen (e.g. "127.0.0.1:0") and forwards every
// connection to target; it is closed when the test ends.
func NewProxy(t testing.TB, listen, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatalf("testenv: proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln}
	p.cond = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// Hang stops forwarding: the server seems to accept and never answer.
func (p *Proxy) Hang() {
	p.mu.Lock()
	p.hung = true
	p.mu.Unlock()
}

// Resume forwards again, what was held first.
func (p *Proxy) Resume() {
	p.mu.Lock()
	p.hung = false
	p.mu.Unlock()
	p.cond.Broadcast()
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed, p.hung = true, false
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.cond.Broadcast()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *Proxy) forward(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		s.Close()
		return
	}
	p.conns = append(p.conns, c, s)
	p.mu.Unlock()
	go p.pipe(s, c)
	p.pipe(c, s)
}

// pipe copies src to dst, each chunk only while the proxy is not hung.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.hung {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF or a closed connection
			return
		}
	}
}
