//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"

// The fused decode-layer kernels (CUDA). Each replaces several MLX
// primitives by one, since at small batches a decode step costs MLX's
// host-side work per primitive more than GPU time.

// add_norm: out_res = res + delta, out_norm = rms_norm(out_res) * weight,
// rows of HD values, one block of 256 threads per row.
static const char* mlxs_add_norm_src =
	"const int row = blockIdx.y;\n"
	"const int tid = threadIdx.x;\n"
	"__shared__ float part[32];\n"
	"const size_t base = (size_t)row * HD;\n"
	"float ss = 0.f;\n"
	"for (int i = tid; i < HD; i += blockDim.x) {\n"
	"  const OutT s = static_cast<OutT>(static_cast<float>(res[base + i]) + static_cast<float>(delta[base + i]));\n"
	"  out_res[base + i] = s;\n"
	"  const float f = static_cast<float>(s);\n"
	"  ss += f * f;\n"
	"}\n"
	"for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, off);\n"
	"if ((tid & 31) == 0) part[tid >> 5] = ss;\n"
	"__syncthreads();\n"
	"if (tid < 32) {\n"
	"  float t = tid < (int)(blockDim.x >> 5) ? part[tid] : 0.f;\n"
	"  for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffff, t, off);\n"
	"  if (tid == 0) part[0] = t;\n"
	"}\n"
	"__syncthreads();\n"
	"const float inv = rsqrtf(part[0] / HD + eps[0]);\n"
	"for (int i = tid; i < HD; i += blockDim.x) {\n"
	"  const OutT y = static_cast<OutT>(static_cast<float>(out_res[base + i]) * inv);\n"
	"  out_norm[base + i] = static_cast<OutT>(static_cast<float>(weight[i]) * static_cast<float>(y));\n"
	"}\n";

// rope_kv: the rows a decode step writes into the KV pool, from the
// fused q/k/v product qkv [N, W] (queries first, QD values): out
// [2*N*KVH, 1, D] holds every token's key heads rotated at pos [N]
// (scaled positions) with inverse frequencies invf [D/2], then every
// token's value heads. One thread per (row, rotated pair).
static const char* mlxs_rope_kv_src =
	"constexpr int HALF = D / 2;\n"
	"const int j = blockIdx.x * blockDim.x + threadIdx.x;\n"
	"const int i = blockIdx.y * blockDim.y + threadIdx.y;\n"
	"const int ntok = qkv_shape[0], W = qkv_shape[1];\n"
	"if (j >= HALF || i >= 2 * ntok * KVH) return;\n"
	"const bool isv = i >= ntok * KVH;\n"
	"const int ri = isv ? i - ntok * KVH : i;\n"
	"const int tok = ri / KVH, hd = ri % KVH;\n"
	"const size_t src = (size_t)tok * W + QD + (isv ? KVH * D : 0) + (size_t)hd * D;\n"
	"const size_t dst = (size_t)i * D;\n"
	"const float x1 = static_cast<float>(qkv[src + j]), x2 = static_cast<float>(qkv[src + j + HALF]);\n"
	"if (isv) {\n"
	"  out[dst + j] = static_cast<OutT>(x1);\n"
	"  out[dst + j + HALF] = static_cast<OutT>(x2);\n"
	"} else {\n"
	"  const float th = pos[tok] * invf[j];\n"
	"  const float cs = cosf(th), sn = sinf(th);\n"
	"  out[dst + j] = static_cast<OutT>(x1 * cs - x2 * sn);\n"
	"  out[dst + j + HALF] = static_cast<OutT>(x1 * sn + x2 * cs);\n"
	"}\n";

// glu_rows: silu(gate) * up from the fused gate/up product y [N,
// 2*INTER] (gates first), out [N, INTER]. One thread per output.
static const char* mlxs_glu_rows_src =
	"const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
	"if (i >= (size_t)y_shape[0] * INTER) return;\n"
	"const size_t row = i / INTER, col = i % INTER;\n"
	"const float gt = static_cast<float>(y[row * 2 * INTER + col]);\n"
	"const float up = static_cast<float>(y[row * 2 * INTER + INTER + col]);\n"
	"out[i] = static_cast<OutT>(gt / (1.f + expf(-gt)) * up);\n";

static mlx_fast_cuda_kernel mlxs_fused_new(int which) {
	mlx_vector_string ins, outs;
	const char* src;
	const char* name;
	if (which == 0) {
		const char* in[4] = {"res", "delta", "weight", "eps"};
		const char* out[2] = {"out_res", "out_norm"};
		ins = mlx_vector_string_new_data(in, 4);
		outs = mlx_vector_string_new_data(out, 2);
		src = mlxs_add_norm_src;
		name = "mlxs_add_norm";
	} else if (which == 1) {
		const char* in[3] = {"qkv", "pos", "invf"};
		const char* out[1] = {"out"};
		ins = mlx_vector_string_new_data(in, 3);
		outs = mlx_vector_string_new_data(out, 1);
		src = mlxs_rope_kv_src;
		name = "mlxs_rope_kv";
	} else {
		const char* in[1] = {"y"};
		const char* out[1] = {"out"};
		ins = mlx_vector_string_new_data(in, 1);
		outs = mlx_vector_string_new_data(out, 1);
		src = mlxs_glu_rows_src;
		name = "mlxs_glu_rows";
	}
	mlx_fast_cuda_kernel k = mlx_fast_cuda_kernel_new(name, ins, outs, src, "", true, 0);
	mlx_vector_string_free(ins);
	mlx_vector_string_free(outs);
	return k;
}
*/
import "C"

// newFusedKernels makes the add-norm, rope-KV and gated-linear kernels;
// CUDA only.
func newFusedKernels() (addNorm, ropeKV, gluRows C.mlx_fast_cuda_kernel) {
	return C.mlxs_fused_new(0), C.mlxs_fused_new(1), C.mlxs_fused_new(2)
}

// decodeOnly reports whether a step runs decodeLayers: every feed decodes
// one token and the layers have fused q/k/v and gate/up products and no
// q/k norm.
func (m *model) decodeOnly(p *stepPlan) bool {
	l := &m.w.layers[0]
	return len(p.pre) == 0 && len(p.dec) == p.n && m.cfg.plainDecode() && !isNull(l.qkv.w) && !isNull(l.gateUp.w)
}

// decodeLayers runs every layer over a decode-only step's tokens x [N,
// hidden] (one per feed, in feed order; h is x after the first layer's
// input norm) at positions [N], and returns them after the final norm. A layer is ten primitives with the CUDA
// kernels: the q/k/v product, the rotated keys and the values in one
// kernel (ropeKV), one scatter into the pool, attention that rotates the
// queries itself, the output product, the residual add and the next norm
// in one kernel (addNorm, twice), the gate/up product, the gated
// activation (gluRows) and the down product. Elsewhere each of these
// kernels is the MLX ops that compute the same.
func (m *model) decodeLayers(g *graph, x, h, positions arr, p *stepPlan) arr {
	c, w := m.cfg, m.w
	f := &fusedStep{n: p.n, kern: g.k.fused && p.pooled, eps: g.float32s([]float32{c.NormEps}, 1), at: positions}
	for li := range w.layers {
		l := &w.layers[li]
		qkv := m.proj(g, li, pQKV, &l.qkv, h, p)
		m.writeKV(g, li, p.writes[m.pool.lay.group[li]], m.ropeKV(g, p, f, qkv))
		o := m.attendFused(g, li, p, f, qkv)
		x, h = m.addNorm(g, f, x, m.proj(g, li, pO, &l.o, o, p), l.postNorm)
		d := m.proj(g, li, pDown, &l.down, m.gluRows(g, f, m.proj(g, li, pGateUp, &l.gateUp, h, p)), p)
		next := w.norm
		if li+1 < len(w.layers) {
			next = w.layers[li+1].inNorm
		}
		x, h = m.addNorm(g, f, x, d, next)
	}
	return h
}

// fusedStep is what decodeLayers' kernels share across layers.
type fusedStep struct {
	n    int  // tokens, one per feed
	kern bool // the CUDA kernels run (else their MLX ops)
	eps  arr  // [1] the norms' epsilon
	at   arr  // [N] int32 positions
}

// ropeScale is what RoPE multiplies positions by.
func (m *model) ropeScale() float32 {
	if m.cfg.Rope.Type == "linear" {
		return float32(1 / m.cfg.Rope.Factor)
	}
	return 1
}

// addNorm returns res + delta and its RMS norm with weight w, [N, hidden]
// each.
func (m *model) addNorm(g *graph, f *fusedStep, res, delta, w arr) (arr, arr) {
	c := m.cfg
	if !f.kern {
		r := g.add(res, delta)
		return r, g.rmsNorm(r, w, c.NormEps)
	}
	n := f.n
	o := g.kernel("add_norm", g.k.addNorm, kernelCall{
		in:    []arr{res, delta, w, f.eps},
		outs:  [][]int{{n, c.Hidden}, {n, c.Hidden}},
		dt:    m.w.dtype,
		grid:  [2]int{256, n},
		block: [2]int{256, 1},
		targs: []string{"HD"}, targVal: []int{c.Hidden},
	})
	return o[0], o[1]
}

// ropeKV returns the pool rows [2*N*kvHeads, 1, D] of a decode step's
// keys (rotated) and values, in writeKV's order, from the q/k/v product
// qkv [N, width].
func (m *model) ropeKV(g *graph, p *stepPlan, f *fusedStep, qkv arr) arr {
	c := m.cfg
	n, qd, kd := f.n, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	if !f.kern {
		k := g.reshape(g.slice(qkv, []int{0, qd}, []int{n, qd + kd}), n, c.KVHeads, 1, c.HeadDim)
		k = g.ropeAt(k, c.HeadDim, c.RopeTheta, m.ropeScale(), f.at, m.w.ropes[0].freqs)
		v := g.slice(qkv, []int{0, qd + kd}, []int{n, qd + 2*kd})
		rows := []int{n * c.KVHeads, 1, c.HeadDim}
		return g.concat(0, g.reshape(k, rows...), g.reshape(v, rows...))
	}
	return g.kernel("rope_kv", g.k.ropeKV, kernelCall{
		in:    []arr{qkv, p.posf, p.invf},
		outs:  [][]int{{2 * n * c.KVHeads, 1, c.HeadDim}},
		dt:    m.w.dtype,
		grid:  [2]int{c.HeadDim / 2, 2 * n * c.KVHeads},
		block: [2]int{32, 8},
		targs: []string{"QD", "KVH", "D"}, targVal: []int{qd, c.KVHeads, c.HeadDim},
	})[0]
}

// attendFused is a decode-only step's attention in layer li from the
// q/k/v product qkv [N, width]; it returns [N, heads*D].
func (m *model) attendFused(g *graph, li int, p *stepPlan, f *fusedStep, qkv arr) arr {
	if f.kern {
		return m.attendPooled(g, li, p, qkv, true)
	}
	c, n := m.cfg, f.n
	q := g.reshape(g.slice(qkv, []int{0, 0}, []int{n, c.Heads * c.HeadDim}), n, c.Heads, 1, c.HeadDim)
	return m.attendDecode(g, li, p, g.ropeAt(q, c.HeadDim, c.RopeTheta, m.ropeScale(), f.at, m.w.ropes[0].freqs))
}

// gluRows is silu(gate) * up from the gate/up product y [N, 2*inter].
func (m *model) gluRows(g *graph, f *fusedStep, y arr) arr {
	c, n := m.cfg, f.n
	if !f.kern {
		gate := g.slice(y, []int{0, 0}, []int{n, c.Intermediate})
		up := g.slice(y, []int{0, c.Intermediate}, []int{n, 2 * c.Intermediate})
		return g.swiglu(gate, up)
	}
	return g.kernel("glu_rows", g.k.gluRows, kernelCall{
		in:    []arr{y},
		outs:  [][]int{{n, c.Intermediate}},
		dt:    m.w.dtype,
		grid:  [2]int{n * c.Intermediate, 1},
		block: [2]int{256, 1},
		targs: []string{"INTER"}, targVal: []int{c.Intermediate},
	})[0]
}
