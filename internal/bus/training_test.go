package bus_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/schemas"
)

// TestTrainingEventsOnTheJobsSubject: an event trace makes and one relayed
// as received both go on the job's subject with their Msg-Id (published
// twice, stored once); a relayed event is stored as it is, malformed or
// not, and an invalid event trace makes is not published.
func TestTrainingEventsOnTheJobsSubject(t *testing.T) {
	ctx := context.Background()
	b := connect(t)
	job := schemas.TrainingJobID(schemas.EnvironmentID("trig-1"), 1)
	failed := &schemas.TrainingEvent{JobID: job, Type: schemas.EventFailed, At: time.Now().UTC(), Worker: "trace deadline", Reason: "deadline"}
	for range 2 {
		if err := b.PublishTrainingEventID(ctx, failed, "deadline:"+job+":1"); err != nil {
			t.Fatal(err)
		}
	}
	malformed := []byte(`{"schema":"training_event/v1","job_id":"` + job + `","type":"paused"}`)
	for range 2 {
		if err := b.RelayTrainingEvent(ctx, job, malformed, job+":3"); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.PublishTrainingEventID(ctx, &schemas.TrainingEvent{JobID: job, Type: schemas.EventFailed, At: time.Now()}, ""); err == nil {
		t.Fatal("a failed event without a reason was published")
	}
	c, err := b.JS.CreateOrUpdateConsumer(ctx, bus.StreamTrainingEvents, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(5, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
	}
	if len(got) != 2 {
		t.Fatalf("%d messages, want 2 (one each)", len(got))
	}
	for i, want := range []string{"deadline:" + job + ":1", job + ":3"} {
		if got[i].Subject() != schemas.TrainingEventsSubject(job) || got[i].Headers().Get(jetstream.MsgIDHeader) != want {
			t.Errorf("message %d: %s %v, want on the job's subject with Msg-Id %s", i, got[i].Subject(), got[i].Headers(), want)
		}
	}
	if e, err := schemas.DecodeTrainingEvent(got[0].Data()); err != nil || e.Reason != "deadline" {
		t.Errorf("the deadline's failure: %v %+v", err, e)
	}
	if string(got[1].Data()) != string(malformed) || !strings.Contains(string(got[1].Data()), "paused") {
		t.Errorf("relayed %s, want it as received", got[1].Data())
	}
}

// TestTrainingClaims: a claim holds its claimer's bound; a claim past it
// (and ClaimSlack), never marked dispatched, is taken over once, and the
// release of the claimer that lost it leaves the new holder's; a claim
// marked dispatched, or written without a bound (before bounds were kept),
// is the job's dispatch.
func TestTrainingClaims(t *testing.T) {
	ctx := context.Background()
	b := connect(t)
	short, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	rev, held, err := b.ClaimTrainingJob(short, "job-a")
	if err != nil || rev == 0 || !held.IsZero() {
		t.Fatalf("first claim: %d %s %v", rev, held, err)
	}
	if r, h, err := b.ClaimTrainingJob(ctx, "job-a"); err != nil || r != 0 || h.IsZero() {
		t.Fatalf("a claim within its holder's bound: %d %s %v; want held", r, h, err)
	}
	time.Sleep(bus.ClaimSlack + 50*time.Millisecond)
	taken, held, err := b.ClaimTrainingJob(ctx, "job-a")
	if err != nil || taken == 0 || !held.IsZero() {
		t.Fatalf("a claim past its bound: %d %s %v; want taken over", taken, held, err)
	}
	if err := b.ReleaseTrainingJob(ctx, "job-a", rev); err == nil {
		t.Fatal("the release of a claim taken over since removed the new holder's")
	}
	if r, h, err := b.ClaimTrainingJob(ctx, "job-a"); err != nil || r != 0 || h.IsZero() {
		t.Fatalf("after a stale release: %d %s %v; want held by the new holder", r, h, err)
	}
	if err := b.DispatchedTrainingJob(ctx, "job-a"); err != nil {
		t.Fatal(err)
	}
	if r, h, err := b.ClaimTrainingJob(ctx, "job-a"); err != nil || r != 0 || !h.IsZero() {
		t.Fatalf("a dispatched job: %d %s %v; want dispatched", r, h, err)
	}
	kv, err := b.JS.KeyValue(ctx, bus.BucketTrainingClaims)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "job-old", []byte(`{"claimed_at":"2026-01-02T03:04:05Z"}`)); err != nil {
		t.Fatal(err)
	}
	if r, h, err := b.ClaimTrainingJob(ctx, "job-old"); err != nil || r != 0 || !h.IsZero() {
		t.Fatalf("a claim without a bound: %d %s %v; want dispatched", r, h, err)
	}
	// A release at the holder's revision frees the job.
	rev, _, err = b.ClaimTrainingJob(ctx, "job-b")
	if err != nil || rev == 0 {
		t.Fatal(rev, err)
	}
	if err := b.ReleaseTrainingJob(ctx, "job-b", rev); err != nil {
		t.Fatal(err)
	}
	if r, _, err := b.ClaimTrainingJob(ctx, "job-b"); err != nil || r == 0 {
		t.Fatalf("a released claim: %d %v; want claimed", r, err)
	}
}
