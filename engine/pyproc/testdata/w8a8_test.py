"""FP8 weights as W8A8 (runtime/mlxsworker/torchrt/w8a8.py;
quant_triton.act_quant and fp8_w8a8).

On the CPU:
- the activations' quantization in torch ops (w8a8.act_quant): each
  row's (or each group of 128 inputs') scale is its max / 448, floored at
  1e-12; the codes are x / scale rounded to e4m3 (quant.e4m3_round's
  nearest even, saturating); every value comes back within 2^-4 of itself
  (relative) or, below e4m3's normal range, within half its finest step;
  scales are column-major for groups; padding rows are zero; and a row
  quantizes to the same codes and scale in any batch (no scale spans
  rows);
- the routing of QWeight.forward, with quant_triton stood in by plain
  torch: products of w8a8.MIN_ROWS rows or more take fp8_w8a8 for the
  layouts w8a8.check passed (per channel; 128x128 blocks with K a
  multiple of 512), fewer rows, other layouts and W8A8 off take the
  weight-only fp8_linear; with the one-kernel product on, rows from
  MMA_MIN_ROWS to MMA_MAX_ROWS take it (K a multiple of 128), and where
  its check failed those rows go back to the above;
- quant.Loader runs w8a8.check for FP8 on CUDA only with the settings'
  fp8_scaled_mm on;
- w8a8.check: a product that agrees with the dequantized one turns its
  layout on (cuBLAS's and the one-kernel product each); one that raises or disagrees (its scales misread) leaves it
  off with a warning; block weights fall back from torch._scaled_mm to
  torch.nn.functional.scaled_mm (v2);
- the emulated W8A8 product's error against the dequantized product is
  under w8a8.TOLERANCE, and a misread scale is far above it.

With --cuda (CUDA, float8 and Triton), on the GPU:
- quant_triton.act_quant (the Triton kernel, and past ACT_QUANT_MAX the
  torch ops) against w8a8.act_quant on the same device: the same scales,
  codes at most one step apart (a division rounded otherwise);
- W8A8 products (after w8a8.check, which must pass here for both
  layouts) against the product emulated in float32 from the same codes
  (within 1e-2 of the largest output: bf16's output rounding and fp32
  sums in another order) and against the dequantized product (within
  w8a8.TOLERANCE), from 2 to 300 rows over 8B- and 4B-shaped projections
  (fp8_mma from w8a8.MMA_MIN_ROWS to MMA_MAX_ROWS, emulated with groups
  of 128 inputs; cuBLAS past it); one row the weight-only GEMM's bytes;
  fp8_mma's activations quantized in the kernel and by act_quant alike,
  and its weight read through TMA (quant_triton.FP8_TMA) and not alike;
- a row's output bitwise the same beside other rows of another value
  (batch invariance within a row count), and a product captured in a CUDA
  graph replays what runs eagerly;
- a model served on CUDA in bfloat16 (kernels and graphs) against the
  same model dequantized on the CPU in float32, fed the CUDA run's tokens:
  the same token wherever the reference's top two are not a near tie, and
  there logprobs within W8A8_LOGPROB_TOL with W8A8 on (see there), 0.1
  with it off (bfloat16's rounding, as the other bf16 CUDA checks).

  python3 w8a8_test.py RUNTIME_DIR [--cuda MODEL_DIR...]

Prints "N passed, 0 failed" or raises. Run by TestQuantW8A8 and
TestQuantW8A8CUDA.
"""
import logging
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

import mlxsworker.torchrt as torchrt  # noqa: E402
from mlxsworker.torchrt import quant, w8a8  # noqa: E402

passed = 0
FP8 = hasattr(torch, "float8_e4m3fn")


def check(cond, what):
    global passed
    if not cond:
        raise AssertionError(what)
    passed += 1


def values(q):
    """Codes (float8, or their float32 values on torch 1.13) as float32."""
    return q.float()


def dequant_acts(q, s, M):
    """The activations act_quant's codes and scales stand for, [M, K]."""
    rows, K = q.shape
    g = K // s.shape[1]
    return (values(q).reshape(rows, -1, g) * s[..., None]).reshape(rows, K)[:M]


def emulated_w8a8(x, w, scale, block, v2=False, mma=False, tma=False):
    """quant_triton.fp8_w8a8 in float32: act_quant's codes and scales
    times the dequantized weight (mma: fp8_mma's groups of 128 inputs,
    whatever the weight's scales)."""
    N, K = w.shape
    x2 = x.reshape(-1, K)
    q, s = w8a8.act_quant(x2, 128 if mma else None if block[0] == 1 else block[1])
    wd = quant.QWeight("fp8", N, K, w=w, scale=scale, block=block).dequant(torch.float32)
    return (dequant_acts(q, s, x2.shape[0]) @ wd.t()).to(x.dtype).reshape(*x.shape[:-1], N)


def fp8_weight(n, k, block, g, device="cpu"):
    """A random fp8 QWeight (codes as float8 where torch has it, else bytes)."""
    w = torch.randn(n, k, generator=g) / k ** 0.5
    if block[0] == 1:
        s = w.abs().amax(1, keepdim=True) / quant.E4M3_MAX
        full = s
    else:
        s = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=g) * 0.004 + 0.001
        full = quant._expand(s, (n, k), block)
    codes = quant.e4m3_encode(w / full)
    if FP8:
        codes = codes.view(torch.float8_e4m3fn)
    return quant.QWeight("fp8", n, k, w=codes.to(device), scale=s.to(device), block=block)


class Logged(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


# -- the activations' quantization -----------------------------------------

def check_act_quant():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 1024, generator=g) * torch.tensor([1e-3, 0.1, 1, 10, 300, 0])[:, None]
    x[2, 7] = 50.0  # one large input sets its row's scale
    q, s = w8a8.act_quant(x)
    check(list(s.shape) == [6, 1], "per row: one scale a row")
    amax = x.abs().amax(1)
    check(torch.equal(s[:, 0], (amax / 448).clamp(min=1e-12)), "per row: scale = max|row| / 448, floored at 1e-12")
    check(s[5, 0].item() == torch.tensor(1e-12).item() and bool((values(q[5]) == 0).all()), "a zero row: the floor, zero codes")
    want = quant.e4m3_round((x / s).clamp(-448, 448))
    check(torch.equal(values(q), want), "codes are x / scale rounded to e4m3 (nearest even)")
    check(bool((values(q).abs().amax(1)[:5] == 448).all()), "each row's largest input is 448")
    back = dequant_acts(q, s, 6)
    normal = x.abs() >= s * 2 ** -6  # e4m3's normal range, scaled
    rel = ((back - x).abs() / x.abs().clamp(min=1e-30))[normal]
    check(rel.max().item() <= 2 ** -4 + 1e-7, "within 2^-4 of each value, relative (%.4g)" % rel.max().item())
    check(bool(((back - x).abs() <= s * 2 ** -10 + 1e-30)[~normal].all()), "subnormals within half the finest step")

    q, s = w8a8.act_quant(x, 128, 8)
    check(list(q.shape) == [8, 1024] and list(s.shape) == [8, 8] and s.stride() == (1, 8),
          "per 128 inputs: scales [rows, K/128], column-major (_scaled_mm's 1x128 layout)")
    grp = x.reshape(6, 8, 128).abs().amax(-1)
    check(torch.equal(s[:6], (grp / 448).clamp(min=1e-12)), "per group: scale = max|group| / 448")
    check(bool((values(q[6:]) == 0).all()) and bool((s[6:] == 1e-12).all()), "padding rows: zero codes")
    for group in (None, 128):
        qa, sa = w8a8.act_quant(x, group)
        for r in range(6):
            q1, s1 = w8a8.act_quant(x[r:r + 1], group)
            if not (torch.equal(values(q1[0]), values(qa[r])) and torch.equal(s1[0], sa[r])):
                check(False, "row %d (group %s) quantizes differently alone" % (r, group))
        check(True, "every row quantizes alone as in its batch (group %s)" % group)


# -- routing ----------------------------------------------------------------

class StandIn:
    """quant_triton's FP8 entry points in plain torch, recording which ran."""

    FP8_TMA = False

    def __init__(self, product=emulated_w8a8):
        self.calls, self.product = [], product

    def fp8_linear(self, x, w, scale, block):
        self.calls.append("weight-only")
        wd = quant.QWeight("fp8", w.shape[0], w.shape[1], w=w, scale=scale, block=block).dequant(torch.float32)
        return x @ wd.t()

    def fp8_w8a8(self, x, w, scale, block, **how):
        self.calls.append(("w8a8", tuple(sorted(how))))
        return self.product(x, w, scale, block, **how)


def with_standin(stand, fn):
    real = sys.modules.get("mlxsworker.torchrt.quant_triton"), getattr(torchrt, "quant_triton", None)
    sys.modules["mlxsworker.torchrt.quant_triton"] = torchrt.quant_triton = stand
    try:
        return fn()
    finally:
        if real[0] is None:
            del sys.modules["mlxsworker.torchrt.quant_triton"]
            del torchrt.quant_triton
        else:
            sys.modules["mlxsworker.torchrt.quant_triton"], torchrt.quant_triton = real


def check_routing():
    g = torch.Generator().manual_seed(6)
    R = w8a8.MIN_ROWS
    chan, blk = fp8_weight(64, 512, (1, 512), g), fp8_weight(256, 512, (128, 128), g)
    narrow = fp8_weight(256, 384, (128, 128), g)  # K/128 = 3: its scale rows are not 16-byte multiples
    odd = fp8_weight(40, 512, (1, 512), g)  # N not a multiple of 16
    check([w8a8.fits(w) for w in (chan, blk, narrow, odd)] == ["channel", "block", None, None],
          "layouts: per channel, 128x128 blocks with K a multiple of 512, else none")
    stand = StandIn()
    dev = "cpu"

    def run(w, rows, shape=None):
        stand.calls.clear()
        x = torch.randn(*(shape or (rows, w.k)), generator=g)
        y = w.forward(x)
        check(list(y.shape) == list(x.shape[:-1]) + [w.n], "forward keeps the leading dims")
        return stand.calls[0]

    def routes():
        w8a8._on.clear()
        out = {"off": run(chan, 64)}
        w8a8._on.update({(dev, torch.float32, "channel"): {}, (dev, torch.float32, "block"): {"v2": True}})
        out.update(channel_small=run(chan, R - 1), channel=run(chan, R), block=run(blk, 64), narrow=run(narrow, 64),
                   odd=run(odd, 64), rows3d=run(chan, 0, (2, R // 2, 512)), block_small=run(blk, R - 1))
        w8a8._on[(dev, torch.float32, "channel")] = None  # its check failed
        out["failed"] = run(chan, 64)
        # fp8_mma on for both layouts: MMA_MIN_ROWS to MMA_MAX_ROWS take it
        # (the narrow K too: its groups of 128 fit), one row and more than
        # MMA_MAX_ROWS do not.
        w8a8._on[(dev, torch.float32, "channel")] = {}
        w8a8._mma.update({(dev, torch.float32, "channel"): True, (dev, torch.float32, "block"): True})
        lo, hi = w8a8.MMA_MIN_ROWS, w8a8.MMA_MAX_ROWS
        out.update(mma_one=run(chan, lo - 1), mma_lo=run(chan, lo), mma_hi=run(blk, hi), mma_past=run(blk, hi + 1),
                   mma_narrow=run(narrow, hi), mma_odd=run(odd, hi), mma_small=run(chan, R - 1))
        w8a8._mma[(dev, torch.float32, "block")] = False  # its check failed: cuBLAS's product
        out["mma_failed"] = run(blk, hi)
        w8a8._on.clear()
        w8a8._mma.clear()
        return out

    got = with_standin(stand, routes)

    # warm runs a (layout, K, N)'s products once at load, and only with
    # W8A8 on: another K or another N of a K (its own tile entries) again.
    def warmed():
        out = []
        w8a8._warmed.clear()
        for on in (False, True):
            if on:
                w8a8._on[(dev, torch.float32, "channel")] = {}
                w8a8._mma[(dev, torch.float32, "channel")] = True
            for w in (chan, chan, other_k, other_n):
                stand.calls.clear()
                w8a8.warm(w, torch.device(dev), torch.float32)
                out.append(list(stand.calls))
        w8a8._on.clear()
        w8a8._mma.clear()
        w8a8._warmed.clear()
        return out
    other_k = fp8_weight(64, 1024, (1, 1024), g)
    other_n = fp8_weight(2 * chan.n, chan.k, (1, chan.k), g)
    ws = with_standin(stand, warmed)
    check(ws[:4] == [[], [], [], []], "warm with W8A8 off runs nothing: %r" % ws[:4])
    rows = w8a8.WARM_ROWS
    want_calls = [("w8a8", ("mma",)) if w8a8.MMA_MIN_ROWS <= r <= w8a8.MMA_MAX_ROWS else ("w8a8", ()) for r in rows]
    check(ws[4] == want_calls and ws[5] == [] and ws[6] == want_calls and ws[7] == want_calls,
          "warm runs each tile class once a K and N, then nothing: %r" % ws[4:])
    mma = ("w8a8", ("mma",))
    want = {"off": "weight-only", "channel_small": "weight-only", "channel": ("w8a8", ()), "block": ("w8a8", ("v2",)),
            "narrow": "weight-only", "odd": "weight-only", "rows3d": ("w8a8", ()), "block_small": "weight-only",
            "failed": "weight-only", "mma_one": "weight-only", "mma_lo": mma, "mma_hi": mma,
            "mma_past": ("w8a8", ("v2",)), "mma_narrow": mma, "mma_odd": mma, "mma_small": mma,
            "mma_failed": ("w8a8", ("v2",))}
    for k, v in want.items():
        check(got[k] == v, "routing %s: %r, want %r" % (k, got[k], v))

    # A product whose W8A8 call raises at its own shape (the check passed
    # on another): the step gets the weight-only product, that shape stays
    # weight-only (logged once), other shapes keep W8A8.
    def refusing(x, w, scale, block, v2=False, mma=False, tma=False):
        if w.shape[0] == chan.n:
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")
        return emulated_w8a8(x, w, scale, block)
    stand2 = StandIn(refusing)
    other = fp8_weight(48, 512, (1, 512), g)
    logger, h = logging.getLogger("quant"), Logged()
    logger.addHandler(h)

    def refused():
        w8a8._on.clear()
        w8a8._refused.clear()
        w8a8._on[(dev, torch.float32, "channel")] = {}
        x = torch.randn(R, 512, generator=g)
        want = x @ chan.dequant(torch.float32).t()
        y = chan.forward(x)
        first = list(stand2.calls)
        stand2.calls.clear()
        chan.forward(x)
        again = list(stand2.calls)
        stand2.calls.clear()
        other.forward(torch.randn(R, 512, generator=g))
        out = (first, again, list(stand2.calls), torch.allclose(y, want, atol=1e-5))
        w8a8._on.clear()
        w8a8._refused.clear()
        return out
    try:
        first, again, others, same = with_standin(stand2, refused)
    finally:
        logger.removeHandler(h)
    check(first == [("w8a8", ()), "weight-only"] and same, "a refused W8A8 call falls back in the same step: %r" % first)
    check(again == ["weight-only"], "and that shape stays weight-only: %r" % again)
    check(others == [("w8a8", ())], "other shapes keep W8A8: %r" % others)
    check(sum("refused" in ln for ln in h.lines) == 1, "logged once: %r" % h.lines)

    # fp8_mma refused at a shape (a Triton error, not a RuntimeError): the
    # step takes cuBLAS's product, the shape keeps cuBLAS's product for the
    # rows it takes and the weight-only one below MIN_ROWS; cuBLAS refused
    # too: weight-only.
    def mma_refusing(x, w, scale, block, v2=False, mma=False, tma=False):
        if mma and w.shape[0] == chan.n:
            raise ValueError("triton: out of resources")
        if w.shape[0] == chan.n and x.shape[0] == 2 * R:
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")
        return emulated_w8a8(x, w, scale, block, mma=mma)
    stand3 = StandIn(mma_refusing)

    def mma_refused():
        w8a8._refused.clear()
        w8a8._on[(dev, torch.float32, "channel")] = {}
        w8a8._mma[(dev, torch.float32, "channel")] = True
        out = []
        for rows in (R, R, R // 2, 2 * R, R, 2):
            stand3.calls.clear()
            chan.forward(torch.randn(rows, 512, generator=g))
            out.append(list(stand3.calls))
        stand3.calls.clear()
        other.forward(torch.randn(R, 512, generator=g))
        out.append(list(stand3.calls))
        w8a8._on.clear()
        w8a8._mma.clear()
        w8a8._refused.clear()
        return out
    got = with_standin(stand3, mma_refused)
    cub, mma = ("w8a8", ()), ("w8a8", ("mma",))
    want = [[mma, cub], [cub], ["weight-only"], [cub, "weight-only"], ["weight-only"], ["weight-only"], [mma]]
    check(got == want, "a refused fp8_mma falls back to cuBLAS's product, then weight-only: %r" % got)


# -- the check at load -------------------------------------------------------

def check_probe():
    logger, h = logging.getLogger("quant"), Logged()
    logger.addHandler(h)

    def probe(product, stand=None):
        w8a8._on.clear()
        h.lines.clear()
        stand = stand or StandIn(product)
        with_standin(stand, lambda: w8a8.check(torch.device("cpu"), torch.float32))
        out = {k[2]: v for k, v in w8a8._on.items()}
        mma = {k[2]: v for k, v in w8a8._mma.items()}
        w8a8._on.clear()
        w8a8._mma.clear()
        return out, mma, list(h.lines), stand.calls

    got, mma, lines, calls = probe(emulated_w8a8)
    check(got == {"channel": {}, "block": {}}, "the emulated product passes for both layouts: %r" % got)
    check(mma == {"channel": True, "block": True}, "and the one-kernel product: %r" % mma)
    check(lines == [] and len(calls) == 8, "and logs nothing: %r" % lines)

    def raises(x, w, scale, block, v2=False, mma=False, tma=False):
        raise RuntimeError("torch._scaled_mm is only supported on CUDA devices with compute capability >= 9.0\nmore")
    got, mma, lines, _ = probe(raises)
    check(got == {"channel": None, "block": None} and mma == {"channel": False, "block": False},
          "a call that raises leaves both off: %r %r" % (got, mma))
    check(any("unavailable" in ln and "compute capability" in ln for ln in lines) and
          any("weight-only" in ln for ln in lines) and any("one kernel unavailable" in ln for ln in lines),
          "and says why: %r" % lines)

    def misread(x, w, scale, block, v2=False, mma=False, tma=False):  # each row scaled by the next row's scale
        N, K = w.shape
        q, s = w8a8.act_quant(x, 128 if mma else None if block[0] == 1 else block[1])
        wd = quant.QWeight("fp8", N, K, w=w, scale=scale, block=block).dequant(torch.float32)
        return dequant_acts(q, s.roll(1, 0), x.shape[0]) @ wd.t()
    got, mma, lines, _ = probe(misread)
    check(got == {"channel": None, "block": None} and mma == {"channel": False, "block": False},
          "a product that disagrees leaves both off: %r %r" % (got, mma))
    check(any("disagrees" in ln for ln in lines) and any("one kernel disagrees" in ln for ln in lines),
          "and says so: %r" % lines)

    def v2_only(x, w, scale, block, v2=False, mma=False, tma=False):
        if block[0] != 1 and not v2 and not mma:
            raise RuntimeError("Invalid scaling configuration")
        return emulated_w8a8(x, w, scale, block, mma=mma)
    got, mma, lines, calls = probe(v2_only)
    check(got == {"channel": {}, "block": {"v2": True}}, "blocks fall back to F.scaled_mm: %r" % got)
    cublas = [c for c in calls if c != ("w8a8", ("mma",))]
    check(cublas == [("w8a8", ()), ("w8a8", ()), ("w8a8", ("v2",))], "trying torch._scaled_mm first: %r" % calls)
    check(mma == {"channel": True, "block": True} and len(calls) - len(cublas) == 6,
          "the one-kernel product checked at three row counts a layout: %r" % calls)

    def mma_misread(x, w, scale, block, v2=False, mma=False, tma=False):  # only the one-kernel product reads a scale wrong
        return misread(x, w, scale, block, mma=True) if mma else emulated_w8a8(x, w, scale, block)
    got, mma, lines, _ = probe(mma_misread)
    check(got == {"channel": {}, "block": {}} and mma == {"channel": False, "block": False},
          "a one-kernel product that disagrees leaves cuBLAS's on: %r %r" % (got, mma))

    # A one-kernel product that raises with the weight's TMA loads and
    # passes without: TMA goes off, the kernel stays on.
    stand_tma = StandIn()

    def tma_raises(x, w, scale, block, v2=False, mma=False, tma=False):  # tma: the check's TMA tile
        if mma and tma:
            raise RuntimeError("TMA descriptor: box dimension\nmore")
        return emulated_w8a8(x, w, scale, block, mma=mma)
    stand_tma.product, stand_tma.FP8_TMA = tma_raises, True
    got, mma, lines, calls = probe(tma_raises, stand_tma)
    check(mma == {"channel": True, "block": True} and not stand_tma.FP8_TMA,
          "a one-kernel product that fails only with TMA keeps the kernel, TMA off: %r %r" % (mma, stand_tma.FP8_TMA))
    check(any("TMA loads are off" in ln and "box dimension" in ln for ln in lines), "and says why: %r" % lines)
    check(("w8a8", ("mma", "tma")) in calls, "the check ran a TMA tile: %r" % calls)

    # One that fails either way is off, and TMA left as it was.
    both = StandIn()
    both.product, both.FP8_TMA = misread, True
    got, mma, lines, _ = probe(misread, both)
    check(mma == {"channel": False, "block": False} and both.FP8_TMA,
          "a one-kernel product that fails with and without TMA is off, TMA as it was: %r %r" % (mma, both.FP8_TMA))
    logger.removeHandler(h)

    # The check's product emulated: its error is inside the tolerance with
    # room, and a misread scale, of the activations or of the weight (read
    # in the other order, or a row or block off), far outside.
    def transposed(x, w, scale, block, v2=False, mma=False, tma=False):  # the weight's scales read column-major
        return emulated_w8a8(x, w, scale.t().contiguous().view(scale.shape), block)

    def shifted(x, w, scale, block, v2=False, mma=False, tma=False):  # each output's scale from the next row or block
        return emulated_w8a8(x, w, scale.roll(1, 0), block)
    for layout in ("channel", "block"):
        w, x = w8a8._case(layout, torch.device("cpu"), torch.float32)
        want = x @ w.dequant(torch.float32).t()
        t = w.t
        cases = [(emulated_w8a8, 0, w8a8.TOLERANCE * 0.75)] + [(f, 2 * w8a8.TOLERANCE, 100) for f in (misread, shifted)]
        if layout == "block":
            cases.append((transposed, 2 * w8a8.TOLERANCE, 100))
        for fn, lo, hi in cases:
            err = ((fn(x, t["w"], t["scale"], t["block"]).float() - want).abs().max() / want.abs().max()).item()
            check(lo <= err < hi, "%s %s: relative error %.3g, want [%g, %g)" % (layout, fn.__name__, err, lo, hi))


def check_loader_gate():
    """quant.Loader runs the check for FP8 on CUDA (kernels on) only where
    the settings' fp8_scaled_mm is on, and never for int4 or on the CPU."""
    from mlxsworker.torchrt.quant_config import Scheme
    calls = []
    real = quant._kernels_ok, w8a8.check
    quant._kernels_ok, w8a8.check = (lambda d, t: True), (lambda d, t: calls.append((d.type, t)))
    try:
        cuda, bf16 = torch.device("cuda"), torch.bfloat16
        for sch, quantize, dev, on, want in ((Scheme("fp8", "fp8", block=(128, 128)), None, cuda, True, 1),
                                             (Scheme("fp8", "fp8", block=(128, 128)), None, cuda, False, 0),
                                             (None, "fp8", cuda, True, 1),
                                             (Scheme("int4", "gptq", group=128), None, cuda, True, 0),
                                             (Scheme("fp8", "fp8"), None, torch.device("cpu"), True, 0)):
            calls.clear()
            quant.Loader(None, sch, dev, bf16, quantize, on)
            check(len(calls) == want, "Loader %s %s on %s, fp8_scaled_mm %s: %d checks, want %d" % (
                sch and sch.kind, quantize, dev, on, len(calls), want))
    finally:
        quant._kernels_ok, w8a8.check = real


# -- CUDA ---------------------------------------------------------------------

def rel(got, want):
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def check_kernels_cuda():
    from mlxsworker.torchrt import quant_triton as qt
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(7)
    for dtype in (torch.bfloat16, torch.float16):
        for M, K, group, rows in ((16, 4096, None, None), (64, 14336, None, None), (17, 4096, 128, 20),
                                  (64, 14336, 128, 64), (5, 512, 128, 8), (3, 40960, None, None), (3, 40960, 128, 4)):
            x = (torch.randn(M, K, generator=g) * torch.rand(M, 1, generator=g) * 10).to(dev, dtype)
            x[0] = 0
            q, s = qt.act_quant(x, group, rows)
            qr, sr = w8a8.act_quant(x, group, rows)
            what = "act_quant %s [%d, %d] group %s" % (dtype, M, K, group)
            check(q.dtype == torch.float8_e4m3fn and s.shape == sr.shape and s.stride() == sr.stride(), what + ": layout")
            check(rel(s, sr) < 1e-6, what + ": scales differ by %.3g" % rel(s, sr))
            a, b = q.view(torch.uint8).long(), qr.view(torch.uint8).long()
            steps = ((a & 0x7F) - (b & 0x7F)).abs().max().item()
            check(steps <= 1 and ((a != b).float().mean().item() < 1e-3), what + ": codes %d steps apart" % steps)

    # The kernels that quantize their own output for fp8_mma (the
    # add+RMSNorm before q/k/v and gate/up, SwiGLU before down): the
    # rows as without it, and act_quant's codes and scales bit for bit.
    from mlxsworker.torchrt import kernels
    for dtype in (torch.bfloat16, torch.float16):
        for M, n, norm in ((17, 4096, "llama"), (64, 3072, "gemma"), (24, 512, "olmo2")):
            x = torch.randn(M, n, generator=g).to(dev, dtype)
            d = torch.randn(M, n, generator=g).to(dev, dtype) * 3
            w = torch.rand(n, generator=g).to(dev, dtype)
            xo, y = kernels.add_rms(x, d, w, 1e-5, norm)
            xo2, y2, q, s = kernels.add_rms(x, d, w, 1e-5, norm, quant=qt.ACT_GROUP)
            qa, sa = qt.act_quant(y2, qt.ACT_GROUP)
            what = "add_rms %s [%d, %d] %s with its codes" % (dtype, M, n, norm)
            check(torch.equal(xo, xo2) and torch.equal(y, y2), what + ": rows as without them")
            check(torch.equal(q.view(torch.uint8), qa.view(torch.uint8)) and torch.equal(s, sa), what + ": act_quant's codes")
        for M, inter in ((17, 14336), (64, 8192), (33, 1152)):
            gu = torch.randn(M, 2 * inter, generator=g).to(dev, dtype) * 4
            y = kernels.silu_mul(gu)
            y2, q, s = kernels.silu_mul(gu, quant=qt.ACT_GROUP)
            qa, sa = qt.act_quant(y2, qt.ACT_GROUP)
            what = "silu_mul %s [%d, %d] with its codes" % (dtype, M, inter)
            check(torch.equal(y, y2), what + ": rows as without them")
            check(torch.equal(q.view(torch.uint8), qa.view(torch.uint8)) and torch.equal(s, sa), what + ": act_quant's codes")

    # Products: after the check, both layouts on in bfloat16 (float16's
    # block product depends on what cuBLAS offers: checked where on).
    w8a8._on.clear()
    for dtype in (torch.bfloat16, torch.float16):
        w8a8.check(dev, dtype)
        on = {k[2]: v for k, v in w8a8._on.items() if k[1] == dtype and v is not None}
        mma = {k[2] for k, v in w8a8._mma.items() if k[1] == dtype and v}
        print("W8A8 on in %s: %r, in one kernel: %r" % (dtype, on, sorted(mma)))
        if dtype == torch.bfloat16:
            check(sorted(on) == ["block", "channel"], "bfloat16: both layouts pass their check here: %r" % on)
            check(sorted(mma) == ["block", "channel"], "and the one-kernel product: %r" % mma)
        # 2560x4096 (Qwen3-4B's o): a K split that rounds past K at 17-64 rows.
        for n, k in ((6144, 4096), (4096, 14336), (2560, 4096), (1024, 512)):
            for block in [b for b in ((1, k), (128, 128)) if ("channel" if b[0] == 1 else "block") in on]:
                w = fp8_weight(n, k, block, g, dev)
                layout = "channel" if block[0] == 1 else "block"
                for M in (w8a8.MMA_MIN_ROWS, 5, w8a8.MIN_ROWS, w8a8.MIN_ROWS + 1, 32, 64, 65, 300):
                    in_mma = layout in mma and w8a8.MMA_MIN_ROWS <= M <= w8a8.MMA_MAX_ROWS
                    if M < w8a8.MIN_ROWS and not in_mma:
                        continue
                    x = torch.randn(M, k, generator=g).to(dev, dtype)
                    got = w.forward(x)
                    t = w.t
                    emu = emulated_w8a8(x, t["w"], t["scale"], t["block"], mma=in_mma)
                    want = x.float() @ w.dequant(torch.float32).t()
                    what = "W8A8 %s [%d, %d] %r x %d rows" % (dtype, n, k, block[:1], M)
                    check(rel(got, emu) < 1e-2, what + ": %.3g from the emulated product" % rel(got, emu))
                    check(rel(got, want) < w8a8.TOLERANCE, what + ": %.3g from the dequantized" % rel(got, want))
                x = torch.randn(w8a8.MMA_MIN_ROWS - 1, k, generator=g).to(dev, dtype)
                check(torch.equal(w.forward(x), qt.fp8_linear(x, w.t["w"], w.t["scale"], w.t["block"])),
                      "below w8a8.MMA_MIN_ROWS: the weight-only GEMM")
                # The one-kernel product's two forms (the tile quantized
                # in the kernel, or by act_quant first) agree bit for bit.
                if layout in mma:
                    x = torch.randn(16, k, generator=g).to(dev, dtype)
                    a = qt.fp8_mma(x, t["w"], t["scale"], t["block"], tiles=qt.Tiles(16, 64, 4, 3, 1, swap=True))
                    b = qt.fp8_mma(x, t["w"], t["scale"], t["block"], tiles=qt.Tiles(16, 64, 4, 3, 1, swap=True, pre=True))
                    check(torch.equal(a, b), "[%d, %d] %s: fp8_mma quantizes alike in the kernel and before it" % (n, k, layout))
                    # The weight (and the codes) through TMA where this GPU
                    # has it: the same tiles, so the same sums, bit for bit,
                    # with the K split rounding past K (waves 4) and without.
                    for M, tile in ((5, qt.Tiles(16, 64, 4, 3, 4, swap=True)), (40, qt.Tiles(64, 64, 4, 3, 4, pre=True)),
                                    (64, qt.Tiles(64, 128, 4, 3, 1, pre=True))):
                        if not qt.FP8_TMA:
                            break
                        x = torch.randn(M, k, generator=g).to(dev, dtype)
                        a = qt.fp8_mma(x, t["w"], t["scale"], t["block"], tiles=tile)
                        for level in (1, 2) if tile.pre else (1,):
                            b = qt.fp8_mma(x, t["w"], t["scale"], t["block"], tiles=tile.replaced(tma=level, stages=5))
                            check(torch.equal(a, b), "[%d, %d] %s x %d rows: fp8_mma alike with TMA %d" % (
                                n, k, layout, M, level))
                # Batch invariance within a row count, and graph capture.
                x = torch.randn(64, k, generator=g).to(dev, dtype)
                y = w.forward(x)
                x2 = torch.randn(64, k, generator=g).to(dev, dtype) * 7
                x2[::3] = x[::3]
                check(torch.equal(w.forward(x2)[::3], y[::3]), "[%d, %d] %r: rows beside others of another value" % (n, k, block[:1]))
                static = x2.clone()
                gr = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    w.forward(static)
                torch.cuda.current_stream().wait_stream(s)
                with torch.cuda.graph(gr):
                    out = w.forward(static)
                static.copy_(x)
                gr.replay()
                torch.cuda.synchronize()
                check(torch.equal(out, y), "[%d, %d] %r: a captured product replays the eager one" % (n, k, block[:1]))


# How far a bfloat16 W8A8 model's logprobs may sit from the float32
# dequantized model's, and the top-two gap under which their tokens may
# differ. Measured on the CPU on this script's models and scenario, W8A8
# emulated (act_quant's values times the dequantized weights) in bfloat16
# against the plain float32 model: 0.155 (block) and 0.134 (channel) at
# most, tokens different at gaps up to 0.174; plain bfloat16 alone 0.028.
# Each activation moves by up to 2^-4 of itself, 32x bfloat16's rounding,
# over 4 layers; 0.4 leaves twice the measured room for the GPU's other
# sums and rounding flips.
W8A8_LOGPROB_TOL = 0.4


def check_model_cuda(path):
    from mlxsworker.settings import Settings
    from mlxsworker.torchrt.model import TorchModel

    def load(device, dtype, settings=None):
        return TorchModel(path, {"device": device, "dtype": dtype, "max_batch": 32}, settings)

    for settings, tol, what in ((Settings(), W8A8_LOGPROB_TOL, "W8A8"), (Settings(fp8_scaled_mm=False), 0.1, "weight-only")):
        w8a8._on.clear()
        m = load("cuda", "bfloat16", settings)
        on = [k[2] for k, v in w8a8._on.items() if v is not None]
        check(sorted(on) == (["block", "channel"] if what == "W8A8" else []), "%s %s: W8A8 layouts on: %r" % (path, what, on))
        got = scenario(m)
        ref = scenario(load("cpu", "float32"), got)
        compare(got, ref, tol, "%s %s" % (path, what))
        check(m.graphs is not None and m.graphs.graphs and not m.graphs.broken, "%s %s: decode graphs ran" % (path, what))
        if what == "W8A8":  # the norms and SwiGLU quantizing for fp8_mma change no number
            given, offered = w8a8.given_group, []
            try:
                w8a8.given_group = lambda *a: 0
                w8a8._on.clear()
                plain = scenario(load("cuda", "bfloat16", settings))
            finally:
                w8a8.given_group = given
            give = qt_give(offered)
            try:
                w8a8._on.clear()
                again = scenario(load("cuda", "bfloat16", settings))
            finally:
                give()
            check(offered and all(n == 0 for n in offered), "%s: the kernels' codes were taken (%d offered, %d left)" % (
                path, len(offered), sum(offered)))
            check(again == plain, "%s: the same tokens and logprobs with the kernels' codes as with act_quant's" % path)
        print("%s bfloat16 %s against the dequantized float32 model: %d tokens, worst logprob difference %.3g" % (
            path, what, sum(map(len, got.values())), worst(got, ref)))
    w8a8._on.clear()


def qt_give(offered):
    """Counts quant_triton.give's offers; offered gets, for each, whether
    it was still untaken at the next offer (1) or not (0). Returns the
    function that puts give back."""
    from mlxsworker.torchrt import quant_triton as qt
    give = qt.give

    def counted(x, q, s):
        if offered:
            offered[-1] = int(qt._given is not None)
        offered.append(0)
        give(x, q, s)
    qt.give = counted

    def restore():
        if offered:
            offered[-1] = int(qt._given is not None)
        qt.give = give
    return restore


def scenario(m, forced=None):
    """20 sequences' prompts in one step (W8A8 rows), 6 decodes of all 20
    (W8A8 rows), then 4 decodes of one (weight-only). Returns {seq:
    [(token, logprob, gap)]}; forced (such a result): each decode is fed
    forced's token instead of the model's own (teacher forcing, so that a
    near tie does not set the runs apart)."""
    lp = {"l": True, "n": 2}
    out = {}

    def step(batch):
        r = m.step(batch)
        for b, t, l, top in zip(batch, r.tokens, r.logprobs, r.top):
            out.setdefault(b[0], []).append((t, l, top[0][1] - top[1][1]))
        if forced is None:
            return r.tokens
        return [forced[b[0]][len(out[b[0]]) - 1][0] for b in batch]

    with torch.no_grad():
        seqs = list(range(1, 21))
        prompts = {i: [(j * (31 + i) + 7 * i) % 300 + 5 for j in range(3 + i % 9)] for i in seqs}
        for i in seqs:
            m.open(i, prompts[i], "")
        last = dict(zip(seqs, step([[i, prompts[i], True, lp] for i in seqs])))
        for _ in range(6):
            last = dict(zip(seqs, step([[i, [last[i]], True, lp] for i in seqs])))
        for _ in range(4):
            last[1] = step([[1, [last[1]], True, lp]])[0]
    return out


def worst(a, b):
    """The largest logprob difference of runs a and b (by sequence, one fed
    the other's tokens) where they chose the same token."""
    return max([abs(x[1] - y[1]) for seq in a for x, y in zip(a[seq], b[seq]) if x[0] == y[0]] or [0.0])


def compare(got, ref, tol, what):
    """got (the run ref was fed) against ref: the same token wherever ref's
    top two are not a near tie (within tol), and there the same logprob
    within tol."""
    n = 0
    for seq in ref:
        for i, (a, b) in enumerate(zip(got[seq], ref[seq])):
            if a[0] != b[0]:
                check(b[2] < tol, "%s: seq %d token %d is %d, reference %d (gap %.3f)" % (what, seq, i, a[0], b[0], b[2]))
                continue
            n += 1
            check(abs(a[1] - b[1]) < tol, "%s: seq %d token %d logprob %.5f, reference %.5f" % (what, seq, i, a[1], b[1]))
    check(n >= sum(map(len, ref.values())) // 2, "%s: only %d tokens agree" % (what, n))


def main():
    args = sys.argv[2:]
    if args[:1] == ["--cuda"]:
        check_kernels_cuda()
        for path in args[1:]:
            check_model_cuda(path)
    else:
        check_act_quant()
        check_routing()
        check_probe()
        check_loader_gate()
    print("%d passed, 0 failed" % passed)


if __name__ == "__main__":
    main()
