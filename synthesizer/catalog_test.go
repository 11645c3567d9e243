package synthesizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer/envserver"
)

// TestCatalogServesDoneEnvironments: the environment server, over the
// registry in ClickHouse, lists only DONE environments with the target's
// tool schemas and their calibration, and plays the stored program
// (sandboxed) through the OpenEnv HTTP API.
func TestCatalogServesDoneEnvironments(t *testing.T) {
	st := chStore(t)
	ctx := context.Background()
	done := sampleEnvironment()
	failed := sampleEnvironment()
	failed.ID, failed.TriggerID, failed.Status, failed.Calibration = "env-failed", "trig-failed", StatusFailed, nil
	for _, e := range []*Environment{done, failed} {
		if err := st.SaveEnvironment(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	cat := Catalog{Store: st}
	list, err := cat.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != done.ID || list[0].Source != "registry" || list[0].ProgramHash != done.ProgramHash {
		t.Fatalf("listed %+v, want only %s", list, done.ID)
	}
	// The listing carries the accepted calibration as it was recorded, not
	// zeros for what a list row lacks (seeds 0, std 0, no policy).
	var cal Calibration
	if err := json.Unmarshal(list[0].Calibration, &cal); err != nil || !reflect.DeepEqual(&cal, done.Calibration) {
		t.Errorf("listed calibration %s (%v), want %+v", list[0].Calibration, err, *done.Calibration)
	}
	for _, tool := range list[0].Tools {
		if tool.Function.Name != "get_reservation_details" && tool.Function.Name != "cancel_reservation" {
			t.Errorf("listed a tool the program does not use: %s", tool.Function.Name)
		}
	}
	if _, err := cat.Open(ctx, failed.ID); !errors.Is(err, envserver.ErrNotFound) {
		t.Errorf("Open(FAILED) = %v, want ErrNotFound", err)
	}
	if _, err := cat.Open(ctx, "env-nope"); !errors.Is(err, envserver.ErrNotFound) {
		t.Errorf("Open(unknown) = %v, want ErrNotFound", err)
	}

	get := serveCatalog(t, envserver.Options{Catalog: cat})
	if code, body := get("GET", "/v1/environments", ""); code != 200 || !strings.Contains(body, done.ID) || strings.Contains(body, failed.ID) {
		t.Errorf("GET /v1/environments = %d %s", code, body)
	}
	code, body := get("POST", "/v1/environments/"+done.ID+"/reset", `{"seed": 3}`)
	if code != 200 || !strings.Contains(body, `"observation"`) || !strings.Contains(body, `"done":false`) {
		t.Errorf("reset = %d %s", code, body)
	}
	if code, _ := get("POST", "/v1/environments/"+failed.ID+"/reset", `{"seed": 3}`); code != http.StatusNotFound {
		t.Errorf("reset of a FAILED environment = %d, want 404", code)
	}
}

// saveCorrupt stores e with a column that does not decode, as a row
// written by an older or newer version (or damaged) would have it.
func saveCorrupt(t *testing.T, st SinkStore, e *Environment, corrupt func(r *sink.EnvironmentRow)) {
	t.Helper()
	r, err := Row(e)
	if err != nil {
		t.Fatal(err)
	}
	corrupt(&r)
	if err := st.Rows.SaveEnvironment(context.Background(), r); err != nil {
		t.Fatal(err)
	}
}

// TestCatalogSkipsUnreadableRows: a row of environments that does not
// decode is left out of the listing, with a warning naming it logged once,
// and the others are listed and served; one whose list columns decode but
// whose full record does not is listed, and only it is unavailable.
func TestCatalogSkipsUnreadableRows(t *testing.T) {
	var logs testenv.SyncBuffer
	st := chStore(t)
	st.Log = slog.New(slog.NewTextHandler(&logs, nil))
	ctx := context.Background()
	done := sampleEnvironment()
	if err := st.SaveEnvironment(ctx, done); err != nil {
		t.Fatal(err)
	}
	badList := sampleEnvironment()
	// A fresh id each run: the warning is once per row and process.
	badList.ID, badList.TriggerID = fmt.Sprintf("env-badlist-%d", time.Now().UnixNano()), "trig-badlist"
	saveCorrupt(t, st, badList, func(r *sink.EnvironmentRow) { r.Tools = `{"names": ["get_reservation_details"]}` })
	badFull := sampleEnvironment()
	badFull.ID, badFull.TriggerID = "env-badfull", "trig-badfull"
	saveCorrupt(t, st, badFull, func(r *sink.EnvironmentRow) { r.AttemptsJSON = `[{"n": "one"` })

	cat := Catalog{Store: st}
	for range 2 {
		list, err := cat.List(ctx)
		if err != nil {
			t.Fatalf("list with an unreadable row: %v", err)
		}
		var ids []string
		for _, e := range list {
			ids = append(ids, e.ID)
		}
		if len(ids) != 2 || !slices.Contains(ids, done.ID) || !slices.Contains(ids, badFull.ID) {
			t.Fatalf("listed %v, want %s and %s", ids, done.ID, badFull.ID)
		}
	}
	if n := strings.Count(logs.String(), "environment_id="+badList.ID); n != 1 || !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "stored tools") {
		t.Fatalf("logged %q, want one warning naming %s and its column", logs.String(), badList.ID)
	}

	do := serveCatalog(t, envserver.Options{Catalog: cat, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if code, body := do("GET", "/v1/environments", ""); code != 200 || !strings.Contains(body, done.ID) || strings.Contains(body, badList.ID) {
		t.Errorf("GET /v1/environments = %d %s, want %s listed and not %s", code, body, done.ID, badList.ID)
	}
	if code, body := do("POST", "/v1/environments/"+done.ID+"/reset", `{"seed": 3}`); code != 200 || !strings.Contains(body, `"observation"`) {
		t.Errorf("reset of the readable environment = %d %s", code, body)
	}
	if code, body := do("POST", "/v1/environments/"+badFull.ID+"/reset", `{"seed": 3}`); code != http.StatusServiceUnavailable || !strings.Contains(body, "attempts_json") {
		t.Errorf("reset of the environment whose record does not decode = %d %s, want 503 naming the column", code, body)
	}
	if code, _ := do("POST", "/v1/environments/"+badList.ID+"/reset", `{"seed": 3}`); code != http.StatusNotFound {
		t.Errorf("reset of the unlisted environment = %d, want 404", code)
	}
	if code, _ := do("POST", "/v1/environments/"+done.ID+"/reset", `{"seed": 4}`); code != 200 {
		t.Errorf("reset of the readable environment afterwards = %d", code)
	}
}

// loadCounter is the catalog's store (trace's CatalogStore over the real
// ClickHouse) counting the records it loads.
type loadCounter struct {
	CatalogStore
	loads atomic.Int32
}

func (c *loadCounter) LoadEnvironment(ctx context.Context, id string) (*Environment, error) {
	c.loads.Add(1)
	return c.CatalogStore.LoadEnvironment(ctx, id)
}

// TestCatalogFailedOpenIsCached: requests for a DONE environment whose
// record does not decode are answered 503 FACTORY_ERROR from one load of
// it, logged as an error once; once its record is fixed (a new version,
// seen in a listing) it opens.
func TestCatalogFailedOpenIsCached(t *testing.T) {
	var logs testenv.SyncBuffer
	st := chStore(t)
	st.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	bad := sampleEnvironment()
	bad.ID, bad.TriggerID = fmt.Sprintf("env-badopen-%d", time.Now().UnixNano()), "trig-badopen"
	saveCorrupt(t, st, bad, func(r *sink.EnvironmentRow) { r.AttemptsJSON = `[{"n": "one"` })
	store := &loadCounter{CatalogStore: st}
	do := serveCatalog(t, envserver.Options{Catalog: Catalog{Store: store},
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	for i := range 10 {
		if code, body := do("POST", "/v1/environments/"+bad.ID+"/reset", `{"seed": 3}`); code != http.StatusServiceUnavailable || !strings.Contains(body, "FACTORY_ERROR") || !strings.Contains(body, "attempts_json") {
			t.Fatalf("reset %d of the environment whose record does not decode = %d %s, want 503 FACTORY_ERROR naming the column", i, code, body)
		}
	}
	if n := store.loads.Load(); n != 1 {
		t.Errorf("10 requests loaded the record %d times, want 1", n)
	}
	var loud int
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, bad.ID) && (strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN")) {
			loud++
		}
	}
	if loud != 1 {
		t.Errorf("logged %d errors or warnings for it, want 1:\n%s", loud, logs.String())
	}

	bad.Version++ // fixed: a new version of its record
	if err := st.SaveEnvironment(ctx, bad); err != nil {
		t.Fatal(err)
	}
	if code, body := do("GET", "/v1/environments", ""); code != 200 || !strings.Contains(body, bad.ID) {
		t.Fatalf("GET /v1/environments = %d %s", code, body)
	}
	if code, body := do("POST", "/v1/environments/"+bad.ID+"/reset", `{"seed": 3}`); code != 200 || !strings.Contains(body, `"observation"`) {
		t.Errorf("reset of the fixed environment = %d %s, want 200", code, body)
	}
}

// listCounter is the catalog's store (trace's CatalogStore over the real
// ClickHouse) counting its listings.
type listCounter struct {
	CatalogStore
	lists atomic.Int32
}

func (c *listCounter) List(ctx context.Context, f sink.EnvironmentFilter) ([]*Environment, error) {
	c.lists.Add(1)
	return c.CatalogStore.List(ctx, f)
}

// TestCatalogFailedListingIsCached: with ClickHouse away, GET
// /v1/environments and the requests for an environment not open yet are
// answered 503 with the reason from one listing, logged as an error once.
func TestCatalogFailedListingIsCached(t *testing.T) {
	ch := testenv.OwnClickHouse(t)
	ctx := context.Background()
	rows, err := sink.Open(ctx, sink.Config{Addr: []string{ch.Addr()}, Database: "trace_catalog"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rows.Close() })
	if err := rows.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	st := SinkStore{Rows: rows, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	done := sampleEnvironment()
	if err := st.SaveEnvironment(ctx, done); err != nil {
		t.Fatal(err)
	}
	store := &listCounter{CatalogStore: st}
	var logs testenv.SyncBuffer
	do := serveCatalog(t, envserver.Options{Catalog: Catalog{Store: store},
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if code, body := do("GET", "/v1/environments", ""); code != 200 || !strings.Contains(body, done.ID) {
		t.Fatalf("GET /v1/environments = %d %s", code, body)
	}
	if err := ch.Kill(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if code, body := do("GET", "/v1/environments", ""); code != http.StatusServiceUnavailable || !strings.Contains(body, "synthesizer catalog: list") {
			t.Fatalf("GET /v1/environments %d with ClickHouse away = %d %s, want 503 with the reason", i, code, body)
		}
		if code, body := do("POST", "/v1/environments/"+done.ID+"/reset", `{"seed": 3}`); code != http.StatusServiceUnavailable || !strings.Contains(body, "FACTORY_ERROR") || !strings.Contains(body, "synthesizer catalog: list") {
			t.Fatalf("reset %d with ClickHouse away = %d %s, want 503 FACTORY_ERROR with the reason", i, code, body)
		}
	}
	if n := store.lists.Load(); n != 2 {
		t.Errorf("one listing, then 10 requests with ClickHouse away: listed %d times, want 2", n)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("logged %d errors for one failed listing, want 1:\n%s", n, logs.String())
	}
}

// serveCatalog serves an environment server with opts (closed when t
// ends) and returns a function doing one JSON request on it: its status
// and body.
func serveCatalog(t *testing.T, opts envserver.Options) func(method, path, body string) (int, string) {
	t.Helper()
	srv, err := envserver.New(envserver.DefaultConfig(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, hs.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
}
