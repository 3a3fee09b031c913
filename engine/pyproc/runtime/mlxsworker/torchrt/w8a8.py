"""FP8 weights as W8A8: products of MMA_MIN_ROWS rows or more (decode
batches, prompt chunks) run quant.py's FP8 QWeights on the FP8 tensor
cores as vLLM's dynamic FP8 does, each row's activations quantized to
e4m3 by its own max / 448. The weight-only GEMM converts each FP8 tile
to bf16 before a bf16 MMA, which bounds it at these row counts; W8A8
skips the conversion and runs at FP8's rate. One row stays weight-only
(the weight's bytes bound it, and the row-loop kernel streams them).

Two products, by rows:
- MMA_MIN_ROWS to MMA_MAX_ROWS (decode batches, short prompt chunks): quant_triton.fp8_mma,
  one Triton kernel, the activations quantized per 128 inputs of a row
  (for per-channel weights too). cuBLAS's scaled GEMM has a floor of
  about 15 us a product whatever its size, which the 8B model's smaller
  products sit under at these rows (BENCHMARKS.md, issue 33's runs).
- MIN_ROWS and more beyond that (large batches, prompt chunks): cuBLAS
  through torch._scaled_mm (quant_triton.act_quant and fp8_w8a8): per
  channel weights one scale a row, 128x128 blocks one per 128 inputs of
  a row (the 1x128 recipe cuBLAS pairs with them).

From 17 rows fp8_mma quantizes its input in a launch of its own first;
the add+RMSNorm before q/k/v and gate/up and the SwiGLU before down
write those codes themselves (given_group, quant_triton.give), the same
codes bit for bit, so only the launch goes.

Each row is quantized by its own scales (no scale over the batch), so
the quantization adds no dependence on the other rows of a product (as
far as the tile a row count takes lets it, as for bf16). The paths
differ, though (W8A8 adds the activations' rounding, within 2^-4 of each
value relative; per-channel weights' activations are scaled per 128
inputs up to MMA_MAX_ROWS rows and per row beyond), so a sequence's
numbers depend on which side of 1 and MMA_MAX_ROWS rows the product's
row count fell: the step's rows, or in a CUDA graph its bucket's.

The settings' fp8_scaled_mm (pyproc.Tuning.NoFP8ScaledMM) turns it off.
Where it is on, quant.Loader calls check at load, which tries each layout
once and keeps the weight-only GEMM, logged, where the call raises (no
float8 GEMM on this GPU, no blockwise scaling in this torch) or disagrees
with the dequantized product. CPU (torch 1.13: no float8) never gets
here: its weights are dequantized at load.
"""
import logging

import torch

from . import quant

log = logging.getLogger("quant")

# The fewest rows a product runs through cuBLAS's W8A8 (where fp8_mma
# is off, or above MMA_MAX_ROWS): 16, the smallest decode batch of issue
# 33's measurements.
MIN_ROWS = 16

# The rows fp8_mma takes (cmd/gpubench/quant_sweep.py --mma-rows, H200,
# the 8B projections, microseconds a layer's four products, BENCHMARKS.md):
# at 16 rows it beats cuBLAS W8A8 and the weight-only tile on all four
# (77 against 95 and 99), at 64 rows 96 against cuBLAS's 112 and bf16's
# 121; at 128 cuBLAS wins (114 against 137). From 2 rows: the weight-only
# tile below 16 rows costs what it costs at 16.
MMA_MIN_ROWS = 2
MMA_MAX_ROWS = 64

# (device, dtype, layout) -> whether fp8_mma passed check there.
_mma = {}

# (device, dtype, layout) -> the keyword arguments of quant_triton.fp8_w8a8
# that passed check there, or None: the weight-only GEMM. Set at
# load where the settings turn W8A8 on (the worker's settings are the
# process's, so one model's load turns it on for every model).
_on = {}

# The W8A8 product's largest error, relative to the largest output, that
# the check accepts: e4m3 rounds each activation within 2^-4 of itself
# (relative) and the per-output errors add up as a random walk, a few
# percent of the largest output at most (3.2% seen in the check's product
# emulated in float32); an operand misread (a transposed scale, a wrong
# row's scale) is off by tens of percent.
TOLERANCE = 0.06


def fits(w):
    """Which W8A8 product an fp8 QWeight fits: "channel" (a scale per
    output, from per-channel or per-tensor files), "block" (128x128
    blocks, K a multiple of 512: the weight's scales [N/128, K/128] are
    read in rows of 16-byte multiples; N whole blocks, as the check's
    case has them), or None (other blocks or sizes: _scaled_mm needs N
    and K multiples of 16)."""
    block, (n, k) = w.t["block"], (w.n, w.k)
    if n % 16 or k % 16 or not w.t["scale"].is_contiguous():
        return None
    if block[0] == 1:
        return "channel"
    if block == (128, 128) and k % 512 == 0 and n % 128 == 0:
        return "block"
    return None


# (device, dtype, N, K, "mma" or "cublas") of products whose W8A8 call
# raised when they first ran (refuse): off that product from then on. The
# check at load tries one shape; a model's own may still be refused by the
# GEMM (a layout it does not take at that size).
_refused = set()


def mma_fits(w):
    """Which fp8_mma layout an fp8 QWeight fits: "channel" or "block"
    (128x128), K a multiple of 128 (its activation groups); else None."""
    if w.k % 128:
        return None
    block = w.t["block"]
    return "channel" if block[0] == 1 else "block" if block == (128, 128) else None


def route(w, x):
    """The keyword arguments of quant_triton.fp8_w8a8 for fp8 QWeight w
    and input x when that product runs as W8A8, else None."""
    rows = x.numel() // w.k
    if rows < MMA_MIN_ROWS or not _on:
        return None
    where = _where(x.device)
    if _takes_mma(w, rows, where, x.dtype):
        return {"mma": True}
    if rows < MIN_ROWS or (where, x.dtype, w.n, w.k, "cublas") in _refused:
        return None
    return _on.get((where, x.dtype, fits(w)))


def given_group(w, rows, device, dtype):
    """The activation group (quant_triton.ACT_GROUP) when the product of
    weight w (a tensor, a QWeight or None) over rows rows runs fp8_mma on
    activations quantized first (act_quant: 17 to MMA_MAX_ROWS rows), so
    the kernel writing them can quantize them instead (quant_triton.give);
    else 0. As route decides."""
    if not _on or not isinstance(w, quant.QWeight) or w.kind != "fp8" or rows < MMA_MIN_ROWS:
        return 0
    if not _takes_mma(w, rows, _where(device), dtype):
        return 0
    from . import quant_triton
    return quant_triton.ACT_GROUP if quant_triton.tiles_for(rows, "mma").pre else 0


def _takes_mma(w, rows, where, dtype):
    """Whether fp8 QWeight w's product of rows rows (MMA_MIN_ROWS or
    more, W8A8 on) runs fp8_mma on device where: within its rows, its
    layout's check passed there and the shape was not refused."""
    return (rows <= MMA_MAX_ROWS and bool(_mma.get((where, dtype, mma_fits(w))))
            and (where, dtype, w.n, w.k, "mma") not in _refused)


def refuse(w, x, e, how):
    """Routes w's shape off the W8A8 product how named (fp8_mma or
    cuBLAS's) from now on, after that call raised e (logged once a shape
    and product): those rows go to cuBLAS's product or the weight-only
    one. A shape is refused in the warm-up run before a graph's capture
    (same shapes), so the capture records the other product; an error
    during a capture, or out of memory, is not the shape's and is raised
    instead (quant._not_the_shape). A refusal may leave an act_quant
    launched before the call raised: its codes go unread."""
    path = "mma" if how.get("mma") else "cublas"
    key = (_where(x.device), x.dtype, w.n, w.k, path)
    if key not in _refused:
        _refused.add(key)
        log.warning("W8A8 (%s) refused a %dx%d FP8 product (%s); those rows of that shape run without it",
                    "one kernel" if path == "mma" else "cuBLAS", w.n, w.k, _first_line(e))


def _first_line(e):
    """An exception's first line, for a one-line log (torch's and Triton's
    messages run to pages)."""
    return (str(e).splitlines() or [repr(e)])[0]


_names = {}  # device (as given) -> _where's name: route runs for every FP8 product of a step


def _where(device):
    """device as check and route both name it: the loader passes
    torch.device("cuda"), a tensor's device reads "cuda:0"."""
    name = _names.get(device)
    if name is None:
        d = torch.device(device)
        if d.type == "cuda" and d.index is None:
            d = torch.device("cuda", torch.cuda.current_device())
        name = _names[device] = str(d)
    return name


def act_quant(x, group=None, rows=None):
    """x [M, K] quantized per row (group None) or per group of a row's
    inputs, in torch ops: what quant_triton.act_quant computes (codes
    [rows, K], scales float32 [rows, K/group or 1], column-major; rows
    past M padding). The codes are float8_e4m3fn where torch has it, else
    (torch 1.13) their values in float32 (e4m3_round)."""
    M, K = x.shape
    xf = x.float()
    if rows and rows > M:
        xf = torch.cat([xf, xf.new_zeros(rows - M, K)])
    g = xf.reshape(xf.shape[0], -1, group or K)
    s = (g.abs().amax(-1) / quant.E4M3_MAX).clamp(min=1e-12)
    q = (g / s[..., None]).clamp(-quant.E4M3_MAX, quant.E4M3_MAX).reshape(xf.shape)
    q = q.to(torch.float8_e4m3fn) if hasattr(torch, "float8_e4m3fn") else quant.e4m3_round(q)
    return q, s.t().contiguous().t()


def check(device, dtype):
    """Checks each W8A8 layout here once (at load, before any CUDA graph
    is captured): a small product against the dequantized one. Block
    weights try torch._scaled_mm, then torch.nn.functional.scaled_mm;
    what passes goes into _on, and a layout that fails keeps the
    weight-only GEMM, logged. Then fp8_mma at MMA_MIN_ROWS, the case's
    rows and MMA_MAX_ROWS (its tile classes) into _mma; where it fails,
    those rows take cuBLAS's product (or the weight-only one)."""
    from . import quant_triton
    for kind, tries in (("channel", ({},)), ("block", ({}, {"v2": True}))):
        key = (_where(device), dtype, kind)
        if key in _on:
            continue
        _on[key] = None
        w, x = _case(kind, device, dtype)
        want = x.float() @ w.dequant(torch.float32).t()
        for kw in tries:
            what = kind + (" (F.scaled_mm)" if kw else "")
            try:
                got = quant_triton.fp8_w8a8(x, w.t["w"], w.t["scale"], w.t["block"], **kw).float()
                err = ((got - want).abs().max() / want.abs().max()).item()
            except Exception as e:  # torch's and Triton's errors alike (a kernel that does not compile here)
                log.warning("W8A8 %s unavailable (%s)", what, _first_line(e))
                continue
            if err < TOLERANCE:
                _on[key] = kw
                break
            log.warning("W8A8 %s disagrees with the dequantized product (relative %.3g)", what, err)
        if _on[key] is None:
            log.warning("FP8 %s weights stay on the weight-only GEMM", kind)
        _mma[key] = _check_mma(kind, w, x, want)


# (device, dtype, layout, K, N) of the products warm has run.
_warmed = set()

# Row counts warm runs: each of fp8_mma's tile classes (2-16, 17-32,
# 33-64) at a multiple of 16 and not, then cuBLAS's side. The kernels
# are not specialized on the rows or the K split (quant_triton), so these
# compile what every product of that K runs (N a multiple of 16, as
# every projection's is).
WARM_ROWS = (2, 16, 19, 32, 37, 64, 65)


def warm(w, device, dtype):
    """Runs fp8 QWeight w's W8A8 products once at WARM_ROWS, the first
    of its (layout, K, N) at load: the kernels of a K's activation groups
    compile here (seconds on a fresh machine) rather than in a served
    step."""
    # N too: tile_table's entries give a K's products their own tiles,
    # each its own compile.
    key = (_where(device), dtype, mma_fits(w) or fits(w), w.k, w.n)
    if key in _warmed or not _on:
        return
    _warmed.add(key)
    for rows in WARM_ROWS:
        w.forward(torch.zeros(rows, w.k, device=device, dtype=dtype))


def _check_mma(kind, w, x, want):
    """Whether fp8_mma passes for layout kind; where it fails with its
    weight through TMA (quant_triton.FP8_TMA) and passes without, TMA is
    turned off, logged, and the kernel kept."""
    from . import quant_triton
    tma = quant_triton.FP8_TMA
    why = _mma_fails(w, x, want, tma)
    if why and tma:
        quant_triton.FP8_TMA = False
        if _mma_fails(w, x, want, False) is None:
            log.warning("W8A8 %s in one kernel: the weight's TMA loads are off (%s)", kind, why)
            return True
        quant_triton.FP8_TMA = True  # not TMA's doing: another layout may still take it
    if why:
        log.warning("W8A8 %s in one kernel %s", kind, why)
        return False
    return True


def _mma_fails(w, x, want, tma):
    """Why fp8_mma fails the check's case at its row classes (and with
    tma, at MMA_MAX_ROWS on a tile that reads through TMA, as
    tile_table's TMA entries do: the default tiles read without), or
    None."""
    from . import quant_triton
    cases = [(rows, {}) for rows in (MMA_MIN_ROWS, x.shape[0], MMA_MAX_ROWS)]
    if tma:
        cases.append((MMA_MAX_ROWS, {"tma": True}))
    for rows, how in cases:
        reps = -(-rows // x.shape[0])
        try:
            got = quant_triton.fp8_w8a8(x.repeat(reps, 1)[:rows], w.t["w"], w.t["scale"], w.t["block"], mma=True,
                                        **how)
            err = ((got.float() - want.repeat(reps, 1)[:rows]).abs().max() / want.abs().max()).item()
        except Exception as e:  # a Triton that has no FP8 dot for this GPU, and the like
            return "unavailable (%s)" % _first_line(e)
        if not err < TOLERANCE:
            return "disagrees with the dequantized product at %d rows (relative %.3g)" % (rows, err)
    return None


def _case(kind, device, dtype):
    """The check's fp8 QWeight [256, 512] and input (MIN_ROWS + 3 rows:
    the block product's row padding), from a fixed seed."""
    g = torch.Generator(device="cpu").manual_seed(0)
    n, k = 256, 512
    # Rows (per channel) or 128x128 blocks scaled by powers of two from
    # 2^-3 to 2^3, so their scales differ 64-fold: a scale read from the
    # wrong row or block (transposed, shifted) is off by tens of percent,
    # where near-equal scales would hide it inside the tolerance.
    rows, cols = (n, 1) if kind == "channel" else (n // 128, k // 128)
    spread = 2.0 ** torch.randint(-3, 4, (rows, cols), generator=g).float()
    if kind != "channel":
        spread = spread.repeat_interleave(128, 0).repeat_interleave(128, 1)
    w = torch.randn(n, k, generator=g) / k ** 0.5 * spread
    if kind == "channel":
        block, s = (1, k), w.abs().amax(1, keepdim=True) / quant.E4M3_MAX
        full = s
    else:
        block = (128, 128)
        s = w.reshape(n // 128, 128, k // 128, 128).abs().amax((1, 3)) / quant.E4M3_MAX
        full = quant._expand(s, (n, k), block)
    codes = quant.e4m3_encode(w / full)
    if hasattr(torch, "float8_e4m3fn"):
        codes = codes.view(torch.float8_e4m3fn)
    x = torch.randn(MIN_ROWS + 3, k, generator=g).to(device=device, dtype=dtype)
    return quant.QWeight("fp8", n, k, w=codes.to(device), scale=s.to(device), block=block), x
