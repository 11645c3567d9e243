package envprog

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.starlark.net/starlark"
)

// TestResetCacheBookkeeping drives the cache's pure logic: a seed is
// cached at its second fresh reset, hits move it to the front, the least
// recently used entries leave beyond the budget, and a state above an
// eighth of the budget is never cached.
func TestResetCacheBookkeeping(t *testing.T) {
	type op struct {
		kind string // "reset": get, then on a miss again+put of size; "get": get only
		seed int64
		size int64
	}
	cases := []struct {
		name    string
		budget  int64
		ops     []op
		hits    uint64
		misses  uint64
		cached  []int64 // seeds cached at the end, most recent first
		bytes   int64
		getHits []bool // of each op, whether get hit
	}{
		{
			name:   "cached at the second reset",
			budget: 1000,
			ops:    []op{{"reset", 1, 100}, {"reset", 1, 100}, {"reset", 1, 100}, {"reset", 1, 100}},
			hits:   2, misses: 2, cached: []int64{1}, bytes: 100,
			getHits: []bool{false, false, true, true},
		},
		{
			name:   "once-reset seeds are not cached",
			budget: 1000,
			ops:    []op{{"reset", 1, 100}, {"reset", 2, 100}, {"reset", 3, 100}},
			hits:   0, misses: 3, cached: nil, bytes: 0,
			getHits: []bool{false, false, false},
		},
		{
			name:   "least recently used leaves first",
			budget: 800, // entries of 100: at most 8
			ops: func() []op {
				var ops []op
				for s := int64(0); s < 9; s++ {
					ops = append(ops, op{"reset", s, 100}, op{"reset", s, 100})
				}
				return append(ops, op{"get", 0, 0}) // 0 left when 8 came in
			}(),
			hits: 0, misses: 19, cached: []int64{8, 7, 6, 5, 4, 3, 2, 1}, bytes: 800,
		},
		{
			name:   "a hit keeps an entry",
			budget: 240, // entries of 30: at most 8
			ops: func() []op {
				var ops []op
				for s := int64(1); s <= 8; s++ {
					ops = append(ops, op{"reset", s, 30}, op{"reset", s, 30})
				}
				// 1 is used again, so 2 is the least recently used when 9 comes in.
				return append(ops, op{"get", 1, 0}, op{"reset", 9, 30}, op{"reset", 9, 30})
			}(),
			hits: 1, misses: 18, cached: []int64{9, 1, 8, 7, 6, 5, 4, 3}, bytes: 240,
		},
		{
			name:   "a state above an eighth of the budget is not cached",
			budget: 800,
			ops:    []op{{"reset", 1, 101}, {"reset", 1, 101}, {"reset", 1, 101}},
			hits:   0, misses: 3, cached: nil, bytes: 0,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newResetCache(tc.budget)
			for i, o := range tc.ops {
				start, st, hit := c.get(o.seed)
				if tc.getHits != nil && hit != tc.getHits[i] {
					t.Fatalf("op %d (%v): hit %v, want %v", i, o, hit, tc.getHits[i])
				}
				if hit {
					if want := fmt.Sprint(o.seed); start.User != want || st != starlark.String(want) {
						t.Fatalf("op %d: seed %d's entry is %q/%v", i, o.seed, start.User, st)
					}
					continue
				}
				if o.kind == "reset" && c.again(o.seed) {
					s := fmt.Sprint(o.seed)
					c.put(o.seed, Start{User: s}, starlark.String(s), o.size)
				}
			}
			got := c.counts()
			if got.Hits != tc.hits || got.Misses != tc.misses || got.Bytes != tc.bytes || got.Entries != len(tc.cached) {
				t.Fatalf("counts %+v, want %d hits, %d misses, %d bytes, %d entries", got, tc.hits, tc.misses, tc.bytes, len(tc.cached))
			}
			var order []int64
			for el := c.lru.Front(); el != nil; el = el.Next() {
				order = append(order, el.Value.(*cachedReset).seed)
			}
			if fmt.Sprint(order) != fmt.Sprint(tc.cached) {
				t.Fatalf("cached %v, want %v", order, tc.cached)
			}
		})
	}
}

// TestResetCacheForgetsOldSeeds: the once-reset seeds it remembers are
// bounded; a seed pushed out of them is new again at its next reset.
func TestResetCacheForgetsOldSeeds(t *testing.T) {
	c := newResetCache(1 << 20)
	for s := int64(0); s < resetCacheSeen+10; s++ {
		if c.again(s) {
			t.Fatalf("seed %d counted as reset before", s)
		}
	}
	if len(c.seen) != resetCacheSeen || len(c.ring) != resetCacheSeen {
		t.Fatalf("remembers %d seeds in a ring of %d, want %d", len(c.seen), len(c.ring), resetCacheSeen)
	}
	if c.again(3) {
		t.Fatal("seed 3 was pushed out, yet counted as reset before")
	}
	if !c.again(resetCacheSeen + 5) {
		t.Fatal("a recent seed was not counted as reset before")
	}
}

func TestNoResetCache(t *testing.T) {
	if c := newResetCache(-1); c != nil {
		t.Fatalf("a negative budget made a cache: %+v", c)
	}
	for _, tc := range []struct {
		lim  Limits
		want int64
	}{
		{Limits{}, 8 << 20},
		{Limits{MaxMemory: 64 << 20}, 2 << 20},
		{Limits{ResetCache: 1 << 10}, 1 << 10},
		{Limits{ResetCache: -1}, -1},
	} {
		if got := tc.lim.withDefaults().ResetCache; got != tc.want {
			t.Errorf("%+v: ResetCache %d, want %d", tc.lim, got, tc.want)
		}
	}
}

// TestCopyStopsAtItsLimit: the reset cache's copy of a state too large to
// keep stops once its estimate passes the limit, at the value that passes
// it (of a list of 10,000 dicts, ~6.6 MB by estimate, it copies ~1 MB),
// and a state within the limit is copied whole.
func TestCopyStopsAtItsLimit(t *testing.T) {
	dicts := make([]starlark.Value, 10_000)
	for i := range dicts {
		d := starlark.NewDict(1)
		_ = d.SetKey(starlark.String("i"), starlark.MakeInt(i))
		dicts[i] = d
	}
	small := starlark.NewDict(1)
	_ = small.SetKey(starlark.String("xs"), starlark.NewList([]starlark.Value{starlark.String("a")}))
	const limit = 1 << 20
	for _, tc := range []struct {
		name    string
		v       starlark.Value
		limit   int64
		stopped bool
	}{
		{"many dicts", starlark.NewList(dicts), limit, true},
		{"a long string", starlark.String(strings.Repeat("x", 2<<20)), limit, true},
		{"a small dict", small, limit, false},
		{"no limit", starlark.NewList(dicts), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := copier{seen: map[starlark.Value]starlark.Value{}, limit: tc.limit}
			_, err := c.copy(tc.v, 0)
			if stopped := errors.Is(err, errCopyLimit); stopped != tc.stopped || (err != nil && !stopped) {
				t.Fatalf("copy: %v (estimate %d bytes), want stopped %v", err, c.bytes, tc.stopped)
			}
			if tc.name == "many dicts" && c.bytes > tc.limit+sizeDict {
				t.Fatalf("estimate %d: the copy went on past its limit %d (the whole list is ~6.6 MB)", c.bytes, tc.limit)
			}
		})
	}
}
