package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
	"github.com/traceops/trace/verify"
	"github.com/traceops/trace/verify/verifytest"
)

// TestReportOnTheTraceRelease stores the release's 10 labeling runs as
// labels and checks `trace report` decides like the authors did.
func TestReportOnTheTraceRelease(t *testing.T) {
	dir := shareddata.Dir(t, "trace-release/pipeline")
	ch := testenv.ClickHouse(t)
	st := ch.Store()
	ctx := context.Background()
	runs, err := analyzer.LoadRuns(filepath.Join(dir, "run_*.json"))
	if err != nil {
		t.Fatal(err)
	}
	scope := analyzer.ImportScope{Environment: "tau2-bench", AgentVersion: "qwen3", DictionaryVersion: 1}
	var rows []sink.LabelRow
	for _, ev := range analyzer.RunFileEvents(scope, runs) {
		rows = append(rows, sink.LabelRowFrom(&ev))
	}
	if err := st.InsertLabels(ctx, rows); err != nil {
		t.Fatal(err)
	}
	// The synthesize role made an environment for the top capability.
	envID := schemas.EnvironmentID("trig-report")
	if err := (synthesizer.SinkStore{Rows: st}).SaveEnvironment(ctx, &synthesizer.Environment{ID: envID, TriggerID: "trig-report",
		Environment: "tau2-bench", AgentVersion: "qwen3", DictionaryVersion: 1, Capability: "multi_step_transaction_completion",
		Status: synthesizer.StatusWaitingForLLM, Reason: "no generation model is configured and no template family matches the capability",
		CreatedAt: time.Now(), UpdatedAt: time.Now(), Version: 1}); err != nil {
		t.Fatal(err)
	}
	sets := []string{"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database}
	// External labels are decided 8 of 10 whatever the labeler: the
	// default's (rules, whose own labels are 1 of 1), and none's.
	for _, labeler := range [][]string{nil, {"--set", "analyzer.labeler=none"}} {
		out, err := runCLI(t, ctx, append(append([]string{"report", "--format", "json"}, sets...), labeler...)...)
		if err != nil {
			t.Fatal(err)
		}
		var rep []reportRow
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		selected := map[string]bool{}
		for _, r := range rep {
			if r.Decision == "selected" {
				selected[r.Capability] = true
			}
			if r.K != 8 || r.N != 10 {
				t.Errorf("%v: %s decided by %d of %d runs, want 8 of 10", labeler, r.Capability, r.K, r.N)
			}
			if r.Capability == "conditional_instruction_following" && (r.Decision != "rejected" || r.RunsPassed != 7 || len(r.Reasons) == 0) {
				t.Errorf("%v: conditional_instruction_following: %+v", labeler, r)
			}
			if (r.Synthesis != nil) != (r.Capability == "multi_step_transaction_completion") ||
				(r.Synthesis != nil && (r.Synthesis.ID != envID || r.Synthesis.Status != "WAITING_FOR_LLM")) {
				t.Errorf("%v: %s: synthesis %+v", labeler, r.Capability, r.Synthesis)
			}
		}
		if len(rep) != 9 || len(selected) != 6 || !selected["multi_step_transaction_completion"] || selected["information_gathering_before_action"] {
			t.Fatalf("%v: report: %d rows, selected %v", labeler, len(rep), selected)
		}
	}
	csv, err := runCLI(t, ctx, append([]string{"report", "--format", "csv", "--env", "tau2-bench"}, sets...)...)
	if err != nil || strings.Count(csv, "\n") != 10 || !strings.HasPrefix(csv, "environment,agent_version") {
		t.Fatalf("csv (%v):\n%s", err, csv)
	}
	if !strings.Contains(csv, envID+",WAITING_FOR_LLM\n") {
		t.Errorf("csv lacks the environment status:\n%s", csv)
	}
	table, err := runCLI(t, ctx, append([]string{"report"}, sets...)...)
	if err != nil || !strings.Contains(table, "environments (trace env show ID for one):") || !strings.Contains(table, envID+"  tau2-bench/qwen3 multi_step_transaction_completion  WAITING_FOR_LLM") {
		t.Fatalf("table (%v):\n%s", err, table)
	}
	// An environment with nothing stored, beside one with labels: an error
	// naming the environments that have data.
	table, err = runCLI(t, ctx, append([]string{"report", "--env", "nothing-here"}, sets...)...)
	if err == nil || !strings.Contains(err.Error(), `nothing stored for environment "nothing-here"`) || !strings.Contains(err.Error(), "with data: tau2-bench") {
		t.Fatalf("report of an unknown environment (%v): %s", err, table)
	}
}

// TestReportSaysWhy: a cohort whose rollouts are stored but not labeled is
// reported with the reason and the setting to change; a cohort whose
// labeler failed says so; a watermark in the future is reported with a
// warning, its data shown.
func TestReportSaysWhy(t *testing.T) {
	ch := testenv.ClickHouse(t)
	st := ch.Store()
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rollout := func(env, id string, end time.Time) sink.RolloutRow {
		ok := false
		return sink.RolloutRowFrom(&schemas.Rollout{RolloutID: id, Environment: env, Agent: schemas.Agent{Name: "a", Version: "v1"}, TaskID: "t",
			StartTime: end.Add(-time.Minute), EndTime: end, Outcome: schemas.Outcome{Success: &ok}}, sink.Coord{Topic: "t"})
	}
	if err := st.InsertRollouts(ctx, []sink.RolloutRow{rollout("lonely", "r1", now.Add(-time.Hour)), rollout("broken", "r2", now.Add(-time.Hour)),
		rollout("skewed", "r3", now.Add(3*time.Hour))}); err != nil {
		t.Fatal(err)
	}
	// "broken" has a dictionary whose rules run failed; "skewed" is labeled
	// three hours ahead of the clock.
	d := &analyzer.Dictionary{Environment: "broken", AgentVersion: "*", Version: 1, Source: "file",
		Capabilities: []analyzer.Capability{{Name: "some_cap", Definition: "a definition long enough to label against.", Detector: "'NA'"}}}
	if err := st.SaveDictionary(ctx, analyzer.DictionaryRow(d)); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertLabelRuns(ctx, []sink.LabelRun{{Environment: "broken", AgentVersion: "v1", DictionaryVersion: 1, RolloutID: "r2",
		Labeler: "rules", Status: "failed", Reason: "capability some_cap: no such key: x", At: now}}); err != nil {
		t.Fatal(err)
	}
	ev := schemas.LabelEvent{RolloutID: "r3", Environment: "skewed", AgentVersion: "v1", DictionaryVersion: 1, Capability: "some_cap",
		Label: "LACKING", Source: "rules", TS: now.Add(3 * time.Hour)}
	if err := st.InsertLabels(ctx, []sink.LabelRow{sink.LabelRowFrom(&ev)}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load("", []string{"clickhouse.addr=" + ch.Addr, "clickhouse.database=" + ch.Database})
	if err != nil {
		t.Fatal(err)
	}
	rows, warnings, err := buildReport(ctx, cfg, st, "", cfg.Analyzer.Window, false, now)
	if err != nil {
		t.Fatal(err)
	}
	why := map[string]string{}
	for _, r := range rows {
		if r.Decision == "no labels" {
			why[r.Environment] = strings.Join(r.Reasons, "; ")
		}
		if r.Environment == "skewed" && (r.Decision != "undecided" || !r.Watermark.Equal(now.Add(3*time.Hour)) || !strings.Contains(r.Reasons[0], "analyzer.min_failures")) {
			t.Errorf("skewed cohort: %+v", r)
		}
	}
	if w := why["lonely"]; !strings.Contains(w, "no dictionary") || !strings.Contains(w, "llm.base_url") || !strings.Contains(w, "trace dict apply FILE --backfill") {
		t.Errorf("lonely: %q", w)
	}
	if w := why["broken"]; !strings.Contains(w, "rules labeler failed on 1 labeling runs") || !strings.Contains(w, "no such key: x") || !strings.Contains(w, "trace relabel --env broken") {
		t.Errorf("broken: %q", w)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "skewed") || !strings.Contains(warnings[0], "3h0m0s in the future") {
		t.Errorf("warnings %q", warnings)
	}
	// The table prints the reasons per cohort.
	var b strings.Builder
	if err := writeReport(&b, "table", rows); err != nil {
		t.Fatal(err)
	}
	// Its counts are of the rollouts stored: without labels it has no window.
	if !regexp.MustCompile(`lonely/v1: no dictionary, as of 2026-12-01 11:00:00 UTC: \d+ rollouts, \d+ failures stored\n`).MatchString(b.String()) ||
		!strings.Contains(b.String(), "  no labels: no dictionary for lonely/v1") {
		t.Errorf("table:\n%s", b.String())
	}
	// A --env without rollouts or labels, beside ones with, is an error
	// naming them; labels alone (an import of external labels) count.
	ev2 := schemas.LabelEvent{RolloutID: "x1", Environment: "imported", AgentVersion: "v1", DictionaryVersion: 1, Capability: "some_cap",
		Label: "LACKING", Source: "external", TS: now}
	if err := st.InsertLabels(ctx, []sink.LabelRow{sink.LabelRowFrom(&ev2)}); err != nil {
		t.Fatal(err)
	}
	for env, want := range map[string]string{"lonely": "", "imported": "", "": "", "lonley": `nothing stored for environment "lonley" (no rollouts, no labels); the environments with data: broken, imported, lonely, skewed`} {
		err := knownEnvironment(ctx, st, env)
		if (err == nil) != (want == "") || (err != nil && err.Error() != want) {
			t.Errorf("knownEnvironment(%q) = %v, want %q", env, err, want)
		}
	}
}

// TestReportLoop: `trace report` shows the closed loop per capability —
// the table's last section and --loop in json and csv — with the verdicts
// and the routing share.
func TestReportLoop(t *testing.T) {
	ch := testenv.ClickHouse(t)
	st := ch.Store()
	ctx := context.Background()
	act := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	gap := verifytest.Mix{LF: 40, PF: 10, NF: 10, LP: 5, PP: 45, NP: 10}
	for _, a := range []verifytest.Adapter{
		{Name: "pv-good", Capability: "precondition_verification", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 2, PF: 28, NF: 5, LP: 2, PP: 60, NP: 3}, Simulated: true},
		{Name: "msc-new", Capability: "multi_step_completion", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 4, PF: 4, PP: 20}},
	} {
		if err := verifytest.Seed(ctx, st, a); err != nil {
			t.Fatal(err)
		}
	}
	sets := []string{"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database, "--set", "analyzer.labeler=none"}
	loopJSON := func() verify.Report {
		t.Helper()
		out, err := runCLI(t, ctx, append([]string{"report", "--loop", "--format", "json"}, sets...)...)
		if err != nil {
			t.Fatal(err)
		}
		var rep verify.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return rep
	}
	rep := loopJSON()
	verdicts := map[string]verify.Verdict{}
	for _, c := range rep.Capabilities {
		for _, a := range c.Adapters {
			verdicts[a.Adapter] = a.Verdict
		}
	}
	if verdicts["pv-good"] != verify.GapClosed || verdicts["msc-new"] != verify.NotEnoughData || len(rep.Share) != 1 || !rep.Config.Guard {
		t.Fatalf("verdicts %v, share %d, guard %v\n%+v", verdicts, len(rep.Share), rep.Config.Guard, rep.Capabilities)
	}
	// What a verdict rests on: the adapter's training environment and job,
	// the cohort and dictionary, and each side's rollouts with their dates.
	for _, c := range rep.Capabilities {
		for _, a := range c.Adapters {
			if a.Adapter != "pv-good" {
				continue
			}
			if a.EnvironmentID != "env-pv-good" || a.JobID != "job-pv-good" || a.AgentVersion != "1.4.0" || a.DictionaryVersion != 1 ||
				a.Before.NeededFailures != 50 || a.After.NeededFailures != 30 ||
				!a.Before.From.Equal(act.Add(-time.Hour)) || !a.Before.To.Equal(act.Add(-time.Hour+119*time.Second)) ||
				!a.After.From.Equal(act.Add(time.Minute)) || !a.After.To.Equal(act.Add(time.Minute+99*time.Second)) {
				t.Fatalf("pv-good's provenance: %+v", a)
			}
		}
	}
	out, err := runCLI(t, ctx, append([]string{"report", "--window", "all"}, sets...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(out)
	for _, want := range []string{"closed loop (before = the base model's rollouts", "precondition_verification on sim-airline",
		"pv-good [SIMULATED trainer]", "pv-good: gap_closed — Δ 0.700 → 0.034, below δ = 0.20", "msc-new: not_enough_data — 8 labeled failures that need the capability among the routed rollouts (of 8 failures), 20 needed",
		"routing share in sim-airline per hour", "base model",
		"    guard: not significantly worse at the guard's look 2 of 6 (the first 87 routed rollouts, 80 that need the capability; 99.2 % intervals)",
		"    guard: the guard's first look needs 40 routed rollouts that need the capability",
		"    cohort sim-airline/1.4.0, dictionary v1, trained on env-pv-good; activated 2026-11-30T12:00:00Z; " +
			"before: 120 rollouts (50 failures needing the capability) ended 2026-11-30T11:00:00Z – 2026-11-30T11:01:59Z; " +
			"after: 100 rollouts (30 failures needing the capability) ended 2026-11-30T12:01:00Z – 2026-11-30T12:02:39Z"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	out, err = runCLI(t, ctx, append([]string{"report", "--loop", "--format", "csv"}, sets...)...)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.Contains(out, ",pv-good,active,true,") || !strings.Contains(out, "gap_closed") ||
		!strings.HasSuffix(lines[0], ",agent_version,dictionary_version,environment_id,needed_failures_before,needed_failures_after,before_from,before_to,after_from,after_to,before_until,baseline_adapter") ||
		!strings.Contains(out, ",1.4.0,1,env-pv-good,50,30,2026-11-30T11:00:00Z,2026-11-30T11:01:59Z,2026-11-30T12:01:00Z,2026-11-30T12:02:39Z,2026-11-30T12:00:00Z,\n") {
		t.Fatalf("csv:\n%s", out)
	}
	// Once the router has recorded decisions, the share is theirs; while
	// the upstream has reported no usage, there are no tokens to show.
	if err := st.InsertRouteDecisions(ctx, []sink.RouteDecisionRow{
		{At: act, RequestID: "q2", DecisionID: "d1", ConversationID: "c1", Environment: "sim-airline", Endpoint: "proxy", Adapter: "pv-good", Cached: true, Outcome: "ok"},
	}); err != nil {
		t.Fatal(err)
	}
	if rep = loopJSON(); len(rep.Share) != 1 || rep.Share[0].Source != "route_decisions" || rep.Tokens == nil || len(rep.Tokens) != 0 {
		t.Fatalf("no usage reported: share %+v, tokens %+v", rep.Share, rep.Tokens)
	}
	if err := st.InsertRouteDecisions(ctx, []sink.RouteDecisionRow{
		{At: act, RequestID: "q1", DecisionID: "d1", ConversationID: "c1", Environment: "sim-airline", Endpoint: "proxy", Adapter: "pv-good", Outcome: "ok",
			Usage: true, PromptTokens: 100, CompletionTokens: 20},
		{At: act, RequestID: "q3", DecisionID: "d2", ConversationID: "c2", Environment: "sim-airline", Endpoint: "proxy", Outcome: "ok",
			Usage: true, PromptTokens: 50, CompletionTokens: 5},
	}); err != nil {
		t.Fatal(err)
	}
	if rep = loopJSON(); len(rep.Share) != 1 || rep.Share[0].Source != "route_decisions" || len(rep.Share[0].Totals) != 1 || rep.Share[0].Totals[0] != 2 ||
		rep.Share[0].Share["pv-good"][0] != 0.5 {
		t.Fatalf("decision share: %+v", rep.Share)
	}
	// The tokens of the proxied requests, per day and adapter: q2 reported none.
	day := act.UTC().Format(time.DateOnly)
	var got []string
	for _, et := range rep.Tokens {
		for _, d := range et.Days {
			got = append(got, fmt.Sprintf("%s %s %q %d %d %d %d", et.Environment, d.Day.Format(time.DateOnly), d.Adapter, d.Requests, d.WithUsage, d.PromptTokens, d.CompletionTokens))
		}
	}
	if want := []string{"sim-airline " + day + ` "" 1 1 50 5`, "sim-airline " + day + ` "pv-good" 2 1 100 20`}; !slices.Equal(got, want) {
		t.Fatalf("tokens %q, want %q", got, want)
	}
	out, err = runCLI(t, ctx, append([]string{"report", "--loop"}, sets...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "tokens in sim-airline per day") || !regexp.MustCompile(`(?m)^  `+day+` +pv-good +2 +1 +100 +20$`).MatchString(out) {
		t.Fatalf("the table lacks the tokens:\n%s", out)
	}
}

// TestReportIncompleteRuns: a cohort whose rollouts are labeled in fewer
// runs than analyzer.n (labels imported from 3 runs, or one LLM run that
// keeps failing) has no complete rollout in its window and so no
// statistics; the report lists it, undecided, naming analyzer.n, instead of
// leaving it out (the table said "no rollouts stored yet").
func TestReportIncompleteRuns(t *testing.T) {
	ch := testenv.ClickHouse(t)
	st := ch.Store()
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var rows []sink.LabelRow
	for i := range 40 {
		for run := range 3 {
			ev := schemas.LabelEvent{RolloutID: fmt.Sprintf("r%d", i), Environment: "partial", AgentVersion: "v1", DictionaryVersion: 1, Capability: "some_cap",
				Run: uint16(run), Label: "LACKING", Source: schemas.SourceExternal, TS: now.Add(-time.Duration(i) * time.Minute)}
			rows = append(rows, sink.LabelRowFrom(&ev))
		}
		// Beside it, a cohort of the rules labeler: one run, decided.
		ev := schemas.LabelEvent{RolloutID: fmt.Sprintf("r%d", i), Environment: "ruled", AgentVersion: "v1", DictionaryVersion: 1, Capability: "some_cap",
			Label: "LACKING", Success: i%2 == 0, Source: schemas.SourceRules, TS: now.Add(-time.Duration(i) * time.Minute)}
		rows = append(rows, sink.LabelRowFrom(&ev))
	}
	if err := st.InsertLabels(ctx, rows); err != nil {
		t.Fatal(err)
	}
	// The default configuration: the rules labeler's cohorts are decided
	// on one run, but these labels are external, 8 of 10.
	sets := []string{"clickhouse.addr=" + ch.Addr, "clickhouse.database=" + ch.Database}
	cfg, err := config.Load("", sets)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Analyzer.N != 0 {
		t.Fatalf("analyzer.n = %d, want it unset (each cohort's)", cfg.Analyzer.N)
	}
	for _, stored := range []bool{false, true} {
		got, _, err := buildReport(ctx, cfg, st, "", cfg.Analyzer.Window, stored, now)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Environment != "partial" || got[0].Decision != "undecided" || got[0].Capability != "" || got[0].K != 8 || got[0].N != 10 ||
			len(got[0].Reasons) != 1 || !strings.Contains(got[0].Reasons[0], "all 10 runs") || !strings.Contains(got[0].Reasons[0], "analyzer.n") {
			t.Errorf("stored %v: rows %+v", stored, got)
		}
		if len(got) == 2 && (got[1].Environment != "ruled" || got[1].Capability != "some_cap" || got[1].Decision == "undecided" || got[1].K != 1 || got[1].N != 1) {
			t.Errorf("stored %v: the rules labeler's cohort %+v, want it decided by 1 of 1", stored, got[1])
		}
	}
	var args []string
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := runCLI(t, ctx, append([]string{"report"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "no rollouts stored yet") || !strings.Contains(out, "partial/v1: no dictionary, as of 2026-12-01 12:00:00 UTC") ||
		!strings.Contains(out, "  undecided: no rollout in the window is labeled in all 10 runs") {
		t.Errorf("table:\n%s", out)
	}
}

// TestReportLoopEmpty: before any adapter, trace report --loop --format
// json has empty lists, as /api/loop does, not null.
func TestReportLoopEmpty(t *testing.T) {
	ch := testenv.ClickHouse(t)
	out, err := runCLI(t, context.Background(), "report", "--loop", "--format", "json", "--set", "clickhouse.addr="+ch.Addr, "--set", "clickhouse.database="+ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if string(raw["capabilities"]) != "[]" || string(raw["routing_share"]) != "[]" {
		t.Errorf("capabilities %s, routing_share %s; want []", raw["capabilities"], raw["routing_share"])
	}
}

// TestReportLoopAdapterExit: `trace report --loop --adapter NAME` reports
// that one adapter and exits with its verdict, for CI: 0 gap_closed, 2 not
// closed, 3 not_enough_data, 1 an adapter the closed loop does not show.
func TestReportLoopAdapterExit(t *testing.T) {
	ch := testenv.ClickHouse(t)
	st := ch.Store()
	ctx := context.Background()
	act := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	gap := verifytest.Mix{LF: 40, PF: 10, NF: 10, LP: 5, PP: 45, NP: 10}
	for _, a := range []verifytest.Adapter{
		{Name: "closed", Capability: "precondition_verification", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 2, PF: 28, NF: 5, LP: 2, PP: 60, NP: 3}},
		{Name: "same", Capability: "multi_step_completion", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: gap},
		{Name: "fresh", Capability: "argument_grounding", Environment: "sim-retail", AgentVersion: "1.5.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 4, PF: 4, PP: 20}},
	} {
		if err := verifytest.Seed(ctx, st, a); err != nil {
			t.Fatal(err)
		}
	}
	sets := []string{"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database, "--set", "analyzer.labeler=none"}
	for _, tc := range []struct {
		adapter string
		code    int // 0: no error
		verdict verify.Verdict
	}{
		{"closed", 0, verify.GapClosed},
		{"same", 2, verify.NoChange},
		{"fresh", 3, verify.NotEnoughData},
		{"nosuch", 1, ""},
	} {
		t.Run(tc.adapter, func(t *testing.T) {
			out, err := runCLI(t, ctx, append([]string{"report", "--loop", "--adapter", tc.adapter, "--format", "json"}, sets...)...)
			code := 0
			if err != nil {
				var ee *exitError
				if !errors.As(err, &ee) {
					t.Fatalf("error without an exit code: %v\n%s", err, out)
				}
				code = ee.code
			}
			if code != tc.code {
				t.Fatalf("exit %d (%v), want %d\n%s", code, err, tc.code, out)
			}
			if tc.verdict == "" {
				if !strings.Contains(err.Error(), "not in the closed loop") {
					t.Fatalf("error %v", err)
				}
				return
			}
			var rep verify.Report
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if len(rep.Capabilities) != 1 || len(rep.Capabilities[0].Adapters) != 1 {
				t.Fatalf("want the one adapter: %+v", rep.Capabilities)
			}
			if a := rep.Capabilities[0].Adapters[0]; a.Adapter != tc.adapter || a.Verdict != tc.verdict {
				t.Fatalf("%s: verdict %s (%s), want %s", a.Adapter, a.Verdict, a.Reason, tc.verdict)
			}
			for _, s := range rep.Share {
				if s.Environment != rep.Capabilities[0].Environment {
					t.Errorf("share of another environment: %s", s.Environment)
				}
			}
		})
	}
	if _, err := runCLI(t, ctx, append([]string{"report", "--adapter", "closed"}, sets...)...); err == nil || !strings.Contains(err.Error(), "--adapter needs --loop") {
		t.Fatalf("--adapter without --loop: %v", err)
	}
}

// TestReportWindow: --window reads durations as the configuration does
// ("7d" too), or all.
func TestReportWindow(t *testing.T) {
	def := 24 * time.Hour
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{"", def, false},
		{"all", time.Duration(math.MaxInt64), false},
		{"168h", 168 * time.Hour, false},
		{"7d", 168 * time.Hour, false},
		{"1d12h", 36 * time.Hour, false},
		{"0s", 0, true},
		{"-1h", 0, true},
		{"7", 0, true},
		{"week", 0, true},
	} {
		got, err := reportWindow(tc.in, def)
		if (err != nil) != tc.err || (!tc.err && got != tc.want) {
			t.Errorf("reportWindow(%q) = %v, %v; want %v (error %v)", tc.in, got, err, tc.want, tc.err)
		}
	}
	if got := loopShareWindow("7d"); got != 168*time.Hour {
		t.Errorf("loopShareWindow(7d) = %v", got)
	}
}

// TestReportWindowAllIgnoresWindowRollouts: --window all takes every
// rollout, as its help says, also with analyzer.window_rollouts set (the
// last M rollouts of the configured window); a duration keeps that limit.
func TestReportWindowAllIgnoresWindowRollouts(t *testing.T) {
	ch := testenv.ClickHouse(t)
	st := ch.Store()
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var rows []sink.LabelRow
	for i := range 30 {
		ev := schemas.LabelEvent{RolloutID: fmt.Sprintf("r%02d", i), Environment: "env", AgentVersion: "v1", DictionaryVersion: 1, Capability: "some_cap",
			Label: "LACKING", Success: i%3 == 0, Source: schemas.SourceRules, TS: now.Add(-time.Duration(i) * time.Hour)}
		rows = append(rows, sink.LabelRowFrom(&ev))
	}
	if err := st.InsertLabels(ctx, rows); err != nil {
		t.Fatal(err)
	}
	args := []string{"report", "--format", "json", "--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database,
		"--set", "analyzer.window_rollouts=10"}
	for _, tc := range []struct {
		window   string
		rollouts int
	}{{"all", 30}, {"7d", 10}, {"5h", 6}} {
		out, err := runCLI(t, ctx, append(args, "--window", tc.window)...)
		if err != nil {
			t.Fatalf("--window %s: %v\n%s", tc.window, err, out)
		}
		var got []reportRow
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("--window %s: %v\n%s", tc.window, err, out)
		}
		if len(got) != 1 || got[0].Rollouts != tc.rollouts {
			t.Errorf("--window %s: %+v, want %d rollouts in the window", tc.window, got, tc.rollouts)
		}
	}
}
