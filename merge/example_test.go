package merge_test

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/merge"
)

// words is a Source that produces a fixed text word by word, slowly, as a
// generation would.
type words struct {
	left []string
}

func (w *words) Recv(ctx context.Context) (api.Chunk, error) {
	if len(w.left) == 0 {
		return api.Chunk{}, io.EOF
	}
	select {
	case <-time.After(5 * time.Millisecond):
	case <-ctx.Done():
		return api.Chunk{}, ctx.Err()
	}
	c := api.Chunk{Text: w.left[0], HasToken: true}
	if w.left = w.left[1:]; len(w.left) == 0 {
		c.Finish = api.FinishStop
	}
	return c, nil
}

func (w *words) Close(error) {}

// Two identical requests share one generation; the second, joining late,
// still reads the whole text. A third, after the first finished, is
// served from the cache.
func ExampleMerger_Join() {
	m, err := merge.New(merge.WithCache(1<<20, time.Minute))
	if err != nil {
		panic(err)
	}
	defer m.Close()
	generations := 0
	start := func(ctx context.Context, tier api.Tier) (api.Source, error) {
		generations++
		return &words{left: []string{"one ", "two ", "three"}}, nil
	}
	k := merge.KeyOf(merge.Request{Model: "m", Prompt: []int32{1, 2, 3}, MaxTokens: 3})
	ctx := context.Background()
	read := func(src api.Source, outcome merge.Outcome) {
		r, err := api.NewStream(ctx, src, api.Header{}).Collect()
		fmt.Printf("%s: %q %v\n", outcome, r.Text, err)
	}
	a, oa, _ := m.Join(ctx, k, api.Normal, true, start)
	b, ob, _ := m.Join(ctx, k, api.High, true, start)
	read(a, oa)
	read(b, ob)
	c, oc, _ := m.Join(ctx, k, api.Normal, true, start)
	read(c, oc)
	fmt.Println("generations:", generations)
	// Output:
	// miss: "one two three" <nil>
	// merged: "one two three" <nil>
	// hit: "one two three" <nil>
	// generations: 1
}
