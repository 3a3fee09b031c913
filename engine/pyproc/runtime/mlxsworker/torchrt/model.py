"""A decoder loaded by the torch backend (backend.py): paged KV memory
(paged.py), steps and sampling on the device."""
import itertools
import logging
import os
from itertools import compress, filterfalse
from operator import itemgetter

import torch

from ..backend import Model, StepResult
from ..errors import CONTEXT_LENGTH, INVALID, OUT_OF_MEMORY, UNAVAILABLE, CheckpointError, ProtocolError
from .. import timing
from ..settings import Settings
from . import fit, kvcache, lookahead, lora, quant
from .config import Config
from .decoder import Decoder
from .graphs import BATCH_BUCKETS, DecodeGraphs
from .paged import Layout, OutOfBlocks, PagedKV
from .pooling import Pooled, with_pooled
from .prefill import PrefillGraphs, prompt_attention_ok
from .sampling import note_forced, sample_rows
from .upload import HostCopy, pack_ints, to_device

BLOCK_SIZE = 16  # tokens per KV block (the settings' block_size overrides it)
MAX_BATCH_CUDA, MAX_BATCH_CPU = 256, 64  # default max_batch where the pool holds that many sequences
# The step size to ask for on CUDA: on an H100 (1B shape, 1,260-token
# prompts under load) 4096 served 60 req/s at 64 clients where 2048 served
# 41 and 1024 28 (a step's launch cost is paid per chunk); 0 elsewhere
# (the caller's default).
STEP_TOKENS_CUDA = 4096
CPU_KV_BYTES = 1 << 30  # the memory a KV pool sized from memory takes on the CPU

log = logging.getLogger("torchrt")
_samples = itemgetter(2)  # of a batch row: whether it samples


def weight_bytes(model):
    """Bytes of the model's weights, each shared tensor once; quantized
    projections at their quantized size."""
    ts = [model.embed, model.norm, model.lm_head] + [t for layer in model.layers for t in layer.values()]
    unique = {id(t): t for t in ts}
    return sum(quant.nbytes(t) for t in unique.values())


def pick_device(name):
    if name in ("", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ProtocolError(UNAVAILABLE, "device cuda requested but torch sees no CUDA device")
    return torch.device(name)


def pick_dtype(name, device, cfg):
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name in table:
        return table[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def _kv_rows(blocks, bs, null, start, end):
    """The rows of positions start .. end - 1 in the flattened KV blocks
    (block * bs + offset), a block given back (None) read as null. A
    block's positions are one range (extended in C, not a Python step a
    token: a 2,048-token chunk is 128 ranges)."""
    if end - start == 1:  # a decode row
        b = blocks[start // bs]
        return [(null if b is None else b) * bs + start % bs]
    out = []
    j = start
    while j < end:
        b = blocks[j // bs]
        at = (null if b is None else b) * bs + j % bs
        n = min(bs - j % bs, end - j)
        out.extend(range(at, at + n))
        j += n
    return out


def _kv_runs(blocks, bs, null, start, end, starts, counts):
    """Appends to starts and counts the rows of positions start .. end - 1
    in the flattened KV blocks as _kv_rows gives them, as runs
    (upload.expand_runs): one a block, two Python ints where _kv_rows
    makes one a token."""
    first, last = start // bs, (end - 1) // bs
    b = blocks[first]
    starts.append((null if b is None else b) * bs + start % bs)
    if first == last:  # a decode row, or a chunk within one block
        counts.append(end - start)
        return
    counts.append(bs - start % bs)
    starts.extend((null if x is None else x) * bs for x in blocks[first + 1 : last])
    counts.extend([bs] * (last - first - 1))
    b = blocks[last]
    starts.append((null if b is None else b) * bs)
    counts.append(end - last * bs)


class TorchModel(Model):
    """One loaded checkpoint. Sequences keep their KV in blocks of a pool
    (paged.py), taken as they grow; freed sequences may keep their blocks
    under a key for prefix reuse, and full prompt blocks are shared by
    every sequence whose prompt starts with the same tokens. With sliding
    windows the blocks are per group of layers (paged.Layout) and the
    sliding groups give back what left their window. settings: the
    worker's (None: the defaults); group: the worker's tensor-parallel
    group (tp.Group), or None."""

    pooling = True

    def __init__(self, path, opts, settings=None, group=None):
        settings = settings or Settings()
        if not os.path.isdir(path):
            raise CheckpointError(path, "not a directory")
        for f in ("config.json", "tokenizer.json"):
            if not os.path.exists(os.path.join(path, f)):
                raise CheckpointError(f, "missing")
        cfg = Config(path)
        if opts.get("context_length"):
            cfg.context = min(cfg.context, int(opts["context_length"]))
        self.device = pick_device(opts.get("device", "auto"))
        self.dtype = pick_dtype(opts.get("dtype", "auto"), self.device, cfg)
        self.cfg = cfg
        self.tp = None  # tensor parallel (tp.py): this rank's device and share; cfg becomes the rank's
        if group is not None:
            self.device = group.device(self.device)
            self.tp = group.shard(cfg, self.device, opts)
        quantize = quant.parse_quantize(opts.get("quantize"), cfg.quant)
        kv_dtype = kvcache.parse(opts.get("kv_cache_dtype"))
        fit.check_device(path, cfg, self.dtype, self.device, self.tp, quantize)
        with torch.no_grad():
            self.model = Decoder(path, cfg, self.device, self.dtype, quantize, self.tp, settings, kv_dtype)
        bs = int(opts.get("block_size") or settings.block_size or BLOCK_SIZE)
        if not 1 <= bs <= 1024:
            raise ProtocolError(INVALID, "block size %d is out of range" % bs)
        # Lookahead (lookahead.py): the most tokens an input asks for, and
        # what a sliding group's blocks allow for it.
        self.max_ahead = settings.lookahead_limit
        self.layout = Layout(cfg.windows, bs, cfg.context, settings.window_step or None, self.max_ahead)
        blocks = self._size_pool(int(opts.get("kv_capacity") or 0), bs, int(opts.get("max_batch") or 0), settings.kv_fraction)
        if self.tp is not None:
            blocks = self.tp.agree(blocks)
        self.max_batch = int(opts.get("max_batch") or self._default_batch(blocks // len(self.layout.groups) * bs))
        cfg.context = self._context_held(blocks, bs)  # one sequence cannot hold more than the pool
        try:
            self.kv = PagedKV(cfg, self.device, self.dtype, blocks, bs, 2 * self.max_batch, self.layout, settings.prefix_cache,
                              self.model.kvq)
        except RuntimeError as e:
            raise ProtocolError(OUT_OF_MEMORY, "KV pool of %d blocks: %s" % (blocks, e))
        self.step_tokens = settings.step_tokens or (STEP_TOKENS_CUDA if self.device.type == "cuda" else 0)
        self.graphs = None
        # Steps that mix prompt chunks with decodes: decodes on their graph
        # and the chunks in a second pass (True), or all in one pass.
        self.split_steps = settings.split_steps
        if self.device.type == "cuda" and opts.get("cuda_graphs", True) and self.model.graphable:
            self.graphs = DecodeGraphs(self.model, self.kv, self.max_batch, cfg.context)
        self.seqs = {}
        # LoRA adapter slots (lora.py): their memory is taken by the first adapter.
        # Under tensor parallel each rank's slots hold its share (lora.py).
        slots = int(opts.get("adapter_slots") or 0)
        self.adapters = lora.Slots(cfg, self.model.layers, self.device, self.dtype, slots, int(opts.get("max_adapter_rank") or 64),
                                   settings.lora_plan, self.tp, self.model.kern is not None,
                                   side_stream=settings.lora_side_stream,
                                   rows=self.step_tokens + self.max_batch) if slots > 0 else None
        if self.graphs is not None:
            self.graphs.lora = self.adapters
        # Steps of prompt chunks in graphs captured piecewise around attention
        # (prefill.py; with adapters, graphs of their own).
        self.prefill = None
        if self.graphs is not None and settings.prefill_graphs and PrefillGraphs.supports(self.model):
            paged = settings.prompt_attention and prompt_attention_ok(self.model, self.kv.bs)
            self.prefill = PrefillGraphs(self.model, self.kv, self.step_tokens, self.adapters, paged=paged)
        self.lookahead_used = False  # a supervisor that asks for lookahead: remember generator states
        self.spec = None  # lookahead.Spec: the next round's first step, already launched
        self.spec_missed = False
        self.overlap = settings.overlap  # speculate the next decode step behind each step (lookahead.overlaps)
        # Speculated steps: launched, used whole by a chain ("chained"), used
        # by a step with other inputs beside (_step_with_spec: "beside"),
        # discarded.
        self.speculated = dict.fromkeys(("launched", "chained", "beside", "discarded"), 0)

    def _size_pool(self, kv_capacity, bs, max_batch, fraction):
        """Blocks in the pool: kv_capacity tokens when given, else a share
        (fraction) of the device's free memory (CUDA) or a fixed budget (CPU), at
        most what twice max_batch sequences of the whole context take (room
        for as many saved prefixes), so a model with a short context leaves
        the device to others. An element takes the pool's bytes (one with
        an FP8 KV cache). A block holds one group of layers (paged.Layout):
        kv_capacity tokens of every layer are that many blocks per group,
        and the pool is a whole number of such rows."""
        cfg, lay = self.cfg, self.layout
        G = len(lay.groups)
        if kv_capacity:
            return G * max(1, -(-kv_capacity // bs))
        if not max_batch:
            max_batch = MAX_BATCH_CUDA if self.device.type == "cuda" else MAX_BATCH_CPU
        most = 2 * max_batch * lay.blocks_for(bs, cfg.context)
        per_block = 2 * lay.size * cfg.kv_heads * cfg.head_dim * bs * self.model.kvq.itemsize
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * fraction)
        else:
            budget = CPU_KV_BYTES
        return G * max(1, min(most, budget // per_block) // G)

    def _context_held(self, blocks, bs):
        """The model's context, capped at the most tokens one sequence
        holds in a pool of blocks blocks."""
        lay, ctx = self.layout, self.cfg.context
        if lay.blocks_for(bs, ctx) <= blocks:
            return ctx
        lo, hi = 0, ctx  # blocks_for(lo) <= blocks < blocks_for(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if lay.blocks_for(bs, mid) <= blocks else (lo, mid)
        return lo

    def _default_batch(self, tokens):
        """The default max_batch: as many sequences as the pool holds at
        2,048 tokens each, within the device's default."""
        top = MAX_BATCH_CUDA if self.device.type == "cuda" else MAX_BATCH_CPU
        return max(1, min(top, max(64, tokens // 2048)))

    @property
    def capacity(self):
        """Tokens of every layer the pool holds (engine.Info.KVCapacity)."""
        return self.kv.pool.n // len(self.layout.groups) * self.kv.bs

    def info(self):
        c = self.cfg
        d = {
            "context_length": c.context, "vocab_size": c.vocab, "bos": c.bos, "eos": c.eos,
            "kv_capacity": self.capacity, "max_batch": self.max_batch,
            "block_size": self.kv.bs, "kv_blocks": self.kv.pool.n, "step_tokens": self.step_tokens,
            "device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""),
            "weight_bytes": weight_bytes(self.model), "kv_bytes": self.kv.bytes(), "kv_cache_dtype": self.model.kvq.name,
            "full_groups": self.layout.full_groups if self.layout.sliding_groups else 0,
            "sliding_groups": self.layout.sliding_groups, "window": self.layout.window,
            "window_blocks": self.layout.window_blocks, "embed_dim": c.hidden,
            **({"adapter_slots": self.adapters.n, "max_adapter_rank": self.adapters.rank, "adapter_bytes": self.adapters.bytes(),
                "adapter_slot_bytes": self.adapters.slot_bytes} if self.adapters is not None else {}),
        }
        return d if self.tp is None else self.tp.info(d, self.model)

    def free_blocks(self):
        return self.kv.pool.free()

    def warm(self):
        """Runs one decode step at each batch-size bucket on the scratch
        block, capturing the CUDA graph of each bucket where graphs are on.
        No sequence or KV accounting changes. Returns the batch sizes."""
        sizes = [b for b in BATCH_BUCKETS if b < self.max_batch] + [self.max_batch]
        with torch.no_grad():
            for b in sizes:
                if self.graphs is not None and self.graphs.usable(b):
                    key = self.graphs.bucket(b, 1)
                    if key in self.graphs.graphs:
                        continue
                    try:
                        self.graphs.capture(*key)
                        continue
                    except RuntimeError as e:  # as in _forward: run eagerly from now on
                        log.warning("CUDA graph capture failed, running eagerly: %s", e, exc_info=True)
                        self.graphs.broken = True
                self._warm_eager(b)
            if self.model.kern is not None:  # the decode chain's argmax, compiled now
                self.model.kern.argmax(torch.zeros(1, self.cfg.vocab, device=self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return sizes

    def _warm_eager(self, b):
        dev = self.device
        t = lambda v: torch.tensor(v, device=dev, dtype=torch.long)
        rows, zero = t(list(range(b))), t([0] * b)
        scratch = [t([self.kv.scratch * self.kv.bs] * b)] * self.kv.ngroups
        self.model.forward(zero, zero, scratch, [("decode", rows, zero, 1, zero + 1)], self.kv, rows)

    def open(self, seq, prompt, prefix_key, pool=None, adapter=None):
        """Opens seq for prompt, reusing saved or cached KV; pool (a
        pooling.POOLS mode) opens a pooled sequence instead, which reuses
        nothing; adapter (the open request's "adapter" object) runs it
        with a LoRA adapter, loaded into its slot first when the request
        says so. Returns the tokens reused."""
        if seq in self.seqs:
            raise ProtocolError(INVALID, "sequence %d is already open" % seq)
        if not prompt:
            raise ProtocolError(INVALID, "sequence %d: empty prompt" % seq)
        if len(prompt) > self.cfg.context:
            raise ProtocolError(CONTEXT_LENGTH, "prompt of %d tokens exceeds the context" % len(prompt),
                                prompt=len(prompt), limit=self.cfg.context)
        if pool is not None:
            state = Pooled(pool)
            s = self.kv.open_fresh()
            s.pool = state
            self.seqs[seq] = s
            return 0
        slot = 0
        if adapter is not None:
            if self.adapters is None:
                raise ProtocolError(INVALID, "this model was loaded without adapter slots")
            slot = self.adapters.ensure(adapter)
        try:
            s, reused = self.kv.open(prompt, prefix_key, adapter["name"] if slot else "")
        except OutOfBlocks:
            raise ProtocolError(OUT_OF_MEMORY, "sequence %d: its reused prefix needs more blocks than the %d free"
                                % (seq, self.kv.pool.free()))
        s.lora = slot
        self.seqs[seq] = s
        return reused

    def load_adapter(self, adapter):
        """Loads the adapter the request names into its slot (the "adapter"
        op: a pinned adapter made resident on every worker), as open
        does for a sequence of it."""
        if self.adapters is None:
            raise ProtocolError(INVALID, "this model was loaded without adapter slots")
        self.adapters.ensure(adapter)

    def take_evicted(self):
        """Returns the saved keys evicted since the last call."""
        return self.kv.take_evicted()

    def drop(self, key):
        """Discards the KV saved under key; an unknown key is a no-op."""
        self.kv.drop(key)

    def seq_len(self, seq):
        s = self.seqs.get(seq)
        return None if s is None else len(s.tokens)

    def free(self, seq, key, back=0):
        s = self.seqs.pop(seq, None)
        if s is None:
            return
        if self.spec is not None:
            self.spec.drop(s)
        if 0 < back <= len(s.tokens):
            lookahead.rewind(s, back)  # tokens decoded ahead that the caller never fed
        self.kv.free(s, key)

    def _graph_decode(self, batch, seqs, slots=None):
        tokens = [b[1][0] for b in batch]
        pos = [len(s.tokens) for s in seqs]
        rows = [s.row for s in seqs]
        for s, t in zip(seqs, tokens):
            s.tokens.append(t)
        return self.graphs.run(tokens, pos, rows, slots)

    def close(self):
        self.kv = self.model = self.graphs = self.spec = None
        self.seqs.clear()

    def stats(self):
        st = self.kv.stats(self.seqs.values())
        st["open"] = len(self.seqs)
        if self.adapters is not None:  # LoRA: resident adapters, graphs captured with the delta (lora.py)
            st["adapters"] = [n for n in self.adapters.names if n is not None]
            st["lora_graphs"] = sum(1 for k in self.graphs.graphs if "lora" in k) if self.graphs is not None else 0
            st["prefill_lora_graphs"] = self.prefill.captured(lora=True) if self.prefill is not None else []
        st["prefill_graphs"] = self.prefill.captured() if self.prefill is not None else []
        st["prompt_attention"] = self.prefill is not None and self.prefill.paged  # whole-step prompt graphs
        st["prefill_whole_graphs"] = self.prefill.captured(whole=True) if self.prefill is not None else []
        # The CUDA fast paths this model runs: the Triton kernels, the varlen
        # prompt attention, and the batch buckets of its base decode graphs.
        st["kernels"], st["varlen"] = self.model.kern is not None, bool(self.model.varlen)
        st["decode_graphs"] = sorted({k[0] for k in self.graphs.graphs if "lora" not in k}) if self.graphs is not None else []
        st["speculated"] = dict(self.speculated)
        return st

    def step(self, batch, last=frozenset()):
        """The step of batch (_step); on CUDA its device span, CUDA events
        as its host work begins and after its last launch, goes to the
        worker's step-cycle summary (timing.device_span: an upper bound of
        the device's busy time, see there). last: the sequences sampling
        their last token, left out of the speculated next step."""
        if self.device.type != "cuda":
            return self._step(batch, last)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            return self._step(batch, last)
        finally:
            end.record()
            timing.device_span(start, end)

    def _step(self, batch, last=frozenset()):
        """batch: list of [seq, tokens, sample, params, n?, back?]. Returns
        the StepResult of the sampling inputs in order, with more and
        more_logprobs when inputs asked for lookahead: the tokens decoded
        after them (lookahead.py). The sequences in last sample their last
        token: the next decode step speculated behind this one leaves
        them out (lookahead.launcher, Spec.launch). Fails with out_of_memory,
        changing nothing, when the blocks the inputs need are not free."""
        if not batch:
            return StepResult([], [], [])
        if len(batch) > self.max_batch:
            raise ProtocolError(INVALID, "a step of %d inputs exceeds max_batch %d" % (len(batch), self.max_batch))
        try:
            seqs, backs, split, pooled, keep = self._check(batch)
        except Exception:
            lookahead.settle(self, batch)  # as on success: a speculation this request cannot use goes first
            raise
        if not keep:
            lookahead.cancel(self)
        for s, back in backs:
            lookahead.rewind(s, back)
            self.kv.truncate(s, len(s.tokens))
        if pooled:
            lookahead.cancel(self)
        if split:
            batch = self._feed_ahead(batch, seqs)
        fresh = []  # sequences still in their prompt: their full blocks go in the prefix cache
        kv = self.kv
        dense, bs = not kv.layout.sliding_groups, kv.bs
        for b, s in zip(batch, seqs):
            toks = b[1]
            if not (dense and len(s.tokens) + len(toks) <= len(s.pages[0]) * bs):  # PagedKV.grow's first test
                kv.grow(s, len(s.tokens) + len(toks))
            if s.pool is not None:
                continue
            if s.sampled:
                if len(toks) == 1:  # a decode row: SeqState.note_fed, inline (a third of the call's time)
                    counts, t = s.counts, toks[0]
                    counts[t] = counts.get(t, 0) + 1
                else:
                    s.note_fed(toks)
                    note_forced(s, toks, b[2])
            else:
                fresh.append(s)
        if pooled:  # the rows that generate
            gen = [(b, s) for b, s in zip(batch, seqs) if s.pool is None]
            gb, gs = [b for b, _ in gen], [s for _, s in gen]
        else:  # all of them: no copies of a 220-row batch
            gb, gs = batch, seqs
        want, room = lookahead.plan(self, gb, gs, last)
        self.lookahead_used = self.lookahead_used or max(want, default=1) > 1 or max(map(len, gb), default=0) > 4
        with torch.no_grad():
            items = [(b[3], s) for b, s in zip(gb, gs) if b[2]]
            single = max(want, default=1) == 1
            # Whether a sequence is not the speculation's, looped in C.
            beside = self.spec is not None and not all(map(self.spec.live.__contains__, map(id, seqs)))
            if beside and not pooled and single:
                out = self._step_with_spec(batch, seqs, fresh, last, room)
                if out is not None:
                    return out
            ends = [b[0] in last for b in gb if b[2]] if last else None
            if not pooled and lookahead.chainable(self, batch, items, want):
                return lookahead.run_chain(self, items, [b[1][0] for b in batch], want, ends, room)
            lookahead.cancel(self)  # a speculation this step cannot use
            rows = self._forward(batch, seqs)
            self._settle(seqs, fresh, items)
            launch = lookahead.launcher(self, items, ends, room) if single and not pooled else None
            out = StepResult(*sample_rows(rows, items, self.device, launch=launch))
            lookahead.fed_after(self, out.tokens)
            if not single:
                out.more, out.more_logprobs = lookahead.run(self, items, out.tokens, want)
            return with_pooled(batch, seqs, out) if pooled else out

    def _settle(self, seqs, fresh, items):
        """After a step's forward, before sampling items: sliding groups
        give back the blocks out of their windows, the prompts' full
        blocks go in the prefix cache, and with lookahead the generator
        states are recorded (lookahead.remember)."""
        if self.layout.sliding_groups:
            for s in seqs:
                self.kv.settle(s)
        for s in fresh:
            self.kv.register(s, len(s.tokens))
        if self.lookahead_used:
            lookahead.remember(self, items)

    def _step_with_spec(self, batch, seqs, fresh, last=frozenset(), room=False):
        """A step of one token per sampling input at most, some of them
        the decodes the speculated step (lookahead.Spec) already ran, the
        others beside them (prompt chunks, sequences that joined since):
        the others run as an ordinary step behind it, and the tokens merge
        in input order. Returns None when no input is the speculation's
        (it is discarded; _check let through only inputs it matches, each
        a sampling one). The index lists are made in C: most steps at 256
        clients are ~220 speculated decodes beside one prompt chunk. room:
        lookahead.plan's."""
        sp, self.spec = self.spec, None
        ran = list(map(sp.live.__contains__, map(id, seqs)))  # per input: the speculation ran its sequence
        mine = list(compress(range(len(seqs)), ran))
        if not mine:  # its sequences all ended: nothing was guessed wrong
            sp.discard()
            self.speculated["discarded"] += 1
            return None
        pre = sp.take([seqs[i] for i in mine])
        if pre is None:  # discarded by take
            self.spec_missed = True
            self.speculated["discarded"] += 1
            return None
        self.speculated["beside"] += 1
        for i in mine:  # the speculated step fed them their token
            seqs[i].tokens.append(batch[i][1][0])
            seqs[i].sampled = True
        rest = list(filterfalse(ran.__getitem__, range(len(seqs))))
        rb, rs = [batch[i] for i in rest], [seqs[i] for i in rest]
        ritems = [(b[3], s) for b, s in zip(rb, rs) if b[2]]
        rows = self._forward(rb, rs) if rest else None
        self._settle(seqs, fresh, ritems)
        tok, lp = pre
        mine_host = HostCopy([tok] + ([lp] if lp is not None else []))  # queued before the next speculation
        # Sampling inputs in order, and the places among them of the
        # speculation's (all of mine) and of the others.
        if all(map(_samples, batch)):
            order, ran_o = range(len(batch)), ran
        else:
            order = [i for i, b in enumerate(batch) if b[2]]
            ran_o = [ran[i] for i in order]
        places = range(len(order))
        spec_at, rest_at = list(compress(places, ran_o)), list(filterfalse(ran_o.__getitem__, places))
        items = [(batch[i][3], seqs[i]) for i in order]
        launch = lookahead.launcher(self, items, [batch[i][0] in last for i in order] if last else None, room)

        def merged(rest_toks):
            """Every sampling input's token on the device, in order: the
            speculation's and this step's."""
            allt = torch.empty(len(order), dtype=torch.long, device=self.device)
            ix = to_device(spec_at + rest_at, self.device)
            allt[ix[: len(mine)]] = tok
            if rest_toks is not None:
                allt[ix[len(mine):]] = rest_toks
            return allt
        if ritems:
            rt, rl, rtop = sample_rows(rows, ritems, self.device,
                                       launch=(lambda t: launch(merged(t))) if launch is not None else None)
        else:
            rt, rl, rtop = [], [], []
            if launch is not None:
                launch(merged(None))
        got = mine_host.get()
        out = StepResult(got[0], [0.0] * len(mine), [[] for _ in mine])  # no top: lookahead.allowed refuses it
        if lp is not None:
            out.logprobs = [v if items[k][0].get("l") else 0.0 for k, v in zip(spec_at, got[1])]
        # The others' outputs into their places, in increasing order: each
        # lands where it belongs, those before it being in place.
        for k, t, v, top in zip(rest_at, rt, rl, rtop):
            out.tokens.insert(k, t)
            out.logprobs.insert(k, v)
            out.top.insert(k, top)
        lookahead.fed_after(self, out.tokens)
        return out

    def _feed_ahead(self, batch, seqs):
        """Feeds the prompt chunks longer than the layout's step (paged.Layout)
        in passes of step tokens but the last, which stays in the
        returned batch: within a step of that size, sliding groups never
        hold more than BlocksFor. For a step whose chunks' windows the
        pool cannot hold at once."""
        S = self.layout.step
        lookahead.cancel(self)
        out = []
        for b, s in zip(batch, seqs):
            toks = b[1]
            while len(toks) > S and not s.sampled:
                part, toks = toks[:S], toks[S:]
                self.kv.grow(s, len(s.tokens) + S)
                self.kv.flush()
                with torch.no_grad():
                    self._forward([[b[0], part, False, b[3]]], [s])
                self.kv.settle(s)
            out.append([b[0], toks] + list(b[2:]))
        return out

    def _check(self, batch):
        """Validates the step without changing anything; returns the
        sequences, the (sequence, tokens) of the rows that take tokens
        back, whether long chunks must be fed in pieces (_feed_ahead),
        whether any sequence is pooled and whether there is a speculated
        step this request can use (lookahead.settle's test; one pass over
        the rows for all). Raises out_of_memory when the pool lacks the
        blocks the step needs (fed in pieces: what BlocksFor counts)."""
        seqs, backs, need, peak, pooled = [], [], 0, 0, False
        sp = self.spec
        keep = sp is not None
        if keep:
            live, feed, fed_params = sp.live, sp.fed(), sp.rows
        # Per row, as little as a decode row needs: 220 rows a step at 256
        # clients, whose host time the GPU waits behind. A pool without
        # sliding groups needs nothing for a row its blocks already hold
        # (PagedKV.need's first test, made here without the calls).
        opened, kv, context, vocab = self.seqs, self.kv, self.cfg.context, self.cfg.vocab
        dense, bs = not kv.layout.sliding_groups, kv.bs
        for b in batch:
            seq, toks = b[0], b[1]
            s = opened.get(seq)
            if s is None:
                raise ProtocolError(INVALID, "sequence %d is not open" % seq)
            back = int(b[5]) if len(b) > 5 and b[5] else 0
            if back < 0 or back > len(s.tokens):
                raise ProtocolError(INVALID, "sequence %d: cannot take back %d of its %d tokens" % (seq, back, len(s.tokens)))
            if not toks:
                raise ProtocolError(INVALID, "sequence %d: empty tokens" % seq)
            if keep:  # no take-back, and an input of a sequence it ran is its step (Spec.matches)
                i = live.get(id(s))
                if (len(b) > 5 and b[5]) or i is not None and not (
                        b[2] and len(toks) == 1 and toks[0] == feed[i] and fed_params[i][0] == b[3]):
                    keep = False
            if s.pool is not None:
                if s.pool.vec is not None:
                    raise ProtocolError(INVALID, "sequence %d: its pooled input has ended; free it" % seq)
                pooled = True
            n = len(s.tokens) - back + len(toks)
            if n > context:
                raise ProtocolError(CONTEXT_LENGTH, "sequence %d would hold %d tokens" % (seq, n),
                                    prompt=n, limit=context)
            # A decode row's one token compared without min and max (a third of their time).
            if (not 0 <= toks[0] < vocab) if len(toks) == 1 else (min(toks) < 0 or max(toks) >= vocab):
                bad = next(t for t in toks if t < 0 or t >= vocab)
                raise ProtocolError(INVALID, "sequence %d: token %d outside the vocabulary" % (seq, bad))
            if back and not kv.window_held(s.pages, len(s.tokens) - back):
                raise ProtocolError(INVALID, "sequence %d: cannot take back %d tokens, past the sliding window's KV"
                                    % (seq, back))
            seqs.append(s)
            if back:
                backs.append((s, back))
            if dense and n <= len(s.pages[0]) * bs:
                continue
            need += kv.need(s, n, pieces=True)
            peak += kv.need(s, n)
        if len(set(map(id, seqs))) != len(seqs):
            raise ProtocolError(INVALID, "a sequence appears twice in one step")
        if need > self.kv.pool.free():
            raise ProtocolError(OUT_OF_MEMORY, "the step needs %d more KV blocks; %d of %d are free"
                                % (need, self.kv.pool.free(), self.kv.pool.n))
        return seqs, backs, peak > self.kv.pool.free(), pooled, keep

    def _forward(self, batch, seqs):
        self.kv.flush()
        if self.adapters is not None and any(s.lora for s in seqs):
            return self._forward_lora(batch, seqs)
        if any(s.pool is not None for s in seqs):  # pooling reads rows the decode paths never form
            return self._forward_packed(batch, seqs)
        decode = all(len(b[1]) == 1 and b[2] for b in batch)
        if decode and self.graphs is not None and self.graphs.usable(len(batch)):
            try:
                return self._graph_decode(batch, seqs)
            except RuntimeError as e:  # capture unsupported here: run eagerly from now on
                log.warning("CUDA graph decode failed, running eagerly: %s", e, exc_info=True)
                self.graphs.broken = True
                for s in seqs:
                    del s.tokens[-1]
        if not decode and self.split_steps and self.graphs is not None:
            split = self._forward_split(batch, seqs)
            if split is not None:
                return split
        dev = self.device
        if decode and self.model.kern is not None:
            t = torch.tensor([[b[1][0] for b in batch], [len(s.tokens) for s in seqs], [s.row for s in seqs]], device=dev)
            for b, s in zip(batch, seqs):
                s.tokens.append(b[1][0])
            return self.model.forward_decode(t[0], t[1], t[2], self.kv)
        return self._forward_packed(batch, seqs)

    def _forward_lora(self, batch, seqs):
        """A step some of whose rows run adapters: a decode step on its
        graph captured with the delta where that runs (graphs.py), its
        one-token inputs there beside prompt chunks (split steps), prompt
        chunks on the prompt-step graphs with the delta where those run
        (_forward_packed), else eager passes with the step's plan on the
        decoder (lora.py)."""
        decode = all(len(b[1]) == 1 and b[2] and s.pool is None for b, s in zip(batch, seqs))
        g = self.graphs
        if decode and g is not None and g.lora_usable(len(batch), max(len(s.tokens) for s in seqs) + 1):
            try:
                return self._graph_decode(batch, seqs, [s.lora for s in seqs])
            except RuntimeError as e:  # as in _forward: adapter steps run eagerly from now on
                log.warning("CUDA graph decode with LoRA failed, running eagerly: %s", e, exc_info=True)
                g.lora_broken = True
                for s in seqs:
                    del s.tokens[-1]
        if not decode and self.split_steps and g is not None and all(s.pool is None for s in seqs):
            split = self._forward_split(batch, seqs, lora=True)
            if split is not None:
                return split
        if decode and self.model.kern is not None:
            return self._eager_lora_decode(batch, seqs)
        return self._forward_packed(batch, seqs)

    def _eager_lora_decode(self, batch, seqs):
        """A decode step run eagerly with its adapters' plan on the decoder."""
        self.model.lora = self.adapters.plan([s.lora for s in seqs], [1] * len(batch))
        try:
            t = to_device([[b[1][0] for b in batch], [len(s.tokens) for s in seqs], [s.row for s in seqs]], self.device)
            for b, s in zip(batch, seqs):
                s.tokens.append(b[1][0])
            return self.model.forward_decode(t[0], t[1], t[2], self.kv)
        finally:
            self.model.lora = None

    def _forward_split(self, batch, seqs, lora=False):
        """A step of prompt chunks and one-token inputs as two passes: the
        one-token inputs on their CUDA graph, the chunks packed. Returns
        the logits of the sampling inputs in order, or None when the step
        has no graph-sized decode part. lora: the step has adapter rows
        (_forward_lora): the one-token inputs' graph is the one with the
        delta when they have some (the chunks' pass sees their own)."""
        dec = [i for i, b in enumerate(batch) if len(b[1]) == 1 and b[2]]
        if not dec or len(dec) == len(batch) or not self.graphs.usable(len(dec)):
            return None
        slots = [seqs[i].lora for i in dec] if lora and any(seqs[i].lora for i in dec) else None
        if slots is not None and not self.graphs.lora_usable(len(dec), max(len(seqs[i].tokens) for i in dec) + 1):
            return None
        rest = [i for i in range(len(batch)) if i not in set(dec)]
        try:
            ld = self._graph_decode([batch[i] for i in dec], [seqs[i] for i in dec], slots)
        except RuntimeError as e:
            log.warning("CUDA graph decode failed, running eagerly: %s", e, exc_info=True)
            if slots is None:
                self.graphs.broken = True
            else:
                self.graphs.lora_broken = True
            for i in dec:
                del seqs[i].tokens[-1]
            return None
        lr = self._forward_packed([batch[i] for i in rest], [seqs[i] for i in rest])
        # Sampling rows in batch order: each part's rows are in its order.
        order = [i for i, b in enumerate(batch) if b[2]]
        at = {i: k for k, i in enumerate(order)}
        out = torch.empty(len(order), ld.shape[1], device=ld.device, dtype=ld.dtype)
        rs = [i for i in rest if batch[i][2]]
        where = to_device([at[i] for i in dec] + [at[i] for i in rs], ld.device)
        out[where[: len(dec)]] = ld
        if rs:
            out[where[len(dec) :]] = lr
        return out

    def _varlen_group(self, seqs, chunks, n):
        """The attention plan of every chunk in one varlen call (see
        Decoder.attend_varlen): chunk c attends over the KV rows of its
        positions 0 .. p + len - 1, its own just written. Rows come per
        block group; a sliding group's blocks out of the window read the
        scratch block, outside the flash window."""
        bs, G, null = self.kv.bs, self.kv.ngroups, self.kv.scratch
        by_row = {s.row: s for s in seqs}
        qrows, krows, cu_q, cu_k = [], [[] for _ in range(G)], [0], [0]
        for _, a, b, trow, p, _, _ in chunks:
            pages = by_row[trow].pages
            qrows.extend(range(a, b))
            for g in range(G):
                krows[g].extend(_kv_rows(pages[g], bs, null, 0, p + b - a))
            cu_q.append(cu_q[-1] + b - a)
            cu_k.append(cu_k[-1] + p + b - a)
        whole = qrows == list(range(n))
        nk = len(krows[0])
        flat = to_device(([] if whole else qrows) + [r for k in krows for r in k] + cu_q + cu_k, self.device)
        at = 0 if whole else len(qrows)
        qd = None if whole else flat[:at]
        kd = [flat[at + g * nk : at + (g + 1) * nk] for g in range(G)]
        at += G * nk
        cq = flat[at : at + len(cu_q)].to(torch.int32)
        ck = flat[at + len(cu_q) :].to(torch.int32)
        max_q = max(b - a for _, a, b, _, _, _, _ in chunks)
        max_k = max(p + b - a for _, a, b, _, p, _, _ in chunks)
        return ("varlen", qd, kd, cq, ck, max_q, max_k)

    def _forward_packed(self, batch, seqs):
        """Any mix of prompt chunks and one-token inputs, packed into one
        pass: one-token sequences attend together (the Triton decode
        kernel on CUDA), each chunk on its own. Every index the pass needs
        goes to the device in one copy, so nothing waits for the GPU here
        (a copy from pageable memory would wait for the decode graph a
        split step just launched). Rows of adapters run on the prompt-step
        graphs with the delta (each row's slot among those indices), or
        eagerly with the step's plan (lora.py)."""
        bs, G, null = self.kv.bs, self.kv.ngroups, self.kv.scratch
        lora = self.adapters is not None and any(s.lora for s in seqs)
        tokens, last, rpos, slot_rows = [], [], [], []
        # Each row's position, then its KV row per block group, as runs
        # (upload.pack_ints): a chunk's position is one run and its KV rows
        # one a block. As Python ints a row, a 2,048-token chunk's cost
        # ~80 us more before a prompt step's launch.
        run_at = [[] for _ in range(1 + G)]
        run_len = [[] for _ in range(1 + G)]
        longrope = self.model.longrope
        dec_rows, dec_trows, dec_len, chunks = [], [], [], []
        # Pooled sequences: the packed rows whose final-norm hidden state
        # their pooling reads, and per input (seq, position, ends, start, count).
        hid, pooled = [], []
        blocks = [[] for _ in range(G)]
        for b, s in zip(batch, seqs):
            toks, sample = b[1], b[2]
            p, a = len(s.tokens), len(tokens)
            end = p + len(toks)
            tokens.extend(toks)
            if lora:
                slot_rows.extend([s.lora] * len(toks))
            run_at[0].append(p)
            run_len[0].append(len(toks))
            for g in range(G):
                _kv_runs(s.pages[g], bs, null, p, end, run_at[1 + g], run_len[1 + g])
            if len(toks) == 1:
                if longrope:
                    rpos.append(p)
                dec_rows.append(a)
                dec_trows.append(s.row)
                dec_len.append(p + 1)
            else:
                if longrope:
                    rpos.extend(self.model.rope_rows(p, end))
                # the blocks the chunk attends over: its prefix and itself
                nb = -(-end // bs)
                chunks.append(["chunk", a, a + len(toks), s.row, p, len(blocks[0]), nb])
                if not self.model.varlen:  # the varlen plan gathers by rows instead
                    for g in range(G):
                        blocks[g].extend(null if b is None else b for b in s.pages[g][:nb])
            if s.pool is not None:
                first, n = s.pool.rows(p, len(toks), sample)
                pooled.append((s, p, sample, len(hid), n))
                hid.extend(range(a + first, a + first + n))
            elif sample:
                last.append(len(tokens) - 1)
            s.tokens.extend(toks)
        # A step of prompt chunks alone may replay a whole-step graph: its
        # attention plan is then a few ints a chunk (prefill.tile_plan).
        tiles = None
        if chunks and not dec_rows and not pooled and self.prefill is not None:
            tiles = self.prefill.tiles([(c[1], c[2] - c[1], c[4], c[3]) for c in chunks], len(tokens), lora)
        n, chain = len(tokens), itertools.chain.from_iterable
        parts = [tokens, last, dec_rows, dec_trows, dec_len, rpos, hid, slot_rows] + blocks
        if tiles is not None:
            parts.append(list(chain(tiles)))
        flat = to_device(pack_ints(parts, list(chain(run_at)), list(chain(run_len)), (1 + G) * n), self.device)
        views, at = [], 0
        for size in [len(part) for part in parts] + [n] * (1 + G):
            views.append(flat[at : at + size])
            at += size
        tok, lastd, rowsd, trowsd, lensd, rposd, hidd, slotd = views[:8]
        blocksd = views[8 : 8 + G]
        posd, kvrowd = views[-1 - G], views[-G:]
        tilesd = views[8 + G] if tiles is not None else None
        if tiles is not None:
            out = self.prefill.run(tok, rposd if longrope else posd, kvrowd, None, lastd, slotd if lora else None,
                                   tiles=tilesd)
            if out is not None:
                return out
        groups = []
        if chunks and self.model.varlen:
            groups.append(self._varlen_group(seqs, chunks, len(tokens)))
        else:
            for c in chunks:
                groups.append(tuple(c[:5]) + ([bd[c[5] : c[5] + c[6]] for bd in blocksd],))
        if dec_rows:
            groups = [("decode", rowsd, trowsd, max(dec_len), lensd)] + groups
        if self.prefill is not None and self.prefill.usable(len(tokens), groups, pooled, lora):
            out = self.prefill.run(tok, rposd if longrope else posd, kvrowd, groups[0], lastd, slotd if lora else None)
            if out is not None:
                return out
        if lora:
            self.model.lora = self.adapters.plan([s.lora for s in seqs], [len(b[1]) for b in batch])
        try:
            out = self.model.forward(tok, posd, kvrowd, groups, self.kv, lastd, rposd if longrope else None,
                                     hidden=hidd if pooled else None)
        finally:
            self.model.lora = None
        if not pooled:
            return out
        logits, h = out
        for s, p, ends, at, n in pooled:
            s.pool.add(h[at : at + n], p, ends, len(s.tokens))
        return logits
