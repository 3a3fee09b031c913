//go:build mlx

package mlx

/*
#include <stdint.h>
#include <stdlib.h>
#include "mlx/c/mlx.h"

// Compiled element-wise pieces of a step: MLX fuses each into one kernel.
// Both take their stream as payload.

static mlx_array mlxs_u32(uint32_t v) { return mlx_array_new_data(&v, NULL, 0, MLX_UINT32); }

#define MLXS_TRY(call) do { if (rc == 0) rc = (call); } while (0)

// swiglu: silu(gate) * up.
static int mlxs_swiglu(mlx_vector_array* res, const mlx_vector_array in, void* payload) {
	mlx_stream s = *(mlx_stream*)payload;
	mlx_array gate = mlx_array_new(), up = mlx_array_new(), sig = mlx_array_new(), t = mlx_array_new(), out = mlx_array_new();
	int rc = 0;
	MLXS_TRY(mlx_vector_array_get(&gate, in, 0));
	MLXS_TRY(mlx_vector_array_get(&up, in, 1));
	MLXS_TRY(mlx_sigmoid(&sig, gate, s));
	MLXS_TRY(mlx_multiply(&t, gate, sig, s));
	MLXS_TRY(mlx_multiply(&out, t, up, s));
	MLXS_TRY(mlx_vector_array_set_value(res, out));
	mlx_array_free(gate); mlx_array_free(up); mlx_array_free(sig); mlx_array_free(t); mlx_array_free(out);
	return rc;
}

// fmix is MurmurHash3's 32-bit finaliser; it replaces *x.
static int mlxs_fmix(mlx_array* x, mlx_stream s) {
	static const uint32_t shifts[3] = {16, 13, 16}, mults[2] = {0x85ebca6bu, 0xc2b2ae35u};
	int rc = 0;
	for (int i = 0; i < 3; i++) {
		mlx_array sh = mlxs_u32(shifts[i]), y = mlx_array_new(), z = mlx_array_new();
		MLXS_TRY(mlx_right_shift(&y, *x, sh, s));
		MLXS_TRY(mlx_bitwise_xor(&z, *x, y, s));
		MLXS_TRY(mlx_array_set(x, z));
		if (i < 2) {
			mlx_array m = mlxs_u32(mults[i]);
			MLXS_TRY(mlx_multiply(&y, *x, m, s));
			MLXS_TRY(mlx_array_set(x, y));
			mlx_array_free(m);
		}
		mlx_array_free(sh); mlx_array_free(y); mlx_array_free(z);
	}
	return rc;
}

// gumbel: ids [V] uint32, k0 and k1 [S, 1] uint32 -> float32 [S, V]
// Gumbel noise, -log(-log(u)) with u from 24 bits of
// fmix(fmix(ids ^ k0) ^ k1).
static int mlxs_gumbel(mlx_vector_array* res, const mlx_vector_array in, void* payload) {
	mlx_stream s = *(mlx_stream*)payload;
	mlx_array ids = mlx_array_new(), k0 = mlx_array_new(), k1 = mlx_array_new(), x = mlx_array_new(), t = mlx_array_new();
	mlx_array eight = mlxs_u32(8), scale = mlx_array_new_float32(1.0f / (1 << 24)), half = mlx_array_new_float32(1.0f / (1 << 25));
	int rc = 0;
	MLXS_TRY(mlx_vector_array_get(&ids, in, 0));
	MLXS_TRY(mlx_vector_array_get(&k0, in, 1));
	MLXS_TRY(mlx_vector_array_get(&k1, in, 2));
	MLXS_TRY(mlx_bitwise_xor(&x, ids, k0, s));
	MLXS_TRY(mlxs_fmix(&x, s));
	MLXS_TRY(mlx_bitwise_xor(&t, x, k1, s));
	MLXS_TRY(mlxs_fmix(&t, s));
	MLXS_TRY(mlx_right_shift(&x, t, eight, s));
	MLXS_TRY(mlx_astype(&t, x, MLX_FLOAT32, s));
	MLXS_TRY(mlx_multiply(&x, t, scale, s));
	MLXS_TRY(mlx_add(&t, x, half, s));
	MLXS_TRY(mlx_log(&x, t, s));
	MLXS_TRY(mlx_negative(&t, x, s));
	MLXS_TRY(mlx_log(&x, t, s));
	MLXS_TRY(mlx_negative(&t, x, s));
	MLXS_TRY(mlx_vector_array_set_value(res, t));
	mlx_array_free(ids); mlx_array_free(k0); mlx_array_free(k1); mlx_array_free(x); mlx_array_free(t);
	mlx_array_free(eight); mlx_array_free(scale); mlx_array_free(half);
	return rc;
}

static void mlxs_free_stream(void* p) { free(p); }

// mlxs_compiled compiles function which (shapeless: one trace serves
// every shape) with stream s as its payload. MLX caches traces by *id,
// the payload's address, so every engine (and stream) has its own.
static int mlxs_compiled(mlx_closure* res, uintptr_t* id, int which, mlx_stream s) {
	mlx_stream* ps = malloc(sizeof(mlx_stream));
	*ps = s;
	*id = (uintptr_t)ps;
	mlx_closure c = mlx_closure_new_func_payload(which == 0 ? mlxs_swiglu : mlxs_gumbel, ps, mlxs_free_stream);
	int rc = mlx_detail_compile(res, c, *id, true, NULL, 0);
	mlx_closure_free(c);
	return rc;
}
*/
import "C"

// kernels are a worker's compiled functions, made on its thread at start,
// and on a CUDA GPU the custom kernels of the decode step: the pool's
// decode attention (pooled.go) and, unless WithFusedKernels(false) turns
// them off, the fused decode-layer kernels (fused.go).
type kernels struct {
	swiglu, gumbel C.mlx_closure
	ids            [2]C.uintptr_t
	cuda           bool // the stream runs on a CUDA GPU: pooled is set
	cpu            bool // the stream runs on the CPU
	fused          bool // addNorm, ropeKV and gluRows are set
	pooled         C.mlx_fast_cuda_kernel
	addNorm        C.mlx_fast_cuda_kernel
	ropeKV         C.mlx_fast_cuda_kernel
	gluRows        C.mlx_fast_cuda_kernel
}

func compileKernels(s C.mlx_stream, fused bool) (*kernels, error) {
	k := &kernels{swiglu: C.mlx_closure_new(), gumbel: C.mlx_closure_new()}
	if rc := C.mlxs_compiled(&k.swiglu, &k.ids[0], 0, s); rc != 0 {
		k.free()
		return nil, errMLX("compile swiglu", rc)
	}
	if rc := C.mlxs_compiled(&k.gumbel, &k.ids[1], 1, s); rc != 0 {
		k.free()
		return nil, errMLX("compile gumbel", rc)
	}
	k.cpu = cpuStream(s)
	if k.cuda = cudaStream(s); k.cuda {
		k.pooled = newPooledKernel()
		if k.fused = fused; k.fused {
			k.addNorm, k.ropeKV, k.gluRows = newFusedKernels()
		}
	}
	return k, nil
}

// free releases the closures, MLX's traces of them and the CUDA kernels.
// MLX thread only.
func (k *kernels) free() {
	for _, id := range k.ids { // before the closures free the payloads the ids are
		if id != 0 {
			C.mlx_detail_compile_erase(id)
		}
	}
	C.mlx_closure_free(k.swiglu)
	C.mlx_closure_free(k.gumbel)
	if k.cuda {
		C.mlx_fast_cuda_kernel_free(k.pooled)
	}
	if k.fused {
		C.mlx_fast_cuda_kernel_free(k.addNorm)
		C.mlx_fast_cuda_kernel_free(k.ropeKV)
		C.mlx_fast_cuda_kernel_free(k.gluRows)
	}
}

// call applies a compiled function to args and returns its one output.
func (g *graph) call(what string, fn C.mlx_closure, args ...arr) arr {
	if g.err != nil {
		return arr{}
	}
	in := C.mlx_vector_array_new_data(&args[0], C.size_t(len(args)))
	defer C.mlx_vector_array_free(in)
	out := C.mlx_vector_array_new()
	defer C.mlx_vector_array_free(out)
	if rc := C.mlx_closure_apply(&out, fn, in); rc != 0 {
		g.err = errMLX(what, rc)
		return arr{}
	}
	return g.op(what, func(r *arr) C.int { return C.mlx_vector_array_get(r, out, 0) })
}

// swiglu is silu(gate) * up, compiled.
func (g *graph) swiglu(gate, up arr) arr { return g.call("swiglu", g.k.swiglu, gate, up) }

// gumbelNoise is the compiled Gumbel noise of ids [V] under keys k0, k1
// [S, 1].
func (g *graph) gumbelNoise(ids, k0, k1 arr) arr { return g.call("gumbel", g.k.gumbel, ids, k0, k1) }
