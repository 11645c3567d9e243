package router

import (
	"container/list"
	"sync"
	"time"
)

// Cache holds one decision per conversation for a TTL, bounded in size
// (least recently used entries go first). Safe for concurrent use.
type Cache struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu    sync.Mutex
	ll    *list.List
	items map[string]*list.Element
}

type cacheEntry struct {
	key     string
	d       Decision
	expires time.Time
}

// NewCache returns a cache; ttl <= 0 disables it (every Get misses), max
// <= 0 means 100,000 entries.
func NewCache(ttl time.Duration, max int, now func() time.Time) *Cache {
	if max <= 0 {
		max = 100000
	}
	if now == nil {
		now = time.Now
	}
	return &Cache{ttl: ttl, max: max, now: now, ll: list.New(), items: map[string]*list.Element{}}
}

// Get returns the conversation's decision while it is fresh.
func (c *Cache) Get(key string) (Decision, bool) {
	if c.ttl <= 0 {
		return Decision{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[key]
	if !ok {
		return Decision{}, false
	}
	ent := e.Value.(*cacheEntry)
	if !c.now().Before(ent.expires) {
		c.ll.Remove(e)
		delete(c.items, key)
		return Decision{}, false
	}
	c.ll.MoveToFront(e)
	return ent.d, true
}

// Put stores a decision for the TTL from now.
func (c *Cache) Put(key string, d Decision) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	exp := c.now().Add(c.ttl)
	if e, ok := c.items[key]; ok {
		ent := e.Value.(*cacheEntry)
		ent.d, ent.expires = d, exp
		c.ll.MoveToFront(e)
		return
	}
	c.items[key] = c.ll.PushFront(&cacheEntry{key: key, d: d, expires: exp})
	for c.ll.Len() > c.max {
		old := c.ll.Back()
		c.ll.Remove(old)
		delete(c.items, old.Value.(*cacheEntry).key)
	}
}

// Len is the number of entries held (fresh or not yet evicted).
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}
