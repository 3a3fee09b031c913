"""LoRA adapters served over a loaded decoder: a pool of device slots and
the batched delta of a step whose rows run with different adapters.

Slots: each packed projection of each layer (decoder.py: "qkv" = q, k, v
concatenated, "o", "gate_up" = gate then up, "down") has a stacked A
[slots + 1, m * R, in] and, per packed module j, a stacked B_j
[slots + 1, out_j, R]: R the highest rank served, rounded up to a
multiple of 8 (every adapter zero-padded to it), m the modules packed in
the projection (3 for split q/k/v, 2 for gate/up, 1 for the rest and for
Phi-3's fused qkv_proj and gate_up_proj), module j's A in rows j*R ..
j*R + r, the adapter's scale folded into B. A module an adapter does not target stays zero, so its
part of the packed delta is zero. Slot 0 is all zeros: the base model's
rows. The tensors are allocated when the first adapter is loaded (a
model that never serves one takes nothing).

A step: each packed token row has a slot (0 for the base). The delta of
projection P for the rows of slot s is (x A_s^T) split per module, each
part times its B_s^T, concatenated. Two plans compute it:

- Plan (host): one GEMM pair per module per distinct adapter of the step
  (the rows of a sequence are contiguous, so an adapter run by one
  sequence reads a slice, no gather). Prompt chunks and eager steps.
- DevicePlan: from the rows' slots as a device tensor alone, no host
  sync: rows sorted by slot, one grouped GEMM (torch._grouped_mm, offsets
  per slot, as moe.py runs experts) for A and one per module for B, the
  result put back in row order. The CUDA decode graphs capture it with
  the slots as an input (graphs.py), so adapter rows decode at graph
  speed; it runs only where it agrees with Plan at the first load
  (check), else adapter steps run eagerly.

A step where no row has an adapter never reaches this module
(TorchModel checks first): the base alone pays nothing.
"""
import logging
import os

import torch

from errors import CheckpointError, ProtocolError
from st import SafetensorsFile
from upload import to_device

log = logging.getLogger("lora")

# Tests: every step's delta through DevicePlan, on any device (the
# reference grouped GEMM where torch has none).
FORCE_DEVICE_PLAN = os.environ.get("MLXSERVING_LORA_PLAN") == "device"


def projections(cfg, layer):
    """The adaptable packed projections of a decoder layer (its weights L
    as decoder.Decoder.load_layer built them): {name: (in, [(module,
    out), ...])}, modules in packing order."""
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

    def __init__(self, cfg, layers, device, dtype, slots, max_rank):
        if slots < 1 or max_rank < 1:
            raise ProtocolError("invalid", "adapter slots %d and max rank %d must be positive" % (slots, max_rank))
        # R: the slots' rank, max_rank rounded up to a multiple of 8 (the
        # grouped GEMM wants 16-byte rows of half-precision values).
        self.device, self.dtype, self.n, self.rank, self.R = device, dtype, slots, max_rank, -(-max_rank // 8) * 8
        self.proj = [projections(cfg, L) for L in layers]
        self.names = [None] * slots  # the adapter resident in each slot (the supervisor's key)
        self.A = self.B = None  # per layer {projection: A} and {projection: [B_j]}, allocated by the first load
        self.grouped = False  # DevicePlan runs here (check), known from the first load
        self.where = {}  # module -> (projection, its index in the packing), over every layer (MoE: dense ones)
        for pr in self.proj:
            for P, (_, mods) in pr.items():
                for j, (mod, _) in enumerate(mods):
                    self.where[mod] = (P, j)
        elem = torch.tensor([], dtype=dtype).element_size()
        self.slot_bytes = sum(len(mods) * self.R * i + sum(o for _, o in mods) * self.R
                              for pr in self.proj for i, mods in pr.values()) * elem

    def bytes(self):
        """The device memory of the pool once allocated: every slot and the zero slot."""
        return (self.n + 1) * self.slot_bytes

    def _allocate(self):
        S, R = self.n + 1, self.R
        try:
            self.A = [{P: torch.zeros(S, len(mods) * R, i, device=self.device, dtype=self.dtype) for P, (i, mods) in pr.items()}
                      for pr in self.proj]
            self.B = [{P: [torch.zeros(S, o, R, device=self.device, dtype=self.dtype) for _, o in mods]
                       for P, (i, mods) in pr.items()} for pr in self.proj]
        except RuntimeError as e:
            self.A = self.B = None
            raise ProtocolError("oom", "adapter slots (%d of rank %d, %d bytes): %s" % (self.n, R, self.bytes(), e))
        self.grouped = _grouped_mm() is not None and self.check()

    def ensure(self, spec):
        """Makes the adapter the open request names resident: spec is its
        "adapter" object ({"name", "slot", "load"?}). Returns the device
        slot index (1 + the supervisor's slot)."""
        slot = int(spec["slot"])
        if not 0 <= slot < self.n:
            raise ProtocolError("invalid", "adapter slot %d outside 0..%d" % (slot, self.n - 1))
        name = spec["name"]
        if spec.get("load") is not None:
            self.names[slot] = None  # a failed load leaves the slot empty, never half-written under a name
            self.load(slot, spec["load"])
            self.names[slot] = name
        elif self.names[slot] != name:
            raise ProtocolError("invalid", "adapter %r is not resident in slot %d (it holds %r)" % (name, slot, self.names[slot]))
        return slot + 1

    def load(self, slot, d):
        """Reads the adapter d describes ("file", "rank", "scale", "pairs":
        [layer, module, A name, B name, transposed]) into slot. The
        supervisor checked it (internal/lora); shapes are checked again
        against the slot, as the file may have changed since."""
        if self.A is None:
            self._allocate()
        r, scale, R = int(d["rank"]), float(d["scale"]), self.R
        if not 1 <= r <= self.rank:
            raise ProtocolError("invalid", "adapter rank %d outside 1..%d" % (r, self.rank))
        f = SafetensorsFile(d["file"])
        i = slot + 1
        with torch.no_grad():
            for pr in self.A:
                for t in pr.values():
                    t[i].zero_()
            for pr in self.B:
                for ts in pr.values():
                    for t in ts:
                        t[i].zero_()
            for layer, mod, an, bn, tr in d["pairs"]:
                if not 0 <= layer < len(self.proj) or mod not in self.where or self.where[mod][0] not in self.proj[layer]:
                    raise CheckpointError(f.name, "layer %d has no adaptable %s" % (layer, mod), an)
                P, j = self.where[mod]
                width, mods = self.proj[layer][P]
                out = mods[j][1]
                a, b = self._tensor(f, an, (width, r) if tr else (r, width)), self._tensor(f, bn, (r, out) if tr else (out, r))
                if tr:
                    a, b = a.t(), b.t()
                self.A[layer][P][i, j * R : j * R + r] = a.to(self.dtype)
                self.B[layer][P][j][i, :, :r] = (b * scale).to(self.dtype)

    def _tensor(self, f, name, shape):
        if name not in f.header:
            raise CheckpointError(f.name, "missing tensor", name)
        if f.shape(name) != list(shape):
            raise CheckpointError(f.name, "shape %r, want %r" % (f.shape(name), list(shape)), name)
        t = f.tensor(name).float()
        if not torch.isfinite(t).all():
            raise CheckpointError(f.name, "holds values that are not finite", name)
        return t.to(self.device)

    def plan(self, slots, counts):
        """The step's delta plan for inputs of counts packed rows each, with
        device slot slots[i] (0: base): a Plan, or None when no row has an
        adapter."""
        if not any(slots) or self.A is None:
            return None
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
        if FORCE_DEVICE_PLAN:
            idx = to_device([s for s, c in zip(slots, counts) for _ in range(c)], self.device)
            return DevicePlan(self, idx, _grouped_mm() if self.grouped else _grouped_ref)
        return Plan(self, groups)

    def device_plan(self, idx):
        """The DevicePlan of rows whose device slots are idx ([N] int64 on
        the device), or None when it does not run here."""
        return DevicePlan(self, idx, _grouped_mm()) if self.grouped else None

    def check(self):
        """Whether DevicePlan agrees with Plan here: random weights in two
        slots (zeroed again after), rows of both and of the base
        interleaved, through layer 0's projections."""
        if self.A is None:
            return False
        hi = min(2, self.n)  # the slots filled: 1 .. hi
        try:
            g = torch.Generator(device="cpu").manual_seed(0)
            idx = [min(v, hi) for v in [1, 0, 2, 2, 1, 0, 1, 2, 0, 0, 1] * 3]
            tol = 1e-4 if self.dtype == torch.float32 else 3e-2
            ok = True
            with torch.no_grad():
                for t in list(self.A[0].values()) + [b for bs in self.B[0].values() for b in bs]:
                    t[1 : hi + 1] = (torch.randn(t[1 : hi + 1].shape, generator=g) * 0.1).to(t)
                dp = DevicePlan(self, to_device(idx, self.device), _grouped_mm())
                hp = Plan(self, [(s, to_device([i for i, v in enumerate(idx) if v == s], self.device)) for s in range(1, hi + 1)])
                for P, (width, mods) in self.proj[0].items():
                    x = torch.randn(len(idx), width, generator=g).to(device=self.device, dtype=self.dtype)
                    y0 = torch.zeros(len(idx), sum(o for _, o in mods), device=self.device, dtype=self.dtype)
                    got = dp.add(y0.clone(), x, 0, P).float()
                    want = hp.add(y0.clone(), x, 0, P).float()
                    if not torch.allclose(got, want, atol=tol, rtol=tol):
                        log.warning("grouped LoRA GEMM disagrees with the per-adapter one on %s (max diff %.3g); "
                                    "adapter steps run eagerly", P, (got - want).abs().max().item())
                        ok = False
                        break
        except (RuntimeError, TypeError, ValueError) as e:
            log.warning("grouped LoRA GEMM unavailable (%s); adapter steps run eagerly", e)
            ok = False
        finally:
            with torch.no_grad():
                for t in list(self.A[0].values()) + [b for bs in self.B[0].values() for b in bs]:
                    t[1 : hi + 1].zero_()
        return ok


class Plan:
    """One step's adapters: per distinct slot its rows (a slice, or a
    device index tensor when several sequences share the adapter).
    decoder.Decoder.proj calls add for every adapted projection."""

    def __init__(self, slots, groups):
        self.s, self.groups = slots, groups

    def add(self, y, x, li, P):
        """y (the projection P of layer li of rows x) plus each row's
        adapter's delta."""
        A = self.s.A[li].get(P)
        if A is None:
            return y
        Bs, R = self.s.B[li][P], self.s.R
        for s, rows in self.groups:
            u = x[rows] @ A[s].t()
            if len(Bs) == 1:
                d = u @ Bs[0][s].t()
            else:
                d = torch.cat([u[:, j * R : (j + 1) * R] @ B[s].t() for j, B in enumerate(Bs)], dim=1)
            y[rows] += d.to(y.dtype)
        return y


class DevicePlan:
    """The delta from the rows' slots on the device alone (see the module
    comment): graph-capturable, no host sync. mm is the grouped GEMM
    (_grouped_mm's, or _grouped_ref)."""

    def __init__(self, slots, idx, mm):
        self.s, self.mm = slots, mm
        self.order = torch.argsort(idx)
        counts = torch.zeros(slots.n + 1, dtype=torch.int32, device=idx.device)
        counts.scatter_add_(0, idx, torch.ones_like(idx, dtype=torch.int32))
        self.offs = counts.cumsum(0, dtype=torch.int32)

    def add(self, y, x, li, P):
        A = self.s.A[li].get(P)
        if A is None:
            return y
        Bs, R = self.s.B[li][P], self.s.R
        u = self.mm(x[self.order], A.transpose(1, 2), self.offs)
        if len(Bs) == 1:
            d = self.mm(u, Bs[0].transpose(1, 2), self.offs)
        else:
            d = torch.cat([self.mm(u[:, j * R : (j + 1) * R].contiguous(), B.transpose(1, 2), self.offs)
                           for j, B in enumerate(Bs)], dim=1)
        back = torch.empty_like(d)
        back[self.order] = d
        return y + back.to(y.dtype)


def _grouped_mm():
    """torch._grouped_mm as (x [N, k], w [G, k, n], offs) -> [N, n], or
    None where this torch has none."""
    f = getattr(torch, "_grouped_mm", None)
    if f is None:
        return None
    return lambda x, w, offs: f(x, w, offs=offs)


def _grouped_ref(x, w, offs):
    """What torch._grouped_mm computes, group by group on the host's
    offsets (tests on a torch without it: MLXSERVING_LORA_PLAN=device)."""
    out = x.new_zeros(x.shape[0], w.shape[2])
    at = 0
    for g, end in enumerate(offs.tolist()):
        if end > at:
            out[at:end] = x[at:end] @ w[g]
        at = end
    return out
