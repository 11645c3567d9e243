package dispatch

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/traceops/trace/schemas"
)

// CallbackRoute is the callback endpoint's pattern on the serve role's
// HTTP server.
const CallbackRoute = "POST /v1/training/jobs/{id}/events"

// EventRelay takes an authenticated callback's event to the adapt role:
// internal/bus publishes it on trace.training.events.<job_id>, where the
// adapt role's consumer applies it (adapter.Stage.HandleEvent) exactly as
// an event a trainer published itself. msgID, when set, deduplicates a
// retried POST.
type EventRelay interface {
	RelayTrainingEvent(ctx context.Context, jobID string, data []byte, msgID string) error
}

// JobExists says whether trace has a job (sink.Store.TrainingJob != nil).
type JobExists func(ctx context.Context, jobID string) (bool, error)

// Callback is the endpoint over which a webhook's trainers report:
// POST /v1/training/jobs/{id}/events with one training_event/v1 object as
// the body. A request is authenticated by SignatureHeader (HMAC-SHA256
// with the webhook's secret, over the timestamp and the body) or, when
// Token is set, by Authorization: Bearer <Token>. Answers: 202 once the
// event is durably queued for the adapt role; 400 with the reason for a
// body that is not a valid event of this job (it is recorded in the job's
// history as malformed, as on NATS); 401 unauthenticated (nothing
// recorded); 404 an unknown job; 413 a body over 1 MiB; 503 when the
// event could not be queued (retry it).
type Callback struct {
	Secret    []byte
	Token     string
	Tolerance time.Duration
	Relay     EventRelay
	Jobs      JobExists
	Log       *slog.Logger
	Now       func() time.Time
}

var jobIDRe = regexp.MustCompile(`^job-[0-9a-f]{16}$`)

// ServeHTTP implements CallbackRoute (the job id is the {id} path value).
func (c *Callback) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil {
		httpError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	if len(body) > 1<<20 {
		httpError(w, http.StatusRequestEntityTooLarge, "an event is at most 1 MiB")
		return
	}
	sig, err := c.authenticate(r, body, now())
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="trace training callback"`)
		httpError(w, http.StatusUnauthorized, err.Error())
		return
	}
	id := r.PathValue("id")
	if !jobIDRe.MatchString(id) {
		httpError(w, http.StatusBadRequest, fmt.Sprintf("%q is not a job id (job-<16 hex digits>)", id))
		return
	}
	ok, err := c.Jobs(r.Context(), id)
	if err != nil {
		httpError(w, http.StatusServiceUnavailable, "looking the job up: "+err.Error())
		return
	}
	if !ok {
		httpError(w, http.StatusNotFound, "unknown training job "+id)
		return
	}
	e, derr := schemas.DecodeTrainingEvent(body)
	if derr == nil && e.JobID != id {
		derr = fmt.Errorf("job_id %s is not the path's job %s", e.JobID, id)
	}
	// The Msg-Id drops a second copy within the duplicate window: the
	// event's seq, else the signature (its timestamp and body), so that a
	// signed request captured and sent again within the tolerance is
	// applied once (the configuration keeps the window at least twice the
	// tolerance). A bearer-token request without seq has none: whoever
	// holds the token can send anything anyway.
	msgID := ""
	switch {
	case derr == nil && e.Seq != nil:
		msgID = id + ":" + strconv.FormatInt(*e.Seq, 10)
	case sig != "":
		msgID = id + ":sig:" + sig
	}
	// A malformed event is relayed too: the adapt role records it in the
	// job's history as malformed, as it does on NATS.
	if err := c.Relay.RelayTrainingEvent(r.Context(), id, body, msgID); err != nil {
		httpError(w, http.StatusServiceUnavailable, "the event could not be queued, retry: "+err.Error())
		return
	}
	if derr != nil {
		log.Warn("training callback: malformed event (recorded)", "job", id, "err", derr)
		httpError(w, http.StatusBadRequest, "not a valid training_event/v1: "+derr.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(map[string]any{"job_id": id, "type": e.Type, "accepted": true})
}

// authenticate accepts a valid signature (returning its VerifiedMAC), or
// the bearer token when one is configured (returning ""); the error says
// what failed.
func (c *Callback) authenticate(r *http.Request, body []byte, now time.Time) (string, error) {
	if c.Token != "" {
		if got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			if subtle.ConstantTimeCompare([]byte(got), []byte(c.Token)) == 1 {
				return "", nil
			}
			return "", errors.New("bearer token does not match")
		}
	}
	if len(c.Secret) == 0 {
		return "", errors.New("no credentials: send the bearer token")
	}
	tol := c.Tolerance
	if tol <= 0 {
		tol = DefaultSignatureTolerance
	}
	sig, err := VerifiedMAC(c.Secret, r.Header.Get(SignatureHeader), body, now, tol)
	if err != nil {
		if errors.Is(err, ErrNoSignature) && c.Token != "" {
			return "", errors.New("no credentials: send " + SignatureHeader + " or the bearer token")
		}
		return "", err
	}
	return sig, nil
}

func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": msg, "status": code})
}
