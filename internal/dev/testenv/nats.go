package testenv

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSServer is an embedded nats-server with JetStream, owned by one test.
// Its methods are safe for concurrent use.
type NATSServer struct {
	t    testing.TB
	mu   sync.Mutex
	opts server.Options // Port is fixed after the first start
	srv  *server.Server // nil while shut down
}

// NATS starts an embedded nats-server v2 with JetStream on 127.0.0.1 (a free
// port), storing JetStream state under t.TempDir(). It is shut down when t
// ends.
func NATS(t testing.TB) *NATSServer {
	t.Helper()
	s := &NATSServer{t: t, opts: server.Options{
		ServerName: "trace-test",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   filepath.Join(t.TempDir(), "jetstream"),
		NoLog:      true,
		NoSigs:     true,
	}}
	if err := s.start(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// URL is the client URL, nats://127.0.0.1:port. It stays the same across
// Restart, so clients configured with it reconnect.
func (s *NATSServer) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "nats://" + net.JoinHostPort(s.opts.Host, strconv.Itoa(s.opts.Port))
}

// Connect opens a client connection (closed when t ends) and its
// JetStream context.
func (s *NATSServer) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.URL(), opts...)
	if err != nil {
		t.Fatalf("testenv: connect to NATS: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("testenv: JetStream: %v", err)
	}
	return nc, js
}

// CloseConn drains nc and waits until it is closed, as a process's
// shutdown closes its connection: what the server delivered to nc's
// subscriptions is then no longer held by it.
func CloseConn(t testing.TB, nc *nats.Conn) {
	t.Helper()
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil {
		t.Fatalf("testenv: drain the NATS connection: %v", err)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("testenv: the NATS connection did not close within 10 s")
	}
}

// StoreDir is where JetStream keeps its state.
func (s *NATSServer) StoreDir() string { return s.opts.StoreDir }

// Server is the running server, or nil while it is shut down.
func (s *NATSServer) Server() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Shutdown stops the server and waits until it is down; clients see the
// connection drop. Shutting down a stopped server does nothing.
func (s *NATSServer) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.srv = nil
}

// Restart shuts the server down if it is running and starts it again on the
// same port and StoreDir: streams, consumers, acknowledged messages,
// dedup windows and KV buckets are all still there. It fails the test when
// the server does not come back.
func (s *NATSServer) Restart() {
	s.t.Helper()
	s.Shutdown()
	if err := s.start(); err != nil {
		s.t.Fatalf("testenv: restart NATS: %v", err)
	}
}

func (s *NATSServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return nil
	}
	// The port of a server that just shut down can take a moment to be
	// free again.
	var last error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		opts := s.opts
		srv, err := server.NewServer(&opts)
		if err != nil {
			return fmt.Errorf("new NATS server: %w", err)
		}
		srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			srv.Shutdown()
			srv.WaitForShutdown()
			last = fmt.Errorf("NATS server on %s:%d not ready", s.opts.Host, s.opts.Port)
			if s.opts.Port == server.RANDOM_PORT {
				break
			}
			continue
		}
		if !srv.JetStreamEnabled() {
			srv.Shutdown()
			return fmt.Errorf("NATS server started without JetStream (store dir %s)", s.opts.StoreDir)
		}
		s.opts.Port = srv.Addr().(*net.TCPAddr).Port
		s.srv = srv
		return nil
	}
	return last
}
