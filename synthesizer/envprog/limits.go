package envprog

import (
	"errors"
	"fmt"
	"time"
)

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

// Check refuses limits that are a user's typo, naming each bad one by
// name(key), key being its configuration key (max_memory): a flag's or a
// setting's name. Negative limits are refused (zero takes the default):
// a program run under them fails (does not load, misses its reference,
// calibrates too hard) as if it were at fault. For a sandboxed program, a
// reset cache above a quarter of max_memory is refused too: it lives in
// the worker, under that bound, and would leave the program too little.
func (lim Limits) Check(name func(key string) string, sandboxed bool) error {
	d := DefaultLimits
	var errs []error
	if lim.MaxMemory < 0 {
		errs = append(errs, fmt.Errorf("%s %d: want a positive byte count (0: the default, %d)", name("max_memory"), lim.MaxMemory, d.MaxMemory))
	}
	if lim.CallTimeout < 0 {
		errs = append(errs, fmt.Errorf("%s %s: want a positive duration (0: the default, %s)", name("call_timeout"), lim.CallTimeout, d.CallTimeout))
	}
	if lim.MaxTurns < 0 {
		errs = append(errs, fmt.Errorf("%s %d: want at least 1 (0: the default, %d)", name("max_turns"), lim.MaxTurns, d.MaxTurns))
	}
	if lim.ResetCache < -1 {
		errs = append(errs, fmt.Errorf("%s %d: want a byte count, or -1 for none (0: the default, %d)", name("reset_cache"), lim.ResetCache, d.ResetCache))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if e := lim.withDefaults(); sandboxed && e.ResetCache > e.MaxMemory/4 {
		return fmt.Errorf("%s %d: more than a quarter of %s (%d), the sandbox worker's bound, which holds the cache and the program: lower it, raise %s, or -1 for none",
			name("reset_cache"), e.ResetCache, name("max_memory"), e.MaxMemory, name("max_memory"))
	}
	return nil
}
