package merge

import (
	"container/list"
	"context"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/mlxserving/mlxserving/api"
)

// cache holds finished responses under their keys, bounded by bytes (kept
// here: the LRU counts entries) and by age. It starts no goroutine: expiry
// is done by the calls themselves. Every look-up, add and stats call first
// drops the entries past their TTL, so an expired response is never served
// and never holds bytes that a live one needs.
type cache struct {
	max int64
	ttl time.Duration
	now func() time.Time // time.Now; tests step it

	mu  sync.Mutex // guards lru and byAge; simplelru is not safe for concurrent use
	lru *simplelru.LRU[Key, *response]
	// byAge holds the entries in insertion order, which is expiry order
	// since every entry lives for the same TTL: expiring is popping its
	// front while that has expired.
	byAge *list.List // of *response

	bytes     atomic.Int64
	hits      atomic.Uint64
	misses    atomic.Uint64
	evictions atomic.Uint64
}

// response is a cached generation. chunks never change once stored, so a
// replay may read them after the entry has left the cache; the other
// fields belong to the cache and are guarded by its mutex.
type response struct {
	chunks  []api.Chunk
	size    int64
	key     Key
	expires time.Time
	age     *list.Element // in cache.byAge
}

// newResponse holds a copy of a finished generation's chunks.
func newResponse(k Key, chunks []api.Chunk) *response {
	r := &response{chunks: make([]api.Chunk, len(chunks)), key: k}
	for i, ch := range chunks {
		r.chunks[i] = ch
		if ch.Usage != nil {
			u := *ch.Usage
			r.chunks[i].Usage = &u
		}
		r.size += int64(len(ch.Text)) + chunkOverhead
	}
	return r
}

// chunkOverhead is what a chunk costs beyond its text, roughly.
const chunkOverhead = 64

func newCache(maxBytes int64, ttl time.Duration) (*cache, error) {
	c := &cache{max: maxBytes, ttl: ttl, now: time.Now, byAge: list.New()}
	// The byte bound limits the entries (each costs at least
	// chunkOverhead), so the LRU's own count bound is left open.
	lru, err := simplelru.NewLRU[Key, *response](math.MaxInt, c.evicted)
	if err != nil {
		return nil, fmt.Errorf("merge: response cache: %w", err)
	}
	c.lru = lru
	return c, nil
}

// evicted is the LRU's eviction callback: every way out of the cache
// (least recently used, expired, purged) passes here. Called with c.mu
// held.
func (c *cache) evicted(_ Key, r *response) {
	c.byAge.Remove(r.age)
	c.bytes.Add(-r.size)
	c.evictions.Add(1)
}

// expire removes the entries whose TTL has passed at now. Amortised O(1):
// each entry is popped once. Has to be called with c.mu held.
func (c *cache) expire(now time.Time) {
	for e := c.byAge.Front(); e != nil; e = c.byAge.Front() {
		r := e.Value.(*response)
		if now.Before(r.expires) {
			return
		}
		c.lru.Remove(r.key)
	}
}

// get returns the live response under k; one past its TTL is a miss and
// is removed.
func (c *cache) get(k Key) (*response, bool) {
	c.mu.Lock()
	c.expire(c.now())
	r, ok := c.lru.Get(k)
	c.mu.Unlock()
	if ok {
		c.hits.Add(1)
	} else {
		c.misses.Add(1)
	}
	return r, ok
}

// add stores a finished generation's chunks for the cache's TTL, first
// dropping expired responses and then the least recently used until the
// bound holds. A response larger than the whole bound is not stored.
func (c *cache) add(k Key, chunks []api.Chunk) {
	r := newResponse(k, chunks)
	if r.size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	c.expire(now)
	if c.lru.Contains(k) {
		return // an identical live response is already held
	}
	r.expires = now.Add(c.ttl)
	r.age = c.byAge.PushBack(r)
	c.lru.Add(k, r)
	c.bytes.Add(r.size)
	for c.bytes.Load() > c.max {
		if _, _, ok := c.lru.RemoveOldest(); !ok {
			break
		}
	}
}

// purge empties the cache; what it held counts as evicted.
func (c *cache) purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Purge()
}

// stats fills st's cache fields, after dropping expired entries so the
// bytes and entries reported are live ones.
func (c *cache) stats(st *Stats) {
	c.mu.Lock()
	c.expire(c.now())
	st.CacheEntries = c.lru.Len()
	c.mu.Unlock()
	st.CacheHits, st.CacheMisses, st.CacheEvictions = c.hits.Load(), c.misses.Load(), c.evictions.Load()
	st.CacheBytes = c.bytes.Load()
}

// replay streams a cached response as a normal Source. Its usage keeps the
// token counts and reports the replay's own time.
type replay struct {
	r     *response
	next  int
	start time.Time
	done  atomic.Bool
}

func newReplay(r *response) *replay { return &replay{r: r, start: time.Now()} }

// Recv returns the next cached chunk.
func (p *replay) Recv(ctx context.Context) (api.Chunk, error) {
	if err := ctx.Err(); err != nil {
		return api.Chunk{}, err
	}
	if p.done.Load() {
		return api.Chunk{}, context.Canceled
	}
	if p.next >= len(p.r.chunks) {
		return api.Chunk{}, io.EOF
	}
	c := p.r.chunks[p.next]
	p.next++
	if c.Usage != nil {
		d := time.Since(p.start)
		c.Usage = &api.Usage{PromptTokens: c.Usage.PromptTokens, CompletionTokens: c.Usage.CompletionTokens,
			ForcedTokens: c.Usage.ForcedTokens, CachedTokens: c.Usage.PromptTokens, TimeToFirstToken: d, Duration: d}
	}
	return c, nil
}

// Close ends the replay.
func (p *replay) Close(error) { p.done.Store(true) }
