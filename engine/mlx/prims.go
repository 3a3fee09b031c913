//go:build mlx

package mlx

// PrimitiveCount is how many MLX primitives (operations MLX evaluates;
// host data excluded) a model's last step built. MLX pays a host-side
// cost per primitive at every evaluation (on a CUDA GPU: its eval_gpu and
// the capture into a CUDA graph), which bounds small-batch decoding, so
// this is the step's launch budget. A model from this package returns it
// from its Primitives method:
//
//	if pc, ok := m.(interface{ Primitives() mlx.PrimitiveCount }); ok {
//		fmt.Println(pc.Primitives().PerLayer())
//	}
type PrimitiveCount struct {
	Step   int // the whole step: embedding, layers, head and sampling
	Layers int // the decoder layers' share of Step
	Of     int // decoder layers
}

// PerLayer is Layers / Of: the primitives of one decoder layer.
func (p PrimitiveCount) PerLayer() float64 {
	if p.Of == 0 {
		return 0
	}
	return float64(p.Layers) / float64(p.Of)
}

// Primitives returns the count of the last step (Step, or a Warm step);
// zero before the first.
func (m *model) Primitives() PrimitiveCount {
	var out PrimitiveCount
	_ = m.call(func(*graph) error { out = m.prims; return nil })
	out.Of = m.cfg.Layers
	return out
}
