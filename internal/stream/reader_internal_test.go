package stream

import (
	"context"
	"testing"
	"time"
)

type noSink struct{}

func (noSink) Write(context.Context, []Record[string]) error { return nil }

func decodeString(b []byte) (string, error) { return string(b), nil }

// The group settings reach kafka-go's reader: the session and rebalance
// timeouts as configured (kafka.session_timeout, kafka.rebalance_timeout),
// the heartbeat a third of the session, at most 3 s.
func TestReaderGroupTimeouts(t *testing.T) {
	for _, tc := range []struct {
		session, rebalance             time.Duration
		wantSession, wantRebalance, hb time.Duration
	}{
		{0, 0, 30 * time.Second, 30 * time.Second, 3 * time.Second},
		{6 * time.Second, 20 * time.Second, 6 * time.Second, 20 * time.Second, 2 * time.Second},
		{3 * time.Second, time.Second, 3 * time.Second, time.Second, time.Second},
		{2 * time.Minute, time.Minute, 2 * time.Minute, time.Minute, 3 * time.Second},
	} {
		c, err := NewConsumer[string](Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g",
			SessionTimeout: tc.session, RebalanceTimeout: tc.rebalance}, decodeString, noSink{}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		rc := c.readerConfig()
		if rc.SessionTimeout != tc.wantSession || rc.RebalanceTimeout != tc.wantRebalance || rc.HeartbeatInterval != tc.hb {
			t.Errorf("session %v, rebalance %v: reader has %v, %v, heartbeat %v; want %v, %v, %v", tc.session, tc.rebalance,
				rc.SessionTimeout, rc.RebalanceTimeout, rc.HeartbeatInterval, tc.wantSession, tc.wantRebalance, tc.hb)
		}
	}
	if _, err := NewConsumer[string](Config{Brokers: []string{"b:1"}, Topic: "t", GroupID: "g", SessionTimeout: 500 * time.Millisecond}, decodeString, noSink{}, nil, nil); err == nil {
		t.Error("a session timeout under 1s was accepted")
	}
}
