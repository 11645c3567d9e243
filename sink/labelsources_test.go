package sink_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// labelsOf are labels of a cohort from sources, one rollout each.
func labelsOf(c sink.Cohort, sources ...string) []sink.LabelRow {
	var rows []sink.LabelRow
	for i, src := range sources {
		rows = append(rows, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: "r" + src, Environment: c.Environment, AgentVersion: c.AgentVersion,
			DictionaryVersion: c.DictionaryVersion, Capability: "cap", Run: uint16(i), Label: schemas.LabelLacking, Source: src,
			TS: time.Date(2025, 6, 2, 9, 0, 0, 0, time.UTC)}})
	}
	return rows
}

// TestLabelSources: each cohort's label sources, as written, whatever is
// redelivered, and of labels stored before the table (migration 19).
func TestLabelSources(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	ruled := sink.Cohort{Environment: "e", AgentVersion: "v", DictionaryVersion: 1}
	imported := sink.Cohort{Environment: "e", AgentVersion: "v", DictionaryVersion: 2}
	mixed := sink.Cohort{Environment: "e", AgentVersion: "w", DictionaryVersion: 1}
	unlabeled := sink.Cohort{Environment: "none", AgentVersion: "v", DictionaryVersion: 1}
	var rows []sink.LabelRow
	rows = append(rows, labelsOf(ruled, schemas.SourceRules)...)
	rows = append(rows, labelsOf(imported, schemas.SourceExternal, schemas.SourceExternal)...)
	rows = append(rows, labelsOf(mixed, schemas.SourceRules, schemas.SourceLLM)...)
	for range 2 { // redelivered
		if err := s.InsertLabels(ctx, rows); err != nil {
			t.Fatal(err)
		}
	}
	want := map[sink.Cohort][]string{
		ruled:    {schemas.SourceRules},
		imported: {schemas.SourceExternal},
		mixed:    {schemas.SourceLLM, schemas.SourceRules},
	}
	got, err := s.LabelSources(ctx, []sink.Cohort{ruled, imported, mixed, unlabeled})
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("LabelSources = %v (%v), want %v", got, err, want)
	}
	if got, err := s.LabelSources(ctx, []sink.Cohort{imported}); err != nil || !reflect.DeepEqual(got, map[sink.Cohort][]string{imported: {schemas.SourceExternal}}) {
		t.Fatalf("LabelSources of one cohort = %v (%v)", got, err)
	}

	// Labels stored before migration 19 (its table and view dropped, its
	// record deleted): migrating copies their sources.
	conn := testenv.StoreConn(t, s)
	for _, q := range []string{"DROP TABLE label_sources_mv", "DROP TABLE label_sources", "ALTER TABLE schema_migrations DELETE WHERE version = 19"} {
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		applied, err := s.AppliedMigrations(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !applied[19] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the mutation deleting migration 19's record did not finish")
		}
		time.Sleep(50 * time.Millisecond)
	}
	before := sink.Cohort{Environment: "old", AgentVersion: "v", DictionaryVersion: 1}
	if err := s.InsertLabels(ctx, labelsOf(before, schemas.SourceExternal)); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	want[before] = []string{schemas.SourceExternal}
	got, err = s.LabelSources(ctx, []sink.Cohort{ruled, imported, mixed, before})
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("after migrating again: LabelSources = %v (%v), want %v", got, err, want)
	}
}
