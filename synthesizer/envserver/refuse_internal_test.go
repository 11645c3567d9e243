package envserver

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestRefusedConnectionsLingerBounded: a connection refused at capacity
// waits for its client's first frame (refusedLinger, an hour here), but
// only maxLingering of them at a time; the next is closed at once.
func TestRefusedConnectionsLingerBounded(t *testing.T) {
	defer func(l time.Duration, m int32) { refusedLinger, maxLingering = l, m }(refusedLinger, maxLingering)
	refusedLinger, maxLingering = time.Hour, 1
	cfg := DefaultConfig()
	cfg.MaxSessions = 1
	srv, _ := servedExample(t, cfg)
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := "ws" + strings.TrimPrefix(ts.URL, "http") + "/v1/environments/ex/ws"
	dial := func() *websocket.Conn {
		t.Helper()
		c, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	refused := func(c *websocket.Conn) {
		t.Helper()
		_, b, err := c.Read(ctx)
		if err != nil || !strings.Contains(string(b), "CAPACITY_REACHED") {
			t.Fatalf("refused connection's first frame: %s, %v", b, err)
		}
	}
	held := dial() // takes the one slot
	defer held.CloseNow()
	// The slot is taken after the handshake: a round trip makes sure
	// held has it before the next connection asks.
	if err := held.Write(ctx, websocket.MessageText, []byte(`{"type":"state","data":{}}`)); err != nil {
		t.Fatal(err)
	}
	if _, b, err := held.Read(ctx); err != nil || strings.Contains(string(b), "CAPACITY_REACHED") {
		t.Fatalf("held connection's state: %s, %v", b, err)
	}
	first := dial()
	defer first.CloseNow()
	refused(first)
	for srv.lingering.Load() != 1 {
		if ctx.Err() != nil {
			t.Fatal("the first refused connection never lingered")
		}
		time.Sleep(time.Millisecond)
	}
	second := dial()
	defer second.CloseNow()
	refused(second)
	if _, b, err := second.Read(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("second refused connection: read %s, %v; want it closed at once (the first lingers)", b, err)
	}
	if n := srv.lingering.Load(); n != 1 {
		t.Fatalf("%d connections lingering, want 1 (the first)", n)
	}
	first.CloseNow() // its wait for a first frame ends
	for srv.lingering.Load() != 0 {
		if ctx.Err() != nil {
			t.Fatal("the first refused connection still lingers after its client left")
		}
		time.Sleep(time.Millisecond)
	}
}
