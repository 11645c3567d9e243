package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
)

// TestBenchQuerySmall runs `trace bench query` end to end on a small load
// (3,000 rollouts over 10 days): the exactness check passes; the
// overview's decisions equal trace report's, which needs each cohort
// decided (the load's labels are one run of source "simulated", which the
// configuration's defaults counted as N = 10, so that every cohort was
// undecided and the run stopped there); and the guard's tick reads the
// load's active adapter, whose rollouts are routed only through their
// conversations' decisions, with the same samples through the routing
// subquery filtered by environment and through the one before.
func TestBenchQuerySmall(t *testing.T) {
	ch := testenv.ClickHouse(t)
	out, err := runCLI(t, context.Background(), "bench", "query", "--sizes", "3k", "--days", "10", "--reps", "1",
		"--clickhouse", ch.Addr, "--database", ch.Database+"_bench")
	if err != nil {
		t.Fatalf("bench query: %v\n%s", err, out)
	}
	for _, want := range []string{"all equal", "the overview's decisions equal trace report's", "| guard tick (1 active adapter) | 3k |"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output has no %q", want)
		}
	}
	if strings.Contains(out, "error:") {
		t.Errorf("an endpoint failed")
	}
	m := regexp.MustCompile(`guard of ` + sink.BenchAdapter + `: before (\d+) rollouts, after (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no guard line in the output:\n%s", out)
	}
	before, _ := strconv.Atoi(m[1])
	after, _ := strconv.Atoi(m[2])
	// The planted cohort is a sixth of the load, half of its last 7 of 10
	// days routed: ~175 routed rollouts, and every base rollout of the
	// first 3 days before them.
	if before < 100 || after < 100 {
		t.Errorf("the guard read %d rollouts before and %d after, want the load's routed cohort on both sides\n%s", before, after, out)
	}
	if t.Failed() {
		t.Log(out)
	}
}
