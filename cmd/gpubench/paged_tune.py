"""Times the paged decode attention kernel (runtime/mlxsworker/torchrt/kernels.py) on the
Llama-3.2-1B shape (32/8 heads, head dim 64, bf16) by batch size, cache
length, block size, KV layout (token-major [blocks, block, heads, dim], as
the runtime keeps it, or head-major [blocks, heads, block, dim]), block-id
prefetch and launch parameters; with BASE_RUNTIME (a runtime of
whole-context slots) its kernel is timed too, for reference.

  paged_tune.py RUNTIME_DIR [BASE_RUNTIME_DIR]
"""
import importlib.util
import math
import sys

import torch
import triton

sys.path.insert(0, sys.argv[1])
from mlxsworker.torchrt import kernels  # noqa: E402

H, K, hd = 32, 8, 64
dev = torch.device("cuda")
ctx = 4096


def base_kernels(path):
    spec = importlib.util.spec_from_file_location("base_kernels", path + "/kernels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rope_tables():
    t = torch.arange(ctx, dtype=torch.float32)
    inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    f = torch.outer(t, inv)
    emb = torch.cat([f, f], -1)
    return emb.cos().to(dev, torch.bfloat16), emb.sin().to(dev, torch.bfloat16)


def launch(qkv, kc, vc, table, rows, pos, cos, sin, strides, bs, cfg, prefetch):
    block, warps, stages = cfg
    B = qkv.shape[0]
    out = torch.empty(B, H * hd, device=dev, dtype=qkv.dtype)
    rb = max(16, triton.next_power_of_2(H // K))
    kernels._decode_attn_kernel[(B, K, 1)](
        qkv, kc, vc, out, out, out, table, rows, pos, cos, sin,
        qkv.stride(0), table.stride(0), strides[0], strides[1], strides[2], 1.0 / math.sqrt(hd),
        H=H, K=K, REP=H // K, RB=rb, HD=hd, BS=bs, BLOCK=block, SPLIT=1, IEEE=False, PREFETCH=prefetch,
        num_warps=warps, num_stages=stages)
    return out


def bench(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3


def main():
    cos, sin = rope_tables()
    base = base_kernels(sys.argv[2]) if len(sys.argv) > 2 else None
    g = torch.Generator(device="cpu").manual_seed(0)
    for B, lo, hi in ((1, 128, 256), (64, 128, 256), (64, 1024, 1300), (256, 1024, 1300)):
        pos = torch.randint(lo, hi, (B,), generator=g).to(dev)
        qkv = torch.randn(B, (H + 2 * K) * hd, generator=g).to(dev, torch.bfloat16)
        res = []
        if base is not None:
            kc = torch.randn(B + 1, K, ctx, hd, generator=g).to(dev, torch.bfloat16)
            vc = torch.randn(B + 1, K, ctx, hd, generator=g).to(dev, torch.bfloat16)
            slots = torch.randperm(B, generator=g).to(dev)
            for cfg in ((32, 1, 3), (64, 4, 3)):
                base.ATTN_CONFIG = cfg
                us = bench(lambda: base.decode_attention(qkv, kc, vc, slots, pos, cos, sin, H, K))
                res.append((us, "slots (before) block %d warps %d stages %d" % cfg))
            del kc, vc
        for bs in (16, 32):
            nb = -(-hi // bs)
            blocks = B * nb
            table = torch.randperm(blocks, generator=g).view(B, nb).int().to(dev)
            rows = torch.arange(B, device=dev)
            for layout in ("token", "head"):
                shape = (blocks, bs, K, hd) if layout == "token" else (blocks, K, bs, hd)
                kc = torch.randn(*shape, generator=g).to(dev, torch.bfloat16)
                vc = torch.randn(*shape, generator=g).to(dev, torch.bfloat16)
                st = (kc.stride(0), kc.stride(1), kc.stride(2)) if layout == "token" else (kc.stride(0), kc.stride(2), kc.stride(1))
                for prefetch in (False, True):
                    for cfg in ((16, 1, 3), (32, 1, 3), (32, 2, 3), (64, 4, 3), (64, 2, 4), (32, 4, 2)):
                        if cfg[0] < 16:
                            continue
                        try:
                            us = bench(lambda: launch(qkv, kc, vc, table, rows, pos, cos, sin, st, bs, cfg, prefetch))
                        except Exception as e:  # a configuration Triton refuses
                            print("B %d bs %d %s: %s" % (B, bs, cfg, str(e)[:60]))
                            continue
                        res.append((us, "bs %d %s-major prefetch %d block %d warps %d stages %d" % ((bs, layout, prefetch) + cfg)))
                del kc, vc
        res.sort()
        print("batch %d, cache %d..%d: best of %d" % (B, lo, hi, len(res)))
        for us, what in res[:8]:
            print("  %7.2f us  %s" % (us, what))
        for us, what in res:
            if what.startswith("slots") or ("token-major" in what and "block 32 warps 1 stages 3" in what) or "block 64 warps 4 stages 3" in what and "token" in what:
                print("  ref %7.2f us  %s" % (us, what))
        sys.stdout.flush()


main()
