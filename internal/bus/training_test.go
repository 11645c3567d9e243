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
