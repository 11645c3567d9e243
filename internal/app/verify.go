package app

import (
	"context"

	"github.com/oklog/run"

	"github.com/traceops/trace/verify"
)

// addGuard adds the closed loop's guard to the adapt role (the role that
// owns the adapter registry): every verify.interval it compares each active
// adapter's routed rollouts with its cohort before activation and rolls
// back the ones that made things significantly worse (verify.guard). A
// guard run in flight finishes before shutdown completes (verify.Checker.Run).
//
// The rollback is verify.StoreRollBack, the registry write alone, until the
// adapter lifecycle's rollback transition (with the unload from vLLM)
// replaces it here; the event on trace.adapters.events tells the routers.
func (a *App) addGuard(ctx context.Context, g *run.Group) {
	c := verify.New(a.Cfg.Verify, a.Store, verify.StoreRollBack{Store: a.Store}, a.Bus, a.Log.With("role", "adapt", "component", "guard"))
	a.Verify = c
	addActor(g, ctx, "adapt-guard", c.Run)
	a.Log.Info("adapt role: closed-loop guard", "guard", a.Cfg.Verify.Guard, "interval", c.Config().Interval,
		"min_failures", c.Config().MinFailures, "delta", c.Config().Delta)
}
