package merge

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/internal/lru"
)

// cache holds finished responses under their keys, bounded by bytes and
// by age in an internal/lru.LRU, which expires on use: an expired response
// is never served and never holds bytes that a live one needs. It starts
// no goroutine.
type cache struct {
	max int64

	mu  sync.Mutex // guards lru, which is not safe for concurrent use
	lru *lru.LRU[Key, *response]

	hits      atomic.Uint64
	misses    atomic.Uint64
	evictions atomic.Uint64
}

// response is a cached generation. chunks never change once stored, so a
// replay may read them after the entry has left the cache.
type response struct {
	chunks []api.Chunk
	size   int64
}

// newResponse holds a copy of a finished generation's chunks.
func newResponse(chunks []api.Chunk) *response {
	r := &response{chunks: make([]api.Chunk, len(chunks))}
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

func newCache(maxBytes int64, ttl time.Duration) *cache {
	c := &cache{max: maxBytes}
	// Every way out of the cache but a replace (least recently used,
	// expired, purged) counts as an eviction.
	c.lru = lru.New[Key, *response](maxBytes, ttl, func(Key, *response) { c.evictions.Add(1) })
	return c
}

// get returns the live response under k.
func (c *cache) get(k Key) (*response, bool) {
	c.mu.Lock()
	r, ok := c.lru.Get(k)
	c.mu.Unlock()
	if ok {
		c.hits.Add(1)
	} else {
		c.misses.Add(1)
	}
	return r, ok
}

// add stores a finished generation's chunks for the cache's TTL, dropping
// the least recently used responses until the bound holds. A response
// larger than the whole bound is not stored, and one whose key holds a
// live response does not replace it.
func (c *cache) add(k Key, chunks []api.Chunk) {
	r := newResponse(chunks)
	if r.size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lru.Contains(k) {
		return // an identical live response is already held
	}
	c.lru.Add(k, r, r.size)
}

// purge empties the cache; what it held counts as evicted.
func (c *cache) purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Purge()
}

// stats fills st's cache fields with the live entries.
func (c *cache) stats(st *Stats) {
	c.mu.Lock()
	st.CacheEntries, st.CacheBytes = c.lru.Len(), c.lru.Weight()
	c.mu.Unlock()
	st.CacheHits, st.CacheMisses, st.CacheEvictions = c.hits.Load(), c.misses.Load(), c.evictions.Load()
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
			ForcedTokens: c.Usage.ForcedTokens, ClosingTokens: c.Usage.ClosingTokens, CachedTokens: c.Usage.PromptTokens, TimeToFirstToken: d, Duration: d}
	}
	return c, nil
}

// Close ends the replay.
func (p *replay) Close(error) { p.done.Store(true) }
