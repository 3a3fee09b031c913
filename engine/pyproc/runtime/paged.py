"""Sequences on paged KV memory: the KV tensors, the block table the
kernels read, saved prefixes and automatic prefix reuse (blocks.py keeps
the pool and the cache).

Layout: k[layer] and v[layer] are [blocks + 1, block_size, kv_heads,
head_dim]; the last block is scratch (padding rows of a CUDA graph write
there). Row r of the table [rows, max_blocks] (int32, on the device)
lists the blocks of the sequence in table row r; row 0 is scratch, every
entry the scratch block.
"""
import collections
import os

import torch

from blocks import OutOfBlocks, Pool
from upload import to_device

MAX_SAVED = 8192  # saved prefixes kept at most; beyond, the oldest is evicted (reported)


def common_prefix(a, b):
    """Length of the longest common prefix of the lists a and b."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect on slices compared in C
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class Seq:
    """An open sequence: its tokens, blocks and table row; sampling state."""
    __slots__ = ("row", "blocks", "reg", "node", "tokens", "gen", "sampled", "counts", "hist")

    def __init__(self, row, tokens, blocks):
        self.row, self.tokens, self.blocks = row, tokens, blocks
        self.reg, self.node = 0, 0  # leading blocks in the prefix cache, the last one's node
        self.gen, self.sampled, self.counts = None, False, {}
        self.hist = None  # generator states before recent draws (lookahead.rewind)


class Saved:
    __slots__ = ("tokens", "blocks")

    def __init__(self, tokens, blocks):
        self.tokens, self.blocks = tokens, blocks


class PagedKV:
    def __init__(self, cfg, device, dtype, blocks, block_size, rows):
        self.device, self.bs = device, block_size
        self.pool = Pool(blocks, block_size, reclaim=self._reclaim)
        self.scratch = blocks
        self.max_blocks = -(-cfg.context // block_size)
        shape = (cfg.layers, blocks + 1, block_size, cfg.kv_heads, cfg.head_dim)
        # Zeroed once, up front (one pass over the pool at load, ~20 ms for
        # 65 GB on an H100): the masked tail of a block must never hold
        # NaN from uninitialised memory. Zeroing each block when first
        # taken cost two kernels per block in the serving path.
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.kc, self.vc = list(self.k.unbind(0)), list(self.v.unbind(0))
        self.table = torch.full((rows + 1, self.max_blocks), blocks, dtype=torch.int32, device=device)
        self.free_rows = list(range(rows, 0, -1))
        self.pending = ([], [], [])  # table writes (row, index, block) not yet on the device
        self.saved = collections.OrderedDict()  # key -> Saved, least recently used first
        self.evicted = []  # saved keys given up, reported on the next reply
        self.table_grown = False  # the table was reallocated: captured graphs read the old one
        # Reuse of cached full blocks by Opens without a key (the prefix cache).
        self.auto_prefix = os.environ.get("MLXSERVING_PREFIX_CACHE", "1") != "0"

    def bytes(self):
        return 2 * self.k.numel() * self.k.element_size()

    # Blocks.

    def _take(self, free_only=False):
        b = self.pool.take_free() if free_only else self.pool.take()
        return b

    def _set(self, s, i, b):
        if i < len(s.blocks):
            s.blocks[i] = b
        else:
            s.blocks.append(b)
        r, x, y = self.pending
        r.append(s.row)
        x.append(i)
        y.append(b)

    def flush(self):
        """Writes the pending block-table entries to the device table."""
        r, x, y = self.pending
        if not r:
            return
        # One write per entry, the last: a freed sequence's row may have
        # entries pending (a block swapped for its cached twin) when a new
        # sequence takes the row, and the GPU applies duplicate indices in
        # no particular order.
        last = {}
        for i, k in enumerate(zip(r, x)):
            last[k] = i
        if len(last) < len(r):
            keep = sorted(last.values())
            r, x, y = [r[i] for i in keep], [x[i] for i in keep], [y[i] for i in keep]
        t = to_device([r, x, y], self.device)
        self.table[t[0], t[1]] = t[2].to(torch.int32)
        self.pending = ([], [], [])

    def need(self, s, tokens):
        """Blocks s takes to hold tokens tokens."""
        return max(0, self.pool.blocks_for(tokens) - len(s.blocks))

    def grow(self, s, tokens, free_only=False):
        """Gives s the blocks to hold tokens tokens; with free_only, only
        while free blocks last (lookahead). Returns the tokens s can hold."""
        while len(s.blocks) * self.bs < tokens:
            b = self._take(free_only)
            if b is None:
                break
            self._set(s, len(s.blocks), b)
        return min(tokens, len(s.blocks) * self.bs)

    def truncate(self, s, tokens):
        """Releases the blocks of s past those holding tokens tokens."""
        keep = self.pool.blocks_for(tokens)
        while len(s.blocks) > keep:
            self.pool.release(s.blocks.pop())
        if s.reg > tokens // self.bs:  # never while running: only prompt blocks are cached then
            s.reg = tokens // self.bs
            s.node = self.pool.node[s.blocks[s.reg - 1]] if s.reg else 0

    def register(self, s, upto):
        """Puts the full blocks of s within its first upto tokens in the
        prefix cache; a block whose tokens are cached already is replaced
        by the cached one (shared, its own copy released)."""
        pool, bs = self.pool, self.bs
        while s.reg < min(upto, len(s.tokens)) // bs and s.reg < len(s.blocks):
            i = s.reg
            b = s.blocks[i]
            got = pool.register(b, s.node, tuple(s.tokens[i * bs : (i + 1) * bs]))
            if got != b:
                pool.share(got)
                self._set(s, i, got)
                pool.release(b)
            s.node = pool.node[got]
            s.reg += 1

    # Sequences.

    def _row(self):
        if not self.free_rows:
            old = self.table
            n = old.shape[0]
            self.table = torch.full((2 * n, self.max_blocks), self.scratch, dtype=torch.int32, device=self.device)
            self.table[:n] = old
            self.free_rows = list(range(2 * n - 1, n - 1, -1))
            self.table_grown = True
        return self.free_rows.pop()

    def _match(self, prompt, key):
        """(blocks, tokens) of the reusable prefix: with a key, the longest
        common prefix with what is saved under it; without, the cached
        full blocks that start the prompt."""
        if key:
            e = self.saved.get(key)
            if e is None:
                return [], 0
            self.saved.move_to_end(key)
            n = common_prefix(e.tokens, prompt)
            return e.blocks[: self.pool.blocks_for(n)], n
        pool, bs, node, out = self.pool, self.bs, 0, []
        for i in range(len(prompt) // bs if self.auto_prefix else 0):
            b = pool.lookup(node, tuple(prompt[i * bs : (i + 1) * bs]))
            if b is None:
                break
            out.append(b)
            node = pool.node[b]
        return out, len(out) * bs

    def open(self, prompt, key):
        """A new sequence for prompt, starting with the KV of its reusable
        prefix (never the whole prompt). Raises OutOfBlocks, changing
        nothing, when the pool cannot hold the reused blocks."""
        src, n = self._match(prompt, key)
        reused = min(n, len(prompt) - 1)
        full = reused // self.bs
        part = reused % self.bs != 0
        pool = self.pool
        if sum(1 for b in src[:full] if pool.seq_refs[b] == 0) + part > pool.free():
            raise OutOfBlocks()
        s = Seq(self._row(), list(prompt[:reused]), [])
        for i, b in enumerate(src[:full]):
            pool.share(b)
            self._set(s, i, b)
        if part and pool.refs[src[full]] == 0:
            # Cached and referenced by nobody: the sequence takes the block
            # over instead of copying it (it may be the only one to spare).
            pool.adopt(src[full])
            self._set(s, full, src[full])
        elif part:
            old = src[full]
            pool.keep(old)  # taking a block may evict the prefix being copied
            try:
                new = self._take()
            except OutOfBlocks:  # the only block to spare was the one copied from
                pool.unkeep(old)
                self.free(s, "")
                raise
            self.k[:, new] = self.k[:, old]
            self.v[:, new] = self.v[:, old]
            pool.unkeep(old)
            self._set(s, full, new)
        while s.reg < full and pool.key[s.blocks[s.reg]] is not None:
            s.node = pool.node[s.blocks[s.reg]]
            s.reg += 1
        return s, reused

    def free(self, s, key):
        """Releases s; with a key, its blocks stay referenced by a saved
        prefix under key (replacing what was there), no copy."""
        self.register(s, len(s.tokens))
        if key and s.tokens:
            old = self.saved.pop(key, None)
            n = self.pool.blocks_for(len(s.tokens))
            for b in s.blocks[:n]:
                self.pool.keep(b)
            self.saved[key] = Saved(s.tokens, s.blocks[:n])
            if old is not None:
                self._unsave(old)
            while len(self.saved) > MAX_SAVED:
                k, e = self.saved.popitem(last=False)
                self._unsave(e)
                self.evicted.append(k)
        for b in s.blocks:
            self.pool.release(b)
        s.blocks = []
        self.free_rows.append(s.row)

    def _unsave(self, e):
        for b in e.blocks:
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
        owners = [(s.blocks, True) for s in seqs] + [(e.blocks, False) for e in self.saved.values()]
        self.pool.check(owners)
        for s in seqs:
            assert len(s.blocks) >= self.pool.blocks_for(len(s.tokens)), "a sequence holds fewer blocks than tokens"
        self.flush()
        for s in seqs:
            assert self.table[s.row, : len(s.blocks)].tolist() == s.blocks, "table row differs from the blocks"

    def stats(self, seqs):
        held = sum(len(s.blocks) for s in seqs)
        toks = sum(len(s.tokens) for s in seqs)
        return {"blocks": self.pool.n, "block_size": self.bs, "free_blocks": self.pool.free(),
                "cached_blocks": len(self.pool.cache), "saved": len(self.saved),
                "saved_tokens": sum(len(e.tokens) for e in self.saved.values()),
                "seq_blocks": held, "seq_tokens": toks,
                "waste": (1 - toks / (held * self.bs)) if held else 0.0}


__all__ = ["OutOfBlocks", "PagedKV", "Seq", "common_prefix"]
