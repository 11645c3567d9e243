package testenv_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/internal/dev/testenv"
)

func produce(t *testing.T, brokers []string, topic string, from, to int) {
	t.Helper()
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     &kafka.Hash{},
		BatchTimeout: 10 * time.Millisecond,
		RequiredAcks: kafka.RequireAll,
	}
	defer w.Close()
	var msgs []kafka.Message
	for i := from; i < to; i++ {
		msgs = append(msgs, kafka.Message{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("v%d", i))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
}

// consume reads n messages as a member of group, committing each, and
// returns their values.
func consume(t *testing.T, brokers []string, topic, group string, n int) map[string]bool {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:     brokers,
		GroupID:     group,
		Topic:       topic,
		StartOffset: kafka.FirstOffset,
		MaxWait:     200 * time.Millisecond, // also bounds how long Close waits for a fetch
	})
	defer func() {
		begin := time.Now()
		if err := r.Close(); err != nil {
			t.Error(err)
		}
		t.Logf("reader closed in %s", time.Since(begin).Round(time.Millisecond))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got := map[string]bool{}
	for len(got) < n {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("after %d of %d messages: %v", len(got), n, err)
		}
		if got[string(m.Value)] {
			t.Fatalf("message %s delivered twice", m.Value)
		}
		got[string(m.Value)] = true
		if err := r.CommitMessages(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// TestKafkaProduceConsume: produce, consume in a group with commits, and a
// second reader of the same group resumes after the committed offsets.
func TestKafkaProduceConsume(t *testing.T) {
	brokers := testenv.Kafka(t)
	topic := testenv.UniqueTopic(t, "smoke")
	testenv.CreateTopic(t, brokers, topic, 3)
	testenv.CreateTopic(t, brokers, topic, 3) // an existing topic is fine
	group := testenv.UniqueTopic(t, "group")

	produce(t, brokers, topic, 0, 20)
	got := consume(t, brokers, topic, group, 20)
	for i := 0; i < 20; i++ {
		if !got[fmt.Sprintf("v%d", i)] {
			t.Errorf("v%d not consumed", i)
		}
	}

	produce(t, brokers, topic, 20, 25)
	got = consume(t, brokers, topic, group, 5)
	for v := range got {
		var i int
		if _, err := fmt.Sscanf(v, "v%d", &i); err != nil || i < 20 {
			t.Errorf("resumed reader got %s, committed before", v)
		}
	}
}

func TestUniqueTopic(t *testing.T) {
	a, b := testenv.UniqueTopic(t, "rollouts"), testenv.UniqueTopic(t, "rollouts")
	if a == b {
		t.Fatalf("two calls gave %s", a)
	}
	if !strings.HasPrefix(a, "rollouts-testuniquetopic-") {
		t.Errorf("UniqueTopic = %q", a)
	}
	t.Run("a very long subtest name / with: odd characters! "+strings.Repeat("x", 300), func(t *testing.T) {
		name := testenv.UniqueTopic(t, "p")
		if len(name) > 200 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			t.Errorf("bad topic name %q", name)
		}
	})
}
