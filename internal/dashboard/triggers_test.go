package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/sink"
)

// TestSummarizePayload: the Triggers page's summary line of a synthesis
// request, and why a payload of another shape could not be read.
func TestSummarizePayload(t *testing.T) {
	for _, tc := range []struct {
		name, payload string
		want          *payloadSummary
		err           string
	}{
		{"a synthesis request", `{"rank":2,"capability":{"description":"checks before acting","status":"selected"},"example_failed_rollout_ids":["r1","r2"],"fired_at":"2026-12-01T10:00:00Z","tools":[{"function":{"name":"get_user"}},{"function":{"name":"cancel"}}]}`,
			&payloadSummary{Rank: 2, Desc: "checks before acting", Status: "selected", Examples: []string{"r1", "r2"}, FiredAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), Tools: []string{"get_user", "cancel"}}, ""},
		{"fields it does not know", `{"rank":1,"next_version_field":{"x":1}}`, &payloadSummary{Rank: 1}, ""},
		{"a rank of another type", `{"rank":"first"}`, nil, "cannot unmarshal string"},
		{"not JSON", `{"rank":`, nil, "unexpected end of JSON input"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := summarizePayload(json.RawMessage(tc.payload))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || got != nil {
					t.Fatalf("got %+v, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got.Rank != tc.want.Rank || got.Desc != tc.want.Desc || got.Status != tc.want.Status || !got.FiredAt.Equal(tc.want.FiredAt) ||
				strings.Join(got.Examples, ",") != strings.Join(tc.want.Examples, ",") || strings.Join(got.Tools, ",") != strings.Join(tc.want.Tools, ",") {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestTriggersPageShowsUnreadableSummary: a trigger whose payload's summary
// cannot be read says so on its row, beside the payload's JSON.
func TestTriggersPageShowsUnreadableSummary(t *testing.T) {
	row := triggerRow{TriggerEvent: TriggerEvent{TriggerID: "t-1", Event: "fired", Payload: json.RawMessage(`{"rank":"first"}`)}, Pretty: `{"rank": "first"}`}
	_, err := summarizePayload(row.Payload)
	row.Unreadable = err.Error()
	var buf bytes.Buffer
	pg := triggersPage{TriggersResponse: &TriggersResponse{}, Rows: []triggerRow{row}}
	if err := mustParsePages()["triggers"].t.ExecuteTemplate(&buf, "layout", pg); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	if !strings.Contains(html, `class="unreadable"`) || !strings.Contains(html, "summary unreadable: json: cannot unmarshal string") || !strings.Contains(html, "trigger t-1") {
		t.Fatalf("the row does not say its summary is unreadable:\n%s", html[strings.Index(html, "<tbody"):])
	}
}

// TestTriggersLimitKeepsTheNewest: a timeline cut at its limit shows the
// newest transitions (in time order), and its counts are of every
// transition the filter matches, not only those shown.
func TestTriggersLimitKeepsTheNewest(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	var evs []sink.TriggerEvent
	for i, kind := range []string{"fired", "deselected", "reselected", "fired", "deselected"} {
		evs = append(evs, sink.TriggerEvent{TriggerID: fmt.Sprintf("t-%d", i), Environment: "lim", AgentVersion: "v1", DictionaryVersion: 1,
			Capability: fmt.Sprintf("cap_%d", i), Epoch: 1, Event: kind, At: now.Add(-time.Duration(5-i) * time.Hour)})
	}
	if err := st.InsertTriggerEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	h := newHandler(st, now, registry())
	var r TriggersResponse
	getJSON(t, h, "/api/triggers?env=lim&limit=2", &r)
	if !r.Truncated || len(r.Events) != 2 || r.Events[0].TriggerID != "t-3" || r.Events[1].TriggerID != "t-4" {
		t.Fatalf("events %+v (truncated %v), want the newest two, t-3 then t-4", r.Events, r.Truncated)
	}
	if r.Total != 5 || r.Counts["fired"] != 2 || r.Counts["deselected"] != 2 || r.Counts["reselected"] != 1 {
		t.Fatalf("counts %v, total %d; want every event counted", r.Counts, r.Total)
	}
	code, body := getStatus(h, "/triggers?env=lim&limit=2")
	if code != 200 || !strings.Contains(body, "Showing the newest 2 of 5 events") || !strings.Contains(body, "fired (2)") {
		t.Fatalf("page %d: %s", code, body)
	}
}
