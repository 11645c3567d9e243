package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dashboard"
	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/internal/dev/testenv"
)

// TestNewUserTau2 is issue 11's acceptance: a new user replays τ²-bench
// result files of agents never configured, with their original 2025
// timestamps, into trace on embedded defaults (in-process broker, NATS and a
// local ClickHouse), with no LLM and no dictionary of their own. The default
// dictionary labels both cohorts; trace report shows per-capability
// statistics for every cohort with enough failures and says why the other
// is undecided; the dashboard's charts have data; every capability over the
// thresholds has fired its synthesis request on NATS.
func TestNewUserTau2(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end: skipped with -short")
	}
	dir := shareddata.Dir(t, "tau2")
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(files) == 0 {
		t.Skipf("no τ²-bench result files in %s", dir)
	}
	if _, err := exec.LookPath("clickhouse-server"); err != nil {
		if _, err := exec.LookPath("clickhouse"); err != nil {
			testenv.Unavailable(t, "no clickhouse-server or clickhouse binary on PATH")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Embedded defaults; only ports (free ones) and the data directory are set.
	a := startTestApp(t, []string{"data_dir=" + t.TempDir(), "kafka.embedded_addr=127.0.0.1:0", "embedded.clickhouse_port=0",
		"embedded.clickhouse_http_port=0", "embedded.nats_port=0", "http.addr=127.0.0.1:0"})
	if out, err := runCLI(t, ctx, append([]string{"replay", "--brokers", a.a.Brokers[0]}, files...)...); err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	const total = 164 // 50 airline + 114 retail simulations
	waitFor(t, "ingest", 2*time.Minute, func() (bool, string) {
		got := storedRollouts(t, a.a.Store)
		return got == total, fmt.Sprintf("%d of %d stored", got, total)
	})
	var rep []reportRow
	waitFor(t, "both cohorts labeled and decided", 2*time.Minute, func() (bool, string) {
		rep = reportJSON(t, ctx, a.cli)
		rows, fired := 0, 0
		for _, r := range rep {
			if r.Decision != "no labels" && r.Rollouts == map[string]int{"tau2-airline": 50, "tau2-retail": 114}[r.Environment] {
				rows++
			}
		}
		fired = len(firedTriggers(t, a.a.Store))
		return rows == 10 && fired >= 1, fmt.Sprintf("%d capability rows over complete windows, %d fired: %+v", rows, fired, rep)
	})
	t.Logf("report:\n%s", mustRun(t, ctx, append([]string{"report"}, a.cli...)))

	minFailures := a.a.Cfg.Analyzer.MinFailures
	selected := map[string]bool{}
	for _, r := range rep {
		if r.Dictionary != "*/*" || !r.DefaultDictionary || r.Watermark.Year() != 2025 {
			t.Errorf("%s/%s %s: dictionary %q (default %v), as of %v; want the default dictionary and the 2025 watermark", r.Environment, r.AgentVersion, r.Capability, r.Dictionary, r.DefaultDictionary, r.Watermark)
		}
		switch {
		case r.Failures >= minFailures:
			if r.Decision != "selected" && r.Decision != "rejected" {
				t.Errorf("%s %s: %d failures but decision %q %v", r.Environment, r.Capability, r.Failures, r.Decision, r.Reasons)
			}
			if r.Decision == "selected" {
				selected[r.Environment+" "+r.Capability] = true
			}
		default:
			// The retail file has 18 failures: undecided, and the report names the setting.
			if r.Decision != "undecided" || len(r.Reasons) != 1 || !strings.Contains(r.Reasons[0], "analyzer.min_failures") {
				t.Errorf("%s %s: %d failures, decision %q %v; want undecided naming analyzer.min_failures", r.Environment, r.Capability, r.Failures, r.Decision, r.Reasons)
			}
		}
	}
	decided := 0
	for _, r := range rep {
		if r.Failures >= minFailures {
			decided++
		}
	}
	if decided == 0 {
		t.Fatalf("no cohort has %d failures: %+v", minFailures, rep)
	}
	// Every selected capability fired its synthesis request, and NATS holds it.
	fired := firedTriggers(t, a.a.Store)
	if len(selected) == 0 {
		t.Fatalf("nothing crosses the thresholds in the τ² data; the report says why: %+v", rep)
	}
	t.Logf("selected %v, fired %v", selected, fired)
	js, err := a.a.Bus.JS.Stream(ctx, bus.StreamSynthesis)
	if err != nil {
		t.Fatal(err)
	}
	for k := range selected {
		env, capName, _ := strings.Cut(k, " ")
		found := false
		for _, f := range fired {
			found = found || strings.HasPrefix(f, env+"/") && strings.Contains(f, " "+capName+" epoch 1")
		}
		msg, err := js.GetLastMsgForSubject(ctx, bus.SynthesisSubject(env, capName))
		if !found || err != nil || !strings.Contains(string(msg.Data), capName) {
			t.Errorf("%s: selected but its synthesis request is not in trigger_events (%v) or on NATS (%v)", k, fired, err)
		}
	}

	// The dashboard's charts are filled although the data is from 2025.
	var ov dashboard.OverviewResponse
	getAPI(t, "http://"+a.a.HTTPAddr()+"/api/overview?env=tau2-airline", &ov)
	if len(ov.PassRate) == 0 || len(ov.Capabilities) == 0 || ov.Decision == nil || ov.Decision.Window.Rollouts != 50 {
		t.Errorf("overview of tau2-airline: %d pass-rate series, %d capability series, decision %+v", len(ov.PassRate), len(ov.Capabilities), ov.Decision)
	}
	if ov.Range.Until.Year() != 2025 || !ov.Range.AsOf.Equal(ov.Range.Until) || ov.Range.Warning != "" {
		t.Errorf("overview range %+v: want it to end at the data's watermark (2025), without a warning", ov.Range)
	}
	for _, c := range ov.Cohorts {
		if c.Dictionary != "*/*" || !c.DefaultDictionary {
			t.Errorf("cohort %+v: want the default dictionary shown", c)
		}
	}
	var all dashboard.OverviewResponse
	getAPI(t, "http://"+a.a.HTTPAddr()+"/api/overview?env=tau2-airline&hours=all&bucket=day", &all)
	if !all.Range.All || all.Range.Since.Year() != 2025 || len(all.PassRate) == 0 || len(all.Capabilities) == 0 {
		t.Errorf("overview, all: range %+v, %d pass-rate series, %d capability series", all.Range, len(all.PassRate), len(all.Capabilities))
	}
	page := getText(t, "http://"+a.a.HTTPAddr()+"/?env=tau2-airline")
	for _, want := range []string{`id="as-of"`, "as of " + ov.Range.AsOf.Format("2006-01-02 15:04 UTC"), `id="default-dictionary"`, "hours=all", `id="chart-pass-rate"`} {
		if !strings.Contains(page, want) {
			t.Errorf("overview page lacks %q", want)
		}
	}
}

func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return string(b)
}

func mustRun(t *testing.T, ctx context.Context, args []string) string {
	t.Helper()
	out, err := runCLI(t, ctx, args...)
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	return out
}

func getAPI(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
