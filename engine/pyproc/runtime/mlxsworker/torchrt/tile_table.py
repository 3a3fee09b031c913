"""Per-product launch tiles over quant_triton's table by rows.

quant_triton.tiles_for picks a product's tile by its row count (and int4's
width); SHAPE_TILES holds the products where one shape's best differs:
(kind, rows, N, K) -> the fields that differ from the table's. kind:
"fp8" (FP8 weights, the row loop or the weight-only tile), "w16" (16-bit
weights through the row loop with unit scales), "fp8norm" / "w16norm"
(the norm inside the one-row product, quant_triton.fp8_norm_linear),
"mma" (fp8_mma), "int4" / "int4fast" (int4's kernels, the fast ones
apart); rows: the product's row count as the table buckets it (1, 16,
32, 64; 0 past 64).

No Triton here: quant.py imports this at the worker's start, so a bad
MLXSERVING_TILES stops the worker there rather than costing it its
kernels (their import is allowed to fail, and the worker then runs
plain torch).
"""
import os

# Measured per product on an H200 by cmd/gpubench/rowloop_sweep.py
# (weights rotated past L2, as decode streams them) and kept where decode
# gained end to end, the 8B shape:
# - FP8 at one row: down with SwiGLU inside 19.26 -> 18.52 us, gate/up
#   34.13 -> 33.02 (decode 346.1 -> 352.6 tok/s with o's entry since
#   replaced below; gate/up's entry runs where its norm is not inside:
#   NORM_FUSE off, adapters, FP8_WIDE off);
# - gate/up with the norm inside: 35.91 -> 34.2 us, which made fusing it
#   win (decode 354.1 -> 355.9; quant.norm_fits), its entry since
#   replaced by the wide one below;
# - down at 64 rows (fp8_mma), four waves: 30.65 -> 29.14 us (decode
#   1.007x), since replaced below;
# - q/k/v and o at 64 rows with the weight through TMA, five stages and
#   no K split beyond one program an SM (rowloop_sweep.py mmatma-8b):
#   15.11 -> 13.28 us and 11.37 -> 10.72 (decode at batch 64 1.025x,
#   15,376 -> 15,768 tok/s, two rounds alternating); down at 64 rows
#   with its input's codes through TMA too, two waves, four stages
#   (mmatma-8b.down): 26.45 -> 24.34 us;
# - int4 (GPTQ) at one row, the packed row loop: o 8.18 -> 7.71 us (decode
#   374.4 -> 376.1 tok/s, two rounds).
# The 1B shape, int4 at one row (per product, rowloop_sweep.py
# int4h2tiles-1b): qkv 6.25 -> 5.43 us, o 5.57 -> 4.85, down 9.22 ->
# 8.16, and gate/up 13.53 -> 10.85 in the packed loop where the 8B's
# wider gate/up keeps the unpacked one (decode 1,206 -> 1,304 tok/s).
# K tiles over two and four scale blocks (256 and 512 inputs,
# quant_triton._fp8_wide; rowloop_sweep.py fp8wide-S and w16wide-S), one
# row, per product in us (the FP8 8B down keeps its tile: none won):
# - 8B FP8: qkv (norm inside) 10.18 -> 9.84, o 7.94 -> 7.59, gate/up
#   (norm inside) 34.32 -> 29.86 (decode 365.3 -> 385.4 tok/s);
# - 8B bf16: qkv (norm inside) 17.25 -> 15.77, o 11.81 -> 11.54, gate/up
#   57.89 -> 55.36 (decode 233.1 -> 237.6);
# - 1B FP8: qkv 5.84 -> 5.63, o 5.27 -> 4.94, gate/up 11.52 -> 10.53,
#   down 9.31 -> 8.19; 1B bf16: qkv 7.08 -> 6.69, o 6.36 -> 5.71,
#   gate/up 20.37 -> 17.85, down 13.10 -> 12.05 (decode 1,018 -> 1,103).
SHAPE_TILES = {
    ("fp8", 1, 4096, 4096): {"bn": 64, "warps": 8, "stages": 2, "waves": 4, "bk": 256},
    ("fp8", 1, 28672, 4096): {"bn": 32, "waves": 16},
    ("fp8", 1, 4096, 14336): {"bn": 32, "waves": 16},
    ("fp8norm", 1, 6144, 4096): {"bn": 32, "warps": 2, "stages": 2, "waves": 8, "bk": 512},
    ("fp8norm", 1, 28672, 4096): {"bn": 32, "warps": 4, "stages": 2, "waves": 4, "bk": 256},
    ("w16norm", 1, 6144, 4096): {"bn": 32, "warps": 2, "stages": 2, "waves": 8, "bk": 256},
    ("w16", 1, 4096, 4096): {"bn": 64, "warps": 2, "stages": 2, "waves": 8, "bk": 256},
    ("w16", 1, 28672, 4096): {"bn": 16, "warps": 4, "stages": 2, "waves": 4, "bk": 512},
    ("fp8norm", 1, 3072, 2048): {"bn": 32, "warps": 4, "stages": 2, "waves": 16, "bk": 256},
    ("fp8", 1, 2048, 2048): {"bn": 32, "warps": 4, "stages": 2, "waves": 16, "bk": 256},
    ("fp8norm", 1, 16384, 2048): {"bn": 16, "warps": 2, "stages": 2, "waves": 4, "bk": 512},
    ("fp8", 1, 2048, 8192): {"bn": 64, "warps": 8, "stages": 2, "waves": 16, "bk": 256},
    ("w16norm", 1, 3072, 2048): {"bn": 32, "warps": 4, "stages": 2, "waves": 16, "bk": 256},
    ("w16", 1, 2048, 2048): {"bn": 16, "warps": 2, "stages": 2, "waves": 16, "bk": 256},
    ("w16norm", 1, 16384, 2048): {"bn": 32, "warps": 4, "stages": 2, "waves": 4, "bk": 256},
    ("w16", 1, 2048, 8192): {"bn": 16, "warps": 4, "stages": 2, "waves": 4, "bk": 512},
    ("mma", 64, 4096, 14336): {"stages": 4, "waves": 2, "tma": 2},
    ("mma", 64, 6144, 4096): {"stages": 5, "waves": 1, "tma": 1},
    ("mma", 64, 4096, 4096): {"stages": 5, "waves": 1, "tma": 1},
    ("int4fast", 1, 4096, 4096): {"bn": 32, "stages": 3},
    ("int4fast", 1, 3072, 2048): {"bn": 32, "stages": 3, "waves": 16},
    ("int4fast", 1, 2048, 2048): {"bn": 32, "stages": 3, "waves": 16},
    ("int4fast", 1, 16384, 2048): {"bn": 128, "warps": 2, "stages": 3, "waves": 16, "bk": 128, "h2": True},
    ("int4fast", 1, 2048, 8192): {"bn": 32, "stages": 2},
}

KINDS = ("fp8", "w16", "fp8norm", "w16norm", "mma", "int4", "int4fast")
ROWS = (1, 16, 32, 64, 0)

# The fields an entry may set, by the tokens quant_triton.Tiles' repr
# writes, and the values each takes.
_FIELDS = {"bm": "bm", "bn": "bn", "w": "warps", "s": "stages", "waves": "waves", "bk": "bk"}
_POW2 = ("bm", "bn", "bk")
# The fields an entry sets by a word alone: word -> (field, value).
_FLAGS = {"swap": ("swap", True), "noswap": ("swap", False), "h2": ("h2", True), "noh2": ("h2", False),
          "tma": ("tma", 1), "tma2": ("tma", 2), "notma": ("tma", 0)}


def parse(spec):
    """SHAPE_TILES entries from "kind:rows:NxK=fields;..." with fields as
    quant_triton.Tiles' repr writes the numeric ones ("bn128 w4 bk64 s2
    waves4"; bm, bn and bk powers of two, warps 1 to 16), "swap" or
    "noswap" for fp8_mma's transposed tile, "tma", "tma2" or "notma" for
    its weight (and its input's codes) through TMA descriptors, and "h2"
    or "noh2" for int4's packed row loop. A malformed entry raises ValueError naming it."""
    out = {}
    for entry in filter(None, (e.strip() for e in spec.split(";"))):
        try:
            key, fields = entry.split("=", 1)
            kind, rows, shape = key.split(":")
            if kind not in KINDS:
                raise ValueError("kind %r is none of %s" % (kind, ", ".join(KINDS)))
            if int(rows) not in ROWS:
                raise ValueError("rows %s is none of %s" % (rows, ", ".join(map(str, ROWS))))
            n, k = (int(v) for v in shape.lower().split("x"))
            if n < 1 or k < 1:
                raise ValueError("shape %s" % shape)
            kw = {}
            for tok in fields.split():
                if tok in _FLAGS:
                    field, v = _FLAGS[tok]
                    kw[field] = v
                    continue
                name = tok.rstrip("0123456789")
                if name not in _FIELDS or name == tok:
                    raise ValueError("field %r (want %s followed by a number, or one of %s)"
                                     % (tok, ", ".join(_FIELDS), ", ".join(_FLAGS)))
                v = int(tok[len(name):])
                if v < 1 or name in _POW2 and v & (v - 1) or name == "w" and v > 16:
                    raise ValueError("field %r out of range" % tok)
                kw[_FIELDS[name]] = v
            if not kw:
                raise ValueError("no fields")
            out[(kind, int(rows), n, k)] = kw
        except ValueError as e:
            raise ValueError("MLXSERVING_TILES: bad entry %r (want kind:rows:NxK=bn64 w4 ...): %s" % (entry, e))
    return out


def from_env(table, spec):
    """table with MLXSERVING_TILES' spec over it: its entries added, or
    none at all for "none" (the table by rows alone: the other side of
    an A/B on one binary)."""
    if spec.strip() == "none":
        return {}
    out = dict(table)
    out.update(parse(spec))
    return out


SHAPE_TILES = from_env(SHAPE_TILES, os.environ.get("MLXSERVING_TILES", ""))


def rows_bucket(M):
    """The table's row bucket of M rows."""
    return 1 if M == 1 else 16 if M <= 16 else 32 if M <= 32 else 64 if M <= 64 else 0


# The row loop's kinds, whose entries may ask for K tiles wider than one
# scale block (bk past 128: quant_triton._fp8_wide).
ROW_KINDS = ("fp8", "w16", "fp8norm", "w16norm")


def entry(kind, rows, N, K, wide=True):
    """SHAPE_TILES' fields for the product, or None. Without wide
    (quant_triton.FP8_WIDE off) a row-loop entry for wide K tiles is
    passed over whole: its other fields were chosen for the wide tile
    (the 8B's FP8 decode at its wide entries read narrow ran 315 tok/s,
    against 365 at the table's)."""
    kw = SHAPE_TILES.get((kind, rows, N, K))
    if kw and not wide and kind in ROW_KINDS and kw.get("bk", 0) > 128:
        return None
    return kw


def norm_tiled(w, N, K, wide=True):
    """Whether SHAPE_TILES holds a tile for the norm inside w's one-row
    product (quant.norm_fits takes the product then, past its bounds);
    wide: as entry's."""
    return entry("fp8norm" if w.element_size() == 1 else "w16norm", 1, N, K, wide) is not None
