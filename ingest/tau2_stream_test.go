package ingest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// replayCountingWriter keeps the first message and counts the others,
// holding none of them.
type replayCountingWriter struct {
	mu    sync.Mutex
	n     int
	first []byte
}

func (w *replayCountingWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == 0 && len(msgs) > 0 {
		w.first = append([]byte(nil), msgs[0].Value...)
	}
	w.n += len(msgs)
	return nil
}

// heapPeak samples the bytes of heap objects (live and not yet collected)
// until stop is called, which returns the largest sample.
func heapPeak() (stop func() uint64) {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak uint64
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 { close(done); <-exited; return peak }
}

// TestReplayTau2Streams: a τ² result file is read one batch of simulations
// at a time, not whole (users have files of many GB): replaying a 64 MB
// file grows the heap by far less than the file. The file's "info" comes
// after its simulations, and the only tool call is in its last simulation:
// every rollout still gets the environment, agent and run timestamp of the
// info, and the tool in its derived tool list (the first pass reads them).
// A simulation that does not decode is rejected naming its index.
func TestReplayTau2Streams(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a 64 MB file")
	}
	const size = 64 << 20
	path := filepath.Join(t.TempDir(), "big.json")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	pad := strings.Repeat("the agent explains the fare rules once more. ", 200) // ~9 KB per message
	fmt.Fprint(w, `{"timestamp": "2025-06-01T10:00:00", "simulations": [`)
	n, bad := 0, 0
	for written := 0; written < size; n++ {
		if n > 0 {
			w.WriteString(",\n")
		}
		var sim string
		switch {
		case n == 1000:
			bad = n + 1
			sim = fmt.Sprintf(`{"id": "s%d", "task_id": "%d", "messages": "not a list"}`, n, n)
		default:
			sim = fmt.Sprintf(`{"id": "s%d", "task_id": "%d", "start_time": "2025-06-01T10:00:00", "reward_info": {"reward": 1.0},
			"messages": [{"role": "user", "content": "change my flight"}, {"role": "assistant", "content": %q}]}`, n, n, pad)
		}
		w.WriteString(sim)
		written += len(sim)
	}
	last := `{"id": "last", "task_id": "0", "reward_info": {"reward": 0.0}, "messages": [
		{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "name": "get_reservation_details", "arguments": {"reservation_id": "X1"}}]},
		{"role": "tool", "id": "c1", "content": "{}"}]}`
	fmt.Fprintf(w, ",\n%s],\n\"info\": {\"agent_info\": {\"implementation\": \"llm_agent\", \"llm\": \"gpt-x\"}, \"environment_info\": {\"domain_name\": \"airline\"}}}\n", last)
	n++
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)

	runtime.GC()
	base := heapPeak()()
	stop := heapPeak()
	cw := &replayCountingWriter{}
	sum, err := (&Replayer{Writer: cw, ChunkSize: 100}).Replay(context.Background(), []string{path})
	peak := stop()
	if err != nil {
		t.Fatal(err)
	}
	grew := int64(peak) - int64(base)
	t.Logf("%d simulations, %d MB: heap grew by %d MB at most while replaying", n, fi.Size()>>20, grew>>20)
	if sum.Sent != n-1 || cw.n != n-1 || sum.Rejected != 1 || sum.RejectedByReason[ReasonTau2Invalid] != 1 {
		t.Fatalf("sent %d (writer %d), want %d, and 1 rejected as %s:\n%s", sum.Sent, cw.n, n-1, ReasonTau2Invalid, sum)
	}
	if rj := sum.FirstRejections[0]; rj.Line != bad || !rj.Simulation || !strings.Contains(rj.String(), fmt.Sprintf("big.json simulation %d: tau2_invalid: simulation %d:", bad, bad)) {
		t.Errorf("rejection %q: want it to name simulation %d", rj.String(), bad)
	}
	var ro struct {
		Environment string `json:"environment"`
		Agent       struct{ Name, Version string }
		Tools       []struct{ Function struct{ Name string } }
		Metadata    map[string]any
	}
	if err := json.Unmarshal(cw.first, &ro); err != nil {
		t.Fatal(err)
	}
	if ro.Environment != "tau2-airline" || ro.Agent.Version != "llm_agent@gpt-x" || len(ro.Tools) != 1 ||
		ro.Tools[0].Function.Name != "get_reservation_details" || ro.Metadata["run_timestamp"] != "2025-06-01T10:00:00" {
		t.Errorf("first rollout: environment %q, agent %+v, tools %+v, metadata %v: want the info and tools of the whole file",
			ro.Environment, ro.Agent, ro.Tools, ro.Metadata)
	}
	if grew > size/2 {
		t.Errorf("replaying a %d MB τ² file grew the heap by %d MB: it must be read a batch of simulations at a time", fi.Size()>>20, grew>>20)
	}
}

// TestConvertTau2InfoAfterSimulations: the members a rollout needs from the
// whole file are read wherever they are, from a file (read twice) and from
// a reader that cannot seek (read into memory); a file with two
// "simulations" is refused rather than half read.
func TestConvertTau2InfoAfterSimulations(t *testing.T) {
	in := `{"simulations": [
		{"id": "a", "task_id": "1", "reward_info": {"reward": 1.0}, "messages": [{"role": "user", "content": "x"}]},
		{"id": "b", "task_id": "2", "reward_info": {"reward": 0.0}, "messages": [
			{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "name": "cancel_reservation", "arguments": {}}]},
			{"role": "tool", "id": "c", "content": "ok"}]}],
		"timestamp": "2025-06-01T10:00:00",
		"info": {"agent_info": {"implementation": "llm_agent", "llm": "gpt-x"}, "environment_info": {"domain_name": "airline", "policy": "be kind"}}}`
	path := replayWriteFile(t, "late-info.json", in)
	if got, err := DetectFormat(path); err != nil || got != FormatTau2 {
		t.Errorf("DetectFormat = %q, %v; want %q", got, err, FormatTau2)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for name, r := range map[string]io.Reader{"file": f, "pipe": io.MultiReader(strings.NewReader(in))} {
		ros, err := ConvertTau2(r)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(ros) != 2 {
			t.Fatalf("%s: %d rollouts, want 2", name, len(ros))
		}
		for _, ro := range ros {
			if ro.Environment != "tau2-airline" || ro.Agent.Version != "llm_agent@gpt-x" || len(ro.Tools) != 1 ||
				ro.Tools[0].Function.Name != "cancel_reservation" || ro.Messages[0].Content != "be kind" || ro.Metadata["run_timestamp"] != "2025-06-01T10:00:00" {
				t.Errorf("%s: rollout %s: environment %q, agent %+v, tools %+v, first message %+v, metadata %v",
					name, ro.RolloutID, ro.Environment, ro.Agent, ro.Tools, ro.Messages[0], ro.Metadata)
			}
		}
	}
	if _, err := ConvertTau2(strings.NewReader(`{"simulations": [], "simulations": []}`)); err == nil || !strings.Contains(err.Error(), `"simulations" appears twice`) {
		t.Errorf("two simulations members: %v", err)
	}
}
