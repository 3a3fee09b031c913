//go:build mlx

package mlx

/*
#include <stdlib.h>
#include "mlx/c/mlx.h"

// The decode attention kernel over the KV pool (CUDA): one warp per
// (sequence, query head) walks the sequence's pool rows in place with an
// online softmax, so no keys or values are gathered. Inputs: q [B, H, D],
// the pools k and v [rows*KVH, D], rows [B, T] (token rows, T the
// longest) and lens [B] (rows each sequence attends). Output [B, H, D].
static const char* mlxs_pooled_src =
	"const int lane = threadIdx.x;\n"
	"const int bh = blockIdx.y * blockDim.y + threadIdx.y;\n"
	"if (bh >= q_shape[0] * H) return;\n"
	"const int b = bh / H, kh = (bh % H) / (H / KVH);\n"
	"const int T = rows_shape[1], n = lens[b];\n"
	"constexpr int E = (D + 31) / 32;\n"
	"const float scale = rsqrtf((float)D);\n"
	"float qv[E], acc[E];\n"
	"for (int e = 0; e < E; e++) {\n"
	"  const int d = lane + 32 * e;\n"
	"  qv[e] = d < D ? static_cast<float>(q[(size_t)bh * D + d]) * scale : 0.f;\n"
	"  acc[e] = 0.f;\n"
	"}\n"
	"float m = -inf, l = 0.f;\n"
	"for (int t = 0; t < n; t++) {\n"
	"  const size_t at = ((size_t)rows[(size_t)b * T + t] * KVH + kh) * D;\n"
	"  float s = 0.f;\n"
	"  for (int e = 0; e < E; e++) { const int d = lane + 32 * e; if (d < D) s += qv[e] * static_cast<float>(k[at + d]); }\n"
	"  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffff, s, off);\n"
	"  const float mn = fmaxf(m, s), c = expf(m - mn), p = expf(s - mn);\n"
	"  l = l * c + p;\n"
	"  for (int e = 0; e < E; e++) { const int d = lane + 32 * e; if (d < D) acc[e] = acc[e] * c + p * static_cast<float>(v[at + d]); }\n"
	"  m = mn;\n"
	"}\n"
	"for (int e = 0; e < E; e++) { const int d = lane + 32 * e; if (d < D) out[(size_t)bh * D + d] = static_cast<OutT>(acc[e] / l); }\n";

static mlx_fast_cuda_kernel mlxs_pooled_new(void) {
	const char* in[5] = {"q", "k", "v", "rows", "lens"};
	const char* out[1] = {"out"};
	mlx_vector_string ins = mlx_vector_string_new_data(in, 5);
	mlx_vector_string outs = mlx_vector_string_new_data(out, 1);
	mlx_fast_cuda_kernel k = mlx_fast_cuda_kernel_new("mlxs_pooled_attention", ins, outs, mlxs_pooled_src, "", true, 0);
	mlx_vector_string_free(ins);
	mlx_vector_string_free(outs);
	return k;
}

static int mlxs_pooled_apply(mlx_array* res, mlx_fast_cuda_kernel kern, mlx_array q, mlx_array k, mlx_array v,
		mlx_array rows, mlx_array lens, int b, int h, int kvh, int d, mlx_dtype dt, mlx_stream s) {
	mlx_fast_cuda_kernel_config cfg = mlx_fast_cuda_kernel_config_new();
	int shape[3] = {b, h, d};
	int rc = mlx_fast_cuda_kernel_config_add_output_arg(cfg, shape, 3, dt);
	if (rc == 0) rc = mlx_fast_cuda_kernel_config_set_grid(cfg, 32, b * h, 1);
	if (rc == 0) rc = mlx_fast_cuda_kernel_config_set_thread_group(cfg, 32, 4, 1);
	if (rc == 0) rc = mlx_fast_cuda_kernel_config_add_template_arg_dtype(cfg, "OutT", dt);
	if (rc == 0) rc = mlx_fast_cuda_kernel_config_add_template_arg_int(cfg, "H", h);
	if (rc == 0) rc = mlx_fast_cuda_kernel_config_add_template_arg_int(cfg, "KVH", kvh);
	if (rc == 0) rc = mlx_fast_cuda_kernel_config_add_template_arg_int(cfg, "D", d);
	mlx_array args[5] = {q, k, v, rows, lens};
	mlx_vector_array in = mlx_vector_array_new_data(args, 5);
	mlx_vector_array out = mlx_vector_array_new();
	if (rc == 0) rc = mlx_fast_cuda_kernel_apply(&out, kern, in, cfg, s);
	if (rc == 0) rc = mlx_vector_array_get(res, out, 0);
	mlx_vector_array_free(in);
	mlx_vector_array_free(out);
	mlx_fast_cuda_kernel_config_free(cfg);
	return rc;
}
*/
import "C"

// pooledKernel returns the CUDA decode attention kernel when the stream
// runs on a CUDA GPU, and ok false otherwise (CPU, Metal).
func pooledKernel(s C.mlx_stream) (C.mlx_fast_cuda_kernel, bool) {
	var cuda C.bool
	if C.mlx_cuda_is_available(&cuda) != 0 || !bool(cuda) {
		return C.mlx_fast_cuda_kernel{}, false
	}
	dev := C.mlx_device_new()
	defer C.mlx_device_free(dev)
	var t C.mlx_device_type
	if C.mlx_stream_get_device(&dev, s) != 0 || C.mlx_device_get_type(&t, dev) != 0 || t != C.MLX_GPU {
		return C.mlx_fast_cuda_kernel{}, false
	}
	return C.mlxs_pooled_new(), true
}

// pooled reports whether decode attention runs in the pool kernel: on a
// CUDA GPU.
func (m *model) pooled(g *graph) bool {
	return g.k.hasPooled && m.cfg.Heads%m.cfg.KVHeads == 0
}

// attendPooled is the decode feeds' attention in layer li through the
// pool kernel: queries q [B, heads, 1, D] against each sequence's pool
// rows p.decRows [B, T], the first p.decLens [B] of them. It returns
// [B, heads*D].
func (m *model) attendPooled(g *graph, li int, p *stepPlan, q arr) arr {
	c, b := m.cfg, len(p.dec)
	o := g.op("pooled_attention", func(r *arr) C.int {
		return C.mlxs_pooled_apply(r, g.k.pooled, q, m.pool.k[li], m.pool.v[li], p.decRows, p.decLens,
			C.int(b), C.int(c.Heads), C.int(c.KVHeads), C.int(c.HeadDim), m.w.dtype, g.s)
	})
	return g.reshape(o, b, c.Heads*c.HeadDim)
}
