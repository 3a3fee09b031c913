"""Triton GEMMs for quantized weights (quant.py's QWeight), CUDA only.

Both read the weight in its quantized form and dequantize each tile in
registers; no step makes a float copy of a weight.

- fp8_linear: x [M, K] (bf16/fp16) times an F8_E4M3 weight [N, K] whose
  scales are per block (bn, bk): (128, 128) for the block-scaled
  checkpoints, (1, K) per channel. Each K tile lies in one block of
  scales, so its partial product is scaled once per output column.
  Weight-only: activations stay in their dtype (no activation
  quantization, so no activation scales).
- int4_linear: x times a 4-bit weight packed GPTQ-style along K (int32
  [K/8, N], input 8r + j in nibble j), with scales and zeros per group of
  g inputs ([K/g, N], the zero as a value; the scales in the file's dtype,
  float16 for GPTQ and AWQ, mostly bfloat16 for compressed-tensors, each
  converted to float32 as loaded): each tile is (q - z) * s in float32,
  rounded to x's dtype, into tl.dot. Act order's gather of x (QWeight's
  perm) is the caller's.

Decode steps have few rows (M), so a grid over output tiles alone leaves
most SMs idle; the K range is then split over programs (SPLIT_K), each
writing a float32 partial that one sum adds up (deterministic, unlike
atomics). Tile sizes are fixed by M (no autotuning, so CUDA graph capture
never meets a benchmark run).
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _fp8_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, k_per, sxm, swn, ssn, ssk,
                BN_S: tl.constexpr, BK_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    pid, pk = tl.program_id(0), tl.program_id(1)
    nn = tl.cdiv(N, BLOCK_N)
    pm, pn = pid // nn, pid % nn
    offs_m = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k0 = pk * k_per
    for kk in range(0, k_per, BLOCK_K):
        ks = k0 + kk
        offs_k = ks + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + offs_m[:, None] * sxm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        b = tl.load(w_ptr + offs_n[None, :] * swn + offs_k[:, None],
                    mask=(offs_n[None, :] < N) & (offs_k[:, None] < K), other=0.0)
        s = tl.load(s_ptr + (offs_n // BN_S) * ssn + (ks // BK_S) * ssk, mask=(offs_n < N) & (ks < K), other=0.0)
        acc += tl.dot(a, b.to(a.dtype)) * s[None, :]
    out = out_ptr + pk * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(out, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _int4_kernel(x_ptr, q_ptr, s_ptr, z_ptr, out_ptr, M, N, K, k_per, sxm,
                 G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid, pk = tl.program_id(0), tl.program_id(1)
    nn = tl.cdiv(N, BLOCK_N)
    pm, pn = pid // nn, pid % nn
    offs_m = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k0 = pk * k_per
    for kk in range(0, k_per, BLOCK_K):
        ks = k0 + kk
        offs_k = ks + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + offs_m[:, None] * sxm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        kmask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
        q = tl.load(q_ptr + (offs_k[:, None] // 8) * N + offs_n[None, :], mask=kmask, other=0)
        q = (q >> ((offs_k[:, None] % 8) * 4)) & 0xF
        g = ks // G
        nmask = (offs_n < N) & (ks < K)
        s = tl.load(s_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32)
        w = ((q.to(tl.float32) - z[None, :]) * s[None, :]).to(a.dtype)
        acc += tl.dot(a, w)
    out = out_ptr + pk * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(out, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


_sms = {}


def _plan(M, N, K, unit, device):
    """Tile sizes and the K split for an [M, K] x [K, N] product; unit: K
    per split is a multiple of it (the scale block or group)."""
    bm = 16 if M <= 16 else 32 if M <= 32 else 64
    bn = 64 if M <= 64 else 128
    tiles = -(-M // bm) * -(-N // bn)
    if device not in _sms:
        _sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
    split = 1
    if tiles < 2 * _sms[device]:
        split = max(1, min(2 * _sms[device] // tiles, K // (4 * unit)))
    k_per = -(-K // (split * unit)) * unit
    split = -(-K // k_per)
    return bm, bn, split, k_per


def _run(kernel, x, N, K, unit, bk, args, consts, stages=3):
    shape = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    bm, bn, split, k_per = _plan(M, N, K, unit, x.device)
    part = torch.empty(split, M, N, device=x.device, dtype=torch.float32)
    grid = (-(-M // bm) * -(-N // bn), split)
    kernel[grid](x2, *args, part, M, N, K, k_per, x2.stride(0), *consts[0], BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                 num_warps=4, num_stages=stages, **consts[1])
    y = part[0] if split == 1 else part.sum(0)
    return y.to(x.dtype).reshape(*shape, N)


def fp8_linear(x, w, scale, block):
    """x [..., K] @ dequant(w).T with w float8_e4m3fn [N, K] and scale
    float32 [ceil(N/bn), ceil(K/bk)] for block (bn, bk)."""
    N, K = w.shape
    bn, bk = block
    # K tiles inside one scale block: BLOCK_K divides bk, or bk spans K.
    kt = 128 if bk % 128 == 0 or bk >= K else 64 if bk % 64 == 0 else 32 if bk % 32 == 0 else 16
    unit = bk if bk < K else kt
    # A scale that spans K (per channel) is one constant for every K, so
    # the kernel compiles once for all of a model's widths.
    return _run(_fp8_kernel, x, N, K, unit, kt, (w, scale),
                ((w.stride(0), scale.stride(0), scale.stride(1)), {"BN_S": bn, "BK_S": bk if bk < K else 1 << 30}))


def int4_linear(x, qw, scales, zeros, g):
    """x [..., K] @ dequant(qw).T with qw int32 [K/8, N], scales (float16,
    bfloat16 or float32) and zeros [K/g, N]."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    # The packed tile is loaded as one int32 per weight (each word eight
    # times): K tiles of 64 and two stages keep it within shared memory.
    return _run(_int4_kernel, x, N, K, g, min(g, 64), (qw, scales, zeros), ((), {"G": g}), stages=2)


def self_check(device, dtype):
    """None when both kernels agree with the dequantized product (quant.py)
    on a small case per row count the decode and prefill paths take, else
    what failed. Also compiles the variants before any graph capture."""
    from . import quant
    gen = torch.Generator(device="cpu").manual_seed(0)
    N, K = 384, 512
    w = torch.randn(N, K, generator=gen) / K ** 0.5
    cases = []
    # FP8, per 128 block and per channel.
    s = w.abs().amax(1, keepdim=True) / quant.E4M3_MAX
    w8 = (w / s).clamp(-quant.E4M3_MAX, quant.E4M3_MAX).to(torch.float8_e4m3fn)
    cases.append(quant.QWeight("fp8", N, K, w=w8.to(device), scale=s.to(device), block=(1, K)))
    sb = torch.rand(N // 128, K // 128, generator=gen) * 0.01 + 0.001
    cases.append(quant.QWeight("fp8", N, K, w=w8.to(device), scale=sb.to(device), block=(128, 128)))
    # int4 with random nibbles, scales and zeros.
    q = torch.randint(0, 16, (K, N), generator=gen, dtype=torch.int32)
    sc = (torch.rand(K // 128, N, generator=gen) * 0.02).half()
    z = torch.randint(0, 16, (K // 128, N), generator=gen).half()
    cases.append(quant.QWeight("int4", N, K, qw=quant.pack4(q).to(device), scales=sc.to(device), zeros=z.to(device), group=128))
    # bfloat16 scales (compressed-tensors) and an act order's gather.
    perm = torch.randperm(K, generator=gen)
    cases.append(quant.QWeight("int4", N, K, qw=quant.pack4(q).to(device), scales=sc.bfloat16().to(device),
                               zeros=z.to(device), group=128, perm=perm.to(device)))
    for M in (1, 7, 33, 200):
        x = torch.randn(M, K, generator=gen).to(device=device, dtype=dtype)
        for c in cases:
            want = x.float() @ c.dequant(torch.float32).t()
            got = c.forward(x).float()
            err = (got - want).abs().max().item() / (want.abs().max().item() + 1e-6)
            if not err < 2e-2:
                return "%s %r, %d rows: relative error %.3g" % (c.kind, c.t.get("block"), M, err)
    return None
