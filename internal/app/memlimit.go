package app

import (
	"log/slog"
	"math"
	"os"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// memoryLimitRatio is the share of the cgroup's memory limit given to Go
// as its soft limit: the rest is for what Go does not count (the
// runtime's own, C libraries, the page cache of files it writes).
const memoryLimitRatio = 0.9

// SetMemoryLimit sets Go's soft memory limit (GOMEMLIMIT) to 90 % of the
// memory limit of the process's cgroup (its container's, v1 or v2), so
// that the collector works harder as the heap nears it instead of the
// kernel ending the process: each role's collector target (GOGC, and
// the route role's headroom) lets the heap grow to a multiple of the
// live heap, which knows nothing of the container. GOMEMLIMIT in the
// environment wins; AUTOMEMLIMIT sets another ratio, or "off". Without a
// cgroup limit nothing changes. Called first thing by `trace run` and
// `trace env serve`.
func SetMemoryLimit(log *slog.Logger) {
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		log.Info("memory limit from GOMEMLIMIT in the environment", "gomemlimit", v)
		return
	}
	limit, err := memlimit.Set(memlimit.WithRatio(memoryLimitRatio), memlimit.WithProvider(memlimit.FromCgroup))
	switch {
	case err != nil: // no cgroups here (not Linux, or not mounted): Go's own
		log.Debug("memory limit: none read from the cgroup", "err", err)
	case limit > 0 && limit < math.MaxInt64:
		log.Info("memory limit from the cgroup: GOMEMLIMIT set (AUTOMEMLIMIT=off or GOMEMLIMIT in the environment overrides)",
			"gomemlimit_bytes", limit, "ratio", memoryLimitRatio)
	}
}
