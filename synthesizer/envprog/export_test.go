package envprog

import (
	"context"
	"fmt"
)

// Introspection of a sandboxed Env's worker for the tests of package
// envprog_test.

// WorkerStats are a worker's counts (see workerStats).
type WorkerStats = workerStats

// SandboxStats asks env's worker (env from LoadSandboxed) for its counts
// and returns them with the worker's process id.
func SandboxStats(ctx context.Context, env Env) (WorkerStats, int, error) {
	s, ok := env.(*sandbox)
	if !ok {
		return WorkerStats{}, 0, fmt.Errorf("%T is not a sandboxed Env", env)
	}
	return s.stats(ctx)
}

// RestrictSyscalls installs the sandbox worker's seccomp filter on the
// calling process.
func RestrictSyscalls() error { return restrictSyscalls() }
