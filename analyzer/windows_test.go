package analyzer_test

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// spyStore is a real store that records the specs of the window reads.
type spyStore struct {
	*sink.Store
	mu    sync.Mutex
	specs []sink.MultiSpec
}

func (s *spyStore) WindowCountsMulti(ctx context.Context, spec sink.MultiSpec) (map[sink.Cohort][]sink.RunCounts, error) {
	s.mu.Lock()
	s.specs = append(s.specs, spec)
	s.mu.Unlock()
	return s.Store.WindowCountsMulti(ctx, spec)
}

// TestReadWindows: a cohort with RollupMinLabels labels or more in its
// rolled-up hours is read through the rollup, a small one raw, and the
// windows are exactly the raw computation's either way.
func TestReadWindows(t *testing.T) {
	ctx := context.Background()
	st := testenv.ClickHouse(t).Store()
	base := time.Now().UTC().Truncate(time.Hour).Add(-30 * time.Hour)
	var ls []sink.LabelRow
	add := func(av string, n int, span time.Duration) {
		for i := range n {
			ok := i%3 == 0
			l := schemas.LabelPresent
			if i%4 == 1 {
				l = schemas.LabelLacking
			}
			ls = append(ls, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: fmt.Sprintf("%s-%06d", av, i), Environment: "env", AgentVersion: av,
				DictionaryVersion: 1, Capability: "cap", Label: l, Success: ok, Source: schemas.SourceRules,
				TS: base.Add(time.Duration(int64(span) * int64(i) / int64(n))).Truncate(time.Second)}})
		}
	}
	add("big", 2*analyzer.RollupMinLabels, 29*time.Hour)
	add("small", 300, 29*time.Hour)
	if err := st.InsertLabels(ctx, ls); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RollupAll(ctx, time.Now().Add(sink.RollupGrace+time.Second)); err != nil {
		t.Fatal(err)
	}
	bigC, smallC := sink.Cohort{Environment: "env", AgentVersion: "big", DictionaryVersion: 1}, sink.Cohort{Environment: "env", AgentVersion: "small", DictionaryVersion: 1}
	spy := &spyStore{Store: st}
	w, err := analyzer.ReadWindows(ctx, spy, []sink.Cohort{bigC, smallC}, analyzer.EvalConfig{Window: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	raw := map[bool][]sink.Cohort{}
	for _, s := range spy.specs {
		raw[s.Raw] = append(raw[s.Raw], s.Cohorts...)
	}
	if !reflect.DeepEqual(raw[false], []sink.Cohort{bigC}) || !reflect.DeepEqual(raw[true], []sink.Cohort{smallC}) {
		t.Errorf("through the rollup %v, raw %v; want %v and %v", raw[false], raw[true], bigC, smallC)
	}
	spec := w.Spec
	spec.Raw = true
	infos, err := st.WindowInfoMulti(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	counts, err := st.WindowCountsMulti(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if infos[bigC].Rollouts < analyzer.RollupMinLabels/2 || infos[smallC].Rollouts == 0 {
		t.Fatalf("windows of %d and %d rollouts: the data does not exercise them", infos[bigC].Rollouts, infos[smallC].Rollouts)
	}
	if !reflect.DeepEqual(w.Infos, infos) || !reflect.DeepEqual(w.Counts, counts) {
		t.Errorf("ReadWindows differs from the raw computation:\n got %+v %+v\nwant %+v %+v", w.Infos, w.Counts, infos, counts)
	}
	// A window of the last rollouts is read raw.
	spy.specs = nil
	if _, err := analyzer.ReadWindows(ctx, spy, []sink.Cohort{bigC, smallC}, analyzer.EvalConfig{Window: 24 * time.Hour, WindowRollouts: 100}); err != nil {
		t.Fatal(err)
	}
	for _, s := range spy.specs {
		if !s.Raw {
			t.Errorf("a last-rollouts window read through the rollup: %v", s.Cohorts)
		}
	}
}
