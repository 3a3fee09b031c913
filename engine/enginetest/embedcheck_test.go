package enginetest

import (
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// TestSimEmbedding runs the embedding checks on simulated decoders (slot
// and paged KV) and a simulated encoder.
func TestSimEmbedding(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []SimOption
	}{
		{"decoder", nil},
		{"paged", []SimOption{WithBlockSize(16)}},
		{"encoder", []SimOption{WithEncoder(), WithEmbedding(24, engine.PoolCLS, true, false)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim, err := NewSim(append([]SimOption{WithVocabSize(500), WithContextLength(64), WithMaxBatch(8)}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			RunEmbedding(t, sim, "")
			if st := sim.Stats(); st.OpenSequences != 0 || st.KVTokens != 0 || st.Models != 0 {
				t.Errorf("after the checks: %+v; want no open sequences, KV or models", st)
			}
		})
	}
}

func TestWithEmbeddingRefusesBadValues(t *testing.T) {
	for _, opts := range [][]SimOption{
		{WithEmbedding(-1, engine.PoolMean, true, false)},
		{WithEmbedding(8, engine.PoolNone, true, false)},
		{WithEmbedding(0, engine.PoolMean, true, false), WithEncoder()},
	} {
		if _, err := NewSim(opts...); err == nil {
			t.Errorf("NewSim accepted %d options with a bad embedding", len(opts))
		}
	}
}
