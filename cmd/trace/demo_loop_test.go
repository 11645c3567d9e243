package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/verify"
)

// TestDemoClosedLoop runs `trace demo --json` through the closed loop:
// every planted deficit's adapter closes its gap on the traffic routed to
// it through the proxy, and the guard rolls the harmful adapter back.
func TestDemoClosedLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end demo: skipped with -short")
	}
	if _, err := exec.LookPath("clickhouse-server"); err != nil {
		if _, err := exec.LookPath("clickhouse"); err != nil {
			testenv.Unavailable(t, "no clickhouse-server or clickhouse binary on PATH")
		}
	}
	demoBeforeLoop = func(ctx context.Context, a *app.App, sum *demoSummary) {
		// Stand-in for the simulated trainer: a candidate adapter per
		// planted deficit.
		now := time.Now().UTC()
		for _, p := range sum.Planted {
			parts := strings.SplitN(p, "/", 3)
			if err := a.Store.SaveAdapter(ctx, sink.AdapterRow{Name: parts[0] + "-" + parts[2], JobID: "test", Environment: parts[0], AgentVersion: parts[1],
				Capability: parts[2], BaseModel: "sim-base", URI: "simulated://" + p, Status: "candidate", Simulated: true, Metadata: "{}",
				CreatedAt: now, UpdatedAt: now, Version: uint64(now.UnixNano())}); err != nil {
				t.Error(err)
			}
		}
	}
	defer func() { demoBeforeLoop = nil }()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	out, err := runCLI(t, ctx, "demo", "--json", "--timeout", "5m", "--rollouts", "3000", "--rate", "0", "--loop-rollouts", "3000",
		"--set", "data_dir="+dir, "--set", "kafka.embedded_addr=127.0.0.1:0", "--set", "embedded.clickhouse_port=0",
		"--set", "embedded.clickhouse_http_port=0", "--set", "embedded.nats_port=0", "--set", "http.addr=127.0.0.1:0")
	var sum demoSummary
	if jerr := json.Unmarshal([]byte(lastJSON(out)), &sum); jerr != nil {
		t.Fatalf("demo printed no JSON summary (err %v): %v\n%s", err, jerr, out)
	}
	l := sum.Loop
	if l == nil {
		t.Fatalf("no closed loop in the summary: %q\n%s", sum.Verdict, out)
	}
	var text bytes.Buffer
	printDemoLoop(&text, l)
	t.Logf("closed loop:%s", text.String())
	if err != nil || !sum.OK || !l.OK {
		t.Fatalf("demo failed: %v; verdict %q", err, sum.Verdict)
	}
	if !strings.Contains(l.Simulated, "SIMULATED") || l.Traffic != 3000 || l.Routed["none"] == 0 {
		t.Fatalf("loop %+v", l)
	}
	planted, harmful := 0, 0
	for _, a := range l.Adapters {
		switch a.Role {
		case "planted_deficit":
			planted++
			if a.Verdict != verify.GapClosed || a.Status != "active" || a.Routed == 0 || a.DeltaBefore.Value < 0.2 || a.DeltaAfter.Value >= 0.2 {
				t.Errorf("planted %+v", a)
			}
		case "harmful":
			harmful++
			if a.Verdict != verify.Worse || a.Status != "rolled_back" || a.PassAfter.Value >= a.PassBefore.Value {
				t.Errorf("harmful %+v", a)
			}
		}
	}
	if planted != 3 || harmful != 1 {
		t.Fatalf("%d planted, %d harmful adapters", planted, harmful)
	}
}
