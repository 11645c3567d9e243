package envprog

import (
	"container/list"
	"sync"

	"go.starlark.net/starlark"
)

// A per-seed reset cache.
//
// reset(seed) is a pure function of the seed (no I/O, no time, no other
// randomness; module globals are frozen), and trainers call it with the
// same seed many times: GRPO plays every prompt as a group of generations
// (TRL's num_generations), each an episode reset with the prompt's seed,
// and an evaluation plays each held-out seed several times. A reset is the
// costliest call of a typical program (the example builds its seeded
// reservation store in ~250 µs of Starlark; copying the result takes
// ~40 µs), so a seed reset a second time keeps a frozen copy of what reset
// returned, and later resets of it get a deep copy of that, indistinguishable
// from running reset again: aliasing inside the state is kept, no mutable
// value is shared between episodes, and a rand object in the state is
// copied with its position. A seed reset only once costs a map lookup: the
// copy is made at its second reset. A state holding functions (lambdas,
// bound methods), which a copy would share, is never cached.

// resetCacheSeen is how many once-reset seeds are remembered.
const resetCacheSeen = 4096

// resetCache holds recently reset seeds' starts and frozen states, least
// recently used first out, within a byte budget (estimated, see
// copier.bytes). It is safe for concurrent use; the states it returns are
// frozen and never changed, so they may be copied without its lock.
type resetCache struct {
	mu      sync.Mutex
	budget  int64
	bytes   int64
	entries map[int64]*list.Element // of *cachedReset
	lru     list.List               // front: most recently used
	seen    map[int64]struct{}      // seeds reset once since they were last cached or forgotten
	ring    []int64                 // seen's seeds in the order they came, to forget the oldest
	next    int
	stats   ResetCacheStats
}

// ResetCacheStats are a reset cache's counts.
type ResetCacheStats struct {
	Hits    uint64 `json:"hits"`    // resets answered from the cache
	Misses  uint64 `json:"misses"`  // resets that ran reset()
	Entries int    `json:"entries"` // seeds cached now
	Bytes   int64  `json:"bytes"`   // their estimated size
}

type cachedReset struct {
	seed  int64
	start Start
	state starlark.Value // frozen
	size  int64
}

// newResetCache returns a cache of at most budget bytes, or nil (no
// cache) when budget is not positive.
func newResetCache(budget int64) *resetCache {
	if budget <= 0 {
		return nil
	}
	return &resetCache{budget: budget, entries: map[int64]*list.Element{}, seen: map[int64]struct{}{}}
}

// get returns seed's cached start and frozen state, counting a hit or a
// miss.
func (c *resetCache) get(seed int64) (Start, starlark.Value, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[seed]
	if !ok {
		c.stats.Misses++
		return Start{}, nil, false
	}
	c.stats.Hits++
	c.lru.MoveToFront(el)
	e := el.Value.(*cachedReset)
	return e.start, e.state, true
}

// again records a fresh reset of seed and reports whether seed was reset
// before (it is then worth caching).
func (c *resetCache) again(seed int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[seed]; ok {
		delete(c.seen, seed)
		return true
	}
	if len(c.ring) < resetCacheSeen {
		c.ring = append(c.ring, seed)
	} else {
		delete(c.seen, c.ring[c.next])
		c.ring[c.next] = seed
		c.next = (c.next + 1) % resetCacheSeen
	}
	c.seen[seed] = struct{}{}
	return false
}

// maxEntry is the largest entry cached: an eighth of the budget (a
// larger one would push out many others).
func (c *resetCache) maxEntry() int64 { return c.budget / 8 }

// put caches seed's start and frozen state of the given size, dropping
// the least recently used entries beyond the budget; an entry above
// maxEntry is not cached.
func (c *resetCache) put(seed int64, start Start, state starlark.Value, size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if size > c.maxEntry() {
		return
	}
	if el, ok := c.entries[seed]; ok { // two first resets ran at once
		c.lru.MoveToFront(el)
		return
	}
	c.entries[seed] = c.lru.PushFront(&cachedReset{seed: seed, start: start, state: state, size: size})
	c.bytes += size
	for c.bytes > c.budget {
		e := c.lru.Remove(c.lru.Back()).(*cachedReset)
		delete(c.entries, e.seed)
		c.bytes -= e.size
	}
}

func (c *resetCache) counts() ResetCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Entries, s.Bytes = len(c.entries), c.bytes
	return s
}
