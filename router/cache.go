package router

import (
	"container/list"
	"hash/maphash"
	"sync"
	"time"
)

// Cache holds one decision per conversation for a TTL (or a shorter one
// of its own, PutTTL), bounded in size
// (least recently used entries go first). Safe for concurrent use: a cache
// of 1,024 entries or more is split into 16 shards by key, each with its
// own lock, LRU list and a 16th of the bound, so that concurrent requests
// (every proxied request reads it) rarely wait for one another; the bound
// and the LRU order then hold per shard.
type Cache struct {
	ttl    time.Duration
	now    func() time.Time
	seed   maphash.Seed
	shards []cacheShard
}

type cacheShard struct {
	mu    sync.Mutex
	max   int
	ll    *list.List
	items map[string]*list.Element
	_     [64]byte // keeps neighbouring shards' locks off one cache line
}

type cacheEntry struct {
	key     string
	d       Decision
	expires time.Time
}

const (
	cacheShards        = 16
	cacheShardFromSize = 1024 // smaller caches keep one exact LRU
)

// NewCache returns a cache; ttl <= 0 disables it (every Get misses), max
// <= 0 means 100,000 entries.
func NewCache(ttl time.Duration, max int, now func() time.Time) *Cache {
	if max <= 0 {
		max = 100000
	}
	if now == nil {
		now = time.Now
	}
	n := 1
	if max >= cacheShardFromSize {
		n = cacheShards
	}
	c := &Cache{ttl: ttl, now: now, seed: maphash.MakeSeed(), shards: make([]cacheShard, n)}
	for i := range c.shards {
		c.shards[i] = cacheShard{max: (max + n - 1) / n, ll: list.New(), items: map[string]*list.Element{}}
	}
	return c
}

func (c *Cache) shard(key string) *cacheShard {
	if len(c.shards) == 1 {
		return &c.shards[0]
	}
	return &c.shards[maphash.String(c.seed, key)%uint64(len(c.shards))]
}

// Get returns the conversation's decision while it is fresh.
func (c *Cache) Get(key string) (Decision, bool) {
	if c.ttl <= 0 {
		return Decision{}, false
	}
	now := c.now()
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.items[key]
	if !ok {
		return Decision{}, false
	}
	ent := e.Value.(*cacheEntry)
	if !now.Before(ent.expires) {
		s.ll.Remove(e)
		delete(s.items, key)
		return Decision{}, false
	}
	s.ll.MoveToFront(e)
	return ent.d, true
}

// Put stores a decision for the TTL from now.
func (c *Cache) Put(key string, d Decision) { c.PutTTL(key, d, c.ttl) }

// PutTTL stores a decision for ttl from now (at most the cache's TTL;
// ttl <= 0 stores nothing).
func (c *Cache) PutTTL(key string, d Decision, ttl time.Duration) {
	ttl = min(ttl, c.ttl)
	if ttl <= 0 {
		return
	}
	exp := c.now().Add(ttl)
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.items[key]; ok {
		ent := e.Value.(*cacheEntry)
		ent.d, ent.expires = d, exp
		s.ll.MoveToFront(e)
		return
	}
	s.items[key] = s.ll.PushFront(&cacheEntry{key: key, d: d, expires: exp})
	for s.ll.Len() > s.max {
		old := s.ll.Back()
		s.ll.Remove(old)
		delete(s.items, old.Value.(*cacheEntry).key)
	}
}

// Remove drops key's entry if it holds the decision id (and not a newer
// one, cached since).
func (c *Cache) Remove(key, id string) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.items[key]; ok && e.Value.(*cacheEntry).d.ID == id {
		s.ll.Remove(e)
		delete(s.items, key)
	}
}

// Len is the number of entries held (fresh or not yet evicted).
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += s.ll.Len()
		s.mu.Unlock()
	}
	return n
}
