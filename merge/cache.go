package merge

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/mlxserving/mlxserving/api"
)

// cache holds finished responses under their keys, bounded by bytes (kept
// here: the LRU counts entries) and by age (the LRU's TTL).
type cache struct {
	max int64
	lru *expirable.LRU[Key, *response]

	mu        sync.Mutex // serialises add, so the byte bound holds
	bytes     atomic.Int64
	hits      atomic.Uint64
	misses    atomic.Uint64
	evictions atomic.Uint64
}

// response is a cached generation.
type response struct {
	chunks []api.Chunk
	size   int64
}

// chunkOverhead is what a chunk costs beyond its text, roughly.
const chunkOverhead = 64

func newCache(maxBytes int64, ttl time.Duration) *cache {
	c := &cache{max: maxBytes}
	// Note: expirable (v2.0.7, its newest release) runs one expiry
	// goroutine per LRU that it never stops; purge at Close empties the
	// LRU so that goroutine holds no responses.
	c.lru = expirable.NewLRU[Key, *response](0, func(_ Key, r *response) {
		c.bytes.Add(-r.size)
		c.evictions.Add(1)
	}, ttl)
	return c
}

func (c *cache) get(k Key) (*response, bool) {
	r, ok := c.lru.Get(k)
	if ok {
		c.hits.Add(1)
	} else {
		c.misses.Add(1)
	}
	return r, ok
}

// add stores a finished generation's chunks, evicting the least recently
// used responses until the bound holds. A response larger than the whole
// bound is not stored.
func (c *cache) add(k Key, chunks []api.Chunk) {
	r := &response{chunks: make([]api.Chunk, len(chunks))}
	for i, ch := range chunks {
		r.chunks[i] = ch
		if ch.Usage != nil {
			u := *ch.Usage
			r.chunks[i].Usage = &u
		}
		r.size += int64(len(ch.Text)) + chunkOverhead
	}
	if r.size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lru.Contains(k) {
		return // an identical response is already held
	}
	c.lru.Add(k, r)
	c.bytes.Add(r.size)
	for c.bytes.Load() > c.max {
		if _, _, ok := c.lru.RemoveOldest(); !ok {
			break
		}
	}
}

func (c *cache) purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Purge()
}

func (c *cache) stats(st *Stats) {
	st.CacheHits, st.CacheMisses, st.CacheEvictions = c.hits.Load(), c.misses.Load(), c.evictions.Load()
	st.CacheBytes, st.CacheEntries = c.bytes.Load(), c.lru.Len()
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
			CachedTokens: c.Usage.PromptTokens, TimeToFirstToken: d, Duration: d}
	}
	return c, nil
}

// Close ends the replay.
func (p *replay) Close(error) { p.done.Store(true) }
