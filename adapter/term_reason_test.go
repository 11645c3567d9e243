package adapter_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/internal/bus"
)

// terminations subscribes to JetStream's advisories of the messages
// terminated on a stream's consumer and returns the reasons given so far.
func terminations(t *testing.T, b *bus.Bus, stream, consumer string) func() []string {
	t.Helper()
	ch := make(chan *nats.Msg, 16)
	sub, err := b.NC.ChanSubscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED."+stream+"."+consumer, ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	var reasons []string
	return func() []string {
		for {
			select {
			case m := <-ch:
				var a struct {
					Reason string `json:"reason"`
				}
				_ = json.Unmarshal(m.Data, &a)
				reasons = append(reasons, a.Reason)
			default:
				return reasons
			}
		}
	}
}

// TestInvalidMessagesTerminatedWithTheirReason: a ready message that is
// not an environment_ready/v1 (another schema version, a broken JSON) and
// an activation request without its job are terminated with the reason,
// which JetStream's termination advisory carries to whoever watches for
// dead letters (as the synthesize role's invalid requests); they were
// terminated without one.
func TestInvalidMessagesTerminatedWithTheirReason(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, b := plannerFixture(t)
	s, err := adapter.NewStage(adapter.Config{Plan: fastPlan(), Store: st, Claims: b, AutoActivate: true, Registry: &adapter.Registry{Store: st},
		Queue: b, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	readyReasons := terminations(t, b, bus.StreamEnvReady, bus.DurableAdapter)
	activationReasons := terminations(t, b, bus.StreamAdapterActivations, bus.DurableAdapterActivations)
	r := readyFor("t-v2", "x")
	data, _ := json.Marshal(r)
	v2 := strings.Replace(string(data), `"environment_ready/v1"`, `"environment_ready/v2"`, 1)
	for _, p := range []string{v2, `{"schema":"environment_ready/v1",`} {
		if _, err := b.JS.Publish(ctx, bus.SubjectEnvReady, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.PublishActivation(ctx, []byte(`{"adapter":"a"}`), "no-job"); err != nil {
		t.Fatal(err)
	}
	rc, err := b.ReadyConsumer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.RunReady(ctx, rc) }()
	defer runActivations(t, b, s)()
	var got []string
	waitFor(t, "the terminations", 20*time.Second, func() bool {
		got = append(readyReasons(), activationReasons()...)
		return len(got) == 3
	})
	for i, r := range got {
		if r == "" {
			t.Errorf("termination %d without a reason", i)
		}
		t.Logf("reason %d: %s", i, r)
	}
}
