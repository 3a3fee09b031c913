"""The mlx backend: models built from mlx_lm.models definitions, with the
runtime's own loading, KV accounting and sampling.

Status: written against mlx-lm's model API (Model(ModelArgs), per-layer
KVCache from mlx_lm.models.cache, model.sanitize); it has not been run in
this project's CI, which has no MLX. A step runs its sequences one after
another (each with its own cache) rather than as one padded batch. Freed
sequences saved under a key keep their cache (at most MAX_SAVED, least
recently used evicted first and reported on the next open); open reuses
the longest common prefix of a saved entry and the prompt by slicing the
saved cache's state (mlx_lm KVCache.state).
"""
import collections
import glob
import importlib
import os

import mlx.core as mx
import mlx_lm
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from .. import params
from ..backend import Backend, Model, StepResult
from ..errors import CONTEXT_LENGTH, INVALID, OUT_OF_MEMORY, CheckpointError, ProtocolError
from ..seqs import SeqState, common_prefix
from ..stcheck import read_header, read_json

# mlx_lm builds Mistral with its llama module.
MODULES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}


# Saved caches kept per model; each holds its sequence's whole KV.
MAX_SAVED = 32


class MlxBackend(Backend):
    name = "mlx"

    def capabilities(self):
        return {"batch": False, "prefix_cache": True, "logprobs": True, "pipeline": True,
                "sampling": params.features(without=("generated",)), "params": params.KEYS}

    def versions(self):
        return {"mlx": mx.__version__, "mlx_lm": getattr(mlx_lm, "__version__", "?")}

    def load(self, path, opts):
        return MlxModel(path, opts)


class Seq(SeqState):
    """An open sequence: its cache, the tokens of KV it holds and its
    random key (made at its first temperature draw)."""

    __slots__ = ("cache", "held", "key")

    def __init__(self, cache, held):
        super().__init__([])
        self.cache, self.held, self.key = cache, held, None


def _allowed(x, width):
    """The protocol's allowed-token mask as a numpy bool array."""
    import numpy as np

    ts = params.token_set(x, width)
    if ts.bits is not None:
        bits = np.unpackbits(np.frombuffer(ts.bits, dtype=np.uint8), bitorder="little").astype(bool)
        m = np.zeros(width, dtype=bool)
        n = min(width, bits.shape[0])
        m[:n] = bits[:n]
        return m
    m = np.zeros(width, dtype=bool) if ts.allow else np.ones(width, dtype=bool)
    m[[i for i in ts.ids if 0 <= i < width]] = ts.allow
    if not ts.allow:
        m[ts.limit:] = False
    return m


class _Ops:
    """mlx's arrays for params.adjust."""

    where = staticmethod(mx.where)

    @staticmethod
    def ids(values, row):
        return mx.array(values)

    @staticmethod
    def floats(values, row):
        return mx.array(values, dtype=row.dtype)


def _adjust(logits, s, p):
    """Penalties and logit bias (params.adjust), then the allowed mask."""
    logits = params.adjust(logits, s, p, _Ops)
    x = p.get("x")
    if x:
        logits = mx.where(mx.array(_allowed(x, logits.shape[0])), logits, -mx.inf)
    return logits


class MlxModel(Model):
    def __init__(self, path, opts):
        if opts.get("quantize"):
            raise ProtocolError(INVALID, "quantize %r: the mlx backend loads weights as they are" % opts["quantize"])
        if opts.get("kv_cache_dtype") not in (None, "", "auto"):
            raise ProtocolError(INVALID, "kv_cache_dtype %r: the mlx backend keeps the KV cache in the model's dtype"
                                % opts["kv_cache_dtype"])
        for f in ("config.json", "tokenizer.json"):
            if not os.path.exists(os.path.join(path, f)):
                raise CheckpointError(f, "missing")
        config = read_json(os.path.join(path, "config.json"), "config.json")
        arch = config.get("model_type", "")
        if arch not in MODULES:
            raise CheckpointError("config.json", "unsupported architecture %r" % arch)
        module = importlib.import_module("mlx_lm.models." + MODULES[arch])
        args = module.ModelArgs.from_dict(config)
        self.model = module.Model(args)
        self.model.load_weights(self._weights(path))
        mx.eval(self.model.parameters())
        self.vocab = int(config["vocab_size"])
        self.context = min(int(config.get("max_position_embeddings") or 2048), int(opts.get("context_length") or 1 << 30))
        self.max_batch = int(opts.get("max_batch") or 64)
        self.capacity = int(opts.get("kv_capacity") or self.max_batch * self.context)
        self.used = 0
        self.bos, self.eos = config.get("bos_token_id", -1), config.get("eos_token_id") or []
        if isinstance(self.eos, int):
            self.eos = [self.eos]
        self.seqs = {}
        self.saved = collections.OrderedDict()  # key -> Seq, least recently used first
        self.evicted = []

    def _weights(self, path):
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise CheckpointError(".", "no *.safetensors file")
        weights = {}
        for f in files:
            read_header(f)  # refuse a crafted header before mx.load reads it
            try:
                weights.update(mx.load(f))
            except Exception as e:
                raise CheckpointError(os.path.basename(f), "cannot read: %s" % e)
        if hasattr(self.model, "sanitize"):
            weights = self.model.sanitize(weights)
        want = dict(tree_flatten(self.model.parameters()))
        for name, p in want.items():
            w = weights.get(name)
            if w is None:
                raise CheckpointError("model.safetensors", "missing tensor", name)
            if tuple(w.shape) != tuple(p.shape):
                raise CheckpointError("model.safetensors", "shape %r contradicts config.json (want %r)"
                                      % (tuple(w.shape), tuple(p.shape)), name)
        return [(k, v) for k, v in weights.items() if k in want]

    def info(self):
        return {"context_length": self.context, "vocab_size": self.vocab, "bos": self.bos, "eos": self.eos,
                "kv_capacity": self.capacity, "max_batch": self.max_batch, "device": "mlx", "dtype": "auto",
                "weight_bytes": sum(v.nbytes for _, v in tree_flatten(self.model.parameters()))}

    def open(self, seq, prompt, key, pool=None, adapter=None):
        if adapter is not None:
            raise ProtocolError(INVALID, "the mlx backend serves no adapters")
        if seq in self.seqs:
            raise ProtocolError(INVALID, "sequence %d is already open" % seq)
        if len(prompt) > self.context:
            raise ProtocolError(CONTEXT_LENGTH, "prompt too long", prompt=len(prompt), limit=self.context)
        if self.used + len(prompt) > self.capacity:
            raise ProtocolError(OUT_OF_MEMORY, "no KV room for %d tokens" % len(prompt))
        s = Seq(make_prompt_cache(self.model), len(prompt))
        reused = 0
        saved = self.saved.get(key) if key else None
        if saved is not None:
            self.saved.move_to_end(key)
            reused = min(common_prefix(saved.tokens, prompt), len(prompt) - 1)
            if reused > 0:
                for dst, src in zip(s.cache, saved.cache):
                    k, v = src.state
                    dst.state = (k[..., :reused, :], v[..., :reused, :])
                s.tokens = list(prompt[:reused])
        self.seqs[seq] = s
        self.used += len(prompt)
        return reused

    def take_evicted(self):
        out, self.evicted = self.evicted, []
        return out

    def drop(self, key):
        self.saved.pop(key, None)

    def seq_len(self, seq):
        s = self.seqs.get(seq)
        return None if s is None else len(s.tokens)

    def free(self, seq, key, back=0):
        if back:
            raise ProtocolError(INVALID, "the mlx backend decodes no tokens ahead: nothing to take back")
        s = self.seqs.pop(seq, None)
        if s is None:
            return
        self.used -= s.held
        if key and s.tokens:
            self.saved.pop(key, None)
            self.saved[key] = s
            while len(self.saved) > MAX_SAVED:
                key, _ = self.saved.popitem(last=False)
                self.evicted.append(key)

    def close(self):
        self.seqs.clear()
        self.saved.clear()
        self.model = None

    def stats(self):
        return {"open": len(self.seqs), "saved": len(self.saved)}

    def step(self, batch, last=frozenset()):  # last: nothing runs ahead here
        if len(batch) > self.max_batch:
            raise ProtocolError(INVALID, "a step of %d inputs exceeds max_batch %d" % (len(batch), self.max_batch))
        out = StepResult([], [], [])
        for seq, tokens, sample, p in batch:
            s = self.seqs.get(seq)
            if s is None:
                raise ProtocolError(INVALID, "sequence %d is not open" % seq)
            if len(s.tokens) + len(tokens) > self.context:
                raise ProtocolError(CONTEXT_LENGTH, "sequence too long", prompt=len(s.tokens) + len(tokens), limit=self.context)
            grow = max(0, len(s.tokens) + len(tokens) - s.held)
            if self.used + grow > self.capacity:
                raise ProtocolError(OUT_OF_MEMORY, "no KV room for %d more tokens" % grow)
            self.used += grow
            s.held += grow
            logits = self.model(mx.array(tokens)[None], cache=s.cache)[0, -1].astype(mx.float32)
            s.note_fed(tokens)
            s.tokens.extend(tokens)
            if sample:
                s.sampled = True
                t, lp, top = self._sample(logits, s, p)
                out.tokens.append(t)
                out.logprobs.append(lp)
                out.top.append(top)
        return out

    def _sample(self, logits, s, p):
        logits = _adjust(logits, s, p)
        logprobs = logits - mx.logsumexp(logits)
        temp = float(p.get("t") or 0)
        if temp == 0:
            tok = mx.argmax(logits)
        else:
            x = logits / temp
            k = int(p.get("k") or 0)
            if 0 < k < x.shape[0]:
                kth = mx.sort(x)[-k]
                x = mx.where(x < kth, -mx.inf, x)
            probs = mx.softmax(x)
            top_p = float(p.get("p") or 0)
            if 0 < top_p < 1:
                order = mx.argsort(-probs)
                sp = probs[order]
                drop = (mx.cumsum(sp) - sp) >= top_p
                keep = mx.zeros_like(probs)
                keep[order] = mx.where(drop, 0, sp)
                probs = keep
            min_p = float(p.get("m") or 0)
            if min_p > 0:
                probs = mx.where(probs < min_p * probs.max(), 0, probs)
            if s.key is None:
                seed = p.get("s")
                s.key = mx.random.key(int(seed) & ((1 << 63) - 1) if seed is not None else int.from_bytes(os.urandom(7), "little"))
            s.key, sub = mx.random.split(s.key)
            tok = mx.random.categorical(mx.log(probs), key=sub)
        tok = int(tok.item())
        n = int(p.get("n") or 0)
        top = []
        if n > 0:
            order = mx.argsort(-logprobs)[:n].tolist()
            top = [[int(i), float(logprobs[i].item())] for i in order if float(logprobs[i].item()) != float("-inf")]
        return tok, (float(logprobs[tok].item()) if p.get("l") or n else 0.0), top
