package adapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/internal/dev/testenv"
)

func TestRetryDelay(t *testing.T) {
	for _, c := range []struct {
		deliveries uint64
		want       time.Duration
	}{
		{0, time.Second}, {1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {5, 16 * time.Second},
		{6, 30 * time.Second}, {MaxDeliveries, 30 * time.Second}, {1 << 40, 30 * time.Second},
	} {
		if got := RetryDelay(c.deliveries); got != c.want {
			t.Errorf("RetryDelay(%d) = %s, want %s", c.deliveries, got, c.want)
		}
	}
}

func TestPermanent(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"a query the server refuses", fmt.Errorf("adapters: %w", &clickhouse.Exception{Code: 62, Message: "Max query size exceeded"}), true},
		{"an unknown table", &clickhouse.Exception{Code: 60}, true},
		{"a server too busy", fmt.Errorf("training jobs: %w", &clickhouse.Exception{Code: 202}), false},
		{"a timeout", fmt.Errorf("training jobs: %w", context.DeadlineExceeded), false},
		{"NATS away", fmt.Errorf("nats: publish activation: %w", nats.ErrConnectionClosed), false},
		{"an unknown error", errors.New("something"), false},
		{"a panic", &permanentError{errors.New("panic: boom")}, true},
	} {
		if got := Permanent(c.err); got != c.want {
			t.Errorf("%s: Permanent(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// TestConsumeRejects: on a consumer that hands out one message at a time,
// a message whose handling panics is rejected at its first delivery, one
// that keeps failing with an error that might pass at its MaxDeliveries-th
// (retried until then), each recorded by reject with why and terminated;
// the message behind them is handled. A rejection that cannot be recorded
// is retried, not dropped.
func TestConsumeRejects(t *testing.T) {
	srv := testenv.NATS(t)
	ctx := context.Background()
	_, js := srv.Connect(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "WORK", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Minute, MaxDeliver: -1, MaxAckPending: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"panics", "keeps-failing", "unrecordable", "good"} {
		if _, err := js.Publish(ctx, "work", []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	s := &Stage{cfg: Config{Log: slog.New(slog.DiscardHandler)}, retryDelay: func(uint64) time.Duration { return 10 * time.Millisecond }}
	type rejection struct {
		msg        string
		cause      string
		deliveries uint64
	}
	rejected, handled := make(chan rejection, 10), make(chan string, 10)
	recordFailures := 2 // "unrecordable": its first two rejections cannot be recorded
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- consume(runCtx, cons, s, handlerBound, func(hctx context.Context, m jetstream.Msg) error {
			switch string(m.Data()) {
			case "panics":
				var counts map[string]int
				counts["x"]++
			case "keeps-failing":
				return fmt.Errorf("training jobs: %w", context.DeadlineExceeded)
			case "unrecordable":
				return &clickhouse.Exception{Code: 62, Message: "Max query size exceeded"}
			}
			handled <- string(m.Data())
			return m.Ack()
		}, func(_ context.Context, m jetstream.Msg, cause error, deliveries uint64) error {
			if string(m.Data()) == "unrecordable" && recordFailures > 0 {
				recordFailures--
				return errors.New("clickhouse away (test)")
			}
			rejected <- rejection{string(m.Data()), cause.Error(), deliveries}
			return nil
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	select {
	case got := <-handled:
		if got != "good" {
			t.Fatalf("handled %s", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the message behind the rejected ones was never handled")
	}
	want := []rejection{{"panics", "panic: assignment to entry in nil map", 1}, {"keeps-failing", "training jobs: context deadline exceeded", MaxDeliveries},
		{"unrecordable", "Max query size exceeded", 3}}
	for _, w := range want {
		got := <-rejected
		if got.msg != w.msg || !strings.Contains(got.cause, w.cause) || got.deliveries != w.deliveries {
			t.Errorf("rejected %+v, want %+v", got, w)
		}
	}
	waitForInfo(t, cons, func(info *jetstream.ConsumerInfo) bool { return info.NumAckPending == 0 && info.NumPending == 0 })
}

func waitForInfo(t *testing.T, cons jetstream.Consumer, ok func(*jetstream.ConsumerInfo) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := cons.Info(context.Background())
		if err == nil && ok(info) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer: %+v %v", info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
