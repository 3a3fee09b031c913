"""Checks of the quantized-weight code (runtime/quant.py, quant_triton.py)
the CPU tests do not reach through a served model: FP8 rounding against
every e4m3 value and tie, int4 packing round trips, the concatenation of
quantized projections (the CUDA path's q/k/v and gate/up), the per-product
tile table's parsing (tile_table: MLXSERVING_TILES), and, where CUDA
runs, the Triton GEMMs against the dequantized product on shapes and row
counts the decoder meets (odd rows, split K, partial blocks): FP8 through
the weight-only GEMM at every row count, as no W8A8 check ran here
(w8a8_test.py checks that path), and int4 through both kernel sets
(quant_triton.INT4_FAST off and on; the self check and quant.linear
take the fast ones unless MLXSERVING_INT4_FAST=0), and the one-row FP8
down product with SwiGLU inside (quant.silu_linear) bit for bit against
silu_mul then the product, and the residual add and RMSNorm inside the
one-row FP8 product (quant.norm_linear) against a float64 reference;
the same one-row loop over 16-bit weights (quant.ROW_LOOP); its K tiles
over whole scale blocks (quant_triton.FP8_WIDE) against float64; each kernel
kind running its per-product tile (tile_table.SHAPE_TILES) and only its
own product taking it.

  python3 quant_test.py RUNTIME_DIR [CHECKPOINT ...]

With checkpoints (testmodel's quantized TinyQuant), each projection as the
CUDA path keeps it (quant.Loader with keep on: AWQ and compressed-tensors
repacked to GPTQ's packing, zeros unpacked, act order's inputs sorted by
group; q/k/v and gate/up concatenated) dequantizes to exactly what the CPU
path loads.

Prints "N passed, 0 failed" or raises. Run by TestQuantRuntime (and on a
GPU by internal/familycheck/quant.sh).
"""
import sys

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

from mlxsworker.torchrt import quant  # noqa: E402

passed = 0


def check(cond, what):
    global passed
    if not cond:
        raise AssertionError(what)
    passed += 1


# e4m3: every finite value rounds to itself; midpoints to the even code.
vals = quant.e4m3_values()
fin = vals[:0x7F]
check(torch.equal(quant.e4m3_round(fin), fin), "finite e4m3 values round to themselves")
check(torch.equal(quant.e4m3_round(-fin[1:]), -fin[1:]), "negative values too")
mid = (fin[:-1] + fin[1:]) / 2
even = torch.where(torch.arange(mid.numel()) % 2 == 0, fin[:-1], fin[1:])
check(torch.equal(quant.e4m3_round(mid), even), "midpoints round to the even code")
check(quant.e4m3_round(torch.tensor([1e6, -1e6])).tolist() == [448.0, -448.0], "saturates at 448")
check(bool(torch.isnan(vals[0x7F])) and bool(torch.isnan(vals[0xFF])), "0x7f and 0xff are NaN")
if hasattr(torch, "float8_e4m3fn"):  # torch's own conversion agrees (torch 2.1+)
    x = torch.randn(100000) * 100
    x = x.clamp(-448, 448)
    check(torch.equal(quant.e4m3_round(x), x.to(torch.float8_e4m3fn).float()), "agrees with torch's float8 conversion")
    check(torch.equal(vals[:0x7F], torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()),
          "the table is torch's float8_e4m3fn")

# int4 packing.
g = torch.Generator().manual_seed(1)
v = torch.randint(0, 16, (256, 24), generator=g, dtype=torch.int32)
check(torch.equal(quant.unpack4(quant.pack4(v).t()).t(), v), "pack4 then unpack4 along the input")
words = torch.randint(-(2 ** 31), 2 ** 31 - 1, (5, 3), generator=g, dtype=torch.int32)
un = quant.unpack4(words, quant.AWQ_REVERSE)
for c in range(3):
    for j in range(8):
        nib = (words[:, c] >> (4 * quant.AWQ_REVERSE[j])) & 15
        check(torch.equal(un[:, 8 * c + j], nib), "AWQ column %d of word %d" % (j, c))

# Concatenated QWeights dequantize to the concatenated weights.


def fp8_part(n, k, block):
    w = torch.randint(0, 0x7F, (n, k), generator=g, dtype=torch.uint8) | (torch.randint(0, 2, (n, k), generator=g, dtype=torch.uint8) << 7)
    bn, bk = block
    s = torch.rand(-(-n // bn), -(-k // bk), generator=g) + 0.01
    return quant.QWeight("fp8", n, k, w=w, scale=s, block=block)


def int4_part(n, k, grp):
    q = torch.randint(0, 16, (k, n), generator=g, dtype=torch.int32)
    return quant.QWeight("int4", n, k, qw=quant.pack4(q), scales=torch.rand(k // grp, n, generator=g).half(),
                         zeros=torch.randint(0, 17, (k // grp, n), generator=g).half(), group=grp)


for parts in ([fp8_part(256, 384, (128, 128)), fp8_part(128, 384, (128, 128))],
              [fp8_part(64, 200, (1, 200)), fp8_part(32, 200, (1, 200))],
              [int4_part(64, 256, 128), int4_part(40, 256, 128)],
              [fp8_part(64, 256, (128, 128)), fp8_part(64, 256, (128, 128))]):  # partial blocks: dequantized
    c = quant.cat(parts, torch.float32)
    got = c if isinstance(c, torch.Tensor) else c.dequant(torch.float32)
    want = torch.cat([p.dequant(torch.float32) for p in parts])
    check(torch.equal(got, want), "cat of %s parts" % parts[0].kind)
    check(isinstance(c, quant.QWeight) == (parts[0].n % 128 == 0 or parts[0].kind != "fp8" or parts[0].t["block"][0] == 1),
          "cat keeps the parts quantized where blocks allow")

# Act order's kept form: the inputs sorted by group and repacked (perm)
# dequantize to the weight dequantized by g_idx directly; forward gathers
# x by perm before the int4 GEMM (here a plain product over qw as stored,
# standing in for quant_triton's, which needs CUDA); parts of one order
# concatenate, parts of two are dequantized.


class _PlainInt4:
    """quant_triton's int4_linear as a float product, for the CPU."""

    @staticmethod
    def int4_linear(x, qw, scales, zeros, grp):
        w = quant.QWeight("int4", qw.shape[1], qw.shape[0] * 8, qw=qw, scales=scales, zeros=zeros, group=grp)
        return x @ w.dequant(torch.float32).t()


def act_order(n, k, grp):
    """A direct (g_idx) int4 part and its kept form, the inputs of each
    group scattered."""
    q = torch.randint(0, 16, (k, n), generator=g, dtype=torch.int32)
    gi = torch.randperm(k, generator=g) // grp
    t = {"qw": quant.pack4(q), "scales": torch.rand(k // grp, n, generator=g).bfloat16(),
         "zeros": torch.randint(0, 16, (k // grp, n), generator=g).half(), "group": grp}
    perm = torch.sort(gi, stable=True).indices
    kept = quant.QWeight("int4", n, k, **dict(t, qw=quant.pack4(q[perm]), perm=perm))
    return quant.QWeight("int4", n, k, g_idx=gi, **t), kept, gi


import mlxsworker.torchrt as torchrt  # noqa: E402

real = sys.modules.get("mlxsworker.torchrt.quant_triton"), getattr(torchrt, "quant_triton", None)
sys.modules["mlxsworker.torchrt.quant_triton"] = torchrt.quant_triton = _PlainInt4
direct, kept, gi = act_order(48, 256, 64)
check(torch.equal(kept.dequant(torch.float32), direct.dequant(torch.float32)), "act order: kept form dequantizes as g_idx does")
x = torch.randn(5, 256, generator=g)
want = x @ direct.dequant(torch.float32).t()
check(torch.allclose(kept.forward(x), want, rtol=1e-5, atol=1e-5), "act order: forward gathers x by perm")
part2 = quant.QWeight("int4", 16, 256, **dict(kept.t, qw=kept.t["qw"][:, :16], scales=kept.t["scales"][:, :16], zeros=kept.t["zeros"][:, :16]))
c = quant.cat([kept, part2], torch.float32)
check(isinstance(c, quant.QWeight) and torch.equal(c.t["perm"], kept.t["perm"]), "act order: parts of one order concatenate")
check(torch.allclose(c.forward(x), x @ c.dequant(torch.float32).t(), rtol=1e-5, atol=1e-5), "act order: the concatenation gathers once")
other = act_order(16, 256, 64)[1]
c = quant.cat([kept, other], torch.float32)
check(isinstance(c, torch.Tensor) and torch.equal(c, torch.cat([kept.dequant(torch.float32), other.dequant(torch.float32)])),
      "act order: parts of two orders are dequantized")
if real[0] is None:
    del sys.modules["mlxsworker.torchrt.quant_triton"], torchrt.quant_triton
else:
    sys.modules["mlxsworker.torchrt.quant_triton"], torchrt.quant_triton = real

# The CUDA path's form of real checkpoints, checked through dequant.
for d in sys.argv[2:]:
    from mlxsworker.torchrt.config import Config
    from mlxsworker.torchrt.st import Checkpoint
    cfg = Config(d)
    if cfg.quant.kind == "fp8" and not hasattr(torch, "float8_e4m3fn"):
        continue  # the kept form views the bytes as float8
    ck = Checkpoint(d)
    flat = quant.Loader(ck, cfg.quant, torch.device("cpu"), torch.float32)
    kept = quant.Loader(ck, cfg.quant, torch.device("cpu"), torch.float32)
    kept.keep = True
    h, H, K, hd = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim
    for i in range(cfg.layers):
        a, m = "model.layers.%d.self_attn." % i, "model.layers.%d.mlp." % i
        groups = [[(a + "q_proj.weight", (H * hd, h)), (a + "k_proj.weight", (K * hd, h)), (a + "v_proj.weight", (K * hd, h))],
                  [(a + "o_proj.weight", (h, H * hd))],
                  [(m + "gate_proj.weight", (cfg.intermediate, h)), (m + "up_proj.weight", (cfg.intermediate, h))],
                  [(m + "down_proj.weight", (h, cfg.intermediate))]]
        for grp in groups:
            want = torch.cat([flat.linear(n, s) for n, s in grp])
            got = quant.cat([kept.linear(n, s) for n, s in grp], torch.float32)
            check(isinstance(got, quant.QWeight), "%s: %s kept quantized" % (d, grp[0][0]))
            check(torch.equal(got.dequant(torch.float32), want), "%s: %s as the CUDA path keeps it" % (d, grp[0][0]))

# The per-product tile table (tile_table, no Triton): MLXSERVING_TILES'
# spec parses as Tiles' repr writes the fields, "none" empties the
# table, and garbage is refused by name (the worker stops at start).
from mlxsworker.torchrt import tile_table  # noqa: E402
spec = "fp8:1:4096x4096=bn128 w4 bk64 waves4; fp8norm:1:4096x4096=bn32 w2;" \
       "mma:64:4096x4096=bn128 s4 waves1 noswap tma; int4fast:1:4096x4096=bn512 w8 bk64 waves4"
table = tile_table.parse(spec)
check(table[("fp8", 1, 4096, 4096)] == {"bn": 128, "warps": 4, "bk": 64, "waves": 4}
      and table[("mma", 64, 4096, 4096)] == {"bn": 128, "stages": 4, "waves": 1, "swap": False, "tma": 1}
      and len(table) == 4, "tile_table.parse: %r" % table)
check(tile_table.parse("int4fast:1:8x8=bn64 noh2; int4fast:1:16x8=h2 w2") == {("int4fast", 1, 8, 8): {"bn": 64, "h2": False},
                                                                          ("int4fast", 1, 16, 8): {"h2": True, "warps": 2}},
      "tile_table.parse h2, noh2")
check(tile_table.from_env(table, "none") == {} and tile_table.from_env(table, " ") == table
      and tile_table.from_env(table, "w16:1:8x8=bn16")[("w16", 1, 8, 8)] == {"bn": 16}
      and tile_table.from_env(table, "w16:1:8x8=bn16")[("fp8", 1, 4096, 4096)] == table[("fp8", 1, 4096, 4096)],
      "tile_table.from_env")
for bad in ("fp8:1:4096=bn64", "fp8:1:4096x4096=bn", "fp8:1:4096x4096=zz64", "fp8:one:4x4=bn64", "fp16:1:4x4=bn64",
            "fp8:2:4x4=bn64", "fp8:1:4x4=bn48", "fp8:1:4x4=w0", "fp8:1:4x4=w32", "fp8:1:4x4=", "fp8:1:0x4=bn64",
            "fp8:1:4x4=gemv"):
    try:
        tile_table.parse(bad)
        check(False, "tile_table.parse took %r" % bad)
    except ValueError as e:
        check("MLXSERVING_TILES" in str(e) and bad in str(e), "tile_table.parse(%r): %s" % (bad, e))
check([tile_table.rows_bucket(m) for m in (1, 2, 16, 17, 32, 33, 64, 65)] == [1, 16, 16, 32, 32, 64, 64, 0],
      "tile_table.rows_bucket")
# Without wide K tiles (quant_triton.FP8_WIDE off) a row-loop entry for
# them is passed over, for the tile and for whether the norm goes inside;
# narrow entries and other kinds' stay.
saved_table = dict(tile_table.SHAPE_TILES)
try:
    tile_table.SHAPE_TILES.update({("fp8norm", 1, 8, 8): {"bk": 256}, ("w16", 1, 8, 8): {"bk": 512, "bn": 16},
                                   ("fp8", 1, 8, 8): {"bk": 64}, ("int4fast", 1, 8, 8): {"bk": 256}})
    w8_, w16_ = torch.zeros(8, 8, dtype=torch.uint8), torch.zeros(8, 8, dtype=torch.bfloat16)
    check(tile_table.entry("w16", 1, 8, 8) == {"bk": 512, "bn": 16} and tile_table.entry("w16", 1, 8, 8, False) is None
          and tile_table.entry("fp8", 1, 8, 8, False) == {"bk": 64}
          and tile_table.entry("int4fast", 1, 8, 8, False) == {"bk": 256}
          and tile_table.norm_tiled(w8_, 8, 8) and not tile_table.norm_tiled(w8_, 8, 8, False)
          and not tile_table.norm_tiled(w16_, 8, 8), "tile_table.entry / norm_tiled without wide K tiles")
finally:
    tile_table.SHAPE_TILES.clear()
    tile_table.SHAPE_TILES.update(saved_table)

# quant._kernels_ok's fallbacks (no Triton: a stand-in for quant_triton
# whose self-check fails while a bad switch's kernels run; the packed
# int4 loop runs only under INT4_FAST): the switches a failure needs stay
# off and no other (the newest first: INT4_FAST before INT4_H2 would
# turn off the fast kernels for the packed loop's failure); a failure no
# switch cures restores them all and fails; int4's switches are not
# blamed where INT4_FAST is off.
import types  # noqa: E402

pkg, qt_name = sys.modules[quant.__package__], quant.__package__ + ".quant_triton"
saved_qt = sys.modules.get(qt_name), getattr(pkg, "quant_triton", None)
flags = ("FP8_WIDE", "INT4_H2", "INT4_FAST")
runs = {"FP8_WIDE": lambda f: f.FP8_WIDE, "INT4_H2": lambda f: f.INT4_FAST and f.INT4_H2,
        "INT4_FAST": lambda f: f.INT4_FAST, "always": lambda f: True}
try:
    for bad, fast, want_ok, want in ((("FP8_WIDE",), True, True, (False, True, True)),
                                     (("INT4_H2",), True, True, (True, False, True)),
                                     (("INT4_FAST",), True, True, (True, True, False)),
                                     (("FP8_WIDE", "INT4_H2"), True, True, (False, False, True)),
                                     ((), True, True, (True, True, True)),
                                     (("always",), True, False, (True, True, True)),
                                     (("always",), False, False, (True, True, False))):
        fake = types.SimpleNamespace(FP8_WIDE=True, INT4_H2=True, INT4_FAST=fast)
        fake.self_check = lambda d, t, f=fake, bad=bad: next(("%s fails" % b for b in bad if runs[b](f)), None)
        sys.modules[qt_name] = fake
        pkg.quant_triton = fake
        quant._checked.pop(("cpu", torch.float32), None)
        ok = quant._kernels_ok(torch.device("cpu"), torch.float32)
        got = tuple(getattr(fake, f) for f in flags)
        check(ok == want_ok and got == want,
              "_kernels_ok with %r failing (INT4_FAST %s): ok %s, switches %r" % (bad, fast, ok, got))
finally:
    quant._checked.pop(("cpu", torch.float32), None)
    if saved_qt[0] is None:
        sys.modules.pop(qt_name, None)
    else:
        sys.modules[qt_name] = saved_qt[0]
    if saved_qt[1] is None:
        pkg.__dict__.pop("quant_triton", None)
    else:
        pkg.quant_triton = saved_qt[1]

# The Triton GEMMs, where CUDA runs.
if torch.cuda.is_available():
    from mlxsworker.torchrt import quant_triton
    dev = torch.device("cuda")
    for dtype in (torch.bfloat16, torch.float16):
        check(quant_triton.self_check(dev, dtype) is None, "self_check %s" % dtype)
        for n, k, M in ((2048, 2048, 1), (512, 8192, 3), (3072, 2048, 64), (1000, 384, 17), (4096, 14336, 256)):
            x = torch.randn(M, k, device=dev, dtype=dtype)
            w = torch.randn(n, k, device=dev) / k ** 0.5
            cases = []
            s = w.abs().amax(1, keepdim=True) / 448
            w8 = (w / s).clamp(-448, 448).to(torch.float8_e4m3fn)
            cases.append(quant.QWeight("fp8", n, k, w=w8, scale=s, block=(1, k)))
            sb = torch.rand(-(-n // 128), -(-k // 128), device=dev) * 0.01
            cases.append(quant.QWeight("fp8", n, k, w=w8, scale=sb, block=(128, 128)))
            if k % 128 == 0:
                q = torch.randint(0, 16, (k, n), device=dev, dtype=torch.int32)
                cases.append(quant.QWeight("int4", n, k, qw=quant.pack4(q), scales=(torch.rand(k // 128, n, device=dev) * 0.01).half(),
                                           zeros=torch.randint(0, 16, (k // 128, n), device=dev).half(), group=128))
            for c in cases:
                want = x.float() @ c.dequant(torch.float32).t()
                got = quant.linear(x, c).float()
                err = ((got - want).abs().max() / want.abs().max()).item()
                check(err < 2e-2, "%s %r [%d, %d] x %d rows %s: relative error %.3g" % (c.kind, c.t.get("block"), n, k, M, dtype, err))

    # SwiGLU inside the one-row FP8 down product (quant.silu_linear): the
    # same bits as silu_mul's rows through the row loop, both layouts,
    # odd widths and a split K; more rows are not taken (None).
    from mlxsworker.torchrt import kernels
    for dtype in (torch.bfloat16, torch.float16):
        for n, k in ((2048, 8192), (4096, 14336), (1000, 384)):
            w = torch.randn(n, k, device=dev) / k ** 0.5
            s = w.abs().amax(1, keepdim=True) / 448
            w8 = (w / s).clamp(-448, 448).to(torch.float8_e4m3fn)
            sb = torch.rand(-(-n // 128), -(-k // 128), device=dev) * 0.01
            for c in (quant.QWeight("fp8", n, k, w=w8, scale=s, block=(1, k)),
                      quant.QWeight("fp8", n, k, w=w8, scale=sb, block=(128, 128))):
                gu = torch.randn(1, 2 * k, device=dev, dtype=dtype) * 3
                got = quant.silu_linear(gu, c)
                want = quant.linear(kernels.silu_mul(gu), c)
                check(got is not None and torch.equal(got, want),
                      "silu_linear %r [%d, %d] %s: not silu_mul's product" % (c.t["block"], n, k, dtype))
                check(quant.silu_linear(torch.randn(3, 2 * k, device=dev, dtype=dtype), c) is None,
                      "silu_linear takes 3 rows")

    # The residual add and RMSNorm inside the one-row FP8 product
    # (quant.norm_linear): the residual bit for bit as add_rms writes it,
    # the product within the output's rounding of a float64 reference
    # (no rounding of the normalised row, where add_rms rounds it), the
    # same bits on a second run; both layouts, odd widths, K split or
    # not (70000 columns fill the SMs at one split), with and without d,
    # and Gemma's (1 + w). Every width, past the widths quant.NORM_MAX_K
    # and NORM_MAX_N let the decoder fuse (checked: past NORM_MAX_K
    # inputs, more than NORM_MAX_N outputs are not taken, unless
    # SHAPE_TILES holds the norm's tile for the product). The
    # decoder's gate (quant.row_loop_ok: its own check of these kernels)
    # passes here.
    row = quant.ROW_LOOP
    for dtype in (torch.bfloat16, torch.float16):
        check(quant.row_loop_ok(dev, dtype) == row, "row_loop_ok %s: not %s" % (dtype, row))
    check(not quant.row_loop_ok(dev, torch.float32), "row_loop_ok float32")
    if quant.NORM_FUSE:  # past NORM_MAX_K inputs: into NORM_MAX_N outputs, not more
        x = torch.randn(1, quant.NORM_MAX_K * 2, device=dev, dtype=torch.bfloat16)
        tiled = ("fp8norm", 1, 28672, x.shape[1]) in tile_table.SHAPE_TILES  # the 8B's gate/up: measured to win
        for n, taken in ((quant.NORM_MAX_N, True), (quant.NORM_MAX_N + 64, False),
                         (28672, tiled or 28672 <= quant.NORM_MAX_N)):
            c = quant.QWeight("fp8", n, x.shape[1], w=torch.zeros(n, x.shape[1], device=dev).to(torch.float8_e4m3fn),
                              scale=torch.ones(n, 1, device=dev), block=(1, x.shape[1]))
            got = quant.norm_linear(x, None, torch.ones(x.shape[1], device=dev, dtype=x.dtype), 1e-5, "llama", c, True)
            check((got is not None) == taken, "norm_linear of %d inputs into %d outputs: taken %s, want %s"
                  % (x.shape[1], n, got is not None, taken))
            # An fp8norm entry for the product takes it past the bounds.
            key = ("fp8norm", 1, n, x.shape[1])
            had = tile_table.SHAPE_TILES.get(key)
            tile_table.SHAPE_TILES[key] = {"waves": 8}
            try:
                got = quant.norm_linear(x, None, torch.ones(x.shape[1], device=dev, dtype=x.dtype), 1e-5, "llama", c, True)
                check(got is not None, "norm_linear into %d outputs: not taken with an fp8norm entry" % n)
            finally:
                if had is None:
                    del tile_table.SHAPE_TILES[key]
                else:
                    tile_table.SHAPE_TILES[key] = had
    max_k, quant.NORM_MAX_K = quant.NORM_MAX_K, 1 << 30
    for dtype, tol in ((torch.bfloat16, 2 ** -7), (torch.float16, 2 ** -10)) if quant.NORM_FUSE else ():
        for n, k in ((6144, 4096), (28672, 4096), (1000, 384), (70000, 256), (1000, 960)):
            w = torch.randn(n, k, device=dev) / k ** 0.5
            s = w.abs().amax(1, keepdim=True) / 448
            w8 = (w / s).clamp(-448, 448).to(torch.float8_e4m3fn)
            sb = torch.rand(-(-n // 128), -(-k // 128), device=dev) * 0.01
            for c in (quant.QWeight("fp8", n, k, w=w8, scale=s, block=(1, k)),
                      quant.QWeight("fp8", n, k, w=w8, scale=sb, block=(128, 128)), w.to(dtype)):
                if isinstance(c, torch.Tensor):  # a 16-bit weight: the row loop's unit scales (quant.ROW_LOOP)
                    if not row:
                        continue
                    wd, layout = c.double(), "16-bit"
                else:
                    wd, layout = c.dequant(torch.float64), repr(c.t["block"])
                for kind, has_d in (("llama", True), ("llama", False), ("gemma", True)):
                    x = torch.randn(1, k, device=dev, dtype=dtype) * 2
                    d = torch.randn(1, k, device=dev, dtype=dtype) if has_d else None
                    nw = torch.rand(k, device=dev, dtype=dtype) + 0.5
                    what = "norm_linear %s [%d, %d] %s %s d=%s" % (layout, n, k, dtype, kind, has_d)
                    got = quant.norm_linear(x, d, nw, 1e-5, kind, c, True)
                    check(got is not None, what + ": not taken")
                    h, y = got
                    h0, _ = kernels.add_rms(x, d, nw, 1e-5, kind)
                    check(torch.equal(h, h0), what + ": residual is not add_rms's")
                    hd = h.double()
                    nd = hd * torch.rsqrt(hd.pow(2).mean() + 1e-5) * (nw.double() + (1 if kind == "gemma" else 0))
                    want = nd @ wd.t()
                    err = ((y.double() - want).abs().max() / want.abs().max()).item()
                    check(err < tol, "%s: relative error %.3g" % (what, err))
                    check(torch.equal(quant.norm_linear(x, d, nw, 1e-5, kind, c, True)[1], y), what + ": a second run differs")
                    check(quant.norm_linear(x, d, nw, 1e-5, kind, c) is None, what + ": taken without row_loop")
                check(quant.norm_linear(torch.randn(3, k, device=dev, dtype=dtype), None, nw, 1e-5, "llama", c, True) is None,
                      "norm_linear takes 3 rows")
    quant.NORM_MAX_K = max_k

    # One-row products of 16-bit weights in the row loop (quant.ROW_LOOP):
    # within the output's rounding of float64, and with SwiGLU inside
    # (silu_linear) bit for bit as silu_mul's rows through the same loop.
    for dtype, tol in ((torch.bfloat16, 2 ** -7), (torch.float16, 2 ** -10)) if row else ():
        for n, k in ((3072, 2048), (1000, 384), (16384, 2048), (2048, 8192), (1000, 960)):
            w = (torch.randn(n, k, device=dev) / k ** 0.5).to(dtype)
            x = torch.randn(1, k, device=dev, dtype=dtype)
            want = x.double() @ w.double().t()
            check(quant._row_operands(x, w, True) is not None and quant._row_operands(x, w, False) is None,
                  "row loop 16-bit [%d, %d] %s: not taken with row_loop alone" % (n, k, dtype))
            got = quant.linear(x, w, row_loop=True)
            err = ((got.double() - want).abs().max() / want.abs().max()).item()
            check(err < tol, "row loop 16-bit [%d, %d] %s: relative error %.3g" % (n, k, dtype, err))
            gu = torch.randn(1, 2 * k, device=dev, dtype=dtype) * 3
            got = quant.silu_linear(gu, w, True)
            check(got is not None and torch.equal(got, quant.linear(kernels.silu_mul(gu), w, row_loop=True)),
                  "silu_linear 16-bit [%d, %d] %s: not silu_mul's product" % (n, k, dtype))
            check(quant.silu_linear(gu, w.float(), True) is None, "silu_linear takes a weight not of x's dtype")
            check(quant.silu_linear(gu, w) is None, "silu_linear takes a 16-bit weight without row_loop")

    # The row loop's K tiles over whole scale blocks (quant_triton._fp8_wide:
    # 256 and 512 inputs, two and four 128-input blocks; one scale a row;
    # 16-bit weights): the product within the output's rounding of float64,
    # with SwiGLU inside and with the norm inside, K not a whole number of
    # tiles (960, 384) and split or not (waves).
    for n, k in ((3072, 2048), (1000, 960), (4096, 14336), (1000, 384)):
        w = torch.randn(n, k, device=dev) / k ** 0.5
        s = w.abs().amax(1, keepdim=True) / 448
        w8 = (w / s).clamp(-448, 448).to(torch.float8_e4m3fn)
        sb = torch.rand(-(-n // 128), -(-k // 128), device=dev) * 0.01 + 0.001
        for c in (quant.QWeight("fp8", n, k, w=w8, scale=sb, block=(128, 128)),
                  quant.QWeight("fp8", n, k, w=w8, scale=s, block=(1, k)), w.to(torch.bfloat16)):
            if isinstance(c, torch.Tensor):
                wt, sc, blk, wd, layout = c, torch.ones(1, 1, device=dev), quant.WHOLE, c.double(), "16-bit"
            else:
                wt, sc, blk, wd, layout = c.t["w"], c.t["scale"], c.t["block"], c.dequant(torch.float64), repr(c.t["block"])
            x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
            gu = torch.randn(1, 2 * k, device=dev, dtype=torch.bfloat16) * 3
            nw = torch.rand(k, device=dev, dtype=torch.bfloat16) + 0.5
            xd, sd = x.double(), kernels.silu_mul(gu).double()
            xn = xd * torch.rsqrt(xd.pow(2).mean() + 1e-5) * nw.double()
            for bk, warps, waves in ((256, 4, 8), (512, 8, 16), (256, 2, 1)):
                t = quant_triton.Tiles(1, 32, warps, 2, waves, gemv=True, bk=bk)
                what = "wide K tile %d (waves %d) %s [%d, %d]" % (bk, waves, layout, n, k)
                for how, fn, want in (
                        ("", lambda: quant_triton.fp8_linear(x, wt, sc, blk, tiles=t), xd @ wd.t()),
                        (" SwiGLU inside", lambda: quant_triton.fp8_linear(gu, wt, sc, blk, tiles=t, silu=True),
                         sd @ wd.t()),
                        (" norm inside", lambda: quant_triton.fp8_norm_linear(x, None, nw, 1e-5, False, wt, sc, blk,
                                                                              tiles=t)[1], xn @ wd.t())):
                    err = ((fn().double() - want).abs().max() / want.abs().max()).item()
                    check(err < 2 ** -7, "%s%s: relative error %.3g" % (what, how, err))

    # The fast int4 kernels (quant_triton.INT4_FAST) and the ones they
    # replace, whatever the flag: odd widths, split K, groups of 64,
    # bfloat16 scales, every row class.
    for dtype in (torch.bfloat16, torch.float16):
        for n, k, grp, M in ((2048, 2048, 128, 1), (1000, 384, 128, 1), (28672, 4096, 128, 1), (640, 512, 64, 1),
                             (512, 8192, 128, 3), (3072, 2048, 128, 16), (1000, 384, 128, 17), (640, 1024, 64, 32),
                             (4096, 14336, 128, 64), (2048, 2048, 128, 200)):
            q = torch.randint(0, 16, (k, n), device=dev, dtype=torch.int32)
            c = quant.QWeight("int4", n, k, qw=quant.pack4(q), scales=(torch.rand(k // grp, n, device=dev) * 0.01 + 0.001).bfloat16(),
                              zeros=torch.randint(0, 17, (k // grp, n), device=dev).half(), group=grp)
            x = torch.randn(M, k, device=dev, dtype=dtype)
            want = x.float() @ c.dequant(torch.float32).t()
            tiles = [quant_triton.tiles_for(M, "int4", n, fast) for fast in (False, True)]
            if M == 1:  # the fast row loop, packed (INT4_H2) and not
                tiles.append(tiles[-1].replaced(h2=not tiles[-1].h2))
            for t in tiles:
                got = quant_triton.int4_linear(x, c.t["qw"], c.t["scales"], c.t["zeros"], grp, tiles=t).float()
                err = ((got - want).abs().max() / want.abs().max()).item()
                check(err < 2e-2, "int4 %r [%d, %d] g%d x %d rows %s: relative error %.3g" % (t, n, k, grp, M, dtype, err))

    # The packed row loop's float16 arithmetic (quant_triton.INT4_H2) at
    # its edges: inputs in the thousands (x enters over 16, a word's four
    # products summed in float16) and at 1, nibbles and zeros at 0 and 15,
    # within a few float16 roundings of each word's sum of a float64
    # product.
    for dtype in (torch.bfloat16, torch.float16):
        n, k = 1536, 4096
        q = torch.randint(0, 16, (k, n), device=dev, dtype=torch.int32)
        q[:, :8] = 15
        q[:, 8:16] = 0
        zeros = torch.randint(0, 16, (k // 128, n), device=dev).half()
        zeros[:, :16:2] = 0
        zeros[:, 1:16:2] = 15
        c = quant.QWeight("int4", n, k, qw=quant.pack4(q), scales=(torch.rand(k // 128, n, device=dev) * 0.01 + 0.001).half(),
                          zeros=zeros, group=128)
        t = quant_triton.tiles_for(1, "int4", n, True).replaced(h2=True)
        for scale in (1.0, 2000.0):
            x = (torch.randn(1, k, device=dev) * scale).to(dtype)
            want = x.double() @ c.dequant(torch.float64).t()
            got = quant_triton.int4_linear(x, c.t["qw"], c.t["scales"], c.t["zeros"], 128, tiles=t).double()
            err = ((got - want).abs().max() / want.abs().max()).item()
            check(torch.isfinite(got).all().item() and err < 4e-3,
                  "int4 packed row loop %s, |x| ~%g: relative error %.3g" % (dtype, scale, err))

    # A per-product entry's h2 does not turn the packed row loop back on
    # where INT4_H2 is off (quant.py's self-check turns it off where it
    # fails), and the built-in int4 entries compute the product.
    saved_h2, saved_table = quant_triton.INT4_H2, dict(tile_table.SHAPE_TILES)
    try:
        quant_triton.INT4_H2 = False
        tile_table.SHAPE_TILES[("int4fast", 1, 1536, 4096)] = {"h2": True, "bn": 32}
        t = quant_triton.tiles_for(1, "int4", 1536, K=4096)
        check(not t.h2 and t.bn == 32, "an h2 entry with INT4_H2 off: %r" % t)
        # A wide K tile's entry is passed over whole while FP8_WIDE is off.
        tile_table.SHAPE_TILES[("fp8", 1, 1536, 4096)] = {"bk": 256, "bn": 32}
        tile_table.SHAPE_TILES[("fp8", 1, 1536, 2048)] = {"bk": 64, "bn": 32}
        saved_wide = quant_triton.FP8_WIDE
        try:
            for wide in (True, False):
                quant_triton.FP8_WIDE = wide
                t, t2 = (quant_triton.tiles_for(1, "fp8", 1536, K=k) for k in (4096, 2048))
                check((t.bk, t.bn) == ((256, 32) if wide else (128, 64)) and (t2.bk, t2.bn) == (64, 32),
                      "FP8_WIDE %s: a wide entry reads %r, a narrow one %r" % (wide, t, t2))
        finally:
            quant_triton.FP8_WIDE = saved_wide
    finally:
        quant_triton.INT4_H2 = saved_h2
        tile_table.SHAPE_TILES.clear()
        tile_table.SHAPE_TILES.update(saved_table)
    for (kind, rows, n, k), fields in tile_table.SHAPE_TILES.items():
        if kind != "int4fast":
            continue
        q = torch.randint(0, 16, (k, n), device=dev, dtype=torch.int32)
        c = quant.QWeight("int4", n, k, qw=quant.pack4(q), scales=(torch.rand(k // 128, n, device=dev) * 0.01 + 0.001).half(),
                          zeros=torch.randint(0, 16, (k // 128, n), device=dev).half(), group=128)
        x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
        want = x.float() @ c.dequant(torch.float32).t()
        err = ((quant.linear(x, c).float() - want).abs().max() / want.abs().max()).item()
        check(err < 2e-2, "int4fast entry %r [%d, %d]: relative error %.3g" % (fields, n, k, err))

    # Per-product tiles (tile_table.SHAPE_TILES) on the GPU: an entry
    # moves its own product's tile and no other (another K, two rows, a
    # 16-bit weight of the same shape, int4's other kernels), each kernel
    # kind runs the entry's fields (the tile _plan receives, recorded),
    # and the product is still the product.
    saved = dict(tile_table.SHAPE_TILES)
    plan, ran = quant_triton._plan, []

    def recording_plan(M, N, K, unit, sms, t):
        ran.append(t)
        return plan(M, N, K, unit, sms, t)

    try:
        tile_table.SHAPE_TILES.clear()
        tile_table.SHAPE_TILES.update(table)
        t = quant_triton.tiles_for(1, "fp8", 4096, K=4096)
        check((t.bn, t.warps, t.bk, t.waves, t.gemv) == (128, 4, 64, 4, True), "tiles_for fp8 4096x4096: %r" % t)
        for what, args in (("another K", (1, "fp8", 4096, None, 2048)), ("two rows", (2, "fp8", 4096, None, 4096)),
                           ("a 16-bit weight", (1, "w16", 4096, None, 4096)),
                           ("int4's previous kernels", (1, "int4", 4096, False, 4096))):
            check(repr(quant_triton.tiles_for(*args)) == repr(quant_triton.tiles_for(*args[:4])),
                  "%s took the 4096x4096 entry" % what)
        t = quant_triton.tiles_for(1, "int4", 4096, True, K=4096)
        check((t.bn, t.warps, t.bk, t.waves, t.fast) == (512, 8, 64, 4, True), "tiles_for int4fast: %r" % t)
        quant_triton._plan = recording_plan
        n = k = 4096
        w = torch.randn(n, k, device=dev) / k ** 0.5
        s = w.abs().amax(1, keepdim=True) / 448
        c = quant.QWeight("fp8", n, k, w=(w / s).clamp(-448, 448).to(torch.float8_e4m3fn),
                          scale=torch.rand(n // 128, k // 128, device=dev) * 0.01, block=(128, 128))
        wd = c.dequant(torch.float64)
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        nw = torch.rand(k, device=dev, dtype=torch.bfloat16) + 0.5
        xn = x.double() * torch.rsqrt(x.double().pow(2).mean() + 1e-5) * nw.double()
        products = [("fp8 row loop", lambda: quant_triton.fp8_linear(x, c.t["w"], c.t["scale"], c.t["block"]),
                     x.double() @ wd.t(), (128, 4, 4)),
                    ("fp8 norm inside", lambda: quant_triton.fp8_norm_linear(x, None, nw, 1e-5, False, c.t["w"],
                                                                             c.t["scale"], c.t["block"])[1],
                     xn @ wd.t(), (32, 2, 8))]
        if torch.cuda.get_device_capability(dev) >= (8, 9):  # W8A8: the activations' rounding too (w8a8.TOLERANCE)
            from mlxsworker.torchrt import w8a8
            x64 = torch.randn(64, k, device=dev, dtype=torch.bfloat16)
            products.append(("fp8_mma 64 rows", lambda: quant_triton.fp8_mma(x64, c.t["w"], c.t["scale"], c.t["block"]),
                             x64.double() @ wd.t(), (128, 4, 1), w8a8.TOLERANCE))
        q = torch.randint(0, 16, (k, n), device=dev, dtype=torch.int32)
        c4 = quant.QWeight("int4", n, k, qw=quant.pack4(q), scales=(torch.rand(k // 128, n, device=dev) * 0.01).half(),
                           zeros=torch.full((k // 128, n), 8.0, device=dev).half(), group=128)
        if quant_triton.INT4_FAST:
            products.append(("int4 fast one row",
                             lambda: quant_triton.int4_linear(x, c4.t["qw"], c4.t["scales"], c4.t["zeros"], 128),
                             x.double() @ c4.dequant(torch.float64).t(), (512, 8, 4)))
        for what, fn, want, fields, *tol in products:
            ran.clear()
            err = ((fn().double() - want).abs().max() / want.abs().max()).item()
            check(err < (tol or [2e-2])[0], "%s under SHAPE_TILES: relative error %.3g" % (what, err))
            got = [(t.bn, t.warps, t.waves) for t in ran]
            check(got == [fields], "%s ran %r, not its entry's %r" % (what, ran, fields))
    finally:
        quant_triton._plan = plan
        tile_table.SHAPE_TILES.clear()
        tile_table.SHAPE_TILES.update(saved)

print("%d passed, 0 failed" % passed)
