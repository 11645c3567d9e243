package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/traceops/trace/internal/dev/testenv"
)

// TestSimulateToKafkaCountsWhatWasDelivered: the summary of trace simulate
// --brokers counts the rollouts Kafka acknowledged. It counted the rollouts
// generated, so a dead broker printed "simulate: 3 rollouts to Kafka …"
// above the error, and a stream that failed midway claimed the rollouts of
// the batch that was refused.
func TestSimulateToKafkaCountsWhatWasDelivered(t *testing.T) {
	ctx := context.Background()
	t.Run("no broker", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close() // a port nothing listens on
		out, err := runCLI(t, ctx, "simulate", "--rollouts", "3", "--brokers", addr)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 1 {
			t.Fatalf("got %v, want exit status 1\n%s", err, out)
		}
		if !strings.Contains(out, "simulate: 0 of 3 rollouts to Kafka trace.rollouts on "+addr) {
			t.Errorf("the summary claims rollouts that were not sent:\n%s", out)
		}
	})
	t.Run("all sent", func(t *testing.T) {
		brokers := testenv.Kafka(t)
		topic := testenv.UniqueTopic(t, "sim")
		testenv.CreateTopic(t, brokers, topic, 1)
		out, err := runCLI(t, ctx, "simulate", "--rollouts", "20", "--brokers", brokers[0], "--topic", topic)
		if err != nil || !strings.Contains(out, "simulate: 20 rollouts to Kafka "+topic) {
			t.Fatalf("%v\n%s", err, out)
		}
	})
	t.Run("refused midway", func(t *testing.T) {
		c := testenv.KFake(t)
		brokers := c.ListenAddrs()
		topic := testenv.UniqueTopic(t, "sim")
		testenv.CreateTopic(t, brokers, topic, 1)
		// The first produce request is stored, every later one refused for good.
		var produces atomic.Int64
		c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
			if produces.Add(1) == 1 {
				return nil, nil, false
			}
			c.KeepControl()
			preq := req.(*kmsg.ProduceRequest)
			resp := preq.ResponseKind().(*kmsg.ProduceResponse)
			for _, rt := range preq.Topics {
				st := kmsg.NewProduceResponseTopic()
				st.Topic, st.TopicID = rt.Topic, rt.TopicID
				for _, rp := range rt.Partitions {
					sp := kmsg.NewProduceResponseTopicPartition()
					sp.Partition, sp.ErrorCode = rp.Partition, 87 // INVALID_RECORD: not retried
					st.Partitions = append(st.Partitions, sp)
				}
				resp.Topics = append(resp.Topics, st)
			}
			return resp, nil, true
		})
		out, err := runCLI(t, ctx, "simulate", "--rollouts", "1200", "--brokers", brokers[0], "--topic", topic)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 1 {
			t.Fatalf("got %v, want exit status 1\n%s", err, out)
		}
		conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, 0)
		if err != nil {
			t.Fatal(err)
		}
		stored, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil || stored == 0 || stored >= 1200 {
			t.Fatalf("topic holds %d rollouts (%v), want some but not all", stored, err)
		}
		m := regexp.MustCompile(`simulate: (\d+) of (\d+) rollouts to Kafka ` + regexp.QuoteMeta(topic)).FindStringSubmatch(out)
		if m == nil || m[1] != strconv.FormatInt(stored, 10) || atoi(m[2]) <= int(stored) {
			t.Errorf("the summary does not say %d of the rollouts generated were sent:\n%s", stored, out)
		}
	})
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// TestBadRatesAndCountsRefused: a rate that is not a number (NaN read as
// "unlimited"), and a demo of 0 rollouts (the simulator's "until
// interrupted": it published until the timeout and failed), are refused at
// once, naming the flag.
func TestBadRatesAndCountsRefused(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"simulate", "--rollouts", "3", "--rate", "NaN"}, `"NaN": want a non-negative number`},
		{[]string{"simulate", "--rollouts", "3", "--rate", "-2/s"}, `"-2/s": want a non-negative number`},
		{[]string{"demo", "--rollouts", "0"}, "--rollouts: 0, want at least 1"},
		{[]string{"demo", "--rate", "NaN"}, "--rate: NaN"},
		{[]string{"simulate", "--rollouts", "3", "--out", filepath.Join(t.TempDir(), "r.jsonl"), "--start", "1900-01-01T00:00:00Z"}, "outside 1970-01-01T00:00:00Z..2106-02-07T06:28:15Z"},
		{[]string{"simulate", "--rollouts", "3", "--out", filepath.Join(t.TempDir(), "r.jsonl"), "--start", "2106-02-07T06:28:00Z"}, "--start: the rollouts would run from"},
	} {
		if out, err := runCLI(t, ctx, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("trace %v: %v, want an error with %q\n%s", tc.args, err, tc.want, out)
		}
	}
}

// TestSimulateTakesTheConfiguration: trace simulate --kafka publishes to the
// brokers and the rollouts topic of trace's configuration (the file, TRACE_
// variables, --set), and --brokers and --topic win over it; a bad setting
// fails at start, naming it. It took no configuration: Kafka was --brokers
// and --topic alone, in plain text.
func TestSimulateTakesTheConfiguration(t *testing.T) {
	ctx := context.Background()
	addr := testenv.KFake(t).ListenAddrs()[0]
	check := func(t *testing.T, topic string, args ...string) {
		t.Helper()
		testenv.CreateTopic(t, []string{addr}, topic, 1)
		out, err := runCLI(t, ctx, append([]string{"simulate", "--rollouts", "5"}, args...)...)
		if err != nil || !strings.Contains(out, "simulate: 5 rollouts to Kafka "+topic+" on "+addr) {
			t.Fatalf("%v\n%s", err, out)
		}
		if ids := readRolloutIDs(t, []string{addr}, topic, nil, 5); len(ids) != 5 || ids[0] == "" {
			t.Errorf("%s holds %v, want 5 rollouts", topic, ids)
		}
	}
	t.Run("config file", func(t *testing.T) {
		topic := testenv.UniqueTopic(t, "sim-file")
		check(t, topic, "--kafka", "--config", writeConfig(t, fmt.Sprintf("kafka:\n  brokers: [%s]\n  rollouts_topic: %s\n", addr, topic)))
	})
	t.Run("environment", func(t *testing.T) {
		topic := testenv.UniqueTopic(t, "sim-env")
		t.Setenv("TRACE_KAFKA__EMBEDDED_ADDR", addr)
		t.Setenv("TRACE_KAFKA__ROLLOUTS_TOPIC", topic)
		check(t, topic, "--kafka")
	})
	t.Run("set", func(t *testing.T) {
		topic := testenv.UniqueTopic(t, "sim-set")
		check(t, topic, "--kafka", "--set", "kafka.brokers="+addr, "--set", "kafka.rollouts_topic="+topic)
	})
	t.Run("flags win", func(t *testing.T) {
		topic := testenv.UniqueTopic(t, "sim-flags")
		check(t, topic, "--set", "kafka.brokers=127.0.0.1:1", "--set", "kafka.rollouts_topic=not.this.one", "--brokers", addr, "--topic", topic)
	})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--kafka", "--config", writeConfig(t, "kafka:\n  rollouts_topic: \"\"\n")}, "kafka.rollouts_topic: must not be empty"},
		{[]string{"--kafka", "--set", "kafka.sasl.mechanism=plain"}, "kafka.sasl.username: required"},
		{[]string{"--kafka", "--set", "kafka.brokers=no-port"}, `kafka.brokers: "no-port" is not host:port`},
		{[]string{"--kafka", "--out", filepath.Join(t.TempDir(), "r.jsonl")}, "--out and --kafka (or --brokers) are exclusive"},
		{[]string{"--kafka", "--topic", ""}, "--topic must not be empty"},
	} {
		out, err := runCLI(t, ctx, append([]string{"simulate", "--rollouts", "3"}, tc.args...)...)
		var ee *exitError
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.As(err, &ee) {
			t.Errorf("trace simulate %v: %v, want an error at start naming %q\n%s", tc.args, err, tc.want, out)
		}
	}
}
