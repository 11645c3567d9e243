package sink

import (
	"context"
	"fmt"
	"time"
)

// EnvEpisodeRow is one episode played through the environment server
// (synthesizer/envserver): its environment, session, seed, assistant turns,
// reward and the reward's named components as JSON text.
type EnvEpisodeRow struct {
	EnvironmentID, ProgramHash string
	SessionID, EpisodeID       string
	Transport                  string // ws | http | mcp
	Seed                       int64
	Hinted                     bool
	Steps                      uint32
	DoneReason                 string // final | environment | max_turns | timeout | error
	Reward                     float64
	Components                 string // {"name": value, ...}
	StartedAt, EndedAt         time.Time
}

// InsertEnvEpisodes writes episode rows in one INSERT. A nil error means
// they are durable; a retried batch replaces itself (ReplacingMergeTree on
// environment, end, session and episode).
func (s *Store) InsertEnvEpisodes(ctx context.Context, rows []EnvEpisodeRow) error {
	if len(rows) == 0 {
		return nil
	}
	b, err := s.conn.PrepareBatch(ctx, `INSERT INTO env_episodes (environment_id, program_hash, session_id, episode_id,
	transport, seed, hinted, steps, done_reason, reward, components, started_at, ended_at, duration_ms)`)
	if err != nil {
		return fmt.Errorf("insert env_episodes: %w", err)
	}
	defer b.Abort()
	now := time.Now().UTC()
	for _, r := range rows {
		start, end := ts(r.StartedAt, now), ts(r.EndedAt, now)
		ms := end.Sub(start).Milliseconds()
		if ms < 0 {
			ms = 0
		}
		if err := b.Append(r.EnvironmentID, r.ProgramHash, r.SessionID, r.EpisodeID, r.Transport, r.Seed, b2u(r.Hinted),
			r.Steps, r.DoneReason, r.Reward, r.Components, start, end, uint32(min(ms, 1<<32-1))); err != nil {
			return fmt.Errorf("insert env_episodes: append %s: %w", r.EpisodeID, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert env_episodes: %w", err)
	}
	return nil
}
