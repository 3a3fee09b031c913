package openai_test

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/merge"
)

// BenchmarkCache measures non-streamed completions of 32 tokens over HTTP
// on the simulated engine (1 ms steps) with the response cache on: "miss"
// sends a new prompt every time (a generation, then cached), "hit" the
// same prompt every time (replayed from the cache).
func BenchmarkCache(b *testing.B) {
	f := newFixture(b, fixtureOpts{
		sim:    []enginetest.SimOption{enginetest.WithStepTime(time.Millisecond, 0)},
		server: []mlxserving.Option{mlxserving.WithMerging(merge.WithCache(256<<20, time.Hour))},
	})
	client := f.ts.Client()
	post := func(b *testing.B, prompt int, want string) {
		body := fmt.Sprintf(`{"model":"tiny","prompt":[%d,%d,3,4],"max_tokens":32,"ignore_eos":true,"temperature":0,"cache":true}`, prompt%200+1, prompt/200+1)
		resp, err := client.Post(f.ts.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Cache") != want {
			b.Fatalf("status %d, X-Cache %q, want %q", resp.StatusCode, resp.Header.Get("X-Cache"), want)
		}
	}
	next := 0 // every prompt once: sub-benchmarks run again under -count
	b.Run("miss", func(b *testing.B) {
		for b.Loop() {
			next++
			post(b, next, "miss")
		}
	})
	b.Run("hit", func(b *testing.B) {
		next++
		p := next
		post(b, p, "miss") // cached before the timed loop
		for b.Loop() {
			post(b, p, "hit")
		}
	})
}
