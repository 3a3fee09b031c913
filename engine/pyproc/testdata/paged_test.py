"""Randomised checks of the paged KV memory (runtime/paged.py, blocks.py):
thousands of opens, feeds, take-backs, frees with and without a key,
drops and evictions against the pool's invariants (no block leaked, none
double-owned, reference counts exact, no table entry written twice in
one flush) and against the KV contents: every
sequence reads back, through its block table, exactly the tokens it was
fed, so shared and copied blocks hold the right tokens; and the KV rows
a packed step writes a chunk to (model._kv_runs) are its blocks'.

  python3 paged_test.py RUNTIME_DIR [OPS] [SEED]

Prints "N passed, 0 failed" or raises. Run by TestPagedRandom.
"""
import random
import sys

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

from mlxsworker.torchrt import model, paged, upload  # noqa: E402
from mlxsworker.torchrt.paged import OutOfBlocks, PagedKV  # noqa: E402

_to_device = paged.to_device


def unique_writes(values, dev):
    """The block-table writes of a flush name each entry once: a GPU
    applies duplicate indices in no particular order (on the CPU the last
    wins, which hid a freed row's stale entry overwriting a new one)."""
    r, x, _ = values
    assert len(set(zip(r, x))) == len(r), "a flush writes one table entry twice"
    return _to_device(values, dev)


paged.to_device = unique_writes


class Cfg:
    layers, kv_heads, head_dim, context = 1, 1, 2, 300


class Windowed:
    """A full layer and three sliding ones of window 9: a full group and
    three sliding groups of one layer each."""
    layers, kv_heads, head_dim, context = 4, 1, 2, 300
    windows = [0, 9, 9, 9]


def write(kv, s, start):
    """Stores each token id as its key at its position (the forward pass
    would store its key vector), in every group that holds it."""
    for p in range(start, len(s.tokens)):
        for pages in s.pages:
            if pages[p // kv.bs] is not None:
                kv.k[0, pages[p // kv.bs], p % kv.bs, 0, 0] = float(s.tokens[p])


def read(kv, s, g=0):
    """The tokens group g's table row gives; a sliding group's only from
    the first its window reads."""
    kv.flush()
    n = len(s.tokens)
    idx = kv.tables[g][s.row, : -(-n // kv.bs)].long()
    got = [int(x) for x in kv.k[0][idx].reshape(-1, 2)[:n, 0].tolist()]
    w = kv.layout.windows[g]
    return got[max(0, n - w + 1) if w else 0 :]


def rows_match(kv, s, start, end):
    """The KV rows a packed step writes positions start .. end - 1 of s to
    (model._kv_runs, expanded as Python ints and by torch ops) are those
    of its blocks, the scratch block's where a group gave a block back."""
    bs = kv.bs
    for pages in s.pages:
        want = [(kv.scratch if pages[p // bs] is None else pages[p // bs]) * bs + p % bs for p in range(start, end)]
        at, counts = [], []
        model._kv_runs(pages, bs, kv.scratch, start, end, at, counts)
        assert upload.pack_ints([[7]], at, counts, end - start).tolist() == [7] + want, "KV rows as ints differ"
        assert upload.expand_runs(at, counts, end - start).tolist() == want, "KV rows by torch ops differ"


def read_all(kv, s):
    return all(read(kv, s, g) == s.tokens[len(s.tokens) - len(read(kv, s, g)) :] for g in range(kv.ngroups))


def run(ops, seed, cfg=Cfg):
    rnd = random.Random(seed)
    bs = rnd.choice([1, 4, 16])
    lay = paged.Layout(getattr(cfg, "windows", [0] * cfg.layers), bs, cfg.context, step=8)
    kv = PagedKV(cfg, torch.device("cpu"), torch.float32, len(lay.groups) * rnd.choice([8, 40, 120]), bs, 2, lay)
    seqs, prompt_len, keys = {}, {}, ["a", "b", "c"]
    alphabet = [rnd.randrange(1000) for _ in range(3)]
    n_open = n_oom = n_reused = 0
    for _ in range(ops):
        op = rnd.random()
        if op < 0.25 or not seqs:
            base = [alphabet[(i * 7) % 3] if rnd.random() < 0.9 else rnd.randrange(1000) for i in range(rnd.randrange(1, 80))]
            key = rnd.choice(keys + ["", "", ""])
            before = kv.pool.free()
            try:
                s, reused = kv.open(base, key)
            except OutOfBlocks:
                n_oom += 1
                assert kv.pool.free() == before, "a refused open changed the pool"
                continue
            assert 0 <= reused < len(base) and s.tokens == base[:reused]
            assert len(s.held()) <= kv.blocks_for(reused), "open holds at most BlocksFor(reused) blocks"
            assert lay.sliding_groups or len(s.held()) == kv.blocks_for(reused), "open holds BlocksFor(reused) blocks"
            assert read_all(kv, s), "reused KV differs from the prompt"
            sid = rnd.randrange(1 << 30)
            seqs[sid] = (s, base)
            prompt_len[sid] = len(base)
            n_open += 1
            n_reused += reused > 0
        elif op < 0.6:
            sid = rnd.choice(list(seqs))
            s, base = seqs[sid]
            fed = len(s.tokens)
            more = base[fed:] if fed < len(base) else [rnd.randrange(1000) for _ in range(rnd.randrange(1, 6))]
            more = more[: rnd.randrange(1, len(more) + 1)]
            if fed + len(more) > cfg.context:
                continue
            need = kv.need(s, fed + len(more), pieces=True)
            exact = len(s.held()) == kv.blocks_for(fed)
            assert need == kv.blocks_for(fed + len(more)) - kv.blocks_for(fed) or not exact
            assert need <= kv.blocks_for(fed + len(more)) - len(s.held())
            if need > kv.pool.free():
                n_oom += 1
                continue
            before = kv.pool.free()
            # As TorchModel: at once while the pool holds the window of the
            # chunk's first token, else in pieces of the layout's step.
            step = len(more) if kv.need(s, fed + len(more)) <= kv.pool.free() else lay.step
            for at in range(0, len(more), step):
                n = len(s.tokens)
                kv.grow(s, n + len(more[at : at + step]))
                s.tokens.extend(more[at : at + step])
                rows_match(kv, s, n, len(s.tokens))
                write(kv, s, n)
                assert read_all(kv, s), "a step reads other tokens than it was fed"
                kv.settle(s)
            assert kv.pool.free() == before - need, "feeding took other than BlocksFor(f+n)-BlocksFor(f)"
            assert len(s.held()) == kv.blocks_for(fed + len(more)) or not exact, "a sequence holds other than BlocksFor(n)"
            if len(s.tokens) <= prompt_len[sid]:
                kv.register(s, len(s.tokens))
        elif op < 0.7:
            sid = rnd.choice(list(seqs))
            s, _ = seqs[sid]
            back = rnd.randrange(0, min(lay.margin, max(1, len(s.tokens) - prompt_len[sid])) + 1)
            if back and len(s.tokens) - back >= prompt_len[sid]:
                del s.tokens[len(s.tokens) - back:]
                kv.truncate(s, len(s.tokens))
        elif op < 0.95:
            sid = rnd.choice(list(seqs))
            s, _ = seqs.pop(sid)
            kv.free(s, rnd.choice(keys + ["", ""]))
        else:
            kv.drop(rnd.choice(keys))
        kv.take_evicted()
        kv.check([s for s, _ in seqs.values()])
        for s, _ in seqs.values():
            assert read_all(kv, s), "a sequence reads other tokens than it was fed"
    for s, _ in seqs.values():
        kv.free(s, "")
    for k in keys:
        kv.drop(k)
    kv.check([])
    assert kv.pool.free() == kv.pool.n, "blocks leaked"
    assert len(kv.free_rows) == kv.table.shape[0] - 1, "table rows leaked"
    return n_open, n_oom, n_reused


def main():
    ops = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    passed = 0
    for i in range(8):
        o, m, r = run(ops // 8, seed * 100 + i, Windowed if i % 2 else Cfg)
        print("seed %d: %d opens (%d reused a prefix), %d refused for blocks" % (seed * 100 + i, o, r, m))
        passed += 1
    print("%d passed, 0 failed" % passed)


main()
