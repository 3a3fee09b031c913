"""Sampling on the device: greedy, temperature, top-k, top-p, min-p,
repetition, presence and frequency penalties, logit bias, allowed-token
masks, top log-probabilities, per-sequence seeded generators.

Parameters arrive as the protocol's compact dict (params.py has its
keys); the penalties and the bias are params.adjust's, shared with the
mlx backend.

The masks of a step's rows are decoded on the host into one packed
bitset ([rows, ceil(vocab / 8)] uint8), copied to the device at once,
unpacked there with shifts and applied with one batched masked_fill (on
the CPU, and for a lone row whose mask is a list of ids, they are written
straight into one bool tensor instead: device_masks).
"""
import random

import torch

from ..params import adjust, adjusts, token_set
from .upload import HostCopy, to_device

try:
    import numpy as _np
except ImportError:  # torch runs without numpy; unpacking then uses torch ops
    _np = None

_MASK64 = (1 << 64) - 1


def _mix64(x):
    """splitmix64's finaliser: a cheap bijective scramble of 64 bits."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class Draws:
    """A sequence's temperature draws: each draw's generator is seeded from
    the sequence's seed and the draw's generated position, so a sequence
    resumed with "g" generated tokens draws as the uninterrupted one did
    from that position on. get_state and set_state save and restore the
    position (lookahead takes draws back with them)."""

    __slots__ = ("seed", "pos", "gen")

    def __init__(self, seed, pos, device):
        self.seed, self.pos = seed, pos
        self.gen = torch.Generator(device=device)

    def next(self):
        """The generator for the draw at the current position; advances it."""
        self.gen.manual_seed(_mix64(self.seed ^ _mix64(self.pos + 0x2545F4914F6CDD1D)) & ((1 << 63) - 1))
        self.pos += 1
        return self.gen

    def get_state(self):
        return self.pos

    def set_state(self, pos):
        self.pos = pos


def _generator(seq, params, device):
    """The sequence's Draws, made at its first temperature draw from the
    seed ("s", a random one when absent) and the generated position it
    starts at ("g")."""
    if seq.gen is None:
        seed = params.get("s")
        seed = int(seed) & _MASK64 if seed is not None else random.getrandbits(64)
        seq.gen = Draws(seed, int(params.get("g") or 0), device)
    return seq.gen


def draw(seq, params, probs, device):
    """One temperature draw from probs for seq."""
    return torch.multinomial(probs, 1, generator=_generator(seq, params, device).next())[0]


def note_forced(seq, toks, sample):
    """Jump-forward decoding (the "jump_forward" capability): a sampling
    input of a sequence that has sampled holds the token it sampled last,
    then tokens the caller appended without sampling. Each of those is a
    generated position, so the draw after them is the one a sequence that
    had sampled them takes. (Seq.note_fed counts them for the penalties.)"""
    if sample and len(toks) > 1 and getattr(seq, "sampled", False) and seq.gen is not None:
        seq.gen.pos += len(toks) - 1


def _resume(seq, params):
    """At a sequence's first sample: the prompt's last "g" tokens were
    generated before it was resumed, so presence and frequency penalties
    count them."""
    g = min(int(params.get("g") or 0), len(seq.tokens))
    if g > 0 and (params.get("pp") or params.get("fp")):
        counts = seq.counts
        for t in seq.tokens[len(seq.tokens) - g:]:
            counts[t] = counts.get(t, 0) + 1


def _ids(ids, limit):
    """The ids below limit as a tensor, each once (the supervisor sends
    them sorted and distinct; anything else is sorted here)."""
    t = torch.tensor(ids, dtype=torch.int64) if ids else torch.empty(0, dtype=torch.int64)
    if t.numel() > 1 and not bool((t[1:] > t[:-1]).all()):
        t = t.unique()
    return t[(t >= 0) & (t < limit)]


def _id_bits(ids, nbytes):
    """The bitset (bit id % 8 of byte id / 8) of the ids below nbytes * 8,
    as a uint8 tensor: distinct ids set distinct bits of a byte, so their
    sum per byte is their union."""
    t = _ids(ids, nbytes * 8)
    return torch.bincount(t >> 3, weights=(1 << (t & 7)).to(torch.float64), minlength=nbytes).to(torch.uint8)


def packed_set(x, width):
    """Decodes one of the protocol's token sets ({"a": ids}, {"d": ids,
    "v": vocab} or {"b": base64}) into a uint8 bitset of ceil(width / 8)
    bytes, on the host; ids at or past width are cleared."""
    nbytes = (width + 7) // 8
    ts = token_set(x, width)
    if ts.bits is not None:
        row = torch.zeros(nbytes, dtype=torch.uint8)
        if ts.bits:
            row[:len(ts.bits)] = torch.frombuffer(bytearray(ts.bits), dtype=torch.uint8)
    elif ts.allow:
        row = _id_bits(ts.ids, nbytes)
    else:
        row = 255 - _id_bits(ts.ids, nbytes)
        v = ts.limit
        if v < nbytes * 8:
            row[v >> 3] &= (1 << (v & 7)) - 1
            row[(v >> 3) + 1:] = 0
    if width % 8:
        row[-1] &= (1 << (width % 8)) - 1
    return row


def packed_rows(sets, width):
    """The token sets of several rows as one uint8 host tensor [rows,
    ceil(width / 8)]; None stands for every token."""
    rows = [packed_set(x, width) if x is not None else None for x in sets]
    full = torch.full(((width + 7) // 8,), 255, dtype=torch.uint8)
    if width % 8:
        full[-1] = (1 << (width % 8)) - 1
    return torch.stack([r if r is not None else full for r in rows])


_SHIFTS = {}


def unpack_rows(packed, width):
    """Bits of a [rows, bytes] uint8 bitset tensor as bool [rows, width],
    on the tensor's device."""
    if packed.device.type == "cpu" and _np is not None:
        return torch.from_numpy(_np.unpackbits(packed.numpy(), axis=-1, bitorder="little")[:, :width].view(_np.bool_))
    sh = _SHIFTS.get(packed.device)
    if sh is None:
        sh = _SHIFTS[packed.device] = torch.arange(8, dtype=torch.uint8, device=packed.device)
    return ((packed.unsqueeze(-1) >> sh) & 1).flatten(1)[:, :width].bool()


def host_masks(sets, width):
    """The token sets of several rows as one bool host tensor [rows,
    width], written straight from the ids where a set is a list of them
    (None stands for every token)."""
    out = torch.ones(len(sets), width, dtype=torch.bool)
    for r, x in enumerate(sets):
        if x is None:
            continue
        row = out[r]
        ts = token_set(x, width)
        if ts.bits is not None:
            row.copy_(unpack_rows(packed_set(x, width).unsqueeze(0), width)[0])
        elif ts.allow:
            row.fill_(False)
            row[_ids(ts.ids, width)] = True
        else:
            row[_ids(ts.ids, width)] = False
            row[ts.limit:] = False
    return out


def device_masks(items, width, device, packed=None):
    """The allowed masks of items' rows ("x") as bool [rows, width] on the
    device (True everywhere for a row without a mask); None when no row
    has one. Off the CPU (packed None or True) they go up as one packed
    bitset and are unpacked on the device; on the CPU, where nothing goes
    up, and for a lone row whose mask is a list of ids, they are written
    straight into one bool tensor (on an H200 a lone list mask cost 84 µs
    that way against 170 µs packed and unpacked, a free string's 328
    against 554 µs, while 16 rows cost a third to two thirds less
    packed)."""
    xs = [p.get("x") for p, _ in items]
    if not any(x is not None for x in xs):
        return None
    if packed is None:
        lone_list = len(xs) == 1 and ("a" in xs[0] or "d" in xs[0])
        packed = torch.device(device).type != "cpu" and not lone_list
    if not packed:
        return host_masks(xs, width).to(device)
    return unpack_rows(to_device(packed_rows(xs, width), device), width)


def apply_masks(logits, masks):
    """Sets the logits of disallowed tokens to minus infinity, in place,
    in one batched operation."""
    if masks is not None:
        logits.masked_fill_(~masks[:, :logits.shape[-1]], float("-inf"))
    return logits


class _Ops:
    """torch's arrays for params.adjust."""

    where = staticmethod(torch.where)

    @staticmethod
    def ids(values, row):
        return torch.tensor(values, device=row.device)

    @staticmethod
    def floats(values, row):
        return torch.tensor(values, device=row.device, dtype=row.dtype)


def _filter(row, params):
    """Temperature, then top-k, top-p and min-p masks; returns probs."""
    row = row / float(params["t"])
    k = int(params.get("k") or 0)
    if 0 < k < row.shape[-1]:
        kth = torch.topk(row, k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    p = float(params.get("p") or 0)
    if 0 < p < 1:
        sp, si = torch.sort(probs, descending=True)
        cum = torch.cumsum(sp, dim=-1)
        drop = cum - sp >= p  # keep the smallest prefix reaching p
        sp = sp.masked_fill(drop, 0)
        probs = torch.zeros_like(probs).scatter(0, si, sp)
    m = float(params.get("m") or 0)
    if m > 0:
        probs = probs.masked_fill(probs < m * probs.max(), 0)
    return probs


def sample_rows(logits, items, device, masks=False, launch=None):
    """logits [S, vocab] float32; items: (params, seq) per row; masks: the
    rows' allowed masks from device_masks (False: decode them here).
    Returns the sampled token ids, their logprobs (0.0 where not asked)
    and the top log-probabilities ([] where not asked) as [[id, logprob],
    ...]. launch (CUDA): called with the sampled ids on the device before
    the host reads anything, to queue more work behind them (the next
    step's speculation); the host's reads then wait for this step only."""
    S = logits.shape[0]
    if S == 0:
        return [], [], []
    for params, seq in items:
        if not seq.sampled:
            _resume(seq, params)
    adj = [i for i, (p, _) in enumerate(items) if adjusts(p)]
    if masks is False:
        masks = device_masks(items, logits.shape[-1], logits.device)
    if adj or masks is not None:
        logits = logits.clone()
        for i in adj:
            params, seq = items[i]
            adjust(logits[i], seq, params, _Ops)
        apply_masks(logits, masks)
    out = torch.argmax(logits, dim=-1)
    for i, (params, seq) in enumerate(items):
        if float(params.get("t") or 0) > 0:
            probs = _filter(logits[i], params)
            out[i] = draw(seq, params, probs, device)
        seq.sampled = True
    want = [i for i, (params, _) in enumerate(items) if params.get("l") or params.get("n")]
    tops_n = [int(items[i][0].get("n") or 0) for i in want]
    reads = [out]
    if want:
        w = to_device(want, logits.device)
        ls = torch.log_softmax(logits[w], dim=-1)
        reads.append(ls.gather(1, out[w].unsqueeze(1)).squeeze(1))
        if max(tops_n) > 0:
            reads.extend(torch.topk(ls, min(max(tops_n), ls.shape[-1])))
    if launch is not None:
        host = HostCopy(reads)
        launch(out)
        reads = host.get()
    else:
        reads = [r.tolist() for r in reads]
    lps, tops = [0.0] * S, [[] for _ in range(S)]
    for k, i in enumerate(want):
        lps[i] = reads[1][k]
        if tops_n[k] > 0:
            vals, ids = reads[2][k][: tops_n[k]], reads[3][k][: tops_n[k]]
            tops[i] = [[int(a), float(b)] for a, b in zip(ids, vals) if b != float("-inf")]
    return reads[0], lps, tops
