package envserver

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/examples"
)

// gateCatalog is a Catalog (trace's own interface) over the example
// program whose Open of one id blocks until the test lets it go, as a
// registry query or a sandbox worker's start can; it counts the calls.
type gateCatalog struct {
	env    envprog.Env
	slow   string
	ids    []string
	opened chan struct{} // receives when Open(slow) has begun
	gate   chan struct{} // closed to let Open(slow) return
	lists  atomic.Int32
	opens  sync.Map // id → *atomic.Int32
}

func (c *gateCatalog) List(context.Context) ([]Entry, error) {
	c.lists.Add(1)
	out := make([]Entry, len(c.ids))
	for i, id := range c.ids {
		out[i] = Entry{ID: id, Source: "file"}
	}
	return out, nil
}

func (c *gateCatalog) Open(ctx context.Context, id string) (envprog.Env, error) {
	n, _ := c.opens.LoadOrStore(id, new(atomic.Int32))
	n.(*atomic.Int32).Add(1)
	if id == c.slow {
		c.opened <- struct{}{}
		select {
		case <-c.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return nopClose{c.env}, nil
}

func (c *gateCatalog) openCount(id string) int32 {
	n, ok := c.opens.Load(id)
	if !ok {
		return 0
	}
	return n.(*atomic.Int32).Load()
}

// nopClose serves one loaded program under several ids (the server closes
// each id's Env).
type nopClose struct{ envprog.Env }

func (nopClose) Close() error { return nil }

// TestCatalogOutsideLock: while the catalog is opening one environment
// (blocked), requests for another, already open, environment are
// answered; requests for the slow one share a single Open; an unknown id
// is looked up in the catalog once within the negative cache's lifetime;
// an Open that never returns is answered 503 at the catalog timeout.
func TestCatalogOutsideLock(t *testing.T) {
	env, err := envprog.Load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	cat := &gateCatalog{env: env, slow: "slow", ids: []string{"fast", "slow", "stuck"},
		opened: make(chan struct{}, 4), gate: make(chan struct{})}
	srv, err := New(DefaultConfig(), Options{Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	// Generous bounds: a request that should be answered and is not fails
	// the test instead of hanging it.
	client := &http.Client{Timeout: 20 * time.Second}
	get := func(path string) (int, error) {
		res, err := client.Get(hs.URL + path)
		if err != nil {
			return 0, err
		}
		res.Body.Close()
		return res.StatusCode, nil
	}
	post := func(path, body string) (int, error) {
		res, err := client.Post(hs.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			return 0, err
		}
		res.Body.Close()
		return res.StatusCode, nil
	}
	if code, err := get("/v1/environments/fast/metadata"); err != nil || code != 200 {
		t.Fatalf("fast metadata: %d %v", code, err)
	}

	// Two requests for the slow environment: one Open, both wait.
	slow := make(chan int, 2)
	for range 2 {
		go func() {
			code, _ := get("/v1/environments/slow/metadata")
			slow <- code
		}()
	}
	select {
	case <-cat.opened:
	case <-time.After(20 * time.Second):
		t.Fatal("the slow Open never began")
	}
	// Meanwhile the open environment answers: HTTP, a reset, a listing.
	if code, err := get("/v1/environments/fast/schema"); err != nil || code != 200 {
		t.Fatalf("fast schema while the catalog is busy: %d %v", code, err)
	}
	if code, err := post("/v1/environments/fast/reset", `{"seed": 1}`); err != nil || code != 200 {
		t.Fatalf("fast reset while the catalog is busy: %d %v", code, err)
	}
	if code, err := get("/v1/environments"); err != nil || code != 200 {
		t.Fatalf("listing while the catalog is busy: %d %v", code, err)
	}
	close(cat.gate)
	for range 2 {
		if code := <-slow; code != 200 {
			t.Fatalf("slow metadata after its Open: %d", code)
		}
	}
	if n := cat.openCount("slow"); n != 1 {
		t.Fatalf("Open(slow) called %d times, want 1", n)
	}

	// An unknown id: 404, and the catalog is listed once for both asks.
	before := cat.lists.Load()
	for range 2 {
		if code, err := get("/v1/environments/nope/metadata"); err != nil || code != 404 {
			t.Fatalf("unknown id: %d %v", code, err)
		}
	}
	if n := cat.lists.Load() - before; n != 1 {
		t.Fatalf("the catalog was listed %d times for two asks of an unknown id, want 1", n)
	}

	// An Open that does not return is answered at the catalog timeout.
	srv.catalogTimeout = 200 * time.Millisecond
	cat.slow, cat.gate = "stuck", make(chan struct{})
	if code, err := get("/v1/environments/stuck/metadata"); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("stuck Open: %d %v, want 503", code, err)
	}
	<-cat.opened
}

// TestNotFoundExpires: an id unknown to the catalog is asked again once
// the negative cache's entry has expired (an environment accepted since is
// served).
func TestNotFoundExpires(t *testing.T) {
	env, err := envprog.Load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	cat := &gateCatalog{env: env, ids: []string{"a"}}
	srv, err := New(DefaultConfig(), Options{Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	ctx := context.Background()
	if _, err := srv.environment(ctx, "b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("b: %v, want ErrNotFound", err)
	}
	cat.ids = []string{"a", "b"} // accepted meanwhile
	if _, err := srv.environment(ctx, "b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("b within the cache's lifetime: %v, want ErrNotFound", err)
	}
	srv.mu.Lock()
	srv.missing["b"] = time.Now().Add(-time.Second) // the entry expires
	srv.mu.Unlock()
	if _, err := srv.environment(ctx, "b"); err != nil {
		t.Fatalf("b after the entry expired: %v", err)
	}
}

// failCatalog lists "a", whose Open fails until ok is set.
type failCatalog struct {
	gateCatalog
	ok atomic.Bool
}

func (c *failCatalog) Open(ctx context.Context, id string) (envprog.Env, error) {
	if !c.ok.Load() {
		c.gateCatalog.opens.LoadOrStore(id, new(atomic.Int32))
		n, _ := c.gateCatalog.opens.Load(id)
		n.(*atomic.Int32).Add(1)
		return nil, errors.New("the program does not load")
	}
	return c.gateCatalog.Open(ctx, id)
}

// TestFailedOpenExpires: an environment that failed to open is answered
// with its failure, without asking the catalog, until the entry expires;
// found failing the same way again it is logged at debug level only, and
// once it opens it is served.
func TestFailedOpenExpires(t *testing.T) {
	env, err := envprog.Load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	var logs testenv.SyncBuffer
	cat := &failCatalog{gateCatalog: gateCatalog{env: env, ids: []string{"a"}}}
	srv, err := New(DefaultConfig(), Options{Catalog: cat, Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	ctx := context.Background()
	expire := func() {
		srv.mu.Lock()
		srv.failed["a"].until = time.Now().Add(-time.Second)
		srv.mu.Unlock()
	}
	for range 3 {
		if _, err := srv.environment(ctx, "a"); err == nil || errors.Is(err, ErrNotFound) {
			t.Fatalf("a: %v, want its open's failure", err)
		}
	}
	if n := cat.openCount("a"); n != 1 {
		t.Fatalf("three asks opened it %d times, want 1", n)
	}
	expire()
	if _, err := srv.environment(ctx, "a"); err == nil {
		t.Fatal("a failing again: no error")
	}
	if n := cat.openCount("a"); n != 2 {
		t.Fatalf("opened %d times after the entry expired, want 2", n)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("logged %d errors for one failure found twice, want 1:\n%s", n, logs.String())
	}
	cat.ok.Store(true)
	expire()
	if _, err := srv.environment(ctx, "a"); err != nil {
		t.Fatalf("a once it opens: %v", err)
	}
}

// listFailCatalog is gateCatalog whose List fails until ok is set.
type listFailCatalog struct {
	gateCatalog
	ok atomic.Bool
}

func (c *listFailCatalog) List(ctx context.Context) ([]Entry, error) {
	if !c.ok.Load() {
		c.lists.Add(1)
		return nil, errors.New("dial tcp: connection refused")
	}
	return c.gateCatalog.List(ctx)
}

// TestFailedListingExpires: a failed listing is answered, to the listing
// and to the requests for an environment not open yet, without asking the
// catalog until the entry expires, logged as an error once each time the
// catalog was asked; once the catalog lists, the environment is served.
func TestFailedListingExpires(t *testing.T) {
	env, err := envprog.Load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	var logs testenv.SyncBuffer
	cat := &listFailCatalog{gateCatalog: gateCatalog{env: env, ids: []string{"a"}}}
	srv, err := New(DefaultConfig(), Options{Catalog: cat, Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	ctx := context.Background()
	for range 3 {
		if _, err := srv.environment(ctx, "a"); err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("a: %v, want the listing's failure", err)
		}
		if _, err := srv.list(ctx); err == nil || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("list: %v, want its failure", err)
		}
	}
	if n := cat.lists.Load(); n != 1 {
		t.Fatalf("six asks listed the catalog %d times, want 1", n)
	}
	expire := func() {
		srv.mu.Lock()
		srv.listFailed.until = time.Now().Add(-time.Second)
		srv.mu.Unlock()
	}
	expire()
	if _, err := srv.environment(ctx, "a"); err == nil {
		t.Fatal("a, the listing failing again: no error")
	}
	if n := cat.lists.Load(); n != 2 {
		t.Fatalf("listed %d times after the entry expired, want 2", n)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 2 {
		t.Errorf("logged %d errors for two listings that failed, want 2:\n%s", n, logs.String())
	}
	cat.ok.Store(true)
	expire()
	if _, err := srv.environment(ctx, "a"); err != nil {
		t.Fatalf("a once the catalog lists: %v", err)
	}
	if srv.listFailed != nil {
		t.Error("a listing that succeeded left the failure kept")
	}
}

// blockListCatalog is gateCatalog whose List blocks until release is
// closed, as a slow registry query does.
type blockListCatalog struct {
	gateCatalog
	started chan struct{} // receives when a List has begun
	release chan struct{}
}

func (c *blockListCatalog) List(ctx context.Context) ([]Entry, error) {
	c.started <- struct{}{}
	select {
	case <-c.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return c.gateCatalog.List(ctx)
}

// TestConcurrentListingsShareOneCall: listings asked for while one is
// running (a trainer fleet discovering environments at once) share its
// catalog call, and a caller that goes away does not fail the others.
func TestConcurrentListingsShareOneCall(t *testing.T) {
	cat := &blockListCatalog{gateCatalog: gateCatalog{ids: []string{"a", "b"}}, started: make(chan struct{}, 16), release: make(chan struct{})}
	srv, err := New(DefaultConfig(), Options{Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	const callers = 8
	type result struct {
		entries []Entry
		err     error
	}
	results := make(chan result, callers)
	gone, leave := context.WithCancel(context.Background())
	go func() { // the first caller, who goes away while the call runs
		_, err := srv.list(gone)
		results <- result{err: err}
	}()
	<-cat.started
	var asking sync.WaitGroup
	for range callers - 1 {
		asking.Add(1)
		go func() {
			asking.Done()
			e, err := srv.list(context.Background())
			results <- result{e, err}
		}()
	}
	leave()
	if r := <-results; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the caller that went away: %v, want its cancellation", r.err)
	}
	asking.Wait()
	time.Sleep(100 * time.Millisecond) // each is in list, waiting on the running call
	select {
	case <-cat.started:
		t.Fatal("a second catalog listing began while one was running")
	default:
	}
	close(cat.release)
	for range callers - 1 {
		r := <-results
		if r.err != nil || len(r.entries) != 2 || r.entries[0].ID != "a" {
			t.Fatalf("a listing: %+v, %v", r.entries, r.err)
		}
	}
	if n := cat.lists.Load(); n != 1 {
		t.Fatalf("%d catalog listings for %d concurrent callers, want 1", n, callers)
	}
	// A listing after the shared one asks the catalog again.
	go func() { <-cat.started }()
	if _, err := srv.list(context.Background()); err != nil || cat.lists.Load() != 2 {
		t.Fatalf("a later listing: %v, %d catalog listings", err, cat.lists.Load())
	}
}
