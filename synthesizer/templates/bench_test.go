package templates

import (
	"context"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/simpolicy"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/synthesizer/calibrate"
	"github.com/traceops/trace/synthesizer/envprog"
)

// BenchmarkCalibrationRunner measures the calibration runner on one core
// (concurrency 1): rollouts/s of calibrate.Run with the simulated policy on
// the precondition_verification template (sim-airline), and beside it, in
// the same run, the same episodes played directly (Reset, Reference, Step,
// Reward, no runner, no policy, no hints). The ratio is what the runner,
// the policy and the hints cost on top of the Starlark program.
func BenchmarkCalibrationRunner(b *testing.B) {
	tpl, err := Instantiate(PreconditionVerification, simulate.Tools(simulate.Airline), Knobs{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	env, err := envprog.Load(ctx, tpl.Name, tpl.Program, envprog.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	defer env.Close()
	pol, err := simpolicy.SimulatedFleetPolicy(simulate.DefaultFleet(), simulate.Airline, "1.4.0", PreconditionVerification)
	if err != nil {
		b.Fatal(err)
	}
	cfg := tpl.CalibrationConfig(calibrate.DefaultConfig())
	cfg.Seeds, cfg.Concurrency = 20, 1
	n := cfg.Seeds * cfg.Rollouts
	var runner, direct time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := calibrate.Run(ctx, env, pol, cfg); err != nil {
			b.Fatal(err)
		}
		runner += time.Since(start)

		start = time.Now()
		for s := 0; s < cfg.Seeds; s++ {
			for r := 0; r < cfg.Rollouts; r++ {
				ep, err := env.Reset(ctx, int64(s))
				if err != nil {
					b.Fatal(err)
				}
				ref, err := ep.Reference(ctx)
				if err != nil {
					b.Fatal(err)
				}
				for _, a := range ref {
					if res, err := ep.Step(ctx, a); err != nil || res.Done {
						break
					}
				}
				if _, err := ep.Reward(ctx); err != nil {
					b.Fatal(err)
				}
				ep.Close()
			}
		}
		direct += time.Since(start)
	}
	rr := float64(n*b.N) / runner.Seconds()
	dr := float64(n*b.N) / direct.Seconds()
	b.ReportMetric(rr, "runner_rollouts/s")
	b.ReportMetric(dr, "direct_rollouts/s")
	b.ReportMetric(rr/dr, "runner/direct")
	b.Logf("runner %.0f rollouts/s, direct %.0f rollouts/s, ratio %.2f (one core; shared machine)", rr, dr, rr/dr)
}
