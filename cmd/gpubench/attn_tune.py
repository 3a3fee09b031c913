"""Times the runtime's decode attention kernel (kernels.decode_attention,
paged: block tables into a pool of 16-position blocks) over its launch
parameters: the 1B shape (32/8 heads, head dim 64) and the 8B's (head dim
128), bf16, batches 1, 8 and 64 at cache lengths 128..256, under a context
of 1,024 (one program a KV head) and of 131,072 (the cache split along
the sequence, then combined: kernels.splits). Each configuration is
checked against the first one's output.

  attn_tune.py RUNTIME_DIR [1b] [8b] [splits-1b] [splits-8b]

splits-S: today's parameters at 1 to 16 programs a KV head (the split
forced), batches 1 and 8: what splitting a short cache costs or gains.
"""
import sys

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402
import triton  # noqa: E402

from mlxsworker.torchrt import kernels  # noqa: E402

SHAPES = {"1b": (32, 8, 64), "8b": (32, 8, 128)}
BS = 16  # positions a block
dev = torch.device("cuda")


def case(B, K, hd, longest, g):
    """Four pools in turn (past L2 at batch 64, as in the model, where the
    weights pass through L2 between layers), each sequence's blocks
    scattered over its pool, and the rest of a step's inputs."""
    per = -(-(longest + 1) // BS)
    pools = []
    for _ in range(4):
        kc = torch.randn(B * per + 1, BS, K, hd, generator=g).to(dev, torch.bfloat16)
        vc = torch.randn(B * per + 1, BS, K, hd, generator=g).to(dev, torch.bfloat16)
        pools.append((kc, vc))
    table = torch.randperm(B * per, generator=g).to(torch.int32).view(B, per).to(dev)
    rows = torch.arange(B, dtype=torch.int64, device=dev)
    pos = torch.randint(128, longest, (B,), generator=g).to(dev)
    return pools, table, rows, pos


def rope_tables(ctx, hd):
    t = torch.arange(ctx, dtype=torch.float32)
    inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    f = torch.outer(t, inv)
    emb = torch.cat([f, f], -1)
    return emb.cos().to(dev, torch.bfloat16), emb.sin().to(dev, torch.bfloat16)


def timed(qkv, pools, table, rows, pos, cos, sin, H, K, ctx):
    """(output, ms a launch): decode_attention as a decode step launches
    it (early), once on the first pool, then timed in a CUDA graph over
    the four pools in turn. The new token's k and v are written at pos
    each run: the same values, so runs agree."""
    def run(kc, vc):
        return kernels.decode_attention(qkv, kc, vc, table, rows, pos, cos, sin, H, K, ctx, early=True)
    out = run(*pools[0])
    ms = triton.testing.do_bench_cudagraph(lambda: [run(kc, vc) for kc, vc in pools], rep=50,
                                           return_mode="median") / len(pools)
    return out, ms


def tune(name):
    H, K, hd = SHAPES[name]
    cos, sin = rope_tables(1024, hd)  # positions stay below 256
    res = {}
    for ctx in (1024, 131072):
        for B in (1, 8, 64):
            g = torch.Generator(device="cpu").manual_seed(B)
            pools, table, rows, pos = case(B, K, hd, 256, g)
            qkv = torch.randn(B, (H + 2 * K) * hd, generator=g).to(dev, torch.bfloat16)
            ref = None
            for blk in (32, 64, 128):
                for w in (1, 2, 4):
                    for st in (2, 3):
                        kernels.ATTN_CONFIG = (blk, w, st)
                        try:
                            out, ms = timed(qkv, pools, table, rows, pos, cos, sin, H, K, ctx)
                            if ref is None:
                                ref = out.float()
                            err = (out.float() - ref).abs().max().item()
                        except Exception as e:  # a configuration Triton refuses
                            print("%s ctx %d B %d block %d warps %d stages %d: %s"
                                  % (name, ctx, B, blk, w, st, str(e)[:80]))
                            continue
                        finally:
                            kernels.ATTN_CONFIG = None
                        flag = "  FAIL" if err > 2e-2 else ""
                        res[(ctx, B, blk, w, st)] = ms
                        print("%s ctx %6d B %2d block %3d warps %d stages %d: %7.2f us  (max diff %.3g)%s"
                              % (name, ctx, B, blk, w, st, ms * 1e3, err, flag), flush=True)
            today = kernels._attn_config(B, hd, 2)
            best = sorted((v, k) for k, v in res.items() if k[:2] == (ctx, B))[:3]
            print("%s ctx %d batch %d: today's block %d warps %d stages %d %.2f us; best %s" % (
                name, ctx, B, *today, res.get((ctx, B) + today, float("nan")) * 1e3,
                ", ".join("block %d warps %d stages %d %.2f us" % (k[2], k[3], k[4], v * 1e3) for v, k in best)))


def split_counts(name):
    """Today's launch parameters at a forced split count (kernels.splits
    patched), batches 1 and 8 at cache lengths 128..256: what splitting a
    short cache costs or gains, the combine included."""
    H, K, hd = SHAPES[name]
    cos, sin = rope_tables(1024, hd)
    today = kernels.splits
    for B in (1, 8):
        g = torch.Generator(device="cpu").manual_seed(B)
        pools, table, rows, pos = case(B, K, hd, 256, g)
        qkv = torch.randn(B, (H + 2 * K) * hd, generator=g).to(dev, torch.bfloat16)
        ref = None
        for sp in (1, 2, 4, 8, 16):
            kernels.splits = lambda batch, kv_heads, context, n=sp: n
            try:
                out, ms = timed(qkv, pools, table, rows, pos, cos, sin, H, K, 1024)
                ref = out.float() if ref is None else ref
                err = (out.float() - ref).abs().max().item()
            finally:
                kernels.splits = today
            print("%s splits B %d: %2d programs a KV head %7.2f us  (max diff %.3g)%s"
                  % (name, B, sp, ms * 1e3, err, "  FAIL" if err > 2e-2 else ""), flush=True)


for arg in sys.argv[2:] or ["1b", "8b"]:
    if arg.startswith("splits-"):
        split_counts(arg[len("splits-"):])
        continue
    tune(arg)
