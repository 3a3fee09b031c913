//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

// loadHF makes the tensors a transformers-quantized checkpoint is
// converted to (convertHF) that the model reads (want) into ts, one at a
// time: each is made on the host, copied into an MLX array of dtype
// (4-bit weights as U32), evaluated, and its temporaries freed before the
// next, so a converted model costs one tensor's float32 copy at a time.
func loadHF(g *graph, conv map[string]func() (hfTensor, error), want map[string]bool, ts map[string]arr, dtype string) error {
	dt := map[string]C.mlx_dtype{"F32": C.MLX_FLOAT32, "BF16": C.MLX_BFLOAT16, "F16": C.MLX_FLOAT16}[dtype]
	for name, mk := range conv {
		if !want[name] {
			continue
		}
		t, err := mk()
		if err != nil {
			return err
		}
		if t.U32 == nil && t.F32 == nil {
			continue // a g_idx in input order: no input order to load
		}
		var a arr
		if t.U32 != nil {
			a = g.uint32s(t.U32, t.Shape...)
		} else {
			a = g.float32s(t.F32, t.Shape...)
			if dt != C.MLX_FLOAT32 {
				a = g.astype(a, dt)
			}
		}
		k := g.keep(a)
		g.eval(k)
		g.release()
		if g.err != nil {
			C.mlx_array_free(k)
			return g.err
		}
		ts[name] = k
	}
	return nil
}
