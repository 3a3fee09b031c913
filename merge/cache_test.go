package merge

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mustCache(t *testing.T, maxBytes int64, ttl time.Duration) *cache {
	t.Helper()
	return newCache(maxBytes, ttl)
}

// checkBound fails t unless c holds at most its bound and its byte count
// agrees with its entries.
func checkBound(t *testing.T, c *cache) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var sum int64
	for _, k := range c.lru.Keys() {
		r, _ := c.lru.Get(k)
		sum += r.size
	}
	if b := c.lru.Weight(); b != sum || b > c.max {
		t.Fatalf("cache counts %d bytes, holds %d (bound %d)", b, sum, c.max)
	}
}

func chunks(n int, text string) []api.Chunk {
	out := make([]api.Chunk, n)
	for i := range out {
		out[i] = api.Chunk{Text: text, Token: int32(i), HasToken: true}
	}
	out[n-1].Finish, out[n-1].Usage = api.FinishLength, &api.Usage{PromptTokens: 3, CompletionTokens: n}
	return out
}

func key(i int) Key { return KeyOf(Request{Model: "m", Prompt: []int32{int32(i)}, MaxTokens: 8}) }

// TestCacheByteBound: a cache full of entries never holds more than its
// byte bound; the least recently used go first and are counted.
func TestCacheByteBound(t *testing.T) {
	c := mustCache(t, 4000, time.Hour)
	for i := range 200 {
		c.add(key(i), chunks(10, strings.Repeat("x", 1+i%30)))
		checkBound(t, c)
	}
	var st Stats
	c.stats(&st)
	if st.CacheEvictions == 0 || st.CacheEntries == 0 || st.CacheEntries >= 200 {
		t.Errorf("stats %+v", st)
	}
	if _, ok := c.get(key(0)); ok {
		t.Error("the oldest entry survived")
	}
	if _, ok := c.get(key(199)); !ok {
		t.Error("the newest entry was evicted")
	}
	c.add(key(1000), chunks(100, strings.Repeat("y", 100))) // larger than the bound
	if _, ok := c.get(key(1000)); ok {
		t.Error("an entry larger than the whole bound was stored")
	}
	c.purge()
	if c.stats(&st); st.CacheBytes != 0 {
		t.Errorf("%d bytes after purge", st.CacheBytes)
	}
}

// TestCacheExpires runs on the real clock: an entry is served while fresh,
// is a miss and gone once its TTL has passed, and its key can be stored
// again.
func TestCacheExpires(t *testing.T) {
	c := mustCache(t, 1<<20, 50*time.Millisecond)
	c.add(key(1), chunks(3, "a"))
	if _, ok := c.get(key(1)); !ok {
		t.Fatal("fresh entry missing")
	}
	time.Sleep(120 * time.Millisecond)
	if _, ok := c.get(key(1)); ok {
		t.Error("entry outlived its TTL")
	}
	var st Stats
	c.stats(&st)
	if st.CacheEntries != 0 || st.CacheBytes != 0 || st.CacheEvictions != 1 {
		t.Errorf("after expiry: %+v", st)
	}
	c.add(key(1), chunks(3, "b"))
	if r, ok := c.get(key(1)); !ok || r.chunks[0].Text != "b" {
		t.Error("an expired key was not stored again")
	}
	c.purge()
	checkBound(t, c)
}

// stepClock is a clock the test moves by hand.
type stepClock struct{ t time.Time }

func (s *stepClock) now() time.Time       { return s.t }
func (s *stepClock) step(d time.Duration) { s.t = s.t.Add(d) }

func newStepClock(c *cache) *stepClock {
	s := &stepClock{t: time.Unix(1e9, 0)}
	c.lru.SetClock(s.now)
	return s
}

// kb returns a response of n*1000 bytes.
func kb(n int) []api.Chunk { return chunks(10*n, strings.Repeat("x", 36)) }

func hit(c *cache, i int) bool {
	_, ok := c.get(key(i))
	return ok
}

func entries(c *cache) (n int, b int64, ev uint64) {
	var st Stats
	c.stats(&st)
	return st.CacheEntries, st.CacheBytes, st.CacheEvictions
}

// TestCacheExpiryBeforeEviction: an expired entry is not served even when
// it was used recently; expired entries give their bytes back before any
// live one is evicted; the byte bound holds throughout.
func TestCacheExpiryBeforeEviction(t *testing.T) {
	c := mustCache(t, 4000, 10*time.Second)
	clock := newStepClock(c)
	c.add(key(0), kb(1))
	c.add(key(1), kb(1))
	clock.step(6 * time.Second)
	c.add(key(2), kb(1))
	c.add(key(3), kb(1))
	checkBound(t, c)
	if !hit(c, 0) { // now the most recently used
		t.Fatal("fresh entry missing")
	}
	clock.step(4 * time.Second) // keys 0 and 1 are exactly 10s old: expired
	if hit(c, 0) {
		t.Fatal("an expired entry was served")
	}
	if n, b, ev := entries(c); n != 2 || b != 2000 || ev != 2 {
		t.Fatalf("after expiry: %d entries, %d bytes, %d evictions; want 2, 2000, 2", n, b, ev)
	}
	c.add(key(4), kb(1))
	c.add(key(5), kb(1))
	checkBound(t, c)
	for _, i := range []int{2, 3, 4, 5} {
		if !hit(c, i) {
			t.Errorf("live entry %d was evicted while expired ones made room", i)
		}
	}
	if _, _, ev := entries(c); ev != 2 {
		t.Errorf("%d evictions, want 2", ev)
	}
	c.add(key(6), kb(2)) // full of live entries: the least recently used go
	checkBound(t, c)
	if hit(c, 2) || hit(c, 3) || !hit(c, 4) || !hit(c, 5) || !hit(c, 6) {
		t.Error("LRU eviction among live entries")
	}
	c.add(key(0), kb(1)) // an expired key is stored anew; 4 makes room
	checkBound(t, c)
	if !hit(c, 0) || hit(c, 4) || !hit(c, 5) || !hit(c, 6) {
		t.Error("expired key not stored again, or the wrong entry made room")
	}
	clock.step(time.Hour)
	if n, b, ev := entries(c); n != 0 || b != 0 || ev != 8 {
		t.Errorf("after every TTL: %d entries, %d bytes, %d evictions; want 0, 0, 8", n, b, ev)
	}
	checkBound(t, c)
}

// TestCacheConcurrent adds, looks up, expires and reads stats from many
// goroutines (run with -race); the bound holds at every stats read.
func TestCacheConcurrent(t *testing.T) {
	c := mustCache(t, 20000, 2*time.Millisecond)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				k := key(g*7 + i%50)
				if _, ok := c.get(k); !ok {
					c.add(k, chunks(1+i%20, strings.Repeat("z", 1+i%40)))
				}
				if i%50 == 0 {
					var st Stats
					c.stats(&st)
					if st.CacheBytes > 20000 || st.CacheBytes < 0 {
						t.Errorf("cache holds %d bytes, bound 20000", st.CacheBytes)
					}
				}
			}
		}()
	}
	wg.Wait()
	checkBound(t, c)
	c.purge()
	checkBound(t, c)
	if n, b, _ := entries(c); n != 0 || b != 0 {
		t.Errorf("after purge: %d entries, %d bytes", n, b)
	}
}

func TestKeyTellsRequestsApart(t *testing.T) {
	base := Request{Model: "m", Revision: "r1", Prompt: []int32{1, 2, 3}, MaxTokens: 8, StopTokens: []int32{2}}
	variants := []func(*Request){
		func(r *Request) { r.Model = "n" },
		func(r *Request) { r.Revision = "r2" },
		func(r *Request) { r.Prompt = []int32{1, 2, 4} },
		func(r *Request) { r.Prompt = []int32{1, 2} },
		func(r *Request) { r.MaxTokens = 9 },
		func(r *Request) { r.Sampling.Seed, r.Sampling.HasSeed = 1, true },
		func(r *Request) { r.Sampling.Temperature = 0.5 },
		func(r *Request) { r.Sampling.Logprobs = true },
		func(r *Request) { r.Stop = []string{"x"} },
		func(r *Request) { r.StopTokens = nil },
		func(r *Request) { r.IgnoreEOS = true },
	}
	k := KeyOf(base)
	if KeyOf(base) != k {
		t.Fatal("KeyOf is not stable")
	}
	for i, v := range variants {
		r := base
		v(&r)
		if KeyOf(r) == k {
			t.Errorf("variant %d has the base key", i)
		}
	}
	if !Deterministic(engine.SamplingParams{}) || !Deterministic(engine.SamplingParams{Temperature: 1, HasSeed: true}) ||
		Deterministic(engine.SamplingParams{Temperature: 1}) {
		t.Error("Deterministic")
	}
	if _, err := New(WithCache(0, time.Second)); err == nil {
		t.Error("WithCache(0, ...) accepted")
	}
}

func TestSharedCacheOptionsValidated(t *testing.T) {
	if _, err := New(WithSharedCache(nil, time.Minute), WithCache(1<<10, time.Minute)); err == nil {
		t.Error("nil shared cache accepted")
	}
	if _, err := New(WithSharedCache(mapCache{}, time.Minute)); err == nil {
		t.Error("shared cache without a local tier accepted")
	}
	m, err := New(WithCache(1<<10, time.Minute), WithSharedCache(mapCache{}, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
}

// mapCache is a SharedCache that holds nothing; it only satisfies the
// option's type check (the Redis-backed cache is tested in
// balancer/redisaffinity against a real redis-server).
type mapCache struct{}

func (mapCache) Get(context.Context, string) ([]byte, bool, error)        { return nil, false, nil }
func (mapCache) Set(context.Context, string, []byte, time.Duration) error { return nil }
