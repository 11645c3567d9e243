package adapter_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
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
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/envserver"
	"github.com/traceops/trace/synthesizer/examples"
)

// trainerPython is the python of the reference trainer's venv
// (TRACE_TRAINER_PYTHON; .ci/run builds it from trainer/requirements.txt).
func trainerPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("TRACE_TRAINER_PYTHON")
	if py == "" {
		t.Skip("TRACE_TRAINER_PYTHON is not set: the reference trainer's smoke test needs its venv " +
			"(python3 -m venv /var/cache/trace/trainer-venv && /var/cache/trace/trainer-venv/bin/pip install -r trainer/requirements.txt; " +
			"then TRACE_TRAINER_PYTHON=/var/cache/trace/trainer-venv/bin/python). .ci/run does this.")
	}
	if out, err := exec.Command(py, "-c", "import torch, transformers, trl, peft, openenv, nats").CombinedOutput(); err != nil {
		t.Fatalf("TRACE_TRAINER_PYTHON=%s cannot import the trainer's dependencies: %v\n%s", py, err, out)
	}
	return py
}

// warmupConversations plays the example environment's reference solution
// for seeds in-process and returns them as OpenAI-format conversations
// (system, user, assistant tool calls, tool results, final answer) with
// the tools: the tiny model's supervised warm-up.
func warmupConversations(t *testing.T, env envprog.Env, seeds []int64) []map[string]any {
	t.Helper()
	ctx := context.Background()
	var tools []any
	b, _ := json.Marshal(env.Info().Tools)
	json.Unmarshal(b, &tools)
	var out []map[string]any
	for _, seed := range seeds {
		ep, err := env.Reset(ctx, seed)
		if err != nil {
			t.Fatal(err)
		}
		st := ep.Start()
		msgs := []map[string]any{{"role": "system", "content": st.System}, {"role": "user", "content": st.User}}
		ref, err := ep.Reference(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range ref {
			m := map[string]any{"role": "assistant", "content": a.Content}
			var calls []any
			for j := range a.ToolCalls {
				a.ToolCalls[j].ID = "call_" + string(rune('a'+i)) + string(rune('0'+j))
				var args any
				json.Unmarshal(a.ToolCalls[j].Arguments, &args)
				calls = append(calls, map[string]any{"id": a.ToolCalls[j].ID, "type": "function",
					"function": map[string]any{"name": a.ToolCalls[j].Name, "arguments": args}})
			}
			if calls != nil {
				m["tool_calls"] = calls
			}
			msgs = append(msgs, m)
			res, err := ep.Step(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res.ToolResults {
				msgs = append(msgs, map[string]any{"role": "tool", "content": r.Content, "tool_call_id": r.ToolCallID})
			}
			if res.Done {
				break
			}
		}
		ep.Close()
		out = append(out, map[string]any{"messages": msgs, "tools": tools})
	}
	return out
}

type episodeRec struct {
	Phase      string             `json:"phase"`
	Step       int                `json:"step"`
	EpisodeID  string             `json:"episode_id"`
	Seed       int64              `json:"seed"`
	Hinted     bool               `json:"hinted"`
	ToolCalls  int                `json:"tool_calls"`
	ToolErrors int                `json:"tool_errors"`
	Reward     float64            `json:"reward"`
	Components map[string]float64 `json:"components"`
}

type envEpisode struct {
	Seed       int64
	Steps      uint32
	Reward     float64
	Hinted     uint8
	DoneReason string
	Components string
}

// TestReferenceTrainerSmoke is the reference trainer's CPU smoke test: a
// tiny Qwen3-shaped model made on the spot (random weights, a tokenizer
// trained here, Qwen3's chat template) and warmed up on reference
// transcripts, then trace_trainer --nats takes the adapt role's job from
// JetStream and trains a LoRA with TRL's GRPOTrainer for 2 optimizer
// steps against the example environment served by trace's environment
// server (episodes recorded in ClickHouse env_episodes). It checks the
// events, that the model's tool calls reached the server and the rewards
// the trainer saw are the server's, the PEFT adapter files, and the
// adapters row the adapt role registered.
func TestReferenceTrainerSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the reference trainer's smoke test trains a model (minutes on 2 cores)")
	}
	py := trainerPython(t)
	t0 := time.Now()
	srv := testenv.NATS(t)
	ch := testenv.ClickHouse(t)
	st := ch.Store()
	ctx := context.Background()
	trainerDir, err := filepath.Abs("../trainer")
	if err != nil {
		t.Fatal(err)
	}

	// trace's environment server with the example environment, under the
	// id of the ready event below.
	ready := readyFor("t-reftrainer", "precondition_verification")
	env, err := envprog.Load(ctx, examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	cfg := envserver.DefaultConfig()
	cfg.RecordFlush = 50 * time.Millisecond
	hs := serveEnv(t, ready.EnvironmentID, env, cfg, st)

	// The tiny base model, warmed up on 200 reference transcripts (training
	// seeds lie below the held-out ones, from 1000).
	work := t.TempDir()
	if d := os.Getenv("TRACE_TRAINER_SMOKE_DIR"); d != "" { // keep the model, adapter and logs to look at
		work = d
		os.RemoveAll(filepath.Join(work, "adapters"))
	}
	var seeds []int64
	for s := int64(0); s < 200; s++ {
		seeds = append(seeds, 500+s)
	}
	wb, _ := json.Marshal(warmupConversations(t, env, seeds))
	warmup := filepath.Join(work, "warmup.json")
	os.WriteFile(warmup, wb, 0o644)
	model := filepath.Join(work, "tiny-qwen3")
	if _, err := os.Stat(filepath.Join(model, "config.json")); err == nil && os.Getenv("TRACE_TRAINER_SMOKE_DIR") != "" {
		t.Logf("reusing the tiny model in %s", model)
	} else {
		tw := time.Now()
		cmd := exec.Command(py, "-m", "trace_trainer.tiny", "--out", model, "--warmup", warmup, "--steps", "500")
		cmd.Dir = trainerDir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("trace_trainer.tiny: %v\n%s", err, out)
		}
		t.Logf("tiny model (%.1fs): %s", time.Since(tw).Seconds(), lastLine(string(out)))
	}

	// The adapt role, planning tiny jobs.
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	pc := plan.DefaultConfig()
	pc.Heartbeat, pc.Deadline = 2*time.Second, 5*time.Minute
	pc.EnvServerURL = hs.URL
	adapters := filepath.Join(work, "adapters")
	pc.OutputURI = "file://" + adapters
	zero := 0.0
	pc.Defaults = plan.Settings{BaseModel: model, LoRARank: 4, LoRAAlpha: 8, GroupSize: 4, GroupsPerIteration: 1, Iterations: 2,
		LearningRate: 1e-4, HintRatio: &zero, EvalSeeds: 2, EvalRollouts: 2}
	role := startRolePlan(t, b, st, pc, time.Second)
	defer role.stop()

	// The trainer, as a worker on the nats protocol.
	logs := startRefTrainer(t, py, trainerDir, srv.URL())

	if err := b.PublishEnvironmentReady(ctx, ready); err != nil {
		t.Fatal(err)
	}
	jobID := schemas.TrainingJobID(ready.EnvironmentID, 1)
	waitFor(t, "the reference trainer's job", 10*time.Minute, func() bool {
		j, err := st.TrainingJob(ctx, jobID)
		if err != nil {
			t.Fatal(err)
		}
		return j != nil && adapter.Terminal(j.Status)
	})
	j, _ := st.TrainingJob(ctx, jobID)
	if j.Status != adapter.StatusSucceeded {
		t.Fatalf("job %s: %s (%s)\ntrainer:\n%s", jobID, j.Status, j.Reason, logs())
	}
	// TRL's GRPO resets a prompt's seed once per generation (group size 4),
	// after the trainer fetched the seed's prompt with a reset of its own:
	// the program's reset cache answers from a seed's third reset on.
	rc, err := envprog.ResetCacheOf(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Hits == 0 {
		t.Errorf("the reset cache answered no reset of the trainer's (%+v): GRPO's generations of a prompt did not repeat its seed", rc)
	}
	t.Logf("reset cache over the training run (warm-up resets included): %d hits, %d misses", rc.Hits, rc.Misses)

	// The events: started, a progress event per optimizer step, succeeded.
	evs, err := st.TrainingEvents(ctx, jobID)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	var progress []sink.TrainingEventRow
	var succeeded map[string]any
	for _, e := range evs {
		if e.Type == "heartbeat" {
			continue
		}
		types = append(types, e.Type)
		switch e.Type {
		case "progress":
			progress = append(progress, e)
		case "succeeded":
			json.Unmarshal([]byte(e.Payload), &succeeded)
		}
	}
	if strings.Join(types, ",") != "dispatched,started,progress,progress,succeeded" {
		t.Fatalf("history: %v", types)
	}
	for i, p := range progress {
		if p.Iteration != int32(i+1) || p.RewardStd < 0 || p.HasKL {
			t.Errorf("progress %d: %+v (kl_coef 0: no KL)", i, p)
		}
	}

	// What the trainer saw of every episode, and what the server recorded.
	name := j.AdapterName
	dir := filepath.Join(adapters, name)
	var recs []episodeRec
	f, err := os.Open(filepath.Join(dir, "episodes.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r episodeRec
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	f.Close()
	// 2 held-out seeds × 2 rollouts before and after training, 4 rollouts × 2 steps.
	want := map[string]int{"eval_base": 4, "train": 8, "eval": 4}
	got := map[string]int{}
	for _, r := range recs {
		got[r.Phase]++
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%d %s episodes in episodes.jsonl, want %d (%v)", got[k], k, n, got)
		}
	}
	server := map[string]envEpisode{}
	deadline := time.Now().Add(20 * time.Second)
	for len(server) < len(recs) && time.Now().Before(deadline) {
		rows, err := ch.Conn().Query(ctx, `SELECT episode_id, seed, steps, reward, hinted, done_reason, components FROM env_episodes FINAL
	WHERE environment_id = ?`, ready.EnvironmentID)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			var e envEpisode
			if err := rows.Scan(&id, &e.Seed, &e.Steps, &e.Reward, &e.Hinted, &e.DoneReason, &e.Components); err != nil {
				t.Fatal(err)
			}
			server[id] = e
		}
		rows.Close()
		time.Sleep(100 * time.Millisecond)
	}
	if len(server) != len(recs) {
		t.Fatalf("env_episodes has %d episodes of %s, the trainer finished %d", len(server), ready.EnvironmentID, len(recs))
	}
	toolCalls, stepReward := 0, map[int][]float64{}
	var evalRewards []float64
	for _, r := range recs {
		e, ok := server[r.EpisodeID]
		if !ok {
			t.Errorf("episode %s (%s, seed %d) is not in env_episodes", r.EpisodeID, r.Phase, r.Seed)
			continue
		}
		if e.Reward != r.Reward || e.Seed != r.Seed {
			t.Errorf("episode %s: the trainer saw reward %v for seed %d, the server computed %v for seed %d", r.EpisodeID, r.Reward, r.Seed, e.Reward, e.Seed)
		}
		// Every tool call that reached the server is an assistant turn of
		// the episode (a protocol error leaves the episode as it was); the
		// final answer is one more.
		if e.DoneReason == "final" && int(e.Steps) != r.ToolCalls-r.ToolErrors+1 {
			t.Errorf("episode %s: %d turns on the server, the trainer made %d tool calls (%d refused) and a final answer", r.EpisodeID, e.Steps, r.ToolCalls, r.ToolErrors)
		}
		toolCalls += r.ToolCalls - r.ToolErrors
		switch r.Phase {
		case "train":
			stepReward[r.Step] = append(stepReward[r.Step], e.Reward)
		case "eval":
			evalRewards = append(evalRewards, e.Reward)
		}
	}
	if toolCalls == 0 {
		t.Errorf("no tool call of the model reached the environment server (the warm-up did not teach it to call tools)")
	}
	for i, p := range progress {
		rs := stepReward[i+1]
		if len(rs) != 4 || math.Abs(p.MeanReward-mean(rs)) > 1e-6 {
			t.Errorf("progress %d: mean reward %v, the server's rewards of that step %v (mean %v)", i+1, p.MeanReward, rs, mean(rs))
		}
	}

	// The adapter: a standard PEFT directory with the plan's LoRA.
	var ac struct {
		R             int      `json:"r"`
		Alpha         int      `json:"lora_alpha"`
		TargetModules []string `json:"target_modules"`
		PeftType      string   `json:"peft_type"`
		Base          string   `json:"base_model_name_or_path"`
	}
	acb, err := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(acb, &ac)
	if ac.R != 4 || ac.Alpha != 8 || ac.PeftType != "LORA" || len(ac.TargetModules) != 7 || ac.Base != model {
		t.Errorf("adapter_config.json: %+v", ac)
	}
	if fi, err := os.Stat(filepath.Join(dir, "adapter_model.safetensors")); err != nil || fi.Size() < 1000 {
		t.Errorf("adapter_model.safetensors: %v %v", fi, err)
	}

	// The registry row, from the adapt role's handling of succeeded.
	a, err := st.Adapter(ctx, name)
	if err != nil || a == nil {
		t.Fatalf("adapter %s not registered: %v", name, err)
	}
	ev := succeeded["eval"].(map[string]any)
	if a.Status != adapter.AdapterCandidate || a.JobID != jobID || a.URI != "file://"+dir || a.BaseModel != model || a.Simulated ||
		math.Abs(a.EvalMeanReward-mean(evalRewards)) > 1e-9 || a.EvalMeanReward != ev["mean_reward"].(float64) ||
		ev["episodes"].(float64) != 4 {
		t.Errorf("adapter row %+v; succeeded eval %v; held-out rewards on the server %v", a, ev, evalRewards)
	}
	t.Logf("smoke test (nats protocol): %d episodes, %d tool calls reached the server, rewards per step %v, held-out %v (base %v), %.1fs in all",
		len(recs), toolCalls, stepReward, evalRewards, ev["base_mean_reward"], time.Since(t0).Seconds())

	// The same trainer on the command protocol: plan revision 2 of the
	// environment, run by the command backend as `python -m trace_trainer
	// --spec {spec}` (events as JSON lines on its stdout, its exit code
	// mapped), on the model built above.
	tc := time.Now()
	cb, err := dispatch.NewCommand(dispatch.CommandConfig{Argv: []string{py, "-m", "trace_trainer", "--spec", "{spec}"}, Dir: trainerDir,
		SpecDir: t.TempDir(), Timeout: 10 * time.Minute}.WithDefaults(), slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := adapter.NewStage(adapter.Config{Plan: pc, Store: st, Claims: b, Backend: cb, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	cb.Reporter, cb.Relay = cs, b // its events are applied by the role's events consumer
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	go func() { _ = cb.Run(runCtx) }()
	res, _, err := cs.DispatchReady(ctx, ready, 2)
	if err != nil || !res.Dispatched {
		t.Fatalf("command dispatch: %+v %v", res, err)
	}
	cb.Wait()
	eventsApplied(t, b)
	cj, err := st.TrainingJob(ctx, res.JobID)
	if err != nil || cj == nil {
		t.Fatalf("job %s: %v", res.JobID, err)
	}
	if cj.Status != adapter.StatusSucceeded || cj.Backend != "command" || cj.Iteration != 2 {
		t.Fatalf("command job %s: %s backend %s iteration %d (%s)", res.JobID, cj.Status, cj.Backend, cj.Iteration, cj.Reason)
	}
	ctypes, _ := historyTypes(t, st, res.JobID)
	if count(ctypes, "started") != 1 || count(ctypes, "progress") != 2 || count(ctypes, "succeeded") != 1 || count(ctypes, "malformed") != 0 {
		t.Fatalf("command job history: %v", ctypes)
	}
	ca, err := st.Adapter(ctx, cj.AdapterName)
	if err != nil || ca == nil || ca.JobID != res.JobID || ca.Status != adapter.AdapterCandidate {
		t.Fatalf("command job's adapter %s: %+v %v", cj.AdapterName, ca, err)
	}
	if _, err := os.Stat(filepath.Join(strings.TrimPrefix(ca.URI, "file://"), "adapter_model.safetensors")); err != nil {
		t.Errorf("command job's adapter files: %v", err)
	}
	t.Logf("smoke test (command protocol): job %s %s, adapter %s, %.1fs", res.JobID, cj.Status, ca.Name, time.Since(tc).Seconds())
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndex(s, "\n")+1:]
}

// startRefTrainer runs python -m trace_trainer --nats; the returned
// function returns what it logged.
func startRefTrainer(t *testing.T, py, dir, natsURL string) func() string {
	t.Helper()
	cmd := exec.Command(py, "-m", "trace_trainer", "--nats", natsURL, "--max-completion-length", "768", "--worker", "smoke-test")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1", "TOKENIZERS_PARALLELISM=false", "TRL_EXPERIMENTAL_SILENCE=1")
	var mu sync.Mutex
	var buf strings.Builder
	pr, pw, _ := os.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "trace-trainer:") {
				t.Log(sc.Text())
			}
			mu.Lock()
			buf.WriteString(sc.Text() + "\n")
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
		}
	})
	return func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }
}

// TestTrainerEnvURL: the reference trainer puts the job's token into the
// environment URL as its password, keeping the host and port as written
// (an IPv6 address in brackets came out as trace:tok@::1:8090, no URL).
func TestTrainerEnvURL(t *testing.T) {
	py := trainerPython(t)
	script := `import json, sys
sys.path.insert(0, "../trainer")
from trace_trainer.environment import env_url
for u in json.load(sys.stdin):
    print(env_url({"env_server": {"base_url": u, "token_env": "TRACE_TEST_ENV_TOKEN"}}))`
	cases := []struct{ in, want string }{
		{"http://127.0.0.1:8090/v1/environments/e", "http://trace:t%2Fk@127.0.0.1:8090/v1/environments/e"},
		{"http://[::1]:8090/v1/environments/e", "http://trace:t%2Fk@[::1]:8090/v1/environments/e"},
		{"https://envs.example.com/v1/environments/e", "https://trace:t%2Fk@envs.example.com/v1/environments/e"},
		{"ws://old:secret@10.0.0.5:8090/v1/environments/e", "ws://trace:t%2Fk@10.0.0.5:8090/v1/environments/e"},
	}
	var ins []string
	for _, c := range cases {
		ins = append(ins, c.in)
	}
	in, _ := json.Marshal(ins)
	cmd := exec.Command(py, "-c", script)
	cmd.Stdin = bytes.NewReader(in)
	cmd.Env = append(os.Environ(), "TRACE_TEST_ENV_TOKEN=t/k")
	out, err := cmd.CombinedOutput()
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil || len(got) != len(cases) {
		t.Fatalf("env_url: %v\n%s", err, out)
	}
	for i, c := range cases {
		if got[i] != c.want {
			t.Errorf("env_url(%s) = %s, want %s", c.in, got[i], c.want)
		}
	}
}

// TestTrainerToolMethodsKeepDescriptions: the reference trainer writes a
// Python method per tool, its description in the docstring; descriptions
// come from programs and rollouts, and one with a backslash ("C:\Users",
// a trailing "\") or ending in a quote was a SyntaxError that failed every
// job of the environment. Each now comes through verbatim.
func TestTrainerToolMethodsKeepDescriptions(t *testing.T) {
	py := trainerPython(t)
	script := `import json, sys
sys.path.insert(0, "../trainer")
from trace_trainer.environment import environment_class
tools = json.load(sys.stdin)
cls = environment_class("http://127.0.0.1:1", tools, None)
for t in tools:
    f = t["function"]
    doc = getattr(cls, f["name"]).__doc__
    want = [f["description"]] + [p["description"] for p in f["parameters"].get("properties", {}).values()]
    print(all(w in doc for w in want))`
	descs := []string{`Reads C:\Users\x and \N{x}`, `ends with a backslash \`, `says "hi"`, `three """ quotes""`}
	var tools []map[string]any
	for i, d := range descs {
		params := map[string]any{"type": "object", "properties": map[string]any{}}
		if i%2 == 1 { // the docstring with an Args section
			params["properties"] = map[string]any{"arg": map[string]any{"type": "string", "description": d}}
		}
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{"name": fmt.Sprintf("tool_%d", i), "description": d, "parameters": params}})
	}
	in, _ := json.Marshal(tools)
	cmd := exec.Command(py, "-c", script)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != strings.TrimSpace(strings.Repeat("True\n", len(descs))) {
		t.Fatalf("tool methods of descriptions %q: %v\n%s", descs, err, out)
	}
}

// TestTrainerReportsABadJob: a job the NATS worker cannot run (here, no
// lora.rank) is reported failed on its events subject with the reason, so
// that trace fails it at once; it used to be dropped with a log line, and
// the job waited out its deadline (30 minutes by default).
func TestTrainerReportsABadJob(t *testing.T) {
	py := trainerPython(t)
	srv := testenv.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	trainerDir, err := filepath.Abs("../trainer")
	if err != nil {
		t.Fatal(err)
	}
	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	jobID := "job-0123456789abcdef"
	events, err := b.NC.SubscribeSync("trace.training.events." + jobID)
	if err != nil {
		t.Fatal(err)
	}
	logs := startRefTrainer(t, py, trainerDir, srv.URL())
	spec, _ := json.Marshal(map[string]any{"schema": "training_job/v1", "job_id": jobID, "base_model": "m",
		"env_server": map[string]any{"base_url": "http://127.0.0.1:1"},
		"report":     map[string]any{"events_subject": "trace.training.events." + jobID}})
	if err := b.PublishTrainingJob(ctx, jobID, spec); err != nil {
		t.Fatal(err)
	}
	msg, err := events.NextMsg(2 * time.Minute) // the worker imports torch first
	if err != nil {
		t.Fatalf("no event for the bad job: %v\n%s", err, logs())
	}
	// Decoded as the adapt role decodes events (training_event/v1).
	ev, err := schemas.DecodeTrainingEvent(msg.Data)
	if err != nil || ev.JobID != jobID || ev.Type != schemas.EventFailed || !strings.Contains(ev.Reason, "lora.rank: missing") || ev.Worker != "smoke-test" {
		t.Fatalf("event %s (%v), want failed naming lora.rank", msg.Data, err)
	}
}

// TestTrainerToolsNamedLikeItsState: an environment's tools become
// methods of the trainer's environment class, which kept its own state
// in public attributes (url, log, result, seed, hinted, tool_calls,
// tool_errors). A tool named like one of them replaced it or was shadowed
// by it: a tool "log" replaced the episode log (every rollout's reward
// then failed: 'function' object has no attribute 'add'), a tool "seed"
// was hidden by the episode's seed, so what TRL takes for the tool was an
// int. Played here through trace's environment server as TRL plays it.
func TestTrainerToolsNamedLikeItsState(t *testing.T) {
	py := trainerPython(t)
	ctx := context.Background()
	tool := func(name string) string {
		return fmt.Sprintf(`{"type": "function", "function": {"name": %q, "description": "The %s tool.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string", "description": "Anything."}}, "required": ["text"]}}}`, name, name)
	}
	names := []string{"log", "seed", "result", "url", "hinted", "tool_calls", "tool_errors"}
	var toolSchemas []string
	for _, n := range names {
		toolSchemas = append(toolSchemas, tool(n))
	}
	src := `"""Tools named like the trainer's own state. One sentence. Two sentences."""

def tools():
    return [` + strings.Join(toolSchemas, ",\n        ") + `]

def reset(seed):
    return {"system": "Call every tool.", "user": "Go.", "state": {"called": []}}

def step(state, call):
    if call["type"] == "final":
        return {"state": state, "done": True}
    state["called"].append(call["name"])
    return {"result": "ok " + call["name"], "state": state}

def reward(state, transcript):
    return {"reward": len(state["called"]) / 7.0}
`
	env, err := envprog.Load(ctx, "state_names.star", []byte(src), envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	hs := serveEnv(t, "env-0123456789abcdef", env, envserver.DefaultConfig(), nil)
	script := `import inspect, json, sys
sys.path.insert(0, "../trainer")
from trace_trainer.environment import EpisodeLog, environment_class, start_of
url = sys.argv[1]
tools = start_of(url, 0, False)["tools"]
log = EpisodeLog(None)
env = environment_class(url, tools, log)()
# What TRL's GRPOTrainer takes for tools: every public function of the
# class other than reset and get_reward, read from the instance.
names = [n for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
         if n not in ("reset", "get_reward") and not n.startswith("_")]
env.reset(seed=0, hinted=False)
results = {n: getattr(env, n)(text="x") if callable(getattr(env, n)) else repr(getattr(env, n)) for n in names}
reward = env._finish("done")
print(json.dumps({"tools": sorted(names), "results": results, "reward": reward, "logged": len(log.rows)}))`
	out, err := exec.Command(py, "-c", script, hs.URL+"/v1/environments/env-0123456789abcdef").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var got struct {
		Tools   []string          `json:"tools"`
		Results map[string]string `json:"results"`
		Reward  float64           `json:"reward"`
		Logged  int               `json:"logged"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, n := range names {
		if got.Results[n] != "ok "+n {
			t.Errorf("tool %s answered %q, want %q", n, got.Results[n], "ok "+n)
		}
	}
	if len(got.Tools) != len(names) || got.Reward != 1 || got.Logged != 1 {
		t.Errorf("tools %v, reward %v, episodes logged %d; want the %d tools, reward 1 and 1 episode", got.Tools, got.Reward, got.Logged, len(names))
	}
}

// serveEnv serves env as environment id on trace's environment server
// (episodes recorded to w unless nil) until the test ends.
func serveEnv(t *testing.T, id string, env envprog.Env, cfg envserver.Config, w envserver.EpisodeWriter) *httptest.Server {
	t.Helper()
	cat := envserver.NewStaticCatalog()
	if err := cat.Add(id, env, envserver.Entry{}); err != nil {
		t.Fatal(err)
	}
	es, err := envserver.New(cfg, envserver.Options{Catalog: cat, Writer: w})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(es.Handler())
	t.Cleanup(func() {
		hs.Close()
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		es.Close(c)
	})
	return hs
}
