//go:build mlx

package mlx

import (
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestAdapterBytes: Info.AdapterBytes is every slot of every adaptable
// module (q, k, v, o, gate, up, down of each layer) at the highest rank,
// in the stacks' dtype (float32 on the CPU).
func TestAdapterBytes(t *testing.T) {
	e := newEngine(t)
	cfg := testmodel.Tiny()
	c := writeAdapterCase(t, cfg, testmodel.Adapter{Rank: 4})
	m := loadSpec(t, e, engine.ModelSpec{Path: c.base, AdapterSlots: 3, MaxAdapterRank: 16})
	h, hd := cfg.Hidden, cfg.Hidden/cfg.Heads
	q, kv := cfg.Heads*hd, cfg.KVHeads*hd
	perLayer := (h + q) + 2*(h+kv) + (q + h) + 2*(h+cfg.Intermediate) + (cfg.Intermediate + h)
	want := int64(cfg.Layers*perLayer) * 3 * 16 * 4
	if got := m.Info().AdapterBytes; got != want {
		t.Fatalf("AdapterBytes %d, want %d", got, want)
	}
}
