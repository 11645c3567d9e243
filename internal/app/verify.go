package app

import (
	"context"

	"github.com/oklog/run"

	"github.com/traceops/trace/adapter"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/verify"
)

// addGuard adds the closed loop's guard to the adapt role (the role that
// owns the adapter registry): every verify.interval it compares each active
// adapter's routed rollouts with its cohort before activation and rolls
// back the ones that made things significantly worse (verify.guard). A
// guard run in flight finishes before shutdown completes (verify.Checker.Run).
//
// The rollback is the registry's RollBack transition (active → rolled_back,
// then unloaded from the serving engine when adapter.serving is on), on the
// same Registry as the stage's, so its transitions stay serialised; the
// event on trace.adapters.events tells the routers.
func (a *App) addGuard(ctx context.Context, g *run.Group, reg *adapter.Registry) {
	c := verify.New(a.Cfg.Verify, a.Store, registryRollBack{reg}, a.Bus, a.Log.With("role", "adapt", "component", "guard"))
	a.Verify = c
	addActor(g, ctx, "adapt-guard", c.Run)
	a.Log.Info("adapt role: closed-loop guard", "guard", a.Cfg.Verify.Guard, "interval", c.Config().Interval,
		"min_failures", c.Config().MinFailures, "delta", c.Config().Delta)
}

// registryRollBack is verify.RollBacker over adapter.Registry.RollBack:
// the registry records the transition with the guard's reason (which names
// the event) in the adapter's metadata and unloads it.
type registryRollBack struct{ reg *adapter.Registry }

func (r registryRollBack) RollBack(ctx context.Context, a sink.AdapterRow, reason, _ string) error {
	_, err := r.reg.RollBack(ctx, a.Name, reason)
	return err
}
