package app

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/internal/stream"
)

// TestReadyzWithAToken: with http.bearer_token set, /readyz still answers
// every probe (a load balancer sends no token) with the status code and
// each check's result, but a check's error — which can name internal
// hosts, users, databases — only to a request with the token.
func TestReadyzWithAToken(t *testing.T) {
	cfg, err := config.Load("", []string{"roles=ingest", "http.bearer_token=s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	a := &App{Cfg: cfg, Store: testenv.ClickHouse(t).Store(), readyCh: make(chan struct{}),
		Brokers: []string{"127.0.0.1:1"}} // nothing listens there
	close(a.readyCh)
	srv := httptest.NewServer(http.HandlerFunc(a.readyz))
	defer srv.Close()
	get := func(authz, query string) (int, string, ReadyReport) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/readyz"+query, nil)
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var rep ReadyReport
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatalf("%d %q: %v", res.StatusCode, b, err)
		}
		return res.StatusCode, string(b), rep
	}
	kafka := func(rep ReadyReport) ReadyCheck {
		for _, c := range rep.Checks {
			if c.Name == "kafka" {
				return c
			}
		}
		t.Fatalf("no kafka check: %+v", rep)
		return ReadyCheck{}
	}
	for _, tc := range []struct {
		name, authz, query string
		details            bool
	}{
		{"no token", "", "", false},
		{"a wrong token", "Bearer nope", "", false},
		{"the token", "Bearer s3cret", "", true},
		{"the token as ?token=", "", "?token=s3cret", true},
	} {
		code, body, rep := get(tc.authz, tc.query)
		c := kafka(rep)
		if code != http.StatusServiceUnavailable || rep.Status != "not ready" || c.OK {
			t.Errorf("%s: %d %s", tc.name, code, body)
		}
		if has := strings.Contains(body, "127.0.0.1:1"); has != tc.details || (c.Error != "") != tc.details {
			t.Errorf("%s: the broker's error shown %v, want %v: %s", tc.name, has, tc.details, body)
		}
	}
}

// slowConsumer is a consumer state whose check takes a while and counts
// the rounds that ran it.
type slowConsumer struct {
	rounds atomic.Int32
	hold   time.Duration
}

func (c *slowConsumer) Config() stream.Config { return stream.Config{Stage: "slow"} }
func (c *slowConsumer) Problem() error {
	c.rounds.Add(1)
	time.Sleep(c.hold)
	return nil
}

// TestReadyzShared: probes that arrive while a round of checks runs wait
// for it and get its report: however many arrive at once, one round runs.
// A probe after it starts a new one.
func TestReadyzShared(t *testing.T) {
	cfg, err := config.Load("", []string{"roles=serve"})
	if err != nil {
		t.Fatal(err)
	}
	a := &App{Cfg: cfg, Store: testenv.ClickHouse(t).Store(), readyCh: make(chan struct{})}
	close(a.readyCh)
	slow := &slowConsumer{hold: 300 * time.Millisecond}
	a.addConsumer(slow)
	var wg sync.WaitGroup
	codes := make([]int, 20)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := httptest.NewRecorder()
			a.readyz(w, httptest.NewRequest("GET", "/readyz", nil))
			codes[i] = w.Code
		}()
		if i == 0 {
			time.Sleep(50 * time.Millisecond) // the first round is under way
		}
	}
	wg.Wait()
	if n := slow.rounds.Load(); n != 1 {
		t.Errorf("20 probes at once ran %d rounds of checks, want 1", n)
	}
	for i, c := range codes {
		if c != 200 {
			t.Errorf("probe %d: %d", i, c)
		}
	}
	a.readyz(httptest.NewRecorder(), httptest.NewRequest("GET", "/readyz", nil))
	if n := slow.rounds.Load(); n != 2 {
		t.Errorf("a probe after the round: %d rounds in all, want 2", n)
	}
}
