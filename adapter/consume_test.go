package adapter

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/internal/dev/testenv"
)

// TestConsumeHandsBackBufferedMessagesOnShutdown: consume pulls messages
// ahead of the one in hand; when it is stopped, the message in hand is
// finished and the buffered ones are handed back, so that after the
// process's connection closes another replica gets them at once rather
// than after the consumer's AckWait (a minute here).
func TestConsumeHandsBackBufferedMessagesOnShutdown(t *testing.T) {
	srv := testenv.NATS(t)
	ctx := context.Background()
	_, admin := srv.Connect(t)
	if _, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Minute, MaxDeliver: -1}); err != nil {
		t.Fatal(err)
	}
	const n = 6
	for i := range n {
		if _, err := admin.Publish(ctx, "events.x", fmt.Appendf(nil, "%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	nc, js := srv.Connect(t)
	cons, err := js.Consumer(ctx, "EVENTS", "d")
	if err != nil {
		t.Fatal(err)
	}
	s := &Stage{cfg: Config{Log: slog.New(slog.DiscardHandler)}}
	inHand, release := make(chan string, n), make(chan struct{})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- consume(runCtx, cons, s, handlerBound, func(hctx context.Context, m jetstream.Msg) error {
			inHand <- string(m.Data())
			<-release
			return m.DoubleAck(hctx)
		}, nil)
	}()
	first := <-inHand
	time.Sleep(200 * time.Millisecond) // the rest are buffered behind it
	cancel()
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("consume did not stop")
	}
	if len(inHand) != 0 {
		t.Fatalf("%d more messages handled after the stop", len(inHand))
	}
	testenv.CloseConn(t, nc)
	other, err := admin.Consumer(ctx, "EVENTS", "d")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := other.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for m := range batch.Messages() {
		got[string(m.Data())] = true
		_ = m.Ack()
	}
	if len(got) != n-1 || got[first] {
		t.Fatalf("another replica got %v within 5 s (the first, %s, was handled); the rest wait for the AckWait", got, first)
	}
}
