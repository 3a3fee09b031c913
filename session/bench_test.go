package session

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// BenchmarkRegistry measures the registry's operations: Begin of a live
// session (the per-request cost), Begin of new sessions past the bound
// (creation plus an eviction), Get, and ValidateID of a UUID.
func BenchmarkRegistry(b *testing.B) {
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = NewID()
	}
	b.Run("begin_resume", func(b *testing.B) {
		r, _ := New(WithMaxSessions(10000))
		defer r.Close()
		for _, id := range ids {
			r.Begin(id, "m")
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			r.Begin(ids[i&1023], "m")
			i++
		}
	})
	b.Run("begin_new_evicting", func(b *testing.B) {
		evicted := 0
		r, _ := New(WithMaxSessions(1000), WithOnEvict(func(Session, Reason) { evicted++ }))
		defer r.Close()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			r.Begin("user-"+strconv.Itoa(i), "m")
			i++
		}
	})
	b.Run("begin_parallel", func(b *testing.B) {
		r, _ := New(WithMaxSessions(10000))
		defer r.Close()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				r.Begin(ids[i&1023], "m")
				i++
			}
		})
	})
	b.Run("get", func(b *testing.B) {
		r, _ := New()
		defer r.Close()
		for _, id := range ids {
			r.Begin(id, "m")
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			r.Get(ids[i&1023])
			i++
		}
	})
	b.Run("validate_id", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = ValidateID(ids[0])
		}
	})
	b.Run("new_id", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = NewID()
		}
	})
}

// BenchmarkIndex measures the prefix index: a lookup of a 2,048-token
// prompt whose first 1,024 tokens (a shared system prompt) are held by
// every indexed key, against 32 and 1,024 keys; inserting and removing a
// 2,048-token entry; hashing a decoded token.
func BenchmarkIndex(b *testing.B) {
	system := tokens(1, 1024)
	for _, keys := range []int{32, 1024} {
		x := NewIndex(DefaultBlockSize)
		for k := range keys {
			h := NewHasher(DefaultBlockSize)
			h.Write(system)
			h.Write(tokens(1000+k, 1024))
			x.Insert(fmt.Sprint("k", k), h.Hashes(), h.Tokens())
		}
		prompt := append(append([]int32(nil), system...), tokens(7, 1024)...)
		b.Run(fmt.Sprintf("lookup_2048_tokens_%d_keys", keys), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, n := x.Lookup(prompt); n != 1024 {
					b.Fatalf("matched %d", n)
				}
			}
		})
	}
	b.Run("insert_remove_2048_tokens", func(b *testing.B) {
		x := NewIndex(DefaultBlockSize)
		h := NewHasher(DefaultBlockSize)
		h.Write(tokens(3, 2048))
		b.ReportAllocs()
		for b.Loop() {
			x.Insert("k", h.Hashes(), h.Tokens())
			x.Remove("k")
		}
	})
	b.Run("hash_per_token", func(b *testing.B) {
		h := NewHasher(DefaultBlockSize)
		tok := []int32{42}
		b.ReportAllocs()
		for b.Loop() {
			h.Write(tok)
			if len(h.hashes) > 4096 {
				h.hashes = h.hashes[:0]
			}
		}
	})
}

// BenchmarkCacheStep is the PrefixCache's cost on the hot path: a decode
// step of 64 sequences on the simulated engine (zero step time), with and
// without the wrapper.
func BenchmarkCacheStep(b *testing.B) {
	for _, wrapped := range []bool{false, true} {
		b.Run(fmt.Sprintf("wrapped=%v", wrapped), func(b *testing.B) {
			var m engine.Model = newSimModel(b)
			if wrapped {
				m = newCache(b, m)
			}
			ctx := context.Background()
			batch := make([]engine.StepInput, 64)
			for i := range batch {
				id := engine.SeqID(i + 1)
				p := tokens(i, 32)
				if _, err := m.Open(ctx, id, p, ""); err != nil {
					b.Fatal(err)
				}
				batch[i] = engine.StepInput{Seq: id, Tokens: p, Sample: true, Params: greedy}
			}
			out, err := m.Step(ctx, batch)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			steps := 0
			for b.Loop() {
				for i := range batch {
					batch[i].Tokens = []int32{out[i].Token}
				}
				if out, err = m.Step(ctx, batch); err != nil {
					b.Fatal(err)
				}
				if steps++; steps == 4000 { // stay inside the context
					b.StopTimer()
					for i := range batch {
						m.Free(batch[i].Seq, "")
						p := tokens(i, 32)
						if _, err := m.Open(ctx, batch[i].Seq, p, ""); err != nil {
							b.Fatal(err)
						}
						batch[i].Tokens = p
					}
					out, _ = m.Step(ctx, batch)
					steps = 0
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*64), "ns/token")
		})
	}
}

// BenchmarkMixedLoad drives a PrefixCache over the simulated engine with a
// mixed stream of requests: 40% follow-up turns of 64 conversations, 40%
// one-off questions behind one of 4 system prompts of 512 tokens, 20%
// unrelated prompts; saved KV is bounded to 64k tokens. It reports the
// hit rate in tokens (vLLM's hits/queries), the share of requests that
// reused anything, and the saved tokens held at the end.
func BenchmarkMixedLoad(b *testing.B) {
	const budget = 1 << 16
	m := newSimModel(b, enginetest.WithContextLength(16384), enginetest.WithPrefixCacheEntries(4096))
	c := newCache(b, m, WithTokenBudget(budget))
	systems := make([][]int32, 4)
	for i := range systems {
		systems[i] = tokens(9000+i, 512)
	}
	convs := make([][]int32, 64)
	r := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	id := engine.SeqID(0)
	for b.Loop() {
		var prompt []int32
		key := ""
		save := c.NewKey()
		switch x := r.IntN(10); {
		case x < 4:
			k := r.IntN(len(convs))
			if len(convs[k]) > 6000 {
				convs[k] = nil
			}
			convs[k] = append(convs[k], tokens(r.IntN(1<<20), 40+r.IntN(100))...)
			prompt, key = convs[k], Key(strconv.Itoa(k))
			save = key
		case x < 8:
			prompt = append(append([]int32(nil), systems[r.IntN(4)]...), tokens(r.IntN(1<<20), 10+r.IntN(30))...)
		default:
			prompt = tokens(r.IntN(1<<20), 50+r.IntN(500))
		}
		id++
		reused, err := c.Open(ctx, id, prompt, key)
		if err != nil {
			b.Fatal(err)
		}
		out, err := c.Step(ctx, []engine.StepInput{{Seq: id, Tokens: prompt[reused:], Sample: true, Params: greedy}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Step(ctx, []engine.StepInput{{Seq: id, Tokens: []int32{out[0].Token}, Sample: true, Params: greedy}}); err != nil {
			b.Fatal(err)
		}
		c.Free(id, save)
		if key != "" {
			k, _ := strconv.Atoi(key[len(Key("")):])
			convs[k] = append(convs[k], out[0].Token)
		}
	}
	st := c.Stats()
	b.ReportMetric(100*float64(st.Hits)/float64(max(st.Queries, 1)), "hit_rate_%")
	b.ReportMetric(100*float64(st.LookupHits)/float64(max(st.Lookups, 1)), "requests_hit_%")
	b.ReportMetric(float64(st.Tokens), "held_tokens")
	b.ReportMetric(float64(st.Keys), "held_keys")
}
