// Command trainer is a test trainer worker that speaks trace's nats
// training protocol (docs/training-protocol.md) with nothing but nats.go
// and encoding/json, as an external trainer would: it takes jobs from the
// JetStream work queue trace.training.jobs (durable consumer
// trace-trainers) and reports on the job's events subject. It trains
// nothing. What it reports depends on the capability's name:
//
//	…fail…   started, one progress, failed {reason}
//	…silent… started, then nothing (trace's deadline must fail the job)
//	else     started, one progress per iteration (at most 3), succeeded
//
// A job stays un-acked while it runs, with an in-progress ack every third
// of the consumer's ack wait, and is acked (confirmed by the server) once
// its last event is published: a trainer that dies leaves it to be
// redelivered to another one (docs/training-protocol.md, section 3).
//
// It prints "job <id> <mode>" for each job it took, and runs until SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

type job struct {
	JobID      string `json:"job_id"`
	Capability struct {
		Name string `json:"name"`
	} `json:"capability"`
	GRPO struct {
		Iterations int `json:"iterations"`
	} `json:"grpo"`
	Output struct {
		AdapterName string `json:"adapter_name"`
		URI         string `json:"uri"`
	} `json:"output"`
	Report struct {
		EventsSubject string `json:"events_subject"`
	} `json:"report"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		fail(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fail(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "TRACE_TRAINING_JOBS", jetstream.ConsumerConfig{
		Durable: "trace-trainers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Minute, MaxAckPending: 1024}) // as trace's bus makes it
	if err != nil {
		fail(err)
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			continue
		}
		for m := range batch.Messages() {
			var j job
			if err := json.Unmarshal(m.Data(), &j); err != nil {
				fmt.Println("bad job:", err)
				_ = m.Term()
				continue
			}
			// In progress until its last event is out, then acked: the work
			// queue drops it.
			every := max(cons.CachedInfo().Config.AckWait/3, 100*time.Millisecond)
			done := make(chan struct{})
			go func() {
				t := time.NewTicker(every)
				defer t.Stop()
				for {
					select {
					case <-done:
						return
					case <-t.C:
						_ = m.InProgress()
					}
				}
			}()
			run(ctx, js, j)
			close(done)
			if err := m.DoubleAck(ctx); err != nil {
				fmt.Println("ack:", err) // redelivered after the ack wait
			}
		}
	}
}

func run(ctx context.Context, js jetstream.JetStream, j job) {
	mode := "succeed"
	switch {
	case strings.Contains(j.Capability.Name, "fail"):
		mode = "fail"
	case strings.Contains(j.Capability.Name, "silent"):
		mode = "silent"
	}
	fmt.Println("job", j.JobID, mode)
	seq := 0
	send := func(ev map[string]any) {
		ev["schema"], ev["job_id"], ev["at"], ev["seq"], ev["worker"] = "training_event/v1", j.JobID, time.Now().UTC().Format(time.RFC3339Nano), seq, "testdata-trainer"
		seq++
		data, _ := json.Marshal(ev)
		if _, err := js.Publish(ctx, j.Report.EventsSubject, data); err != nil {
			fmt.Println("publish:", err)
		}
	}
	send(map[string]any{"type": "started", "iterations": j.GRPO.Iterations})
	if mode == "silent" {
		return
	}
	n := min(j.GRPO.Iterations, 3)
	if mode == "fail" {
		n = 1
	}
	for i := 1; i <= n; i++ {
		send(map[string]any{"type": "progress", "iteration": i, "iterations": j.GRPO.Iterations,
			"mean_reward": 0.3 + 0.1*float64(i), "reward_std": 0.2, "kl": 0.001 * float64(i)})
	}
	if mode == "fail" {
		send(map[string]any{"type": "failed", "reason": "CUDA out of memory (test trainer)"})
		return
	}
	send(map[string]any{"type": "succeeded", "adapter": map[string]any{"name": j.Output.AdapterName, "uri": j.Output.URI},
		"eval": map[string]any{"mean_reward": 0.71, "success_rate": 0.55, "episodes": 200, "base_mean_reward": 0.45}})
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "trainer:", err)
	os.Exit(1)
}
