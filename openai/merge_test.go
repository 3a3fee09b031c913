package openai_test

import (
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/merge"
)

// TestXCache: the X-Cache header says how request merging served a
// request, and a cache hit reports its prompt as cached.
func TestXCache(t *testing.T) {
	f := newFixture(t, fixtureOpts{
		sim:    []enginetest.SimOption{enginetest.WithStepTime(2*time.Millisecond, 0)},
		server: []mlxserving.Option{mlxserving.WithMerging(merge.WithCache(1<<20, time.Minute))},
	})
	body := map[string]any{"model": "tiny", "prompt": "hello there", "max_tokens": 8, "temperature": 0, "cache": true}
	status, h, first := f.post(t, "/v1/completions", body)
	if status != 200 || h.Get("X-Cache") != "miss" {
		t.Fatalf("first: %d X-Cache %q %s", status, h.Get("X-Cache"), first)
	}
	status, h, second := f.post(t, "/v1/completions", body)
	if status != 200 || h.Get("X-Cache") != "hit" {
		t.Fatalf("second: %d X-Cache %q", status, h.Get("X-Cache"))
	}
	a, b := mustJSON(t, first), mustJSON(t, second)
	textOf := func(m map[string]any) any { return m["choices"].([]any)[0].(map[string]any)["text"] }
	if textOf(a) != textOf(b) {
		t.Errorf("hit text %q, miss text %q", textOf(b), textOf(a))
	}
	usage := b["usage"].(map[string]any)
	details, _ := usage["prompt_tokens_details"].(map[string]any)
	if details == nil || details["cached_tokens"] != usage["prompt_tokens"] {
		t.Errorf("hit usage %v: want every prompt token cached", usage)
	}

	// Identical streaming requests at once: one miss, the rest merged.
	stream := map[string]any{"model": "tiny", "prompt": "merge me", "max_tokens": 40, "seed": 3, "temperature": 0.7, "stream": true}
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]int{}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, h, _ := f.post(t, "/v1/completions", stream)
			mu.Lock()
			seen[h.Get("X-Cache")]++
			mu.Unlock()
			if status != 200 {
				t.Errorf("stream: %d", status)
			}
		}()
	}
	wg.Wait()
	if seen["miss"] < 1 || seen["miss"]+seen["merged"] != 4 {
		t.Errorf("X-Cache of 4 identical streams: %v", seen)
	}

	// Not deterministic: no header.
	random := map[string]any{"model": "tiny", "prompt": "hello there", "max_tokens": 4, "temperature": 0.7, "cache": true}
	if _, h, _ := f.post(t, "/v1/completions", random); h.Get("X-Cache") != "" {
		t.Errorf("unseeded sampling: X-Cache %q", h.Get("X-Cache"))
	}
}
