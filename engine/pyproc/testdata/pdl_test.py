"""Programmatic dependent launch (torchrt/pdl.py) leaves every result of
the decode path's kernels as it was. A chain of layers as a decode step
runs them (add_rms, the FP8 row loop, silu_mul,
int4's row loop; fp8_mma at 16 rows, and behind act_quant at 32; the
paged decode attention and its combine) is captured in one CUDA graph
with PDL and in one without, and both are replayed on fresh inputs: the
outputs must agree bit for bit on every replay. A kernel that read its
input before the kernel writing it had completed (a wait missing or too
late) would read the previous replay's values, and so differ.

  python3 pdl_test.py RUNTIME_DIR [--bench]

--bench also times one replay of the chain with PDL off, on with
releases only at exit (MLXSERVING_PDL=exit) and on, alternating, at 1
and 64 rows, and prints the microseconds each saves a kernel boundary.

Prints "N passed, 0 failed" or raises; sm_90 or later (PDL), CUDA and
Triton only. Run by TestPDLCUDA (MLXSERVING_TEST_DEVICE=cuda).
"""
import sys

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

from mlxsworker.torchrt import kernels, pdl, quant, quant_triton  # noqa: E402

HIDDEN, INTER, LAYERS = 2048, 4096, 4
HEADS, KV_HEADS, HD, BS, CONTEXT = 16, 4, 128, 16, 8192


def fp8_weight(gen, n, k, dev):
    w = (torch.randn(n, k, generator=gen) * 8).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(n // 128, k // 128, generator=gen) * 0.002 + 0.0005
    return w.to(dev), s.to(dev)


def int4_weight(gen, n, k, dev):
    q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
    s = (torch.rand(k // 128, n, generator=gen) * 0.004).half()
    z = torch.randint(0, 16, (k // 128, n), generator=gen).half()
    return quant.pack4(q).to(dev), s.to(dev), z.to(dev)


class Chain:
    """LAYERS layers of a decode step's kernels on rows rows, each taking
    its input from the kernel before: add_rms, qkv (FP8), attention over
    a paged cache, o (int4), add_rms, gate_up (FP8), silu_mul, down
    (int4); fp8 routes through fp8_mma where rows > 1."""

    def __init__(self, rows, dev):
        gen = torch.Generator().manual_seed(rows)
        self.rows, self.dev = rows, dev
        qkv = (HEADS + 2 * KV_HEADS) * HD
        self.layers = []
        for _ in range(LAYERS):
            self.layers.append({
                "ln1": (torch.rand(HIDDEN, generator=gen) + 0.5).bfloat16().to(dev),
                "ln2": (torch.rand(HIDDEN, generator=gen) + 0.5).bfloat16().to(dev),
                "qkv": fp8_weight(gen, qkv, HIDDEN, dev),
                "o": int4_weight(gen, HIDDEN, HEADS * HD, dev),
                "gate_up": fp8_weight(gen, 2 * INTER, HIDDEN, dev),
                "down": int4_weight(gen, HIDDEN, INTER, dev),
            })
        blocks = rows * CONTEXT // BS
        self.kc = [torch.zeros(blocks, BS, KV_HEADS, HD, dtype=torch.bfloat16, device=dev) for _ in range(LAYERS)]
        self.vc = [torch.zeros_like(c) for c in self.kc]
        self.table = torch.arange(blocks, dtype=torch.int32, device=dev).view(rows, -1)
        self.trows = torch.arange(rows, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(rows, dtype=torch.int64, device=dev)
        ang = torch.arange(CONTEXT, dtype=torch.float32)[:, None] * (1e-4 ** (torch.arange(HD) % (HD // 2) / (HD // 2)))
        self.cos, self.sin = ang.cos().bfloat16().to(dev), ang.sin().bfloat16().to(dev)
        self.x = torch.zeros(rows, HIDDEN, dtype=torch.bfloat16, device=dev)

    def fp8(self, h, w):
        if self.rows == 1:
            return quant_triton.fp8_linear(h, w[0], w[1], (128, 128))
        return quant_triton.fp8_mma(h, w[0], w[1], (128, 128))

    def forward(self):
        x, d = self.x, None
        for li, L in enumerate(self.layers):
            x, h = kernels.add_rms(x, d, L["ln1"], 1e-5)
            qkv = self.fp8(h, L["qkv"])
            a = kernels.decode_attention(qkv, self.kc[li], self.vc[li], self.table, self.trows, self.pos, self.cos,
                                         self.sin, HEADS, KV_HEADS, CONTEXT, early=True)
            a = quant_triton.int4_linear(a, *L["o"], 128)
            x, h = kernels.add_rms(x, a, L["ln2"], 1e-5)
            d = quant_triton.int4_linear(kernels.silu_mul(self.fp8(h, L["gate_up"])), *L["down"], 128)
        return x + d

    def capture(self):
        """The chain as a CUDA graph under pdl's current setting, compiled
        and warmed first; returns (graph, its output)."""
        s = torch.cuda.Stream(self.dev)
        s.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(s):
            for _ in range(2):
                self.forward()
        torch.cuda.current_stream(self.dev).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = self.forward()
        return g, out


def graphs(chain, modes):
    """One graph per pdl.MODE in modes, in their order."""
    got = []
    for mode in modes:
        pdl.MODE = mode
        got.append(chain.capture())
    pdl.MODE = pdl.AUTO
    return got


def check(dev):
    passed = 0
    for rows in (1, 16, 32):
        chain = Chain(rows, dev)
        (g_off, out_off), (g_on, out_on), (g_exit, out_exit) = graphs(chain, [pdl.OFF, pdl.ON, pdl.EXIT])
        gen = torch.Generator().manual_seed(100 + rows)
        for i in range(20):
            # Fresh inputs and positions each replay: stale reads differ.
            chain.x.copy_(torch.randn(rows, HIDDEN, generator=gen).bfloat16())
            chain.pos.copy_(torch.randint(1, 600, (rows,), generator=gen))
            g_off.replay()
            want = out_off.clone()
            if not torch.isfinite(want).all():
                raise AssertionError("rows %d replay %d: the chain without PDL is not finite" % (rows, i))
            for name, g, out in (("on", g_on, out_on), ("exit", g_exit, out_exit)):
                g.replay()
                if not torch.equal(out, want):
                    diff = (out.float() - want.float()).abs().max().item()
                    raise AssertionError("rows %d replay %d: PDL %s changed the output (max diff %g)"
                                         % (rows, i, name, diff))
                passed += 1
    return passed


def bench(dev):
    names = ["off", "exit", "on"]
    for rows in (1, 64):
        chain = Chain(rows, dev)
        gs = graphs(chain, [pdl.OFF, pdl.EXIT, pdl.ON])
        times = {n: [] for n in names}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(5):
            for n, (g, _) in zip(names, gs):
                for _ in range(20):
                    g.replay()
                start.record()
                for _ in range(200):
                    g.replay()
                end.record()
                end.synchronize()
                times[n].append(start.elapsed_time(end) * 1e3 / 200)
        boundaries = LAYERS * 9
        best = {n: min(t) for n, t in times.items()}
        for n in names:
            print("chain of %d layers, %d rows, PDL %-4s: %7.1f us a replay (best of 5; all %s)"
                  % (LAYERS, rows, n, best[n], " ".join("%.1f" % t for t in times[n])))
        for n in ("exit", "on"):
            print("%d rows: PDL %s saves %.2f us a kernel boundary (%d boundaries)"
                  % (rows, n, (best["off"] - best[n]) / boundaries, boundaries))


def main():
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev)[0] < 9 or not pdl._HAS:
        raise SystemExit("PDL needs sm_90 or later and a Triton with gdc_wait")
    passed = check(dev)
    if "--bench" in sys.argv:
        bench(dev)
    print("%d passed, 0 failed" % passed)


if __name__ == "__main__":
    main()
