package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Kafka returns the addresses of a Kafka-protocol broker for t.
//
// By default it is a new in-process kfake cluster of one broker on
// 127.0.0.1 (a free port), closed when t ends: nothing is shared between
// tests. See KFake for where it keeps messages. kfake does not create topics on
// use; call CreateTopic.
//
// With TRACE_TEST_KAFKA=apache it returns TRACE_TEST_KAFKA_BROKERS (default
// 127.0.0.1:19092), one broker shared by every test and every run: name
// topics with UniqueTopic. An unreachable broker skips the test (fails it
// with TRACE_REQUIRE_SERVERS=1).
func Kafka(t testing.TB) []string {
	t.Helper()
	switch mode := os.Getenv(EnvKafka); mode {
	case "", "kfake":
		return KFake(t).ListenAddrs()
	case "apache":
		return apacheBrokers(t)
	default:
		t.Fatalf("%s=%q: want kfake (the default) or apache", EnvKafka, mode)
		return nil
	}
}

// KFake starts an in-process kfake cluster for t whatever TRACE_TEST_KAFKA
// says, for tests that need control over the broker (Close to simulate an
// outage, Control hooks to inject errors, a restart on the same DataDir).
//
// Defaults: one broker, and a kfake.DataDir in a fresh directory on tmpfs
// (/dev/shm, else t.TempDir()), removed when t ends. Without a DataDir kfake
// keeps every message in the Go heap at 6-10 times its size; on tmpfs the
// bytes cost their size and nothing is fsynced (a cluster starts and stops
// in ~3 ms there, ~100 ms on ext4). opts come after the defaults and
// override them: kfake.DataDir("") keeps everything in memory.
func KFake(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	all := append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.DataDir(scratchDir(t, "kfake")),
	}, opts...)
	c, err := kfake.NewCluster(all...)
	if err != nil {
		t.Fatalf("testenv: start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

var apache struct {
	once    sync.Once
	brokers []string
	err     error
}

func apacheBrokers(t testing.TB) []string {
	t.Helper()
	apache.once.Do(func() {
		list := os.Getenv(EnvKafkaBrokers)
		if strings.TrimSpace(list) == "" {
			list = DefaultApacheBrokers
		}
		for _, b := range strings.Split(list, ",") {
			if b = strings.TrimSpace(b); b != "" {
				apache.brokers = append(apache.brokers, b)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := dialAny(ctx, apache.brokers)
		if err != nil {
			apache.err = err
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Brokers(); err != nil {
			apache.err = fmt.Errorf("metadata request: %w", err)
		}
	})
	if apache.err != nil {
		Unavailable(t, "testenv: %s=apache but no Kafka broker answers at %s: %v (start one with scripts/kafka-apache.sh, or unset %s to use the in-process kfake)",
			EnvKafka, strings.Join(apache.brokers, ","), apache.err, EnvKafka)
	}
	return append([]string(nil), apache.brokers...)
}

func dialAny(ctx context.Context, brokers []string) (*kafka.Conn, error) {
	if len(brokers) == 0 {
		return nil, errors.New("no broker addresses")
	}
	var errs []error
	for _, b := range brokers {
		conn, err := kafka.DialContext(ctx, "tcp", b)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// CreateTopic creates topic with the given number of partitions (replication
// factor 1) through the cluster's controller, and waits until every
// partition has a leader. An existing topic is left as it is.
func CreateTopic(t testing.TB, brokers []string, topic string, partitions int) {
	t.Helper()
	if err := createTopic(brokers, topic, partitions); err != nil {
		t.Fatalf("testenv: create topic %q on %v: %v", topic, brokers, err)
	}
}

func createTopic(brokers []string, topic string, partitions int) error {
	if partitions < 1 {
		return fmt.Errorf("partitions = %d", partitions)
	}
	const timeout = 30 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()

	conn, err := dialAny(ctx, brokers)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)
	ctrl, err := conn.Controller()
	if err != nil {
		return fmt.Errorf("find controller: %w", err)
	}
	admin := conn
	if ctrl.Host != "" {
		c, err := kafka.DialContext(ctx, "tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
		if err != nil {
			return fmt.Errorf("dial controller %s:%d: %w", ctrl.Host, ctrl.Port, err)
		}
		defer c.Close()
		_ = c.SetDeadline(deadline)
		admin = c
	}
	if err := admin.CreateTopics(kafka.TopicConfig{
		Topic:             topic,
		NumPartitions:     partitions,
		ReplicationFactor: 1,
	}); err != nil {
		return err
	}
	// Apache Kafka creates topics asynchronously: wait for the metadata.
	var last error
	for {
		parts, err := conn.ReadPartitions(topic)
		if err == nil {
			ready := len(parts) > 0
			for _, p := range parts {
				if p.Leader.Host == "" || p.Leader.ID < 0 {
					ready = false
				}
			}
			if ready {
				return nil
			}
			err = fmt.Errorf("%d partitions, not all with a leader", len(parts))
		}
		last = err
		if time.Now().Add(100 * time.Millisecond).After(deadline) {
			return fmt.Errorf("topic not ready after %s: %w", timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// UniqueTopic returns a topic name, starting with prefix, that no other test,
// run or process uses: tests sharing one Apache broker never see each
// other's messages.
func UniqueTopic(t testing.TB, prefix string) string {
	t.Helper()
	return uniqueName(t, prefix, '-', 200)
}
