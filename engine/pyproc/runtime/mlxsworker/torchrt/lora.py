"""LoRA adapters served over a loaded decoder: a pool of device slots and
the batched delta of a step whose rows run with different adapters.

Slots: each packed projection of each layer (decoder.py: "qkv" = q, k, v
concatenated, "o", "gate_up" = gate then up, "down") has a stacked A
[slots, m, R, in] and, per packed module j, a stacked B_j^T
[slots, R, out_j]: R the highest rank served, rounded up to a multiple
of 8 (every adapter zero-padded to it), m the modules packed in the
projection (3 for split q/k/v, 2 for gate/up, 1 for the rest and for
Phi-3's fused qkv_proj and gate_up_proj), the adapter's scale folded
into B; the B_j^T of a projection are column slices of one [slots, R,
out] (SegmentPlan's expand reads it whole). Slot-major, so a slot's A is
one contiguous [m * R, in] matrix. A module an adapter does not target
stays zero, so its part of the packed delta is zero. The tensors are
allocated when the first adapter is loaded (a model that never serves
one takes nothing). A row of the base has device slot 0, a row of
supervisor slot k device slot k + 1 (stored at index k).

A step: each packed token row has a device slot. The delta of module j
of projection P for a row of slot s is (x A_j,s^T) B_j,s^T, added to
module j's columns of P's output. Three plans compute it:

- Plan (host): two GEMMs per module per distinct adapter of the step
  (the rows of a sequence are contiguous, so an adapter run by one
  sequence reads a slice, no gather). Prompt chunks that run eagerly
  (no prompt-step graphs, or their capture with the delta failed).
- DensePlan: over every slot at once, from the rows' slots as a device
  tensor alone (no sort, no host sync, no grouped GEMM): one GEMM of x
  by every slot's A (A viewed as [slots * m * R, in]), the products of
  the slots other than each row's own set to zero (one torch.where,
  written module-major), then per module one GEMM of those
  [N, slots * R] by the module's stacked B^T viewed as [slots * R,
  out_j], added in place to its columns: 2 + m kernels per projection.
  The zeroed products add exact zeros, so each row gets its own
  adapter's delta. It reads every slot's A and B each step: a rank-16
  slot of an 8B llama is ~85 MB, so 8 slots add ~4% to the weights a
  decode step reads, 32 slots ~17% (fine to some 32 slots of rank 16;
  the cost grows with slots * R). Its FLOPs grow the same way: on prompt
  chunks, where the weights are read once for many rows, 8 slots of rank
  16 add ~5% to an 8B llama's projections, 32 slots ~19% (prefill.py).
  The CUDA decode graphs and the prompt-step graphs capture it with the
  slots as an input (graphs.py, prefill.py) where the segmented kernels
  do not run, or under settings.lora_plan "dense"; eager steps whose
  inputs are all one token use it too.
- SegmentPlan (the default on CUDA with the Triton kernels): the rows
  sorted by slot on the device (segments), then two Triton kernels a
  projection (lora_triton.py, Punica's SGMV): each adapter's weights
  read for its own rows, FLOPs of the rows' own rank, base rows
  untouched; it replaces both plans above, in the graphs too. At the
  first adapter load the kernels are checked against DensePlan
  (_check_kernels) and every variant a step can launch is compiled
  (warm); DensePlan serves where they disagree or a variant fails to
  build. Measured on an H200 (8B,
  8 adapters in 32 slots of rank 16, BENCHMARKS.md), the four
  projections' deltas of a layer take 33 µs at 1 row and 48 µs at 64
  rows, against DensePlan's 73 and 82 µs. Under settings.lora_side_stream
  each projection's shrink runs on a second stream beside the base
  projection's GEMM (SegmentPlan.begin; not measured yet, so off).

A step where no row has an adapter never reaches this module
(TorchModel checks first): the base alone pays nothing.

Tensor parallel (tp.py): every rank's slots hold the adapters' share
that matches its share of the base, so the deltas need no collective of
their own. The column-parallel projections (qkv, gate_up) keep A whole
and B_j^T's columns of the rank's output rows of module j (its heads, KV
heads, MLP columns), packed as the base packs its shard; the
row-parallel ones (o, down) keep A's columns of the rank's input share
and B whole, so each rank adds (x_rank A_rank^T) B^T to its partial
output and the all-reduce after the projection sums the whole delta.
The shapes come from the rank's config, so both plans and the decode
graphs run unchanged; load slices what it reads.
"""
import logging

import torch
import torch.nn.functional as F

from ..errors import INVALID, OUT_OF_MEMORY, CheckpointError, ProtocolError
from .st import SafetensorsFile
from .upload import to_device


log = logging.getLogger("lora")

# The projections split by input columns under tensor parallel (their A
# is cut, their B whole); the others are split by output rows.
ROW_PARALLEL = ("o", "down")


def projections(cfg, layer):
    """The adaptable packed projections of a decoder layer (its weights L
    as decoder.Decoder.load_layer built them): {name: (in, [(module,
    out), ...])}, modules in packing order; under tensor parallel cfg is
    the rank's, and so are the widths."""
    fam = cfg.family
    h, hd, H, K = cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads
    out = {}
    if fam.attn == "fused":
        out["qkv"] = (h, [("self_attn.qkv_proj", (H + 2 * K) * hd)])
    else:
        out["qkv"] = (h, [("self_attn.q_proj", H * hd), ("self_attn.k_proj", K * hd), ("self_attn.v_proj", K * hd)])
    out["o"] = (H * hd, [("self_attn.o_proj", h)])
    if "gate_up" in layer:  # a mixture-of-experts layer's experts are not adapted
        if fam.mlp == "fused":
            out["gate_up"] = (h, [("mlp.gate_up_proj", 2 * cfg.intermediate)])
        else:
            out["gate_up"] = (h, [("mlp.gate_proj", cfg.intermediate), ("mlp.up_proj", cfg.intermediate)])
        out["down"] = (cfg.intermediate, [("mlp.down_proj", h)])
    return out


class Slots:
    """The adapter slots of one model (see the module comment)."""

    def __init__(self, cfg, layers, device, dtype, slots, max_rank, plan="auto", tp=None, kernels=False, side_stream=False, rows=4096):
        if slots < 1 or max_rank < 1:
            raise ProtocolError(INVALID, "adapter slots %d and max rank %d must be positive" % (slots, max_rank))
        # R: the slots' rank, max_rank rounded up to a multiple of 8
        # (16-byte aligned rows of half-precision values for the GEMMs).
        self.device, self.dtype, self.n, self.rank, self.R = device, dtype, slots, max_rank, -(-max_rank // 8) * 8
        self.dense = plan == "dense"  # every step's delta through DensePlan, prompt chunks too (settings.lora_plan)
        self.tp = tp  # tp.Shard: cfg is the rank's, and load reads the rank's share (see the module comment)
        self.proj = [projections(cfg, L) for L in layers]
        self.names = [None] * slots  # the adapter resident in each slot (the supervisor's key)
        # Per layer {projection: A}, {projection: B} (the modules' B_j^T side
        # by side, [slots, R, out]) and {projection: [B_j^T]} (views of its
        # columns), allocated by the first load.
        self.A = self.Bcat = self.B = None
        # DensePlan's device constants: the device slots 1 .. slots, and a
        # zero (a Python scalar would be copied to the device at each use,
        # which graph capture refuses).
        self.ids = self.zero = None
        self.where = {}  # module -> (projection, its index in the packing), over every layer (MoE: dense ones)
        for pr in self.proj:
            for P, (_, mods) in pr.items():
                for j, (mod, _) in enumerate(mods):
                    self.where[mod] = (P, j)
        # kern: SegmentPlan's kernels (lora_triton; the CPU tests stand one
        # in) for every step where they run (kernels: the decoder's Triton
        # kernels are on) and cover the shapes, unless the settings ask for
        # the dense delta; None when not, or when they disagreed with
        # DensePlan on the first adapter loaded (checked).
        self.kern = self._kernels() if plan != "dense" and kernels else None
        # side: the CUDA stream SegmentPlan.begin runs each projection's
        # shrink on, beside the base projection (settings.lora_side_stream).
        # At a higher priority than the step's stream, so the shrink's
        # programs are scheduled beside a GEMM already filling the GPU
        # rather than after it. Without the kernels (off, absent, or
        # turned off by their check) the setting does nothing.
        self.side = torch.cuda.Stream(device, priority=-1) if side_stream and self.kern is not None else None
        self.checked = False
        self.rows = rows  # the most packed rows a step can run (warm compiles the kernels' variants up to it)
        self.key_ids = None  # SegmentPlan's device constant: the device slots 1 .. slots + 1
        self.offsets = [{P: offsets(mods) for P, (_, mods) in pr.items()} for pr in self.proj]  # each module's first output column
        elem = torch.tensor([], dtype=dtype).element_size()
        self.slot_bytes = sum(len(mods) * self.R * i + sum(o for _, o in mods) * self.R
                              for pr in self.proj for i, mods in pr.values()) * elem

    @property
    def fused(self):
        """Whether SegmentPlan computes every step's delta."""
        return self.kern is not None

    def _kernels(self):
        """lora_triton where it imports and covers the slots, else None."""
        if torch.device(self.device).type != "cuda":
            return None
        try:
            from . import lora_triton
        except Exception as e:  # no Triton here
            log.warning("LoRA kernels unavailable, using the dense delta: %s", e)
            return None
        widths = [o for pr in self.proj for _, mods in pr.values() for _, o in mods]
        return lora_triton if lora_triton.usable(widths, self.R, self.dtype) else None

    def bytes(self):
        """The device memory of the pool once allocated: every slot."""
        return self.n * self.slot_bytes

    def _allocate(self):
        S, R = self.n, self.R
        try:
            self.A = [{P: torch.zeros(S, len(mods), R, i, device=self.device, dtype=self.dtype) for P, (i, mods) in pr.items()}
                      for pr in self.proj]
            self.Bcat = [{P: torch.zeros(S, R, sum(o for _, o in mods), device=self.device, dtype=self.dtype)
                          for P, (i, mods) in pr.items()} for pr in self.proj]
            self.B = [{P: [Bc[P][:, :, a : a + o] for a, (_, o) in zip(offs[P], mods)] for P, (i, mods) in pr.items()}
                      for Bc, offs, pr in zip(self.Bcat, self.offsets, self.proj)]
            self.ids = torch.arange(1, S + 1, device=self.device)
            self.key_ids = torch.arange(1, S + 2, device=self.device)
            self.zero = torch.zeros((), device=self.device, dtype=self.dtype)
        except RuntimeError as e:
            self.A = self.Bcat = self.B = self.ids = self.key_ids = self.zero = None
            if self.tp is not None:  # another rank may have allocated: not in step, the group goes down (tp.py)
                raise
            raise ProtocolError(OUT_OF_MEMORY, "adapter slots (%d of rank %d, %d bytes): %s" % (self.n, R, self.bytes(), e))

    def ensure(self, spec):
        """Makes the adapter the open request names resident: spec is its
        "adapter" object ({"name", "slot", "load"?}). Returns the device
        slot index (1 + the supervisor's slot)."""
        slot = int(spec["slot"])
        if not 0 <= slot < self.n:
            raise ProtocolError(INVALID, "adapter slot %d outside 0..%d" % (slot, self.n - 1))
        name = spec["name"]
        if spec.get("load") is not None:
            self.names[slot] = None  # a failed load leaves the slot empty, never half-written under a name
            self.load(slot, spec["load"])
            self.names[slot] = name
            if self.fused and not self.checked:
                self._check_kernels(slot + 1)
        elif self.names[slot] != name:
            raise ProtocolError(INVALID, "adapter %r is not resident in slot %d (it holds %r)" % (name, slot, self.names[slot]))
        return slot + 1

    def load(self, slot, d):
        """Reads the adapter d describes ("file", "rank", "scale", "pairs":
        [layer, module, A name, B name, transposed]) into slot. The
        supervisor checked it (internal/lora); shapes are checked again
        against the slot, as the file may have changed since."""
        if self.A is None:
            self._allocate()
        r, scale = int(d["rank"]), float(d["scale"])
        if not 1 <= r <= self.rank:
            raise ProtocolError(INVALID, "adapter rank %d outside 1..%d" % (r, self.rank))
        f = SafetensorsFile(d["file"])
        with torch.no_grad():
            self._clear(slot)
            try:
                self._read(slot, f, d["pairs"], r, scale)
            except BaseException:
                # Whatever stopped the load, the slot holds nothing of it: a
                # value that is not finite anywhere in a slot would reach
                # every row of a dense step (the zeroed products times B).
                self._clear(slot)
                raise

    def _read(self, slot, f, pairs, r, scale):
        """load's reading: every pair into slot, then one host sync for
        the whole adapter's finiteness check. Each rank checks the whole
        stored tensors, as converted to the slots' dtype (a float16 slot
        overflows where float32 does not), before taking its share, so
        under tensor parallel the ranks agree on a bad file."""
        read, finite = [], []  # the tensors' names, in order, and per pair whether each is finite (on the device)
        n, at = (1, 0) if self.tp is None else (self.tp.size, self.tp.rank)
        for layer, mod, an, bn, tr in pairs:
            if not 0 <= layer < len(self.proj) or mod not in self.where or self.where[mod][0] not in self.proj[layer]:
                raise CheckpointError(f.name, "layer %d has no adaptable %s" % (layer, mod), an)
            P, j = self.where[mod]
            width, mods = self.proj[layer][P]
            out = mods[j][1]
            wide, tall = (width * n, out) if P in ROW_PARALLEL else (width, out * n)  # the file's shapes
            a, b = self._tensor(f, an, (wide, r) if tr else (r, wide)), self._tensor(f, bn, (r, tall) if tr else (tall, r))
            if tr:
                a, b = a.t(), b.t()
            a, b = a.to(self.dtype), (b * scale).to(self.dtype)
            read += [an, bn]
            finite.append(torch.stack([torch.isfinite(a).all(), torch.isfinite(b).all()]))
            if P in ROW_PARALLEL:  # the rank's share (whole at tp 1)
                a = a[:, at * width : (at + 1) * width]
            else:
                b = b[at * out : (at + 1) * out]
            self.A[layer][P][slot, j, :r] = a
            self.B[layer][P][j][slot, :r] = b.t()
        ok = torch.cat(finite) if finite else None
        if ok is not None and not bool(ok.all()):
            raise CheckpointError(f.name, "holds values that are not finite", read[int(ok.logical_not().nonzero()[0])])

    def _check_kernels(self, s):
        """SegmentPlan's deltas against DensePlan's on every projection of
        the first and last layers, rows of device slot s (just loaded),
        of another slot filled with random weights for the check (the
        highest empty one; cleared after) and of the base interleaved:
        where a slot's rows disagree beyond rounding, relative to that
        slot's own delta, a base row gets any delta, or the kernels fail,
        every step keeps DensePlan (logged). A kernel that faults the
        device leaves an error no check recovers from. Kernels that pass
        then compile every variant a step launches (warm)."""
        self.checked = True
        g = torch.Generator(device="cpu").manual_seed(0)
        other = next((k for k in range(self.n - 1, -1, -1) if k != s - 1 and self.names[k] is None), None)
        layers = sorted({0, len(self.proj) - 1})
        tol = 1e-4 if self.dtype == torch.float32 else 2e-2
        try:
            with torch.no_grad():
                if other is not None:
                    for li in layers:
                        for P, A in self.A[li].items():
                            A[other].copy_(torch.randn(A[other].shape, generator=g) * 0.05)
                            Bc = self.Bcat[li][P]
                            Bc[other].copy_(torch.randn(Bc[other].shape, generator=g) * 0.05)
                ids = [s] + ([other + 1] if other is not None else [])
                for n in (3, 80):
                    rows = [ids[i % len(ids)] if i % 3 else 0 for i in range(n)]
                    idx = to_device(rows, self.device)
                    seg, dense = SegmentPlan.of(self, idx), DensePlan(self, idx)
                    for li in layers:
                        for P, (width, mods) in self.proj[li].items():
                            x = torch.randn(n, width, generator=g).to(self.device, self.dtype)
                            y = torch.zeros(n, sum(o for _, o in mods), device=self.device, dtype=self.dtype)
                            want = dense.add(y.clone(), x, li, P).float()  # the deltas alone
                            got = seg.add(y.clone(), x, li, P).float()
                            for v in [0] + ids:  # each slot against its own delta; the base's must stay zero
                                at = idx == v
                                err, scale = (got[at] - want[at]).abs().max().item(), want[at].abs().max().item()
                                if not err <= tol * scale:  # a delta that is all zero must come back zero
                                    raise RuntimeError("layer %d %s, %d rows: slot %d's delta differs from the dense one by %g "
                                                       "(its largest %g)" % (li, P, n, v, err, scale))
        except Exception as e:  # a kernel that fails to build or disagrees: the dense delta serves
            self.kern = None
            log.warning("LoRA kernels disabled, using the dense delta: %s", e)
        finally:
            if other is not None:
                with torch.no_grad():
                    self._clear(other)
        if self.fused:
            self.warm()

    def warm(self):
        """Launches the segmented kernels once for each variant a step would
        launch (lora_triton.variants), on every distinct projection shape:
        Triton compiles a kernel at its first launch with new compile-time
        values, about a second each on a machine that has not compiled it
        before (its disk cache serves later processes), so the first
        adapter's load (_check_kernels) pays for it, not steps that every
        sequence would wait for. Not at the model's load: every model has
        adapter slots, most never serve an adapter. Steps of 1 to
        self.rows rows are covered, and past them up to where the variants
        stop changing (64 * PROGRAMS rows). The launches read a layer's
        slots but run no tiles (every row the base's), so they need
        memory for the inputs' shapes only. A variant that fails to
        compile turns the kernels off (the dense delta serves, logged);
        running out of memory here only leaves the rest to compile at
        their first step."""
        variants = getattr(self.kern, "variants", None)
        if variants is None:
            return
        try:
            with torch.no_grad():
                self._warm(variants)
        except torch.cuda.OutOfMemoryError as e:
            log.warning("LoRA kernels: compiling their variants ahead ran out of memory; the rest compile at their first step: %s", e)
        except Exception as e:  # a variant that does not build: the dense delta serves
            self.kern = None
            log.warning("LoRA kernels disabled, using the dense delta: %s", e)

    def _warm(self, variants):
        dev, last = self.device, max(self.rows, 64 * getattr(self.kern, "PROGRAMS", 0) + 1)
        shapes = {}
        for li, pr in enumerate(self.proj):
            for P, (width, mods) in pr.items():
                shapes.setdefault((width, tuple(mods)), (li, P))
        for (width, mods), (li, P) in shapes.items():
            A, B, off = self.A[li][P], self.Bcat[li][P], self.offsets[li][P]
            y = torch.empty(1, B.shape[2], device=dev, dtype=self.dtype)  # its row stride is all the kernels take from it: no tile runs
            seen = set()
            for n in range(1, last + 1):
                key = variants(n, A, B, off)
                if key in seen:
                    continue
                seen.add(key)
                order, start, tiles = segments(torch.zeros(n, dtype=torch.long, device=dev), self.key_ids, self.kern.ROW_TILES)
                x = torch.empty(n, width, device=dev, dtype=self.dtype)
                self.kern.delta(y, x, A, B, off, order, start, tiles)
                del x

    def _clear(self, slot):
        for pr in self.A:
            for t in pr.values():
                t[slot].zero_()
        for pr in self.Bcat:
            for t in pr.values():
                t[slot].zero_()

    def _tensor(self, f, name, shape):
        """The stored tensor name, checked against shape, as float32 on
        the device. The stored bytes go to the device as they are and
        convert there: a CPU conversion and finiteness check per tensor
        took 15-30 s for an 8B model's rank-16 adapter on a GPU host whose
        cores the other workers kept busy, stalling every sequence of
        the worker behind the adapter's first request."""
        if name not in f.header:
            raise CheckpointError(f.name, "missing tensor", name)
        if f.shape(name) != list(shape):
            raise CheckpointError(f.name, "shape %r, want %r" % (f.shape(name), list(shape)), name)
        return f.tensor(name).to(self.device).float()

    def plan(self, slots, counts):
        """The delta plan of an eager step for inputs of counts packed rows
        each, with device slot slots[i] (0: base): a SegmentPlan where
        those serve (fused), else a DensePlan when every input is one
        token (the rows' slots in one copy, a few kernels a projection)
        or the settings ask for it (dense), else a Plan; None when no row
        has an adapter."""
        if not any(slots) or self.A is None:
            return None
        if self.fused or self.dense or all(c == 1 for c in counts):
            return self.device_plan(to_device([s for s, c in zip(slots, counts) for _ in range(c)], self.device))
        ranges, at = {}, 0
        for s, c in zip(slots, counts):
            if s:
                ranges.setdefault(s, []).append((at, at + c))
            at += c
        groups, flat, where = [], [], []
        for s, rs in ranges.items():
            if len(rs) == 1:
                groups.append((s, slice(*rs[0])))
                continue
            where.append((len(groups), len(flat)))
            groups.append((s, None))
            for a, b in rs:
                flat.extend(range(a, b))
            where[-1] += (len(flat),)
        if flat:  # one copy for every gathered slot's rows
            dev = to_device(flat, self.device)
            for g, a, b in where:
                groups[g] = (groups[g][0], dev[a:b])
        return Plan(self, groups)

    def device_plan(self, idx):
        """The plan of rows whose device slots are idx ([N] int64 on the
        device; what the graphs capture): a SegmentPlan where those serve
        (fused), else a DensePlan; None before the first adapter is
        loaded."""
        if self.A is None:
            return None
        return SegmentPlan.of(self, idx) if self.fused else DensePlan(self, idx)


class Plan:
    """One step's adapters: per distinct slot its rows (a slice, or a
    device index tensor when several sequences share the adapter).
    decoder.Decoder.proj calls begin and then add for every adapted
    projection."""

    def __init__(self, slots, groups):
        self.s, self.groups = slots, groups

    def begin(self, x, li, P):
        """What of the delta of rows x this plan starts before the base
        projection (SegmentPlan: its shrink on the side stream); None."""
        return None

    def join(self, started, x):
        """Makes the step's stream wait for what begin started (x: the
        rows it read), where add will not: the base projection failed."""

    def add(self, y, x, li, P, started=None):
        """y (the projection P of layer li of rows x) plus each row's
        adapter's delta."""
        A = self.s.A[li].get(P)
        if A is None:
            return y
        Bs = self.s.B[li][P]
        for s, rows in self.groups:
            xr, at = x[rows], 0
            for j, B in enumerate(Bs):
                o = B.shape[2]
                y[rows, at : at + o] += (F.linear(xr, A[s - 1, j]) @ B[s - 1]).to(y.dtype)
                at += o
        return y


class DensePlan(Plan):
    """The delta over every slot at once from the rows' device slots idx
    ([N], on the device; see the module comment): graph-capturable, no
    host sync, 2 + m kernels per projection."""

    def __init__(self, slots, idx):
        self.s = slots
        # [N, 1, slots, 1]: whether row i runs slot k + 1, in the layout of
        # the shrink's product read module-major, [N, m, slots, R].
        self.mask = (idx.unsqueeze(1) == slots.ids).view(idx.shape[0], 1, slots.n, 1)

    def add(self, y, x, li, P, started=None):
        A = self.s.A[li].get(P)
        if A is None:
            return y
        Bs, N = self.s.B[li][P], x.shape[0]
        S, m, R, width = A.shape
        t = F.linear(x, A.view(S * m * R, width)).view(N, S, m, R)
        # Written module-major, [N, m, S, R], so sel[:, j] is [N, S * R]
        # with no copy.
        sel = torch.empty(N, m, S, R, device=t.device, dtype=t.dtype)
        torch.where(self.mask, t.transpose(1, 2), self.s.zero, out=sel)
        at = 0
        for j, B in enumerate(Bs):
            o = B.shape[2]
            part, Bj = sel[:, j].reshape(N, S * R), B.view(S * R, o)
            if y.dtype == Bj.dtype:
                y[:, at : at + o].addmm_(part, Bj)
            else:
                y[:, at : at + o] += (part @ Bj).to(y.dtype)
            at += o
        return y


class SegmentPlan(Plan):
    """The delta of rows sorted by slot (segments; of sorts them from the
    rows' device slots) through lora_triton's segmented kernels: two
    kernels a projection, each adapter's weights read for its own rows
    only, the base's rows untouched. Graph-capturable, no host sync.
    With the slots' side stream (settings.lora_side_stream), begin runs
    a projection's shrink there while the base projection's GEMM runs on
    the step's stream (a fork and a join, which CUDA graphs capture as
    two branches); add's expand waits for it."""

    def __init__(self, slots, segs):
        """segs: the rows' (order, start, tiles), as segments gives them."""
        self.s, self.kern = slots, slots.kern
        self.order, self.start, self.tiles = segs

    @staticmethod
    def of(slots, idx):
        """The plan of rows whose device slots are idx ([N], on the device)."""
        return SegmentPlan(slots, segments(idx, slots.key_ids, slots.kern.ROW_TILES))

    def begin(self, x, li, P):
        side, A = self.s.side, self.s.A[li].get(P)
        if side is None or A is None:
            return None
        side.wait_stream(torch.cuda.current_stream(x.device))  # x, and the segments, are ready
        with torch.cuda.stream(side):
            # t's memory returns to the side stream's pool when add drops it;
            # the side stream's next use waits for the step's stream first
            # (above), so it is not reused before the expand has read it.
            return self.kern.shrink(x, A, self.order, self.start, self.tiles)

    def add(self, y, x, li, P, started=None):
        A = self.s.A[li].get(P)
        if A is None:
            return y
        B, off = self.s.Bcat[li][P], self.s.offsets[li][P]
        if started is None:
            return self.kern.delta(y, x, A, B, off, self.order, self.start, self.tiles)
        self.join(started, y)
        return self.kern.expand(y, started, B, off, self.order, self.start, self.tiles)

    def join(self, started, x):
        if started is not None:
            torch.cuda.current_stream(x.device).wait_stream(self.s.side)  # the shrink is done


def segments(idx, key_ids, row_tiles):
    """(order, start, tiles) of rows whose device slots are idx ([N]
    int64, 0: the base), on the device without a host sync: order the
    rows sorted by slot, the base last; start [S + 1] int32 with the rows
    of device slot s + 1 at order[start[s] : start[s + 1]]; tiles {BM:
    [S + 1] int32} for each BM of row_tiles, slot s's row tiles of BM
    rows numbered from tiles[BM][s], their count at tiles[BM][S] (the
    kernels run the step's row tiles, not every slot's). key_ids:
    arange(1, S + 2) on the device."""
    last = key_ids[-1:]  # S + 1: the base sorts after every slot
    key = torch.where(idx == 0, last, idx)
    sk, order = torch.sort(key, stable=True)
    start = torch.searchsorted(sk, key_ids).to(torch.int32)
    counts = start[1:] - start[:-1]
    tiles = {bm: torch.cat([start[:1] * 0, torch.cumsum((counts + bm - 1) // bm, 0, dtype=torch.int32)]) for bm in row_tiles}
    return order, start, tiles


def offsets(mods):
    """The first output column of each of a projection's modules."""
    out, at = [], 0
    for _, o in mods:
        out.append(at)
        at += o
    return out
