package bus_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
)

func ready(id string) *schemas.EnvironmentReady {
	hash := strings.Repeat("ab", 32)
	return &schemas.EnvironmentReady{EnvironmentID: id, TriggerID: "t", Environment: "sim-airline", AgentVersion: "1.4.0", DictionaryVersion: 1,
		Capability:  schemas.ReadyCapability{Name: "precondition_verification", Definition: "d"},
		Program:     schemas.ReadyProgram{Hash: hash, Origin: schemas.OriginTemplate, Tools: []string{"get_reservation_details"}, Attempts: 1},
		Calibration: schemas.ReadyCalib{Policy: "simulated", Simulated: true, Seeds: 1, RolloutsPerSeed: 1, PassAtK: map[string]float64{"1": 1}},
		Fetch:       schemas.ReadyFetch{Path: schemas.EnvironmentProgramPath(id), ClickHouse: schemas.ClickHouseRef{Table: "environments", EnvironmentID: id, ProgramHash: hash}},
		ReadyAt:     time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
}

// connect connects a bus to a fresh embedded NATS server (closed when t
// ends), its streams ensured.
func connect(t *testing.T) *bus.Bus {
	t.Helper()
	b, err := bus.Connect(context.Background(), bus.Config{URL: testenv.NATS(t).URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestEnvironmentReadyOncePerEnvironment(t *testing.T) {
	ctx := context.Background()
	b := connect(t)
	a, c := schemas.EnvironmentID("a"), schemas.EnvironmentID("c")
	for _, id := range []string{a, a, c, a} {
		if err := b.PublishEnvironmentReady(ctx, ready(id)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.ReadyEnvironments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].EnvironmentID != a || got[1].EnvironmentID != c || got[0].Schema != schemas.EnvironmentReadySchema {
		t.Fatalf("%+v", got)
	}
	bad := ready(schemas.EnvironmentID("x"))
	bad.Fetch.ClickHouse.ProgramHash = strings.Repeat("cd", 32)
	if err := b.PublishEnvironmentReady(ctx, bad); err == nil || !strings.Contains(err.Error(), "program_hash") {
		t.Fatalf("an inconsistent message was published: %v", err)
	}
}

func TestSynthesisConsumerGetsRequests(t *testing.T) {
	ctx := context.Background()
	b := connect(t)
	req := &schemas.SynthesisRequest{TriggerID: "trig-1", Environment: "sim-airline", AgentVersion: "1.4.0", DictionaryVersion: 1, Epoch: 1,
		Capability: schemas.SelectedCapability{Skill: "precondition_verification", ExampleFailedCases: []string{}}, FiredAt: time.Now().UTC()}
	if _, err := b.PublishSynthesis(ctx, req); err != nil {
		t.Fatal(err)
	}
	c, err := b.SynthesisConsumer(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.SynthesisConsumer(ctx, time.Second); err != nil { // a second replica, or a restart
		t.Fatalf("consumer again: %v", err)
	}
	batch, err := c.Fetch(5, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for m := range batch.Messages() {
		got, err := schemas.DecodeSynthesisRequest(m.Data())
		if err != nil || got.TriggerID != "trig-1" || m.Subject() != "trace.synthesis.sim-airline.precondition_verification" {
			t.Fatalf("%v %+v %s", err, got, m.Subject())
		}
		n++
		_ = m.Ack()
	}
	info, _ := c.Info(ctx)
	if n != 1 || info.Config.MaxDeliver != -1 || info.Config.AckWait != time.Second {
		t.Fatalf("%d messages; consumer %+v", n, info.Config)
	}
}

// TestRequeueSynthesisOncePerMsgID: a request published and handled once is
// requeued (its trigger claim does not stop it); two replicas requeueing
// it with the same Msg-Id add one message, which carries that Msg-Id.
func TestRequeueSynthesisOncePerMsgID(t *testing.T) {
	ctx := context.Background()
	b := connect(t)
	req := &schemas.SynthesisRequest{TriggerID: "trig-r", Environment: "sim-airline", AgentVersion: "1.4.0", DictionaryVersion: 1, Epoch: 1,
		Capability: schemas.SelectedCapability{Skill: "precondition_verification", ExampleFailedCases: []string{}}, FiredAt: time.Now().UTC()}
	if _, err := b.PublishSynthesis(ctx, req); err != nil {
		t.Fatal(err)
	}
	c, err := b.SynthesisConsumer(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fetch := func() []jetstream.Msg {
		batch, err := c.Fetch(5, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var out []jetstream.Msg
		for m := range batch.Messages() {
			out = append(out, m)
			_ = m.Ack()
		}
		return out
	}
	if got := fetch(); len(got) != 1 {
		t.Fatalf("%d requests", len(got))
	}
	stored := *req
	stored.Schema = "" // as a record's request may hold it
	for range 2 {
		if err := b.RequeueSynthesis(ctx, &stored, "resume:env-1:7"); err != nil {
			t.Fatal(err)
		}
	}
	got := fetch()
	if len(got) != 1 {
		t.Fatalf("%d requeued messages, want 1", len(got))
	}
	r, err := schemas.DecodeSynthesisRequest(got[0].Data())
	if err != nil || r.TriggerID != "trig-r" || got[0].Subject() != "trace.synthesis.sim-airline.precondition_verification" ||
		got[0].Headers().Get(jetstream.MsgIDHeader) != "resume:env-1:7" {
		t.Fatalf("%v %+v %s %v", err, r, got[0].Subject(), got[0].Headers())
	}
}

// TestPublishSynthesisReturnsTheStoredRequest: a request already in the
// stream — claimed, or a duplicate when two replicas race before the claim
// is written — comes back as the stream holds it (Stored), the first
// publisher's, so that every replica records what was requested.
func TestPublishSynthesisReturnsTheStoredRequest(t *testing.T) {
	ctx := context.Background()
	b := connect(t)
	first := &schemas.SynthesisRequest{TriggerID: "trig-s", Environment: "sim-airline", AgentVersion: "1.4.0", DictionaryVersion: 1, Epoch: 1,
		Capability: schemas.SelectedCapability{Skill: "precondition_verification", MeanCov: 0.95, ExampleFailedCases: []string{}},
		FiredAt:    time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
	res, err := b.PublishSynthesis(ctx, first)
	if err != nil || !res.Published || res.Stored != nil {
		t.Fatalf("first: %+v %v", res, err)
	}
	later := *first
	later.Capability.MeanCov, later.FiredAt = 0.91, first.FiredAt.Add(time.Minute)
	res, err = b.PublishSynthesis(ctx, &later) // the claim is there
	if err != nil || !res.Claimed || res.Stored == nil || res.Stored.Capability.MeanCov != 0.95 || !res.Stored.FiredAt.Equal(first.FiredAt) {
		t.Fatalf("claimed: %+v %v", res, err)
	}
	// Two replicas racing: the second publishes before the first wrote
	// its claim; JetStream's duplicate window drops it.
	kv, err := b.JS.KeyValue(ctx, bus.BucketClaims)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "t_"+bus.Token(first.TriggerID)); err != nil {
		t.Fatal(err)
	}
	res, err = b.PublishSynthesis(ctx, &later)
	if err != nil || !res.Duplicate || res.Stored == nil || res.Stored.Capability.MeanCov != 0.95 || !res.Stored.FiredAt.Equal(first.FiredAt) {
		t.Fatalf("duplicate: %+v %v", res, err)
	}
}
