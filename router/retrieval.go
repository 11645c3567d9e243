package router

import (
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/sink"
)

// Retrieval (TRACE's variant): each candidate capability is shown to the
// classifier with its most similar successful trajectory — the stored
// successful rollout labeled PRESENT for it whose first user turn is
// closest (cosine of embeddings from an OpenAI /embeddings endpoint) to the
// conversation's context. Off unless a Retriever is configured.

// Embedder is an OpenAI-compatible embeddings endpoint (*llm.Client).
type Embedder interface {
	Embed(ctx context.Context, req llm.EmbeddingsRequest) ([][]float64, error)
}

// TrajectorySource lists an environment's successful trajectories of a
// capability, newest first (*sink.Store).
type TrajectorySource interface {
	SuccessfulTrajectories(ctx context.Context, environment, capability string, limit int) ([]sink.Trajectory, error)
}

// Retriever finds each candidate's example trajectory. Safe for
// concurrent use. The candidates' trajectories and their embeddings are
// kept per (environment, capability) for TTL; only the conversation's
// context is embedded per classification. Any failure leaves the
// capability without an example (logged), never fails a decision.
type Retriever struct {
	Embedder Embedder
	// Model is the embedding model ("" = the embedder's configured model).
	Model   string
	Source  TrajectorySource
	Pool    int           // trajectories considered per capability (default 50)
	TTL     time.Duration // default 10m
	MaxText int           // characters of an example shown (default 600)
	// Timeout bounds one classification's retrieval as a whole (0: the
	// caller's deadline only). Each capability whose trajectories are not
	// embedded yet makes a call of its own, so without it an embeddings
	// endpoint that does not answer takes one call's time per capability
	// out of the decision's deadline, the classifier's share included.
	// The route role sets it to the embeddings call's share of the deadline.
	Timeout time.Duration
	Log     *slog.Logger

	mu    sync.Mutex
	cache map[string]retrievalEntry
}

type retrievalEntry struct {
	items []retrievalItem
	at    time.Time
}

type retrievalItem struct {
	rolloutID, text string
	vec             []float64
}

// Example is a candidate's most similar successful trajectory.
type Example struct {
	RolloutID  string
	Text       string
	Similarity float64
}

// Examples returns the best example per capability (absent when none).
func (r *Retriever) Examples(ctx context.Context, environment string, capabilities []string, turns []Turn) map[string]Example {
	out := map[string]Example{}
	if r.Timeout > 0 {
		var cancel func()
		ctx, cancel = context.WithTimeout(ctx, r.Timeout)
		defer cancel()
	}
	var q strings.Builder
	for _, t := range turns {
		q.WriteString(t.Text)
		q.WriteByte('\n')
	}
	var qvec []float64
	for _, c := range capabilities {
		items := r.items(ctx, environment, c)
		if len(items) == 0 {
			continue
		}
		if qvec == nil {
			vs, err := r.Embedder.Embed(ctx, llm.EmbeddingsRequest{Purpose: "route_retrieval", Model: r.Model, Input: []string{q.String()}})
			if err != nil || len(vs) != 1 {
				r.log().Warn("router retrieval: embedding the conversation failed; no examples", "err", err)
				return out
			}
			qvec = vs[0]
		}
		best, bestSim := -1, math.Inf(-1)
		for i, it := range items {
			if s := cosine(qvec, it.vec); s > bestSim {
				best, bestSim = i, s
			}
		}
		if best >= 0 {
			out[c] = Example{RolloutID: items[best].rolloutID, Text: items[best].text, Similarity: bestSim}
		}
	}
	return out
}

func (r *Retriever) log() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

func (r *Retriever) items(ctx context.Context, env, capability string) []retrievalItem {
	ttl := r.TTL
	if ttl <= 0 {
		ttl = 10 * time.Minute
	}
	key := env + "\x00" + capability
	r.mu.Lock()
	e, ok := r.cache[key]
	r.mu.Unlock()
	if ok && time.Since(e.at) < ttl {
		return e.items
	}
	pool := r.Pool
	if pool <= 0 {
		pool = 50
	}
	trs, err := r.Source.SuccessfulTrajectories(ctx, env, capability, pool)
	if err != nil {
		r.log().Warn("router retrieval: reading trajectories failed", "environment", env, "capability", capability, "err", err)
		return e.items // the last list, if any
	}
	var items []retrievalItem
	var inputs []string
	maxText := r.MaxText
	if maxText <= 0 {
		maxText = 600
	}
	for _, t := range trs {
		first, text := RenderTrajectory(t.Messages, maxText)
		if first == "" {
			continue
		}
		items = append(items, retrievalItem{rolloutID: t.RolloutID, text: text})
		inputs = append(inputs, first)
	}
	if len(items) > 0 {
		vs, err := r.Embedder.Embed(ctx, llm.EmbeddingsRequest{Purpose: "route_retrieval", Model: r.Model, Input: inputs})
		if err != nil || len(vs) != len(items) {
			r.log().Warn("router retrieval: embedding trajectories failed", "environment", env, "capability", capability, "err", err)
			return e.items
		}
		for i := range items {
			items[i].vec = vs[i]
		}
	}
	r.mu.Lock()
	if r.cache == nil {
		r.cache = map[string]retrievalEntry{}
	}
	r.cache[key] = retrievalEntry{items: items, at: time.Now()}
	r.mu.Unlock()
	return items
}

// RenderTrajectory reads a stored rollout's compacted messages and returns
// its first user turn (what is embedded) and a one-line-per-message
// rendering cut to maxChars (what the classifier is shown).
func RenderTrajectory(messagesJSON string, maxChars int) (firstUser, text string) {
	var msgs []sink.CompactMessage
	if json.Unmarshal([]byte(messagesJSON), &msgs) != nil {
		return "", ""
	}
	var b strings.Builder
	for _, m := range msgs {
		if m.Role == "system" {
			continue
		}
		if firstUser == "" && m.Role == "user" {
			firstUser = m.Content
		}
		line := m.Role + ": " + strings.Join(strings.Fields(m.Content), " ")
		for _, tc := range m.ToolCalls {
			line += " → " + tc.Name + "(" + tc.Arguments + ")"
		}
		if b.Len() > 0 {
			b.WriteString(" | ")
		}
		b.WriteString(line)
	}
	return firstUser, cutText(b.String(), maxChars)
}

func cosine(a, b []float64) float64 {
	if len(a) != len(b) || len(a) == 0 {
		return math.Inf(-1)
	}
	var dot, na, nb float64
	for i := range a {
		dot += a[i] * b[i]
		na += a[i] * a[i]
		nb += b[i] * b[i]
	}
	if na == 0 || nb == 0 {
		return 0
	}
	return dot / math.Sqrt(na*nb)
}
