package dispatch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/schemas"
)

// noteReporter keeps what a backend reports.
type noteReporter struct {
	reasons, notes []string
}

func (r *noteReporter) HandleEvent(_ context.Context, e *schemas.TrainingEvent, _ string, _ []byte) error {
	r.reasons = append(r.reasons, e.Reason)
	return nil
}

func (r *noteReporter) RecordMalformed(context.Context, string, string, []byte, error) error {
	return nil
}

func (r *noteReporter) RecordNote(_ context.Context, _, _, _ string, payload []byte) error {
	r.notes = append(r.notes, string(payload))
	return nil
}

// TestWebhookRedactsURLPassword: a webhook URL's password (basic auth in
// adapter.webhook.url) is sent, but never written to the job's failure
// reason, its webhook_accepted note or the dispatch error, which end up
// in ClickHouse, the dashboard and the logs.
func TestWebhookRedactsURLPassword(t *testing.T) {
	status := http.StatusUnprocessableEntity
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "ci" || p != "hunter2-secret" {
			http.Error(w, "no auth", http.StatusUnauthorized)
			return
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	url := strings.Replace(srv.URL, "http://", "http://ci:hunter2-secret@", 1) + "/hooks/trace"
	w, err := NewWebhook(WebhookConfig{URL: url, Secret: "0123456789abcdef", InitialInterval: time.Millisecond, RetryFor: 50 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep := &noteReporter{}
	w.Reporter = rep
	job := &schemas.TrainingJob{JobID: "job-0123456789abcdef"}
	ctx := context.Background()
	for _, s := range []int{http.StatusUnprocessableEntity, http.StatusAccepted, http.StatusServiceUnavailable} {
		status = s
		err := w.Dispatch(ctx, job, []byte(`{}`))
		if s == http.StatusServiceUnavailable {
			if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "/hooks/trace") {
				t.Errorf("dispatch error after %d: %v", s, err)
			}
		} else if err != nil {
			t.Fatalf("dispatch (%d): %v", s, err)
		}
	}
	if len(rep.reasons) != 1 || strings.Contains(rep.reasons[0], "hunter2") || !strings.Contains(rep.reasons[0], "answered 422") ||
		!strings.Contains(rep.reasons[0], "/hooks/trace") {
		t.Errorf("failure reasons %q", rep.reasons)
	}
	if len(rep.notes) != 1 || strings.Contains(rep.notes[0], "hunter2") || !strings.Contains(rep.notes[0], "/hooks/trace") {
		t.Errorf("notes %q", rep.notes)
	}
}
