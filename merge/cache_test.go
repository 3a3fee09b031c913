package merge

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
)

// The expirable LRU's expiry goroutine (golang-lru/v2 v2.0.7) cannot be
// stopped; see Merger.Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"))
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
	c := newCache(4000, time.Hour)
	for i := range 200 {
		c.add(key(i), chunks(10, strings.Repeat("x", 1+i%30)))
		if b := c.bytes.Load(); b > 4000 {
			t.Fatalf("after %d adds the cache holds %d bytes, bound 4000", i+1, b)
		}
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
	if c.bytes.Load() != 0 {
		t.Errorf("%d bytes after purge", c.bytes.Load())
	}
}

func TestCacheExpires(t *testing.T) {
	c := newCache(1<<20, 50*time.Millisecond)
	c.add(key(1), chunks(3, "a"))
	if _, ok := c.get(key(1)); !ok {
		t.Fatal("fresh entry missing")
	}
	time.Sleep(120 * time.Millisecond)
	if _, ok := c.get(key(1)); ok {
		t.Error("entry outlived its TTL")
	}
	c.purge()
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
