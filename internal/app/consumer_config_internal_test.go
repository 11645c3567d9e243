package app

import (
	"testing"
	"time"

	"github.com/traceops/trace/internal/config"
)

// kafka.session_timeout and kafka.rebalance_timeout reach every stage's
// consumer.
func TestConsumerConfigGroupTimeouts(t *testing.T) {
	cfg, err := config.Load("", []string{"kafka.session_timeout=6s", "kafka.rebalance_timeout=20s"})
	if err != nil {
		t.Fatal(err)
	}
	a := &App{Cfg: cfg}
	for _, stage := range []string{"ingest", "analyze", "labels"} {
		sc := a.consumerConfig("g", "t", stage)
		if sc.SessionTimeout != 6*time.Second || sc.RebalanceTimeout != 20*time.Second {
			t.Errorf("%s: session %v, rebalance %v", stage, sc.SessionTimeout, sc.RebalanceTimeout)
		}
	}
}
