"""The torch backend: a loaded model with slot-based KV memory, steps and
sampling on the device."""
import collections
import logging
import os

import torch

from llama import Config, Llama
from errors import CheckpointError, ProtocolError
from sampling import note_fed, sample_rows
from graphs import BATCH_BUCKETS, DecodeGraphs
import lookahead


CAPABILITIES = {"batch": True, "prefix_cache": True, "logprobs": True, "lookahead": True,
                "sampling": ["greedy", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed",
                             "presence_penalty", "frequency_penalty", "logit_bias", "allowed_mask", "top_logprobs"]}


def load(path, opts):
    """Loads the checkpoint at path; opts as in PROTOCOL.md's load."""
    return TorchModel(path, opts)


log = logging.getLogger("torch_backend")


def weight_bytes(model):
    """Bytes of the model's weight tensors, each shared tensor once."""
    ts = [model.embed, model.norm, model.lm_head] + [t for layer in model.layers for t in layer.values()]
    unique = {id(t): t for t in ts}
    return sum(t.numel() * t.element_size() for t in unique.values())


def pick_device(name):
    if name in ("", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ProtocolError("unavailable", "device cuda requested but torch sees no CUDA device")
    return torch.device(name)


def pick_dtype(name, device, cfg):
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name in table:
        return table[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


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
    __slots__ = ("slot", "tokens", "gen", "held", "sampled", "counts", "hist")

    def __init__(self, slot, tokens, held):
        self.slot, self.tokens, self.gen, self.held = slot, tokens, None, held
        self.sampled, self.counts = False, {}
        self.hist = None  # generator states before recent draws (lookahead.rewind)


class TorchModel:
    """One loaded checkpoint. Sequences live in KV slots of context-length
    capacity; freed sequences may be kept under a key for prefix reuse."""

    def __init__(self, path, opts):
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
        with torch.no_grad():
            self.model = Llama(path, cfg, self.device, self.dtype)
        self.max_batch = int(opts.get("max_batch") or 64)
        self.slots, self.capacity = self._size_slots(int(opts.get("kv_capacity") or 0))
        self.used = 0  # KV tokens held by open sequences, at most capacity
        # One slot more than sequences can take: CUDA-graph padding rows write there.
        shape = (self.slots + 1, cfg.kv_heads, cfg.context, cfg.head_dim)
        try:
            self.kc = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in range(cfg.layers)]
            self.vc = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in range(cfg.layers)]
        except RuntimeError as e:
            raise ProtocolError("oom", "KV cache of %d slots: %s" % (self.slots, e))
        self.free_slots = list(range(self.slots - 1, -1, -1))
        self.graphs = None
        if self.device.type == "cuda" and opts.get("cuda_graphs", True):
            self.graphs = DecodeGraphs(self.model, self.kc, self.vc, self.slots, self.max_batch, cfg.context)
        self.seqs = {}
        self.saved = collections.OrderedDict()  # key -> Seq, oldest first
        self.evicted = []  # saved keys given up for memory, reported on the next open
        self.lookahead_used = False  # a supervisor that asks for lookahead: remember generator states
        self.spec = None  # lookahead.Spec: the next round's first step, already launched
        self.spec_missed = False

    def _size_slots(self, kv_capacity):
        """Returns (slots, capacity): KV slots of one context each, and the
        tokens open sequences may hold in all. An explicit capacity gets
        enough slots for up to twice max_batch short sequences."""
        cfg = self.cfg
        if kv_capacity:
            return max(-(-kv_capacity // cfg.context), min(kv_capacity, 2 * self.max_batch)), kv_capacity
        per_token = 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * torch.tensor([], dtype=self.dtype).element_size()
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * 0.8)
        else:
            budget = 1 << 30
        slots = max(1, min(self.max_batch * 2, budget // (per_token * cfg.context)))
        return slots, slots * cfg.context

    def info(self):
        c = self.cfg
        return {
            "context_length": c.context, "vocab_size": c.vocab, "bos": c.bos, "eos": c.eos,
            "kv_capacity": self.capacity, "max_batch": self.max_batch,
            "device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""),
            "weight_bytes": weight_bytes(self.model),
            "kv_bytes": sum(t.numel() * t.element_size() for t in self.kc + self.vc),
        }

    def warm(self):
        """Runs one decode step at each batch-size bucket on the scratch
        slot, capturing the CUDA graph of each bucket where graphs are on.
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
        rows, slots = t(list(range(b))), t([self.slots] * b)
        mask = torch.zeros(b, 1, device=dev, dtype=self.dtype).view(b, 1, 1, 1, 1)
        self.model.forward(t([0] * b), t([0] * b), slots, [("decode", rows, slots, 1, mask)], self.kc, self.vc, rows)

    def _take_slot(self):
        if not self.free_slots and self.saved:
            key, old = self.saved.popitem(last=False)
            self.free_slots.append(old.slot)
            self.evicted.append(key)
        if not self.free_slots:
            raise ProtocolError("oom", "all %d KV slots are in use" % self.slots)
        return self.free_slots.pop()

    def open(self, seq, prompt, prefix_key):
        if seq in self.seqs:
            raise ProtocolError("invalid", "sequence %d is already open" % seq)
        if len(prompt) > self.cfg.context:
            raise ProtocolError("context_length", "prompt of %d tokens exceeds the context" % len(prompt),
                                prompt=len(prompt), limit=self.cfg.context)
        if self.used + len(prompt) > self.capacity:
            raise ProtocolError("oom", "sequence %d needs %d KV tokens; %d of %d are free"
                                % (seq, len(prompt), self.capacity - self.used, self.capacity))
        saved = self.saved.get(prefix_key) if prefix_key else None
        if saved is not None:
            self.saved.move_to_end(prefix_key)  # the last to give up its slot below
        slot = self._take_slot()
        reused = 0
        if saved is not None:
            reused = min(common_prefix(saved.tokens, prompt), len(prompt) - 1)
            if reused > 0 and saved.slot != slot:  # same slot: the evicted save's KV is already there
                for layer in range(self.cfg.layers):
                    self.kc[layer][slot, :, :reused] = self.kc[layer][saved.slot, :, :reused]
                    self.vc[layer][slot, :, :reused] = self.vc[layer][saved.slot, :, :reused]
        self.seqs[seq] = Seq(slot, list(prompt[:reused]), len(prompt))
        self.used += len(prompt)
        return reused

    def take_evicted(self):
        """Returns the saved keys evicted since the last call."""
        out, self.evicted = self.evicted, []
        return out

    def drop(self, key):
        """Discards the KV saved under key; an unknown key is a no-op."""
        old = self.saved.pop(key, None)
        if old is not None:
            self.free_slots.append(old.slot)

    def free(self, seq, save_key, back=0):
        s = self.seqs.pop(seq, None)
        if s is None:
            return
        if self.spec is not None:
            self.spec.drop(s)
        if 0 < back <= len(s.tokens):
            lookahead.rewind(s, back)  # tokens decoded ahead that the caller never fed
        self.used -= s.held
        if save_key and s.tokens:
            old = self.saved.pop(save_key, None)
            if old is not None:
                self.free_slots.append(old.slot)
            self.saved[save_key] = s
        else:
            self.free_slots.append(s.slot)

    def _graph_decode(self, batch, seqs):
        tokens = [b[1][0] for b in batch]
        pos = [len(s.tokens) for s in seqs]
        slots = [s.slot for s in seqs]
        for s, t in zip(seqs, tokens):
            s.tokens.append(t)
        return self.graphs.run(tokens, pos, slots)

    def close(self):
        self.kc = self.vc = self.model = self.graphs = self.spec = None
        self.seqs.clear()
        self.saved.clear()

    def stats(self):
        return {"open": len(self.seqs), "saved": len(self.saved), "free_slots": len(self.free_slots),
                "saved_tokens": sum(len(s.tokens) for s in self.saved.values())}

    def step(self, batch):
        """batch: list of [seq, tokens, sample, params, n?, back?]. Returns
        (tokens, logprobs, top logprobs) for the sampling inputs in order,
        then (more, more_logprobs) when inputs asked for lookahead: the
        tokens decoded after them (lookahead.py)."""
        if not batch:
            return [], [], []
        if len(batch) > self.max_batch:
            raise ProtocolError("invalid", "a step of %d inputs exceeds max_batch %d" % (len(batch), self.max_batch))
        lookahead.settle(self, batch)
        seqs, grow = [], 0
        for b in batch:
            seq, toks = b[0], b[1]
            s = self.seqs.get(seq)
            if s is None:
                raise ProtocolError("invalid", "sequence %d is not open" % seq)
            back = int(b[5]) if len(b) > 5 and b[5] else 0
            if back:
                if back < 0 or back > len(s.tokens):
                    raise ProtocolError("invalid", "sequence %d: cannot take back %d of its %d tokens" % (seq, back, len(s.tokens)))
                lookahead.rewind(s, back)
            if not toks:
                raise ProtocolError("invalid", "sequence %d: empty tokens" % seq)
            if len(s.tokens) + len(toks) > self.cfg.context:
                raise ProtocolError("context_length", "sequence %d would hold %d tokens" % (seq, len(s.tokens) + len(toks)),
                                    prompt=len(s.tokens) + len(toks), limit=self.cfg.context)
            bad = [t for t in toks if t < 0 or t >= self.cfg.vocab]
            if bad:
                raise ProtocolError("invalid", "sequence %d: token %d outside the vocabulary" % (seq, bad[0]))
            seqs.append(s)
            grow += max(0, len(s.tokens) + len(toks) - s.held)
        if self.used + grow > self.capacity:
            raise ProtocolError("oom", "the step needs %d more KV tokens; %d of %d are free"
                                % (grow, self.capacity - self.used, self.capacity))
        self.used += grow
        for b, s in zip(batch, seqs):
            s.held = max(s.held, len(s.tokens) + len(b[1]))
            note_fed(s, b[1])
        want = lookahead.plan(self, batch, seqs)
        self.lookahead_used = self.lookahead_used or max(want, default=1) > 1 or any(len(b) > 4 for b in batch)
        with torch.no_grad():
            items = [(b[3], s) for b, s in zip(batch, seqs) if b[2]]
            if lookahead.chainable(self, batch, items, want):
                return lookahead.run_chain(self, items, [b[1][0] for b in batch], want)
            lookahead.cancel(self)  # a speculation this step cannot use
            rows = self._forward(batch, seqs)
            if self.lookahead_used:
                lookahead.remember(items, self.device)
            toks, lps, tops = sample_rows(rows, items, self.device)
            if max(want, default=1) <= 1:
                return toks, lps, tops
            more, more_lps = lookahead.run(self, items, toks, want)
            return toks, lps, tops, more, more_lps

    def _forward(self, batch, seqs):
        decode = all(len(b[1]) == 1 and b[2] for b in batch)
        if decode and self.graphs is not None and self.graphs.usable(len(batch)):
            try:
                return self._graph_decode(batch, seqs)
            except RuntimeError as e:  # capture unsupported here: run eagerly from now on
                log.warning("CUDA graph decode failed, running eagerly: %s", e, exc_info=True)
                self.graphs.broken = True
                for s in seqs:
                    del s.tokens[-1]
        dev = self.device
        if decode and self.model.kern is not None:
            t = torch.tensor([[b[1][0] for b in batch], [len(s.tokens) for s in seqs], [s.slot for s in seqs]], device=dev)
            for b, s in zip(batch, seqs):
                s.tokens.append(b[1][0])
            return self.model.forward_decode(t[0], t[1], t[2], self.kc, self.vc)
        tokens, pos, slot_tok, last = [], [], [], []
        dec_rows, dec_slots, dec_len, chunks = [], [], [], []
        for b, s in zip(batch, seqs):
            toks, sample = b[1], b[2]
            p, a = len(s.tokens), len(tokens)
            tokens.extend(toks)
            pos.extend(range(p, p + len(toks)))
            slot_tok.extend([s.slot] * len(toks))
            if len(toks) == 1:
                dec_rows.append(a)
                dec_slots.append(s.slot)
                dec_len.append(p + 1)
            else:
                chunks.append(("chunk", a, a + len(toks), s.slot, p))
            if sample:
                last.append(len(tokens) - 1)
            s.tokens.extend(toks)
        groups = chunks
        if dec_rows:
            maxlen = max(dec_len)
            lens = torch.tensor(dec_len, device=dev)
            mask = torch.zeros(len(dec_len), maxlen, device=dev, dtype=self.dtype)
            mask.masked_fill_(torch.arange(maxlen, device=dev).unsqueeze(0) >= lens.unsqueeze(1), float("-inf"))
            groups = [("decode", torch.tensor(dec_rows, device=dev), torch.tensor(dec_slots, device=dev),
                       maxlen, mask.view(len(dec_len), 1, 1, 1, maxlen))] + chunks
        t = lambda v: torch.tensor(v, device=dev, dtype=torch.long)
        return self.model.forward(t(tokens), t(pos), t(slot_tok), groups, self.kc, self.vc, t(last))

