"""Times the runtime's decode attention kernel (kernels.decode_attention)
over its launch parameters on the Llama-3.2-1B shape (32/8 heads, head
dim 64, bf16): batch 1 and 64, cache lengths 128..256, context 1024.

  attn_tune.py RUNTIME_DIR
"""
import sys

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402
import triton  # noqa: E402

from mlxsworker.torchrt import kernels  # noqa: E402

H, K, hd, ctx = 32, 8, 64, 1024
dev = torch.device("cuda")
res = {}
for B in (1, 8, 64):
    g = torch.Generator(device="cpu").manual_seed(B)
    # Four caches in turn, 4 x 2 x B x 16 MB: past the 50 MB L2 at batch 64,
    # as in the model, where the weights pass through L2 between layers.
    kvs = [(torch.randn(B + 1, K, ctx, hd, generator=g).to(dev, torch.bfloat16),
            torch.randn(B + 1, K, ctx, hd, generator=g).to(dev, torch.bfloat16)) for _ in range(4)]
    kc, vc = kvs[0]
    qkv = torch.randn(B, (H + 2 * K) * hd, generator=g).to(dev, torch.bfloat16)
    slots = torch.randperm(B, generator=g).to(dev)
    pos = torch.randint(128, 256, (B,), generator=g).to(dev)
    t = torch.arange(ctx, dtype=torch.float32)
    inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    f = torch.outer(t, inv)
    emb = torch.cat([f, f], -1)
    cos, sin = emb.cos().to(dev, torch.bfloat16), emb.sin().to(dev, torch.bfloat16)
    ref = None
    for blk in (16, 32, 64, 128):
        for w in (1, 2, 4):
            for st in (2, 3, 4):
                kernels.ATTN_CONFIG = (blk, w, st)
                try:
                    out = kernels.decode_attention(qkv, kc, vc, slots, pos, cos, sin, H, K)
                    if ref is None:
                        ref = out.float()
                    err = (out.float() - ref).abs().max().item()
                    ms = triton.testing.do_bench_cudagraph(
                        lambda: [kernels.decode_attention(qkv, a, b, slots, pos, cos, sin, H, K) for a, b in kvs],
                        rep=50, return_mode="median") / len(kvs)
                except Exception as e:  # a configuration Triton refuses
                    print("B %d block %d warps %d stages %d: %s" % (B, blk, w, st, str(e)[:80]))
                    continue
                res[(B, blk, w, st)] = ms
                print("B %2d block %3d warps %d stages %d: %7.2f us  (max diff %.3g)" % (B, blk, w, st, ms * 1e3, err))
for B in (1, 8, 64):
    best = sorted((v, k) for k, v in res.items() if k[0] == B)[:3]
    print("best at batch %d:" % B, ", ".join("block %d warps %d stages %d %.2f us" % (k[1], k[2], k[3], v * 1e3) for v, k in best))
