//go:build mlx

package mlx

/*
#include <stdlib.h>
#include "mlx/c/mlx.h"

// The decode attention kernel over the KV pool (CUDA): a block per
// (sequence, query head), whose S warps walk the sequence's pool rows in
// place (warp w every S-th row from w) with an online softmax each, merged
// through shared memory at the end, so no keys or values are gathered. Inputs: q, QS values
// per sequence with head h's D values at h*D (the rotated queries
// [B, H, 1, D], QS = H*D; or with ROPE the fused q/k/v product [B, QS]
// whose queries the kernel rotates itself at positions pos [B] (scaled)
// and inverse frequencies invf [D/2]); the pool kv [2*rows*KVH, D], keys
// then values (kvPool); rows [B, T] (token rows, T the longest) and lens
// [B] (rows each sequence attends); sc [1] the queries' scale. With a
// sliding window WIN > 0 a sequence attends only its last WIN rows (the
// query at position n-1 sees keys j > n-1-WIN). Output [B, H*D].
#define MLXS_POOLED_WARPS 16 // pooledWarps
#define MLXS_STR_(x) #x
#define MLXS_STR(x) MLXS_STR_(x)
static const char* mlxs_pooled_src =
	"constexpr int S = " MLXS_STR(MLXS_POOLED_WARPS) ";\n"
	"const int lane = threadIdx.x, w = threadIdx.y;\n"
	"const int bh = blockIdx.y;\n"
	"if (bh >= rows_shape[0] * H) return;\n"
	"const int b = bh / H, hq = bh % H, kh = hq / (H / KVH);\n"
	"const int T = rows_shape[1], n = lens[b];\n"
	"const size_t voff = (size_t)(kv_shape[0] / 2) * D;\n"
	"const size_t qb = (size_t)b * QS + (size_t)hq * D;\n"
	"constexpr int E = (D + 31) / 32;\n"
	"constexpr int HALF = D / 2;\n"
	"const float scale = sc[0];\n"
	"float qv[E], acc[E];\n"
	"for (int e = 0; e < E; e++) {\n"
	"  const int d = lane + 32 * e;\n"
	"  float x = 0.f;\n"
	"  if (d < D && !ROPE) x = static_cast<float>(q[qb + d]);\n"
	"  if (d < D && ROPE) {\n"
	"    const int j = d < HALF ? d : d - HALF;\n"
	"    const float th = pos[b] * invf[j];\n"
	"    const float cs = cosf(th), sn = sinf(th);\n"
	"    const float x1 = static_cast<float>(q[qb + j]), x2 = static_cast<float>(q[qb + j + HALF]);\n"
	"    x = static_cast<float>(static_cast<OutT>(d < HALF ? x1 * cs - x2 * sn : x1 * sn + x2 * cs));\n"
	"  }\n"
	"  qv[e] = x * scale;\n"
	"  acc[e] = 0.f;\n"
	"}\n"
	"float m = -INFINITY, l = 0.f;\n"
	"const int lo = (WIN > 0 && n > WIN) ? n - WIN : 0;\n"
	"for (int t = lo + w; t < n; t += S) {\n"
	"  const size_t at = ((size_t)rows[(size_t)b * T + t] * KVH + kh) * D;\n"
	"  float s = 0.f;\n"
	"  for (int e = 0; e < E; e++) { const int d = lane + 32 * e; if (d < D) s += qv[e] * static_cast<float>(kv[at + d]); }\n"
	"  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffff, s, off);\n"
	"  const float mn = fmaxf(m, s), c = expf(m - mn), p = expf(s - mn);\n"
	"  l = l * c + p;\n"
	"  for (int e = 0; e < E; e++) { const int d = lane + 32 * e; if (d < D) acc[e] = acc[e] * c + p * static_cast<float>(kv[voff + at + d]); }\n"
	"  m = mn;\n"
	"}\n"
	"__shared__ float sm[S], sl[S], sacc[S * D];\n"
	"if (lane == 0) { sm[w] = m; sl[w] = l; }\n"
	"for (int e = 0; e < E; e++) { const int d = lane + 32 * e; if (d < D) sacc[w * D + d] = acc[e]; }\n"
	"__syncthreads();\n"
	"if (w != 0) return;\n"
	"float M = -INFINITY;\n"
	"for (int i = 0; i < S; i++) M = fmaxf(M, sm[i]);\n"
	"float L = 0.f;\n"
	"for (int i = 0; i < S; i++) if (sl[i] > 0.f) L += sl[i] * expf(sm[i] - M);\n"
	"for (int e = 0; e < E; e++) {\n"
	"  const int d = lane + 32 * e;\n"
	"  if (d >= D) continue;\n"
	"  float a = 0.f;\n"
	"  for (int i = 0; i < S; i++) if (sl[i] > 0.f) a += sacc[i * D + d] * expf(sm[i] - M);\n"
	"  out[(size_t)bh * D + d] = static_cast<OutT>(a / L);\n"
	"}\n";

// mlxs_kernel_new makes a custom CUDA kernel of source src with inputs
// in[nin] and outputs out[nout].
static mlx_fast_cuda_kernel mlxs_kernel_new(const char* name, const char** in, int nin, const char** out, int nout, const char* src) {
	mlx_vector_string ins = mlx_vector_string_new_data(in, nin);
	mlx_vector_string outs = mlx_vector_string_new_data(out, nout);
	mlx_fast_cuda_kernel k = mlx_fast_cuda_kernel_new(name, ins, outs, src, "", true, 0);
	mlx_vector_string_free(ins);
	mlx_vector_string_free(outs);
	return k;
}

// mlxs_kernel_apply runs kern on in[nin] over a grid of gx*gy threads in
// blocks of tx*ty, with template arguments OutT = dt and tnames[i] =
// tvals[i]. Output i has dtype dt and shape shapes[i*3 .. i*3+ndims[i]).
static int mlxs_kernel_apply(mlx_vector_array* res, mlx_fast_cuda_kernel kern, const mlx_array* in, int nin,
		const int* shapes, const int* ndims, int nout, mlx_dtype dt, int gx, int gy, int tx, int ty,
		const char** tnames, const int* tvals, int nt, mlx_stream s) {
	mlx_fast_cuda_kernel_config cfg = mlx_fast_cuda_kernel_config_new();
	int rc = 0;
	for (int i = 0; i < nout && rc == 0; i++) rc = mlx_fast_cuda_kernel_config_add_output_arg(cfg, shapes + 3 * i, ndims[i], dt);
	if (rc == 0) rc = mlx_fast_cuda_kernel_config_set_grid(cfg, gx, gy, 1);
	if (rc == 0) rc = mlx_fast_cuda_kernel_config_set_thread_group(cfg, tx, ty, 1);
	if (rc == 0) rc = mlx_fast_cuda_kernel_config_add_template_arg_dtype(cfg, "OutT", dt);
	for (int i = 0; i < nt && rc == 0; i++) rc = mlx_fast_cuda_kernel_config_add_template_arg_int(cfg, tnames[i], tvals[i]);
	mlx_vector_array ins = mlx_vector_array_new_data(in, nin);
	if (rc == 0) rc = mlx_fast_cuda_kernel_apply(res, kern, ins, cfg, s);
	mlx_vector_array_free(ins);
	mlx_fast_cuda_kernel_config_free(cfg);
	return rc;
}

static mlx_fast_cuda_kernel mlxs_pooled_new(void) {
	const char* in[7] = {"q", "kv", "rows", "lens", "pos", "invf", "sc"};
	const char* out[1] = {"out"};
	return mlxs_kernel_new("mlxs_pooled_attention", in, 7, out, 1, mlxs_pooled_src);
}
*/
import "C"

import "fmt"

// cudaStream reports whether stream s runs on a CUDA GPU (not CPU, not
// Metal).
func cudaStream(s C.mlx_stream) bool {
	var cuda C.bool
	if C.mlx_cuda_is_available(&cuda) != 0 || !bool(cuda) {
		return false
	}
	dev := C.mlx_device_new()
	defer C.mlx_device_free(dev)
	var t C.mlx_device_type
	return C.mlx_stream_get_device(&dev, s) == 0 && C.mlx_device_get_type(&t, dev) == 0 && t == C.MLX_GPU
}

// cpuStream reports whether stream s runs on the CPU.
func cpuStream(s C.mlx_stream) bool {
	dev := C.mlx_device_new()
	defer C.mlx_device_free(dev)
	var t C.mlx_device_type
	return C.mlx_stream_get_device(&dev, s) == 0 && C.mlx_device_get_type(&t, dev) == 0 && t == C.MLX_CPU
}

// kernelCall is one launch of a custom CUDA kernel: its inputs, output
// shapes (all of dtype dt), the grid of threads and their block, and
// integer template arguments (OutT is always dt).
type kernelCall struct {
	in      []arr
	outs    [][]int
	dt      C.mlx_dtype
	grid    [2]int
	block   [2]int
	targs   []string
	targVal []int
}

// templateNames are the C strings of the kernels' template argument
// names, made once and never freed.
var templateNames = func() map[string]*C.char {
	out := map[string]*C.char{}
	for _, n := range []string{"H", "KVH", "D", "QS", "ROPE", "HD", "QD", "INTER", "WIN"} {
		out[n] = C.CString(n)
	}
	return out
}()

// kernel applies the custom CUDA kernel k as one primitive and returns
// its outputs.
func (g *graph) kernel(what string, k C.mlx_fast_cuda_kernel, c kernelCall) []arr {
	outs := make([]arr, len(c.outs))
	if g.err != nil {
		return outs
	}
	shapes := make([]C.int, 3*len(c.outs))
	ndims := make([]C.int, len(c.outs))
	for i, sh := range c.outs {
		if len(sh) > 3 {
			g.err = fmt.Errorf("mlx: %s: output %d has %d dimensions, at most 3", what, i, len(sh))
			return outs
		}
		for j, d := range sh {
			shapes[3*i+j] = C.int(d)
		}
		ndims[i] = C.int(len(sh))
	}
	names := make([]*C.char, len(c.targs))
	vals := make([]C.int, len(c.targs))
	for i, n := range c.targs {
		names[i], vals[i] = templateNames[n], C.int(c.targVal[i])
		if names[i] == nil {
			g.err = fmt.Errorf("mlx: %s: unknown template argument %q", what, n)
			return outs
		}
	}
	var np **C.char
	var vp *C.int
	if len(names) > 0 {
		np, vp = &names[0], &vals[0]
	}
	res := C.mlx_vector_array_new()
	defer C.mlx_vector_array_free(res)
	rc := C.mlxs_kernel_apply(&res, k, &c.in[0], C.int(len(c.in)), &shapes[0], &ndims[0], C.int(len(c.outs)), c.dt,
		C.int(c.grid[0]), C.int(c.grid[1]), C.int(c.block[0]), C.int(c.block[1]), np, vp, C.int(len(names)), g.s)
	if rc != 0 {
		g.err = errMLX(what, rc)
		return outs
	}
	for i := range outs {
		outs[i] = g.op(what, func(r *arr) C.int { return C.mlx_vector_array_get(r, res, C.size_t(i)) })
	}
	g.prims -= len(outs) - 1 // one primitive, several outputs
	return outs
}

// pooledWarps is the warps the pool kernel gives each (sequence, query
// head): S in its source, both from MLXS_POOLED_WARPS. Each walks every
// pooledWarps-th row with its own online softmax and the block merges
// them, so a decode step's attention
// is not one warp's walk of the whole context: on an H200 at batch 1 the
// single-warp walk took 135 µs a layer, 58% of the step's device time.
const pooledWarps = C.MLXS_POOLED_WARPS

// newPooledKernel makes the decode attention kernel; CUDA only.
func newPooledKernel() C.mlx_fast_cuda_kernel { return C.mlxs_pooled_new() }

// pooled reports whether decode attention runs in the pool kernel: on a
// CUDA GPU, for every architecture but those that soft-cap attention
// logits (Gemma 2), whose decode steps take the generic path
// (attendDecode: gathered rows, softcapAttention). Sliding layers run
// in the kernel with their window (WIN), any query scale through sc.
func (m *model) pooled(g *graph) bool {
	return g.k.cuda && m.cfg.Heads%m.cfg.KVHeads == 0 && m.cfg.AttnCap == 0 && !m.cfg.Sinks
}

// attendPooled is the decode feeds' attention in layer li through the
// pool kernel, against each sequence's pool rows in li's group (groupDec's
// rows [B, T], the first lens [B] of them). Its queries q are rotated ([B, heads, 1,
// D]) or, with rope, the fused q/k/v product [B, qkvWidth] whose queries
// the kernel rotates at p.posf. It returns [B, heads*D].
func (m *model) attendPooled(g *graph, li int, p *stepPlan, q arr, rope bool) arr {
	c, b := m.cfg, len(p.dec)
	qs, r := c.Heads*c.HeadDim, 0
	if rope {
		qs, r = (c.Heads+2*c.KVHeads)*c.HeadDim, 1
	}
	win := 0
	if c.slides(li) {
		win = c.Window
	}
	d := &p.decs[m.pool.lay.group[li]]
	return g.kernel("pooled_attention", g.k.pooled, kernelCall{
		in:      []arr{q, *m.kvOf(li), d.rows, d.lens, p.posf, p.invf, p.qscale},
		outs:    [][]int{{b, c.Heads * c.HeadDim}},
		dt:      m.w.dtype,
		grid:    [2]int{32, b * c.Heads * pooledWarps},
		block:   [2]int{32, pooledWarps},
		targs:   []string{"H", "KVH", "D", "QS", "ROPE", "WIN"},
		targVal: []int{c.Heads, c.KVHeads, c.HeadDim, qs, r, win},
	})[0]
}
