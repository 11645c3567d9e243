package app_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
)

var trajectoryIDRe = regexp.MustCompile(`(?m)^id: (\S+)$`)

// TestDiscoveryForANewEnvironment: rollouts of an environment without a
// dictionary of its own are labeled with the default dictionary (version 1)
// and make the analyzer run the discovery agent (over a sample read back
// from ClickHouse); its proposal takes over as version 2, stored, announced,
// and used to label the next rollouts.
func TestDiscoveryForANewEnvironment(t *testing.T) {
	if testing.Short() {
		t.Skip("pipeline test")
	}
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 80)
	for _, r := range w.rollouts {
		r.Environment = "novel-env" // no built-in dictionary
	}
	srv := llmtest.New(t)
	var discoveryPrompts int
	label := llmtest.AutoLabels(func(llmtest.Request, string) string { return "PRESENT" })
	srv.Handle(func(req llmtest.Request) llmtest.Reply {
		p := req.Chat.Prompt()
		if !strings.Contains(p, "<trajectory>") {
			return label(req)
		}
		discoveryPrompts++
		ids := trajectoryIDRe.FindAllStringSubmatch(p, -1)
		if len(ids) < 2 {
			return llmtest.Text("{}")
		}
		return llmtest.JSON(map[string]any{"capabilities": []map[string]any{{
			"name":       "write_precondition_check",
			"definition": "Before changing a record the agent reads that record with a lookup tool. It acts only after checking the record's current state.",
			"examples":   []string{ids[0][1], ids[1][1]},
			"family":     "precondition_verification",
		}}})
	})
	cfg := w.cfg
	cfg.Analyzer.Labeler = "llm"
	cfg.Analyzer.N, cfg.Analyzer.K = 1, 1
	cfg.LLM = config.LLM{BaseURL: srv.URL, Model: "scripted", Timeout: 5 * time.Second, Concurrency: 4, Runs: 1, Structured: "json_schema"}
	a, stop := w.start(t, cfg)
	defer stop()
	w.publish(t, 0, 40) // no dictionary of its own: labeled with the default, discovery is requested
	deadline := time.Now().Add(90 * time.Second)
	for {
		if d := a.Dicts.Resolve("novel-env", "1.4.0"); (d != nil && !d.IsDefault()) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	var found bool
	for _, av := range []string{"1.4.0", "1.5.0"} {
		d := a.Dicts.Resolve("novel-env", av)
		if d == nil || d.IsDefault() {
			continue
		}
		found = true
		if d.Version != 2 || d.Source != "discovery" || d.Environment != "novel-env" || d.Capabilities[0].Name != "write_precondition_check" {
			t.Fatalf("discovered dictionary %+v", d)
		}
	}
	if !found || discoveryPrompts == 0 {
		t.Fatalf("no dictionary discovered (%d discovery prompts)", discoveryPrompts)
	}
	rows, err := a.Store.LatestDictionaries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var stored bool
	for _, r := range rows {
		stored = stored || (r.Environment == "novel-env" && r.Source == "discovery")
	}
	if !stored {
		t.Fatal("the discovered dictionary is not stored in ClickHouse")
	}
	// Meanwhile the default dictionary labeled the first rollouts.
	// (Their labels may still be on their way to ClickHouse when discovery
	// finishes: the labeler flushes in batches.)
	var byDefault uint64
	for deadline := time.Now().Add(30 * time.Second); byDefault == 0 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		testenv.StoreConn(t, a.Store).QueryRow(context.Background(), "SELECT count() FROM capability_labels WHERE environment = 'novel-env' AND dictionary_version = 1 AND capability = 'tool_error_recovery'").Scan(&byDefault)
	}
	if byDefault == 0 {
		t.Error("the default dictionary labeled none of the rollouts that arrived before discovery")
	}
	// The next rollouts are labeled against it.
	w.publish(t, 40, 80)
	deadline = time.Now().Add(60 * time.Second)
	for {
		var n uint64
		testenv.StoreConn(t, a.Store).QueryRow(context.Background(), "SELECT count() FROM capability_labels WHERE environment = 'novel-env' AND dictionary_version = 2 AND capability = 'write_precondition_check'").Scan(&n)
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no labels against the discovered dictionary")
		}
		time.Sleep(200 * time.Millisecond)
	}
}
