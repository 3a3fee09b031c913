"""The Triton kernels of the CUDA decode path (runtime/mlxsworker/torchrt/
kernels.py) against the plain torch code they replace, for the shapes of
the families the torch backend serves: head dims, grouped-query ratios,
rotated dims, attention scales, sliding windows and RMSNorm kinds, in
each serving dtype. Every case runs each kernel once on random data:
add_rms (and its sum of a mixture's k choices), silu_mul,
decode_attention (its cache split at a long context and a short one, and
unsplit; blocks of 16 and 32 tokens scattered through the pool; no
window, the family's and one that bites; gpt-oss's with a sink logit per
head, some far above and below the scores; each head of q and k
RMS-normalised inside, as the QK-norm families' decode steps run it),
rope_kv and argmax (a tie included). Then the varlen flash call with
sinks (its log-sum-exp rescaling the output, decoder._flash_varlen and
gptoss.with_sinks) against float32 attention with a sink column, in
gpt-oss's shapes: packed chunks, fresh and continuing, one-token chunks,
its window of 128 and none. At load the runtime only builds the kernels
(kernels.probe) and checks the varlen call on a few tokens
(decoder._varlen_ok); this is where their numbers are checked.

  python3 kernels_test.py RUNTIME_DIR [DTYPE...]

DTYPE (bfloat16, float16, float32; default all three) limits the cases to
those dtypes: each process builds its own kernels, so several processes
of one dtype each finish sooner than one of all (Triton's compiler, not
the GPU, takes most of the time).

Prints "N passed, 0 failed" or raises; CUDA and Triton only. Run by
TestRuntimeKernels (MLXSERVING_TEST_DEVICE=cuda).
"""
import sys

sys.path.insert(0, sys.argv[1])

import types  # noqa: E402

import torch  # noqa: E402

from mlxsworker.torchrt import decoder, kernels  # noqa: E402

# (name, heads, kv heads, head dim, rotated dims, scale, window, norm, sinks)
SHAPES = [
    ("llama 3.2 1B", 32, 8, 64, None, None, 0, "llama", False),
    ("qwen3", 16, 8, 128, None, None, 0, "llama", False),
    ("mistral (sliding window)", 32, 8, 128, None, None, 4096, "llama", False),
    ("gemma 3 (local layers, 1 + w)", 8, 4, 256, None, 256 ** -0.5, 512, "gemma", False),
    ("phi-4-mini (partial rotary)", 24, 8, 128, 96, None, 0, "llama", False),
    ("olmo 2 (one rounding)", 16, 16, 128, None, None, 0, "olmo2", False),
    ("the tiny test models (a window that bites)", 4, 2, 16, None, 0.3, 7, "llama", False),
    ("gpt-oss (sinks, window 128)", 64, 8, 64, None, None, 128, "olmo2", True),
    ("the tiny gpt_oss (sinks)", 4, 2, 64, None, None, 16, "olmo2", True),
]


def random_sinks(g, H):
    """Sink logits [H] (float32, CPU) beside the scores' spread, with the
    first far above them (the head attends to almost nothing) and the
    second far below (the sink drops out)."""
    s = torch.randn(H, generator=g) * 2
    s[0], s[1] = 20.0, -20.0
    return s


def self_check(device, dtype, heads, kv_heads, hd, rot=None, scale=None, window=0, norm="llama", sinks=False):
    """Runs each kernel once on random data against plain torch, with the
    model's rotated dims, attention scale, a sliding window (0: none),
    RMSNorm kind and sinks; returns None when they agree, else what
    differs."""
    g = torch.Generator(device="cpu").manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)
    tol = 2e-2 if dtype != torch.float32 else 1e-4
    B, ctx = 3, 4100  # long enough to split the cache
    x, d, w = rnd(B, 256), rnd(B, 256), rnd(256)
    xo, y = kernels.add_rms(x, d, w, 1e-5, norm)
    s = (x + d).float()
    s = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5)
    rounds, off = kernels.NORMS[norm]
    ref = w * s.to(dtype) if rounds else (s * (w.float() + off)).to(dtype)
    if not torch.allclose(y.float(), ref.float(), atol=tol, rtol=tol):
        return "add_rms"
    # A mixture's 8 choices unsummed: summed in float32, rounded once.
    d8 = rnd(B, 8, 256)
    xo, y = kernels.add_rms(x, d8, w, 1e-5, norm)
    s = (x.float() + d8.float().sum(1).to(dtype).float()).to(dtype)
    if not torch.allclose(xo.float(), s.float(), atol=tol, rtol=tol):
        return "add_rms (k choices)"
    s = s.float() * torch.rsqrt(s.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    ref = w * s.to(dtype) if rounds else (s * (w.float() + off)).to(dtype)
    if not torch.allclose(y.float(), ref.float(), atol=tol, rtol=tol):
        return "add_rms (k choices), the norm"
    gu = rnd(B, 2 * 300)
    ref = torch.nn.functional.silu(gu[:, :300]) * gu[:, 300:]
    if not torch.allclose(kernels.silu_mul(gu).float(), ref.float(), atol=tol, rtol=tol):
        return "silu_mul"
    H, K = heads, kv_heads
    sink = random_sinks(g, H) if sinks else None
    for bs in (16, 32):
        for win in sorted({0, window, 7 if window else 0}):  # none, the model's, one that bites
            err = _check_attention(device, dtype, rnd, g, tol, B, ctx, bs, H, K, hd, rot or hd, scale or hd ** -0.5, win, sink)
            if err is not None:
                return err
    # Each head of q and k normalised inside the kernel (qwen3, gemma 3).
    if norm != "olmo2":
        err = _check_attention(device, dtype, rnd, g, tol, B, ctx, 16, H, K, hd, rot or hd, scale or hd ** -0.5, window, sink,
                               qkn=(rnd(hd), rnd(hd), 1e-6, norm))
        if err is not None:
            return err + " with QK norms"
    x = torch.randn(3, 50000, generator=g).to(device)
    x[1, 7] = x[1, 40000] = 1e9  # a tie: the first index wins
    if not torch.equal(kernels.argmax(x), torch.argmax(x, -1)):
        return "argmax"
    return None


def _check_attention(device, dtype, rnd, g, tol, B, ctx, bs, H, K, hd, rot, scale, window, sinks=None, qkn=None):
    """decode_attention (split and not) and rope_kv against plain torch on
    blocks of bs tokens scattered through the pool, rot of each head's dims
    rotated, q.k scaled by scale, a sliding window (0: none), sinks [H]
    (CPU float32; None: none) as one more softmax column; qkn: decode
    attention's qk_norm (q weight, k weight, eps, norm kind), each head
    normalised first as decoder.rms does (rope_kv not checked then)."""
    nb = -(-ctx // bs)
    blocks = B * nb
    kc, vc = rnd(blocks + 1, bs, K, hd), rnd(blocks + 1, bs, K, hd)
    table = torch.full((B + 1, nb), blocks, dtype=torch.int32)
    table[1:] = torch.randperm(blocks, generator=g).view(B, nb).int()
    table = table.to(device)
    qkv = rnd(B, (H + 2 * K) * hd)
    rows = torch.tensor([2, 1, 3], device=device)
    pos = torch.tensor([0, 37, 4099], device=device)
    inv = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    f = torch.outer(torch.arange(ctx, dtype=torch.float32), inv)
    emb = torch.cat([f, f], -1)
    cos, sin = torch.ones(ctx, hd), torch.zeros(ctx, hd)
    cos[:, :rot], sin[:, :rot] = emb.cos(), emb.sin()
    cos, sin = cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)

    def normed(t, w):  # [heads, hd] by decoder.rms's rounding of the kind
        if qkn is None:
            return t
        rounds, off = kernels.NORMS[qkn[3]]
        f = t.float() * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + qkn[2])
        return w * f.to(t.dtype) if rounds else (f * (w.float() + off)).to(t.dtype)

    def rope(t, p, w=None):
        t = t if w is None else normed(t, w)
        half = rot // 2
        return t * cos[p] + torch.cat([-t[..., half:rot], t[..., :half], t[..., rot:]], -1) * sin[p]

    qw, kw = (qkn[0], qkn[1]) if qkn is not None else (None, None)

    def where(b):  # (block, offset) of row b's new token
        p, r = int(pos[b]), int(rows[b])
        return int(table[r, p // bs]), p % bs

    def seq(t, b, n):  # [K, n, hd]: the first n positions of row b's sequence
        idx = table[int(rows[b]), : -(-n // bs)].long()
        return t[idx].reshape(-1, K, hd)[:n].transpose(0, 1)

    kref, vref = kc.clone(), vc.clone()
    for b in range(B):
        blk, off = where(b)
        kref[blk, off] = rope(qkv[b, H * hd : (H + K) * hd].view(K, hd), int(pos[b]), kw)
        vref[blk, off] = qkv[b, (H + K) * hd :].view(K, hd)
    # A long context (split up to 16 ways), a short one (split up to
    # kernels.SHORT_SPLITS ways) and the short one unsplit, that one with
    # the step's inputs loaded after the PDL wait (early off, as a mixed
    # step's decode rows run it).
    for context, short in ((ctx, kernels.SHORT_SPLITS), (1024, kernels.SHORT_SPLITS), (1024, 1)):
        k2, v2 = kc.clone(), vc.clone()
        keep, kernels.SHORT_SPLITS = kernels.SHORT_SPLITS, short
        try:
            out = kernels.decode_attention(qkv, k2, v2, table, rows, pos, cos, sin, H, K, context, scale, window, rot,
                                           sinks=None if sinks is None else sinks.to(device), qk_norm=qkn,
                                           early=short > 1)
        finally:
            kernels.SHORT_SPLITS = keep
        for b in range(B):
            p = int(pos[b])
            q = rope(qkv[b, : H * hd].view(H, hd), p, qw)
            first = max(0, p - window + 1) if window else 0
            kk = seq(kref, b, p + 1)[:, first:].float().repeat_interleave(H // K, 0)
            vv = seq(vref, b, p + 1)[:, first:].float().repeat_interleave(H // K, 0)
            s = torch.einsum("hd,hld->hl", q.float(), kk) * scale
            if sinks is None:
                att = torch.softmax(s, -1)
            else:  # the sink as one more column, dropped after
                att = torch.softmax(torch.cat([s, sinks.to(device).unsqueeze(1)], -1), -1)[:, :-1]
            o = torch.einsum("hl,hld->hd", att, vv).reshape(-1)
            if not torch.allclose(out[b].float(), o, atol=tol, rtol=tol):
                return "decode_attention (block %d, context %d, %d splits, row %d, max diff %.3g)" % (
                    bs, context, kernels.splits(B, K, context) if short > 1 else 1, b, (out[b].float() - o).abs().max())
        if not (torch.allclose(k2.float(), kref.float(), atol=tol, rtol=tol) and torch.equal(v2, vref)):
            return "decode_attention's KV write (block %d)" % bs
    if qkn is not None:
        return None
    k2, v2 = kc.clone(), vc.clone()
    kvrow = torch.tensor([where(b)[0] * bs + where(b)[1] for b in range(B)], device=device)
    qk = kernels.rope_kv(qkv, k2, v2, kvrow, pos, cos, sin, H, K, rot)
    for b in range(B):
        p = int(pos[b])
        blk, off = where(b)
        q = rope(qkv[b, : H * hd].view(H, hd), p)
        k = rope(qkv[b, H * hd : (H + K) * hd].view(K, hd), p)
        if not (torch.allclose(qk[b, :H].float(), q.float(), atol=tol, rtol=tol) and torch.allclose(qk[b, H:].float(), k.float(), atol=tol, rtol=tol)
                and torch.allclose(k2[blk, off].float(), k.float(), atol=tol, rtol=tol) and torch.equal(v2[blk, off], qkv[b, (H + K) * hd :].view(K, hd))):
            return "rope_kv (block %d, row %d)" % (bs, b)
    return None


def check_varlen_sinks(device, dtype):
    """The varlen flash call with gpt-oss's sinks against float32
    attention with a sink column (decoder._varlen_error); returns None
    when they agree, else what differs."""
    g = torch.Generator(device="cpu").manual_seed(1)
    sinks = random_sinks(g, 64)
    cfg = types.SimpleNamespace(heads=64, kv_heads=8, head_dim=64)
    cases = [[(37, 37), (150, 150), (20, 300)],  # fresh chunks, and one continuing a 280-token prefix
             [(1, 1), (1, 200)]]  # one-token chunks: flash regroups their heads
    for lens in cases:
        for window in (0, 128):
            err = decoder._varlen_error(device, dtype, cfg, g, lens, None, window, sinks)
            if err > 0.03:
                return "chunks %s, window %d: off by %.3g" % (lens, window, err)
    return None


def main():
    if not torch.cuda.is_available():
        raise SystemExit("kernels_test.py needs CUDA")
    dev = torch.device("cuda")
    dtypes = [getattr(torch, n) for n in sys.argv[2:]] or [torch.bfloat16, torch.float16, torch.float32]
    passed = 0
    for name, H, K, hd, rot, scale, window, norm, sinks in SHAPES:
        for dtype in dtypes:
            err = self_check(dev, dtype, H, K, hd, rot=rot, scale=scale, window=window, norm=norm, sinks=sinks)
            if err is not None:
                raise AssertionError("%s in %s: %s disagrees with plain torch" % (name, dtype, err))
            passed += 1
    for dtype in (d for d in dtypes if d != torch.float32):
        err = check_varlen_sinks(dev, dtype)
        if err is not None:
            raise AssertionError("varlen flash attention with sinks in %s: %s" % (dtype, err))
        passed += 1
    print("%d passed, 0 failed" % passed)


if __name__ == "__main__":
    main()
