"""CUDA graphs for steps of prompt chunks, piecewise around attention.

A step of prompt chunks (packed rows, every chunk in one varlen flash call
per layer: Decoder.attend_varlen) ran eagerly: about ten kernels a layer
launched from Python, a few milliseconds of host time for a 1,260-token
prompt on a 1B model, longer than the GPU takes to run them; a server's
steps under load were bound by it. Here everything between two attention
calls is one captured graph: the embedding and layer 0 up to its rotated q
and k; then, per layer, the o projection, the residual and norms, the MLP
and the next layer up to its q and k; the last graph ends with the final
residual. Attention itself (its KV rows and cumulative lengths change
every step) runs eagerly between them: per layer two gathers and the flash
call. The logits of the sampled rows run eagerly too.

Graphs are captured per token bucket (BUCKETS up to the step's token
budget) on first use and share their buffers: inputs (tokens, rotary rows,
each block group's KV rows), the residual, the MLP's output, the rotated q
and k and the attention output, sized for the largest bucket; a bucket's
graphs use the first rows. Rows past the step's tokens write their keys
and values into the scratch block (paged.py), as the decode graphs' padding
rows do. The base's graphs share one memory pool, those with the delta
(below) another, so that a failed capture of theirs leaves the base's
untouched: their temporaries never outlive a replay and replays never
overlap.

LoRA adapters (lora.py): a step with adapter rows replays graphs of its
own, captured with the delta as the decode graphs compute it: a
lora.SegmentPlan's kernels where they run (the rows sorted by slot once
a step by the first piece into buffers the others read), else a
lora.DensePlan over every slot, its rows' plan built
inside each piece from a shared buffer of each row's device slot (0: the
base; padding rows too). Steps without adapter rows keep the graphs
without it and pay nothing. The dense delta's FLOPs grow with slots * R (lora.Slots: the
slots' rank, whatever the adapters' own): about 82,000 * slots * R
multiply-adds a token per layer of an 8B Llama, whose projections take
~218 M: ~5% more at 8 slots of rank 16, ~19% at 32 slots of rank 16 or
8 of rank 64, with every slot counted, resident or not. The host plan
(lora.Plan) costs few FLOPs, but such steps ran eagerly (two GEMMs per
module per adapter on top of the eager launches): under a prompt-bound
load on an H100 they served 0.66x the base's throughput at 1 or 8
adapters and 0.46x at 32.

Only models whose projections are plain tensors (no quantized weights),
whose experts, if any, run the fused kernels (moe_triton: routing and
sort on the device, a grid that depends on the bucket's rows alone), and
no tensor parallel take this path; anything else, and a capture that fails (logged, then never tried again: of the
base's graphs, every prompt step; of those with the delta, the steps
with adapters), runs eagerly. Every dense family the decoder runs
takes it (their norms, QK norms, sliding layers, rotary tables and
longrope rows are inputs or code inside the pieces); Gemma 2 does not:
its soft-capped attention runs without the kernels.
"""
import logging

import torch

from . import graphs
from .lora import SegmentPlan, segments

log = logging.getLogger("prefill")


def buckets(limit):
    """Token counts a step is padded up to: 64, 128, 256, then every 256
    up to limit."""
    out = [b for b in (64, 128) if b < limit]
    b = 256
    while b < limit:
        out.append(b)
        b += 256
    return out + [limit]


class PrefillGraphs:
    def __init__(self, model, kv, limit, adapters=None):
        self.model, self.kv, self.limit = model, kv, limit
        self.adapters = adapters  # lora.Slots when the model serves adapters
        self.sizes = buckets(limit)
        self.sets = {}  # (bucket, with the delta) -> its graphs, in replay order
        # bucket -> the segmented LoRA plan's buffers its graphs read (kept
        # here: a graph holds no tensor from outside its pool alive).
        self.segs = {}
        self.pools = {}  # with the delta (bool) -> the memory pool of those graphs
        self.broken = False
        self.lora_broken = False  # capture with the delta failed: steps with adapters run eagerly
        self.buf = None  # the shared buffers (_buffers)

    def captured(self, lora=False):
        """The buckets whose graphs (with the delta: lora) are captured."""
        return sorted(nb for nb, d in self.sets if d == lora)

    @staticmethod
    def supports(model):
        """Whether model's prompt steps can run here (see the module doc)."""
        plain = all(isinstance(L[n], torch.Tensor) for L in model.layers for n in ("qkv", "o", "gate_up", "down") if n in L)
        experts = model.moe is None or model.moe.fused is not None  # the fused experts: no host sync, a grid fixed by the rows
        return model.kern is not None and model.varlen and model.tp is None and experts and plain

    def usable(self, n, groups, pooled, lora=False):
        """Whether a packed step of n rows with attention plan groups runs
        here: one varlen group covering every row, no pooled rows, no
        plan on the decoder; lora: rows run adapters (an adapter is loaded
        and the graphs with the delta have not failed)."""
        if lora and (self.lora_broken or self.adapters is None or self.adapters.A is None):
            return False
        return (not self.broken and 0 < n <= self.limit and not pooled and self.model.lora is None
                and len(groups) == 1 and groups[0][0] == "varlen" and groups[0][1] is None)

    def _buffers(self):
        m, cfg, dev = self.model, self.model.cfg, self.model.device
        n = self.limit
        H, K, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        scratch = self.kv.scratch * self.kv.bs
        return {
            "tok": torch.zeros(n, dtype=torch.long, device=dev),
            "rp": torch.zeros(n, dtype=torch.long, device=dev),
            "kr": torch.full((self.kv.ngroups, n), scratch, dtype=torch.long, device=dev),
            "x": torch.zeros(n, cfg.hidden, dtype=m.dtype, device=dev),
            "d": torch.zeros(n, cfg.hidden, dtype=m.dtype, device=dev),
            "qk": torch.zeros(n, H + K, hd, dtype=m.dtype, device=dev),
            "a": torch.zeros(n, H * hd, dtype=m.dtype, device=dev),
            "slot": torch.zeros(n, dtype=torch.long, device=dev),  # each row's adapter (lora.py; 0: the base)
        }

    def _capture(self, nb, lora=False):
        """The graphs of bucket nb (with the delta: lora): embedding and
        layer 0 to its q and k, then per layer the rest of it and the next
        layer to its q and k."""
        m, kv, cfg = self.model, self.kv, self.model.cfg
        H, K = cfg.heads, cfg.kv_heads
        if self.buf is None:
            self.buf = self._buffers()
        b = {k: v[:, :nb] if k == "kr" else v[:nb] for k, v in self.buf.items()}
        b["kr"][:] = kv.scratch * kv.bs  # the warm-up runs write the scratch block only

        def pre(li, x, d):
            L = m.layers[li]
            x, h = m.add_norm(x, d, L.get("ln_in"))
            qkv = m.qk_norm(m.proj(h, L, "qkv", li), L)
            cos, sin = m.tabs[m.tab_of[li]]
            qk = m.kern.rope_kv(qkv, kv.kc[li], kv.vc[li], b["kr"][kv.group_of[li]], b["rp"], cos, sin, H, K, cfg.rot_dim,
                                *m.kvq.scales[li])
            b["x"].copy_(x)
            b["qk"].copy_(qk)

        def piece(li):
            def run():
                if li < 0:
                    pre(0, m.embed_rows(b["tok"]), None)
                    return
                L = m.layers[li]
                a = m.rms(m.proj(b["a"], L, "o", li), L.get("attn_post"))
                x, h = m.add_norm(b["x"], a, L.get("ln_ffn"))
                d = m.rms(m.mlp(h, L, li), L.get("mlp_post"))
                if li + 1 < len(m.layers):
                    pre(li + 1, x, d)
                else:
                    b["x"].copy_(x)
                    b["d"].copy_(d)
            return run if not lora else with_delta(run, li)

        ad = self.adapters
        # The segmented kernels' row order and tiles (lora.segments), sorted
        # once a step by the first piece into buffers the others read.
        segs = None
        if lora and ad.fused:
            dev, S = b["slot"].device, ad.n
            segs = self.segs[nb] = (torch.zeros(nb, dtype=torch.long, device=dev), torch.zeros(S + 1, dtype=torch.int32, device=dev),
                                    {bm: torch.zeros(S + 1, dtype=torch.int32, device=dev) for bm in ad.kern.ROW_TILES})

        def with_delta(run, li):
            # The plan is built inside each piece, so a replay reads the slot
            # buffer (or the segments sorted from it) as it is then.
            def delta():
                if segs is None:
                    m.lora = ad.device_plan(b["slot"])
                else:
                    if li < 0:
                        order, start, tiles = segments(b["slot"], ad.key_ids, ad.kern.ROW_TILES)
                        segs[0].copy_(order)
                        segs[1].copy_(start)
                        for bm, t in tiles.items():
                            segs[2][bm].copy_(t)
                    m.lora = SegmentPlan(ad, segs)
                try:
                    run()
                finally:
                    m.lora = None
            return delta

        pool = self.pools.get(lora)
        if pool is None:
            pool = self.pools[lora] = graphs.new_pool()
        out = []
        for li in range(-1, len(m.layers)):
            g, _ = graphs.record(piece(li), pool, warmup=1)
            out.append(g)
        self.sets[(nb, lora)] = out
        return out

    def _fail(self, lora, e):
        """Marks the graphs of a kind broken after their capture failed
        (logged): steps of that kind run eagerly from now on."""
        if lora:
            self.lora_broken = True
            log.warning("prompt-step CUDA graphs with LoRA failed to capture; prompts with adapters run eagerly: %s", e,
                        exc_info=True)
        else:
            self.broken = True
            log.warning("prompt-step CUDA graphs failed to capture; prompts run eagerly: %s", e, exc_info=True)

    def run(self, tokens, rp, kvrow, group, last, slots=None):
        """The packed step's logits of rows last: tokens, rp (rotary rows)
        [n] and kvrow (per block group [n]) on the device, group its
        varlen plan; slots: each row's device slot [n] (lora.py) for a
        step with adapters, else None. None when capturing failed (the
        step then runs eagerly; graphs of that kind are off from then
        on)."""
        m, kv = self.model, self.kv
        n, lora = tokens.shape[0], slots is not None
        nb = next(s for s in self.sizes if s >= n)
        gs = self.sets.get((nb, lora))
        if gs is None:
            try:
                gs = self._capture(nb, lora)
            except RuntimeError as e:
                self._fail(lora, e)
                return None
        b = self.buf
        b["tok"][:n].copy_(tokens)
        b["rp"][:n].copy_(rp)
        for g, r in enumerate(kvrow):
            b["kr"][g, :n].copy_(r)
        if n < nb:
            b["kr"][:, n:nb].fill_(kv.scratch * kv.bs)  # padding rows: the scratch block
        if lora:
            b["slot"][:n].copy_(slots)
            b["slot"][n:nb].zero_()  # padding rows: the base
        H = m.cfg.heads
        gs[0].replay()
        for li in range(len(m.layers)):
            o = m.attend_varlen(b["qk"][:n, :H], kv.kc[li], kv.vc[li], group, None, li, kv.group_of[li])
            b["a"][:n].copy_(o)
            gs[li + 1].replay()
        x, d = b["x"][:n], b["d"][:n]
        return m.logits(m.rms(x[last] + d[last], m.norm))
