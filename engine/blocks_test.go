package engine_test

import (
	"math"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// TestBlocksFor checks BlocksFor on one group (ceil(n/BlockSize)) and on
// sliding groups (a Gemma-3-12B shape: one full group, five sliding ones
// of at most 73 blocks), and that TokensFor inverts its growth: feeding
// TokensFor(held, b) tokens takes at most b blocks, one more token more.
func TestBlocksFor(t *testing.T) {
	dense := engine.Info{BlockSize: 16, KVBlocks: 1 << 20}
	gemma := engine.Info{BlockSize: 16, KVBlocks: 1 << 20, FullGroups: 1, SlidingGroups: 5, Window: 1024, WindowBlocks: 73}
	slide := engine.Info{BlockSize: 4, KVBlocks: 1 << 20, SlidingGroups: 1, Window: 16, WindowBlocks: 6}
	for _, c := range []struct {
		info    engine.Info
		n, want int
	}{
		{dense, 0, 0}, {dense, 1, 1}, {dense, 16, 1}, {dense, 17, 2},
		{gemma, 1, 6}, {gemma, 1388, 452}, {gemma, 131072, 8557},
		{slide, 10, 3}, {slide, 1000, 6},
		{engine.Info{}, 100, 0},
	} {
		if got := c.info.BlocksFor(c.n); got != c.want {
			t.Errorf("%+v: BlocksFor(%d) = %d, want %d", c.info, c.n, got, c.want)
		}
	}
	for _, info := range []engine.Info{dense, gemma} {
		for _, held := range []int{0, 1, 15, 16, 17, 1000, 1160, 1170, 5000} {
			for _, b := range []int{0, 1, 5, 6, 7, 100, 1000} {
				n := info.TokensFor(held, b)
				if grow := info.BlocksFor(held+n) - info.BlocksFor(held); grow > b {
					t.Errorf("%+v: TokensFor(%d, %d) = %d takes %d blocks", info, held, b, n, grow)
				}
				if grow := info.BlocksFor(held+n+1) - info.BlocksFor(held); grow <= b {
					t.Errorf("%+v: TokensFor(%d, %d) = %d, but %d more tokens take only %d blocks", info, held, b, n, n+1, grow)
				}
			}
		}
	}
	if got := slide.TokensFor(100, 0); got != math.MaxInt {
		t.Errorf("TokensFor of a sliding-only model past its window = %d, want math.MaxInt", got)
	}
	if got := slide.TokensFor(0, 3); got != 12 {
		t.Errorf("TokensFor(0, 3) = %d, want 12", got)
	}
}
