"""The paged prompt-attention kernel (kernels.prompt_attention, which the
whole-step prompt graphs of prefill.py run) against plain float32
attention over the same pool (prefill.attention_reference), for the
shapes of the families the torch backend serves: head dims, grouped-query
ratios (1 to 8 query heads a KV head), attention scales, sliding windows
(the family's and one that bites), blocks of 16 and 32 tokens scattered
through the pool, bfloat16, float16 and float32 pools and an FP8 one.
Each case packs chunks as a server's step does: a fresh prompt, a chunk
continuing a long prefix, a chunk shorter than a tile, one of exactly a
tile. Also the load check itself (prefill.prompt_attention_ok) for each
shape.

With --bench, the kernel's device time per layer beside the piecewise
graphs' attention (two gathers of the chunks' KV and the varlen flash
call), for the 1B and 8B Llama shapes.

  python3 prompt_attention_test.py RUNTIME_DIR [--bench [--default]] [--part=K/N]

PROMPT_CONFIG=BN,BNF,WARPS,STAGES runs the cases under those launch
parameters (kernels.PROMPT_CONFIG) instead of the defaults.
--part=K/N runs only the entries of SHAPES whose index is K modulo N
(each variant is a kernel build, so N processes share the compiling, as
TestPromptAttentionCUDA runs them).

Prints "N passed, 0 failed" or raises; CUDA and Triton only. Run by
TestPromptAttentionCUDA (MLXSERVING_TEST_DEVICE=cuda).
"""
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])

import os  # noqa: E402
import types  # noqa: E402

import torch  # noqa: E402

from mlxsworker.torchrt import decoder, kernels, kvcache, prefill  # noqa: E402

# (name, heads, kv heads, head dim, scale, window)
SHAPES = [
    ("llama 3.2 1B", 32, 8, 64, None, 0),
    ("llama 3.1 8B", 32, 8, 128, None, 0),
    ("qwen3", 16, 8, 128, None, 0),
    ("mistral (sliding window)", 32, 8, 128, None, 4096),
    ("gemma 3 (local layers)", 8, 4, 256, 256 ** -0.5, 512),
    ("phi-4-mini", 24, 8, 128, None, 0),
    ("olmo 2 (no grouping)", 16, 16, 128, None, 0),
    ("the tiny test models (a window that bites)", 4, 2, 16, 0.3, 7),
    ("a window inside a tile of more tokens than a loop step", 16, 16, 64, None, 40),
]


def decoder_like(dev, dtype, H, K, hd, scale, window, kv="auto"):
    """What prompt_attention_ok reads of a decoder.Decoder."""
    cfg = types.SimpleNamespace(heads=H, kv_heads=K, head_dim=hd, windows=[window, 0])
    fmt = kvcache.KVFormat(kv, dev, dtype, [(0.5, 0.25)] * 2)
    return types.SimpleNamespace(cfg=cfg, device=dev, dtype=dtype, layers=[{}, {}], kvq=fmt, kern=kernels,
                                 custom_scale=lambda: scale)


def case(dev, dtype, H, K, hd, scale, window, bs, kv, g):
    """The kernel against the reference on one packed step; returns the
    largest difference."""
    tb = prefill.tile_tokens(H, K, hd)
    # (first packed row, tokens, position, table row)
    chunks = [(0, 300, 0, 1), (300, 70, 2500, 2), (370, tb, 40, 3), (370 + tb, 5, 700, 4)]
    n = sum(c[1] for c in chunks)
    nb = -(-(2570 + tb) // bs)
    blocks = 4 * nb + 1
    table = torch.full((5, nb), 4 * nb, dtype=torch.int32)
    table[1:] = torch.randperm(4 * nb, generator=g).to(torch.int32).view(4, nb)
    table = table.to(dev)
    fmt = kvcache.KVFormat(kv, dev, dtype, None)
    ks, vs = (0.05, 0.03) if kv == "fp8" else (1.0, 1.0)
    kc, vc = (fmt.encode(torch.randn(blocks, bs, K, hd, generator=g).to(dev, dtype), s).contiguous() for s in (ks, vs))
    q = torch.randn(n, H + K, hd, generator=g).to(dev, dtype)
    width = 64
    tiles = torch.tensor(prefill.tile_plan(chunks, tb, width), dtype=torch.int32, device=dev)
    got = torch.zeros(n, H * hd, device=dev, dtype=dtype)
    want = torch.zeros_like(got)
    kernels.prompt_attention(q, kc, vc, table, tiles, width, got, H, K, tb, scale, window, ks, vs)
    prefill.attention_reference(q, kc, vc, table, tiles, width, want, H, K, scale, window, ks, vs, fmt)
    return (got.float() - want.float()).abs().max().item()


def bench(dev):
    """Device time per layer: prompt_attention (each launch configuration
    of a sweep, "*" the default; the default alone with --default)
    against the gathers and the varlen flash call, for fresh prompts of
    1,260, 2,048 and 4,096 tokens and 512-token chunks after prefixes of
    1,024 to 8,000 tokens."""
    g = torch.Generator(device="cpu").manual_seed(3)
    cases = ((1260, 0), (2048, 0), (4096, 0), (512, 1024), (512, 2048), (512, 4096), (512, 8000))
    sweep = [None]
    if "--default" not in sys.argv:
        sweep += [(64, bnf, 8, st) for bnf in (64, 128) for st in (2, 3)] + [(128, 128, 8, 3), (64, 256, 8, 2)]

    def timed(fn):
        for _ in range(3):
            fn()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(50):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) * 20  # us a call

    for name, H, K, hd in (("llama1b", 32, 8, 64), ("llama8b", 32, 8, 128)):
        bs, dtype = 16, torch.bfloat16
        tb = prefill.tile_tokens(H, K, hd)
        rows_out = {}
        for T, p in cases:
            nb = -(-(p + T) // bs)
            kc, vc = (torch.randn(nb + 1, bs, K, hd, generator=g).to(dev, dtype) for _ in "kv")
            table = torch.arange(nb, dtype=torch.int32).view(1, nb).repeat(2, 1).to(dev)
            q = torch.randn(T, H + K, hd, generator=g).to(dev, dtype)
            out = torch.empty(T, H * hd, device=dev, dtype=dtype)
            width = -(-T // tb) + prefill.MAX_CHUNKS
            tiles = torch.tensor(prefill.tile_plan([(0, T, p, 1)], tb, width), dtype=torch.int32, device=dev)
            rows = torch.arange(p + T, device=dev)
            cu_q = torch.tensor([0, T], dtype=torch.int32, device=dev)
            cu_k = torch.tensor([0, p + T], dtype=torch.int32, device=dev)
            qq = q[:, :H]

            def gathered():
                kk = kc.view(-1, K, hd)[rows]
                vv = vc.view(-1, K, hd)[rows]
                return decoder._flash_varlen(qq, kk, vv, cu_q, cu_k, T, p + T)
            rows_out.setdefault("gathers + varlen flash", []).append(timed(gathered))
            for cf in sweep:
                kernels.PROMPT_CONFIG = cf
                try:
                    us = timed(lambda: kernels.prompt_attention(q, kc, vc, table, tiles, width, out, H, K, tb))
                except Exception as e:  # a configuration that does not build here
                    us = float("nan")
                    print("bench %s config %s: %s" % (name, cf, str(e).splitlines()[0][:80]))
                rows_out.setdefault("paged %s" % ("*" if cf is None else "BN %d, BNF %d, %d warps, %d stages" % cf), []).append(us)
            kernels.PROMPT_CONFIG = None
        print("bench %s (us a layer): %s" % (name, ", ".join("%d after %d" % c for c in cases)))
        for label, v in rows_out.items():
            print("bench %s | %s | %s" % (name, label, " | ".join("%.1f" % x for x in v)))


def main():
    if not torch.cuda.is_available():
        raise SystemExit("prompt_attention_test.py needs CUDA")
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(1)
    passed = 0
    if os.environ.get("PROMPT_CONFIG"):  # the cases under other launch parameters (a sweep's candidate)
        kernels.PROMPT_CONFIG = tuple(int(x) for x in os.environ["PROMPT_CONFIG"].split(","))
    shapes = SHAPES
    for a in sys.argv[2:]:
        if a.startswith("--part="):
            k, n = (int(x) for x in a[len("--part="):].split("/"))
            shapes = SHAPES[k::n]
    for name, H, K, hd, scale, window in shapes:
        # Every dtype with blocks of 16; bfloat16 also with blocks of 32 and
        # an FP8 pool (each variant is a kernel build: they take the time).
        runs = [(torch.bfloat16, "auto", 16), (torch.float16, "auto", 16), (torch.float32, "auto", 16),
                (torch.bfloat16, "auto", 32), (torch.bfloat16, "fp8", 16)]
        for dtype, kv, bs in runs:
            tol = 1e-3 if dtype == torch.float32 else 3e-2
            for win in sorted({0, window}):
                err = case(dev, dtype, H, K, hd, scale, win, bs, kv, g)
                print("%s, %s, KV %s, blocks of %d, window %d: off by %.3g" % (name, dtype, kv, bs, win, err), flush=True)
                if not err <= tol:
                    raise AssertionError("%s, %s, KV %s, blocks of %d, window %d: off by %.3g"
                                         % (name, dtype, kv, bs, win, err))
                passed += 1
        if not prefill.prompt_attention_ok(decoder_like(dev, torch.bfloat16, H, K, hd, scale, window), 16):
            raise AssertionError("%s: the load check refuses the kernel" % name)
        passed += 1
    if "--bench" in sys.argv:
        bench(dev)
    print("%d passed, 0 failed" % passed)


if __name__ == "__main__":
    main()
