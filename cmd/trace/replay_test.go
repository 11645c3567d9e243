package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/testenv"
)

// replayTestFile writes n valid rollouts as JSONL, ids r0…r(n-1).
func replayTestFile(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"rollout_id":"r%d","environment":"cfg-env","agent":{"name":"a","version":"1"},"task_id":"t","outcome":{"reward":1},"messages":[{"role":"user","content":"hi"}]}`+"\n", i)
	}
	f := filepath.Join(t.TempDir(), "small.jsonl")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// writeConfig writes a configuration file of yaml.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "trace.yaml")
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// readRolloutIDs reads n messages of partition 0 of topic (through d, nil
// for plain connections) and returns their rollout ids, sorted.
func readRolloutIDs(t *testing.T, brokers []string, topic string, d *kafka.Dialer, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, Dialer: d, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	var ids []string
	for range n {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read %s after %d messages: %v", topic, len(ids), err)
		}
		var v struct {
			ID string `json:"rollout_id"`
		}
		if err := json.Unmarshal(m.Value, &v); err != nil {
			t.Fatalf("message %d of %s: %v", len(ids), topic, err)
		}
		ids = append(ids, v.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestReplayTakesTheConfiguration: trace replay publishes to the brokers
// and the rollouts topic of trace's configuration (the file, TRACE_
// variables, --set; kafka.embedded_addr when no broker is configured) with
// its SASL settings, and --brokers and --topic win over it. It took none:
// no --config or --set, TRACE_KAFKA__BROKERS ignored, and every replay went
// to 127.0.0.1:9092 and trace.rollouts in plain text.
func TestReplayTakesTheConfiguration(t *testing.T) {
	ctx := context.Background()
	file := replayTestFile(t, 3)
	want := []string{"r0", "r1", "r2"}
	c := testenv.KFake(t)
	addr := c.ListenAddrs()[0]
	check := func(t *testing.T, topic string, args ...string) {
		t.Helper()
		testenv.CreateTopic(t, []string{addr}, topic, 1)
		out, err := runCLI(t, ctx, append(append([]string{"replay"}, args...), file)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if !strings.Contains(out, "sent 3 rollouts") {
			t.Errorf("summary:\n%s", out)
		}
		if got := readRolloutIDs(t, []string{addr}, topic, nil, 3); !slices.Equal(got, want) {
			t.Errorf("%s holds %v, want %v", topic, got, want)
		}
	}
	t.Run("config file", func(t *testing.T) {
		topic := testenv.UniqueTopic(t, "cfg-file")
		check(t, topic, "--config", writeConfig(t, fmt.Sprintf("kafka:\n  brokers: [%s]\n  rollouts_topic: %s\n", addr, topic)))
	})
	t.Run("environment", func(t *testing.T) {
		topic := testenv.UniqueTopic(t, "cfg-env")
		t.Setenv("TRACE_KAFKA__BROKERS", addr)
		t.Setenv("TRACE_KAFKA__ROLLOUTS_TOPIC", topic)
		check(t, topic)
	})
	t.Run("set", func(t *testing.T) {
		topic := testenv.UniqueTopic(t, "cfg-set")
		check(t, topic, "--set", "kafka.brokers="+addr, "--set", "kafka.rollouts_topic="+topic)
	})
	t.Run("embedded_addr", func(t *testing.T) {
		// The embedded broker of a trace run moved elsewhere.
		topic := testenv.UniqueTopic(t, "cfg-embedded")
		check(t, topic, "--set", "kafka.embedded_addr="+addr, "--set", "kafka.rollouts_topic="+topic)
	})
	t.Run("flags win", func(t *testing.T) {
		topic := testenv.UniqueTopic(t, "cfg-flags")
		cfg := writeConfig(t, "kafka:\n  brokers: [127.0.0.1:1]\n  rollouts_topic: not.this.one\n")
		check(t, topic, "--config", cfg, "--brokers", addr, "--topic", topic)
	})
	t.Run("sasl", func(t *testing.T) {
		c := testenv.KFake(t, kfake.EnableSASL(), kfake.Superuser("PLAIN", "replayer", "s3cret"))
		brokers := c.ListenAddrs()
		topic := testenv.UniqueTopic(t, "cfg-sasl")
		k := config.Kafka{SASL: config.SASL{Mechanism: "plain", Username: "replayer", Password: "s3cret"}}
		d, err := app.KafkaDialer(k)
		if err != nil {
			t.Fatal(err)
		}
		// Created through the SASL dialer (testenv.CreateTopic has none).
		conn, err := d.DialContext(ctx, "tcp", brokers[0])
		if err != nil {
			t.Fatal(err)
		}
		err = conn.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: 1, ReplicationFactor: 1})
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		set := []string{"--set", "kafka.brokers=" + brokers[0], "--set", "kafka.rollouts_topic=" + topic}
		if out, err := runCLI(t, ctx, append(append([]string{"replay"}, set...), file)...); err == nil {
			t.Fatalf("replay without SASL into a SASL broker succeeded:\n%s", out)
		}
		set = append(set, "--set", "kafka.sasl.mechanism=plain", "--set", "kafka.sasl.username=replayer", "--set", "kafka.sasl.password=s3cret")
		out, err := runCLI(t, ctx, append(append([]string{"replay"}, set...), file)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if got := readRolloutIDs(t, brokers, topic, d, 3); !slices.Equal(got, want) {
			t.Errorf("%s holds %v, want %v", topic, got, want)
		}
	})
}

// TestReplayBadConfigurationFailsAtStart: a bad setting fails trace replay
// before anything is read or sent, naming the field, as it fails the other
// commands.
func TestReplayBadConfigurationFailsAtStart(t *testing.T) {
	ctx := context.Background()
	file := replayTestFile(t, 1)
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"file", []string{"--config", writeConfig(t, "kafka:\n  rollouts_topic: \"\"\n")}, nil, "kafka.rollouts_topic: must not be empty"},
		{"set", []string{"--set", "kafka.sasl.mechanism=kerberos"}, nil, "kafka.sasl.mechanism"},
		{"environment", nil, map[string]string{"TRACE_KAFKA__BROKERS": "no-port"}, `kafka.brokers: "no-port" is not host:port`},
		{"unknown key", []string{"--set", "kafka.broker=127.0.0.1:9092"}, nil, "kafka.broker"},
		{"empty --brokers", []string{"--brokers", ""}, nil, "--brokers: at least one broker is needed"},
		{"empty --topic", []string{"--topic", ""}, nil, "--topic must not be empty"},
		{"bad topic name", []string{"--set", "kafka.rollouts_topic=trace rollouts"}, nil, `kafka.rollouts_topic: "trace rollouts" is not a Kafka topic name`},
		{"bad --topic", []string{"--topic", "trace rollouts"}, nil, `--topic: "trace rollouts" is not a Kafka topic name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			out, err := runCLI(t, ctx, append(append([]string{"replay"}, tc.args...), file)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %q\n%s", err, tc.want, out)
			}
			var ee *exitError
			if errors.As(err, &ee) || strings.Contains(out, "sent ") {
				t.Errorf("failed after replaying, not at start: %v\n%s", err, out)
			}
		})
	}
}

// TestReplaySendsWhatCameBeforeAFileError: a file that stops the replay (a
// syntax error in a JSON array, data after it) leaves the rollouts read
// before it sent, as trace replay --help says, those of earlier files as
// well; with the default chunk of 1000 they were queued and dropped, and
// the summary said "sent 0".
func TestReplaySendsWhatCameBeforeAFileError(t *testing.T) {
	ctx := context.Background()
	addr := testenv.KFake(t).ListenAddrs()[0]
	good := replayTestFile(t, 3) // r0, r1, r2
	el := func(id string) string {
		return `{"rollout_id":"` + id + `","environment":"cfg-env","agent":{"name":"a","version":"1"},"task_id":"t","outcome":{"reward":1},"messages":[{"role":"user","content":"hi"}]}`
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content, wantErr string
	}{
		{"trailing comma", "[\n" + el("a0") + ",\n" + el("a1") + ",\n]\n", "element 3"},
		{"data after the array", "[" + el("a0") + "," + el("a1") + "]\n{}\n", "after the array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".json")
			if err := os.WriteFile(bad, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			topic := testenv.UniqueTopic(t, "replay-stop")
			testenv.CreateTopic(t, []string{addr}, topic, 1)
			out, err := runCLI(t, ctx, "replay", "--brokers", addr, "--topic", topic, good, bad)
			var ee *exitError
			if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want exit 1 naming %q\n%s", err, tc.wantErr, out)
			}
			if !strings.Contains(out, "sent 5 rollouts") {
				t.Errorf("summary, want 5 sent:\n%s", out)
			}
			if got, want := readRolloutIDs(t, []string{addr}, topic, nil, 5), []string{"a0", "a1", "r0", "r1", "r2"}; !slices.Equal(got, want) {
				t.Errorf("%s holds %v, want %v", topic, got, want)
			}
		})
	}
}
