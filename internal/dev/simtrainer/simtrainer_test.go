package simtrainer_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/adapter/dispatch"
	"github.com/traceops/trace/adapter/plan"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/simtrainer"
	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/schemas"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func job(id string, iterations int) *schemas.TrainingJob {
	return &schemas.TrainingJob{JobID: id, GRPO: schemas.GRPOSettings{Iterations: iterations},
		Eval: schemas.EvalPlan{Seeds: []int64{1000, 1001, 1002}, RolloutsPerSeed: 4}, Output: schemas.JobOutput{AdapterName: "cap-abcdef12"}}
}

// TestSimulate: the curve is deterministic per (seed, job), starts near the
// base, ends clearly above it, stays in [0, 1], and the adapter is marked
// simulated in its name and URI.
func TestSimulate(t *testing.T) {
	for _, tc := range []struct {
		name       string
		base       float64
		iterations int
	}{{"low base", 0.1, 20}, {"mid base", 0.45, 40}, {"high base", 0.9, 10}, {"one iteration", 0.3, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			j := job("job-0123456789abcdef", tc.iterations)
			a, b := simtrainer.Simulate(7, j, tc.base), simtrainer.Simulate(7, j, tc.base)
			if len(a.Curve) != tc.iterations {
				t.Fatalf("%d points, want %d", len(a.Curve), tc.iterations)
			}
			for i := range a.Curve {
				if a.Curve[i] != b.Curve[i] {
					t.Fatalf("not deterministic at %d: %+v vs %+v", i, a.Curve[i], b.Curve[i])
				}
				p := a.Curve[i]
				if p.Iteration != i+1 || p.MeanReward < 0 || p.MeanReward > 1 || p.RewardStd < 0 || p.KL <= 0 {
					t.Fatalf("point %+v", p)
				}
			}
			last := a.Curve[len(a.Curve)-1].MeanReward
			if tc.iterations > 1 {
				if first := a.Curve[0].MeanReward; math.Abs(first-tc.base) > 0.15 {
					t.Errorf("first reward %.3f is far from the base %.3f", first, tc.base)
				}
				if last < tc.base+0.03 && tc.base < 0.9 {
					t.Errorf("last reward %.3f did not rise above the base %.3f", last, tc.base)
				}
			}
			if a.Eval.MeanReward != last || a.Eval.BaseMeanReward == nil || *a.Eval.BaseMeanReward != tc.base || a.Eval.Episodes != 12 {
				t.Errorf("eval %+v", a.Eval)
			}
			if a.AdapterName != "sim-cap-abcdef12" || a.URI != "sim://simtrainer/sim-cap-abcdef12" {
				t.Errorf("adapter %q %q", a.AdapterName, a.URI)
			}
		})
	}
	j := job("job-0123456789abcdef", 20)
	if x, y := simtrainer.Simulate(1, j, 0.4), simtrainer.Simulate(2, j, 0.4); x.Curve[19] == y.Curve[19] && x.Curve[10] == y.Curve[10] {
		t.Error("another seed gives the same curve")
	}
}

func readyFor(trigger string) *schemas.EnvironmentReady {
	id := schemas.EnvironmentID(trigger)
	hash := strings.Repeat("ab", 32)
	return &schemas.EnvironmentReady{Schema: schemas.EnvironmentReadySchema, EnvironmentID: id, TriggerID: trigger, Environment: "sim-airline",
		AgentVersion: "1.4.0", DictionaryVersion: 1,
		Capability:  schemas.ReadyCapability{Name: "precondition_verification", Definition: "d"},
		Program:     schemas.ReadyProgram{Hash: hash, Origin: schemas.OriginTemplate, Tools: []string{"get_reservation_details"}, Attempts: 1},
		Calibration: schemas.ReadyCalib{Policy: "simulated", Simulated: true, Seeds: 100, RolloutsPerSeed: 16, Temperature: 0.7, MeanReward: 0.42, StdReward: 0.4, SuccessRate: 0.38, PassAtK: map[string]float64{"1": 0.38}},
		Fetch:       schemas.ReadyFetch{Path: schemas.EnvironmentProgramPath(id), ClickHouse: schemas.ClickHouseRef{Table: "environments", EnvironmentID: id, ProgramHash: hash}},
		ReadyAt:     time.Now().UTC().Truncate(time.Second)}
}

// TestTrainerEndToEnd: the adapt role (nats backend) dispatches the job of
// a ready environment; the simulated trainer, on its own NATS connection,
// takes it from the work queue and reports; the role records the history
// (started, every progress point, succeeded), ends the job SUCCEEDED and
// registers the adapter as simulated, with the sim:// URI.
func TestTrainerEndToEnd(t *testing.T) {
	srv := testenv.NATS(t)
	st := testenv.ClickHouse(t).Store()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	pc := plan.DefaultConfig()
	pc.Defaults.Iterations = 12
	stage, err := adapter.NewStage(adapter.Config{Plan: pc, Store: st, Claims: b, Backend: dispatch.NATS{Pub: b}, Simulated: true})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := b.ReadyConsumer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	ec, err := b.TrainingEventsConsumer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go stage.RunReady(rctx, rc)
	go stage.RunEvents(rctx, ec)

	_, js := srv.Connect(t)
	var (
		mu                   sync.Mutex
		bases                []string
		pendingWhileTraining []int
	)
	tr, err := simtrainer.New(simtrainer.Config{JS: js, Seed: 3, Step: 5 * time.Millisecond, Log: slog.Default(),
		Base: func(ctx context.Context, j *schemas.TrainingJob) (float64, error) {
			// While the job trains its message is held, not acked (the
			// pause lets an ack sent as the job was taken reach the server).
			time.Sleep(300 * time.Millisecond)
			c, err := b.JS.Consumer(ctx, bus.StreamTrainingJobs, bus.DurableTrainers)
			if err != nil {
				return 0, err
			}
			info, err := c.Info(ctx)
			if err != nil {
				return 0, err
			}
			mu.Lock()
			defer mu.Unlock()
			bases = append(bases, j.EnvironmentID)
			pendingWhileTraining = append(pendingWhileTraining, info.NumAckPending)
			return 0.42, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	go tr.Run(rctx)

	r := readyFor("t-sim")
	if err := b.PublishEnvironmentReady(ctx, r); err != nil {
		t.Fatal(err)
	}
	id := schemas.TrainingJobID(r.EnvironmentID, 1)
	for {
		j, err := st.TrainingJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if j != nil && adapter.Terminal(j.Status) {
			if j.Status != adapter.StatusSucceeded || !j.Simulated || j.Iteration != 12 {
				t.Fatalf("job %+v", j)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("job %s did not end: %+v", id, j)
		}
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bases) != 1 || bases[0] != r.EnvironmentID {
		t.Errorf("base reward asked for %v", bases)
	}
	// The protocol's acks: held while it trained, acked once it ended.
	if len(pendingWhileTraining) != 1 || pendingWhileTraining[0] != 1 {
		t.Errorf("ack-pending jobs while training: %v, want [1] (acked only when it ends)", pendingWhileTraining)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		s, err := b.JS.Stream(ctx, bus.StreamTrainingJobs)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d jobs left on the work queue after the job ended, want it acked", info.State.Msgs)
		}
	}
	evs, err := st.TrainingEvents(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	var rewards []float64
	for _, e := range evs {
		types = append(types, e.Type)
		if e.Type == "progress" {
			rewards = append(rewards, e.MeanReward)
			if !e.HasKL || e.RewardStd <= 0 {
				t.Errorf("progress event without KL or std: %+v", e)
			}
		}
	}
	if len(types) != 15 || types[0] != "dispatched" || types[1] != "started" || types[14] != "succeeded" || len(rewards) != 12 {
		t.Fatalf("history %v", types)
	}
	want := simtrainer.Simulate(3, &schemas.TrainingJob{JobID: id, GRPO: schemas.GRPOSettings{Iterations: 12}}, 0.42)
	for i, p := range want.Curve {
		if rewards[i] != p.MeanReward {
			t.Fatalf("reward %d = %v, the simulation says %v", i, rewards[i], p.MeanReward)
		}
	}
	j, _ := st.TrainingJob(ctx, id)
	ad, err := st.Adapter(ctx, simtrainer.NamePrefix+j.AdapterName)
	if err != nil || ad == nil {
		t.Fatalf("adapter not registered: %v", err)
	}
	var meta map[string]any
	_ = json.Unmarshal([]byte(ad.Metadata), &meta)
	if ad.Status != adapter.AdapterCandidate || !ad.Simulated || !strings.HasPrefix(ad.URI, "sim://") || ad.JobID != id ||
		meta["simulated"] != true || !strings.Contains(meta["trainer"].(string), "simulated") || meta["worker"] != simtrainer.Worker ||
		ad.EvalMeanReward != want.Eval.MeanReward {
		t.Fatalf("adapter %+v", ad)
	}
}

// signalHandler is a slog handler that sends each record's message whose
// text contains match on ch (without blocking).
type signalHandler struct {
	match string
	ch    chan string
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) {
		select {
		case h.ch <- r.Message:
		default:
		}
	}
	return nil
}
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

// TestTrainerSurvivesNATSOutage: NATS is down when the simulated trainer
// reports a job's first event. It abandoned the job at that first publish
// error (a demo job then hung RUNNING until its deadline); it retries
// until NATS is back and reports the whole run, each event stored once.
// With NATS down and the trainer's context ended, Train returns.
func TestTrainerSurvivesNATSOutage(t *testing.T) {
	srv := testenv.NATS(t)
	ctx, cancel := context.WithCancel(context.Background()) // no deadline: as the demo's
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test") // the streams
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	_, js := srv.Connect(t, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	retrying := make(chan string, 1)
	tr, err := simtrainer.New(simtrainer.Config{JS: js, Seed: 3, Log: slog.New(signalHandler{match: "retry", ch: retrying})})
	if err != nil {
		t.Fatal(err)
	}
	j := job("job-0123456789abcdef", 5)
	j.Report.EventsSubject = schemas.TrainingEventsSubject(j.JobID)

	srv.Shutdown()
	done := make(chan error, 1)
	go func() { done <- tr.Train(ctx, j) }()
	select {
	case <-retrying:
	case err := <-done:
		t.Fatalf("the job was abandoned while NATS was down: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no publish was retried")
	}
	srv.Restart()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("after the outage: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the job's run did not end after NATS came back")
	}
	_, rjs := srv.Connect(t)
	stream, err := rjs.Stream(ctx, bus.StreamTrainingEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(j.Report.EventsSubject))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[j.Report.EventsSubject]; n != 7 { // started, 5 progress, succeeded
		t.Errorf("%d events stored, want 7", n)
	}

	// NATS down again: ending the context ends the retries.
	srv.Shutdown()
	cctx, ccancel := context.WithCancel(ctx)
	j2 := job("job-fedcba9876543210", 5)
	j2.Report.EventsSubject = schemas.TrainingEventsSubject(j2.JobID)
	go func() { done <- tr.Train(cctx, j2) }()
	select {
	case <-retrying:
	case <-time.After(30 * time.Second):
		t.Fatal("no publish was retried")
	}
	ccancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Train at the context's end: %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Train did not return at the context's end")
	}
}
