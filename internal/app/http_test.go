package app_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/dev/testenv"
)

// TestServeEndpoints: health and readiness are open; /metrics, the API and
// the dashboard need the bearer token (header, or ?token= for pages).
func TestServeEndpoints(t *testing.T) {
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	cfg := withRoles(w.cfg, "serve")
	cfg.HTTP.BearerToken = "s3cret-token"
	a, stop := w.start(t, cfg)
	defer stop()
	<-a.Ready()
	base := "http://" + a.HTTPAddr()
	get := func(path, token string) (int, string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, tt := range []struct {
		path, token string
		code        int
		contains    string
	}{
		{"/healthz", "", 200, "ok"},
		{"/readyz", "", 200, "ready"},
		{"/metrics", "", 401, "unauthorized"},
		{"/metrics", "wrong", 401, "unauthorized"},
		{"/metrics", "s3cret-token", 200, "go_goroutines"},
		{"/api/overview", "s3cret-token", 200, "thresholds"},
		{"/?token=s3cret-token", "", 200, "<html"},
		{"/", "", 401, ""},
	} {
		code, body := get(tt.path, tt.token)
		if code != tt.code || !strings.Contains(body, tt.contains) {
			t.Errorf("GET %s (token %q): %d %.120q, want %d containing %q", tt.path, tt.token, code, body, tt.code, tt.contains)
		}
	}
}

// A replica without the serve role still answers probes and scrapes, and
// its metrics include the ingest consumer's; the dashboard is not there. An
// ingest-only replica does not use NATS: it starts and is ready with NATS
// unreachable.
func TestIngestReplicaServesMetricsAndHealth(t *testing.T) {
	ch := testenv.ClickHouse(t)
	w := newWorld(t, ch.Addr, 1)
	cfg := withRoles(w.cfg, "ingest")
	cfg.NATS.URL = "nats://127.0.0.1:1" // nothing listens there
	a, stop := w.start(t, cfg)
	defer stop()
	<-a.Ready()
	base := "http://" + a.HTTPAddr()
	for _, tt := range []struct {
		path     string
		code     int
		contains string
	}{
		{"/healthz", 200, "ok"},
		{"/readyz", 200, "ready"},
		{"/metrics", 200, `trace_consumer_messages_consumed_total{stage="ingest"`},
		{"/metrics", 200, `trace_clickhouse_inserts_stalled{table="rollouts"} 0`},
		{"/api/overview", 404, ""},
	} {
		res, err := http.Get(base + tt.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tt.code || !strings.Contains(string(b), tt.contains) {
			t.Errorf("GET %s: %d %.120q, want %d containing %q", tt.path, res.StatusCode, b, tt.code, tt.contains)
		}
	}
}

// TestBearer: the token is taken from "Authorization: Bearer", the scheme
// in any case (RFC 7235), or a bare token, and from ?token=; an
// Authorization of another scheme (a reverse proxy's Basic credentials,
// passed on) does not hide ?token=.
func TestBearer(t *testing.T) {
	h := app.Bearer("s3cret", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("in")) }))
	for _, tt := range []struct {
		authz, query string
		code         int
	}{
		{"Bearer s3cret", "", 200},
		{"bearer s3cret", "", 200},
		{"BEARER s3cret", "", 200},
		{"s3cret", "", 200},
		{"", "s3cret", 200},
		{"Basic dXNlcjpwcm94eS1wYXNzd29yZA==", "s3cret", 200},
		{"Bearer wrong", "", 401},
		{"Bearer", "", 401},
		{"Basic dXNlcjpzM2NyZXQ=", "", 401}, // user:s3cret is not the bearer token
		{"", "", 401},
		{"", "wrong", 401},
	} {
		req := httptest.NewRequest("GET", "/api/overview?token="+tt.query, nil)
		if tt.authz != "" {
			req.Header.Set("Authorization", tt.authz)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tt.code {
			t.Errorf("Authorization %q, ?token=%q: %d, want %d", tt.authz, tt.query, rec.Code, tt.code)
		}
		// The API's refusal is its JSON error, as its other errors are.
		if tt.code == 401 && (!strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") ||
			!strings.Contains(rec.Body.String(), `"error"`) || rec.Header().Get("WWW-Authenticate") == "") {
			t.Errorf("Authorization %q, ?token=%q: 401 %q %s, want a JSON error and WWW-Authenticate", tt.authz, tt.query, rec.Header().Get("Content-Type"), rec.Body.String())
		}
	}
	// A page's refusal stays plain text.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/trends", nil))
	if rec.Code != 401 || strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
		t.Errorf("page: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
}
