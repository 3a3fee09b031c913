"""Triton kernels for a sparse layer's experts on CUDA (moe.py): a fused
mixture-of-experts in the manner of vLLM's fused_moe, for the SiLU-gated
families without expert biases (qwen3_moe, mixtral).

moe.align sorts the step's (token, choice) pairs by expert into rows
padded to whole blocks of BM per expert, on the device (no host sync, so
CUDA graphs capture it); rows[r] is the pair in padded row r (P, the
pair count, for padding), block_expert[b] the expert of block b (E past
the blocks in use). Two kernels then run the layer, whatever the number
of experts a step touches:

- gate_up: out[r, cols] = silu(x[tok] @ Wg[e]^T) * (x[tok] @ Wu[e]^T)
  for the rows r of each block, tok = rows[r] // k, the input rows
  gathered in the kernel. Grid (blocks, column tiles of the expert
  width).
- down: ys[pair, cols] = (out[r] @ Wd[e]^T) * weight[pair], written at
  the pair's own row (token-major order), so the caller's sum over the k
  choices of a token is moe.py's fixed-order sum. Grid (blocks, column
  tiles of the hidden size).

A block's programs read its expert's weights once, so a step reads the
experts it touches and no other (a decode step of one token reads 8 of
Qwen3-30B-A3B's 128); a block past the blocks in use returns at once.
The grid depends on the pair count only (moe.max_blocks), so one CUDA
graph per batch bucket covers any routing.

Rounding follows moe.py's grouped path: each product accumulated in
float32 and rounded to the weights' dtype, silu(gate) in float32 rounded
before the product with up (kernels.silu_mul), the routing weight's
product rounded. float32 weights multiply in IEEE float32 (no TF32).

Imported only where torch runs on CUDA and Triton imports; moe.Experts
checks the kernels against the loop at load and falls back to the
grouped GEMM or the loop where they fail or disagree.
"""
import torch
import triton
import triton.language as tl


# P changes with the step; specialized on it, a step of an odd pair count
# would compile the kernels again mid-serving.
@triton.jit(do_not_specialize=["P"])
def _gate_up_kernel(x_ptr, w_ptr, rows_ptr, bexp_ptr, out_ptr, P, E, K, INTER, sx, swe, swn, so,
                    TOPK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    b = tl.program_id(0)
    e = tl.load(bexp_ptr + b)
    if e >= E:
        return
    r = b * BM + tl.arange(0, BM)
    pair = tl.load(rows_ptr + r)
    live = pair < P
    tok = pair // TOPK
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    cm = cols < INTER
    wbase = w_ptr + e.to(tl.int64) * swe
    accg = tl.zeros((BM, BN), dtype=tl.float32)
    accu = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        km = ks < K
        a = tl.load(x_ptr + tok[:, None].to(tl.int64) * sx + ks[None, :], mask=live[:, None] & km[None, :], other=0.0)
        wg = tl.load(wbase + cols[None, :] * swn + ks[:, None], mask=cm[None, :] & km[:, None], other=0.0)
        wu = tl.load(wbase + (cols[None, :] + INTER) * swn + ks[:, None], mask=cm[None, :] & km[:, None], other=0.0)
        accg += tl.dot(a, wg, input_precision=PREC)
        accu += tl.dot(a, wu, input_precision=PREC)
    dt = out_ptr.dtype.element_ty
    g = accg.to(dt).to(tl.float32)
    u = accu.to(dt).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    tl.store(out_ptr + r[:, None].to(tl.int64) * so + cols[None, :], (s * u).to(dt), mask=live[:, None] & cm[None, :])


@triton.jit(do_not_specialize=["P"])
def _down_kernel(a_ptr, w_ptr, rows_ptr, bexp_ptr, wt_ptr, y_ptr, P, E, K, N, sa, swe, swn, sy,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    b = tl.program_id(0)
    e = tl.load(bexp_ptr + b)
    if e >= E:
        return
    r = b * BM + tl.arange(0, BM)
    pair = tl.load(rows_ptr + r)
    live = pair < P
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    cm = cols < N
    wbase = w_ptr + e.to(tl.int64) * swe
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        km = ks < K
        a = tl.load(a_ptr + r[:, None].to(tl.int64) * sa + ks[None, :], mask=live[:, None] & km[None, :], other=0.0)
        w = tl.load(wbase + cols[None, :] * swn + ks[:, None], mask=cm[None, :] & km[:, None], other=0.0)
        acc += tl.dot(a, w, input_precision=PREC)
    dt = y_ptr.dtype.element_ty
    wt = tl.load(wt_ptr + pair, mask=live, other=0.0).to(tl.float32)
    y = (acc.to(dt).to(tl.float32) * wt[:, None]).to(dt)
    tl.store(y_ptr + pair[:, None].to(tl.int64) * sy + cols[None, :], y, mask=live[:, None] & cm[None, :])


def experts(h, gu_w, down_w, rows, bexp, weights, k, tiles):
    """The k choices' outputs of every token of h [N, hidden]:
    [N * k, hidden], pair p = token * k + choice at row p, each already
    times its routing weight (weights [N * k], h's dtype). gu_w [E, 2 *
    inter, hidden] (gate rows then up rows), down_w [E, hidden, inter];
    rows and bexp from moe.align with blocks of tiles' BM (moe.tiles:
    BM, BN, BK, warps, stages)."""
    n, hidden = h.shape
    E, inter = gu_w.shape[0], gu_w.shape[1] // 2
    P = n * k
    BM, BN, BK, warps, stages = tiles
    prec = "tf32"  # for half types unused
    if h.dtype == torch.float32:  # twice the bytes a tile: half the depth, two stages, in shared memory
        prec, BK, stages = "ieee", BK // 2, min(stages, 2)
    nb = bexp.numel()
    out = torch.empty(rows.numel(), inter, device=h.device, dtype=h.dtype)
    ys = torch.empty(P, hidden, device=h.device, dtype=h.dtype)
    if P == 0:
        return ys
    _gate_up_kernel[(nb, triton.cdiv(inter, BN))](h, gu_w, rows, bexp, out, P, E, hidden, inter,
                                                  h.stride(0), gu_w.stride(0), gu_w.stride(1), out.stride(0),
                                                  TOPK=k, BM=BM, BN=BN, BK=BK, PREC=prec, num_warps=warps, num_stages=stages)
    _down_kernel[(nb, triton.cdiv(hidden, BN))](out, down_w, rows, bexp, weights, ys, P, E, inter, hidden,
                                                out.stride(0), down_w.stride(0), down_w.stride(1), ys.stride(0),
                                                BM=BM, BN=BN, BK=BK, PREC=prec, num_warps=warps, num_stages=stages)
    return ys


# A decode step's routing in two kernels where torch takes about 30 small
# ones (softmax, top-k, the sort by expert and its index arithmetic): at
# one token those launches, not the 8 experts' weights, were most of a
# sparse layer's time (108 µs against 18 µs of weights on an H200).
ALIGN_MAX_PAIRS = 1024  # align's one-pass limit (moe.tiles' decode blocks up to it)


@triton.jit
def _route_kernel(logit_ptr, w_ptr, idx_ptr, E, sl, TOPK: tl.constexpr, EP: tl.constexpr, RENORM: tl.constexpr):
    # One token: softmax over its experts in float32, the top k (the
    # first index of equal values first), renormalised where asked.
    t = tl.program_id(0)
    i = tl.arange(0, EP)
    x = tl.load(logit_ptr + t.to(tl.int64) * sl + i, mask=i < E, other=float("-inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    ex = tl.where(i < E, tl.exp(x), 0.0)
    p = tl.where(i < E, ex / tl.sum(ex, axis=0), -2.0)  # below every probability, and the -1 of one taken
    jj = tl.arange(0, TOPK)
    vals = tl.zeros((TOPK,), dtype=tl.float32)
    idxs = tl.zeros((TOPK,), dtype=tl.int64)
    for j in tl.static_range(TOPK):
        m = tl.max(p, axis=0)
        # An expert that exists always: NaN logits match no maximum (the
        # last expert then; the token's NaN rows carry into its output).
        a = tl.minimum(tl.min(tl.where(p == m, i, EP), axis=0), E - 1)
        vals = tl.where(jj == j, m, vals)
        idxs = tl.where(jj == j, a.to(tl.int64), idxs)
        p = tl.where(i == a, -1.0, p)
    if RENORM:
        vals = vals / tl.sum(vals, axis=0)
    tl.store(w_ptr + t * TOPK + jj, vals)
    tl.store(idx_ptr + t * TOPK + jj, idxs)


def route(logits, k, renorm):
    """(weights [N, k] float32, experts [N, k] int64) of router logits [N,
    E], as moe.Experts.route's torch code takes them (softmax in float32,
    top k, renormalised to sum 1 where renorm); k a power of two."""
    n, E = logits.shape
    w = torch.empty(n, k, device=logits.device, dtype=torch.float32)
    idx = torch.empty(n, k, device=logits.device, dtype=torch.int64)
    if n:
        _route_kernel[(n,)](logits, w, idx, E, logits.stride(0), TOPK=k, EP=triton.next_power_of_2(E), RENORM=renorm, num_warps=1)
    return w, idx


@triton.jit(do_not_specialize=["P", "NB"])
def _align_kernel(flat_ptr, rows_ptr, bexp_ptr, P, E, NB, BM: tl.constexpr, PP: tl.constexpr, EB: tl.constexpr):
    # Program e: every program counts every expert's pairs (a histogram
    # of P <= PP values), then writes expert e's padded run of rows and
    # its blocks' expert; program 0 also the padding blocks past the runs.
    e = tl.program_id(0)
    i = tl.arange(0, PP)
    f = tl.load(flat_ptr + i, mask=i < P, other=E).to(tl.int32)  # E: a bin past the experts
    counts = tl.histogram(f, EB)
    b = tl.arange(0, EB)
    padded = tl.where(b < E, (counts + BM - 1) // BM * BM, 0)
    start = tl.sum(tl.where(b < e, padded, 0), axis=0)
    mine = tl.sum(tl.where(b == e, counts, 0), axis=0)
    run = tl.sum(tl.where(b == e, padded, 0), axis=0)
    sel = f == e
    rank = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    tl.store(rows_ptr + start + rank, i, mask=sel)
    r = tl.arange(0, BM)
    tl.store(rows_ptr + start + mine + r, tl.zeros((BM,), tl.int32) + P, mask=r < run - mine)
    for j in range(0, run // BM):
        tl.store(bexp_ptr + start // BM + j, e)
    if e == 0:
        used = tl.sum(padded, axis=0) // BM
        for blk in range(used, NB):
            tl.store(rows_ptr + blk * BM + r, tl.zeros((BM,), tl.int32) + P)
            tl.store(bexp_ptr + blk, E)


def align(flat, experts, BM, nb):
    """moe.align's (rows, block_expert) in one kernel, for at most
    ALIGN_MAX_PAIRS pairs; nb is moe.max_blocks. The kernel compiles once
    for each power of two of pairs (PP): moe.Experts builds them all at
    load."""
    P = flat.numel()
    rows = torch.empty(nb * BM, device=flat.device, dtype=torch.int32)
    bexp = torch.empty(nb, device=flat.device, dtype=torch.int32)
    _align_kernel[(experts,)](flat, rows, bexp, P, experts, nb, BM=BM, PP=triton.next_power_of_2(max(P, 16)),
                              EB=triton.next_power_of_2(experts + 1), num_warps=4)
    return rows, bexp

