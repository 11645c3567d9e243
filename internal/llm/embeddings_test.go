package llm_test

import (
	"context"
	"testing"

	"github.com/traceops/trace/internal/dev/llmtest"
	"github.com/traceops/trace/internal/llm"
)

// TestEmbed: one vector per input in input order, from /embeddings, with
// an audit row per attempt.
func TestEmbed(t *testing.T) {
	srv := llmtest.New(t)
	c, rec := newClient(t, srv, nil)
	vs, err := c.Embed(context.Background(), llm.EmbeddingsRequest{Purpose: "route_retrieval", Model: "embed", Input: []string{"checked bags", "dog in cabin"}})
	if err != nil {
		t.Fatal(err)
	}
	want0, want1 := llmtest.BagOfWords("checked bags"), llmtest.BagOfWords("dog in cabin")
	if len(vs) != 2 || len(vs[0]) != llmtest.EmbeddingDims || vs[0][0] != want0[0] || vs[1][5] != want1[5] {
		t.Fatalf("vectors %v", vs)
	}
	calls := rec.Drain()
	if len(calls) != 1 || calls[0].Purpose != "route_retrieval" || calls[0].Outcome != llm.OutcomeOK || srv.EmbeddingRequests() != 1 {
		t.Fatalf("audit %+v", calls)
	}
}
