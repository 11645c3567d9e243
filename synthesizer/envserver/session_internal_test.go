package envserver

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/examples"
	"github.com/traceops/trace/synthesizer/openenv"
)

// servedExample serves the example environment on a server of cfg (no
// listener: the tests call the server's methods).
func servedExample(t *testing.T, cfg Config) (*Server, *served) {
	t.Helper()
	env, err := envprog.Load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cat := NewStaticCatalog()
	if err := cat.Add("ex", env, Entry{}); err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, Options{Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	e, err := srv.environment(context.Background(), "ex")
	if err != nil {
		t.Fatal(err)
	}
	return srv, e
}

// TestIdleReaperRace plays the interleavings of a request and the idle
// reaper on one stateful HTTP session, step by step (the reaper is called
// with a clock past the idle timeout instead of waiting for it). A
// request that found the session holds it until it leaves, so the reaper
// passes it by and the request's episode lives on; a session the reaper
// took first is gone for the request (404) and for a WebSocket frame.
func TestIdleReaperRace(t *testing.T) {
	cfg := DefaultConfig()
	cfg.IdleTimeout = time.Hour // the test's reap calls are the only ones
	later := func() time.Time { return time.Now().Add(2 * cfg.IdleTimeout) }
	ctx := context.Background()
	for _, c := range []struct {
		name string
		// steps: "lookup" (a request finds the session and enters it),
		// "reset" (it plays a reset), "leave" (it ends), "reap" (the
		// reaper runs past the idle timeout), "stale" (the session's last
		// activity moves back past the idle timeout, as during a step
		// longer than it).
		steps       []string
		wantFound   bool // the request's lookup found the session
		wantEvicted bool // the session is gone at the end
	}{
		{"request at the timeout, reaper after its lookup", []string{"lookup", "reap", "reset", "leave"}, true, false},
		{"reaper first", []string{"reap", "lookup"}, false, true},
		{"request running longer than the idle timeout", []string{"lookup", "reset", "stale", "reap", "leave"}, true, false},
		{"idle again after the request", []string{"lookup", "reset", "leave", "stale", "reap"}, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, e := servedExample(t, cfg)
			created, perr := e.acquire("http", nil)
			if perr != nil {
				t.Fatal(perr)
			}
			created.lastActive.Store(time.Now().Add(-2 * cfg.IdleTimeout).UnixNano()) // idle since long
			var sess *session
			found := false
			for _, step := range c.steps {
				switch step {
				case "lookup":
					sess = e.lookup(created.id)
					found = sess != nil
				case "reset":
					if sess == nil {
						t.Fatal("reset without a session")
					}
					seed := int64(1)
					if _, perr := use(sess, func() (any, *openenv.Error) { return sess.reset(ctx, openenv.ResetRequest{Seed: &seed}) }); perr != nil {
						t.Fatalf("reset: %v", perr)
					}
				case "leave":
					sess.leave()
				case "stale":
					created.lastActive.Store(time.Now().Add(-2 * cfg.IdleTimeout).UnixNano())
				case "reap":
					e.reap(later())
				}
			}
			if found != c.wantFound {
				t.Fatalf("lookup found the session: %v, want %v", found, c.wantFound)
			}
			evicted := false
			select {
			case <-created.evicted:
				evicted = true
			default:
			}
			e.mu.Lock()
			inMap := e.sessions[created.id] != nil
			e.mu.Unlock()
			if evicted != c.wantEvicted || inMap == c.wantEvicted {
				t.Fatalf("evicted %v (in the map %v), want evicted %v", evicted, inMap, c.wantEvicted)
			}
			if !evicted {
				// The request's episode lives on: the session plays it.
				created.mu.Lock()
				p := created.play
				created.mu.Unlock()
				if found && p == nil {
					t.Fatal("the reset's episode was closed under the request")
				}
				return
			}
			// Gone for every later request and frame.
			if e.lookup(created.id) != nil {
				t.Fatal("an evicted session was found")
			}
			if created.enter() {
				t.Fatal("a frame entered an evicted session")
			}
		})
	}
}

// countingEnv counts its open episodes.
type countingEnv struct {
	envprog.Env
	open *atomic.Int64
}

type countingEpisode struct {
	envprog.Episode
	open *atomic.Int64
}

func (c countingEnv) Reset(ctx context.Context, seed int64) (envprog.Episode, error) {
	ep, err := c.Env.Reset(ctx, seed)
	if err != nil {
		return nil, err
	}
	c.open.Add(1)
	return countingEpisode{ep, c.open}, nil
}

func (c countingEpisode) Close() error {
	c.open.Add(-1)
	return c.Episode.Close()
}

// TestCloseRace closes a stateful HTTP session (openenv/session/close)
// between a request's lookup of it and the request's use of it: the
// request is answered SESSION_ERROR and starts no episode, which nothing
// would ever close (the session has left the map). A close after the
// request's reset closes the reset's episode.
func TestCloseRace(t *testing.T) {
	ctx := context.Background()
	for _, closeFirst := range []bool{true, false} {
		env, err := envprog.Load(ctx, examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		var open atomic.Int64
		cat := NewStaticCatalog()
		if err := cat.Add("ex", countingEnv{env, &open}, Entry{}); err != nil {
			t.Fatal(err)
		}
		srv, err := New(DefaultConfig(), Options{Catalog: cat})
		if err != nil {
			t.Fatal(err)
		}
		e, err := srv.environment(ctx, "ex")
		if err != nil {
			t.Fatal(err)
		}
		created, perr := e.acquire("http", nil)
		if perr != nil {
			t.Fatal(perr)
		}
		sess := e.lookup(created.id) // a POST /reset with X-Session-Id
		if sess == nil {
			t.Fatal("lookup did not find the session")
		}
		closeIt := func() {
			r := srv.mcp(ctx, e, nil, openenv.RPCRequest{JSONRPC: "2.0", Method: openenv.MethodSessionClose, Params: json.RawMessage(`{"session_id":"` + created.id + `"}`)})
			if r.Error != nil {
				t.Fatalf("close: %+v", r.Error)
			}
		}
		if closeFirst {
			closeIt()
		}
		_, perr = use(sess, func() (json.RawMessage, *openenv.Error) { return sess.reset(ctx, openenv.ResetRequest{}) })
		sess.leave()
		if closeFirst {
			if perr == nil || perr.Code != openenv.CodeSession {
				t.Fatalf("reset on a session closed after its lookup: %v, want %s", perr, openenv.CodeSession)
			}
		} else {
			if perr != nil {
				t.Fatalf("reset: %v", perr)
			}
			if n := open.Load(); n != 1 {
				t.Fatalf("%d episodes open after the reset, want 1", n)
			}
			closeIt()
		}
		if n := open.Load(); n != 0 {
			t.Fatalf("close first %v: %d episodes open after the close, want 0", closeFirst, n)
		}
		if n := e.sessionCount(); n != 0 {
			t.Fatalf("close first %v: %d sessions open, want 0", closeFirst, n)
		}
		srv.Close(ctx)
	}
}
