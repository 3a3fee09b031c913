"""Sequences on paged KV memory: the KV tensors, the block tables the
kernels read, saved prefixes and automatic prefix reuse (blocks.py keeps
the pool and the cache).

Layout (Layout below): the layers fall in groups of G layers of one kind,
full attention or sliding window (G the gcd of the two kinds' counts; a
model without sliding layers is one group of every layer). A block (a
page of the pool) holds one group's G layers for block_size tokens:
k[slot] and v[slot] are [blocks + 1, block_size, kv_heads, head_dim],
slot a layer's place in its group, so layer l reads kc[l] (the tensor of
its slot) through its group's table. The last block is scratch: padding
rows of a CUDA graph write there, and a sliding group's table points
there for the blocks that left its window (the kernels and masks never
read them). The table [rows, groups * max_blocks] (int32, on the device)
holds each group's table side by side; row r lists the blocks of the
sequence in table row r; row 0 is scratch, every entry the scratch block.

Sliding windows (vLLM's hybrid allocator, SGLang's SWA pool): a sequence
of n tokens holds ceil(n/bs) blocks in each full group, and in each
sliding group only its last window_blocks of them (engine.Info.BlocksFor
counts the same); the blocks before return to the pool as it grows.
window_blocks covers the window of a step of up to Layout.step tokens and
a take-back of up to Layout.margin tokens (lookahead), so such a step never
needs a block it gave back. A longer prompt chunk keeps the blocks its
first token's window reads until the step ends (settle gives them back):
for a moment it holds more than BlocksFor, and when the pool lacks them,
TorchModel feeds it in pieces of Layout.step instead.
"""
import collections
import math

import torch

from ..seqs import SeqState, common_prefix
from ..settings import Settings
from .blocks import OutOfBlocks, Pool
from .upload import to_device

MAX_SAVED = 8192  # saved prefixes kept at most; beyond, the oldest is evicted (reported)


class Layout:
    """How the layers share blocks: groups (lists of layers), each group's
    window (0: full attention), and for sliding groups window_blocks, the
    most blocks of a sequence they hold, and step, the most tokens one
    sequence is fed at once within them. windows: each layer's window;
    step: None takes 64 tokens, at least a block (settings.window_step);
    margin: the tokens of lookahead growth or take-back the sliding
    groups' blocks allow (None: the default lookahead limit)."""

    def __init__(self, windows, bs, context, step=None, margin=None):
        layers = len(windows)
        W = max(windows) if windows else 0
        if step is None:
            step = max(bs, 64)
        step = max(1, step)
        self.margin = margin or Settings().lookahead_limit
        wb = -(-(W + step + self.margin - 2) // bs) + 1 if W else 0
        if not W or wb >= -(-context // bs):  # no window, or none that frees a block: one group, as dense
            self.groups, self.windows, self.window, self.window_blocks, self.step = [list(range(layers))], [0], 0, 0, 0
        else:
            full = [i for i in range(layers) if not windows[i]]
            sliding = [i for i in range(layers) if windows[i]]
            g = math.gcd(len(full), len(sliding))
            self.groups = [full[i : i + g] for i in range(0, len(full), g)] + [sliding[i : i + g] for i in range(0, len(sliding), g)]
            # Sliding layers of several windows free by the widest.
            self.windows = [0] * (len(full) // g) + [W] * (len(sliding) // g)
            self.window, self.window_blocks, self.step = W, wb, step
        self.group_of, self.slot_of = [0] * layers, [0] * layers
        for gi, ls in enumerate(self.groups):
            for j, li in enumerate(ls):
                self.group_of[li], self.slot_of[li] = gi, j
        self.size = len(self.groups[0])  # layers per block
        self.full_groups = sum(1 for w in self.windows if not w)
        self.sliding_groups = len(self.windows) - self.full_groups

    def blocks_for(self, bs, tokens):
        """Blocks a sequence of tokens tokens holds (engine.Info.BlocksFor)."""
        nb = -(-tokens // bs)
        if not self.sliding_groups:
            return nb * len(self.groups)
        return self.full_groups * nb + self.sliding_groups * min(nb, self.window_blocks)

    def low(self, bs, tokens, fed):
        """The first block a sliding group keeps of a sequence that holds
        tokens tokens, fed already of them: the last window_blocks, and
        never one the window of the token after the fed ones reads."""
        nb = -(-tokens // bs)
        return max(0, min(nb - self.window_blocks, (fed - self.window + 1) // bs))


class Seq(SeqState):
    """An open sequence: its tokens, blocks and table row; sampling state.
    pages[g] lists the blocks of group g by position (a sliding group's
    blocks out of its window: None); blocks is the first group's. pool: a
    pooled sequence's state (pooling.Pooled), None for a generating one.
    adapter: the LoRA adapter it runs (its key, "" for the base) and lora
    its device slot (lora.py; 0 for the base); root: the prefix cache node
    its blocks hang from (0 for the base, one per adapter: KV is never
    shared between adapters)."""
    __slots__ = ("row", "pages", "reg", "node", "gen", "hist", "pool", "adapter", "lora", "root")

    def __init__(self, row, tokens, pages):
        super().__init__(tokens)
        self.row, self.pages = row, pages
        self.reg, self.node = 0, 0  # leading blocks in the prefix cache, the last one's node
        self.gen = None  # sampling.Draws
        self.hist = None  # generator states before recent draws (lookahead.rewind)
        self.pool = None
        self.adapter, self.lora, self.root = "", 0, 0

    @property
    def blocks(self):
        return self.pages[0]

    def held(self):
        return [b for p in self.pages for b in p if b is not None]


class Saved:
    __slots__ = ("tokens", "pages", "adapter")

    def __init__(self, tokens, pages, adapter=""):
        self.tokens, self.pages, self.adapter = tokens, pages, adapter

    def held(self):
        return [b for p in self.pages for b in p if b is not None]


class PagedKV:
    """The pool of KV blocks and the sequences on it. dtype: what k and v
    hold, unless fmt (kvcache.KVFormat) says how they are stored (FP8)."""

    def __init__(self, cfg, device, dtype, blocks, block_size, rows, layout=None, prefix_cache=True, fmt=None):
        self.device, self.bs = device, block_size
        self.max_blocks = -(-cfg.context // block_size)
        windows = getattr(cfg, "windows", None) or [0] * cfg.layers
        lay = self.layout = layout or Layout(windows, block_size, cfg.context)
        self.ngroups = len(lay.groups)
        self.group_of = lay.group_of
        self.pool = Pool(blocks, block_size, reclaim=self._reclaim)
        self.scratch = blocks
        shape = (lay.size, blocks + 1, block_size, cfg.kv_heads, cfg.head_dim)
        # Zeroed once, up front (one pass over the pool at load, ~20 ms for
        # 65 GB on an H100): the masked tail of a block must never hold
        # NaN from uninitialised memory. Zeroing each block when first
        # taken cost two kernels per block in the serving path.
        zeros = fmt.zeros if fmt is not None else (lambda shape, device: torch.zeros(shape, device=device, dtype=dtype))
        self.k, self.v = zeros(shape, device), zeros(shape, device)
        ks, vs = self.k.unbind(0), self.v.unbind(0)
        self.kc = [ks[lay.slot_of[li]] for li in range(cfg.layers)]  # layer -> its slot's blocks
        self.vc = [vs[lay.slot_of[li]] for li in range(cfg.layers)]
        self._set_table(torch.full((rows + 1, self.ngroups * self.max_blocks), blocks, dtype=torch.int32, device=device))
        self.free_rows = list(range(rows, 0, -1))
        self.pending = ([], [], [])  # table writes (row, column, block) not yet on the device
        self.saved = collections.OrderedDict()  # key -> Saved, least recently used first
        self.evicted = []  # saved keys given up, reported on the next reply
        self.table_grown = False  # the table was reallocated: captured graphs read the old one
        # Reuse of cached full blocks by Opens without a key (the prefix
        # cache; settings.prefix_cache). Not with sliding groups: their
        # blocks of a prefix's start are gone once the sequence moves on.
        self.auto_prefix = prefix_cache and not lay.sliding_groups
        self.roots = {}  # adapter key -> its prefix cache root node (root)

    def _set_table(self, t):
        self.table = t
        mb = self.max_blocks
        self.tables = [t[:, g * mb : (g + 1) * mb] for g in range(self.ngroups)]

    def table_of(self, li):
        """Layer li's block table: its group's [rows, max_blocks] view."""
        return self.tables[self.group_of[li]]

    def bytes(self):
        return 2 * self.k.numel() * self.k.element_size()

    def blocks_for(self, tokens):
        """Blocks a sequence of tokens tokens holds (engine.Info.BlocksFor)."""
        return self.layout.blocks_for(self.bs, tokens)

    # Blocks.

    def _take(self, ahead=False):
        return self.pool.take_idle() if ahead else self.pool.take()

    def _set(self, s, i, b, g=0):
        p = s.pages[g]
        if i < len(p):
            p[i] = b
        else:
            p.append(b)
        r, x, y = self.pending
        r.append(s.row)
        x.append(g * self.max_blocks + i)
        y.append(self.scratch if b is None else b)

    def _extend(self, s, blocks, g=0):
        """_set for blocks (taken ones, never None) at the end of group g
        of s, at once."""
        p, n = s.pages[g], len(blocks)
        r, x, y = self.pending
        at = g * self.max_blocks + len(p)
        p += blocks
        r += [s.row] * n
        x += range(at, at + n)
        y += blocks

    def flush(self):
        """Writes the pending block-table entries to the device table."""
        r, x, y = self.pending
        if not r:
            return
        # One write per entry, the last: a freed sequence's row may have
        # entries pending (a block swapped for its cached twin) when a new
        # sequence takes the row, and the GPU applies duplicate indices in
        # no particular order.
        last = dict(zip(zip(r, x), range(len(r))))
        if len(last) < len(r):
            keep = sorted(last.values())
            r, x, y = [r[i] for i in keep], [x[i] for i in keep], [y[i] for i in keep]
        t = to_device([r, x, y], self.device)
        self.table[t[0], t[1]] = t[2].to(torch.int32)
        self.pending = ([], [], [])

    def _sliding(self):
        return [g for g, w in enumerate(self.layout.windows) if w]

    def _gone(self, s, tokens, fed=None):
        """The blocks of s its sliding groups give back when it grows to
        hold tokens tokens, fed of them already (None: its tokens):
        [(group, index)]."""
        if not self.layout.sliding_groups:
            return []
        lo = self.layout.low(self.bs, tokens, len(s.tokens) if fed is None else fed)
        return [(g, i) for g in self._sliding() for i in range(min(lo, len(s.pages[g]))) if s.pages[g][i] is not None]

    def _wanted(self, s, tokens, fed=None):
        """The blocks s takes to hold tokens tokens: per new position
        index, the groups that take one."""
        nb = -(-tokens // self.bs)
        lo = self.layout.low(self.bs, tokens, len(s.tokens) if fed is None else fed) if self.layout.sliding_groups else 0
        win = self.layout.windows
        return [(i, [g for g in range(self.ngroups) if not win[g] or i >= lo]) for i in range(len(s.pages[0]), nb)]

    def need(self, s, tokens, pieces=False):
        """Blocks s takes from the free ones to hold tokens tokens (those
        its sliding groups give back counted off): fed at once, or with
        pieces, fed in pieces of layout.step tokens (what BlocksFor's
        growth counts)."""
        if not self.layout.sliding_groups:  # every group takes a block a new position, none gives back
            return max(0, -(-tokens // self.bs) - len(s.pages[0])) * self.ngroups
        fed = tokens if pieces else None
        back = sum(1 for g, i in self._gone(s, tokens, fed) if self.pool.seq_refs[s.pages[g][i]] == 1)
        return max(0, sum(len(gs) for _, gs in self._wanted(s, tokens, fed)) - back)

    def _slide(self, s, tokens):
        for g, i in self._gone(s, tokens):
            self.pool.release(s.pages[g][i])
            self._set(s, i, None, g)

    def settle(self, s):
        """Gives back the blocks of s its sliding groups' windows no
        longer read (after a step: BlocksFor(tokens) held again)."""
        self._slide(s, len(s.tokens))

    def grow(self, s, tokens, ahead=False):
        """Gives s the blocks to hold tokens tokens, its sliding groups
        giving back first those out of the window of its next token; with
        ahead, only while free or idle cached blocks last (Pool.take_idle:
        no saved prefix is given up), giving back none (lookahead and the
        speculated step: the tokens may be taken back). Returns the tokens
        s can hold."""
        if not self.layout.sliding_groups:
            if tokens <= len(s.pages[0]) * self.bs:
                return tokens  # the common decode step: its block is there
            return self._grow_dense(s, tokens, ahead)
        if not ahead:
            self._slide(s, tokens)
        for i, gs in self._wanted(s, tokens):
            if ahead and self.pool.idle() < len(gs):
                break  # every group's block of a position, or none
            for g in range(self.ngroups):
                self._set(s, i, self._take(ahead) if g in gs else None, g)
        return min(tokens, len(s.pages[0]) * self.bs)

    def _grow_dense(self, s, tokens, ahead):
        """grow without sliding groups: each new position takes a block in
        every group (a prompt chunk's many at once, without grow's
        per-position lists)."""
        have, nb = len(s.pages[0]), -(-tokens // self.bs)
        if ahead:
            nb = min(nb, have + self.pool.idle() // self.ngroups)
        G = self.ngroups
        if (nb - have) * G == 1:  # a decode row's next block: less work than a batch's setup
            self._set(s, have, self.pool.take())
        elif nb > have:
            # A prompt chunk's blocks taken at once (Pool.take_many),
            # position by position, a block for each group.
            got = self.pool.take_many((nb - have) * G)
            for g in range(G):
                self._extend(s, got[g::G] if G > 1 else got, g)
        return min(tokens, len(s.pages[0]) * self.bs)

    def truncate(self, s, tokens):
        """Releases the blocks of s past those holding tokens tokens."""
        keep = -(-tokens // self.bs)
        for p in s.pages:
            while len(p) > keep:
                b = p.pop()
                if b is not None:
                    self.pool.release(b)
        if s.reg > tokens // self.bs:  # never while running: only prompt blocks are cached then
            s.reg = tokens // self.bs
            s.node = self.pool.node[s.blocks[s.reg - 1]] if s.reg else s.root

    def window_held(self, pages, tokens):
        """Whether pages (per group) hold every block the window of the
        token after the first tokens reads."""
        if not self.layout.sliding_groups or tokens <= 0:
            return True
        first = max(0, tokens - self.layout.window + 1) // self.bs
        nb = -(-tokens // self.bs)
        return all(i < len(pages[g]) and pages[g][i] is not None for g in self._sliding() for i in range(first, nb))

    def register(self, s, upto):
        """Puts the full blocks of s within its first upto tokens in the
        prefix cache; a block whose tokens are cached already is replaced
        by the cached one (shared, its own copy released). Only with one
        group of full attention (see auto_prefix)."""
        if self.layout.sliding_groups or s.pool is not None:  # a pooled sequence's blocks stay its own
            return
        pool, bs, toks, blocks, node = self.pool, self.bs, s.tokens, s.blocks, s.node
        for i in range(s.reg, min(min(upto, len(toks)) // bs, len(blocks))):
            b = blocks[i]
            got = pool.register(b, node, tuple(toks[i * bs : (i + 1) * bs]))
            if got != b:
                pool.share(got)
                self._set(s, i, got)
                pool.release(b)
            node = s.node = pool.node[got]
            s.reg = i + 1

    # Sequences.

    def _row(self):
        if not self.free_rows:
            old = self.table
            n = old.shape[0]
            self._set_table(torch.full((2 * n, old.shape[1]), self.scratch, dtype=torch.int32, device=self.device))
            self.table[:n] = old
            self.free_rows = list(range(2 * n - 1, n - 1, -1))
            self.table_grown = True
        return self.free_rows.pop()

    def root(self, adapter):
        """The prefix cache node an adapter's blocks hang from: 0 for the
        base, a node of its own (never reused) for each adapter key."""
        if not adapter:
            return 0
        n = self.roots.get(adapter)
        if n is None:
            n = self.roots[adapter] = self.pool.next_node
            self.pool.next_node += 1
        return n

    def _match(self, prompt, key, adapter=""):
        """(pages, tokens) of the reusable prefix: with a key, the longest
        common prefix with what is saved under it (by the same adapter);
        without, the cached full blocks that start the prompt (under the
        adapter's root)."""
        if key:
            e = self.saved.get(key)
            if e is None or e.adapter != adapter:
                return [[] for _ in range(self.ngroups)], 0
            self.saved.move_to_end(key)
            n = common_prefix(e.tokens, prompt)
            nb = -(-n // self.bs)
            return [p[:nb] for p in e.pages], n
        pool, bs, node, out = self.pool, self.bs, self.root(adapter), []
        for i in range(len(prompt) // bs if self.auto_prefix else 0):
            b = pool.lookup(node, tuple(prompt[i * bs : (i + 1) * bs]))
            if b is None:
                break
            out.append(b)
            node = pool.node[b]
        return [out] + [[] for _ in range(self.ngroups - 1)], len(out) * bs

    def open(self, prompt, key, adapter=""):
        """A new sequence for prompt, starting with the KV of its reusable
        prefix (never the whole prompt; with sliding groups, none unless
        they still hold the blocks its window reads), run with adapter
        (see Seq). Raises OutOfBlocks, changing nothing, when the pool
        cannot hold the reused blocks."""
        src, n = self._match(prompt, key, adapter)
        reused = min(n, len(prompt) - 1)
        if not self.window_held(src, reused):
            reused = 0
        full = reused // self.bs
        part = reused % self.bs != 0
        pool = self.pool
        lo = self.layout.low(self.bs, reused, reused) if self.layout.sliding_groups else 0
        win = self.layout.windows
        use = [[b if not win[g] or i >= lo else None for i, b in enumerate(src[g][: full + part])] for g in range(self.ngroups)]
        shared = [b for g in range(self.ngroups) for b in use[g][:full] if b is not None]
        parts = [use[g][full] for g in range(self.ngroups) if part and use[g][full] is not None]
        if sum(1 for b in shared if pool.seq_refs[b] == 0) + len(parts) > pool.free():
            raise OutOfBlocks()
        s = Seq(self._row(), list(prompt[:reused]), [[] for _ in range(self.ngroups)])
        s.adapter = adapter
        s.root = s.node = self.root(adapter)
        for g in range(self.ngroups):
            for i, b in enumerate(use[g][:full]):
                if b is not None:
                    pool.share(b)
                self._set(s, i, b, g)
        olds = [use[g][full] for g in range(self.ngroups)] if part else []
        copied = [b for b in olds if b is not None and pool.refs[b] > 0]
        for b in copied:
            pool.keep(b)  # taking a block may evict the prefix being copied
        try:
            for g, old in enumerate(olds):
                if old is None:
                    self._set(s, full, None, g)
                elif old not in copied:
                    # Cached and referenced by nobody: the sequence takes the
                    # block over instead of copying it (it may be the only one
                    # to spare).
                    pool.adopt(old)
                    self._set(s, full, old, g)
                else:
                    try:
                        new = self._take()
                    except OutOfBlocks:  # the only block to spare was the one copied from
                        self.free(s, "")
                        raise
                    self.k[:, new] = self.k[:, old]
                    self.v[:, new] = self.v[:, old]
                    self._set(s, full, new, g)
        finally:
            for b in copied:
                pool.unkeep(b)
        while s.reg < full and not self.layout.sliding_groups and pool.key[s.blocks[s.reg]] is not None:
            s.node = pool.node[s.blocks[s.reg]]
            s.reg += 1
        return s, reused

    def open_fresh(self):
        """A new sequence reusing no KV (a pooled one: pooling reads every
        token's hidden state)."""
        return Seq(self._row(), [], [[] for _ in range(self.ngroups)])

    def free(self, s, key):
        """Releases s; with a key, its blocks stay referenced by a saved
        prefix under key (replacing what was there), no copy. A pooled
        sequence is never saved."""
        self.register(s, len(s.tokens))
        if key and s.tokens and s.pool is None:
            old = self.saved.pop(key, None)
            n = -(-len(s.tokens) // self.bs)
            e = Saved(s.tokens, [p[:n] for p in s.pages], s.adapter)
            for b in e.held():
                self.pool.keep(b)
            self.saved[key] = e
            if old is not None:
                self._unsave(old)
            while len(self.saved) > MAX_SAVED:
                k, e = self.saved.popitem(last=False)
                self._unsave(e)
                self.evicted.append(k)
        for b in s.held():
            self.pool.release(b)
        s.pages = [[] for _ in range(self.ngroups)]
        self.free_rows.append(s.row)

    def _unsave(self, e):
        for b in e.held():
            self.pool.unkeep(b)

    def drop(self, key):
        e = self.saved.pop(key, None)
        if e is not None:
            self._unsave(e)

    def _reclaim(self):
        if not self.saved:
            return False
        k, e = self.saved.popitem(last=False)
        self._unsave(e)
        self.evicted.append(k)
        return True

    def take_evicted(self):
        out, self.evicted = self.evicted, []
        return out

    def check(self, seqs):
        """The pool's invariants against the open sequences (tests)."""
        owners = [(s.held(), True) for s in seqs] + [(e.held(), False) for e in self.saved.values()]
        self.pool.check(owners)
        for s in seqs:
            assert all(len(p) == len(s.blocks) for p in s.pages), "groups hold different lengths"
            assert len(s.blocks) >= self.pool.blocks_for(len(s.tokens)), "a sequence holds fewer blocks than tokens"
            assert self.window_held(s.pages, len(s.tokens)), "a sliding group gave back a block its window reads"
        self.flush()
        for s in seqs:
            for g, p in enumerate(s.pages):
                want = [self.scratch if b is None else b for b in p]
                assert self.tables[g][s.row, : len(p)].tolist() == want, "table row differs from the blocks"

    def stats(self, seqs):
        held = sum(len(s.held()) for s in seqs)
        toks = sum(len(s.tokens) for s in seqs)
        # Token slots of the held blocks that hold no token yet.
        used = sum(max(0, min(self.bs, len(s.tokens) - i * self.bs)) for s in seqs for p in s.pages
                   for i, b in enumerate(p) if b is not None)
        return {"blocks": self.pool.n, "block_size": self.bs, "free_blocks": self.pool.free(),
                "cached_blocks": len(self.pool.cache), "saved": len(self.saved),
                "saved_tokens": sum(len(e.tokens) for e in self.saved.values()),
                "seq_blocks": held, "seq_tokens": toks,
                "waste": (1 - used / (held * self.bs)) if held else 0.0}


__all__ = ["OutOfBlocks", "PagedKV", "Seq"]
