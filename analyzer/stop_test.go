package analyzer

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/internal/stream"
	"github.com/traceops/trace/schemas"
)

// TestLabelingSinkWritesEachAnswerAtTheStop: once the consumer is
// stopping, an LLM answer is written as soon as its rollout is done, not
// at the next FlushEvery tick (here an hour): the drain deadline that ends
// a slower call still in flight can come first, and the batch's last write
// then has a cancelled context, so an answer not written by then was paid
// for and is asked again after the restart.
func TestLabelingSinkWritesEachAnswerAtTheStop(t *testing.T) {
	st := testenv.ClickHouse(t).Store()
	conn := testenv.StoreConn(t, st)
	d := llmTestDict()
	reg := NewRegistry()
	reg.Put(d)

	srv := llmtest.New(t)
	release := make(chan struct{})
	var releaseOnce sync.Once
	open := func() { releaseOnce.Do(func() { close(release) }) }
	defer open()
	asked := make(chan struct{}, 2)
	var n atomic.Int32
	srv.Handle(func(llmtest.Request) llmtest.Reply {
		first := n.Add(1) == 1
		asked <- struct{}{}
		if first { // answered after the stop
			<-release
			return llmtest.Labels(allLabels(d, "PRESENT")...)
		}
		// still in flight at the drain deadline
		return llmtest.Slow(time.Minute, llmtest.Labels(allLabels(d, "LACKING")...))
	})
	client, _ := newTestLLMClient(t, srv, func(c *llm.Config) { c.Concurrency = 2; c.Timeout = 2 * time.Minute })
	l, err := NewLLMLabeler(client, LLMLabelerConfig{Runs: 1})
	if err != nil {
		t.Fatal(err)
	}
	s := &LabelingSink{Labeler: l, Registry: reg, Store: st, Concurrency: 2, FlushEvery: time.Hour}

	stop := make(chan struct{})
	work, drainDeadline := context.WithCancel(context.Background())
	defer drainDeadline()
	batch := []stream.Record[*schemas.Rollout]{{Value: llmTestRollout("r-1", false)}, {Value: llmTestRollout("r-2", true)}}
	done := make(chan error, 1)
	go func() { done <- s.Write(stream.WithStopping(work, stop), batch) }()
	<-asked
	<-asked // both rollouts' calls are in flight
	close(stop)
	open()

	count := func(q string) uint64 {
		t.Helper()
		var c uint64
		if err := conn.QueryRow(context.Background(), q).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	const okRuns = "SELECT count() FROM label_runs WHERE status = 'ok'"
	for deadline := time.Now().Add(30 * time.Second); count(okRuns) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the answer that came after the stop was not written while the other call was still in flight")
		}
	}
	drainDeadline()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Write returned nil for a batch whose second rollout was never labeled: it would be committed")
		}
		t.Logf("Write: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Write did not return after the drain deadline")
	}
	if got := count(okRuns); got != 1 {
		t.Errorf("%d runs recorded ok, want the answered one", got)
	}
	if got := count("SELECT count() FROM label_runs WHERE status = 'failed'"); got != 0 {
		t.Errorf("%d runs recorded failed: the call ended by the drain deadline is not a failed run", got)
	}
	if got := count("SELECT count() FROM capability_labels WHERE label = 'PRESENT'"); got != uint64(len(d.Capabilities)) {
		t.Errorf("%d labels stored for the answered rollout, want %d", got, len(d.Capabilities))
	}
	if got := count("SELECT count() FROM capability_labels WHERE label != 'PRESENT'"); got != 0 {
		t.Errorf("%d labels stored for the rollout whose call the drain deadline ended", got)
	}
}
