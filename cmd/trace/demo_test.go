package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/verify"
)

// TestDemoEndToEnd runs `trace demo --json` in-process on embedded servers
// (kfake, nats-server, a local ClickHouse) and checks that triggers fired for
// exactly the planted deficits, their environments and adapters were made,
// and, in the closed loop, every planted deficit's gap closed on the traffic
// routed to its adapter through the proxy while the guard rolled the
// harmful adapter back.
func TestDemoEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end demo: skipped with -short")
	}
	if _, err := exec.LookPath("clickhouse-server"); err != nil {
		if _, err := exec.LookPath("clickhouse"); err != nil {
			testenv.Unavailable(t, "no clickhouse-server or clickhouse binary on PATH")
		}
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()
	out, err := runCLI(t, ctx, "demo", "--json", "--timeout", "6m", "--rollouts", "2000", "--rate", "0", "--loop-rollouts", "3000",
		"--set", "data_dir="+dir, "--set", "kafka.embedded_addr=127.0.0.1:0", "--set", "embedded.clickhouse_port=0",
		"--set", "embedded.clickhouse_http_port=0", "--set", "embedded.nats_port=0", "--set", "http.addr=127.0.0.1:0")
	var sum demoSummary
	if jerr := json.Unmarshal([]byte(lastJSON(out)), &sum); jerr != nil {
		t.Fatalf("demo printed no JSON summary (err %v): %v\n%s", err, jerr, out)
	}
	if err != nil || !sum.OK {
		t.Fatalf("demo failed: %v; verdict %q\n%s", err, sum.Verdict, out)
	}
	if len(sum.Planted) != 3 || len(sum.Triggered) != 3 || sum.Counts.Stored != 2000 || sum.Counts.Labeled != 2000 { // counted before the loop
		t.Fatalf("summary %+v", sum)
	}
	if sum.Counts.DeadLettered < int64(sum.Counts.Malformed) || sum.Counts.Malformed == 0 {
		t.Fatalf("malformed messages not dead-lettered: %+v", sum.Counts)
	}
	for _, tr := range sum.Triggers {
		if tr.Request.Capability.Status != "PENDING" || len(tr.Request.Tools) == 0 || len(tr.Request.ExampleFailedRolloutIDs) == 0 {
			t.Errorf("synthesis request lacks its payload: %+v", tr.Request)
		}
	}
	// Every planted deficit got an environment from a template, DONE,
	// calibrated by the simulated policy and labeled so.
	if len(sum.Environments) != 3 || sum.Counts.EnvsDone != 3 {
		t.Fatalf("environments %+v", sum.Environments)
	}
	for _, e := range sum.Environments {
		key := e.Environment + "/" + e.AgentVersion + "/" + e.Capability
		if e.Status != "DONE" || !e.Simulated || len(e.Tools) < 2 || e.MeanReward == nil || e.SuccessRate == nil ||
			*e.MeanReward < 0.2 || *e.MeanReward > 0.6 || *e.SuccessRate < 0.2 || *e.SuccessRate > 0.6 || len(e.PassAtK) != 4 || e.Family != e.Capability {
			t.Errorf("environment of %s: %+v", key, e)
		}
		if !slices.Contains(sum.Planted, key) {
			t.Errorf("an environment for %s, which is not a planted deficit", key)
		}
	}
	// Every environment's training job went through the nats work queue to
	// the simulated trainer, succeeded after its planned iterations with a
	// reward above the environment's calibrated base, and its adapter is in
	// the registry as a simulated candidate with a sim:// URI.
	if len(sum.Jobs) != 3 || len(sum.Adapters) != 3 || sum.Counts.JobsSucceeded != 3 || sum.Counts.Adapters != 3 {
		t.Fatalf("training: jobs %+v adapters %+v counts %+v", sum.Jobs, sum.Adapters, sum.Counts)
	}
	envs := map[string]environmentSummary{}
	for _, e := range sum.Environments {
		envs[e.ID] = e
	}
	ads := map[string]demoAdapter{}
	for _, a := range sum.Adapters {
		ads[a.JobID] = a
	}
	for _, j := range sum.Jobs {
		e, ok := envs[j.EnvironmentID]
		if !ok || j.JobID != schemas.TrainingJobID(e.ID, 1) || j.Capability != e.Capability {
			t.Errorf("job %+v is not the job of an environment of the demo", j)
		}
		if j.Status != "SUCCEEDED" || !j.Simulated || j.Iterations < 10 || j.Iteration != j.Iterations || e.MeanReward == nil ||
			j.BaseReward != *e.MeanReward || j.FinalReward <= j.BaseReward || j.FinalReward > 1 {
			t.Errorf("job %+v", j)
		}
		a, ok := ads[j.JobID]
		if !ok || a.Name != j.Adapter || !strings.HasPrefix(a.Name, "sim-") || !strings.HasPrefix(a.URI, "sim://") || a.Status != "candidate" ||
			!a.Simulated || !strings.Contains(a.Trainer, "simulated") || a.EvalMeanReward != j.FinalReward {
			t.Errorf("adapter of %s: %+v", j.JobID, a)
		}
	}
	if !strings.Contains(sum.Verdict, "adapter registered") {
		t.Errorf("verdict %q does not say the adapters were registered", sum.Verdict)
	}

	// The closed loop.
	l := sum.Loop
	if l == nil || !l.OK {
		t.Fatalf("closed loop %+v", l)
	}
	var text bytes.Buffer
	printDemoLoop(&text, l)
	t.Logf("closed loop:%s", text.String())
	if !strings.Contains(l.Simulated, "SIMULATED") || !strings.Contains(l.Simulated, "stand-in for a trained adapter") || l.Traffic != 3000 || l.Routed["none"] == 0 {
		t.Fatalf("loop %+v", l)
	}
	routed := 0
	for _, n := range l.Routed {
		routed += n
	}
	if routed != 3000 {
		t.Fatalf("routed %v, want 3000 conversations in all", l.Routed)
	}
	planted, harmful := 0, 0
	for _, a := range l.Adapters {
		key := a.Environment + "/" + a.AgentVersion + "/" + a.Capability
		switch a.Role {
		case "planted_deficit":
			planted++
			if !slices.Contains(sum.Planted, key) || a.Verdict != verify.GapClosed || a.Status != "active" || a.Routed == 0 ||
				a.DeltaBefore.Value < 0.2 || a.DeltaAfter.Value >= 0.2 || a.PassAfter.Value <= a.PassBefore.Value {
				t.Errorf("planted deficit's adapter %+v", a)
			}
		case "harmful":
			harmful++
			if a.Verdict != verify.Worse || a.Status != "rolled_back" || a.PassAfter.Hi >= a.PassBefore.Lo {
				t.Errorf("harmful adapter %+v", a)
			}
		}
	}
	if planted != 3 || harmful != 1 {
		t.Fatalf("%d planted deficits' adapters, %d harmful", planted, harmful)
	}
	if !strings.Contains(sum.Verdict, "guard rolled the harmful adapter back") {
		t.Errorf("verdict %q", sum.Verdict)
	}
	// A synthesis request during the loop (the analyzer may see the
	// harmful adapter's regression before the guard rolls it back) is
	// listed with its environment, and counted apart from step 1's.
	for _, tr := range l.Triggers {
		if !tr.Harmful || tr.Capability != harmfulCapability || tr.EnvID == "" {
			t.Errorf("trigger during the loop %+v", tr)
		}
		if !strings.Contains(text.String(), "synthesis requested during the loop for "+tr.Environment+"/"+tr.AgentVersion+" "+tr.Capability) {
			t.Errorf("the loop's text does not list the trigger %+v", tr)
		}
	}
	if sum.Counts.SynthesisMsgs != 3 {
		t.Errorf("%d synthesis requests in step 1, want the 3 planted deficits'", sum.Counts.SynthesisMsgs)
	}
}

// TestLoopTriggersPrinted: the summary lists a synthesis request of the
// closed loop, says what it is, and counts it apart from step 1's.
func TestLoopTriggersPrinted(t *testing.T) {
	s := &demoSummary{OK: true, Verdict: "v", Counts: demoCounts{SynthesisMsgs: 3}, Loop: &demoLoop{Simulated: loopDisclaimer, OK: true,
		Triggers: []demoLoopTrigger{{Environment: "sim-airline", AgentVersion: "1.4.0", Capability: harmfulCapability, Harmful: true, EnvID: "env-1", EnvStatus: "FAILED", EnvReason: "too easy"}}}}
	var b bytes.Buffer
	printDemoSummary(&b, s)
	for _, want := range []string{
		"synthesis requested during the loop for sim-airline/1.4.0 " + harmfulCapability + " (the harmful adapter's regression",
		"env-1: FAILED: too easy",
		"synthesis requests 3 (+1 during the closed loop)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, b.String())
		}
	}
}

// lastJSON returns the last top-level JSON object in s (logs may precede it).
func lastJSON(s string) string {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '{' && (i == 0 || s[i-1] == '\n') {
			return s[i:]
		}
	}
	return s
}
