"""Sampling on the device: greedy, temperature, top-k, top-p, min-p,
repetition, presence and frequency penalties, logit bias, allowed-token
masks, top log-probabilities, per-sequence seeded draws (a step's
temperature rows drawn together: draws).

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
    """A sequence's temperature draws: each draw's uniform comes from the
    sequence's seed and the draw's generated position (splitmix64), so a
    sequence resumed with "g" generated tokens draws as the uninterrupted
    one did from that position on, whatever else is in its batches.
    get_state and set_state save and restore the position (lookahead
    takes draws back with them)."""

    __slots__ = ("seed", "pos")

    def __init__(self, seed, pos):
        self.seed, self.pos = seed, pos

    def next(self):
        """The uniform in [0, 1) of the draw at the current position, on a
        grid of 2^-52 (exact in float64); advances the position."""
        x = _mix64(self.seed ^ _mix64(self.pos + 0x2545F4914F6CDD1D))
        self.pos += 1
        return (x >> 12) / float(1 << 52)

    def get_state(self):
        return self.pos

    def set_state(self, pos):
        self.pos = pos


# splitmix64's constants as numpy scalars, for uniforms' arrays.
_SPLIT = (0x2545F4914F6CDD1D, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def _mix64_array(x):
    """_mix64 over a uint64 array (numpy's uint64 products wrap mod 2^64,
    its shifts are logical: the same bits as the ints' masks)."""
    np = _np
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_SPLIT[1])
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_SPLIT[2])
    return x ^ (x >> np.uint64(31))


def uniforms(gens):
    """Each of gens' next draw's uniform (Draws.next, advancing each), as
    a float64 CPU tensor. With numpy the splitmix64 runs over arrays: a
    step of 220 temperature rows took 170 µs of per-row Python here. The
    Draws are distinct (one a sequence, each once in a step)."""
    n = len(gens)
    if _np is None or n < 8:
        return torch.tensor([g.next() for g in gens], dtype=torch.float64)
    np = _np
    seeds = np.fromiter([g.seed for g in gens], dtype=np.uint64, count=n)
    pos = np.fromiter([g.pos & _MASK64 for g in gens], dtype=np.uint64, count=n)
    for g in gens:
        g.pos += 1
    with np.errstate(over="ignore"):
        x = _mix64_array(seeds ^ _mix64_array(pos + np.uint64(_SPLIT[0])))
    return torch.from_numpy((x >> np.uint64(12)).astype(np.float64) / float(1 << 52))


def _generator(seq, params):
    """The sequence's Draws, made at its first temperature draw from the
    seed ("s", a random one when absent) and the generated position it
    starts at ("g")."""
    if seq.gen is None:
        seed = params.get("s")
        seed = int(seed) & _MASK64 if seed is not None else random.getrandbits(64)
        seq.gen = Draws(seed, int(params.get("g") or 0))
    return seq.gen


def draws(logits, rows, items):
    """The temperature draws of rows (indices into logits [S, vocab] and
    items, each with t > 0), for all of them at once: the rows' filtered
    probabilities (filtered), then each row's token by inverse transform
    (pick) with its uniform for this draw (Draws.next). A few kernels
    whatever the batch: a loop over the rows launched a dozen a row, and a
    server's default temperature of 1 made every row of a step take it.
    Returns the tokens, int64 [len(rows)] on logits' device."""
    dev = logits.device
    ps = [items[i][0] for i in rows]
    x = logits if len(rows) == logits.shape[0] and rows == list(range(len(rows))) else logits[to_device(rows, dev)]
    u = to_device(uniforms([_generator(items[i][1], p) for i, p in zip(rows, ps)]), dev)
    return pick(filtered(x.float(), ps), u)


def filtered(x, ps):
    """Rows x [n, vocab] (float32) as probabilities after each row's
    parameters ps: temperature "t", then top-k "k" (ties with the k-th
    kept), top-p "p" (the smallest prefix of the sorted probabilities
    reaching p) and min-p "m" (below m times the row's largest dropped),
    left unnormalised once zeroed. Parameters every row shares are
    scalars, and the filters no row asks for do not run: a step of
    default rows (temperature 1) is a softmax."""
    dev, V = x.device, x.shape[-1]

    def column(values):  # one value a row: a scalar when all agree
        return values[0] if len(set(values)) == 1 else to_device(values, dev, torch.float32).unsqueeze(1)

    t = column([float(p["t"]) for p in ps])
    if not isinstance(t, float) or t != 1.0:
        x = x / t
    ks = [int(p.get("k") or 0) for p in ps]
    if any(0 < k < V for k in ks):
        kmax = max(k for k in ks if 0 < k < V)  # a row's k of V or more filters nothing
        top = torch.topk(x, kmax, dim=-1).values
        if len(set(ks)) == 1:
            kth = top[:, kmax - 1 :]
        else:  # each row's k-th (any entry for rows that keep all: dropped below)
            kth = top.gather(1, to_device([[max(min(k, kmax), 1) - 1] for k in ks], dev))
        drop = x < kth
        if not all(0 < k < V for k in ks):  # rows whose k does not filter keep all
            drop &= to_device([[0 < k < V] for k in ks], dev, torch.bool)
        x = x.masked_fill(drop, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    tops = [float(p.get("p") or 0) for p in ps]
    some = [i for i, tp in enumerate(tops) if 0 < tp < 1]
    if some:  # the rows that ask, sorted (a sort of the whole vocabulary a row)
        sub = probs if len(some) == len(ps) else probs[to_device(some, dev)]
        sp, si = torch.sort(sub, dim=-1, descending=True)
        sp = sp.masked_fill(torch.cumsum(sp, dim=-1) - sp >= column([tops[i] for i in some]), 0)
        sub = torch.zeros_like(sub).scatter(1, si, sp)
        probs = sub if len(some) == len(ps) else probs.index_copy(0, to_device(some, dev), sub)
    mins = [float(p.get("m") or 0) for p in ps]
    if any(m > 0 for m in mins):
        probs = probs.masked_fill(probs < column(mins) * probs.amax(dim=-1, keepdim=True), 0)
    return probs


def pick(probs, u):
    """Each row's token of probs [n, vocab] (non-negative, unnormalised)
    for its uniform u [n] (float64) in [0, 1): the first whose cumulative
    weight exceeds u times the row's total. Each probability is weighed
    as a whole multiple of 2^-32 of its row's largest (rounded down), so
    the cumulative weights are exact integers whatever order a scan adds
    them in (CUDA's add in tree order, and a float sum could move across
    a token of probability 0, or fall): flat over tokens of weight 0,
    never falling. The target, below the total, then lands on a token of
    weight above 0. A token under 2^-32 of its row's largest is never
    drawn. A row with nothing left (every token masked, or NaN logits)
    takes its largest entry, as greedy sampling would."""
    # A row with nothing left has a NaN (or 0) largest entry: weights 0.
    w = torch.nan_to_num(probs * (4294967296.0 / probs.amax(dim=-1, keepdim=True)), nan=0.0, posinf=0.0)
    cum = torch.cumsum(w.floor_().to(torch.int64), dim=-1)
    total = cum[:, -1]
    target = torch.minimum((u * total).floor_().to(torch.int64), total - 1)
    tok = torch.searchsorted(cum, target.unsqueeze(1), right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)
    return torch.where(total > 0, tok, torch.argmax(probs, dim=-1))


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
    temp = [i for i, (params, _) in enumerate(items) if float(params.get("t") or 0) > 0]
    if len(temp) == S:
        out = draws(logits, temp, items)
    else:
        out = torch.argmax(logits, dim=-1)
        if temp:
            out[to_device(temp, logits.device)] = draws(logits, temp, items)
    for _, seq in items:
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
