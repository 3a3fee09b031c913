//go:build mlx

package mlx

/*
#cgo LDFLAGS: -lmlxc -lmlx
#include <stdlib.h>
#include "mlx/c/mlx.h"
void mlxs_init(void);
const char* mlxs_take_error(void);

static mlx_optional_int mlxs_some_int(int v) { mlx_optional_int o = {v, true}; return o; }
static mlx_optional_float mlxs_some_float(float v) { mlx_optional_float o = {v, true}; return o; }
static mlx_optional_float mlxs_no_float(void) { mlx_optional_float o = {0, false}; return o; }
static mlx_optional_dtype mlxs_no_dtype(void) { mlx_optional_dtype o = {MLX_FLOAT32, false}; return o; }
static mlx_array mlxs_null(void) { mlx_array a = {0}; return a; }
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/mlxserving/mlxserving/internal/metal"
)

// errMLX is MLX's message for a failed call, taken on the calling thread.
func errMLX(what string, rc C.int) error {
	msg := C.mlxs_take_error()
	if msg == nil {
		return fmt.Errorf("mlx: %s: %w: code %d", what, metal.ErrMLX, int(rc))
	}
	return fmt.Errorf("mlx: %s: %w: %s", what, metal.ErrMLX, C.GoString(msg))
}

// arr is an MLX array handle. Handles are freed explicitly: temporaries by
// the graph that made them, kept ones by their owner.
type arr = C.mlx_array

func isNull(a arr) bool { return a.ctx == nil }

// free releases a kept handle and nulls it.
func free(a *arr) {
	if a.ctx != nil {
		C.mlx_array_free(*a)
		a.ctx = nil
	}
}

// graph builds MLX computations on one stream. Every array it returns is a
// temporary freed by release; keep makes a handle that outlives it. The
// first failed call sets err and turns later calls into no-ops, so code
// reads straight and checks err once.
type graph struct {
	s   C.mlx_stream
	k   *kernels
	tmp []arr
	err error
	// prims counts the MLX primitives (operations, not host data) the
	// graph has made since it was created: MLX pays a host-side cost per
	// primitive at every evaluation, so this is the step's launch budget.
	prims int
}

func (g *graph) op(what string, f func(*arr) C.int) arr {
	if g.err != nil {
		return C.mlxs_null()
	}
	var r arr
	if rc := f(&r); rc != 0 {
		g.err = errMLX(what, rc)
		if r.ctx != nil {
			C.mlx_array_free(r)
		}
		return C.mlxs_null()
	}
	g.tmp = append(g.tmp, r)
	if what != "array" && what != "scalar" {
		g.prims++
	}
	return r
}

// release frees the graph's temporaries.
func (g *graph) release() {
	for _, a := range g.tmp {
		C.mlx_array_free(a)
	}
	g.tmp = g.tmp[:0]
}

// keep returns a new handle to a that the caller owns and frees.
func (g *graph) keep(a arr) arr {
	k := C.mlx_array_new()
	if g.err == nil {
		if rc := C.mlx_array_set(&k, a); rc != 0 {
			g.err = errMLX("keep", rc)
		}
	}
	return k
}

// eval computes arrays.
func (g *graph) eval(as ...arr) {
	if g.err != nil || len(as) == 0 {
		return
	}
	v := C.mlx_vector_array_new_data(&as[0], C.size_t(len(as)))
	defer C.mlx_vector_array_free(v)
	if rc := C.mlx_eval(v); rc != 0 {
		g.err = errMLX("eval", rc)
	}
}

func cints(xs []int) []C.int {
	out := make([]C.int, len(xs))
	for i, x := range xs {
		out[i] = C.int(x)
	}
	return out
}

// hostArray copies host data of shape into a new array of type dt.
func (g *graph) hostArray(data unsafe.Pointer, dt C.mlx_dtype, shape []int) arr {
	sh := cints(shape)
	return g.op("array", func(r *arr) C.int {
		*r = C.mlx_array_new_data(data, &sh[0], C.int(len(sh)), dt)
		return 0
	})
}

func (g *graph) int32s(data []int32, shape ...int) arr {
	return g.hostArray(unsafe.Pointer(&data[0]), C.MLX_INT32, shape)
}
func (g *graph) uint32s(data []uint32, shape ...int) arr {
	return g.hostArray(unsafe.Pointer(&data[0]), C.MLX_UINT32, shape)
}
func (g *graph) float32s(data []float32, shape ...int) arr {
	return g.hostArray(unsafe.Pointer(&data[0]), C.MLX_FLOAT32, shape)
}
func (g *graph) bools(data []bool, shape ...int) arr {
	return g.hostArray(unsafe.Pointer(&data[0]), C.MLX_BOOL, shape)
}

func (g *graph) scalar(v float32) arr {
	return g.op("scalar", func(r *arr) C.int { *r = C.mlx_array_new_float32(C.float(v)); return 0 })
}

func (g *graph) add(a, b arr) arr {
	return g.op("add", func(r *arr) C.int { return C.mlx_add(r, a, b, g.s) })
}
func (g *graph) sub(a, b arr) arr {
	return g.op("subtract", func(r *arr) C.int { return C.mlx_subtract(r, a, b, g.s) })
}
func (g *graph) mul(a, b arr) arr {
	return g.op("multiply", func(r *arr) C.int { return C.mlx_multiply(r, a, b, g.s) })
}
func (g *graph) div(a, b arr) arr {
	return g.op("divide", func(r *arr) C.int { return C.mlx_divide(r, a, b, g.s) })
}
func (g *graph) matmul(a, b arr) arr {
	return g.op("matmul", func(r *arr) C.int { return C.mlx_matmul(r, a, b, g.s) })
}
func (g *graph) sigmoid(a arr) arr {
	return g.op("sigmoid", func(r *arr) C.int { return C.mlx_sigmoid(r, a, g.s) })
}
func (g *graph) neg(a arr) arr {
	return g.op("negative", func(r *arr) C.int { return C.mlx_negative(r, a, g.s) })
}
func (g *graph) greater(a, b arr) arr {
	return g.op("greater", func(r *arr) C.int { return C.mlx_greater(r, a, b, g.s) })
}
func (g *graph) less(a, b arr) arr {
	return g.op("less", func(r *arr) C.int { return C.mlx_less(r, a, b, g.s) })
}
func (g *graph) where(c, a, b arr) arr {
	return g.op("where", func(r *arr) C.int { return C.mlx_where(r, c, a, b, g.s) })
}
func (g *graph) astype(a arr, dt C.mlx_dtype) arr {
	return g.op("astype", func(r *arr) C.int { return C.mlx_astype(r, a, dt, g.s) })
}

func (g *graph) reshape(a arr, shape ...int) arr {
	sh := cints(shape)
	return g.op("reshape", func(r *arr) C.int { return C.mlx_reshape(r, a, &sh[0], C.size_t(len(sh)), g.s) })
}

func (g *graph) transpose(a arr, axes ...int) arr {
	ax := cints(axes)
	return g.op("transpose", func(r *arr) C.int { return C.mlx_transpose_axes(r, a, &ax[0], C.size_t(len(ax)), g.s) })
}

func (g *graph) slice(a arr, start, stop []int) arr {
	st, sp := cints(start), cints(stop)
	one := make([]C.int, len(st))
	for i := range one {
		one[i] = 1
	}
	n := C.size_t(len(st))
	return g.op("slice", func(r *arr) C.int { return C.mlx_slice(r, a, &st[0], n, &sp[0], n, &one[0], n, g.s) })
}

func (g *graph) sliceUpdate(src, upd arr, start, stop []int) arr {
	st, sp := cints(start), cints(stop)
	one := make([]C.int, len(st))
	for i := range one {
		one[i] = 1
	}
	n := C.size_t(len(st))
	return g.op("slice_update", func(r *arr) C.int {
		return C.mlx_slice_update(r, src, upd, &st[0], n, &sp[0], n, &one[0], n, g.s)
	})
}

// scatterRows writes upd [N, 1, ...] into rows idx [N] of a [rows, ...].
func (g *graph) scatterRows(a, idx, upd arr) arr {
	return g.op("scatter", func(r *arr) C.int { return C.mlx_scatter_single(r, a, idx, upd, 0, g.s) })
}

func (g *graph) concat(axis int, as ...arr) arr {
	if len(as) == 1 {
		return as[0]
	}
	return g.op("concatenate", func(r *arr) C.int {
		v := C.mlx_vector_array_new_data(&as[0], C.size_t(len(as)))
		defer C.mlx_vector_array_free(v)
		return C.mlx_concatenate_axis(r, v, C.int(axis), g.s)
	})
}

func (g *graph) zeros(dt C.mlx_dtype, shape ...int) arr {
	sh := cints(shape)
	return g.op("zeros", func(r *arr) C.int { return C.mlx_zeros(r, &sh[0], C.size_t(len(sh)), dt, g.s) })
}

func (g *graph) take(a, idx arr, axis int) arr {
	return g.op("take", func(r *arr) C.int { return C.mlx_take_axis(r, a, idx, C.int(axis), g.s) })
}
func (g *graph) takeAlong(a, idx arr, axis int) arr {
	return g.op("take_along_axis", func(r *arr) C.int { return C.mlx_take_along_axis(r, a, idx, C.int(axis), g.s) })
}
func (g *graph) putAlong(a, idx, v arr, axis int) arr {
	return g.op("put_along_axis", func(r *arr) C.int { return C.mlx_put_along_axis(r, a, idx, v, C.int(axis), g.s) })
}
func (g *graph) argmax(a arr, axis int) arr {
	return g.op("argmax", func(r *arr) C.int { return C.mlx_argmax_axis(r, a, C.int(axis), false, g.s) })
}
func (g *graph) argsort(a arr, axis int) arr {
	return g.op("argsort", func(r *arr) C.int { return C.mlx_argsort_axis(r, a, C.int(axis), g.s) })
}
func (g *graph) argpartition(a arr, kth, axis int) arr {
	return g.op("argpartition", func(r *arr) C.int { return C.mlx_argpartition_axis(r, a, C.int(kth), C.int(axis), g.s) })
}
func (g *graph) topk(a arr, k, axis int) arr {
	return g.op("topk", func(r *arr) C.int { return C.mlx_topk_axis(r, a, C.int(k), C.int(axis), g.s) })
}
func (g *graph) sort(a arr, axis int) arr {
	return g.op("sort", func(r *arr) C.int { return C.mlx_sort_axis(r, a, C.int(axis), g.s) })
}
func (g *graph) maxKeep(a arr, axis int) arr {
	return g.op("max", func(r *arr) C.int { return C.mlx_max_axis(r, a, C.int(axis), true, g.s) })
}
func (g *graph) sumKeep(a arr, axis int) arr {
	return g.op("sum", func(r *arr) C.int { return C.mlx_sum_axis(r, a, C.int(axis), true, g.s) })
}
func (g *graph) greaterEqual(a, b arr) arr {
	return g.op("greater_equal", func(r *arr) C.int { return C.mlx_greater_equal(r, a, b, g.s) })
}
func (g *graph) and(a, b arr) arr {
	return g.op("logical_and", func(r *arr) C.int { return C.mlx_logical_and(r, a, b, g.s) })
}
func (g *graph) bitAnd(a, b arr) arr {
	return g.op("bitwise_and", func(r *arr) C.int { return C.mlx_bitwise_and(r, a, b, g.s) })
}
func (g *graph) xor(a, b arr) arr {
	return g.op("bitwise_xor", func(r *arr) C.int { return C.mlx_bitwise_xor(r, a, b, g.s) })
}
func (g *graph) shr(a, b arr) arr {
	return g.op("right_shift", func(r *arr) C.int { return C.mlx_right_shift(r, a, b, g.s) })
}
func (g *graph) log(a arr) arr {
	return g.op("log", func(r *arr) C.int { return C.mlx_log(r, a, g.s) })
}
func (g *graph) view(a arr, dt C.mlx_dtype) arr {
	return g.op("view", func(r *arr) C.int { return C.mlx_view(r, a, dt, g.s) })
}
func (g *graph) scatterAdd(a, idx, upd arr) arr {
	return g.op("scatter_add", func(r *arr) C.int { return C.mlx_scatter_add_single(r, a, idx, upd, 0, g.s) })
}
func (g *graph) scatter(a, idx, upd arr) arr {
	return g.op("scatter", func(r *arr) C.int { return C.mlx_scatter_single(r, a, idx, upd, 0, g.s) })
}
func (g *graph) u32(v uint32) arr { return g.uint32s([]uint32{v}, 1) }

func (g *graph) softmax(a arr, axis int) arr {
	return g.op("softmax", func(r *arr) C.int { return C.mlx_softmax_axis(r, a, C.int(axis), true, g.s) })
}
func (g *graph) logsumexp(a arr, axis int) arr {
	return g.op("logsumexp", func(r *arr) C.int { return C.mlx_logsumexp_axis(r, a, C.int(axis), true, g.s) })
}
func (g *graph) cumsum(a arr, axis int, inclusive bool) arr {
	return g.op("cumsum", func(r *arr) C.int { return C.mlx_cumsum(r, a, C.int(axis), false, C.bool(inclusive), g.s) })
}
func (g *graph) arange(n int, dt C.mlx_dtype) arr {
	return g.op("arange", func(r *arr) C.int { return C.mlx_arange(r, 0, C.double(n), 1, dt, g.s) })
}

// rmsNorm is x's RMS norm over its last axis, times w: MLX's fast
// rms_norm, except where MLX's CUDA kernel for it is wrong
// (rmsNormMixesRows), where it is the same written out.
func (g *graph) rmsNorm(x, w arr, eps float32) arr {
	if g.err == nil && g.k != nil && g.k.cuda {
		if sh := shapeOf(x); len(sh) > 0 && rmsNormMixesRows(sh[len(sh)-1], int(C.mlx_dtype_size(dtype(x)))) {
			return g.rmsNormOps(x, w, eps)
		}
	}
	return g.fastRMSNorm(x, w, eps)
}

// fastRMSNorm is MLX's fast rms_norm as it is.
func (g *graph) fastRMSNorm(x, w arr, eps float32) arr {
	return g.op("rms_norm", func(r *arr) C.int { return C.mlx_fast_rms_norm(r, x, w, C.float(eps), g.s) })
}

// rmsNormMixesRows reports whether MLX 0.31's CUDA rms_norm gives wrong
// results for rows of n values of size bytes each (float32: 4; bfloat16,
// float16: 2). For n in (32*r, 64*r], r = 16/size the values a thread
// reads, it packs two rows into a block of two warps per row but reduces
// the squares block-wide, so each row is normalized by the sum of its
// pair's squares (and its shared array is overrun). Gemma 3's per-head
// q/k norms at head_dim 256 in float32 fall in that band: on an H200 its
// float32 log-probabilities were up to 0.99 from transformers' with
// every other family within 1.2e-05. Fixed upstream by
// ml-explore/mlx#3792 (one row per block); the CPU and Metal paths are
// not affected.
func rmsNormMixesRows(n, size int) bool {
	if size != 2 && size != 4 {
		return false
	}
	r := 16 / size
	return n > 32*r && n <= 64*r
}

// rmsNormOps is MLX's own rms_norm fallback written out: in float32,
// x * rsqrt(mean(x²) + eps), cast back to x's dtype, times w.
func (g *graph) rmsNormOps(x, w arr, eps float32) arr {
	dt := dtype(x)
	f := x
	if dt != C.MLX_FLOAT32 {
		f = g.astype(x, C.MLX_FLOAT32)
	}
	sq := g.op("square", func(r *arr) C.int { return C.mlx_square(r, f, g.s) })
	ms := g.op("mean", func(r *arr) C.int { return C.mlx_mean_axis(r, sq, -1, true, g.s) })
	ms = g.add(ms, g.scalar(eps))
	inv := g.op("rsqrt", func(r *arr) C.int { return C.mlx_rsqrt(r, ms, g.s) })
	y := g.mul(f, inv)
	if dt != C.MLX_FLOAT32 {
		y = g.astype(y, dt)
	}
	if isNull(w) {
		return y
	}
	return g.mul(y, w)
}

// rope rotates x [B, H, T, D] for positions offset.. with base theta or,
// when freqs is set, those frequencies.
func (g *graph) rope(x arr, dims int, theta, scale float32, offset int, freqs arr) arr {
	base := C.mlxs_some_float(C.float(theta))
	if !isNull(freqs) {
		base = C.mlxs_no_float()
	}
	return g.op("rope", func(r *arr) C.int {
		return C.mlx_fast_rope(r, x, C.int(dims), false, base, C.float(scale), C.int(offset), freqs, g.s)
	})
}

// ropeAt rotates x [N, H, T, D] where batch row i starts at position
// offsets[i].
func (g *graph) ropeAt(x arr, dims int, theta, scale float32, offsets, freqs arr) arr {
	base := C.mlxs_some_float(C.float(theta))
	if !isNull(freqs) {
		base = C.mlxs_no_float()
	}
	return g.op("rope", func(r *arr) C.int {
		return C.mlx_fast_rope_dynamic(r, x, C.int(dims), false, base, C.float(scale), offsets, freqs, g.s)
	})
}

// sdpaMask is attention with a mask broadcast against the scores
// [B, heads, Tq, Tk]: boolean (true: attend) or additive in q's dtype.
// sinks, when not null, is a logit per head [heads] that every row's
// softmax includes and drops (gpt-oss).
func (g *graph) sdpaMask(q, k, v arr, scale float32, mask, sinks arr) arr {
	return g.op("scaled_dot_product_attention", func(r *arr) C.int {
		return C.mlx_fast_scaled_dot_product_attention(r, q, k, v, C.float(scale), noMask, mask, sinks, g.s)
	})
}

var noMask = C.CString("") // constant, never freed

// sdpa is attention, causal or over every key, with sinks as sdpaMask's.
func (g *graph) sdpa(q, k, v arr, scale float32, causal bool, sinks arr) arr {
	mode := C.CString("")
	if causal {
		C.free(unsafe.Pointer(mode))
		mode = C.CString("causal")
	}
	defer C.free(unsafe.Pointer(mode))
	return g.op("scaled_dot_product_attention", func(r *arr) C.int {
		return C.mlx_fast_scaled_dot_product_attention(r, q, k, v, C.float(scale), mode, C.mlxs_null(), sinks, g.s)
	})
}

var (
	affine = C.CString("affine") // constants, never freed
	mxfp4  = C.CString("mxfp4")
)

func (g *graph) quantizedMatmul(x, w, scales, biases arr, groupSize, bits int) arr {
	return g.op("quantized_matmul", func(r *arr) C.int {
		return C.mlx_quantized_matmul(r, x, w, scales, biases, true, C.mlxs_some_int(C.int(groupSize)), C.mlxs_some_int(C.int(bits)), affine, g.s)
	})
}

func (g *graph) dequantize(w, scales, biases arr, groupSize, bits int) arr {
	return g.op("dequantize", func(r *arr) C.int {
		return C.mlx_dequantize(r, w, scales, biases, C.mlxs_some_int(C.int(groupSize)), C.mlxs_some_int(C.int(bits)), affine, C.mlxs_null(), C.mlxs_no_dtype(), g.s)
	})
}

// quantize returns MLX affine (weight, scales, biases) for w.
func (g *graph) quantize(w arr, groupSize, bits int) (q, scales, biases arr) {
	if g.err != nil {
		return C.mlxs_null(), C.mlxs_null(), C.mlxs_null()
	}
	v := C.mlx_vector_array_new()
	defer C.mlx_vector_array_free(v)
	if rc := C.mlx_quantize(&v, w, C.mlxs_some_int(C.int(groupSize)), C.mlxs_some_int(C.int(bits)), affine, C.mlxs_null(), g.s); rc != 0 {
		g.err = errMLX("quantize", rc)
		return C.mlxs_null(), C.mlxs_null(), C.mlxs_null()
	}
	if n := C.mlx_vector_array_size(v); n != 3 {
		g.err = fmt.Errorf("mlx: quantize returned %d arrays, want 3", int(n))
		return C.mlxs_null(), C.mlxs_null(), C.mlxs_null()
	}
	get := func(i int) arr {
		return g.op("quantize", func(r *arr) C.int { return C.mlx_vector_array_get(r, v, C.size_t(i)) })
	}
	return get(0), get(1), get(2)
}

func shapeOf(a arr) []int {
	n := int(C.mlx_array_ndim(a))
	if n == 0 {
		return nil
	}
	p := unsafe.Slice(C.mlx_array_shape(a), n)
	out := make([]int, n)
	for i, d := range p {
		out[i] = int(d)
	}
	return out
}

// readInt32s copies an evaluated int32 array to Go.
func readInt32s(a arr) ([]int32, error) {
	if C.mlx_array_dtype(a) != C.MLX_INT32 && C.mlx_array_dtype(a) != C.MLX_UINT32 {
		return nil, errors.New("mlx: want an int32 array")
	}
	n := int(C.mlx_array_size(a))
	p := C.mlx_array_data_int32(a)
	if p == nil {
		return nil, errMLX("data", 1)
	}
	return append([]int32(nil), unsafe.Slice((*int32)(unsafe.Pointer(p)), n)...), nil
}

// readFloat32s copies an evaluated float32 array to Go.
func readFloat32s(a arr) ([]float32, error) {
	if C.mlx_array_dtype(a) != C.MLX_FLOAT32 {
		return nil, errors.New("mlx: want a float32 array")
	}
	n := int(C.mlx_array_size(a))
	p := C.mlx_array_data_float32(a)
	if p == nil {
		return nil, errMLX("data", 1)
	}
	return append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(p)), n)...), nil
}

func (g *graph) tanh(a arr) arr {
	return g.op("tanh", func(r *arr) C.int { return C.mlx_tanh(r, a, g.s) })
}
func (g *graph) floorDiv(a, b arr) arr {
	return g.op("floor_divide", func(r *arr) C.int { return C.mlx_floor_divide(r, a, b, g.s) })
}

// scalarOf is v as a 0-d array of dtype dt, so that it does not promote
// the array it scales.
func (g *graph) scalarOf(v float32, dt C.mlx_dtype) arr {
	s := g.scalar(v)
	if dt == C.MLX_FLOAT32 {
		return s
	}
	return g.astype(s, dt)
}

// dtype is a's element type.
func dtype(a arr) C.mlx_dtype { return C.mlx_array_dtype(a) }

// gatherMM is x @ b[idx]: x [..., M, K] against the matrices b [E, K, N]
// picked by rhs indices idx (broadcast against x's batch), as mlx-lm's
// SwitchLinear runs it; sorted says idx is in increasing order.
func (g *graph) gatherMM(x, b, idx arr, sorted bool) arr {
	return g.op("gather_mm", func(r *arr) C.int { return C.mlx_gather_mm(r, x, b, C.mlxs_null(), idx, C.bool(sorted), g.s) })
}

// gatherQMM is gatherMM over MLX-quantized matrices w [E, N, K*bits/32]
// (transposed, as linear layers store them): affine, or mxfp4 (no
// biases) when mode is "mxfp4".
func (g *graph) gatherQMM(x, w, scales, biases, idx arr, p quantParams, sorted bool) arr {
	mode := affine
	if p.Mode == "mxfp4" {
		mode = mxfp4
	}
	return g.op("gather_qmm", func(r *arr) C.int {
		return C.mlx_gather_qmm(r, x, w, scales, biases, C.mlxs_null(), idx, true, C.mlxs_some_int(C.int(p.GroupSize)), C.mlxs_some_int(C.int(p.Bits)), mode, C.bool(sorted), g.s)
	})
}

func (g *graph) expandDims(a arr, axis int) arr {
	return g.op("expand_dims", func(r *arr) C.int { return C.mlx_expand_dims(r, a, C.int(axis), g.s) })
}
