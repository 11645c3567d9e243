package router_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/router"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// TestRetrievalShowsMostSimilarSuccess: with retrieval on, each candidate
// is shown with its stored successful trajectory (labeled PRESENT) whose
// first user turn is most similar to the conversation; failed or NA
// rollouts are never shown; trajectories are embedded once per TTL.
func TestRetrievalShowsMostSimilarSuccess(t *testing.T) {
	st := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	end := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	var rows []sink.RolloutRow
	var labels []sink.LabelRow
	add := func(id, capability, user string, ok bool, label string) {
		reward := 0.0
		if ok {
			reward = 1
		}
		r := &schemas.Rollout{RolloutID: id, Environment: env, Agent: schemas.Agent{Name: "a", Version: "1.0"}, TaskID: "t",
			StartTime: end.Add(-time.Minute), EndTime: end, Outcome: schemas.Outcome{Reward: reward},
			Messages: []schemas.Message{{Role: "system", Content: "policy"}, {Role: "user", Content: user}, {Role: "assistant", Content: "done: " + id}}}
		rows = append(rows, sink.RolloutRowFrom(r, sink.Coord{Topic: "t", Offset: int64(len(rows))}))
		labels = append(labels, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: id, Environment: env, AgentVersion: "1.0",
			DictionaryVersion: 1, Capability: capability, Label: label, Success: ok, Reward: reward, Source: "rules", TS: end}})
	}
	add("r-bag", "baggage_policy", "how many checked bags are included in my fare", true, "PRESENT")
	add("r-pet", "baggage_policy", "can I travel with my dog in the cabin", true, "PRESENT")
	add("r-bag-failed", "baggage_policy", "how many checked bags bags bags are included", false, "PRESENT")
	add("r-id", "id_verification", "change the name on my reservation please", true, "PRESENT")
	add("r-id-na", "id_verification", "how many checked bags are included in my fare", true, "NA")
	if err := st.InsertRollouts(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertLabels(ctx, labels); err != nil {
		t.Fatal(err)
	}

	up := llmtest.New(t)
	up.Handle(func(llmtest.Request) llmtest.Reply {
		return llmtest.Classification(map[string]float64{"A": 0.7, "C": 0.3})
	})
	client, err := llm.New(llm.Config{BaseURL: up.URL, Model: baseModel})
	if err != nil {
		t.Fatal(err)
	}
	ret := &router.Retriever{Embedder: client, Model: "embed-model", Source: st}
	r, err := router.New(router.Config{BaseModel: baseModel, Retriever: ret}, client,
		staticAdapters{{Adapter: "lora-bag", Capability: "baggage_policy"}, {Adapter: "lora-id", Capability: "id_verification"},
			{Adapter: "lora-refund", Capability: "refund_policy"}})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := r.Route(ctx, router.Input{ConversationID: "c1", Environment: env,
		Turns: []router.Turn{{Role: "user", Text: "How many checked bags does my fare include?"}}})
	if d.Examples["baggage_policy"] != "r-bag" || d.Examples["id_verification"] != "r-id" || d.Adapter != "lora-bag" {
		t.Fatalf("examples %v, adapter %q", d.Examples, d.Adapter)
	}
	prompt := up.Requests()[0].Chat.Prompt()
	if !strings.Contains(prompt, "Example of a request this skill handled well: user: how many checked bags are included in my fare | assistant: done: r-bag") ||
		strings.Contains(prompt, "r-bag-failed") || strings.Contains(prompt, "r-pet") {
		t.Fatalf("prompt:\n%s", prompt)
	}
	// trajectories of 2 capabilities + the conversation
	if n := up.EmbeddingRequests(); n != 3 {
		t.Fatalf("%d embedding requests, want 3", n)
	}
	r.Route(ctx, router.Input{ConversationID: "c2", Environment: env, Turns: []router.Turn{{Role: "user", Text: "can my dog come along"}}})
	if n := up.EmbeddingRequests(); n != 4 {
		t.Fatalf("%d embedding requests after a second conversation, want 4 (trajectories kept)", n)
	}
	if p := up.Requests()[1].Chat.Prompt(); !strings.Contains(p, "done: r-pet") {
		t.Fatalf("second prompt lacks the most similar trajectory r-pet:\n%s", p)
	}
}

// TestRetrievalHangingEmbedderLeavesTheClassifierItsTime: an embeddings
// endpoint that does not answer leaves the candidates without examples,
// and the decision is still classified. The route role's decision deadline
// adds one embeddings call (its attempts) to the classifier's, so the
// retrieval as a whole must keep within that: each candidate whose
// trajectories are not embedded yet made a call of its own, and three of
// them outlasted the deadline (classifier_error, after twice the
// deadline's embeddings share).
func TestRetrievalHangingEmbedderLeavesTheClassifierItsTime(t *testing.T) {
	st := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	end := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	var rows []sink.RolloutRow
	var labels []sink.LabelRow
	for i, capability := range []string{"baggage_policy", "id_verification", "refund_policy"} {
		id := "r-" + capability
		r := &schemas.Rollout{RolloutID: id, Environment: env, Agent: schemas.Agent{Name: "a", Version: "1.0"}, TaskID: "t",
			StartTime: end.Add(-time.Minute), EndTime: end, Outcome: schemas.Outcome{Reward: 1},
			Messages: []schemas.Message{{Role: "user", Content: "question about " + capability}, {Role: "assistant", Content: "done"}}}
		rows = append(rows, sink.RolloutRowFrom(r, sink.Coord{Topic: "t", Offset: int64(i)}))
		labels = append(labels, sink.LabelRow{LabelEvent: schemas.LabelEvent{RolloutID: id, Environment: env, AgentVersion: "1.0",
			DictionaryVersion: 1, Capability: capability, Label: "PRESENT", Success: true, Reward: 1, Source: "rules", TS: end}})
	}
	if err := st.InsertRollouts(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertLabels(ctx, labels); err != nil {
		t.Fatal(err)
	}

	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // then a client that gives up is seen
		<-r.Context().Done()
	}))
	t.Cleanup(hang.Close)
	const attempt = 300 * time.Millisecond
	emb, err := llm.New(llm.Config{BaseURL: hang.URL + "/v1", Model: "embed-model", Timeout: attempt, MaxAttempts: 2,
		BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	up := llmtest.New(t)
	up.Handle(func(llmtest.Request) llmtest.Reply {
		return llmtest.Classification(map[string]float64{"A": 0.9, "D": 0.1})
	})
	cls, err := llm.New(llm.Config{BaseURL: up.URL, Model: baseModel, Timeout: attempt, MaxAttempts: 2,
		BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// As the route role derives them: one call is its attempts and the waits between them.
	call := 2*attempt + 10*time.Millisecond
	ret := &router.Retriever{Embedder: emb, Source: st, Timeout: call}
	r, err := router.New(router.Config{BaseModel: baseModel, Retriever: ret, ClassifierAttempts: 2, DecisionTimeout: 2 * call}, cls,
		staticAdapters{{Adapter: "lora-bag", Capability: "baggage_policy"}, {Adapter: "lora-id", Capability: "id_verification"},
			{Adapter: "lora-refund", Capability: "refund_policy"}})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := r.Route(ctx, router.Input{ConversationID: "c1", Environment: env, Turns: []router.Turn{{Role: "user", Text: "my bags"}}})
	if d.Reason != router.ReasonClassified || d.Adapter != "lora-bag" || len(d.Examples) != 0 {
		t.Fatalf("decision %s (%s), adapter %q, examples %v; want classified, lora-bag, no examples", d.Reason, d.Error, d.Adapter, d.Examples)
	}
}
