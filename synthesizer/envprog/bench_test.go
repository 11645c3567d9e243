package envprog_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/traceops/trace/synthesizer/envprog"
)

// The benchmark workload: each episode of the example is a reset, lookups
// repetitions of its reference solution's look-up calls, the reference
// solution itself and the reward (~20 steps, close to the release's 24
// turns). The CPython class in testdata/precondition_airline.py plays the
// same plan. A step is one tool call or the final answer.
const benchLookups = 16

// benchLimits turn the reset cache off: the benchmarks measure the
// interpreter, and they reset the same seeds again (to plan, then in each
// round), which the cache would answer with a copy.
var benchLimits = envprog.Limits{ResetCache: -1}

func loadBenchExample(b *testing.B) envprog.Env {
	env, err := envprog.Load(context.Background(), "precondition_airline.star", exampleSrc(), benchLimits)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { env.Close() })
	return env
}

// plan returns each seed's actions, prepared outside the timed loop;
// arguments are JSON strings, as OpenAI sends them.
func plan(tb testing.TB, env envprog.Env, episodes int) [][]envprog.Action {
	ctx := context.Background()
	plans := make([][]envprog.Action, episodes)
	for seed := range plans {
		ep, err := env.Reset(ctx, int64(seed))
		if err != nil {
			tb.Fatal(err)
		}
		ref, err := ep.Reference(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		ep.Close()
		var reads []envprog.ToolCall
		for _, a := range ref {
			for i := range a.ToolCalls {
				s, _ := json.Marshal(string(a.ToolCalls[i].Arguments))
				a.ToolCalls[i].Arguments = s
				if strings.HasPrefix(a.ToolCalls[i].Name, "get_") {
					reads = append(reads, a.ToolCalls[i])
				}
			}
		}
		acts := make([]envprog.Action, 0, benchLookups+len(ref))
		for i := 0; i < benchLookups; i++ {
			acts = append(acts, envprog.Action{ToolCalls: []envprog.ToolCall{reads[i%len(reads)]}})
		}
		plans[seed] = append(acts, ref...)
	}
	return plans
}

// batched puts each plan's look-ups into one turn (parallel tool calls).
func batched(plans [][]envprog.Action) [][]envprog.Action {
	out := make([][]envprog.Action, len(plans))
	for i, p := range plans {
		var one envprog.Action
		for _, a := range p[:benchLookups] {
			one.ToolCalls = append(one.ToolCalls, a.ToolCalls...)
		}
		out[i] = append([]envprog.Action{one}, p[benchLookups:]...)
	}
	return out
}

// timing is what runPlans measured: the steps taken, and the wall-clock
// and CPU time of the step loops alone (resets and rewards excluded).
type timing struct {
	steps     int
	stepWall  time.Duration
	stepCPU   time.Duration
	wall, cpu time.Duration // the whole loop
}

// runPlans plays the plans from seed first on.
func runPlans(tb testing.TB, env envprog.Env, plans [][]envprog.Action, first int) timing {
	ctx := context.Background()
	var tm timing
	start, cpu := time.Now(), cpuTime()
	for i, acts := range plans {
		seed := int64(first + i)
		ep, err := env.Reset(ctx, seed)
		if err != nil {
			tb.Fatal(err)
		}
		t0, c0 := time.Now(), cpuTime()
		for _, a := range acts {
			if _, err := ep.Step(ctx, a); err != nil {
				tb.Fatal(err)
			}
			tm.steps += max(1, len(a.ToolCalls))
		}
		tm.stepWall += time.Since(t0)
		tm.stepCPU += cpuTime() - c0
		r, err := ep.Reward(ctx)
		if err != nil || r.Value != 1 {
			tb.Fatalf("seed %d: reward %v %v", seed, r, err)
		}
		ep.Close()
	}
	tm.wall, tm.cpu = time.Since(start), cpuTime()-cpu
	return tm
}

// BenchmarkExampleSteps is the in-process step rate of the example on one
// core (GOMAXPROCS 1), b.N episodes.
func BenchmarkExampleSteps(b *testing.B) {
	env := loadBenchExample(b)
	plans := plan(b, env, 1000)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	b.ResetTimer()
	var tm timing
	for i := 0; i < b.N; i++ {
		t := runPlans(b, env, plans[i%len(plans):i%len(plans)+1], i%len(plans))
		tm.steps += t.steps
		tm.stepWall += t.stepWall
	}
	b.ReportMetric(float64(tm.steps)/tm.stepWall.Seconds(), "steps/s")
	b.ReportMetric(float64(tm.steps)/b.Elapsed().Seconds(), "steps/s-with-resets")
}

// rates are step rates: of the step loops alone and of whole episodes
// (with resets and rewards), each by wall-clock and by CPU time.
type rates struct{ stepWall, stepCPU, wall, cpu float64 }

func ratesOf(steps int, stepWall, stepCPU, wall, cpu time.Duration) rates {
	n := float64(steps)
	return rates{n / stepWall.Seconds(), n / stepCPU.Seconds(), n / wall.Seconds(), n / cpu.Seconds()}
}

func (t timing) rates() rates { return ratesOf(t.steps, t.stepWall, t.stepCPU, t.wall, t.cpu) }

func (r rates) best(o rates) rates {
	return rates{max(r.stepWall, o.stepWall), max(r.stepCPU, o.stepCPU), max(r.wall, o.wall), max(r.cpu, o.cpu)}
}

// cpuTime is this process's user+system CPU time (all its threads).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkExampleVersusCPython prints, from one run, the example's steps/s
// in-process on one core, the same logic as a plain CPython class, their
// ratio, and the sandboxed rates. The machine is shared, so Go and CPython
// are measured in alternation, three rounds, each keeping its best round,
// by wall-clock time and by CPU time (CPU time is what contention from
// other processes distorts least). Run it with -benchtime 1x.
func BenchmarkExampleVersusCPython(b *testing.B) {
	const episodes, rounds = 2000, 3
	python, err := exec.LookPath("python3")
	if err != nil {
		b.Skip("python3 is not installed")
	}
	env := loadBenchExample(b)
	plans := plan(b, env, episodes)

	var goRate, pyRate rates
	for round := 0; round < rounds; round++ {
		prev := runtime.GOMAXPROCS(1)
		runPlans(b, env, plans[:200], 0) // warm up
		goRate = goRate.best(runPlans(b, env, plans, 0).rates())
		runtime.GOMAXPROCS(prev)

		out, err := exec.Command(python, "testdata/precondition_airline.py", fmt.Sprint(episodes), fmt.Sprint(benchLookups)).CombinedOutput()
		if err != nil {
			b.Fatalf("python: %v: %s", err, out)
		}
		var steps int
		var wall, cpu, stepWall, stepCPU float64
		if _, err := fmt.Sscanf(string(out), "steps %d seconds %g cpu_seconds %g step_seconds %g step_cpu_seconds %g", &steps, &wall, &cpu, &stepWall, &stepCPU); err != nil {
			b.Fatalf("python printed %q: %v", out, err)
		}
		sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
		pyRate = pyRate.best(ratesOf(steps, sec(stepWall), sec(stepCPU), sec(wall), sec(cpu)))
	}

	// The sandbox: each mode in a worker of its own, CPU time counted in
	// both processes (the worker's once it has exited), less the CPU of
	// starting and stopping a worker without playing.
	const sbEpisodes = 1000
	idle := sandboxRun(b, nil, 1)
	sbRate := sandboxRun(b, plans[:sbEpisodes], 1).less(idle)
	sbBatched := sandboxRun(b, batched(plans[:sbEpisodes]), 1).less(idle)
	const par = 4
	sbParallel := sandboxRun(b, plans[:sbEpisodes], par).less(idle)

	b.ReportMetric(goRate.stepCPU, "go-steps/cpu-s")
	b.ReportMetric(pyRate.stepCPU, "cpython-steps/cpu-s")
	b.ReportMetric(goRate.stepCPU/pyRate.stepCPU, "go/cpython")
	b.ReportMetric(sbRate.cpuRate(), "sandboxed-steps/cpu-s")
	p := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	p("example environment: %d episodes of %d look-ups + the reference solution (~%d steps); best of %d alternating rounds", episodes, benchLookups, benchLookups+3, rounds)
	p("(a shared machine: compare only figures of one run; CPU time is the least distorted by other processes)")
	p("%-34s %12s %12s %14s %14s", "steps/s", "steps, CPU", "steps, wall", "episodes, CPU", "episodes, wall")
	p("%-34s %12.0f %12.0f %14.0f %14.0f", "in-process, one core", goRate.stepCPU, goRate.stepWall, goRate.cpu, goRate.wall)
	p("%-34s %12.0f %12.0f %14.0f %14.0f", "CPython class, "+pythonVersion(python), pyRate.stepCPU, pyRate.stepWall, pyRate.cpu, pyRate.wall)
	p("%-34s %12.2f %12.2f %14.2f %14.2f", "ratio in-process / CPython", goRate.stepCPU/pyRate.stepCPU, goRate.stepWall/pyRate.stepWall, goRate.cpu/pyRate.cpu, goRate.wall/pyRate.wall)
	p("%-34s %12.0f %12.0f %14s %14s", "sandboxed, one call per turn", sbRate.cpuRate(), sbRate.wallRate(), "", "")
	p("%-34s %12.0f %12.0f %14s %14s", "sandboxed, look-ups in one turn", sbBatched.cpuRate(), sbBatched.wallRate(), "", "")
	p("%-34s %12.0f %12.0f %14s %14s", fmt.Sprintf("sandboxed, %d episodes at once", par), sbParallel.cpuRate(), sbParallel.wallRate(), "", "")
	p("(\"steps\": the step loops alone; \"episodes\": whole episodes with reset and reward, in steps/s;")
	p(" sandboxed: whole episodes, CPU of parent and worker; GOMAXPROCS is 1 in-process only)")
}

// session is a sandboxed run: steps, wall-clock time of the play, and CPU
// time of the parent and its worker from load to close.
type session struct {
	steps     int
	wall, cpu time.Duration
}

func (s session) less(idle session) session { s.cpu -= idle.cpu; return s }
func (s session) cpuRate() float64          { return float64(s.steps) / s.cpu.Seconds() }
func (s session) wallRate() float64         { return float64(s.steps) / s.wall.Seconds() }

// childCPU is the CPU time of this process's exited, waited-for children.
func childCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sandboxRun loads the example sandboxed, plays the plans with par
// goroutines, and closes it.
func sandboxRun(b *testing.B, plans [][]envprog.Action, par int) session {
	self, child := cpuTime(), childCPU()
	sb, err := envprog.LoadSandboxed(context.Background(), "precondition_airline.star", exampleSrc(), benchLimits)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	var mu sync.Mutex
	var wg sync.WaitGroup
	steps := 0
	per := len(plans) / par
	for w := 0; w < par; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := runPlans(b, sb, plans[w*per:(w+1)*per], w*per)
			mu.Lock()
			steps += t.steps
			mu.Unlock()
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	sb.Close()
	return session{steps: steps, wall: wall, cpu: cpuTime() - self + childCPU() - child}
}

func pythonVersion(python string) string {
	out, _ := exec.Command(python, "-c", "import platform; print(platform.python_version())").Output()
	return "python " + strings.TrimSpace(string(out))
}

// BenchmarkResetCache is the example's reset as GRPO makes it, a group of
// 8 resets per seed, with the reset cache (the first two run reset, the
// other six copy the second's state) and without it (all eight run
// reset): time per reset, in the same run.
func BenchmarkResetCache(b *testing.B) {
	for _, bc := range []struct {
		name string
		lim  envprog.Limits
	}{{"cache", envprog.Limits{}}, {"no-cache", benchLimits}} {
		b.Run(bc.name, func(b *testing.B) {
			env, err := envprog.Load(context.Background(), "precondition_airline.star", exampleSrc(), bc.lim)
			if err != nil {
				b.Fatal(err)
			}
			defer env.Close()
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				ep, err := env.Reset(ctx, int64(i/8))
				if err != nil {
					b.Fatal(err)
				}
				ep.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/reset")
		})
	}
}
