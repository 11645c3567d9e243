package envserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer/envclient"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/envserver"
	"github.com/traceops/trace/synthesizer/openenv"
)

type episodeRow struct {
	Env, Session, Episode, Transport, Reason, Components, Hash string
	Seed                                                       int64
	Steps                                                      uint32
	Reward                                                     float64
	Hinted                                                     uint8
	Started, Ended                                             time.Time
}

func readEpisodes(t testing.TB, st *sink.Store, want int) []episodeRow {
	t.Helper()
	ctx := context.Background()
	var rows []episodeRow
	deadline := time.Now().Add(20 * time.Second)
	for {
		rows = rows[:0]
		r, err := testenv.StoreConn(t, st).Query(ctx, `SELECT environment_id, session_id, episode_id, transport, done_reason, components, program_hash,
	seed, steps, reward, hinted, started_at, ended_at FROM env_episodes FINAL ORDER BY seed, episode_id`)
		if err != nil {
			t.Fatal(err)
		}
		for r.Next() {
			var e episodeRow
			if err := r.Scan(&e.Env, &e.Session, &e.Episode, &e.Transport, &e.Reason, &e.Components, &e.Hash,
				&e.Seed, &e.Steps, &e.Reward, &e.Hinted, &e.Started, &e.Ended); err != nil {
				t.Fatal(err)
			}
			rows = append(rows, e)
		}
		r.Close()
		if len(rows) >= want || time.Now().After(deadline) {
			return rows
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRecordEpisodes: episodes finished through WebSocket and HTTP sessions
// land in ClickHouse env_episodes with the seed, the turns, and the reward
// and components the program computes in-process; an abandoned episode
// is not recorded.
func TestRecordEpisodes(t *testing.T) {
	st := testenv.ClickHouse(t).Store()
	f := start(t, testConfig(), st, nil)
	ctx := ctxT(t)
	c := f.client("")
	want := map[int64]localPlay{}
	episodes := map[int64]string{}
	for _, seed := range []int64{11, 12} {
		lp := playLocal(t, seed)
		want[seed] = lp
		s, err := c.Dial(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seed := seed
		obs, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed, Hint: seed == 12})
		if err != nil {
			t.Fatal(err)
		}
		episodes[seed] = obs.Observation.EpisodeID
		for _, a := range lp.actions {
			if _, err := s.Step(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		// An abandoned episode after it: never recorded.
		other := seed + 100
		s.Reset(ctx, openenv.ResetRequest{Seed: &other})
		s.Close()
	}
	seed := int64(13)
	lp := playLocal(t, seed)
	want[seed] = lp
	sid, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eid := "trainer-chosen-episode-13"
	if _, err := c.Reset(ctx, openenv.ResetRequest{Seed: &seed, SessionID: sid, EpisodeID: &eid}); err != nil {
		t.Fatal(err)
	}
	episodes[seed] = eid
	for _, a := range lp.actions {
		if _, err := c.Step(ctx, sid, nil, a); err != nil {
			t.Fatal(err)
		}
	}
	rows := readEpisodes(t, st, 3)
	if len(rows) != 3 {
		t.Fatalf("%d env_episodes rows, want 3: %+v", len(rows), rows)
	}
	for _, r := range rows {
		lp := want[r.Seed]
		var comps map[string]float64
		if err := json.Unmarshal([]byte(r.Components), &comps); err != nil {
			t.Fatalf("components %q: %v", r.Components, err)
		}
		transport := "ws"
		if r.Seed == 13 {
			transport = "http"
		}
		if r.Env != exampleID || r.Episode != episodes[r.Seed] || r.Steps != uint32(len(lp.actions)) || r.Reward != lp.reward.Value ||
			!reflect.DeepEqual(comps, lp.reward.Components) || r.Transport != transport || r.Reason != "final" ||
			r.Hash == "" || r.Session == "" || (r.Hinted == 1) != (r.Seed == 12) || r.Ended.Before(r.Started) {
			t.Errorf("row %+v, want reward %v components %v steps %d transport %s", r, lp.reward.Value, lp.reward.Components, len(lp.actions), transport)
		}
	}
	if got := counter(t, f, "trace_env_episode_reward", map[string]string{"environment": exampleID}); got != 3 {
		t.Errorf("reward histogram count %v, want 3", got)
	}
	waitFor(t, "recorded counter", func() bool { return counter(t, f, "trace_env_episodes_recorded_total", nil) == 3 })
}

// TestRecordSampling: at rate 0.5 exactly the episodes whose id hashes
// below it are recorded.
func TestRecordSampling(t *testing.T) {
	st := testenv.ClickHouse(t).Store()
	cfg := testConfig()
	cfg.RecordSample = 0.5
	f := start(t, cfg, st, nil)
	ctx := ctxT(t)
	c := f.client("")
	var sampled []string
	for i := range 40 {
		seed := int64(i)
		// A stateless step whose action is the final answer: one episode.
		obs, err := c.Step(ctx, "", &seed, openenv.ChatMessage{Role: "assistant", Content: "I cannot help with that."})
		if err != nil || !obs.Done {
			t.Fatalf("%+v, %v", obs, err)
		}
		if envserver.Sampled(obs.Observation.EpisodeID, 0.5) {
			sampled = append(sampled, obs.Observation.EpisodeID)
		}
	}
	if len(sampled) < 8 || len(sampled) > 32 {
		t.Fatalf("%d of 40 sampled at 0.5", len(sampled))
	}
	rows := readEpisodes(t, st, len(sampled))
	var got []string
	for _, r := range rows {
		got = append(got, r.Episode)
	}
	sort.Strings(got)
	sort.Strings(sampled)
	// Give a late extra row the chance to show up before comparing.
	time.Sleep(200 * time.Millisecond)
	if rows = readEpisodes(t, st, len(sampled)); len(rows) != len(sampled) || fmt.Sprint(got) != fmt.Sprint(sampled) {
		t.Fatalf("recorded %v, want %v", got, sampled)
	}
}

// TestRecordQueuedAtShutdown: episodes still queued when the server shuts
// down reach ClickHouse before Close returns (the serve role closes the
// store right after), even with a WebSocket peer that never answers the
// close handshake and a shutdown context shorter than coder/websocket's
// wait for it: sessions end all at once within that context, and the
// recorder's drain has a budget of its own.
func TestRecordQueuedAtShutdown(t *testing.T) {
	ch := testenv.ClickHouse(t)
	read := ch.Store()
	w := ch.Store() // the server's, closed as the serve role closes it
	cfg := testConfig()
	cfg.RecordFlush = time.Hour // nothing is written before the shutdown
	cat := envserver.NewStaticCatalog()
	if err := cat.Add(exampleID, loadExample(t), envserver.Entry{}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := envserver.New(cfg, envserver.Options{Catalog: cat, Writer: w, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	f := &fixture{srv: srv, http: hs, reg: reg, base: hs.URL + "/v1/environments/" + exampleID}
	ctx := ctxT(t)
	c := f.client("")
	var episodes []string
	for _, seed := range []int64{21, 22} {
		obs, err := c.Step(ctx, "", &seed, openenv.ChatMessage{Role: "assistant", Content: "I cannot help with that."})
		if err != nil || !obs.Done {
			t.Fatalf("%+v, %v", obs, err)
		}
		episodes = append(episodes, obs.Observation.EpisodeID)
	}
	if got := counter(t, f, "trace_env_episodes_recorded_total", nil); got != 0 {
		t.Fatalf("%v episodes written before the shutdown, want them all waiting", got)
	}
	// A peer that never reads, so never answers the close handshake.
	deaf, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(f.base, "http")+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer deaf.CloseNow()
	waitFor(t, "the WebSocket session", func() bool { return counter(t, f, "trace_env_sessions_open", nil) == 1 })

	closed := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		closed <- srv.Close(sctx)
	}()
	select {
	case err := <-closed:
		t.Logf("Close: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("Close did not return")
	}
	w.Close()
	rows := readEpisodes(t, read, 2)
	var got []string
	for _, r := range rows {
		got = append(got, r.Episode)
	}
	sort.Strings(got)
	sort.Strings(episodes)
	if fmt.Sprint(got) != fmt.Sprint(episodes) {
		t.Fatalf("recorded %v, want %v", got, episodes)
	}
	if n := counter(t, f, "trace_env_episodes_dropped_total", nil); n != 0 {
		t.Fatalf("%v episodes dropped", n)
	}
}

// TestRecordDoneReasons: every finished episode is recorded with why it
// ended: the server's step timeout and the program's own call timeout
// ("timeout"), a program error ("error"), the turn limit ("max_turns"),
// and the final answer ("final"); those that ended without a reward
// have reward 0 and no components. The observation says the same.
func TestRecordDoneReasons(t *testing.T) {
	st := testenv.ClickHouse(t).Store()
	cfg := testConfig()
	cfg.StepTimeout = 300 * time.Millisecond
	src, err := os.ReadFile("testdata/spin.star")
	if err != nil {
		t.Fatal(err)
	}
	load := func(lim envprog.Limits) envprog.Env {
		env, err := envprog.Load(context.Background(), "spin.star", src, lim)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { env.Close() })
		return env
	}
	cat := envserver.NewStaticCatalog()
	for id, c := range map[string]struct {
		lim envprog.Limits
		e   envserver.Entry
	}{
		// The server's step timeout stops it (the program's are an hour away).
		"spin": {envprog.Limits{MaxSteps: 1 << 62, CallTimeout: time.Hour}, envserver.Entry{}},
		// Its own call timeout, below the server's.
		"spin-calltimeout": {envprog.Limits{MaxSteps: 1 << 62, CallTimeout: 50 * time.Millisecond}, envserver.Entry{}},
		// Its step budget: a program error.
		"spin-steps": {envprog.Limits{MaxSteps: 10000}, envserver.Entry{}},
		// One turn at most.
		"spin-1turn": {envprog.Limits{MaxTurns: 1}, envserver.Entry{MaxTurns: 1}},
	} {
		if err := cat.Add(id, load(c.lim), c.e); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := envserver.New(cfg, envserver.Options{Catalog: cat, Writer: st})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		srv.Close(context.Background())
	})
	ctx := ctxT(t)
	spin := func(n int64) openenv.ChatMessage {
		return openenv.ChatMessage{Role: "assistant", ToolCalls: []openenv.ChatToolCall{{ID: "s", Type: "function",
			Function: openenv.ChatFunction{Name: "spin", Arguments: `{"n": ` + jsonInt(n) + `}`}}}}
	}
	type want struct {
		reason string
		steps  uint32
		reward float64
	}
	wants := map[int64]want{}
	play := func(id string, seed int64, actions []openenv.ChatMessage, w want) {
		t.Helper()
		c := envclient.New(hs.URL+"/v1/environments/"+id, "")
		s, err := c.Dial(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
			t.Fatal(err)
		}
		var obs openenv.StepResponse
		for _, a := range actions {
			if obs, err = s.Step(ctx, a); err != nil {
				break
			}
		}
		switch w.reason {
		case "timeout", "error":
			if !isCode(err, openenv.CodeExecution) {
				t.Fatalf("%s: %v, want EXECUTION_ERROR", id, err)
			}
		default:
			if err != nil || !obs.Done || obs.Observation.DoneReason != w.reason {
				t.Fatalf("%s: %+v, %v, want done_reason %s", id, obs, err, w.reason)
			}
		}
		wants[seed] = w
	}
	play("spin", 1, []openenv.ChatMessage{spin(1 << 50)}, want{"timeout", 0, 0})
	play("spin-calltimeout", 2, []openenv.ChatMessage{spin(1 << 50)}, want{"timeout", 0, 0})
	play("spin-steps", 3, []openenv.ChatMessage{spin(1 << 40)}, want{"error", 0, 0})
	play("spin-1turn", 4, []openenv.ChatMessage{spin(4)}, want{"max_turns", 1, 1})
	play("spin-1turn", 5, []openenv.ChatMessage{{Role: "assistant", Content: "none"}}, want{"final", 1, 0})
	rows := readEpisodes(t, st, len(wants))
	if len(rows) != len(wants) {
		t.Fatalf("%d rows, want %d: %+v", len(rows), len(wants), rows)
	}
	for _, r := range rows {
		w := wants[r.Seed]
		if r.Reason != w.reason || r.Steps != w.steps || r.Reward != w.reward {
			t.Errorf("seed %d: recorded %s, %d steps, reward %v; want %s, %d, %v", r.Seed, r.Reason, r.Steps, r.Reward, w.reason, w.steps, w.reward)
		}
		if (w.reason == "timeout" || w.reason == "error") && r.Components != "{}" {
			t.Errorf("seed %d: components %s of an episode without a reward", r.Seed, r.Components)
		}
	}
}
