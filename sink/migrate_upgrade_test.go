package sink_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
)

// A database migrated by a newer trace (a downgrade, or an old replica
// restarted after a new one migrated) is refused at Migrate, which every
// start and `trace migrate` run, with both versions named, instead of
// being used as if it had the old binary's schema.
func TestMigrateRefusesANewerSchema(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	latest := sink.Migrations[len(sink.Migrations)-1].Version
	b, err := testenv.StoreConn(t, s).PrepareBatch(ctx, "INSERT INTO schema_migrations (version, name, applied_at)")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Append(uint32(latest+1), "from_the_future", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	err = s.Migrate(ctx)
	if !errors.Is(err, sink.ErrSchemaNewer) {
		t.Fatalf("Migrate on a schema at %d, this build's latest %d: err = %v, want ErrSchemaNewer", latest+1, latest, err)
	}
	for _, want := range []string{fmt.Sprint(latest + 1), fmt.Sprint(latest), s.Database()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

// Replicas that start at once against an unmigrated database all migrate
// it without an error, and every migration is recorded.
func TestConcurrentMigrations(t *testing.T) {
	ch := testenv.ClickHouse(t)
	ctx := context.Background()
	const replicas = 4
	stores := make([]*sink.Store, replicas)
	for i := range stores {
		s, err := sink.Open(ctx, sink.Config{Addr: []string{ch.Addr}, Database: ch.Database}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores[i] = s
	}
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Migrate(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: %v", i, err)
		}
	}
	applied, err := stores[0].AppliedMigrations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != len(sink.Migrations) {
		t.Errorf("applied %v, want %d migrations", applied, len(sink.Migrations))
	}
}
