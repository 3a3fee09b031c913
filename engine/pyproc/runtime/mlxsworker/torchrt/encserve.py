"""A loaded encoder (encoder.py) behind the worker's model interface:
open, step, free, info. It only embeds: a sequence is opened pooled, its
whole input comes in one step input that samples, and the reply carries
its pooled vector (PROTOCOL.md, Embeddings). Nothing is kept between
steps, so there is no KV pool: info reports kv_capacity as the tokens one
step may carry."""
import os

import torch

from ..backend import Model, StepResult
from ..errors import CONTEXT_LENGTH, INVALID, CheckpointError, ProtocolError
from ..settings import Settings
from .encoder import Encoder, EncoderConfig
from .pooling import check_mode, encode, finish
from .upload import to_device

# Tokens one step may carry by default: the packed activations of a step
# ([tokens, intermediate] at most) must fit beside the weights.
STEP_TOKENS_CUDA, STEP_TOKENS_CPU = 65536, 8192
MAX_BATCH_CUDA, MAX_BATCH_CPU = 256, 64


class EncoderModel(Model):
    pooling = True

    def __init__(self, path, opts, device, dtype_of, settings=None):
        if not os.path.isdir(path):
            raise CheckpointError(path, "not a directory")
        cfg = EncoderConfig(path)
        if opts.get("quantize"):
            raise ProtocolError(INVALID, "quantize %r: an encoder loads its weights as they are" % opts["quantize"])
        if opts.get("context_length"):
            cfg.context = min(cfg.context, int(opts["context_length"]))
        self.cfg, self.device = cfg, device
        self.dtype = dtype_of(device)
        cuda = device.type == "cuda"
        with torch.no_grad():
            self.model = Encoder(path, cfg, device, self.dtype, (settings or Settings()).varlen)
        self.max_batch = int(opts.get("max_batch") or (MAX_BATCH_CUDA if cuda else MAX_BATCH_CPU))
        # kv_capacity asks how many tokens the model holds at once: for an
        # encoder, those of one step; at least one whole input.
        cap = int(opts.get("kv_capacity") or 0) or (STEP_TOKENS_CUDA if cuda else STEP_TOKENS_CPU)
        self.step_tokens = max(cap, cfg.context)
        self.seqs = {}  # seq -> pooling, until its input is fed

    def info(self):
        c = self.cfg
        return {
            "context_length": c.context, "vocab_size": c.vocab, "bos": c.bos, "eos": c.eos,
            "kv_capacity": self.step_tokens, "max_batch": self.max_batch, "step_tokens": self.step_tokens,
            "device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""),
            "weight_bytes": sum(t.numel() * t.element_size() for t in {id(t): t for t in self.model.tensors()}.values()),
            "kv_bytes": 0, "embed_dim": c.hidden, "encoder": True,
        }

    def open(self, seq, prompt, key, pool=None, adapter=None):
        if seq in self.seqs:
            raise ProtocolError(INVALID, "sequence %d is already open" % seq)
        if pool is None:
            raise ProtocolError(INVALID, "an encoder only embeds: open sequence %d with a pooling" % seq)
        if adapter is not None:
            raise ProtocolError(INVALID, "an encoder serves no adapters")
        check_mode(pool)
        if not prompt:
            raise ProtocolError(INVALID, "sequence %d: empty input" % seq)
        if len(prompt) > self.cfg.context:
            raise ProtocolError(CONTEXT_LENGTH, "input of %d tokens exceeds the context" % len(prompt),
                                prompt=len(prompt), limit=self.cfg.context)
        self.seqs[seq] = pool
        return 0

    def seq_len(self, seq):
        return 0 if seq in self.seqs else None  # an encoder holds nothing between steps

    def free(self, seq, key, back=0):
        self.seqs.pop(seq, None)

    def close(self):
        self.model = None
        self.seqs.clear()

    def stats(self):
        return {"open": len(self.seqs)}

    def step(self, batch, last=frozenset()):
        """batch: [seq, tokens, sample, params, ...] per input, each a
        pooled sequence's whole input with sample true. Returns a
        StepResult of -1 per input and the inputs' vectors (last: nothing
        runs ahead here)."""
        if not batch:
            return StepResult([], [], [])
        if len(batch) > self.max_batch:
            raise ProtocolError(INVALID, "a step of %d inputs exceeds max_batch %d" % (len(batch), self.max_batch))
        seen, total = set(), 0
        for b in batch:
            seq, toks = b[0], b[1]
            if seq not in self.seqs:
                raise ProtocolError(INVALID, "sequence %d is not open" % seq)
            if self.seqs[seq] is None:
                raise ProtocolError(INVALID, "sequence %d: its input was embedded already; an encoder's input comes whole" % seq)
            if seq in seen:
                raise ProtocolError(INVALID, "a sequence appears twice in one step")
            seen.add(seq)
            if not b[2]:
                raise ProtocolError(INVALID, "sequence %d: an encoder's input comes whole, in one input that samples" % seq)
            if not toks:
                raise ProtocolError(INVALID, "sequence %d: empty tokens" % seq)
            if len(toks) > self.cfg.context:
                raise ProtocolError(CONTEXT_LENGTH, "sequence %d: input of %d tokens exceeds the context" % (seq, len(toks)),
                                    prompt=len(toks), limit=self.cfg.context)
            bad = [t for t in toks if t < 0 or t >= self.cfg.vocab]
            if bad:
                raise ProtocolError(INVALID, "sequence %d: token %d outside the vocabulary" % (seq, bad[0]))
            total += len(toks)
        if total > self.step_tokens:
            raise ProtocolError(INVALID, "a step of %d tokens exceeds the %d one step carries" % (total, self.step_tokens))
        lens = [len(b[1]) for b in batch]
        flat = to_device([t for b in batch for t in b[1]] + [j for n in lens for j in range(n)], self.device)
        N = sum(lens)
        with torch.no_grad():
            x = self.model.forward(flat[:N], flat[N:], lens)
            vecs, at = [], 0
            for b, n in zip(batch, lens):
                pool = self.seqs[b[0]]
                rows = x[at : at + n]
                vecs.append(finish(pool, rows.float().sum(0), rows[0].float(), rows[-1].float(), n))
                at += n
            embeddings = [encode(v) for v in torch.stack(vecs).cpu().unbind(0)]
        for b in batch:  # fed: a second input would be a second embedding
            self.seqs[b[0]] = None
        return StepResult([-1] * len(batch), [0.0] * len(batch), [[] for _ in batch], embeddings=embeddings)
