package envprog

import "time"

// DefaultLimits are the limits a zero Limits field takes.
//
//   - MaxSteps 10,000,000 Starlark steps per contract call (a step of a
//     typical program is a few hundred; a busy loop reaches the bound in
//     about a second).
//   - MaxMemory 256 MiB of address space above the worker's own start-up
//     footprint (sandboxed programs only).
//   - CallTimeout 2 s of wall-clock time per contract call.
//   - MaxTurns 24 assistant turns per episode (the authors' release).
//   - ResetCache 8 MiB (~400 of the example's states; GRPO resets a
//     prompt's generations within moments of each other), and at most a
//     thirty-second of MaxMemory: it lives in the sandbox worker, under
//     that bound, whose collector lets the heap grow to 5 × what is live
//     (GOGC 400).
var DefaultLimits = Limits{
	MaxSteps:    10_000_000,
	MaxMemory:   256 << 20,
	CallTimeout: 2 * time.Second,
	MaxTurns:    24,
	ResetCache:  8 << 20,
}

// withDefaults returns lim with its zero fields set from DefaultLimits.
func (lim Limits) withDefaults() Limits {
	if lim.MaxSteps == 0 {
		lim.MaxSteps = DefaultLimits.MaxSteps
	}
	if lim.MaxMemory == 0 {
		lim.MaxMemory = DefaultLimits.MaxMemory
	}
	if lim.CallTimeout == 0 {
		lim.CallTimeout = DefaultLimits.CallTimeout
	}
	if lim.MaxTurns == 0 {
		lim.MaxTurns = DefaultLimits.MaxTurns
	}
	if lim.ResetCache == 0 {
		lim.ResetCache = min(DefaultLimits.ResetCache, lim.MaxMemory/32)
	}
	return lim
}
