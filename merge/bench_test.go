package merge

import (
	"context"
	"io"
	"testing"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
)

// BenchmarkKeyOf hashes a request with a 512-token prompt and seeded
// sampling: the per-request cost of naming a generation.
func BenchmarkKeyOf(b *testing.B) {
	prompt := make([]int32, 512)
	for i := range prompt {
		prompt[i] = int32(i * 7)
	}
	r := Request{Model: "llama", Revision: "/models/llama#1", Prompt: prompt, MaxTokens: 256,
		Sampling: engine.SamplingParams{Temperature: 0.7, TopP: 0.9, Seed: 42, HasSeed: true}, StopTokens: []int32{2, 128001}}
	for b.Loop() {
		_ = KeyOf(r)
	}
}

// ready is a Source whose chunks are all ready: what is left to measure is
// the merge path's own cost.
type ready struct {
	chunks []api.Chunk
	next   int
}

func (r *ready) Recv(context.Context) (api.Chunk, error) {
	if r.next == len(r.chunks) {
		return api.Chunk{}, io.EOF
	}
	r.next++
	return r.chunks[r.next-1], nil
}

func (r *ready) Close(error) {}

// BenchmarkJoin is one request through a Merger, alone (a miss: key, flight,
// subscriber, 8 chunks and the end), against the same chunks read from the
// source directly.
func BenchmarkJoin(b *testing.B) {
	chunks := make([]api.Chunk, 9)
	for i := range 8 {
		chunks[i] = api.Chunk{Text: "tok", Token: int32(i), HasToken: true}
	}
	chunks[8] = api.Chunk{Finish: api.FinishLength, Usage: &api.Usage{PromptTokens: 4, CompletionTokens: 8}}
	drain := func(b *testing.B, src api.Source) {
		for {
			_, err := src.Recv(context.Background())
			if err == io.EOF {
				return
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			drain(b, &ready{chunks: chunks})
		}
	})
	b.Run("merge", func(b *testing.B) {
		m, err := New()
		if err != nil {
			b.Fatal(err)
		}
		defer m.Close()
		prompt := []int32{0, 2, 3, 4}
		for b.Loop() {
			prompt[0]++
			k := KeyOf(Request{Model: "m", Revision: "1", Prompt: prompt, MaxTokens: 8})
			src, _, err := m.Join(context.Background(), k, api.Normal, false, func(context.Context, api.Tier) (api.Source, error) {
				return &ready{chunks: chunks}, nil
			})
			if err != nil {
				b.Fatal(err)
			}
			drain(b, src)
			src.Close(nil)
		}
	})
}
