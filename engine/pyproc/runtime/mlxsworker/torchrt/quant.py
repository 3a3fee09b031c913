"""Quantized checkpoints as they are published, and -quantize fp8.

Layouts (config.json's quantization_config; quant_config.scheme() parses
it and refuses what the engine cannot run, naming the field):

- quant_method "fp8" with weight_block_size [bn, bk] (Qwen3-*-FP8,
  DeepSeek-V3): weight F8_E4M3 [out, in], weight_scale_inv F32
  [ceil(out/bn), ceil(in/bk)]; w = fp8 * scale_inv per block. Without
  weight_block_size: weight_scale per tensor or per output channel.
- "compressed-tensors", format "float-quantized" (RedHatAI FP8 and
  FP8-dynamic): weight F8_E4M3, weight_scale per tensor ([1] or []),
  channel ([out, 1]) or block; activation scales are not used (see below).
- "mxfp4" (gpt_oss's experts, gpt-oss-20b/120b): gptoss.py dequantizes
  them at load; config.py then serves the model as a float one.
- "awq" (AutoAWQ, version "gemm", 4 bits, zero_point): qweight I32 [in,
  out/8] and qzeros I32 [in/g, out/8] packed in AWQ's order (nibble i of
  word c holds column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]), scales F16
  [in/g, out]; w = (q - z) * s.
- "gptq" (auto-gptq's format, 4 bits): qweight I32 [in/8, out] (nibble
  j of row r is input 8r + j), qzeros I32 [in/g, out/8] holding zero - 1
  (the "v1" format auto-gptq and most published checkpoints use; the
  zero is the stored value plus one) or, with checkpoint_format
  "gptq_v2" (GPTQModel), the zero itself; scales F16 [in/g, out], g_idx
  I32 [in]: input k's group, k // g, or scattered with desc_act (act
  order, below).
- "compressed-tensors", format "pack-quantized" (RedHatAI's W4A16,
  llm-compressor; int, 4 bits, strategy "group", weight-only):
  weight_packed I32 [out, in/8] (nibble j of word c holds input 8c + j
  as q + 8), weight_scale [out, in/g] in the model's dtype, weight_shape
  [2] ([out, in]); symmetric: the zero is 8; else weight_zero_point I32
  [ceil(out/8), in/g] packed along the output (nibble i of row r is
  output 8r + i's zero point plus 8); weight_g_idx I32 [in] with an act
  order. weight_packed transposed is GPTQ's qweight, bit for bit.

Act order (a g_idx other than k // g: GPTQ's desc_act, compressed-tensors'
actorder) puts each group's g inputs anywhere. Where the weight is
dequantized each input takes its own group's scale and zero. Where it stays
quantized its inputs are sorted by group (perm, stable) and repacked, so
the groups are contiguous as the kernel reads them, and the projection
gathers its input by perm first: W' x[perm] = W x, the same 4-bit values,
scales and zeros. q, k and v (gate and up) share one order in the files
GPTQ makes and stay fused; parts of different orders are dequantized.

Where a layout leaves a weight unquantized (embeddings, norms, lm_head,
MoE routers, anything in ignore or modules_to_not_convert) the file holds
it in float and it loads as any float weight: what is quantized is read
from the file (a weight with a scale beside it, or a qweight), not from
the config's lists.

On CPU (and where the CUDA kernels are missing or disagree with the plain
product on a check at load) every weight is dequantized at load from the
raw bytes (a 256-entry table for e4m3, shifts for int4) to the serving
dtype. On CUDA the decoder's projections (q, k, v, o, gate, up, down) stay
quantized (QWeight) and run through quant_triton: the FP8 weights through
a GEMM that converts each tile to the activations' dtype in registers and
scales it per block or channel (weight-only: activations stay bf16) or,
in products of w8a8.MMA_MIN_ROWS rows or more, as W8A8 on the FP8 tensor
cores with each row's activations quantized dynamically (w8a8.py; static
activation scales in the config are not used either way), the int4
weights through a GEMM that unpacks and dequantizes each tile in
registers. Mixture-of-experts experts and fused (Phi-3) projections load
dequantized.

-quantize fp8 (load opts "quantize": "fp8") quantizes a float checkpoint's
projections at load per output channel (scale max|row| / 448, round to
nearest even, saturating), as vLLM's --quantization fp8: on CUDA they are
then served as FP8; on CPU they are rounded to the fp8 grid and back, so
the CPU serves the numbers the GPU does.
"""
import logging
import os
import sys

import torch
import torch.nn.functional as F

from ..errors import CheckpointError
from . import tile_table
from .quant_config import parse_quantize, scheme  # noqa: F401 (quant's API: config.py and model.py call them here)

log = logging.getLogger("quant")

E4M3_MAX = 448.0
AWQ_REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)  # column j of a word is nibble AWQ_REVERSE[j]
FLOATS = (torch.float16, torch.bfloat16, torch.float32)  # the int4 scales a file may hold


# -- numbers ---------------------------------------------------------------

def e4m3_values():
    """The 256 float8 e4m3fn values by byte (bias 7, no infinities, 0x7f
    and 0xff NaN), float32."""
    b = torch.arange(256)
    e, m = (b >> 3) & 15, (b & 7).float()
    v = torch.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * torch.pow(2.0, (e - 7).float()))
    v = torch.where(b & 0x7F == 0x7F, torch.full_like(v, float("nan")), v)
    return torch.where(b & 0x80 != 0, -v, v)


def e4m3_encode(x):
    """x (float32) as float8 e4m3fn bytes (uint8), bit for bit what torch's
    conversion to float8_e4m3fn gives after clamping to ±448: the nearest
    value, ties to the even code, saturating, zero keeping its sign, NaN
    0x7f (with its sign). The CPU's FP8 KV cache (kvcache.py) and torch
    1.13, which has no float8 dtype, store these."""
    vals = e4m3_values()[:0x7F].to(x.device)  # 0, the subnormals, ..., 448; increasing
    a = x.abs().clamp(max=E4M3_MAX)
    i = torch.bucketize(a, vals).clamp(1, vals.numel() - 1)  # vals[i - 1] < a <= vals[i]
    lo, hi = vals[i - 1], vals[i]
    up = (hi - a < a - lo) | ((hi - a == a - lo) & (i % 2 == 0))
    code = torch.where(up, i, i - 1)
    code = torch.where(torch.isnan(x), torch.full_like(code, 0x7F), code)
    return (code | (torch.signbit(x).long() << 7)).to(torch.uint8)


def e4m3_round(x):
    """x (float32) rounded to the nearest e4m3 value, ties to the even
    code, saturating at ±448: what converting to fp8 and back gives."""
    return e4m3_values().to(x.device)[e4m3_encode(x).long()]


def unpack4(words, order=range(8)):
    """int32 words [..., n] to 4-bit values [..., 8n] (int32): value 8c +
    j is nibble order[j] of word c."""
    shifts = torch.tensor([4 * i for i in order], dtype=torch.int32, device=words.device)
    return ((words.unsqueeze(-1) >> shifts) & 15).flatten(-2)


def pack4(vals):
    """4-bit values [8r + j, n] to int32 words [r, n], value 8r + j in
    nibble j (GPTQ's packing along the input)."""
    v = vals.to(torch.int32).reshape(-1, 8, vals.shape[-1])
    out = torch.zeros(v.shape[0], v.shape[2], dtype=torch.int32, device=vals.device)
    for j in range(8):
        out |= v[:, j] << (4 * j)
    return out


def _expand(s, shape, block):
    """Scales [ceil(n/bn), ceil(k/bk)] to one per weight [n, k]."""
    n, k = shape
    return s.repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]


class QWeight:
    """A projection weight kept quantized (CUDA), or a float tensor to be.
    fp8: w (float8_e4m3fn [N, K]), scale (float32 [ceil(N/bn),
    ceil(K/bk)]), block (bn, bk). int4: qw (int32 [K/8, N], input 8r + j in
    nibble j of row r), scales ([K/g, N], the file's float dtype) and zeros
    ([K/g, N], float16; the zero as a value, not as stored), group g, and
    for act order either perm (int64 [K]: row i of qw is input perm[i], the
    kept form, groups contiguous) or g_idx (int64 [K]: input k's group,
    qw in input order; the form that is only dequantized)."""

    def __init__(self, kind, n, k, **t):
        self.kind, self.n, self.k, self.t = kind, n, k, t

    def nbytes(self):
        return sum(v.numel() * v.element_size() for v in self.t.values() if isinstance(v, torch.Tensor))

    def dequant(self, dtype):
        """The float weight [N, K]."""
        t = self.t
        if self.kind == "fp8":
            w = t["w"].view(torch.uint8) if t["w"].dtype != torch.uint8 else t["w"]
            table = e4m3_values().to(w.device)
            return (table[w.long()] * _expand(t["scale"], (self.n, self.k), t["block"])).to(dtype)
        q = unpack4(t["qw"].t()).t().float()  # [K, N]
        grp = t["g_idx"] if "g_idx" in t else torch.arange(self.k, device=q.device) // t["group"]
        w = ((q - t["zeros"].float()[grp]) * t["scales"].float()[grp]).t()
        if "perm" in t:  # column i is input perm[i]
            out = torch.empty_like(w)
            out[:, t["perm"]] = w
            w = out
        return w.contiguous().to(dtype)

    def forward(self, x, bias=None):
        from . import quant_triton, w8a8
        t = self.t
        if self.kind == "fp8":
            how, y = w8a8.route(self, x), None
            while how is not None and y is None:
                try:
                    y = quant_triton.fp8_w8a8(x, t["w"], t["scale"], t["block"], **how)
                except Exception as e:  # torch's and Triton's: this shape, not the layout the check passed
                    if _not_the_shape(e):
                        raise
                    w8a8.refuse(self, x, e, how)  # then cuBLAS's product where fp8_mma refused, else none
                    how = w8a8.route(self, x)
            if y is None:
                y = quant_triton.fp8_linear(x, t["w"], t["scale"], t["block"])
        else:
            if "perm" in t:  # act order: the inputs in the order qw holds them
                x = x.index_select(-1, t["perm"])
            y = quant_triton.int4_linear(x, t["qw"], t["scales"], t["zeros"], t["group"])
        return y if bias is None else y + bias


def _not_the_shape(e):
    """Whether a W8A8 product's exception says nothing about its shape,
    so that refusing the shape for good would be wrong: out of memory,
    or any error while a CUDA graph is being captured (the warm-up before
    a capture runs the same shapes, so one a product refuses is refused
    there; what fails in the capture is the capture's)."""
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def linear(x, w, bias=None, row_loop=False):
    """x @ w.T + bias for a float weight or a QWeight: the one entry point
    of the decoder's projections. row_loop: one row of a 16-bit weight
    runs the row loop (the caller's kernels run and row_loop_ok passed:
    decoder.Decoder.row_loop)."""
    if isinstance(w, torch.Tensor):
        if bias is None and row_loop:
            ops = _row_operands(x, w, row_loop)
            if ops is not None:
                from . import quant_triton
                return quant_triton.fp8_linear(x, *ops)
        return F.linear(x, w, bias)
    return w.forward(x, bias)


# One-row products of 16-bit weights run in the FP8 row loop too, with
# unit scales (quant_triton.fp8_linear), where cuBLAS's would launch
# without PDL and take SwiGLU from a kernel of its own (silu_linear), and
# the norm before them may join them (norm_linear), where row_loop_ok
# passes: MLXSERVING_ROW_LOOP=0 in the worker's environment keeps
# cuBLAS's and the norm's own kernel.
ROW_LOOP = os.environ.get("MLXSERVING_ROW_LOOP", "") != "0"
_unit = {}  # device -> the unit scale [1, 1] of a 16-bit weight in the row loop
WHOLE = (1 << 30, 1 << 30)  # one scale block over any weight: one kernel variant for every width
_row_checked = {}


def _row_operands(x, w, row_loop):
    """(weight, scale, block) of w for the one-row loop
    (quant_triton.fp8_linear) at x's rows, or None where it does not run:
    an FP8 QWeight (kept only where _kernels_ok passed), or with row_loop
    a 16-bit weight of x's dtype, at one contiguous bfloat16/float16 row
    on CUDA."""
    if x.dim() != 2 or x.shape[0] != 1 or not x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16) \
            or not x.is_contiguous():
        return None
    if isinstance(w, QWeight):
        return (w.t["w"], w.t["scale"], w.t["block"]) if w.kind == "fp8" else None
    if not row_loop or w.dtype != x.dtype or w.dim() != 2 or not w.is_contiguous():
        return None
    if w.device not in _unit:
        _unit[w.device] = torch.ones(1, 1, device=w.device)
    return w, _unit[w.device], WHOLE


def silu_linear(gu, w, row_loop=False):
    """silu(gate) * up of the packed gate and up rows gu [N, 2K] times w,
    in one launch where that runs, else None: the caller runs the two.
    It runs where the one-row loop does (_row_operands: one row on CUDA
    of an FP8 QWeight, never W8A8 there, w8a8.MMA_MIN_ROWS, or with
    row_loop of a 16-bit weight), which computes the inputs as it reads
    them, rounded as kernels.silu_mul rounds them."""
    ops = _row_operands(gu, w, row_loop)
    if ops is None:
        return None
    from . import quant_triton
    return quant_triton.fp8_linear(gu, *ops, silu=True)


def norm_linear(x, d, nw, eps, kind, w, row_loop=False):
    """(h, rms_norm(h) * nw times w) with h = x + d (x where d is None) in
    one launch where that runs, else None: the caller runs kernels.add_rms
    and the product. It runs with row_loop (row_loop_ok passed), where
    the one-row loop does (_row_operands), into products norm_fits
    takes, for the norm kinds of kernels.NORMS; the normalised row is not
    rounded to x's dtype before the product, where add_rms rounds it
    (quant_triton.fp8_norm_linear)."""
    ops = _row_operands(x, w, True) if row_loop and NORM_FUSE else None
    if ops is None or d is not None and (d.shape != x.shape or not d.is_contiguous()):
        return None
    if not norm_fits(ops[0], x.shape[-1]):
        return None
    from . import kernels, quant_triton
    if kind not in kernels.NORMS:
        return None
    return quant_triton.fp8_norm_linear(x, d, nw, eps, kernels.NORMS[kind][1], *ops)


def row_loop_ok(device, dtype):
    """Whether one-row products of 16-bit weights and norm_linear may run
    (the callers' row_loop): ROW_LOOP on, CUDA, a 16-bit dtype, and
    _row_check passed (once per device and dtype; a failure is logged
    and those products stay cuBLAS's, the norm its own kernel)."""
    if not ROW_LOOP or device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return False
    key = (str(device), dtype)
    if key not in _row_checked:
        try:
            err = _row_check(device, dtype)
        except Exception as e:  # no Triton, a kernel that cannot compile here
            err = str(e)
        if err is not None:
            log.warning("one-row loop unavailable (%s): one-row products of %s weights run cuBLAS's", err, dtype)
        _row_checked[key] = err is None
    return _row_checked[key]


def _row_check(device, dtype):
    """None when the row loop over a 16-bit weight (plain and with SwiGLU
    inside) and norm_linear (over a 16-bit and an FP8 weight) agree with
    torch's float32 products on small cases with K split, else what
    failed. Also compiles them before any graph capture. Where they pass
    and quant_triton.wide_check fails, the wide K tiles alone turn off
    (logged)."""
    from . import quant_triton
    gen = torch.Generator(device="cpu").manual_seed(1)
    N, K = 384, 512
    rnd = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    w = (rnd(N, K) / K ** 0.5).to(device=device, dtype=dtype)
    x, d, gu = (rnd(1, n).to(device=device, dtype=dtype) for n in (K, K, 2 * K))
    nw = (torch.rand(K, generator=gen) + 0.5).to(device=device, dtype=dtype)
    wf = w.float()
    g, u = gu.chunk(2, dim=-1)
    h = (x.float() + d.float()).to(dtype)
    normed = h.float() * torch.rsqrt(h.float().pow(2).mean() + 1e-5) * nw.float()
    residual, y = norm_linear(x, d, nw, 1e-5, "llama", w, True)
    if not torch.equal(residual, h):
        return "norm inside: the residual is not x + d"
    cases = [("16-bit row loop", lambda: linear(x, w, row_loop=True), x.float() @ wf.t()),
             ("16-bit SwiGLU inside", lambda: silu_linear(gu, w, True), (F.silu(g.float()).to(dtype) * u).float() @ wf.t()),
             ("norm inside, 16-bit", lambda: y, normed @ wf.t())]
    if hasattr(torch, "float8_e4m3fn"):
        s = wf.abs().amax(1, keepdim=True) / E4M3_MAX
        w8 = QWeight("fp8", N, K, w=(wf / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale=s, block=(1, K))
        cases.append(("norm inside, FP8", lambda: norm_linear(x, d, nw, 1e-5, "llama", w8, True)[1],
                      normed @ w8.dequant(torch.float32).t()))
    for what, run, want in cases:
        got = run().float()
        err = (got - want).abs().max().item() / (want.abs().max().item() + 1e-6)
        if not err < 2e-2:
            return "%s: relative error %.3g" % (what, err)
    if quant_triton.FP8_WIDE:  # the rest passed: a failure costs the wide tiles alone
        try:
            err = quant_triton.wide_check(device, dtype)
        except Exception as e:  # a wide tile that cannot compile here
            err = str(e)
        if err is not None:
            quant_triton.FP8_WIDE = False
            name, instead = _FALLBACKS[0][1:]
            log.warning("%s unavailable (%s): %s", name, err, instead)
    return None


def norm_fits(w, K):
    """Whether norm_linear puts the norm inside the one-row product of w
    (the row loop's weight, [N, K]): up to NORM_MAX_K inputs, into up to
    NORM_MAX_N outputs, or where tile_table.SHAPE_TILES holds a tile for
    the norm inside that product (measured to win there)."""
    from . import quant_triton  # the row loop runs: it imported
    N = w.shape[0]
    return K <= NORM_MAX_K or N <= NORM_MAX_N or tile_table.norm_tiled(w, N, K, quant_triton.FP8_WIDE)


# Where norm_linear runs: into any product of up to NORM_MAX_K inputs,
# and of more only into up to NORM_MAX_N outputs. Measured on an H200 at
# one token a step (gpubench, BENCHMARKS.md): the 1B shape (hidden
# 2,048, bfloat16) decodes 1.026x faster with it in qkv and gate_up; at
# the 8B shape (hidden 4,096) in both it loses (0.96x FP8, 0.97x
# bfloat16), in qkv alone (6,144 outputs; gate_up has 28,672) it gains
# 1.015x (FP8; bfloat16 1.00x). In FP8 gate_up it gains too at the
# tile tile_table.SHAPE_TILES holds for it (1.005x; it lost at the
# default tile), so a product with such an entry is fused whatever its
# width. MLXSERVING_NORM_FUSE=0 in the worker's environment turns it
# off, MLXSERVING_NORM_MAX_K and _MAX_N move the bounds (measurement:
# one binary runs each).
NORM_MAX_K = int(os.environ.get("MLXSERVING_NORM_MAX_K", "2048"))
NORM_MAX_N = int(os.environ.get("MLXSERVING_NORM_MAX_N", "8192"))
NORM_FUSE = os.environ.get("MLXSERVING_NORM_FUSE", "") != "0"


def nbytes(w):
    """Bytes a weight (tensor or QWeight) holds."""
    return w.nbytes() if isinstance(w, QWeight) else w.numel() * w.element_size()


def cat(parts, dtype):
    """The weights of parts stacked along the outputs (q, k, v; gate, up).
    QWeights concatenate when they share a layout that allows it (FP8
    blocks: every part a whole number of blocks; int4: one group size and
    one input order); otherwise each is dequantized."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts)
    a = parts[0]
    same = all(isinstance(p, QWeight) and p.kind == a.kind and p.k == a.k for p in parts)
    if same and a.kind == "fp8":
        same = all(p.t["block"] == a.t["block"] for p in parts) and (a.t["block"][0] == 1 or all(p.n % a.t["block"][0] == 0 for p in parts))
        if same:
            return QWeight("fp8", sum(p.n for p in parts), a.k, w=torch.cat([p.t["w"] for p in parts]),
                           scale=torch.cat([p.t["scale"] for p in parts]), block=a.t["block"])
    elif same and all(p.t["group"] == a.t["group"] and p.t["scales"].dtype == a.t["scales"].dtype for p in parts) and _one_order(parts):
        w = QWeight("int4", sum(p.n for p in parts), a.k, group=a.t["group"],
                    **{f: torch.cat([p.t[f] for p in parts], 1) for f in ("qw", "scales", "zeros")})
        if "perm" in a.t:
            w.t["perm"] = a.t["perm"]
        return w
    log.warning("quantized projections that do not concatenate (different layouts, act orders, "
                "or blocks cut by a projection's edge): dequantized at load")
    return torch.cat([p if isinstance(p, torch.Tensor) else p.dequant(dtype) for p in parts])


def _one_order(parts):
    """Whether int4 parts, kept quantized, read their inputs in one order:
    none gathered, or all by one perm."""
    if any("g_idx" in p.t for p in parts):
        return False
    perms = [p.t.get("perm") for p in parts]
    if all(x is None for x in perms):
        return True
    return all(x is not None and torch.equal(x, perms[0]) for x in perms)


# -- loading ---------------------------------------------------------------

class Loader:
    """Reads a checkpoint's weights (st.Checkpoint) under its Scheme (None:
    float). get returns float tensors, dequantizing quantized weights;
    linear returns the decoder's projections, kept quantized (QWeight)
    where kernels run them (CUDA, bf16/fp16 and quant_triton's check at
    load passed), else float."""

    def __init__(self, ck, sch, device, dtype, quantize=None, scaled_mm=True):
        self.ck, self.sch, self.device, self.dtype, self.quantize = ck, sch, device, dtype, quantize
        self.keep = False
        if device.type == "cuda" and (sch is not None or quantize) and dtype in (torch.bfloat16, torch.float16):
            self.keep = _kernels_ok(device, dtype)
            if self.keep and scaled_mm and (quantize == "fp8" or sch.kind == "fp8"):  # settings.fp8_scaled_mm
                from . import w8a8
                w8a8.check(device, dtype)

    def get(self, name, shape):
        w = self._quantized(name, shape, False)
        return self.ck.get(name, shape, self.device, self.dtype) if w is None else w.dequant(self.dtype)

    def linear(self, name, shape):
        w = self._quantized(name, shape, self.keep)
        if w is None and self.quantize == "fp8":
            w = self._fp8_channel(self.ck.get(name, shape, self.device, torch.float32))
            if not self.keep:  # the fp8 grid, back in float: what the GPU serves
                return w
        if w is None:
            return self.ck.get(name, shape, self.device, self.dtype)
        if self.keep and w.kind == "fp8":
            from . import w8a8
            w8a8.warm(w, self.device, self.dtype)
        return w if self.keep else w.dequant(self.dtype)

    def _fp8_channel(self, w):
        """-quantize fp8: w per output channel, scale max|row| / 448."""
        s = w.abs().amax(1, keepdim=True) / E4M3_MAX
        s = torch.where(s == 0, torch.ones_like(s), s)
        q = w / s
        if not self.keep:
            return (e4m3_round(q) * s).to(self.dtype)
        q8 = q.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)  # rounds to nearest even
        return QWeight("fp8", w.shape[0], w.shape[1], w=q8, scale=s.contiguous(), block=(1, w.shape[1]))

    def _quantized(self, name, shape, keep):
        """The QWeight of weight name (its float shape [N, K]) when the file
        stores it quantized, else None; keep: in the form the kernels run
        (act order's inputs sorted by group), else the form dequant reads
        most directly."""
        if self.sch is None or len(shape) != 2:
            return None
        ck, (n, k) = self.ck, shape
        if self.sch.kind == "int4" and self.sch.method == "compressed-tensors":
            return self._packed(name, n, k, keep) if ck.has(name + "_packed") else None
        if self.sch.kind == "int4":
            p = name[: -len("weight")] if name.endswith(".weight") else name + "."
            if not ck.has(p + "qweight"):
                return None
            return self._int4(p, n, k, keep)
        scale = next((name + s for s in ("_scale_inv", "_scale") if ck.has(name + s)), None)
        if scale is None:
            if ck.has(name) and ck.stored_dtype(name) == "F8_E4M3":
                raise CheckpointError(ck.file_of(name), "F8_E4M3 weight without weight_scale_inv or weight_scale", name)
            return None
        w = ck.raw(name, shape, self.device)
        if w.dtype != torch.uint8:
            raise CheckpointError(ck.file_of(name), "has a scale but is %s, not F8_E4M3" % ck.stored_dtype(name), name)
        if bool(((w & 0x7F) == 0x7F).any()):
            raise CheckpointError(ck.file_of(name), "F8_E4M3 weight holds NaN", name)
        s = ck.raw(scale, None, self.device).float()
        bn, bk = self.sch.block or (0, 0)
        if self.sch.block and list(s.shape) == [-(-n // bn), -(-k // bk)]:
            block = (bn, bk)
        elif not self.sch.block and list(s.shape) in ([n, 1], [n]):
            s, block = s.reshape(n, 1), (1, k)
        elif not self.sch.block and s.numel() == 1:  # per tensor: as a channel scale, so q, k and v concatenate
            s, block = s.reshape(1, 1).expand(n, 1).contiguous(), (1, k)
        else:
            raise CheckpointError(ck.file_of(scale), "scale shape %r does not fit weight [%d, %d]%s" % (
                list(s.shape), n, k, " in blocks %r" % (self.sch.block,) if self.sch.block else ""), scale)
        _finite(ck, scale, s)
        if self.keep:
            w = w.view(torch.float8_e4m3fn)
        return QWeight("fp8", n, k, w=w, scale=s, block=block)

    def _int4(self, p, n, k, keep):
        """AWQ's or GPTQ's tensors under prefix p."""
        ck, g = self.ck, self.sch.group
        if k % g or n % 8:
            raise CheckpointError(ck.file_of(p + "qweight"), "[%d, %d] is not in groups of %d inputs and 8 outputs" % (n, k, g), p + "qweight")
        awq = self.sch.method == "awq"
        qw = ck.raw(p + "qweight", (k, n // 8) if awq else (k // 8, n), self.device)
        qz = ck.raw(p + "qzeros", (k // g, n // 8), self.device)
        scales = ck.raw(p + "scales", (k // g, n), self.device)
        if qw.dtype != torch.int32 or qz.dtype != torch.int32 or scales.dtype not in FLOATS:
            raise CheckpointError(ck.file_of(p + "qweight"), "qweight and qzeros must be I32 and scales float", p + "qweight")
        _finite(ck, p + "scales", scales)
        if awq:
            return self._int4_weight(n, k, pack4(unpack4(qw, AWQ_REVERSE)), scales, unpack4(qz, AWQ_REVERSE), None, keep)
        zeros = unpack4(qz) + self.sch.zero_offset
        return self._int4_weight(n, k, qw, scales, zeros, self._g_idx(p + "g_idx", k), keep)

    def _packed(self, name, n, k, keep):
        """compressed-tensors' pack-quantized tensors of weight name."""
        ck, g = self.ck, self.sch.group
        if k % g:
            raise CheckpointError(ck.file_of(name + "_packed"), "[%d, %d] is not in groups of %d inputs" % (n, k, g), name + "_packed")
        qw = ck.raw(name + "_packed", (n, k // 8), self.device)
        scales = ck.raw(name + "_scale", (n, k // g), self.device)
        if qw.dtype != torch.int32 or scales.dtype not in FLOATS:
            raise CheckpointError(ck.file_of(name + "_packed"), "weight_packed must be I32 and weight_scale float", name + "_packed")
        if ck.has(name + "_shape"):
            shape = ck.raw(name + "_shape", (2,), "cpu")
            if shape.dtype not in (torch.int64, torch.int32) or shape.tolist() != [n, k]:
                raise CheckpointError(ck.file_of(name + "_shape"), "%s %r: want [%d, %d]" % (
                    ck.stored_dtype(name + "_shape"), shape.tolist(), n, k), name + "_shape")
        _finite(ck, name + "_scale", scales)
        if self.sch.asym:  # zero points packed along the output, stored plus 8 as the values are
            zp = ck.raw(name + "_zero_point", (-(-n // 8), k // g), self.device)
            if zp.dtype != torch.int32:
                raise CheckpointError(ck.file_of(name + "_zero_point"), "weight_zero_point must be I32", name + "_zero_point")
            zeros = unpack4(zp.t())[:, :n]
        else:
            zeros = torch.full((k // g, n), 8, dtype=torch.int32, device=self.device)
        # weight_packed [N, K/8] transposed is GPTQ's qweight: input 8c + j in nibble j of row c.
        return self._int4_weight(n, k, qw.t().contiguous(), scales.t().contiguous(), zeros, self._g_idx(name + "_g_idx", k), keep)

    def _g_idx(self, name, k):
        """Tensor name, each input's group, when the file has it and it is
        not input // group (act order), else None. Refused: a group past
        the last, or a group of other than group-size inputs."""
        ck, g = self.ck, self.sch.group
        if not ck.has(name):
            return None
        gi = ck.raw(name, (k,), self.device)
        if gi.dtype not in (torch.int32, torch.int64):
            raise CheckpointError(ck.file_of(name), "%s: want I32" % ck.stored_dtype(name), name)
        gi, ng = gi.long(), k // g
        if bool(((gi < 0) | (gi >= ng)).any()):
            bad = int(((gi < 0) | (gi >= ng)).nonzero()[0])
            raise CheckpointError(ck.file_of(name), "g_idx[%d] = %d: want a group below %d" % (bad, int(gi[bad]), ng), name)
        if torch.equal(gi, torch.arange(k, device=gi.device) // g):
            return None
        counts = torch.bincount(gi, minlength=ng)
        if bool((counts != g).any()):
            bad = int((counts != g).nonzero()[0])
            raise CheckpointError(ck.file_of(name), "g_idx puts %d inputs in group %d: want %d" % (int(counts[bad]), bad, g), name)
        return gi

    def _int4_weight(self, n, k, qw, scales, zeros, g_idx, keep):
        """The int4 QWeight of qw [K/8, N], scales and zeros [K/g, N] (zeros
        as values) and g_idx (None: groups in input order); keep: act
        order's inputs sorted by group and repacked, with perm."""
        t = {"qw": qw.contiguous(), "scales": scales, "zeros": zeros.half(), "group": self.sch.group}
        if g_idx is not None and keep:
            perm = torch.sort(g_idx, stable=True).indices
            t["qw"], t["perm"] = pack4(unpack4(qw.t()).t()[perm]), perm
        elif g_idx is not None:
            t["g_idx"] = g_idx
        return QWeight("int4", n, k, **t)


def _finite(ck, name, s):
    if not bool(torch.isfinite(s).all()) or bool((s < 0).any()):
        raise CheckpointError(ck.file_of(name), "scale holds NaN, infinite or negative values", name)


_checked = {}


def _self_check(device, dtype):
    """quant_triton.self_check's verdict, or what raised (no Triton, no
    float8 dtype, a kernel that cannot compile here)."""
    try:
        from . import quant_triton
        return quant_triton.self_check(device, dtype)
    except Exception as e:
        return str(e)


# quant_triton's switches _kernels_ok turns off, newest first, and what
# it logs: (what is unavailable, what runs instead).
_FALLBACKS = (("FP8_WIDE", "wide row-loop K tiles", "one-row products read K tiles within one scale block"),
              ("INT4_H2", "packed int4 row loop", "one-row int4 products run the unpacked row loop"),
              ("INT4_FAST", "fast int4 kernels", "int4 weights run the previous kernels"))


def _kernels_ok(device, dtype):
    """Whether quant_triton runs here and agrees with the dequantized
    product (once per device and dtype). Where it does not, _FALLBACKS'
    switches turn off, newest first and one more at a time, until the
    check passes; then each but the last goes back on where the check
    still passes without it, so only the switches it needs stay off
    (logged). Where none cures it, every switch is restored."""
    key = (str(device), dtype)
    if key not in _checked:
        err = first = _self_check(device, dtype)
        quant_triton = sys.modules.get(__package__ + ".quant_triton")  # None: it did not import
        off, why = [], {}  # the switches turned off, and the failure each was turned off for
        for flag, _, _ in _FALLBACKS if err is not None and quant_triton is not None else ():
            if not getattr(quant_triton, flag) or flag.startswith("INT4") and not quant_triton.INT4_FAST:
                continue
            setattr(quant_triton, flag, False)
            off.append(flag)
            why[flag] = err
            err = _self_check(device, dtype)
            if err is None:
                break
        for flag in off[:-1] if err is None else off:
            setattr(quant_triton, flag, True)
            if err is None and _self_check(device, dtype) is not None:
                setattr(quant_triton, flag, False)
        for flag, name, instead in _FALLBACKS if err is None else ():
            if flag in off and not getattr(quant_triton, flag):
                log.warning("%s unavailable (%s): %s", name, why[flag], instead)
        if err is not None:
            log.warning("quantized kernels unavailable (%s): quantized weights are dequantized at load", first)
        _checked[key] = err is None
    return _checked[key]
