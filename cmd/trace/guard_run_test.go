package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/verify/verifytest"
)

// TestAdaptRoleGuard: `trace run --roles adapt` runs the closed loop's
// guard: an active adapter that made its capability worse is rolled back
// within a few intervals, and SIGTERM still exits 0 promptly.
func TestAdaptRoleGuard(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	ch := testenv.ClickHouse(t)
	ns := testenv.NATS(t)
	st, err := sink.Open(context.Background(), sink.Config{Addr: []string{ch.Addr}, Database: ch.Database}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	gap := verifytest.Mix{LF: 40, PF: 10, NF: 10, LP: 5, PP: 45, NP: 10}
	act := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	for _, a := range []verifytest.Adapter{
		{Name: "msc-bad", Capability: "multi_step_completion", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 45, PF: 40, NF: 5, LP: 2, PP: 13, NP: 5}},
		{Name: "pv-good", Capability: "precondition_verification", Environment: "sim-airline", AgentVersion: "1.4.0", ActivatedAt: act,
			Before: gap, After: verifytest.Mix{LF: 2, PF: 28, NF: 5, LP: 2, PP: 60, NP: 3}},
	} {
		if err := verifytest.Seed(context.Background(), st, a); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"run", "--roles", "adapt", "--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database,
		"--set", "nats.url=" + ns.URL(), "--set", "data_dir=" + t.TempDir(), "--set", "http.addr=127.0.0.1:0", "--set", "verify.interval=300ms",
		"--set", "adapter.backend=none"}
	cmd := traceProcess(args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	deadline := time.Now().Add(60 * time.Second)
	for {
		a, err := st.Adapter(context.Background(), "msc-bad")
		if err == nil && a != nil && a.Status == "rolled_back" {
			if !strings.Contains(a.Metadata, `"to":"rolled_back"`) || !strings.Contains(a.Metadata, "closed-loop guard (event aev-") ||
				!strings.Contains(a.Metadata, "significantly worse") {
				t.Fatalf("metadata %s", a.Metadata)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not rolled back after 60s (%+v %v):\n%s", a, err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if a, _ := st.Adapter(context.Background(), "pv-good"); a == nil || a.Status != "active" {
		t.Fatalf("the good adapter: %+v", a)
	}
	if err := terminate(t, cmd, 15*time.Second, &logs); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "closed loop: adapter rolled back") {
		t.Fatalf("the rollback was not logged:\n%s", logs.String())
	}
}
