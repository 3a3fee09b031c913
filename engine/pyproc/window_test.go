package pyproc

import (
	"context"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/testmodel"
)

// windowEngine starts an engine whose workers keep KV in blocks of 4
// tokens, with sliding groups that hold the window of a step of 8 tokens,
// so the tiny families' windows of 16 give blocks back within short
// prompts.
func windowEngine(t *testing.T, opts ...Option) *Engine {
	return newEngine(t, append([]Option{WithTuning(Tuning{BlockSize: 4, WindowStep: 8})}, opts...)...)
}

// TestSlidingWindowBlocks checks the sliding groups of the paged pool on
// the windowed families: greedy tokens match the reference for prompts
// far past the window (whole and in chunks), a long sequence holds
// BlocksFor(n) blocks, fewer than with every layer holding the whole
// sequence, and a saved session is reused with the tokens a fresh
// sequence samples. The pool (200 tokens of every layer) holds the
// 150-token prompt's window at once and feeds the 230-token one in pieces.
func TestSlidingWindowBlocks(t *testing.T) {
	py := python(t)
	e := windowEngine(t)
	ctx := context.Background()
	for _, arch := range []string{"gemma3_text", "mistral", "gemma2"} {
		t.Run(arch, func(t *testing.T) {
			dir := t.TempDir()
			if err := testmodel.Write(dir, testmodel.TinyFamily(arch)); err != nil {
				t.Fatal(err)
			}
			prompts := [][]int32{prompt(2, 150), prompt(3, 230)}
			const n = 6
			ref := runReference(t, py, dir, prompts, n)
			l, err := e.Load(ctx, engine.ModelSpec{ID: arch, Path: dir, KVCapacity: 200})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			m := l.(*Model)
			info := m.Info()
			if info.SlidingGroups == 0 || info.WindowBlocks == 0 {
				t.Fatalf("Info %+v: no sliding groups", info)
			}
			for i, p := range prompts {
				for _, chunk := range []int{0, 24} {
					toks, _ := generateChunked(t, m, engine.SeqID(10*i+chunk), p, n, chunk)
					for k := range toks {
						if toks[k] != ref[i].Tokens[k] {
							if ref[i].Gaps[k] < 1e-3 {
								break
							}
							t.Fatalf("prompt %d chunk %d token %d: %d, reference %d", i, chunk, k, toks[k], ref[i].Tokens[k])
						}
					}
				}
			}
			// Blocks: a 230-token sequence holds BlocksFor(230).
			free := m.FreeBlocks()
			openFeed(t, m, 500, prompts[1])
			if _, err := m.Step(ctx, []engine.StepInput{{Seq: 500, Tokens: prompts[1]}}); err != nil {
				t.Fatal(err)
			}
			held, dense := free-m.FreeBlocks(), info.Groups()*((len(prompts[1])+info.BlockSize-1)/info.BlockSize)
			if held != info.BlocksFor(len(prompts[1])) || held >= dense {
				t.Errorf("a %d-token sequence holds %d blocks; want BlocksFor = %d, fewer than %d", len(prompts[1]), held, info.BlocksFor(len(prompts[1])), dense)
			}
			m.Free(500, "")
			// Sessions: the saved KV of a conversation is reused by its next
			// turn, which samples what it samples alone.
			turn := append(slices.Clone(prompts[1]), prompt(9, 20)...)
			saveOn(t, m, 600, prompts[1], "s")
			r, err := m.Open(ctx, 601, turn, "s")
			if err != nil {
				t.Fatal(err)
			}
			if r != len(prompts[1]) {
				t.Errorf("the next turn reused %d tokens, want %d", r, len(prompts[1]))
			}
			got := generateFrom(t, m, 601, turn[r:], n)
			want := generate(t, m, 602, turn, n)
			if !slices.Equal(got, want) {
				t.Errorf("after reusing the session: %v; alone: %v", got, want)
			}
		})
	}
}

// generateFrom runs n greedy steps of the open sequence seq after feeding
// feed, and frees it.
func generateFrom(t *testing.T, m *Model, seq engine.SeqID, feed []int32, n int) []int32 {
	t.Helper()
	defer m.Free(seq, "")
	var out []int32
	for len(out) < n {
		o, err := m.Step(context.Background(), []engine.StepInput{{Seq: seq, Tokens: feed, Sample: true, Params: greedy}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o[0].Token)
		feed = []int32{o[0].Token}
	}
	return out
}

// TestConformanceSliding runs the conformance suite on a windowed family
// whose sliding groups give blocks back.
func TestConformanceSliding(t *testing.T) {
	e := windowEngine(t, WithWorkers(2))
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.TinyFamily("gemma3_text")); err != nil {
		t.Fatal(err)
	}
	enginetest.Run(t, e, dir)
}
