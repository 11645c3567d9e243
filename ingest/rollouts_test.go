package ingest_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/shareddata"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// DecodeRolloutRow keeps only content prefixes and reuses its decode
// buffers, yet its rows are exactly the rows of the fully decoded rollouts:
// on the τ²-bench simulations and on long contents with escapes and
// multi-byte characters around the cut.
func TestDecodeRolloutRowMatchesFullDecode(t *testing.T) {
	var docs [][]byte
	long := func(unit string, n int) string { return strings.Repeat(unit, n) }
	for _, content := range []string{
		long("é", 1500), long("a\"b\\\n", 400), long("😀x", 700), long("abc", 100) + long("\u2028<&>", 500),
		long("x", 1203) + "é" + long("y", 10), long("x", 1204) + "\u0001", long("ab", 150),
	} {
		r := &schemas.Rollout{RolloutID: "r", Environment: "env", Agent: schemas.Agent{Name: "a", Version: "v1"}, TaskID: "t",
			Outcome: schemas.Outcome{Reward: 1}, Messages: []schemas.Message{{Role: "user", Content: content}, {Role: "assistant", Content: content[:len(content)/2]}}}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b)
	}
	if dir, err := shareddata.Lookup("tau2"); err == nil {
		files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		for _, f := range files {
			rs, err := ingest.ConvertTau2File(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				b, _ := json.Marshal(r)
				docs = append(docs, b)
			}
		}
	} else {
		t.Log("../shared/data/tau2 absent: synthetic rollouts only")
	}
	dec := ingest.DecodeRolloutRow(0)
	cut := 0
	var gots, wants []sink.RolloutRow
	for i, b := range docs {
		full, err := schemas.DecodeRollout(b, schemas.DecodeOptions{})
		if err != nil {
			t.Fatalf("doc %d: %v", i, err)
		}
		wants = append(wants, sink.RolloutRowFrom(full, sink.Coord{}))
		got, err := dec(b)
		if err != nil {
			t.Fatalf("doc %d: DecodeRolloutRow: %v", i, err)
		}
		gots = append(gots, *got)
		for _, m := range full.Messages {
			if len(m.Content) > 4*(sink.MaxContentChars+1) {
				cut++
			}
		}
	}
	// Compared after every decode: a row must not view the decoder's reused
	// buffer.
	for i := range gots {
		if gots[i] != wants[i] {
			t.Fatalf("doc %d: row differs\n got %.300s\nwant %.300s", i, gots[i].Messages, wants[i].Messages)
		}
	}
	if cut == 0 {
		t.Fatal("no content was long enough to be cut: the test does not exercise the prefix")
	}
	t.Logf("%d documents, %d contents decoded as prefixes", len(docs), cut)
}
