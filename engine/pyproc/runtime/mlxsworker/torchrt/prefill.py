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

Whole-step graphs (settings.prompt_attention, on by default where the
check below passes): attention through kernels.prompt_attention, which
reads each chunk's keys and values in place through the block table and
takes from the host only a tile plan (tile_plan: a few ints a chunk,
copied into a buffer), so the step's every layer, attention included, is
one graph per bucket, replayed by one launch. The piecewise graphs'
gathers and varlen calls cost host time that scaled with the layers
(about 60 eager kernel launches and 17 graph launches a step on a 16-layer
model) and device copies that scaled with each chunk's prefix. A step whose plan takes more tiles
than the bucket's (its tokens' tiles and MAX_CHUNKS more) takes the
piecewise graphs. At load the kernel is checked against the plain torch
attention (attention_reference) on a pool in the model's shapes; where it
disagrees or does not build (a head dim not a power of two, say), or the
model has sinks, the piecewise graphs serve (logged). A failed capture of
whole-step graphs sends their kind (with the delta or without) to the
piecewise graphs.

Graphs are captured per token bucket (BUCKETS up to the step's token
budget) on first use and share their buffers: inputs (tokens, rotary rows,
each block group's KV rows), the residual, the MLP's output, the rotated q
and k and the attention output, sized for the largest bucket; a bucket's
graphs use the first rows. Rows past the step's tokens write their keys
and values into the scratch block (paged.py), as the decode graphs' padding
rows do. Graphs share a memory pool per kind (with the delta or
without, whole or piecewise), so that a failed capture of one kind leaves
the others untouched: their temporaries never outlive a replay and replays never
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

Only models whose projections are float tensors or quantized weights kept
quantized (quant.QWeight: FP8 and int4 products whose kernel the rows
alone pick), whose experts, if any, run the fused kernels (moe_triton: routing and
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
from .quant import QWeight

log = logging.getLogger("prefill")

# A program of kernels.prompt_attention takes TILE_ROWS rows (half as many
# for heads wider than 128): tokens of one chunk times the query heads of
# one KV head (padded to a power of two).
TILE_ROWS = 128
# The most prompt chunks a whole-step graph's tile plan leaves room for
# beyond the bucket's tokens (a chunk's last tile may be short).
MAX_CHUNKS = 64


def buckets(limit):
    """Token counts a step is padded up to: 64, 128, 256, then every 256
    up to limit."""
    out = [b for b in (64, 128) if b < limit]
    b = 256
    while b < limit:
        out.append(b)
        b += 256
    return out + [limit]


def _pow2(n):
    p = 1
    while p < n:
        p *= 2
    return p


def tile_tokens(heads, kv_heads, head_dim):
    """The tokens of one chunk a program of prompt_attention takes."""
    rows = TILE_ROWS if head_dim <= 128 else TILE_ROWS // 2
    return max(1, rows // _pow2(heads // kv_heads))


def tile_plan(chunks, tb, width):
    """prompt_attention's tiles for chunks [(first packed row, tokens,
    position, table row)], tb tokens a tile: four lists of width columns
    (first packed row, tokens, position, table row; unused columns count
    0 tokens), or None when they take more than width. A tile's work
    grows with its last position (the keys it reads), so the longest
    come first: the chunks by their end, each chunk's tiles from its
    last; the GPU starts programs in order, and the short ones then fill
    the gaps the long ones leave instead of long ones starting last and
    running alone (a fresh 2,048-token prompt's last tile reads 64 times
    the keys of its first)."""
    rows, counts, pos, trows = [], [], [], []
    for a, n, p, trow in sorted(chunks, key=lambda c: c[2] + c[1], reverse=True):
        for off in reversed(range(0, n, tb)):
            rows.append(a + off)
            counts.append(min(tb, n - off))
            pos.append(p + off)
            trows.append(trow)
    if len(rows) > width:
        return None
    pad = [0] * (width - len(rows))
    return [rows + pad, counts + pad, pos + pad, trows + pad]


def attention_reference(q, kc, vc, table, tiles, ntiles, out, heads, kv_heads, scale, window, k_scale, v_scale, fmt):
    """kernels.prompt_attention in plain torch (float32 scores), the pool
    read through fmt (kvcache.KVFormat): the load check's reference and
    the CPU tests' stand-in."""
    hd, bs = kc.shape[-1], kc.shape[1]
    rep = heads // kv_heads
    scale = hd ** -0.5 if scale is None else scale
    for a, n, p0, trow in zip(*tiles[:, :ntiles].tolist()):
        if n == 0:
            continue
        L = p0 + n
        blocks = table[trow, : -(-L // bs)].long()
        kk = fmt.load(kc, blocks, k_scale).reshape(-1, kv_heads, hd)[:L].float()
        vv = fmt.load(vc, blocks, v_scale).reshape(-1, kv_heads, hd)[:L].float()
        qq = q[a : a + n, :heads].float().reshape(n, kv_heads, rep, hd)
        s = torch.einsum("nkrd,lkd->krnl", qq, kk) * scale
        i = torch.arange(n, device=q.device).unsqueeze(1) + p0
        j = torch.arange(L, device=q.device).unsqueeze(0)
        ok = j <= i
        if window:
            ok = ok & (j > i - window)
        o = torch.einsum("krnl,lkd->nkrd", torch.softmax(s.masked_fill(~ok, float("-inf")), -1), vv)
        out[a : a + n] = o.reshape(n, heads * hd).to(out.dtype)
    return out


def prompt_attention_ok(m, bs):
    """Whether kernels.prompt_attention builds here and agrees with
    attention_reference for decoder m's heads, head dim, KV format,
    scale and windows over blocks of bs tokens: chunks fresh and after a
    prefix, longer and shorter than a tile, one past a sliding window.
    Logs why not."""
    cfg, dev = m.cfg, m.device
    if any(L.get("sinks") is not None for L in m.layers):
        return False  # sink logits: the piecewise graphs' varlen call has them
    H, K, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
    tb = tile_tokens(H, K, hd)
    g = torch.Generator(device="cpu").manual_seed(5)
    chunks = [(0, 37, 0, 1), (37, 3, 90, 2), (40, tb + 9, 200, 3)]  # (row, tokens, position, table row)
    n = sum(c[1] for c in chunks)
    nb = -(-(200 + tb + 9) // bs)
    blocks = 3 * nb + 1
    perm = torch.randperm(3 * nb, generator=g).to(torch.int32)
    table = torch.full((4, nb), 3 * nb, dtype=torch.int32)
    table[1:] = perm.view(3, nb)
    table = table.to(dev)
    ks, vs = 0.5, 0.25
    pool = [m.kvq.encode(torch.randn(blocks, bs, K, hd, generator=g).to(dev, m.dtype), sc).contiguous() for sc in (ks, vs)]
    q = torch.randn(n, H + K, hd, generator=g).to(dev, m.dtype)
    tiles = torch.tensor(tile_plan(chunks, tb, 64), dtype=torch.int32, device=dev)
    tol = 1e-3 if m.dtype == torch.float32 else 3e-2
    try:
        for window in sorted({0} | {w for w in cfg.windows if w} | ({50} if any(cfg.windows) else set())):
            got = torch.zeros(n, H * hd, device=dev, dtype=m.dtype)
            want = torch.zeros_like(got)
            args = (table, tiles, 64)
            m.kern.prompt_attention(q, *pool, *args, got, H, K, tb, m.custom_scale(), window, ks, vs)
            attention_reference(q, *pool, *args, want, H, K, m.custom_scale(), window, ks, vs, m.kvq)
            err = (got.float() - want.float()).abs().max().item()
            if not err <= tol:
                log.warning("prompt attention kernel disagrees with plain attention (window %d, by %.3g); "
                            "prompt steps keep the piecewise graphs", window, err)
                return False
    except Exception as e:  # no build for this device or shape
        log.warning("prompt attention kernel unavailable (%s); prompt steps keep the piecewise graphs", e)
        return False
    return True


class PrefillGraphs:
    def __init__(self, model, kv, limit, adapters=None, paged=False):
        self.model, self.kv, self.limit = model, kv, limit
        self.adapters = adapters  # lora.Slots when the model serves adapters
        self.sizes = buckets(limit)
        # paged: whole-step graphs around kernels.prompt_attention (the
        # module doc); off after a failed capture.
        self.paged = paged
        self.tb = tile_tokens(model.cfg.heads, model.cfg.kv_heads, model.cfg.head_dim)
        self.table = None  # the KV table the whole-step graphs read (paged.py reallocates it as rows run out)
        self.sets = {}  # (bucket, with the delta, whole) -> its graphs, in replay order
        # (bucket, whole) -> the segmented LoRA plan's buffers its graphs
        # read (kept here: a graph holds no tensor from outside its pool
        # alive).
        self.segs = {}
        self.pools = {}  # (with the delta, whole) -> the memory pool of those graphs
        self.broken = False
        self.lora_broken = False  # capture with the delta failed: steps with adapters run eagerly
        self.lora_whole_broken = False  # whole-step capture with the delta failed: such steps take the piecewise graphs
        self.buf = None  # the shared buffers (_buffers)

    def captured(self, lora=False, whole=None):
        """The buckets whose graphs (with the delta: lora; of whole steps or
        piecewise: whole, None for either) are captured."""
        return sorted({nb for nb, d, w in self.sets if d == lora and whole in (None, w)})

    def width(self, nb):
        """The tiles of bucket nb's whole-step graph."""
        return -(-nb // self.tb) + MAX_CHUNKS

    def tiles(self, chunks, n, lora=False):
        """The tile plan (tile_plan) of a step of chunks [(first packed row,
        tokens, position, table row)], n rows in all, for a whole-step
        graph, or None when the step cannot take one (no paged graphs
        here, the step too large, a plan on the decoder, adapter rows the
        graphs with the delta cannot run, too many chunks)."""
        if not self.paged or self.broken or not 0 < n <= self.limit or self.model.lora is not None:
            return None
        if lora and (self.lora_broken or self.lora_whole_broken or self.adapters is None or self.adapters.A is None):
            return None
        return tile_plan(chunks, self.tb, self.width(next(s for s in self.sizes if s >= n)))

    @staticmethod
    def supports(model):
        """Whether model's prompt steps can run here (see the module doc)."""
        # Quantized projections (quant.QWeight) capture as the decode graphs
        # do: their products pick a kernel by the rows alone (the bucket's:
        # a step run eagerly at a row count across DEQUANT_ROWS or
        # w8a8.MIN_ROWS from its bucket's may take the other product, and
        # its logits differ by that product's rounding), scale activations
        # per row or per group of a row (padding rows never reach real
        # ones), and sync nothing with the host.
        weights = all(isinstance(L[n], (torch.Tensor, QWeight)) for L in model.layers for n in ("qkv", "o", "gate_up", "down") if n in L)
        experts = model.moe is None or model.moe.fused is not None  # the fused experts: no host sync, a grid fixed by the rows
        return model.kern is not None and model.varlen and model.tp is None and experts and weights

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
            "tiles": torch.zeros(4, self.width(n), dtype=torch.int32, device=dev),  # prompt_attention's plan
        }

    def _capture(self, nb, lora=False, whole=False):
        """The graphs of bucket nb (with the delta: lora): embedding and
        layer 0 to its q and k, then per layer the rest of it and the next
        layer to its q and k; whole: one graph of them all with each
        layer's prompt_attention between."""
        m, kv, cfg = self.model, self.kv, self.model.cfg
        H, K = cfg.heads, cfg.kv_heads
        if self.buf is None:
            self.buf = self._buffers()
        b = {k: v[:, :nb] if k == "kr" else v[:nb] for k, v in self.buf.items() if k != "tiles"}
        b["kr"][:] = kv.scratch * kv.bs  # the warm-up runs write the scratch block only

        def pre(li, x, d):
            L = m.layers[li]
            x, h = m.add_norm(x, d, L.get("ln_in"), L.get("qkv"))
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
                x, h = m.add_norm(b["x"], a, L.get("ln_ffn"), L.get("gate_up"))
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
            segs = self.segs[(nb, whole)] = (torch.zeros(nb, dtype=torch.long, device=dev), torch.zeros(S + 1, dtype=torch.int32, device=dev),
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

        pool = self.pools.get((lora, whole))
        if pool is None:
            pool = self.pools[(lora, whole)] = graphs.new_pool()
        if whole:
            pieces = [piece(li) for li in range(-1, len(m.layers))]
            tiles, width = self.buf["tiles"], self.width(nb)
            tiles.zero_()  # the warm-up run attends nowhere

            def step():
                pieces[0]()
                for li in range(len(m.layers)):
                    m.kern.prompt_attention(b["qk"], kv.kc[li], kv.vc[li], kv.table_of(li), tiles, width, b["a"], H, K,
                                            self.tb, m.custom_scale(), cfg.windows[li], *m.kvq.scales[li])
                    pieces[li + 1]()
            self.table = kv.table
            out = [graphs.record(step, pool, warmup=1)[0]]
        else:
            out = [graphs.record(piece(li), pool, warmup=1)[0] for li in range(-1, len(m.layers))]
        self.sets[(nb, lora, whole)] = out
        return out

    def _fail(self, lora, e, whole=False):
        """Marks the graphs of a kind broken after their capture failed
        (logged): steps of that kind run eagerly from now on (whole-step
        graphs: on the piecewise graphs)."""
        if whole:
            if lora:
                self.lora_whole_broken = True
            else:
                self.paged = False
                self._drop_whole()
            log.warning("whole prompt-step CUDA graphs%s failed to capture; such prompts take the piecewise graphs: %s",
                        " with LoRA" if lora else "", e, exc_info=True)
        elif lora:
            self.lora_broken = True
            log.warning("prompt-step CUDA graphs with LoRA failed to capture; prompts with adapters run eagerly: %s", e,
                        exc_info=True)
        else:
            self.broken = True
            log.warning("prompt-step CUDA graphs failed to capture; prompts run eagerly: %s", e, exc_info=True)

    def _drop_whole(self):
        """Drops the whole-step graphs and their pools (never captured into
        again) and the table they read."""
        for key in [k for k in self.sets if k[2]]:
            del self.sets[key]
        for key in [k for k in self.pools if k[1]]:
            del self.pools[key]
        self.table = None

    def run(self, tokens, rp, kvrow, group, last, slots=None, tiles=None):
        """The packed step's logits of rows last: tokens, rp (rotary rows)
        [n] and kvrow (per block group [n]) on the device, group its
        varlen plan, or tiles its tile plan (self.tiles, flattened, on the
        device) for a whole-step graph; slots: each row's device slot [n]
        (lora.py) for a step with adapters, else None. None when
        capturing failed (the step then runs eagerly; graphs of that kind
        are off from then on)."""
        m, kv = self.model, self.kv
        n, lora, whole = tokens.shape[0], slots is not None, tiles is not None
        nb = next(s for s in self.sizes if s >= n)
        if whole and self.table is not None and self.table is not kv.table:
            self._drop_whole()  # the table was reallocated: they read the old one
        gs = self.sets.get((nb, lora, whole))
        if gs is None:
            try:
                gs = self._capture(nb, lora, whole)
            except Exception as e:  # RuntimeError from CUDA; a Triton build error (whole) too
                if not (whole or isinstance(e, RuntimeError)):
                    raise
                self._fail(lora, e, whole)
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
        if whole:
            w = self.width(nb)
            b["tiles"][:, :w].copy_(tiles.view(4, w))
        gs[0].replay()
        for li in range(len(gs) - 1):  # piecewise: each layer's attention between its graphs
            o = m.attend_varlen(b["qk"][:n, :H], kv.kc[li], kv.vc[li], group, None, li, kv.group_of[li])
            b["a"][:n].copy_(o)
            gs[li + 1].replay()
        x, d = b["x"][:n], b["d"][:n]
        return m.logits(m.rms(x[last] + d[last], m.norm))
