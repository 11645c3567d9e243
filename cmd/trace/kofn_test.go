package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dashboard"
	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
)

// TestLabelsImportDecidesAsSelect: with the default configuration (the
// rules labeler, analyzer.k and analyzer.n unset), the TRACE release's 10
// labeling runs imported as external labels (`trace labels import`) are
// decided 8 of 10, as `trace select` decides over the same files: the
// evaluator fires exactly select's 6 of the 9 candidates, and `trace report`
// and the dashboard show its decision with 8 of 10. The rules labeler's
// 1 of 1 used to apply to them: all 9 were selected and fired.
func TestLabelsImportDecidesAsSelect(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end: skipped with -short")
	}
	dir := shareddata.Dir(t, "trace-release/pipeline")
	runs, cands := filepath.Join(dir, "run_*.json"), filepath.Join(dir, "candidate_capabilities.json")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	brokers := testenv.Kafka(t)
	ch := testenv.ClickHouse(t)
	natsURL := testenv.NATS(t).URL()
	// The labels consumer takes the whole import in one batch (as the
	// golden stream test does), so that no trigger fires on a part of it.
	sets, topic := appSets(t, brokers, ch.Addr, natsURL, "kofn-import", "clickhouse.database="+ch.Database, "roles=ingest,analyze,serve",
		"kafka.batch_rows=20000", "kafka.batch_timeout=2s")

	// The offline selection over the same files.
	out, err := runCLI(t, ctx, "select", "--runs", runs, "--candidates", cands, "--format", "json")
	if err != nil {
		t.Fatalf("select: %v\n%s", err, out)
	}
	var offline []schemas.SelectedCapability
	if err := json.Unmarshal([]byte(out), &offline); err != nil {
		t.Fatalf("select: %v\n%s", err, out)
	}
	var want []string
	for _, s := range offline {
		want = append(want, s.Skill)
	}
	sort.Strings(want)
	if len(want) != 6 {
		t.Fatalf("trace select selects %v, want the release's 6", want)
	}

	// The import is on the labels topic before the analyzer starts, like
	// a backlog.
	out, err = runCLI(t, ctx, "labels", "import", "--runs", runs, "--candidates", cands, "--environment", "tau2-bench",
		"--agent-version", "qwen3-30b-a3b", "--topic", topic+".labels", "--set", "clickhouse.addr="+ch.Addr, "--set", "clickhouse.database="+ch.Database,
		"--set", "nats.url="+natsURL, "--set", "kafka.brokers="+brokers[0])
	if err != nil || !strings.Contains(out, "published 14760 label events (10 runs)") {
		t.Fatalf("labels import (%v):\n%s", err, out)
	}
	a := startTestApp(t, sets)
	if an := a.a.Cfg.Analyzer; an.Labeler != "rules" || an.K != 0 || an.N != 0 {
		t.Fatalf("analyzer.labeler %q, k %d, n %d: the test needs the defaults (rules, k and n unset)", an.Labeler, an.K, an.N)
	}
	var rep []reportRow
	waitFor(t, "the evaluator's decision on the imported labels", 2*time.Minute, func() (bool, string) {
		rep = reportJSON(t, ctx, append([]string{"--env", "tau2-bench"}, a.cli...))
		n := 0
		for _, r := range rep {
			if r.Source == "evaluator" && r.Rollouts == 164 {
				n++
			}
		}
		return n == 9, fmt.Sprintf("%+v", rep)
	})
	t.Logf("report:\n%s", mustRun(t, ctx, append([]string{"report", "--env", "tau2-bench"}, a.cli...)))
	byName := map[string]schemas.SelectedCapability{}
	for _, s := range offline {
		byName[s.Skill] = s
	}
	var selected []string
	for _, r := range rep {
		if r.K != 8 || r.N != 10 {
			t.Errorf("%s: decided by %d of %d runs, want 8 of 10", r.Capability, r.K, r.N)
		}
		if r.Decision == "selected" {
			selected = append(selected, r.Capability)
			if s := byName[r.Capability]; r.RunsPassed != s.NRunsPassed || math.Abs(r.Cov-s.MeanCov) > 1e-9 || math.Abs(r.Delta-s.MeanDelta) > 1e-9 {
				t.Errorf("%s: report %+v, trace select %+v", r.Capability, r, s)
			}
		}
	}
	sort.Strings(selected)
	if !slices.Equal(selected, want) {
		t.Errorf("trace report selects %v, trace select %v", selected, want)
	}

	// Exactly select's capabilities fired, and their requests are on NATS.
	var fired []string
	for _, f := range firedTriggers(t, a.a.Store) {
		fired = append(fired, strings.Fields(f)[1])
	}
	sort.Strings(fired)
	if !slices.Equal(fired, want) {
		t.Errorf("fired %v, want %v", fired, want)
	}
	js, err := a.a.Bus.JS.Stream(ctx, bus.StreamSynthesis)
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(len(want)) {
		t.Errorf("%d synthesis requests on NATS, want %d", info.State.Msgs, len(want))
	}
	for _, s := range offline {
		msg, err := js.GetLastMsgForSubject(ctx, bus.SynthesisSubject("tau2-bench", s.Skill))
		if err != nil {
			t.Errorf("%s: no synthesis request: %v", s.Skill, err)
			continue
		}
		req, err := schemas.DecodeSynthesisRequest(msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		if got := req.Capability; got.NRunsPassed != s.NRunsPassed || got.NRunsTotal != 10 || math.Abs(got.MeanDelta-s.MeanDelta) > 1e-9 || math.Abs(got.MeanCov-s.MeanCov) > 1e-9 {
			t.Errorf("%s: request %+v, trace select %+v", s.Skill, got, s)
		}
	}

	// The dashboard shows the evaluator's decision, 8 of 10.
	var ov dashboard.OverviewResponse
	getAPI(t, "http://"+a.a.HTTPAddr()+"/api/overview?env=tau2-bench", &ov)
	if d := ov.Decision; d == nil || d.Source != "evaluator" || !d.Decided || d.K != 8 || d.N != 10 {
		t.Fatalf("overview decision %+v, want the evaluator's, decided by 8 of 10", ov.Decision)
	}
	var dash []string
	for _, c := range ov.Decision.Capabilities {
		if c.Decision == dashboard.DecisionSelected {
			dash = append(dash, c.Name)
		}
	}
	sort.Strings(dash)
	if !slices.Equal(dash, want) {
		t.Errorf("the dashboard selects %v, want %v", dash, want)
	}
	if ov.Thresholds.K != 0 || ov.Thresholds.N != 0 {
		t.Errorf("thresholds %+v: analyzer.k and analyzer.n are unset", ov.Thresholds)
	}
}
