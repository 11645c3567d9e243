package ingest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
)

// replayCodecZstd is the compression codec id in a Kafka RecordBatch's attributes.
const replayCodecZstd = 4

// replayBroker is the Kafka-protocol broker of a test (internal/dev/testenv).
type replayBroker struct {
	addrs []string

	// observed is set with the in-process kfake broker, which lets the test
	// see the compression codec of every produced record batch.
	observed bool
	mu       sync.Mutex
	codecs   map[int16]int // codec of every produced record batch → count
}

func (k *replayBroker) producedCodecs() map[int16]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[int16]int, len(k.codecs))
	for c, n := range k.codecs {
		out[c] = n
	}
	return out
}

// replayStartKafka returns a broker from testenv with topic created with
// the given number of partitions. With the default in-process kfake it also
// records the codec of every produce request (an Apache broker, selected
// with TRACE_TEST_KAFKA=apache, is used as is).
func replayStartKafka(t *testing.T, topic string, partitions int) *replayBroker {
	t.Helper()
	k := &replayBroker{codecs: map[int16]int{}}
	switch os.Getenv(testenv.EnvKafka) {
	case "", "kfake":
		c := testenv.KFake(t)
		k.addrs, k.observed = c.ListenAddrs(), true
		c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
			pr, ok := req.(*kmsg.ProduceRequest)
			if !ok {
				return nil, nil, false
			}
			k.mu.Lock()
			defer k.mu.Unlock()
			for _, tp := range pr.Topics {
				for _, p := range tp.Partitions {
					// RecordBatch v2: baseOffset(8) batchLength(4) leaderEpoch(4) magic(1) crc(4) attributes(2).
					if len(p.Records) >= 23 && p.Records[16] == 2 {
						k.codecs[int16(binary.BigEndian.Uint16(p.Records[21:23]))&0x7]++
					}
				}
			}
			return nil, nil, false // observe only: the cluster handles the request
		})
	default:
		k.addrs = testenv.Kafka(t)
	}
	testenv.CreateTopic(t, k.addrs, topic, partitions)
	return k
}

// replayConsumeAll reads every message of every partition of topic with kafka-go
// Readers, up to each partition's high watermark.
func replayConsumeAll(t *testing.T, brokers []string, topic string, partitions int) map[int][]kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[int][]kafka.Message{}
	for p := range partitions {
		conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, p)
		if err != nil {
			t.Fatalf("dial leader of partition %d: %v", p, err)
		}
		last, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatalf("last offset of partition %d: %v", p, err)
		}
		if last == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers: brokers, Topic: topic, Partition: p,
			MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 100 * time.Millisecond,
		})
		for {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				t.Fatalf("read partition %d: %v (have %d of %d)", p, err, len(out[p]), last)
			}
			out[p] = append(out[p], m)
			if m.Offset >= last-1 {
				break
			}
		}
		r.Close()
	}
	return out
}

// replayTestRollout is a small valid rollout of cohort replay-test/<version>.
func replayTestRollout(id, version string, reward float64) []byte {
	ro := schemas.Rollout{
		Schema: "rollout/v1", RolloutID: id, Environment: "replay-test",
		Agent: schemas.Agent{Name: "agent", Version: version}, TaskID: "task-" + id,
		Outcome:  schemas.Outcome{Reward: reward},
		Messages: []schemas.Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "hello"}},
	}
	b, err := json.Marshal(ro)
	if err != nil {
		panic(err)
	}
	return b
}

// replayWriteJSONL writes a rollout JSONL file with 6 valid rollouts (two cohorts),
// one blank line and 3 bad lines at lines 2 (not_json), 5 (schema: no
// rollout_id) and 8 (non_finite_reward).
func replayWriteJSONL(t *testing.T, dir string) string {
	t.Helper()
	lines := []string{
		string(replayTestRollout("j1", "v1", 1)),
		`{"rollout_id": "bad-json", "environment": `,
		string(replayTestRollout("j2", "v2", 0)),
		string(replayTestRollout("j3", "v1", 0.5)),
		`{"environment": "replay-test", "agent": {"name": "a", "version": "v1"}, "task_id": "t", "outcome": {"reward": 1}, "messages": [{"role": "user", "content": "x"}]}`,
		"",
		string(replayTestRollout("j4", "v2", 1)),
		`{"rollout_id": "bad-nan", "environment": "replay-test", "agent": {"name": "a", "version": "v1"}, "task_id": "t", "outcome": {"reward": NaN}, "messages": [{"role": "user", "content": "x"}]}`,
		string(replayTestRollout("j5", "v1", 1)),
		string(replayTestRollout("j6", "v1", 0)) + "\r", // CRLF line ending
	}
	p := filepath.Join(dir, "mixed.jsonl")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReplayKafka(t *testing.T) {
	tau2Dir := shareddata.Dir(t, "tau2")
	const partitions = 4
	topic := testenv.UniqueTopic(t, "trace.rollouts")
	k := replayStartKafka(t, topic, partitions)
	jsonl := replayWriteJSONL(t, t.TempDir())
	files := []string{filepath.Join(tau2Dir, tau2AirlineFile), filepath.Join(tau2Dir, tau2RetailFile), jsonl}

	w := NewKafkaWriter(k.addrs, topic)
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum, err := Replay(ctx, w, files, FormatAuto, &progress)
	if cerr := w.Close(); cerr != nil {
		t.Errorf("close writer: %v", cerr)
	}
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, sum)
	}
	t.Logf("summary: %s", sum)

	const wantSent = 50 + 114 + 6
	if sum.Sent != wantSent || sum.Files != 3 || sum.Bytes <= 0 || sum.Rate <= 0 {
		t.Errorf("sent %d from %d files (%d bytes, %.1f/s), want %d from 3", sum.Sent, sum.Files, sum.Bytes, sum.Rate, wantSent)
	}
	wantReasons := map[string]int{schemas.ReasonNotJSON: 1, schemas.ReasonSchema: 1, schemas.ReasonNonFiniteReward: 1}
	if sum.Rejected != 3 || fmt.Sprint(sum.RejectedByReason) != fmt.Sprint(wantReasons) {
		t.Errorf("rejected %d %v, want 3 %v", sum.Rejected, sum.RejectedByReason, wantReasons)
	}
	var lines []string
	for _, r := range sum.FirstRejections {
		lines = append(lines, fmt.Sprintf("%s:%d:%s", r.File, r.Line, r.Reason))
	}
	if got, want := strings.Join(lines, " "), "mixed.jsonl:2:not_json mixed.jsonl:5:schema mixed.jsonl:8:non_finite_reward"; got != want {
		t.Errorf("first rejections %q, want %q", got, want)
	}
	if progress.Len() != 0 {
		t.Errorf("progress written to a non-terminal: %q", progress.String())
	}
	if s := sum.String(); !strings.Contains(s, "sent 170 rollouts") || !strings.Contains(s, "not_json=1") || !strings.Contains(s, "mixed.jsonl:8: non_finite_reward") {
		t.Errorf("summary text:\n%s", s)
	}

	// Everything that was sent is on the topic, exactly once, keyed by cohort.
	byPartition := replayConsumeAll(t, k.addrs, topic, partitions)
	total, perEnv, successes := 0, map[string]int{}, map[string]int{}
	ids := map[string]bool{}
	keyPartition := map[string]int{}
	var jsonlOrder []string
	for p, msgs := range byPartition {
		for _, m := range msgs {
			total++
			ro, err := schemas.DecodeRollout(m.Value, schemas.DecodeOptions{})
			if err != nil {
				t.Errorf("partition %d offset %d does not decode: %v", p, m.Offset, err)
				continue
			}
			if string(m.Key) != ro.Key() || string(m.Key) != ro.Environment+"/"+ro.Agent.Version {
				t.Errorf("rollout %s: key %q, want %q", ro.RolloutID, m.Key, ro.Key())
			}
			if q, ok := keyPartition[string(m.Key)]; ok && q != p {
				t.Errorf("key %q in partitions %d and %d", m.Key, q, p)
			}
			keyPartition[string(m.Key)] = p
			if ids[ro.RolloutID] {
				t.Errorf("rollout %s published twice", ro.RolloutID)
			}
			ids[ro.RolloutID] = true
			perEnv[ro.Environment]++
			if ro.Succeeded() {
				successes[ro.Environment]++
			}
			if ro.Environment == "replay-test" && string(m.Key) == "replay-test/v1" {
				jsonlOrder = append(jsonlOrder, ro.RolloutID)
			}
			if len(m.Headers) == 0 || m.Headers[0].Key != "source" {
				t.Errorf("rollout %s: headers %v", ro.RolloutID, m.Headers)
			}
		}
	}
	if total != wantSent {
		t.Errorf("consumed %d messages, want %d", total, wantSent)
	}
	wantEnv := map[string]int{"tau2-airline": 50, "tau2-retail": 114, "replay-test": 6}
	wantSucc := map[string]int{"tau2-airline": 23, "tau2-retail": 96, "replay-test": 3}
	if fmt.Sprint(perEnv) != fmt.Sprint(wantEnv) || fmt.Sprint(successes) != fmt.Sprint(wantSucc) {
		t.Errorf("per environment %v successes %v, want %v %v", perEnv, successes, wantEnv, wantSucc)
	}
	for _, bad := range []string{"bad-json", "bad-nan", ""} {
		if ids[bad] {
			t.Errorf("rejected rollout %q was published", bad)
		}
	}
	if strings.Join(jsonlOrder, ",") != "j1,j3,j5,j6" {
		t.Errorf("cohort replay-test/v1 order %v, want input order", jsonlOrder)
	}
	if len(keyPartition) != 4 {
		t.Errorf("keys %v, want 4 cohorts", keyPartition)
	}

	codecs := k.producedCodecs()
	if k.observed && (codecs[replayCodecZstd] == 0 || len(codecs) != 1) {
		t.Errorf("record batch codecs %v, want only zstd (%d)", codecs, replayCodecZstd)
	}
	t.Logf("consumed %d messages over %d partitions; produce batches by codec %v", total, len(byPartition), codecs)
}

// replayFakeWriter records WriteMessages calls and fails as told.
type replayFakeWriter struct {
	calls [][]kafka.Message
	fail  []error // error returned by call i (nil or missing: success)
}

func (f *replayFakeWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	i := len(f.calls)
	f.calls = append(f.calls, append([]kafka.Message(nil), msgs...))
	if i < len(f.fail) && f.fail[i] != nil {
		return f.fail[i]
	}
	return nil
}

func (f *replayFakeWriter) sent() int {
	n := 0
	for i, c := range f.calls {
		if i >= len(f.fail) || f.fail[i] == nil {
			n += len(c)
		}
	}
	return n
}

func replayWriteFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReplayWriterErrors(t *testing.T) {
	three := string(replayTestRollout("a", "v1", 1)) + "\n" + string(replayTestRollout("b", "v1", 0)) + "\n" + string(replayTestRollout("c", "v2", 1))
	in := replayWriteFile(t, "three.jsonl", three)
	cases := []struct {
		name      string
		fail      []error
		chunk     int
		wantErr   bool
		wantSent  int
		wantCalls int
	}{
		{name: "chunks of 2", chunk: 2, wantSent: 3, wantCalls: 2},
		{name: "leader not available is retried", fail: []error{kafka.LeaderNotAvailable, kafka.UnknownTopicOrPartition}, wantSent: 3, wantCalls: 3},
		{name: "permanent error", fail: []error{errors.New("boom")}, wantErr: true, wantCalls: 1},
		{name: "partial write errors count successes", fail: []error{kafka.WriteErrors{nil, kafka.RequestTimedOut, nil}}, wantErr: true, wantSent: 2, wantCalls: 1},
		{name: "non-temporary kafka error", fail: []error{kafka.TopicAuthorizationFailed}, wantErr: true, wantCalls: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fw := &replayFakeWriter{fail: tc.fail}
			r := &Replayer{Writer: fw, ChunkSize: tc.chunk}
			sum, err := r.Replay(context.Background(), []string{in})
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if sum.Sent != tc.wantSent || len(fw.calls) != tc.wantCalls {
				t.Errorf("sent %d in %d calls, want %d in %d", sum.Sent, len(fw.calls), tc.wantSent, tc.wantCalls)
			}
		})
	}
}

func TestReplayInputs(t *testing.T) {
	ok := string(replayTestRollout("ok", "v1", 1))
	big := `{"rollout_id": "big", "pad": "` + strings.Repeat("x", 300) + `"}`
	cases := []struct {
		name       string
		content    string
		format     string
		maxBytes   int
		wantErr    string
		wantSent   int
		wantReason map[string]int
	}{
		{name: "jsonl without trailing newline", content: ok + "\n\n" + ok, wantSent: 2, wantReason: map[string]int{}},
		{name: "too long line is consumed and rejected", content: ok + "\n" + big + "\n" + ok, maxBytes: 290, wantSent: 2, wantReason: map[string]int{"too_large": 1}},
		{name: "invalid utf8", content: ok + "\n" + "{\"rollout_id\": \"\xff\"}", wantSent: 1, wantReason: map[string]int{"invalid_utf8": 1}},
		{name: "empty file", content: "", wantSent: 0, wantReason: map[string]int{}},
		{name: "jsonl after a UTF-8 byte order mark, CRLF line endings", content: "\ufeff" + ok + "\r\n" + ok + "\r\n", wantSent: 2, wantReason: map[string]int{}},
		{name: "tau2 after a UTF-8 byte order mark", content: "\ufeff" + `{"info": {"environment_info": {"domain_name": "mock"}}, "simulations": [
			{"id": "s1", "task_id": "1", "reward_info": {"reward": 1.0}, "messages": [{"role": "user", "content": "x"}]}]}`,
			wantSent: 1, wantReason: map[string]int{}},
		{name: "forced tau2 after a UTF-8 byte order mark", format: FormatTau2, content: "\ufeff" + `{"info": {"environment_info": {"domain_name": "mock"}}, "simulations": [
			{"id": "s1", "task_id": "1", "reward_info": {"reward": 1.0}, "messages": [{"role": "user", "content": "x"}]}]}`,
			wantSent: 1, wantReason: map[string]int{}},
		{name: "UTF-16 is refused as a whole", content: "\xff\xfe{\x00}\x00\n\x00", wantErr: "UTF-16 or UTF-32 byte order mark"},
		{name: "forced jsonl on UTF-16", format: FormatRolloutJSONL, content: "\xfe\xff\x00{\x00}", wantErr: "UTF-16 or UTF-32 byte order mark"},
		{name: "gzip is refused naming the fix", content: "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\n\xff", wantErr: "zcat FILE | trace replay -"},
		{name: "forced jsonl on zstd", format: FormatRolloutJSONL, content: "\x28\xb5\x2f\xfd\x00\n", wantErr: "zcat FILE | trace replay -"},
		{name: "forced tau2 on gzip", format: FormatTau2, content: "\x1f\x8b\x08\x00", wantErr: "zcat FILE | trace replay -"},
		{name: "forced json on gzip", format: FormatRolloutJSON, content: "\x1f\x8b\x08\x00", wantErr: "zcat FILE | trace replay -"},
		{name: "forced tau2 on UTF-16", format: FormatTau2, content: "\xff\xfe{\x00}\x00", wantErr: "UTF-16 or UTF-32 byte order mark"},
		{name: "an end time the store cannot hold is rejected as ingest would dead-letter it",
			content:  ok + "\n" + strings.Replace(ok, `"outcome"`, `"end_time": "2110-01-01T00:00:00Z", "outcome"`, 1),
			wantSent: 1, wantReason: map[string]int{"schema": 1}},
		{name: "tau2 simulation that cannot be decoded", content: `{"info": {"environment_info": {"domain_name": "mock"}}, "simulations": [
			{"id": "s1", "task_id": "1", "reward_info": {"reward": 1.0}, "messages": [{"role": "user", "content": "x"}]},
			{"id": "s2", "task_id": "2", "messages": "not a list"},
			{"id": "s3", "task_id": "3", "messages": []}]}`,
			wantSent: 1, wantReason: map[string]int{ReasonTau2Invalid: 1, "schema": 1}},
		{name: "forced tau2 on jsonl", content: ok + "\n" + ok, format: FormatTau2, wantErr: "τ²"},
		{name: "forced jsonl on tau2", content: `{"simulations": []}`, format: FormatRolloutJSONL, wantReason: map[string]int{"schema": 1}},
		{name: "unknown format", content: ok, format: "csv", wantErr: "unknown format"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := replayWriteFile(t, "in", tc.content)
			fw := &replayFakeWriter{}
			r := &Replayer{Writer: fw, Format: tc.format, MaxBytes: tc.maxBytes}
			sum, err := r.Replay(context.Background(), []string{in})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sum.Sent != tc.wantSent || fw.sent() != tc.wantSent || fmt.Sprint(sum.RejectedByReason) != fmt.Sprint(tc.wantReason) {
				t.Errorf("sent %d (writer %d) rejected %v, want %d %v\n%s", sum.Sent, fw.sent(), sum.RejectedByReason, tc.wantSent, tc.wantReason, sum)
			}
		})
	}
	if _, err := Replay(context.Background(), &replayFakeWriter{}, []string{filepath.Join(t.TempDir(), "missing.jsonl")}, FormatAuto, nil); err == nil {
		t.Error("missing file: no error")
	}
}

// TestReplayJSON reads rollouts as exporters write them when not as JSONL:
// a JSON array (compact or indented) and indented objects one after
// another (jq). Each element is checked as the ingest stage checks a
// message, and a rejection names its line and element.
func TestReplayJSON(t *testing.T) {
	indent := func(b []byte) string {
		var out bytes.Buffer
		if err := json.Indent(&out, b, "  ", "  "); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	a, b, c := replayTestRollout("a", "v1", 1), replayTestRollout("b", "v1", 0), replayTestRollout("c", "v2", 1)
	noID := bytes.Replace(replayTestRollout("d", "v1", 1), []byte(`"rollout_id":"d",`), nil, 1)
	dup := bytes.Replace(replayTestRollout("e", "v1", 1), []byte(`"rollout_id":"e"`), []byte(`"rollout_id":"e","rollout_id":"e2"`), 1)
	type rej struct {
		reason        string
		line, element int
	}
	cases := []struct {
		name     string
		content  string
		format   string
		wantErr  string
		wantIDs  string
		wantRejs []rej
	}{
		{name: "compact array", content: "[" + string(a) + "," + string(b) + "]", wantIDs: "a,b"},
		{name: "indented array, CRLF, byte order mark", content: strings.ReplaceAll("\ufeff[\n  "+indent(a)+",\n  "+indent(b)+"\n]\n", "\n", "\r\n"), wantIDs: "a,b"},
		{name: "empty array", content: " [ ] ", wantIDs: ""},
		{name: "indented objects one after another", content: indent(a) + "\n" + indent(b) + "\n\n" + indent(c) + "\n", wantIDs: "a,b,c"},
		{name: "forced on one-line objects", format: FormatRolloutJSON, content: string(a) + "\n" + string(b) + "\n", wantIDs: "a,b"},
		{name: "invalid elements are rejected with their line and element, the others sent",
			content: "[\n  " + indent(a) + ",\n  " + indent(noID) + ",\n  " + string(dup) + ",\n  " + indent(c) + ",\n  \"text\"\n]",
			wantIDs: "a,c",
			wantRejs: []rej{{"schema", 2 + strings.Count(indent(a), "\n") + 1, 2}, {"duplicate_key", 2 + strings.Count(indent(a), "\n") + 1 + strings.Count(indent(noID), "\n") + 1, 3},
				{"schema", 2 + strings.Count(indent(a)+indent(noID)+indent(c), "\n") + 4, 5}}},
		{name: "a syntax error stops the file naming its line", content: "[\n" + string(a) + ",\n" + string(b) + ",\n{\"rollout_id\": NaN}\n]", wantIDs: "a,b", wantErr: ":4: element 3"},
		{name: "a truncated array", content: "[\n" + string(a) + ",\n" + string(b)[:40], wantIDs: "a", wantErr: ":3: element 2: unexpected EOF"},
		{name: "data after the array", content: "[" + string(a) + "]\n[" + string(b) + "]", wantIDs: "a", wantErr: "after the array"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := replayWriteFile(t, "rollouts.json", tc.content)
			fw := &replayFakeWriter{}
			r := &Replayer{Writer: fw, Format: tc.format, ChunkSize: 1}
			sum, err := r.Replay(context.Background(), []string{in})
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			var ids []string
			for _, call := range fw.calls {
				for _, m := range call {
					if bytes.ContainsAny(m.Value, "\r\n") {
						t.Errorf("sent with its indentation: %q", m.Value)
					}
					var ro struct {
						RolloutID string `json:"rollout_id"`
					}
					if err := json.Unmarshal(m.Value, &ro); err != nil {
						t.Fatal(err)
					}
					ids = append(ids, ro.RolloutID)
				}
			}
			if strings.Join(ids, ",") != tc.wantIDs || sum.Sent != len(ids) {
				t.Errorf("sent %v (summary %d), want %s", ids, sum.Sent, tc.wantIDs)
			}
			var rejs []rej
			for _, rj := range sum.FirstRejections {
				rejs = append(rejs, rej{rj.Reason, rj.Line, rj.Element})
				if want := fmt.Sprintf("rollouts.json:%d (element %d): %s: ", rj.Line, rj.Element, rj.Reason); !strings.HasPrefix(rj.String(), want) {
					t.Errorf("rejection %q, want it to start %q", rj, want)
				}
			}
			if fmt.Sprint(rejs) != fmt.Sprint(tc.wantRejs) {
				t.Errorf("rejections %v, want %v\n%s", rejs, tc.wantRejs, sum)
			}
		})
	}
}

// TestReplayProgressLines: a long replay whose progress goes to a log file
// (not a terminal) says how far it got, every ProgressEvery.
func TestReplayProgressLines(t *testing.T) {
	var lines []string
	for i := range 3 {
		lines = append(lines, string(replayTestRollout(fmt.Sprintf("p%d", i), "v1", 1)))
	}
	content := strings.Join(lines, "\n") + "\n"
	in := replayWriteFile(t, "p.jsonl", content)
	var log bytes.Buffer
	r := &Replayer{Writer: &replayFakeWriter{}, Progress: &log, ProgressEvery: time.Nanosecond, ChunkSize: 1}
	if _, err := r.Replay(context.Background(), []string{in}); err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(got) < 3 || !strings.HasPrefix(got[len(got)-1], fmt.Sprintf("replay: %d B of %d B (100%%) read, ", len(content), len(content))) {
		t.Fatalf("progress lines %q, want one per record ending at 100%%", got)
	}
	log.Reset()
	r.ProgressEvery = time.Hour
	if _, err := r.Replay(context.Background(), []string{in}); err != nil || log.Len() != 0 {
		t.Fatalf("%q, %v: want no line before the interval", log.String(), err)
	}
}

// TestReplayPipes: a pipe (a FIFO, /dev/stdin, "-") is read once: with
// the format to tell, nothing of it may be lost to the look at its start.
func TestReplayPipes(t *testing.T) {
	var lines []string
	for i := range 2000 { // more than one buffer of the format's look
		lines = append(lines, string(replayTestRollout(fmt.Sprintf("p%d", i), "v1", 1)))
	}
	jsonl := strings.Join(lines, "\n") + "\n"
	array := "[\n" + strings.Join(lines, ",\n") + "\n]\n"
	tau2 := `{"info": {"environment_info": {"domain_name": "mock"}}, "simulations": [
		{"id": "s1", "task_id": "1", "reward_info": {"reward": 1.0}, "messages": [{"role": "user", "content": "x"}]}]}`
	fifo := func(t *testing.T, content string) string {
		p := filepath.Join(t.TempDir(), "fifo")
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Skip("no FIFO here:", err)
		}
		go func() {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				return
			}
			defer f.Close()
			_, _ = io.WriteString(f, content)
		}()
		return p
	}
	cases := []struct {
		name, content, format string
		stdin                 bool
		want                  int
	}{
		{name: "FIFO, JSONL, format told", content: jsonl, want: 2000},
		{name: "FIFO, JSON array, format told", content: array, want: 2000},
		{name: "FIFO, tau2, format told", content: tau2, want: 1},
		{name: "stdin, JSONL, format told", content: jsonl, stdin: true, want: 2000},
		{name: "stdin, JSONL, format given", content: jsonl, stdin: true, format: FormatRolloutJSONL, want: 2000},
		{name: "FIFO, JSON array, format given", content: array, format: FormatRolloutJSON, want: 2000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fw := &replayFakeWriter{}
			r := &Replayer{Writer: fw, Format: tc.format}
			in := "-"
			if tc.stdin {
				r.Stdin = strings.NewReader(tc.content)
			} else {
				in = fifo(t, tc.content)
			}
			sum, err := r.Replay(context.Background(), []string{in})
			if err != nil || sum.Sent != tc.want || fw.sent() != tc.want || sum.Rejected != 0 {
				t.Fatalf("sent %d (writer %d), %v, want %d and nothing rejected\n%s", sum.Sent, fw.sent(), err, tc.want, sum)
			}
		})
	}
	r := &Replayer{Writer: &replayFakeWriter{}, Stdin: strings.NewReader(jsonl)}
	if _, err := r.Replay(context.Background(), []string{"-", "-"}); err == nil || !strings.Contains(err.Error(), "only once") {
		t.Errorf(`"-" twice: %v`, err)
	}
	r = &Replayer{Writer: &replayFakeWriter{}, Stdin: strings.NewReader(`{"rollout_id": 1}` + "\n")}
	if sum, _ := r.Replay(context.Background(), []string{"-"}); len(sum.FirstRejections) != 1 || !strings.HasPrefix(sum.FirstRejections[0].String(), "stdin:1: schema") {
		t.Errorf("rejection from standard input: %v", sum)
	}
}

func TestDetectFormat(t *testing.T) {
	ok := string(replayTestRollout("ok", "v1", 1))
	cases := map[string]struct{ content, want string }{
		"tau2 object":                  {"\n  {\"info\": {}, \"simulations\": []}\n", FormatTau2},
		"tau2 object after a BOM":      {"\ufeff{\"info\": {}, \"simulations\": []}\r\n", FormatTau2},
		"one-line jsonl":               {ok + "\n", FormatRolloutJSONL},
		"two objects with simulations": {`{"simulations": []}` + "\n" + `{"simulations": []}`, FormatRolloutJSONL},
		"nested simulations key":       {`{"metadata": {"simulations": []}}`, FormatRolloutJSONL},
		"array":                        {`[{"simulations": []}]`, FormatRolloutJSON},
		"array after a BOM":            {"\ufeff \r\n[" + ok + "]", FormatRolloutJSON},
		"indented rollout":             {"{\n  \"rollout_id\": \"x\"\n}\n", FormatRolloutJSON},
		"indented rollouts":            {"{\n  \"rollout_id\": \"x\"\n}\n{\n  \"rollout_id\": \"y\"\n}\n", FormatRolloutJSON},
		"indented tau2 object":         {"{\n  \"simulations\": []\n}\n", FormatTau2},
		"jsonl, second line indented":  {ok + "\n{\n\"a\": 1}\n", FormatRolloutJSONL},
		"broken":                       {`{"simulations": [`, FormatRolloutJSONL},
		"empty":                        {"", FormatRolloutJSONL},
	}
	for name, tc := range cases {
		got, err := DetectFormat(replayWriteFile(t, "f", tc.content))
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", name, got, err, tc.want)
		}
	}
	if dir, err := shareddata.Lookup("tau2"); err == nil {
		for _, f := range []string{tau2AirlineFile, tau2RetailFile} {
			if got, err := DetectFormat(filepath.Join(dir, f)); err != nil || got != FormatTau2 {
				t.Errorf("%s: %q, %v", f, got, err)
			}
		}
	}
}
