package testenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/internal/dev/testenv"
)

// TestNATSJetStream: create a stream, publish, pull-consume and ack; restart
// the server and find the stream, the consumer's acks and the dedup window
// still there.
func TestNATSJetStream(t *testing.T) {
	ns := testenv.NATS(t)
	_, js := ns.Connect(t, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       "SMOKE",
		Subjects:   []string{"smoke.>"},
		Storage:    jetstream.FileStorage,
		Duplicates: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := js.Publish(ctx, "smoke.a", []byte(fmt.Sprint(i)), jetstream.WithMsgID(fmt.Sprint("id-", i))); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:   "worker",
		AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if err := batch.Error(); err != nil || n != 3 {
		t.Fatalf("fetched %d of 3: %v", n, err)
	}

	url := ns.URL()
	ns.Restart()
	if ns.URL() != url {
		t.Fatalf("URL changed across Restart: %s -> %s", url, ns.URL())
	}

	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatalf("stream after restart: %v", err)
	}
	if info.State.Msgs != 3 {
		t.Errorf("stream has %d messages after restart, want 3", info.State.Msgs)
	}
	ack, err := js.Publish(ctx, "smoke.a", []byte("again"), jetstream.WithMsgID("id-0"))
	if err != nil {
		t.Fatal(err)
	}
	if !ack.Duplicate {
		t.Error("a republished Msg-Id was not deduplicated after restart")
	}
	if _, err := js.Publish(ctx, "smoke.a", []byte("3"), jetstream.WithMsgID("id-3")); err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data()) != "3" {
		t.Errorf("after restart the consumer got %q, want only the new message 3", msg.Data())
	}
	if err := msg.Ack(); err != nil {
		t.Fatal(err)
	}

	ns.Shutdown()
	if ns.Server() != nil {
		t.Error("Server() not nil after Shutdown")
	}
	ns.Shutdown() // twice is fine
}
