"""Triton kernels for the LoRA delta of a step (lora.py's SegmentPlan):
segmented gather matmuls in the manner of Punica's SGMV and vLLM's
lora_shrink / lora_expand.

The step's rows are sorted by adapter slot once (lora.segments, on the
device: no host sync, so CUDA graphs capture it); start[s] .. start[s +
1] are the positions in that order of the rows of slot s (device slot
s + 1), and the base's rows come last, outside every segment. Each projection then
takes two kernels, whatever the number of adapters or their modules:

- shrink: t[row, :] = x[row] @ A[s]^T for every row of slot s, where
  A[s] is the slot's [m * R, in] (the m packed modules' A stacked), t
  float32 [N, m * R], as partial sums over slices of the input dimension
  when the rows are few (split-K). Grid (programs over the row tiles,
  slices).
- expand: y[row, cols] += t[row, j * R : (j + 1) * R] @ B[s][:, cols]
  (t's partial sums added first, in order),
  B[s] the slot's [R, out] (the modules' B^T side by side), j the module
  whose columns the tile covers. Grid (programs over the row tiles,
  groups of column tiles): a program sums a row tile's partial sums
  once and runs a group of column tiles with them, the group wider
  where the rows are many (_column_tiles).

A row tile holds rows of one slot; a program runs every n-th of the
step's row tiles (their count read on the device), n about rows / BM,
so an empty slot costs no program. Rows of the base are never read or
written. Each slot's weights are read once per
row tile, so a step reads the A and B of the adapters it runs, not of
every slot, and its FLOPs are its rows' own (rank R), not every slot's.
The grids depend on the row count and the slot count only, so one CUDA
graph per batch bucket covers any mix of adapters.

Rounding follows lora.DensePlan: t rounded to the weights' dtype before
the expand, products accumulated in float32, the delta added to y in
float32 and rounded once. float32 weights multiply in IEEE float32 (no
TF32), so the float32 tolerances of the CUDA tests hold.

delta runs both; shrink and expand are also called apart, so the shrink
can run on a second stream beside the base projection (lora.SegmentPlan
.begin).

Imported only where torch runs on CUDA and Triton imports; lora.Slots
checks the kernels against DensePlan on the first adapter it loads and
keeps DensePlan where they disagree or fail.
"""
import torch
import triton
import triton.language as tl

# Column tiles of the expand, widest first: a projection's tile is the
# widest that divides every module's width, so no tile straddles two
# modules (usable checks that the narrowest does).
EXPAND_COLS = (128, 64, 32, 16)


@triton.jit
def _tile_rows(order_ptr, start_ptr, tstart_ptr, p, n_slots, BM: tl.constexpr, SP: tl.constexpr):
    """The slot s, rows and live mask of row tile p of the step (p below
    the step's tile count): tstart[s] is the first tile of slot s."""
    i = tl.arange(0, SP)
    ts = tl.load(tstart_ptr + i, mask=i <= n_slots, other=2147483647)
    s = tl.sum((ts <= p).to(tl.int32), axis=0) - 1  # the last slot whose first tile is at or before p
    tile = p - tl.load(tstart_ptr + s)
    at = tl.load(start_ptr + s) + tile * BM + tl.arange(0, BM)
    live = at < tl.load(start_ptr + s + 1)
    rows = tl.load(order_ptr + at, mask=live, other=0)
    return s, rows, live


# Triton compiles a kernel again for each new value of its compile-time
# arguments and for integers that turn 1 or a multiple of 16: the
# arguments that change that way with the step's rows are kept out of
# it (the row tiles' programs; the partial sums' stride, a multiple of
# 16 or not with odd rows at ranks of 8 mod 16), so the variants a
# model's steps launch are few and known (variants), and lora.Slots
# compiles them all at the first adapter load, not during a step. The
# input slice k_split stays specialized: always a multiple of BK, it
# keeps the loads of x and A aligned, and vectorized.
@triton.jit(do_not_specialize=["n_progs", "st_split"])
def _shrink_kernel(x_ptr, a_ptr, t_ptr, order_ptr, start_ptr, tstart_ptr, n_slots, n_progs, n_in, k_split, mr, sx, sa_slot, sa_row,
                   st, st_split, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SP: tl.constexpr, PREC: tl.constexpr):
    part = tl.program_id(1)
    cols = tl.arange(0, BN)
    cm = cols < mr
    k_lo = part * k_split
    k_hi = tl.minimum(k_lo + k_split, n_in)
    for p in range(tl.program_id(0), tl.load(tstart_ptr + n_slots), n_progs):  # the step's row tiles, n_progs apart
        s, rows, live = _tile_rows(order_ptr, start_ptr, tstart_ptr, p, n_slots, BM, SP)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            ks = k0 + tl.arange(0, BK)
            km = ks < k_hi
            xb = tl.load(x_ptr + rows[:, None] * sx + ks[None, :], mask=live[:, None] & km[None, :], other=0.0)
            ab = tl.load(a_ptr + s * sa_slot + cols[None, :] * sa_row + ks[:, None], mask=km[:, None] & cm[None, :], other=0.0)
            acc += tl.dot(xb, ab, input_precision=PREC)
        tl.store(t_ptr + part * st_split + rows[:, None] * st + cols[None, :], acc, mask=live[:, None] & cm[None, :])


@triton.jit(do_not_specialize=["n_progs", "st_split"])
def _expand_kernel(t_ptr, b_ptr, y_ptr, order_ptr, start_ptr, tstart_ptr, n_slots, n_progs, n_out, r, off1, off2, st, st_split,
                   sb_slot, sb_row, sy, BM: tl.constexpr, BN: tl.constexpr, CT: tl.constexpr, BR: tl.constexpr,
                   SPLIT: tl.constexpr, SP: tl.constexpr, PREC: tl.constexpr):
    c0 = tl.program_id(1) * (BN * CT)  # CT column tiles of BN, all in one module
    j = (c0 >= off1).to(tl.int32) + (c0 >= off2).to(tl.int32)  # the module of these columns
    rr = tl.arange(0, BR)
    rm = rr < r
    for p in range(tl.program_id(0), tl.load(tstart_ptr + n_slots), n_progs):  # the step's row tiles, n_progs apart
        s, rows, live = _tile_rows(order_ptr, start_ptr, tstart_ptr, p, n_slots, BM, SP)
        tp = t_ptr + rows[:, None] * st + (j * r + rr)[None, :]
        tm = live[:, None] & rm[None, :]
        t = tl.load(tp, mask=tm, other=0.0)
        for part in tl.static_range(1, SPLIT):  # the shrink's partial sums over its slices of the input, in order
            t += tl.load(tp + part * st_split, mask=tm, other=0.0)
        t = t.to(b_ptr.dtype.element_ty)
        for c in range(CT):  # the partial sums read once for the program's column tiles
            cols = c0 + c * BN + tl.arange(0, BN)
            cm = cols < n_out
            b = tl.load(b_ptr + s * sb_slot + rr[:, None] * sb_row + cols[None, :], mask=rm[:, None] & cm[None, :], other=0.0)
            d = tl.dot(t, b, input_precision=PREC)
            yp = y_ptr + rows[:, None] * sy + cols[None, :]
            ym = live[:, None] & cm[None, :]
            y = tl.load(yp, mask=ym, other=0.0)
            tl.store(yp, (y.to(tl.float32) + d).to(y.dtype), mask=ym)


def usable(widths, rank, dtype):
    """Whether the kernels cover slots of rank rank (lora.Slots.R) in
    dtype over projections of module widths widths (every module's output
    width, under tensor parallel the rank's): the expand's column tiles
    must not straddle modules, and the rank fits one tile."""
    return (dtype in (torch.bfloat16, torch.float16, torch.float32) and rank <= 128
            and all(o % EXPAND_COLS[-1] == 0 for o in widths))


# Row tiles of the kernels, the shrink's always and the expand's by the
# rows (lora.segments numbers each slot's tiles of these sizes).
ROW_TILES = (16, 64)


def _expand_rows(n):
    """The expand's row tile for n rows: one of ROW_TILES (segments
    numbers the tiles of those sizes only)."""
    return ROW_TILES[0] if n <= 64 else ROW_TILES[1]


# Launch shapes (cmd/gpubench/lora_kernels_sweep.py times the choices):
# the programs a kernel aims to keep working (the shrink's input slices,
# the expand's column groups), and the programs along the rows beyond
# one a full row tile (for the partial tiles of the slots in use; a
# program runs every n_progs-th tile, so fewer still cover them).
PROGRAMS = 128
ROW_SLACK = 8
# The shrink's input tile and slices; warps a program (measured at rank 16:
# higher ranks take 4, whose accumulators 2 warps' registers would spill).
SHRINK_BK, SPLIT_MAX, SHRINK_WARPS, EXPAND_WARPS = 128, 16, 2, 2


def _programs(n, bm, slots):
    """Programs along the rows for a step of n rows in tiles of bm: its
    row tiles number at most cdiv(n, bm) plus one partial tile a slot in
    use; those past the step's count return after one load."""
    return triton.cdiv(n, bm) + min(slots, n, ROW_SLACK)


def _column_tiles(n_tiles, row_tiles, bounds):
    """Column tiles an expand program runs (a power of two, at most 16):
    as many as keep some PROGRAMS working for the step's row tiles
    (row_tiles, at least), so the partial sums of a row tile are read
    once for several tiles where the rows are many, and a program per
    tile where they are few; its columns never straddle a module
    (bounds: the modules' ends, in tiles, each a multiple)."""
    ct = 1
    while ct < 16 and (n_tiles // (2 * ct)) * row_tiles >= PROGRAMS and all(b % (2 * ct) == 0 for b in bounds):
        ct *= 2
    return ct


def _pow2(n, least=16):
    return max(least, triton.next_power_of_2(n))


def delta(y, x, A, B, offsets, order, start, tiles):
    """y += each row's adapter delta in place: x [N, in], A [S, m, R, in]
    the projection's stacked A, B [S, R, out] the modules' B^T side by
    side (columns of module j from offsets[j]), (order, start, tiles)
    from lora.segments. Returns y."""
    return expand(y, shrink(x, A, order, start, tiles), B, offsets, order, start, tiles)


def shrink(x, A, order, start, tiles):
    """The shrink of delta: x [N, in] by each row's slot's A (A [S, m, R,
    in]), as float32 partial sums t [split, N, m * R] over slices of the
    input (expand adds them). Needs x alone, so it can run beside the
    base projection (lora.SegmentPlan.begin)."""
    N = x.shape[0]
    S, m, R, n_in = A.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    assert m <= 3 and A.is_contiguous()
    mr, bm, sp = m * R, ROW_TILES[0], triton.next_power_of_2(S + 1)
    bk, split, k_split = _shrink_shape(N, m, R, n_in)
    t = torch.empty(split, N, mr, device=x.device, dtype=torch.float32)
    progs = _programs(N, bm, S)
    _shrink_kernel[(progs, split)](x, A, t, order, start, tiles[bm], S, progs, n_in, k_split, mr, x.stride(0), A.stride(0),
                                   A.stride(2), t.stride(1), t.stride(0), BM=bm, BN=_pow2(mr), BK=bk, SP=sp,
                                   PREC=_precision(A.dtype), num_warps=SHRINK_WARPS if _pow2(mr) <= 128 else 4)
    return t


def _shrink_shape(N, m, R, n_in):
    """(BK, split, k_split): the shrink's input tile for m modules of
    rank R, and the slices of the input its programs take for N rows
    (split of k_split columns each)."""
    # The shrink's A tile is [BK, m * R] rounded up: BK shrinks as the
    # packed rank grows, so a tile stays within 32 KB of half-precision
    # values and the pipeline's copies of it fit shared memory (split
    # q/k/v at rank 128 packs 384 columns).
    bk = min(SHRINK_BK, max(16, 16384 // _pow2(m * R)))
    # The shrink splits the input dimension among programs when the rows
    # are few (a program streams its slot's A alone: one program reading
    # a whole [m * R, 4096] A runs at a fraction of the GPU's bandwidth),
    # each writing its partial product; the expand sums them in order
    # (deterministic, no atomics).
    # The expand holds a row tile's partial sums at once (SPLIT of [BM,
    # BR] float32): at most 16 KB of them where there are several (one
    # slice is all a wide tile of a high rank gets), or a wide tile
    # overflows the registers and shared memory (Phi-3's rank 64 at 300
    # rows asked for 237 KB of shared memory).
    cap = max(1, 16384 // (_expand_rows(N) * _pow2(R) * 4))
    split = max(1, min(SPLIT_MAX, cap, PROGRAMS // triton.cdiv(N, ROW_TILES[0]), n_in // (4 * bk)))
    k_split = triton.cdiv(triton.cdiv(n_in, split), bk) * bk
    return bk, triton.cdiv(n_in, k_split), k_split


def expand(y, t, B, offsets, order, start, tiles):
    """The expand of delta: y += each row's partial sums t (shrink's,
    [split, N, m * R]) by its slot's B ([S, R, out], the m modules' B^T
    side by side from offsets). Returns y."""
    split, N, mr = t.shape
    S, m = B.shape[0], len(offsets)
    R = mr // m
    assert m <= 3 and y.stride(1) == 1 and B.stride(2) == 1 and B.shape[1] == R
    n_out = B.shape[2]
    off = list(offsets[1:]) + [n_out] * (3 - len(offsets))
    bm, cols, ct = _expand_shape(N, n_out, offsets)
    progs = _programs(N, bm, S)
    _expand_kernel[(progs, triton.cdiv(n_out, cols * ct))](
        t, B, y, order, start, tiles[bm], S, progs, n_out, R, off[0], off[1], t.stride(1), t.stride(0), B.stride(0), B.stride(1),
        y.stride(0), BM=bm, BN=cols, CT=ct, BR=_pow2(R), SPLIT=split, SP=triton.next_power_of_2(S + 1),
        PREC=_precision(B.dtype), num_stages=2, num_warps=EXPAND_WARPS if _pow2(R) <= 32 else 4)
    return y


def _expand_shape(N, n_out, offsets):
    """(BM, BN, CT): the expand's row tile for N rows, its column tile
    (the widest that divides every module's width, so none straddles
    two modules) and the column tiles a program runs, over modules
    starting at offsets of n_out columns."""
    off = list(offsets[1:]) + [n_out]
    cols = next(c for c in EXPAND_COLS if all(o % c == 0 for o in off))
    bm = _expand_rows(N)
    return bm, cols, _column_tiles(n_out // cols, triton.cdiv(N, bm), [o // cols for o in off])


def variants(N, A, B, offsets):
    """What sets apart the compiled kernels delta launches for N rows over
    a projection of stacked A [S, m, R, in] and B [S, R, out] (modules
    from offsets): steps whose row counts give equal values launch
    kernels already compiled (see the kernels' do_not_specialize)."""
    _, m, R, n_in = A.shape
    return _shrink_shape(N, m, R, n_in)[:2] + _expand_shape(N, B.shape[2], offsets)


def _precision(dtype):
    """tl.dot's precision for weights of dtype (the kernels cast the
    other operand to it): IEEE for float32 (the CUDA tests' float32
    tolerances), else the tensor cores'."""
    return "ieee" if dtype == torch.float32 else "tf32"
