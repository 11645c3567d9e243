package dashboard

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// TestPassRateWithoutRollouts: a cohort whose labels arrived without its
// rollouts (trace labels import publishes labels only) has no pass rate:
// the overview says so ("—") instead of a pass rate of 0.0 %.
func TestPassRateWithoutRollouts(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	var labels []sink.LabelRow
	for i := range 30 {
		for _, capName := range demoDict.Names() {
			labels = append(labels, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: fmt.Sprintf("imp-%02d", i), Environment: "imported", AgentVersion: "v1",
				DictionaryVersion: 1, Capability: capName, Label: schemas.LabelLacking, Success: i%3 == 0, Source: schemas.SourceExternal, TS: now.Add(-time.Duration(i) * time.Minute)}})
		}
	}
	if err := st.InsertLabels(ctx, labels); err != nil {
		t.Fatal(err)
	}
	h := newHandler(st, now, registry())
	var o OverviewResponse
	getJSON(t, h, "/api/overview?env=imported", &o)
	if o.Cohort == nil || len(o.Cohorts) != 1 || o.Cohorts[0].Rollouts != 0 || o.Cohorts[0].LabeledRollouts != 30 {
		t.Fatalf("cohorts = %+v", o.Cohorts)
	}
	code, body := getStatus(h, "/?env=imported")
	if code != 200 {
		t.Fatalf("overview: %d", code)
	}
	stat := regexp.MustCompile(`id="stat-pass-rate">([^<]*)<`).FindStringSubmatch(body)
	cell := regexp.MustCompile(`<td class="num pass-rate">([^<]*)<`).FindStringSubmatch(body)
	if stat == nil || stat[1] != "—" || cell == nil || cell[1] != "—" {
		t.Errorf("pass rate of a cohort without stored rollouts: card %q, cohort table %q; want —", stat, cell)
	}
}

// TestIncompleteRunsReason: a cohort labeled in fewer runs than N has no
// complete rollout in its window; the decision says so, naming analyzer.n,
// not that there are no labeled rollouts (there are).
func TestIncompleteRunsReason(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	var labels []sink.LabelRow
	for i := range 30 {
		for run := range uint16(3) {
			labels = append(labels, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: fmt.Sprintf("p-%02d", i), Environment: "partial", AgentVersion: "v1",
				DictionaryVersion: 1, Capability: capMulti, Run: run, Label: schemas.LabelLacking, Source: schemas.SourceExternal, TS: now.Add(-time.Duration(i) * time.Minute)}})
		}
	}
	if err := st.InsertLabels(ctx, labels); err != nil {
		t.Fatal(err)
	}
	h := newHandler(st, now, registry())
	var o OverviewResponse
	getJSON(t, h, "/api/overview?env=partial", &o)
	if o.Decision == nil || o.Decision.Decided || !strings.Contains(o.Decision.Reason, fmt.Sprintf("all %d runs", testEval.N)) || !strings.Contains(o.Decision.Reason, "analyzer.n") {
		t.Errorf("decision of a cohort labeled in 3 of %d runs: %+v", testEval.N, o.Decision)
	}
}

// TestClockSkewWarningFromTheWatermark: labels ending 40 minutes ahead of
// the clock are warned about with their exact lead (the cohort list knows
// only their hour, which would hide a lead under an hour), on the overview
// and the capability page.
func TestClockSkewWarningFromTheWatermark(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 5, 15, 14, 0, 0, time.UTC)
	ahead := now.Add(40 * time.Minute) // 15:54: its hour, 15:00, is behind the clock
	var labels []sink.LabelRow
	for i := range 5 {
		for _, capName := range demoDict.Names() {
			labels = append(labels, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: fmt.Sprintf("fut-%02d", i), Environment: "future", AgentVersion: "v1",
				DictionaryVersion: 1, Capability: capName, Label: schemas.LabelLacking, Source: schemas.SourceRules, TS: ahead.Add(-time.Duration(i) * time.Second)}})
		}
	}
	if err := st.InsertLabels(ctx, labels); err != nil {
		t.Fatal(err)
	}
	h := newHandler(st, now, registry())
	var o OverviewResponse
	getJSON(t, h, "/api/overview?env=future", &o)
	if !strings.Contains(o.Range.Warning, "ends 40m0s after this server's clock") {
		t.Errorf("overview warning %q, want the 40 minutes", o.Range.Warning)
	}
	var c CapabilityResponse
	getJSON(t, h, "/api/capability?env=future&agent_version=v1&name="+demoDict.Names()[0], &c)
	if !strings.Contains(c.Range.Warning, "ends 40m0s after this server's clock") {
		t.Errorf("capability warning %q, want the 40 minutes", c.Range.Warning)
	}
}
