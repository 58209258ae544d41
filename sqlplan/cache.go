package sqlplan

import (
	"container/list"
	"context"
	"sync"
	"sync/atomic"
)

// planCache is a bounded least-recently-used cache of plans, in three namespaces:
// 'E' extended-protocol texts, 'N' normalised simple-protocol texts, 'S' simple-protocol
// texts kept as they are.
type planCache struct {
	mu struct {
		sync.Mutex
		maps  map[byte]map[string]*list.Element
		order *list.List // front: most recently used
	}
	size         int
	hits, misses atomic.Int64
}

type cacheEntry struct {
	ns   byte
	key  string
	plan *Plan
}

func newPlanCache(size int) *planCache {
	c := &planCache{size: size}
	c.mu.maps = map[byte]map[string]*list.Element{'E': {}, 'N': {}, 'S': {}}
	c.mu.order = list.New()
	return c
}

func (c *planCache) get(key string, ns byte) (*Plan, bool) {
	c.mu.Lock()
	e, ok := c.mu.maps[ns][key]
	p := c.hit(e, ok)
	c.mu.Unlock()
	return c.result(p, ok && !p.staleStats())
}

// getBytes is get without converting key to a string (the map lookup does not copy it).
func (c *planCache) getBytes(key []byte, ns byte) (*Plan, bool) {
	c.mu.Lock()
	e, ok := c.mu.maps[ns][string(key)]
	p := c.hit(e, ok)
	c.mu.Unlock()
	return c.result(p, ok && !p.staleStats())
}

// hit marks an entry used and reads its plan; the caller holds c.mu, since put may
// replace the plan of an entry (two sessions planning the same text at once).
func (c *planCache) hit(e *list.Element, ok bool) *Plan {
	if !ok {
		return nil
	}
	c.mu.order.MoveToFront(e)
	return e.Value.(*cacheEntry).plan
}

// result counts a hit or a miss; a plan planned on statistics since grown stale
// (Plan.staleStats) is a miss, planned again and put in its place.
func (c *planCache) result(p *Plan, ok bool) (*Plan, bool) {
	if !ok {
		c.misses.Add(1)
		return nil, false
	}
	c.hits.Add(1)
	return p, true
}

func (c *planCache) put(key string, ns byte, p *Plan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.mu.maps[ns]
	if e, ok := m[key]; ok {
		e.Value.(*cacheEntry).plan = p
		c.mu.order.MoveToFront(e)
		return
	}
	m[key] = c.mu.order.PushFront(&cacheEntry{ns: ns, key: key, plan: p})
	for c.mu.order.Len() > c.size {
		old := c.mu.order.Back()
		ent := old.Value.(*cacheEntry)
		delete(c.mu.maps[ent.ns], ent.key)
		c.mu.order.Remove(old)
	}
}

func (c *planCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ns := range c.mu.maps {
		c.mu.maps[ns] = map[string]*list.Element{}
	}
	c.mu.order.Init()
}

func (c *planCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.order.Len()
}

// CacheStats are the plan cache's counters.
type CacheStats struct {
	Plans        int   // plans held
	Hits, Misses int64 // lookups since the planner was made
}

// CacheStats returns the plan cache's counters (zero when the cache is off).
func (p *Planner) CacheStats() CacheStats {
	if p.cache == nil {
		return CacheStats{}
	}
	return CacheStats{Plans: p.cache.len(), Hits: p.cache.hits.Load(), Misses: p.cache.misses.Load()}
}

// Invalidate empties the plan cache. Sessions call it after DDL, since a plan may depend
// on a table's columns (INSERT without a column list) or its key type.
func (p *Planner) Invalidate() {
	if p.cache != nil {
		p.cache.clear()
	}
}

// entries lists the cache's entries, least recently used first.
func (c *planCache) entries() []cacheEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]cacheEntry, 0, c.mu.order.Len())
	for e := c.mu.order.Back(); e != nil; e = e.Prev() {
		out = append(out, *e.Value.(*cacheEntry))
	}
	return out
}

// Warm plans on p every statement text that from holds a cached plan for, as
// Prepare and PlanSimple would when a client sends it, so that p's cache (and its
// catalog) are ready before clients come: a resharding cutover warms the planner of
// the new layout from the one in force. p must serve no one yet: its lookup counters
// are put back as they were, so that CacheStats counts the clients' lookups only. It
// returns how many texts it planned; one that p refuses is left out (a client meets
// the refusal itself), and so is every text after ctx ends.
func (p *Planner) Warm(ctx context.Context, from *Planner) int {
	if p.cache == nil || from.cache == nil {
		return 0
	}
	// Its own lookups are not the clients': CacheStats counts those only.
	hits, misses := p.cache.hits.Load(), p.cache.misses.Load()
	defer func() {
		p.cache.hits.Add(hits - p.cache.hits.Load())
		p.cache.misses.Add(misses - p.cache.misses.Load())
	}()
	n := 0
	for _, e := range from.cache.entries() {
		if ctx.Err() != nil {
			break
		}
		var err error
		switch e.ns {
		case 'E':
			_, err = p.Prepare(ctx, e.key)
		case 'S':
			_, _, err = p.PlanSimple(ctx, e.key)
		case 'N':
			// The normalised text is the key; the plan keeps a text it was made from.
			_, _, err = p.PlanSimple(ctx, e.plan.SQL)
		}
		if err == nil {
			n++
		}
	}
	return n
}
