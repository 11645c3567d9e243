package adapter_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/dispatch"
	"github.com/traceops/trace/adapter/plan"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

const testSecret = "test-webhook-secret-0123456789"

// checkSignature verifies X-Trace-Signature as docs/training-protocol.md
// tells a receiver to, written out here rather than with dispatch.Verify.
func checkSignature(h string, body []byte) bool {
	var ts, v1 string
	for _, p := range strings.Split(h, ",") {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			v1 = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return false
	}
	m := hmac.New(sha256.New, []byte(testSecret))
	m.Write([]byte(ts + "."))
	m.Write(body)
	got, err := hex.DecodeString(v1)
	return err == nil && hmac.Equal(got, m.Sum(nil))
}

// post sends an event to a callback URL, signed unless sign is false.
func post(t *testing.T, url string, body []byte, sign bool, hdr map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if sign {
		req.Header.Set(dispatch.SignatureHeader, dispatch.Sign([]byte(testSecret), time.Now(), body))
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func eventJSON(t *testing.T, e *schemas.TrainingEvent) []byte {
	t.Helper()
	data, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestWebhookBackendAndCallback: the webhook backend POSTs the spec to a
// receiver that checks the signature and answers 503 twice, then 202; the
// spec names the callback URL, where the "trainer" reports, signed, and
// its events reach training_job_events, the job's status and the registry
// through the adapt role's events consumer. A bad body is 400 with a
// message (and recorded as malformed); an unsigned or wrongly signed one
// 401; an unknown job 404; the bearer callback token is accepted. A
// receiver answering 422 fails the job at once with the status; one that
// stays down makes the dispatch fail (the adapt role retries it) and a
// later dispatch of the same job goes through.
func TestWebhookBackendAndCallback(t *testing.T) {
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	ctx := context.Background()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	// The serve role's callback endpoint.
	mux := http.NewServeMux()
	mux.Handle(dispatch.CallbackRoute, &dispatch.Callback{Secret: []byte(testSecret), Token: "callback-token", Relay: b,
		Jobs: func(ctx context.Context, id string) (bool, error) {
			j, err := st.TrainingJob(ctx, id)
			return j != nil, err
		}})
	callback := httptest.NewServer(mux)
	defer callback.Close()

	// The team's receiver.
	var (
		mu       sync.Mutex
		attempts = map[string]int{}
		badSigs  int
		bodies   = map[string][]byte{}
		specs    = make(chan *schemas.TrainingJob, 4)
		down     = true
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if !checkSignature(r.Header.Get(dispatch.SignatureHeader), body) || r.Header.Get("Authorization") != "Bearer hook-token" {
			badSigs++
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		job, err := schemas.DecodeTrainingJob(body)
		if err != nil || r.Header.Get("X-Trace-Job-Id") != job.JobID || r.Header.Get("Idempotency-Key") != job.JobID {
			http.Error(w, "bad spec", http.StatusBadRequest)
			return
		}
		attempts[job.JobID]++
		bodies[job.JobID] = body
		switch {
		case strings.Contains(job.Capability.Name, "rejected"):
			http.Error(w, `{"error":"no such partition: gpu-h100"}`, http.StatusUnprocessableEntity)
		case strings.Contains(job.Capability.Name, "down") && down:
			http.Error(w, "maintenance", http.StatusServiceUnavailable)
		case strings.Contains(job.Capability.Name, "flaky") && attempts[job.JobID] <= 2:
			http.Error(w, "scheduler restarting", http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusAccepted)
			w.Write([]byte(`{"queued":"slurm-77"}`))
			specs <- job
		}
	}))
	defer receiver.Close()

	hook, err := dispatch.NewWebhook(dispatch.WebhookConfig{URL: receiver.URL, Secret: testSecret, BearerToken: "hook-token",
		InitialInterval: 20 * time.Millisecond, RetryFor: 2 * time.Second, Events: dispatch.EventsCallback, CallbackURL: callback.URL},
		slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s := newStage(t, b, st, hook, func(p *plan.Config) { p.CallbackURL = hook.Config().CallbackURL })
	hook.Reporter = s
	r := startRoleWith(t, b, s)
	defer r.stop()

	// 503, 503, 202.
	res, err := s.HandleReady(ctx, readyFor("t-hook-flaky", "flaky_scheduler"))
	if err != nil || !res.Dispatched {
		t.Fatalf("dispatch: %+v %v", res, err)
	}
	id := res.JobID
	row, _ := st.TrainingJob(ctx, id)
	mu.Lock()
	if attempts[id] != 3 || badSigs != 0 || string(bodies[id]) != row.Spec {
		t.Errorf("receiver saw %d attempts (want 3), %d bad signatures, body = stored spec: %v", attempts[id], badSigs, string(bodies[id]) == row.Spec)
	}
	mu.Unlock()
	spec := <-specs
	wantURL := callback.URL + "/v1/training/jobs/" + id + "/events"
	if spec.Report.CallbackURL != wantURL {
		t.Fatalf("report.callback_url = %q, want %q", spec.Report.CallbackURL, wantURL)
	}

	// The trainer reports over the callback.
	it, mr, sd := 1, 0.42, 0.1
	seq := func(n int64) *int64 { return &n }
	started := eventJSON(t, &schemas.TrainingEvent{JobID: id, Type: schemas.EventStarted, At: time.Now().UTC(), Seq: seq(0), Worker: "slurm-77"})
	it2 := 2
	progressNoSeq := eventJSON(t, &schemas.TrainingEvent{JobID: id, Type: schemas.EventProgress, At: time.Now().UTC(), Iteration: &it2, MeanReward: &mr, RewardStd: &sd})
	noSeqSig := dispatch.Sign([]byte(testSecret), time.Now(), progressNoSeq)
	for _, tc := range []struct {
		name   string
		body   []byte
		sign   bool
		hdr    map[string]string
		url    string
		status int
		msg    string
	}{
		{"started, signed", started, true, nil, wantURL, http.StatusAccepted, `"accepted":true`},
		{"the same event again (a retried POST)", started, true, nil, wantURL, http.StatusAccepted, `"accepted":true`},
		{"unsigned", started, false, nil, wantURL, http.StatusUnauthorized, "no credentials"},
		{"signed with another secret", started, false, map[string]string{dispatch.SignatureHeader: dispatch.Sign([]byte("another-secret-0123456"), time.Now(), started)},
			wantURL, http.StatusUnauthorized, "signature does not match"},
		{"an old signature (replay)", started, false, map[string]string{dispatch.SignatureHeader: dispatch.Sign([]byte(testSecret), time.Now().Add(-time.Hour), started)},
			wantURL, http.StatusUnauthorized, "outside the tolerance"},
		{"wrong bearer token", started, false, map[string]string{"Authorization": "Bearer nope"}, wantURL, http.StatusUnauthorized, "bearer token does not match"},
		{"unknown job", eventJSON(t, &schemas.TrainingEvent{JobID: "job-0000000000000000", Type: schemas.EventStarted, At: time.Now().UTC()}), true, nil,
			callback.URL + "/v1/training/jobs/job-0000000000000000/events", http.StatusNotFound, "unknown training job"},
		{"not JSON", []byte(`{"type": "progress", `), true, nil, wantURL, http.StatusBadRequest, "not a valid training_event/v1"},
		{"another job's event", eventJSON(t, &schemas.TrainingEvent{JobID: "job-0000000000000000", Type: schemas.EventStarted, At: time.Now().UTC()}),
			true, nil, wantURL, http.StatusBadRequest, "is not the path's job"},
		{"progress, bearer token", eventJSON(t, &schemas.TrainingEvent{JobID: id, Type: schemas.EventProgress, At: time.Now().UTC(), Seq: seq(1),
			Iteration: &it, MeanReward: &mr, RewardStd: &sd}), false, map[string]string{"Authorization": "Bearer callback-token"}, wantURL, http.StatusAccepted, ""},
		// A signed request without seq, and the same request captured and
		// sent again (a replay within the tolerance, another v1 added):
		// both answered 202, applied once.
		{"progress without seq, signed", progressNoSeq, false, map[string]string{dispatch.SignatureHeader: noSeqSig}, wantURL, http.StatusAccepted, ""},
		{"the same signed request again (a replay)", progressNoSeq, false, map[string]string{dispatch.SignatureHeader: noSeqSig + ",v1=00ff"}, wantURL, http.StatusAccepted, ""},
		{"succeeded", eventJSON(t, &schemas.TrainingEvent{JobID: id, Type: schemas.EventSucceeded, At: time.Now().UTC(), Seq: seq(2),
			Adapter: &schemas.EventAdapter{Name: spec.Output.AdapterName, URI: spec.Output.URI},
			Eval:    &schemas.EvalMetrics{MeanReward: 0.66, SuccessRate: 0.5, Episodes: 200}}), true, nil, wantURL, http.StatusAccepted, ""},
	} {
		code, body := post(t, tc.url, tc.body, tc.sign, tc.hdr)
		if code != tc.status || !strings.Contains(body, tc.msg) {
			t.Errorf("%s: %d %s, want %d with %q", tc.name, code, body, tc.status, tc.msg)
		}
	}
	waitFor(t, "the job to succeed through the callback", 20*time.Second, func() bool {
		j, _ := st.TrainingJob(ctx, id)
		return j != nil && j.Status == adapter.StatusSucceeded
	})
	var types []string
	waitFor(t, "the history", 10*time.Second, func() bool {
		types, _ = historyTypes(t, st, id)
		return len(types) >= 8
	})
	sorted := slices.Clone(types)
	slices.Sort(sorted)
	// The repeated started is one entry, and so is the replayed progress;
	// each bad body (not JSON, another job's event) is one malformed
	// entry; unauthenticated ones are none.
	if strings.Join(sorted, ",") != "dispatched,malformed,malformed,progress,progress,started,succeeded,webhook_accepted" || types[0] != "dispatched" || types[1] != "webhook_accepted" {
		t.Errorf("history: %v", types)
	}
	_, evs := historyTypes(t, st, id)
	if !strings.Contains(evs[1].Payload, `"attempts":3`) || !strings.Contains(evs[1].Payload, `"status":202`) {
		t.Errorf("webhook_accepted: %s", evs[1].Payload)
	}
	j, _ := st.TrainingJob(ctx, id)
	if j.Backend != "webhook" || j.MeanReward != 0.42 || j.Iteration != 2 {
		t.Errorf("job: %+v", j)
	}
	if a, err := st.Adapter(ctx, spec.Output.AdapterName); err != nil || a == nil || a.EvalMeanReward != 0.66 {
		t.Errorf("adapter: %+v %v", a, err)
	}

	// 422: FAILED at once, with the status.
	res, err = s.HandleReady(ctx, readyFor("t-hook-rejected", "rejected_partition"))
	if err != nil {
		t.Fatal(err)
	}
	j, _ = st.TrainingJob(ctx, res.JobID)
	mu.Lock()
	n := attempts[res.JobID]
	mu.Unlock()
	if j.Status != adapter.StatusFailed || n != 1 || !strings.Contains(j.Reason, "answered 422 Unprocessable Entity") || !strings.Contains(j.Reason, "no such partition: gpu-h100") {
		t.Errorf("rejected: %d attempts, %s %q", n, j.Status, j.Reason)
	}

	// Down for longer than retry_for: the dispatch fails; later it goes through.
	down1 := readyFor("t-hook-down", "scheduler_down")
	if _, err := s.HandleReady(ctx, down1); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("a receiver that stays down: %v", err)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	res, err = s.HandleReady(ctx, down1)
	if err != nil || !res.Dispatched || res.Duplicate {
		t.Fatalf("the retried dispatch: %+v %v", res, err)
	}
	if types, _ := historyTypes(t, st, res.JobID); strings.Join(types, ",") != "dispatched,webhook_accepted" {
		t.Errorf("history of the retried dispatch: %v", types)
	}
	_ = sink.TrainingEventRow{}
}
