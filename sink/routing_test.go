package sink_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/sink"
)

// TestRouteDecisions: decisions round-trip with their arrays, filters
// select, the per-conversation join finds the latest decision, and the
// hourly shares count requests per adapter.
func TestRouteDecisions(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	at := time.Now().UTC().Truncate(time.Hour).Add(-2 * time.Hour)
	row := func(req, dec, conv, adapter string, off time.Duration, cached bool) sink.RouteDecisionRow {
		return sink.RouteDecisionRow{At: at.Add(off), RequestID: req, DecisionID: dec, ConversationID: conv, ConversationSource: "header",
			Environment: "sim-airline", AgentVersion: "1.4.0", Endpoint: "proxy", Cached: cached, Adapter: adapter, Capability: "cap-" + adapter,
			Model: adapter, Label: "A", Labels: []string{"A", "B"}, LabelCapabilities: []string{"cap-a1", "none"}, LabelAdapters: []string{"a1", ""},
			Probabilities: []float64{0.75, 0.25}, WeightAdapters: []string{"a1"}, Weights: []float64{1}, Reason: "classified",
			ClassifierModel: "base", ClassifyMS: 12, OverheadUS: 150, UpstreamStatus: 200, Outcome: "ok", Stream: true}
	}
	rows := []sink.RouteDecisionRow{
		row("r1", "d1", "c1", "a1", 0, false), row("r2", "d1", "c1", "a1", time.Second, true),
		row("r3", "d2", "c2", "", 90*time.Minute, false),
	}
	rows[2].Labels, rows[2].LabelCapabilities, rows[2].LabelAdapters, rows[2].Probabilities, rows[2].WeightAdapters, rows[2].Weights = nil, nil, nil, nil, nil, nil
	rows[2].Reason, rows[2].Outcome, rows[2].UpstreamStatus, rows[2].Stream = "no_logprobs", "stream_error", 200, false
	rows[0].Usage, rows[0].PromptTokens, rows[0].CompletionTokens = true, 1200, 34 // the usage of r1 alone
	rows[1].PromptTokens = 99                                                      // not reported (Usage false): NULL
	// The batch lands twice, as after a retry whose first answer was lost:
	// every read still counts each request once.
	for range 2 {
		if err := s.InsertRouteDecisions(ctx, rows); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.RouteDecisions(ctx, sink.RouteDecisionFilter{Environment: "sim-airline"})
	if err != nil || len(got) != 3 {
		t.Fatalf("RouteDecisions = %d rows, %v", len(got), err)
	}
	if g := got[0]; g.RequestID != "r1" || g.Cached || !g.Stream || !slices.Equal(g.Labels, []string{"A", "B"}) || !slices.Equal(g.Probabilities, []float64{0.75, 0.25}) ||
		!slices.Equal(g.LabelAdapters, []string{"a1", ""}) || g.OverheadUS != 150 || !g.At.Equal(at) ||
		!g.Usage || g.PromptTokens != 1200 || g.CompletionTokens != 34 {
		t.Fatalf("first decision %+v", g)
	}
	if g := got[1]; g.Usage || g.PromptTokens != 0 || g.CompletionTokens != 0 {
		t.Fatalf("second decision's usage %v %d/%d, want none (NULL)", g.Usage, g.PromptTokens, g.CompletionTokens)
	}
	if g := got[2]; g.Adapter != "" || len(g.Probabilities) != 0 || g.Reason != "no_logprobs" || g.Outcome != "stream_error" {
		t.Fatalf("third decision %+v", g)
	}
	if got, _ := s.RouteDecisions(ctx, sink.RouteDecisionFilter{DecisionID: "d1", Limit: 1}); len(got) != 1 || got[0].RequestID != "r1" {
		t.Fatalf("by decision id: %+v", got)
	}
	// Tokens per day and adapter: r1's usage once (its row landed twice);
	// r2 (cached, no usage) counts as a request without one.
	usage, err := s.TokenUsage(ctx, "sim-airline", at.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var days []string
	for _, u := range usage {
		days = append(days, fmt.Sprintf("%s %q %d %d %d %d", u.Day.Format(time.DateOnly), u.Adapter, u.Requests, u.WithUsage, u.PromptTokens, u.CompletionTokens))
	}
	d0, d2 := at.Format(time.DateOnly), at.Add(90*time.Minute).Format(time.DateOnly)
	want := []string{fmt.Sprintf(`%s "a1" 2 1 1200 34`, d0), fmt.Sprintf(`%s "" 1 0 0 0`, d2)}
	if d0 == d2 {
		want = []string{fmt.Sprintf(`%s "" 1 0 0 0`, d0), fmt.Sprintf(`%s "a1" 2 1 1200 34`, d0)}
	}
	if !slices.Equal(days, want) {
		t.Fatalf("TokenUsage = %q, want %q", days, want)
	}
	routes := conversationRoutes(t, s, "sim-airline", "c1", "c2", "c3")
	if len(routes) != 2 || routes["c1"] != "d1/a1" || routes["c2"] != "d2/" {
		t.Fatalf("RouteByConversationSQL = %v", routes)
	}
	shares, err := s.RouteShares(ctx, "sim-airline", at.Add(-time.Hour))
	if err != nil || len(shares) != 2 || shares[0].Adapter != "a1" || shares[0].Requests != 2 || shares[1].Adapter != "" || shares[1].Requests != 1 ||
		!shares[1].Hour.Equal(at.Add(time.Hour)) {
		t.Fatalf("RouteShares = %+v, %v", shares, err)
	}
	// A later decision without a conversation, and a later one of
	// conversation c2 in another environment: neither is a route of
	// sim-airline's conversations.
	extra := []sink.RouteDecisionRow{row("r4", "d4", "", "a1", 100*time.Minute, false), row("r5", "d5", "c2", "a9", 110*time.Minute, false)}
	extra[1].Environment = "sim-retail"
	if err := s.InsertRouteDecisions(ctx, extra); err != nil {
		t.Fatal(err)
	}
	routes = conversationRoutes(t, s, "sim-airline", "", "c2")
	if len(routes) != 1 || routes["c2"] != "d2/" {
		t.Fatalf("RouteByConversationSQL with another environment's decision and a decision without a conversation = %v", routes)
	}
}

// conversationRoutes reads RouteByConversationSQL, the latest decision of
// each of an environment's conversations (the guard's join), for ids:
// conversation id -> "decision/adapter".
func conversationRoutes(t *testing.T, s *sink.Store, environment string, ids ...string) map[string]string {
	t.Helper()
	rows, err := testenv.StoreConn(t, s).Query(context.Background(),
		`SELECT conversation_id, decision_id, adapter FROM (`+sink.RouteByConversationSQL+`) WHERE has(?, conversation_id)`, environment, ids)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var conv, dec, adapter string
		if err := rows.Scan(&conv, &dec, &adapter); err != nil {
			t.Fatal(err)
		}
		out[conv] = dec + "/" + adapter
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
