package embedded

import (
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestNATSPortInUse: a port already taken is reported as such, naming the
// settings to change, instead of a server that never gets ready; a free
// port serves.
func TestNATSPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	_, _, err = NATS(t.TempDir(), port, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), "embedded.nats_port") {
		t.Fatalf("NATS on a port in use: %v", err)
	}
	l.Close()
	ns, url, err := NATS(t.TempDir(), port, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}
