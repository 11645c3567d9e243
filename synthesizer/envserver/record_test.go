package envserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
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
