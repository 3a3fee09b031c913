"""Paged KV memory: a pool of fixed-size blocks (PagedAttention, Kwon et
al., SOSP 2023) with a prefix cache on full blocks.

A block holds the KV of block_size consecutive tokens of one sequence.
Blocks are referenced by open sequences and by saved prefixes; a block
nobody references is free, or cached when it holds a full block of
tokens whose prefix is known: the cache maps (parent node, the block's
tokens) to the block, a radix tree kept as a dict, so a prompt finds the
blocks of its longest cached prefix exactly (no hash collisions: node ids
are never reused). Cached blocks nobody references are evicted least
recently used first, and only when a block is needed.

Accounting (engine.BlockPool): free() counts the blocks no open sequence
holds: free ones, cached ones and those held only by saved prefixes; the
owner's reclaim callback frees saved prefixes when a block is needed and
no free or cached one is left.
"""
import collections


class OutOfBlocks(Exception):
    """The pool cannot give a block: every block is held by a sequence."""


class Pool:
    def __init__(self, n, size, reclaim=None):
        if n < 1 or size < 1:
            raise ValueError("a pool needs at least one block of at least one token")
        self.n, self.size = n, size
        self.reclaim = reclaim or (lambda: False)  # frees a saved prefix; False when none is left
        self.refs = [0] * n  # references: sequences and saved prefixes
        self.seq_refs = [0] * n  # references by open sequences
        self.held = 0  # blocks with seq_refs > 0
        self.stack = list(range(n - 1, -1, -1))  # free blocks, lowest id on top
        self.key = [None] * n  # the cache key of a cached block
        self.node = [0] * n  # the cache node of a cached block
        self.cache = {}  # (parent node, tokens) -> block
        self.lru = collections.OrderedDict()  # cached blocks nobody references, oldest first
        self.next_node = 1

    def free(self):
        """Blocks sequences can take now (engine.BlockPool.FreeBlocks)."""
        return self.n - self.held

    def blocks_for(self, tokens):
        return -(-tokens // self.size)

    def take(self):
        """A block for a sequence: a free one, else the least recently used
        cached one, else one a saved prefix gave up. Raises OutOfBlocks."""
        while not self.stack and not self.lru:
            if not self.reclaim():
                raise OutOfBlocks()
        if self.stack:
            b = self.stack.pop()
        else:
            b, _ = self.lru.popitem(last=False)
            self._uncache(b)
        self.refs[b] = self.seq_refs[b] = 1
        self.held += 1
        return b

    def take_many(self, k):
        """k blocks for a sequence, in the order k take() calls give them.
        Raises OutOfBlocks, taking none, when fewer than k are free (a
        block no sequence holds can always be had: free, cached, or given
        up by the saved prefixes holding it)."""
        if k > self.n - self.held:
            raise OutOfBlocks()
        stack, refs, seq_refs = self.stack, self.refs, self.seq_refs
        out = stack[-k:]  # pop() takes from the top, so reversed
        del stack[-k:]
        out.reverse()
        while len(out) < k and self.lru:
            b, _ = self.lru.popitem(last=False)
            self._uncache(b)
            out.append(b)
        for b in out:
            refs[b] = seq_refs[b] = 1
        self.held += len(out)
        while len(out) < k:  # none free or idle: saved prefixes give theirs up (take)
            out.append(self.take())
        return out

    def adopt(self, b):
        """A sequence takes over b, cached and referenced by nobody: out of
        the cache, the sequence's own (it will write into it)."""
        assert self.refs[b] == 0 and self.key[b] is not None, "block %d is not an idle cached block" % b
        del self.lru[b]
        self._uncache(b)
        self.refs[b] = self.seq_refs[b] = 1
        self.held += 1

    def take_idle(self):
        """A free block, else the least recently used cached one nobody
        references (evicted from the cache); never one a saved prefix
        holds. None when neither is left. For blocks taken ahead of need
        (lookahead): once the cache has filled the pool the free list
        stays empty, and a block only from it would never come."""
        if not self.stack and not self.lru:
            return None
        return self.take()

    def idle(self):
        """Blocks take_idle can give: free ones and idle cached ones."""
        return len(self.stack) + len(self.lru)

    def share(self, b):
        """A sequence references b too."""
        if self.seq_refs[b] == 0:
            self.held += 1
            self.lru.pop(b, None)
        self.seq_refs[b] += 1
        self.refs[b] += 1

    def release(self, b):
        """A sequence drops its reference on b."""
        self.seq_refs[b] -= 1
        if self.seq_refs[b] == 0:
            self.held -= 1
        self._unref(b)

    def keep(self, b):
        """A saved prefix references b."""
        self.refs[b] += 1
        self.lru.pop(b, None)

    def unkeep(self, b):
        """A saved prefix drops its reference on b."""
        self._unref(b)

    def _unref(self, b):
        self.refs[b] -= 1
        if self.refs[b] == 0:
            if self.key[b] is not None:
                self.lru[b] = None
            else:
                self.stack.append(b)
        elif self.refs[b] < 0:
            raise AssertionError("block %d released more often than referenced" % b)

    def _uncache(self, b):
        del self.cache[self.key[b]]
        self.key[b] = None
        self.node[b] = 0

    def lookup(self, parent, toks):
        """The cached block holding toks after the prefix ending at node
        parent (0: the start), or None."""
        return self.cache.get((parent, toks))

    def register(self, b, parent, toks):
        """Caches full block b (tokens toks after node parent). Returns the
        block that holds them in the cache: b, or an older block with the
        same tokens, which the caller should use instead of b."""
        k = (parent, toks)
        old = self.cache.get(k)
        if old is not None:
            return old
        if self.key[b] is not None:  # cached under another prefix already: keep that
            return b
        self.cache[k] = b
        self.key[b] = k
        self.node[b] = self.next_node
        self.next_node += 1
        return b

    def check(self, owners):
        """Verifies the invariants against owners, a list of (block list,
        is a sequence) for every sequence and saved prefix; raises
        AssertionError on the first violation (tests)."""
        refs, seq_refs = [0] * self.n, [0] * self.n
        for blocks, is_seq in owners:
            for b in blocks:
                refs[b] += 1
                seq_refs[b] += is_seq
        assert refs == self.refs, "reference counts drifted"
        assert seq_refs == self.seq_refs, "sequence reference counts drifted"
        assert self.held == sum(1 for r in seq_refs if r), "held count drifted"
        free = set(self.stack)
        assert len(free) == len(self.stack), "a block is free twice"
        for b in range(self.n):
            idle = refs[b] == 0
            assert (b in free) == (idle and self.key[b] is None), "block %d: free list wrong" % b
            assert (b in self.lru) == (idle and self.key[b] is not None), "block %d: LRU wrong" % b
            if self.key[b] is not None:
                assert self.cache.get(self.key[b]) == b, "block %d: cache entry wrong" % b
        assert len(self.cache) == sum(1 for k in self.key if k is not None), "cache size drifted"
