package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testEval is the analyzer configuration of the tests: the decision window
// covers all the demo data.
var testEval = analyzer.EvalConfig{Window: 30 * 24 * time.Hour, N: demoRuns, K: 8, MinFailures: 20}

func newHandler(st *sink.Store, now time.Time, dicts *analyzer.Registry) http.Handler {
	return New(Deps{Store: st, Dicts: dicts, Rho: 0.10, Delta: 0.20, Eval: testEval, Now: func() time.Time { return now }})
}

func registry() *analyzer.Registry {
	reg := analyzer.NewRegistry()
	reg.Put(demoDict)
	return reg
}

func getJSON(t *testing.T, h http.Handler, path string, v any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body.String())
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("GET %s: content type %q", path, ct)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, rec.Body.String())
	}
}

func getStatus(h http.Handler, path string) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestAPI(t *testing.T) {
	st := openStore(t)
	now := time.Now().UTC().Truncate(time.Second)
	d := seedDemo(t, st, now)
	h := newHandler(st, now, registry())

	t.Run("overview", func(t *testing.T) {
		var o OverviewResponse
		getJSON(t, h, "/api/overview?env=airline&agent_version=v2", &o)
		if o.Empty || o.Cohort == nil || *o.Cohort != (CohortKey{"airline", "v2", 1}) {
			t.Fatalf("cohort = %+v, empty %v", o.Cohort, o.Empty)
		}
		if o.Thresholds.Rho != 0.10 || o.Thresholds.Delta != 0.20 || o.Thresholds.K != 8 || o.Thresholds.N != 10 {
			t.Errorf("thresholds = %+v", o.Thresholds)
		}
		// Cohorts: three, rollouts counted once despite the redelivery.
		want := map[CohortKey][2]uint64{}
		for _, r := range d.rollouts {
			k := CohortKey{r.Environment, r.AgentVersion, 1}
			if r.Environment == "retail" {
				k.DictionaryVersion = 0
			}
			v := want[k]
			v[0]++
			if r.Success {
				v[1]++
			}
			want[k] = v
		}
		if len(o.Cohorts) != len(want) {
			t.Fatalf("cohorts = %+v, want %v", o.Cohorts, want)
		}
		for _, c := range o.Cohorts {
			w := want[c.CohortKey]
			if c.Rollouts != w[0] || c.Successes != w[1] || !near(c.PassRate, float64(w[1])/float64(w[0])) {
				t.Errorf("cohort %+v: rollouts %d successes %d, want %v", c.CohortKey, c.Rollouts, c.Successes, w)
			}
			if c.DictionaryVersion == 1 && (c.LabeledRollouts != w[0] || c.Runs != demoRuns || c.Capabilities != 4) {
				t.Errorf("cohort %+v: labeled %d runs %d caps %d", c.CohortKey, c.LabeledRollouts, c.Runs, c.Capabilities)
			}
		}
		// Selected is a count for every cohort, not only the one shown (no
		// evaluator here): the number its own decision table selects, 0
		// without labels.
		for _, c := range o.Cohorts {
			want := 0
			if c.DictionaryVersion > 0 {
				var oc OverviewResponse
				getJSON(t, h, fmt.Sprintf("/api/overview?env=%s&agent_version=%s&dict=%d", c.Environment, c.AgentVersion, c.DictionaryVersion), &oc)
				for _, cd := range oc.Decision.Capabilities {
					if cd.Decision == DecisionSelected {
						want++
					}
				}
				if c.CohortKey == (CohortKey{"airline", "v1", 1}) && want == 0 {
					t.Errorf("airline v1 selects nothing; the seed plants %s", capMulti)
				}
			}
			if c.Selected != want {
				t.Errorf("cohort %+v: selected = %d, want %d", c.CohortKey, c.Selected, want)
			}
		}

		// Decision: computed (no evaluator), against expectations.
		dec := o.Decision
		if dec == nil || dec.Source != "computed" || !dec.Decided || dec.Runs != demoRuns {
			t.Fatalf("decision = %+v", dec)
		}
		if want := len(d.passBuckets("airline", "v2", time.Time{}, d.hour)); want == 0 {
			t.Fatal("no v2 rollouts seeded")
		}
		nv2 := 0
		for _, r := range d.rollouts {
			if r.AgentVersion == "v2" && r.Environment == "airline" {
				nv2++
			}
		}
		if dec.Window.Rollouts != nv2 {
			t.Errorf("window rollouts = %d, want %d", dec.Window.Rollouts, nv2)
		}
		if len(dec.Capabilities) != 4 {
			t.Fatalf("capabilities = %d, want 4", len(dec.Capabilities))
		}
		since := now.Add(-testEval.Window)
		for i, c := range dec.Capabilities {
			e := d.expectCap("airline", "v2", c.Name, since, 0.10, 0.20)
			if !near(c.MeanCov, e.meanCov) || !near(c.MeanDelta, e.meanDelta) || c.RunsPassed != e.runsPassed || c.RunsTotal != e.runs {
				t.Errorf("%s: cov %v Δ %v runs %d/%d, want cov %v Δ %v runs %d/%d", c.Name, c.MeanCov, c.MeanDelta, c.RunsPassed, c.RunsTotal,
					e.meanCov, e.meanDelta, e.runsPassed, e.runs)
			}
			if c.Rank != i+1 || (i > 0 && c.MeanDelta > dec.Capabilities[i-1].MeanDelta) {
				t.Errorf("%s: rank %d out of order", c.Name, c.Rank)
			}
			if c.Definition == "" {
				t.Errorf("%s: no definition", c.Name)
			}
			wantDec := DecisionNotSelected
			if e.runsPassed >= 8 {
				wantDec = DecisionSelected
			}
			if c.Decision != wantDec {
				t.Errorf("%s: decision %s, want %s", c.Name, c.Decision, wantDec)
			}
		}
		// The planted pattern.
		top := dec.Capabilities[0]
		if top.Name != capMulti || top.Decision != DecisionSelected || top.RunsPassed != 10 || top.MeanDelta < 0.4 || top.MeanCov < 0.4 {
			t.Errorf("planted capability: %+v", top)
		}
		if len(top.Examples) != 8 || !sort.StringsAreSorted(top.Examples) {
			t.Errorf("examples = %v", top.Examples)
		}
		for _, c := range dec.Capabilities[1:] {
			if c.Decision == DecisionSelected && c.Name != capArgs {
				t.Errorf("%s selected; only the planted capability (and maybe %s) should be", c.Name, capArgs)
			}
		}

		// Pass rate per hour, every agent version of the environment.
		if len(o.PassRate) != 2 {
			t.Fatalf("pass-rate series = %d, want v1 and v2", len(o.PassRate))
		}
		for _, ps := range o.PassRate {
			exp := d.passBuckets("airline", ps.AgentVersion, o.Range.Since, d.hour)
			if len(ps.Points) != len(exp) {
				t.Errorf("%s: %d hourly points, want %d", ps.AgentVersion, len(ps.Points), len(exp))
			}
			for _, p := range ps.Points {
				w := exp[p.Bucket.Unix()]
				if p.Rollouts != w[0] || p.Successes != w[1] || !near(p.PassRate, float64(w[1])/float64(w[0])) {
					t.Errorf("%s %s: %d/%d, want %v", ps.AgentVersion, p.Bucket, p.Successes, p.Rollouts, w)
				}
			}
		}
		// Cov and Δ per capability per hour.
		if len(o.Capabilities) != 4 {
			t.Fatalf("capability series = %d", len(o.Capabilities))
		}
		for _, cs := range o.Capabilities {
			exp := d.capBuckets("airline", "v2", cs.Capability, o.Range.Since, d.hour)
			if len(cs.Points) != len(exp) {
				t.Errorf("%s: %d points, want %d", cs.Capability, len(cs.Points), len(exp))
			}
			for _, p := range cs.Points {
				w := exp[p.Bucket.Unix()]
				if !near(p.MeanCov, w[0]) || !near(p.MeanDelta, w[1]) || p.Runs != demoRuns {
					t.Errorf("%s %s: cov %v Δ %v runs %d, want %v", cs.Capability, p.Bucket, p.MeanCov, p.MeanDelta, p.Runs, w)
				}
			}
		}
	})

	t.Run("overview daily buckets", func(t *testing.T) {
		var o OverviewResponse
		getJSON(t, h, "/api/overview?env=airline&agent_version=v1&hours=336&bucket=day", &o)
		// A day starts at midnight in the server's time zone, as its buckets do.
		if l := o.Range.Since.In(d.loc); o.Range.Bucket != "day" || l.Hour() != 0 || l.Minute() != 0 {
			t.Fatalf("range = %+v", o.Range)
		}
		for _, ps := range o.PassRate {
			exp := d.passBuckets("airline", ps.AgentVersion, o.Range.Since, d.day)
			if len(ps.Points) != len(exp) {
				t.Errorf("%s: %d daily points, want %d", ps.AgentVersion, len(ps.Points), len(exp))
			}
			for _, p := range ps.Points {
				if w := exp[p.Bucket.Unix()]; p.Rollouts != w[0] || p.Successes != w[1] {
					t.Errorf("%s %s: %d/%d, want %v", ps.AgentVersion, p.Bucket, p.Successes, p.Rollouts, w)
				}
			}
		}
		for _, cs := range o.Capabilities {
			exp := d.capBuckets("airline", "v1", cs.Capability, o.Range.Since, d.day)
			if len(cs.Points) != len(exp) || len(exp) < 10 {
				t.Errorf("%s: %d daily points, want %d", cs.Capability, len(cs.Points), len(exp))
			}
			for _, p := range cs.Points {
				if w := exp[p.Bucket.Unix()]; !near(p.MeanCov, w[0]) || !near(p.MeanDelta, w[1]) {
					t.Errorf("%s %s: cov %v Δ %v, want %v", cs.Capability, p.Bucket, p.MeanCov, p.MeanDelta, w)
				}
			}
		}
	})

	t.Run("overview default cohort and trigger status", func(t *testing.T) {
		var o OverviewResponse
		getJSON(t, h, "/api/overview?env=airline&agent_version=v1&hours=720", &o)
		if o.Cohort == nil || o.Cohort.AgentVersion != "v1" || o.Range.Hours != 720 {
			t.Fatalf("cohort %+v range %+v", o.Cohort, o.Range)
		}
		var found bool
		for _, c := range o.Decision.Capabilities {
			if c.Name == capMulti {
				found = true
				if c.Trigger == nil || c.Trigger.Event != "fired" || c.Trigger.Epoch != 2 {
					t.Errorf("trigger status = %+v, want fired epoch 2", c.Trigger)
				}
			}
		}
		if !found {
			t.Error("no", capMulti)
		}
		// No parameters: the most recently active labeled cohort.
		var def OverviewResponse
		getJSON(t, h, "/api/overview", &def)
		if def.Cohort == nil || def.Cohort.Environment != "airline" || def.Cohort.DictionaryVersion != 1 {
			t.Errorf("default cohort = %+v", def.Cohort)
		}
		// An unlabeled cohort: pass rate only.
		var un OverviewResponse
		getJSON(t, h, "/api/overview?env=retail", &un)
		if un.Cohort == nil || un.Cohort.DictionaryVersion != 0 || un.Decision != nil || len(un.PassRate) != 1 || un.Message == "" {
			t.Errorf("unlabeled cohort: %+v", un)
		}
		// A filter that matches nothing.
		var none OverviewResponse
		getJSON(t, h, "/api/overview?env=nowhere", &none)
		if !none.Empty || none.Cohort != nil || !strings.Contains(none.Message, "No rollouts yet") {
			t.Errorf("unknown env: %+v", none)
		}
	})

	t.Run("capability", func(t *testing.T) {
		var c CapabilityResponse
		getJSON(t, h, "/api/capability?env=airline&agent_version=v2&dict=1&name="+capMulti+"&examples=4", &c)
		if !c.InDictionary || c.Capability.Definition != demoDict.Capabilities[0].Definition {
			t.Errorf("capability = %+v", c.Capability)
		}
		if c.Stats == nil || c.Stats.Decision != DecisionSelected || c.Stats.RunsPassed != 10 {
			t.Fatalf("stats = %+v", c.Stats)
		}
		exp := d.counts("airline", "v2", capMulti, now.Add(-testEval.Window))
		if len(c.PerRun) != demoRuns {
			t.Fatalf("per run = %d rows", len(c.PerRun))
		}
		for _, r := range c.PerRun {
			w := exp[uint16(r.Run)]
			if r.LackingFailed != w.lf || r.PresentFailed != w.pf || r.NAFailed != w.nf || r.LackingPassed != w.lp || r.PresentPassed != w.pp || r.NAPassed != w.np {
				t.Errorf("run %d: %+v, want %+v", r.Run, r, w)
			}
			cov, dl := w.stats()
			if !near(r.Cov, cov) || !near(r.Delta, dl) || r.Passed != (cov >= 0.1 && dl >= 0.2) {
				t.Errorf("run %d: cov %v Δ %v, want %v %v", r.Run, r.Cov, r.Delta, cov, dl)
			}
		}
		// Examples: most often LACKING first, with their conversation.
		lack := d.lackingExamples("airline", "v2", capMulti)
		ids := sortedKeys(lack, func(a, b string) bool {
			if lack[a] != lack[b] {
				return lack[a] > lack[b]
			}
			return a < b
		})
		if len(c.Examples) != 4 {
			t.Fatalf("examples = %d", len(c.Examples))
		}
		for i, e := range c.Examples {
			if e.RolloutID != ids[i] || int(e.LackingRuns) != lack[ids[i]] || e.Runs != demoRuns {
				t.Errorf("example %d = %s (%d/%d), want %s (%d)", i, e.RolloutID, e.LackingRuns, e.Runs, ids[i], lack[ids[i]])
			}
			if !e.Found || e.Success || len(e.Messages) < 5 || len(e.Grader) == 0 {
				t.Errorf("example %s: found %v success %v messages %d grader %s", e.RolloutID, e.Found, e.Success, len(e.Messages), e.Grader)
			}
			var sawCall, sawErr bool
			for _, m := range e.Messages {
				sawCall = sawCall || len(m.ToolCalls) > 0
				sawErr = sawErr || m.Error
			}
			if !sawCall || !sawErr {
				t.Errorf("example %s: conversation lacks tool calls or the tool error", e.RolloutID)
			}
		}
		if len(c.Series) == 0 {
			t.Error("no hourly series")
		}
		// The dictionary also comes from ClickHouse when the registry lacks it.
		h2 := New(Deps{Store: st, Eval: testEval, Now: func() time.Time { return now }})
		var c2 CapabilityResponse
		getJSON(t, h2, "/api/capability?env=airline&agent_version=v2&name="+capPolicy, &c2)
		if !c2.InDictionary || c2.Cohort.DictionaryVersion != 1 || c2.Stats == nil {
			t.Errorf("capability without registry: %+v", c2)
		}
		// Redelivered labels: run 3 reflects the relabel.
		exp2 := d.counts("airline", "v2", capPolicy, now.Add(-testEval.Window))[3]
		for _, r := range c2.PerRun {
			if r.Run == 3 && (r.LackingFailed != exp2.lf || r.LackingPassed != exp2.lp || r.PresentFailed != exp2.pf) {
				t.Errorf("relabeled run 3: %+v, want %+v", r, exp2)
			}
		}
		// Unknown capability: 200 with a message.
		var c3 CapabilityResponse
		getJSON(t, h, "/api/capability?env=airline&agent_version=v2&dict=1&name=no_such_thing", &c3)
		if c3.InDictionary || c3.Stats != nil || c3.Message == "" {
			t.Errorf("unknown capability: %+v", c3)
		}
		// Trigger events of the capability.
		var c4 CapabilityResponse
		getJSON(t, h, "/api/capability?env=airline&agent_version=v1&dict=1&name="+capMulti, &c4)
		if len(c4.Triggers) != 4 {
			t.Errorf("v1 %s triggers = %d, want 4", capMulti, len(c4.Triggers))
		}
	})

	t.Run("triggers", func(t *testing.T) {
		var tr TriggersResponse
		getJSON(t, h, "/api/triggers", &tr)
		if len(tr.Events) != len(d.triggers) {
			t.Fatalf("events = %d, want %d", len(tr.Events), len(d.triggers))
		}
		for i := 1; i < len(tr.Events); i++ {
			if tr.Events[i].At.Before(tr.Events[i-1].At) {
				t.Errorf("events out of time order at %d", i)
			}
		}
		wantOrder := []string{"fired", "fired", "deselected", "rearmed", "fired"}
		for i, e := range tr.Events {
			if e.Event != wantOrder[i] {
				t.Errorf("event %d = %s, want %s", i, e.Event, wantOrder[i])
			}
		}
		if tr.Counts["fired"] != 3 || tr.Counts["deselected"] != 1 || tr.Counts["rearmed"] != 1 {
			t.Errorf("counts = %v", tr.Counts)
		}
		last := tr.Events[len(tr.Events)-1]
		var req schemas.SynthesisRequest
		if err := json.Unmarshal(last.Payload, &req); err != nil || req.Capability.Skill != capMulti || req.Rank != 1 || len(req.ExampleFailedRolloutIDs) != 2 {
			t.Errorf("payload = %s (%v)", last.Payload, err)
		}
		if p := string(tr.Events[2].Payload); p != "" && p != "null" {
			t.Errorf("deselected event payload = %s, want null", tr.Events[2].Payload)
		}
		if last.Window.Rollouts != 120 || last.Window.Failures != 70 || last.RunsPassed != 10 {
			t.Errorf("last event = %+v", last)
		}
		var f TriggersResponse
		getJSON(t, h, "/api/triggers?capability="+capArgs, &f)
		if len(f.Events) != 1 || f.Events[0].Capability != capArgs {
			t.Errorf("filtered = %+v", f.Events)
		}
		var lim TriggersResponse
		getJSON(t, h, "/api/triggers?limit=2", &lim)
		if len(lim.Events) != 2 || !lim.Truncated {
			t.Errorf("limit: %d events, truncated %v", len(lim.Events), lim.Truncated)
		}
		var recent TriggersResponse
		getJSON(t, h, "/api/triggers?days=1", &recent)
		if len(recent.Events) != 1 {
			t.Errorf("last day: %d events, want 1", len(recent.Events))
		}
	})

	t.Run("trends", func(t *testing.T) {
		var tr TrendsResponse
		getJSON(t, h, "/api/trends?weeks=5", &tr)
		if tr.Empty || tr.Environment != "airline" || len(tr.Weeks) != 5 || strings.Join(tr.AgentVersions, ",") != "v1,v2" {
			t.Fatalf("trends: env %q weeks %v versions %v empty %v", tr.Environment, tr.Weeks, tr.AgentVersions, tr.Empty)
		}
		// "This week" is the week of the newest data, not of the clock: on
		// a Monday shortly after midnight the newest rollout (at least
		// 14 minutes old) still ended on Sunday, in last week.
		if got, want := tr.ThisWeek.Format("2006-01-02"), d.monday(d.newest("airline")); got != want {
			t.Errorf("this week = %s, want %s (the week of the newest rollout)", got, want)
		}
		if strings.Join(tr.Environments, ",") != "airline,retail" {
			t.Errorf("environments = %v", tr.Environments)
		}
		for _, av := range []string{"v1", "v2"} {
			exp := d.passWeekly("airline", av)
			n := 0
			for _, w := range tr.PassRate {
				if w.AgentVersion != av {
					continue
				}
				n++
				e := exp[w.Week.Format("2006-01-02")]
				if w.Rollouts != e[0] || w.Successes != e[1] {
					t.Errorf("%s week %s: %d/%d, want %v", av, w.Week.Format("2006-01-02"), w.Successes, w.Rollouts, e)
				}
			}
			// Weeks older than the 5 shown are cut.
			if n == 0 || n > 5 || n > len(exp) {
				t.Errorf("%s: %d weeks of pass rate, %d expected in total", av, n, len(exp))
			}
		}
		for _, l := range tr.Lacking {
			wk := l.Week.Format("2006-01-02")
			// A week (the first of a version, cut by the window) may have
			// no failure labeled LACKING: its top is empty.
			if want := min(d.lackingCaps("airline", l.AgentVersion, wk), 5); len(l.Top) != want {
				t.Errorf("%s %s: top = %d, want %d", l.AgentVersion, wk, len(l.Top), want)
				continue
			}
			for i, c := range l.Top {
				cov, runs := d.weekCov("airline", l.AgentVersion, c.Capability, wk)
				if !near(c.MeanCov, cov) || runs != demoRuns {
					t.Errorf("%s %s %s: cov %v, want %v (%d runs)", l.AgentVersion, wk, c.Capability, c.MeanCov, cov, runs)
				}
				if i > 0 && c.MeanCov > l.Top[i-1].MeanCov {
					t.Errorf("%s %s: top not sorted by Cov", l.AgentVersion, wk)
				}
			}
		}
		// This week vs last week, for v1 (it has both weeks).
		last := tr.ThisWeek.AddDate(0, 0, -7).Format("2006-01-02")
		this := tr.ThisWeek.Format("2006-01-02")
		var n int
		for _, w := range tr.WeekOverWeek {
			if w.AgentVersion != "v1" {
				continue
			}
			n++
			ct, rt := d.weekCov("airline", "v1", w.Capability, this)
			cl, rl := d.weekCov("airline", "v1", w.Capability, last)
			if !near(w.CovThisWeek, ct) || !near(w.CovLastWeek, cl) || int(w.RunsThisWeek) != rt || int(w.RunsLastWeek) != rl {
				t.Errorf("v1 %s: this %v (%d runs) last %v (%d runs), want %v (%d) %v (%d)", w.Capability, w.CovThisWeek, w.RunsThisWeek, w.CovLastWeek, w.RunsLastWeek, ct, rt, cl, rl)
			}
		}
		if n != 4 {
			t.Errorf("v1 week over week: %d capabilities, want 4", n)
		}
		var empty TrendsResponse
		getJSON(t, h, "/api/trends?env=nowhere", &empty)
		if !empty.Empty || empty.Message == "" {
			t.Errorf("unknown env: %+v", empty)
		}
	})

	t.Run("bad parameters", func(t *testing.T) {
		for _, p := range []string{"/api/overview?hours=0", "/api/overview?dict=x", "/api/overview?bucket=week", "/api/capability?env=airline", "/api/trends?weeks=1",
			"/api/triggers?limit=-3", "/api/trends?at=yesterday", "/api/overview?fresh=maybe",
			// Out of ClickHouse's DateTime range: milliseconds (as JavaScript's
			// Date.now() gives them) wrapped around to another year, a time
			// before 1970 gave weeks in 2149.
			"/api/trends?at=1764900000000", "/api/trends?at=-5", "/api/trends?at=2200-01-01T00:00:00Z",
			// weeks before 1970 (its Date wraps around to 2149 too); a dict
			// of "v" alone (it meant the newest).
			"/api/trends?at=0", "/api/trends?at=1970-02-01T00:00:00Z&weeks=8", "/api/overview?dict=v",
			// a week ending after 2106-02-07 (the end of its DateTime): the
			// end of this week wrapped around to 1970, and every weekly
			// statement read nothing.
			"/api/trends?at=2106-02-03T00:00:00Z", "/api/trends?at=4294967295"} {
			code, body := getStatus(h, p)
			if code != http.StatusBadRequest || !strings.Contains(body, `"error"`) {
				t.Errorf("GET %s: %d %s", p, code, body)
			}
		}
		// hours takes "all" too: the error says so.
		if _, body := getStatus(h, "/api/loop?hours=0"); !strings.Contains(body, "parameter hours") || !strings.Contains(body, "or all") {
			t.Errorf("hours=0: %s", body)
		}
		if code, _ := getStatus(h, "/capability?env=airline"); code != http.StatusBadRequest {
			t.Errorf("page with bad parameters: %d", code)
		}
		if code, _ := getStatus(h, "/nope"); code != http.StatusNotFound {
			t.Errorf("unknown page: %d", code)
		}
	})

	t.Run("pages", func(t *testing.T) {
		pages := map[string][]string{
			"/?env=airline&agent_version=v2":                                   {`id="chart-pass-rate"`, `id="chart-cov"`, `id="chart-delta"`, `data-threshold="rho"`, `data-threshold="delta"`, `class="cap-row"`, capMulti},
			"/capability?env=airline&agent_version=v2&dict=1&name=" + capMulti: {`id="per-run"`, `class="conversation"`, "update_reservation_flights", "payment method credit_card_7 not found"},
			"/triggers":      {`id="chart-triggers"`, `class="event-row"`, "synthesis request"},
			"/trends":        {`id="chart-weekly-pass"`, `id="weekly"`, `class="wow"`},
			"/?token=s3cr3t": {`href="/triggers?token=s3cr3t"`, `/assets/style.css?token=s3cr3t`},
		}
		for p, wants := range pages {
			code, body := getStatus(h, p)
			if code != http.StatusOK {
				t.Errorf("GET %s: %d", p, code)
				continue
			}
			for _, w := range wants {
				if !strings.Contains(body, w) {
					t.Errorf("GET %s: no %q", p, w)
				}
			}
		}
		code, css := getStatus(h, "/assets/style.css")
		if code != http.StatusOK || !strings.Contains(css, "svg.chart") {
			t.Errorf("style.css: %d", code)
		}
	})

	t.Run("documented queries run", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, q := range sink.DashboardQueries {
			sql, err := q.Example()
			if err != nil {
				t.Fatalf("%s: %v", q.Name, err)
			}
			rows, err := testenv.StoreConn(t, st).Query(ctx, sql)
			if err != nil {
				t.Errorf("%s: %v", q.Name, err)
				continue
			}
			n := 0
			for rows.Next() {
				n++
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				t.Errorf("%s: %v", q.Name, err)
			}
			if n == 0 {
				t.Errorf("%s: example returned no rows on the demo data", q.Name)
			}
		}
	})
}

type nopPublisher struct{ n int }

func (p *nopPublisher) PublishSynthesis(context.Context, *schemas.SynthesisRequest) (analyzer.PublishResult, error) {
	p.n++
	return analyzer.PublishResult{}, nil
}

// TestStoredEvaluation: a dashboard in another process than the evaluator
// shows the evaluator's stored evaluation, which agrees with
// its own computation on the same data and is really read from storage:
// after a new labeled rollout, the stored decision still shows the window
// the evaluator saw, and fresh=1 the new one.
func TestStoredEvaluation(t *testing.T) {
	st := openStore(t)
	now := time.Now().UTC().Truncate(time.Second)
	seedDemo(t, st, now)
	reg := registry()
	ev := analyzer.NewEvaluator(testEval, st, &nopPublisher{}, reg, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := sink.Cohort{Environment: "airline", AgentVersion: "v2", DictionaryVersion: 1}
	if err := ev.Evaluate(ctx, c); err != nil {
		t.Fatal(err)
	}
	h := newHandler(st, now, reg)
	var stored, fresh OverviewResponse
	getJSON(t, h, "/api/overview?env=airline&agent_version=v2", &stored)
	getJSON(t, h, "/api/overview?env=airline&agent_version=v2&fresh=1", &fresh)
	if stored.Decision.Source != "evaluator" || stored.Decision.EvaluatedAt.IsZero() || fresh.Decision.Source != "computed" {
		t.Fatalf("sources: %s (evaluated at %v), %s", stored.Decision.Source, stored.Decision.EvaluatedAt, fresh.Decision.Source)
	}
	if stored.Decision.Window != fresh.Decision.Window || stored.Decision.Decided != fresh.Decision.Decided || stored.Decision.Runs != fresh.Decision.Runs {
		t.Fatalf("stored %+v\ncomputed %+v", stored.Decision, fresh.Decision)
	}
	if len(stored.Decision.Capabilities) != len(fresh.Decision.Capabilities) || len(stored.Decision.Capabilities) == 0 {
		t.Fatalf("%d vs %d capabilities", len(stored.Decision.Capabilities), len(fresh.Decision.Capabilities))
	}
	for i, a := range stored.Decision.Capabilities {
		b := fresh.Decision.Capabilities[i]
		if a.Name != b.Name || a.RunsPassed != b.RunsPassed || !near(a.MeanCov, b.MeanCov) || !near(a.MeanDelta, b.MeanDelta) || a.Decision != b.Decision {
			t.Errorf("stored %+v\ncomputed %+v", a, b)
		}
	}
	// The capability page: the stored per-run counts are the computed ones.
	var capStored, capFresh CapabilityResponse
	path := "/api/capability?env=airline&agent_version=v2&dict=1&name=" + capMulti
	getJSON(t, h, path, &capStored)
	getJSON(t, h, path+"&fresh=1", &capFresh)
	if capStored.Source != "evaluator" || capFresh.Source != "computed" || len(capStored.PerRun) == 0 {
		t.Fatalf("capability page: sources %s, %s; %d runs", capStored.Source, capFresh.Source, len(capStored.PerRun))
	}
	if !reflect.DeepEqual(capStored.PerRun, capFresh.PerRun) || capStored.Window != capFresh.Window {
		t.Errorf("capability page per run: stored %+v\ncomputed %+v", capStored.PerRun, capFresh.PerRun)
	}
	// One more labeled rollout in the window: only a fresh computation sees it.
	var rows []sink.LabelRow
	for run := range uint16(fresh.Decision.Runs) {
		rows = append(rows, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: "airline:v2:late", Environment: "airline", AgentVersion: "v2",
			DictionaryVersion: 1, Capability: capMulti, Run: run, Label: schemas.LabelLacking, Source: schemas.SourceExternal,
			TS: fresh.Decision.Window.End.Add(-time.Minute)}})
	}
	if err := st.InsertLabels(ctx, rows); err != nil {
		t.Fatal(err)
	}
	var stored2, fresh2 OverviewResponse
	getJSON(t, h, "/api/overview?env=airline&agent_version=v2", &stored2)
	getJSON(t, h, "/api/overview?env=airline&agent_version=v2&fresh=1", &fresh2)
	if stored2.Decision.Window != stored.Decision.Window {
		t.Errorf("the stored decision changed without an evaluation: %+v, was %+v", stored2.Decision.Window, stored.Decision.Window)
	}
	if fresh2.Decision.Window.Rollouts != fresh.Decision.Window.Rollouts+1 {
		t.Errorf("fresh window: %d rollouts, want %d", fresh2.Decision.Window.Rollouts, fresh.Decision.Window.Rollouts+1)
	}
	// The next evaluation is what the page shows.
	if err := ev.Evaluate(ctx, c); err != nil {
		t.Fatal(err)
	}
	var stored3 OverviewResponse
	getJSON(t, h, "/api/overview?env=airline&agent_version=v2", &stored3)
	if stored3.Decision.Window != fresh2.Decision.Window || !stored3.Decision.EvaluatedAt.After(stored.Decision.EvaluatedAt) {
		t.Errorf("after a new evaluation: %+v at %v, want %+v", stored3.Decision.Window, stored3.Decision.EvaluatedAt, fresh2.Decision.Window)
	}
}

// TestEvaluatorSnapshot: after an evaluation the overview shows the
// evaluator's decision, which agrees with the dashboard's own computation, and its
// trigger events (with the published request) appear on the timeline.
func TestEvaluatorSnapshot(t *testing.T) {
	st := openStore(t)
	now := time.Now().UTC().Truncate(time.Second)
	seedDemo(t, st, now)
	reg := registry()
	pub := &nopPublisher{}
	ev := analyzer.NewEvaluator(testEval, st, pub, reg, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ev.Evaluate(ctx, sink.Cohort{Environment: "airline", AgentVersion: "v2", DictionaryVersion: 1}); err != nil {
		t.Fatal(err)
	}
	if pub.n == 0 {
		t.Fatal("the evaluator published nothing")
	}
	h := newHandler(st, now, reg)
	var snap, fresh OverviewResponse
	getJSON(t, h, "/api/overview?env=airline&agent_version=v2", &snap)
	getJSON(t, h, "/api/overview?env=airline&agent_version=v2&fresh=1", &fresh)
	if snap.Decision.Source != "evaluator" || fresh.Decision.Source != "computed" {
		t.Fatalf("sources: %s, %s", snap.Decision.Source, fresh.Decision.Source)
	}
	if len(snap.Decision.Capabilities) != len(fresh.Decision.Capabilities) {
		t.Fatalf("%d vs %d capabilities", len(snap.Decision.Capabilities), len(fresh.Decision.Capabilities))
	}
	for i, a := range snap.Decision.Capabilities {
		b := fresh.Decision.Capabilities[i]
		if a.Name != b.Name || a.RunsPassed != b.RunsPassed || !near(a.MeanCov, b.MeanCov) || !near(a.MeanDelta, b.MeanDelta) || a.Decision != b.Decision {
			t.Errorf("evaluator %+v\ncomputed %+v", a, b)
		}
	}
	for _, c := range snap.Decision.Capabilities {
		if c.Name == capMulti && (c.Trigger == nil || c.Trigger.Event != "fired") {
			t.Errorf("%s trigger = %+v", capMulti, c.Trigger)
		}
	}
	for _, c := range snap.Cohorts {
		if c.CohortKey == (CohortKey{"airline", "v2", 1}) && c.Selected < 1 {
			t.Errorf("cohort summary selected = %d", c.Selected)
		}
	}
	var tr TriggersResponse
	getJSON(t, h, "/api/triggers?agent_version=v2", &tr)
	if len(tr.Events) != pub.n {
		t.Fatalf("v2 events = %d, published %d", len(tr.Events), pub.n)
	}
	var req schemas.SynthesisRequest
	if err := json.Unmarshal(tr.Events[0].Payload, &req); err != nil || req.Environment != "airline" || len(req.Tools) != 3 {
		t.Errorf("evaluator payload: %s (%v)", tr.Events[0].Payload, err)
	}
}

// TestEmpty: a fresh database gives "no rollouts yet" everywhere, never an error.
func TestEmpty(t *testing.T) {
	st := openStore(t)
	h := New(Deps{Store: st})
	var o OverviewResponse
	getJSON(t, h, "/api/overview", &o)
	if !o.Empty || o.Cohort != nil || !strings.Contains(o.Message, "No rollouts yet") || o.Cohorts == nil {
		t.Errorf("overview: %+v", o)
	}
	var tr TrendsResponse
	getJSON(t, h, "/api/trends", &tr)
	if !tr.Empty || !strings.Contains(tr.Message, "No rollouts yet") {
		t.Errorf("trends: %+v", tr)
	}
	var tg TriggersResponse
	getJSON(t, h, "/api/triggers", &tg)
	if len(tg.Events) != 0 || tg.Events == nil || tg.Message == "" {
		t.Errorf("triggers: %+v", tg)
	}
	var c CapabilityResponse
	getJSON(t, h, "/api/capability?env=airline&agent_version=v1&name="+capMulti, &c)
	if c.Stats != nil || c.Message == "" || c.Examples == nil {
		t.Errorf("capability: %+v", c)
	}
	for _, p := range []string{"/", "/trends", "/triggers", "/capability?env=airline&agent_version=v1&name=" + capMulti} {
		code, body := getStatus(h, p)
		if code != http.StatusOK {
			t.Errorf("GET %s: %d %s", p, code, body)
		}
		if !strings.Contains(body, "No rollouts yet") && !strings.Contains(body, "No trigger events") && !strings.Contains(body, "No capability") {
			t.Errorf("GET %s: no empty-state message", p)
		}
	}
}

// TestNoStore: without a store the API answers 503, not a panic.
func TestNoStore(t *testing.T) {
	h := New(Deps{})
	for _, p := range []string{"/api/overview", "/api/triggers", "/api/trends", "/"} {
		if code, _ := getStatus(h, p); code != http.StatusServiceUnavailable {
			t.Errorf("GET %s: %d, want 503", p, code)
		}
	}
}

// TestQueriesDoc keeps docs/queries.md generated from the SQL constants.
func TestQueriesDoc(t *testing.T) {
	path := filepath.Join("..", "..", QueriesDocPath)
	want := QueriesDoc()
	if os.Getenv("TRACE_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (generate it with TRACE_UPDATE_DOCS=1 go test -run TestQueriesDoc ./internal/dashboard/)", err)
	}
	for _, q := range sink.DashboardQueries {
		if !strings.Contains(string(got), q.SQL) {
			t.Errorf("%s does not contain the SQL of %s", QueriesDocPath, q.Name)
		}
	}
	if string(got) != want {
		t.Errorf("%s is out of date: run TRACE_UPDATE_DOCS=1 go test -run TestQueriesDoc ./internal/dashboard/", QueriesDocPath)
	}
	for _, name := range []string{"QPassRateHourly", "QCapabilityHourly", "QLackingWeekOverWeek"} {
		if !strings.Contains(string(got), "sink."+name) {
			t.Errorf("doc lacks %s", name)
		}
	}
}

// TestQueryLimits: a dashboard query stopped by the server at its memory
// limit answers 503 with a plain message (no driver internals), on the API
// and on the pages.
func TestQueryLimits(t *testing.T) {
	ch := testenv.ClickHouse(t)
	ctx := context.Background()
	st, err := sink.Open(ctx, sink.Config{Addr: []string{ch.Addr}, Database: ch.Database, QueryMaxMemory: 1 << 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	seedDemo(t, st, time.Now())
	h := New(Deps{Store: st})
	for _, p := range []string{"/api/overview", "/api/trends", "/"} {
		code, body := getStatus(h, p)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "more memory than the dashboard") {
			t.Errorf("GET %s: %d %.300s, want 503 and the plain message", p, code, body)
		}
		if strings.Contains(body, "code: 241") || strings.Contains(body, "clickhouse [") {
			t.Errorf("GET %s: driver internals in the body: %.300s", p, body)
		}
	}
}

func TestLimitKind(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{&clickhouse.Exception{Code: 159, Message: "Timeout exceeded: elapsed 10.0 seconds"}, "timeout"},
		{fmt.Errorf("overview: %w", &clickhouse.Exception{Code: 241, Message: "Memory limit (for query) exceeded"}), "memory"},
		{fmt.Errorf("trends: %w", context.DeadlineExceeded), "timeout"},
		{&clickhouse.Exception{Code: 60, Message: "Table doesn't exist"}, ""},
		{nil, ""},
	} {
		if got := sink.LimitKind(tt.err); got != tt.want {
			t.Errorf("LimitKind(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// countingStore is the real store, counting its reads of the dictionaries.
type countingStore struct {
	*sink.Store
	dictReads atomic.Int64
}

func (c *countingStore) AllDictionaries(ctx context.Context) ([]sink.DictionaryRow, error) {
	c.dictReads.Add(1)
	return c.Store.AllDictionaries(ctx)
}

// TestDictionariesOncePerRequest: without a registry (a dashboard in a
// process that loaded no dictionaries), every cohort's dictionary comes
// from the stored ones, read once per request however many cohorts the
// page decides: at thousands of cohorts a read per cohort took the
// overview past its time limit.
func TestDictionariesOncePerRequest(t *testing.T) {
	st := openStore(t)
	now := time.Now().UTC().Truncate(time.Second)
	seedDemo(t, st, now)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := st.SaveDictionary(ctx, analyzer.DictionaryRow(demoDict)); err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{Store: st}
	h := New(Deps{Store: cs, Rho: 0.10, Delta: 0.20, Eval: testEval, Now: func() time.Time { return now }})
	for _, path := range []string{"/api/overview?env=airline&agent_version=v2", "/api/overview?env=airline&agent_version=v1&fresh=1", "/api/trends?env=airline"} {
		cs.dictReads.Store(0)
		var o map[string]any
		getJSON(t, h, path, &o)
		if n := cs.dictReads.Load(); n != 1 {
			t.Errorf("%s: %d reads of the dictionaries, want 1", path, n)
		}
	}
	var o OverviewResponse
	getJSON(t, h, "/api/overview?env=airline&agent_version=v2", &o)
	labeled := 0
	for _, c := range o.Cohorts {
		if c.DictionaryVersion == 0 {
			continue
		}
		labeled++
		if c.Dictionary != demoDict.Scope() {
			t.Errorf("cohort %+v: dictionary %q, want %q (from the stored dictionaries)", c.CohortKey, c.Dictionary, demoDict.Scope())
		}
	}
	if labeled < 2 || o.Decision == nil || len(o.Decision.Capabilities) != len(demoDict.Capabilities) {
		t.Fatalf("%d labeled cohorts, decision %+v", labeled, o.Decision)
	}
}

// TestAPIErrorsAreJSON: an unknown endpoint under /api/ (404) and another
// method than GET on any (405, with Allow) answer {"error": …} as every
// other API error does, not the server's plain text.
func TestAPIErrorsAreJSON(t *testing.T) {
	h := New(Deps{})
	for _, tt := range []struct {
		method, path string
		code         int
	}{
		{http.MethodGet, "/api/nope", http.StatusNotFound},
		{http.MethodGet, "/api/overview/", http.StatusNotFound},
		{http.MethodGet, "/api/environments/x/y/z", http.StatusNotFound},
		{http.MethodPost, "/api/overview", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/api/environments/env-1", http.StatusMethodNotAllowed},
		{http.MethodPut, "/api/", http.StatusMethodNotAllowed},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
		var body map[string]string
		if rec.Code != tt.code || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") ||
			json.Unmarshal(rec.Body.Bytes(), &body) != nil || body["error"] == "" {
			t.Errorf("%s %s: %d %q %s, want %d and a JSON error", tt.method, tt.path, rec.Code, rec.Header().Get("Content-Type"), rec.Body.String(), tt.code)
		}
		if tt.code == http.StatusMethodNotAllowed && rec.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("%s %s: Allow %q", tt.method, tt.path, rec.Header().Get("Allow"))
		}
	}
	// The pages keep the server's answers.
	if code, _ := getStatus(h, "/nope"); code != http.StatusNotFound {
		t.Errorf("unknown page: %d", code)
	}
}
