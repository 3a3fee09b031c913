"""Mixtures of experts: Qwen3-MoE (mlp.gate, mlp.experts.j.gate_proj /
up_proj / down_proj), Mixtral (block_sparse_moe.gate,
block_sparse_moe.experts.j.w1 (gate) / w3 (up) / w2 (down)) and gpt_oss
(gptoss.py loads it: a router with a bias and its own top-k softmax,
experts with biases; the activation is the decoder's act_mul).

The router: p = softmax(gate(x)) in float32, the top k of p,
renormalised to sum 1 where the family does (Mixtral always, Qwen3-MoE
with norm_topk_prob), cast to the hidden dtype; the layer's output is
sum_k p_k * expert_k(x), each expert a SwiGLU MLP. Which Qwen3-MoE layers
are sparse (mlp_only_layers, decoder_sparse_step) is config.py's.

The experts' weights are stacked, [E, 2 * inter, hidden] (gate then up)
and [E, hidden, inter], with biases [E, 2 * inter] and [E, hidden] where
the family has them (gpt_oss). On CUDA, three ways run the experts, the
first that builds, agrees with the loop at load and captures in a CUDA
graph:
- the fused kernels (moe_triton.py, with the decoder's Triton kernels on;
  SiLU-gated families without expert biases): the (token, choice) pairs
  sorted into blocks of one expert each (align), two kernels a layer
  that read each touched expert's weights once. A decode step of one
  token reads 8 of Qwen3-30B-A3B's 128 experts. Decode steps also route
  and sort in a kernel each (moe_triton.route and align), where torch
  launched about 30 small kernels a layer.
- one grouped GEMM a projection (torch._grouped_mm) over the pairs
  sorted by expert, with no host sync;
- a loop over the experts that received tokens, each one's rows as one
  matrix product: elsewhere, and the fallback.

A model's decode steps run on CUDA graphs (graphs.py) only where the
experts' path captures (Experts.capturable, tried at load): some builds
run the grouped GEMM, for some dtypes (float32, fp8), through a fallback
that copies its offsets to the host, which capture refuses. The loop
never captures (its counts come to the host).
"""
import logging

import torch
import torch.nn.functional as F

from . import gptoss, graphs

log = logging.getLogger("moe")

# Blocks of the fused kernels: (BM, BN, BK, warps, stages) by the
# step's pair count. Decode steps put a few pairs on each expert, so
# blocks of 16 rows (tl.dot's least); prompt steps hundreds.
DECODE_TILES = (16, 64, 128, 4, 3)
PROMPT_TILES = (64, 128, 64, 4, 3)
# Steps of up to this many pairs take the decode tiles and route and
# sort in a kernel each (at most moe_triton.ALIGN_MAX_PAIRS).
DECODE_PAIRS = 1024


def tiles(pairs):
    return DECODE_TILES if pairs <= DECODE_PAIRS else PROMPT_TILES


def max_blocks(pairs, experts, BM):
    """The blocks of BM rows that pairs sorted by expert can fill, each
    expert's rows padded to whole blocks: at most min(experts, pairs)
    experts take a partial block."""
    return (pairs + min(experts, pairs) * (BM - 1) + BM - 1) // BM


def align(flat, experts, BM):
    """The fused kernels' rows for the expert of each (token, choice)
    pair, flat [P] (pair p = token * k + choice): (rows, block_expert).
    rows [max_blocks * BM] int32 holds the pairs sorted by expert (in pair
    order within one), each expert's run padded to whole blocks of BM
    with P; block_expert [max_blocks] int32 the expert of each block,
    `experts` past the blocks in use. All on flat's device, no host sync."""
    P, dev = flat.numel(), flat.device
    nb = max_blocks(P, experts, BM)
    counts = torch.zeros(experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + BM - 1) // BM * BM
    pend = padded.cumsum(0)
    first = counts.cumsum(0) - counts  # each expert's first position in sorted order
    order = torch.argsort(flat, stable=True)
    e = flat[order]
    dest = pend[e] - padded[e] + torch.arange(P, device=dev) - first[e]
    rows = torch.full((nb * BM,), P, dtype=torch.int32, device=dev)
    rows[dest] = order.to(torch.int32)
    starts = torch.arange(nb, device=dev) * BM
    bexp = torch.searchsorted(pend, starts, right=True).to(torch.int32)  # experts where past pend[-1]
    return rows, bexp


NAMES = {"qwen3_moe": ("mlp.", "gate_proj", "up_proj", "down_proj"),
         "mixtral": ("block_sparse_moe.", "w1", "w3", "w2")}


def load(get, cfg, p):
    """The router and stacked experts of sparse layer prefix p."""
    sub, g, u, d = NAMES[cfg.family.mlp]
    m, h, inter = p + sub, cfg.hidden, cfg.moe_intermediate
    gu, down = [], []
    for j in range(cfg.experts):
        e = "%sexperts.%d." % (m, j)
        gu.append(torch.cat([get(e + g + ".weight", (inter, h)), get(e + u + ".weight", (inter, h))]))
        down.append(get(e + d + ".weight", (h, inter)))
    return {"router": get(m + "gate.weight", (cfg.experts, h)), "experts_gu": torch.stack(gu), "experts_down": torch.stack(down)}


class Experts:
    """The forward pass of a sparse layer (see the module comment)."""

    def __init__(self, cfg, device, dtype, layers, act_mul, kernels=False):
        self.k, self.E, self.renorm = cfg.top_k, cfg.experts, cfg.norm_topk
        self.fused = None  # moe_triton where its kernels run here and agree with the loop
        self.grouped = False  # the grouped GEMM runs here and agrees with the loop
        self.capturable = False  # and the path taken captures in a CUDA graph: the decode graphs may run
        sample = next((L for L in layers if "router" in L), None)
        if device.type != "cuda" or sample is None:
            return
        if kernels and cfg.family.act == "silu" and "experts_gu_b" not in sample and sample["experts_gu"].dtype == dtype:
            self.fused = self._fused(sample, cfg.hidden, device, dtype, act_mul)
            if self.fused is not None:
                self.capturable = True
                return
        if hasattr(torch, "_grouped_mm"):
            self.grouped = self._check(sample, cfg.hidden, device, dtype, act_mul)
            self.capturable = self.grouped and self._capture_check(sample, cfg.hidden, device, dtype, act_mul)

    def route(self, h, L):
        """(weights [N, k] in h's dtype, experts [N, k])."""
        if "router_b" in L:  # gpt_oss
            return gptoss.route(h, L, self.k)
        p = torch.softmax(F.linear(h, L["router"]), dim=-1, dtype=torch.float32)
        w, idx = torch.topk(p, self.k, dim=-1)
        if self.renorm:
            w = w / w.sum(dim=-1, keepdim=True)
        return w.to(h.dtype), idx

    def forward(self, h, L, act_mul, grouped=None, fused=None, routed=None, summed=True):
        """The layer's output for rows h: through the fused kernels
        (self.fused, or fused), else the grouped GEMM (self.grouped, or
        grouped), else the loop. routed: (weights, experts) to use
        instead of the router's (the load-time checks compare paths on
        one routing: bfloat16 logits tie, and two top-k codes may order
        equal values differently). summed False: the fused path returns
        the k choices of each row unsummed, [N, k, hidden], for the
        caller's kernel to sum (kernels.add_rms); the others sum them."""
        kern = self.fused if fused is None else fused
        if kern is not None and grouped is None:
            P = h.shape[0] * self.k
            t = tiles(P)
            small = P <= DECODE_PAIRS and self.k & (self.k - 1) == 0  # the routing kernels run
            if routed is not None:
                w, idx = routed
            elif small:
                wf, idx = kern.route(F.linear(h, L["router"]), self.k, self.renorm)
                w = wf.to(h.dtype)
            else:
                w, idx = self.route(h, L)
            if small:
                rows, bexp = kern.align(idx.reshape(-1), self.E, t[0], max_blocks(P, self.E, t[0]))
            else:
                rows, bexp = align(idx.reshape(-1), self.E, t[0])
            ys = kern.experts(h.contiguous(), L["experts_gu"], L["experts_down"], rows, bexp, w.reshape(-1), self.k, t)
            ys = ys.view(h.shape[0], self.k, -1)
            return ys.sum(dim=1) if summed else ys
        w, idx = self.route(h, L) if routed is None else routed
        flat = idx.reshape(-1)
        order = torch.argsort(flat)
        tok = order // self.k  # the token of each sorted (token, choice)
        xs = h[tok]
        gub, downb = L.get("experts_gu_b"), L.get("experts_down_b")
        if self.grouped if grouped is None else grouped:
            counts = torch.zeros(self.E, dtype=torch.int32, device=h.device)
            counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
            offs = counts.cumsum(0, dtype=torch.int32)
            gu = torch._grouped_mm(xs, L["experts_gu"].transpose(1, 2), offs=offs)
            if gub is not None:  # each sorted row's expert's bias
                gu = gu + gub[flat[order]]
            ys = torch._grouped_mm(act_mul(gu), L["experts_down"].transpose(1, 2), offs=offs)
            if downb is not None:
                ys = ys + downb[flat[order]]
        else:
            # The fallback: one product per expert that has tokens (the
            # counts come to the host).
            ys = torch.empty_like(xs)
            at = 0
            for e, c in enumerate(torch.bincount(flat, minlength=self.E).tolist()):
                if c:
                    x = xs[at : at + c]
                    gu = F.linear(x, L["experts_gu"][e], None if gub is None else gub[e])
                    ys[at : at + c] = F.linear(act_mul(gu), L["experts_down"][e], None if downb is None else downb[e])
                at += c
        ys = ys * w.reshape(-1)[order].unsqueeze(1)
        # Back to (token, choice) order and a sum over the k choices: the
        # same additions in the same order every run (index_add_ adds with
        # atomics on CUDA, in whatever order they land), and no host sync.
        back = torch.empty_like(ys)
        back[order] = ys
        return back.view(h.shape[0], self.k, -1).sum(dim=1)

    def _fused(self, L, hidden, device, dtype, act_mul):
        """moe_triton when its kernels build, agree with the loop on a
        decode-sized and a prompt-sized step through a sparse layer's own
        weights, and replay the same from a CUDA graph; else None."""
        try:
            from . import moe_triton
            g = torch.Generator(device="cpu").manual_seed(2)
            # The routing kernel on float32 logits, where ties are rare:
            # the same experts in the same order as torch's top k.
            x = torch.randn(16, hidden, generator=g).to(device=device)
            r = L["router"].float()
            w, idx = self.route(x, {"router": r})
            if self.k & (self.k - 1) == 0:
                wk, ik = moe_triton.route(F.linear(x, r), self.k, self.renorm)
                if not torch.equal(ik, idx) or not torch.allclose(wk, w, atol=1e-6, rtol=1e-5):
                    log.warning("the fused experts' routing kernel disagrees with torch's top k; not used")
                    return None
            tol = 2e-2 if dtype != torch.float32 else 1e-4
            for n in (3, 1024 // self.k + 7):  # both tile shapes (tiles) and both ways to sort
                x = torch.randn(n, hidden, generator=g).to(device=device, dtype=dtype)
                routed = self.route(x, L)
                got = self.forward(x, L, act_mul, fused=moe_triton, routed=routed).float()
                want = self.forward(x, L, act_mul, grouped=False, routed=routed).float()
                if not torch.allclose(got, want, atol=tol, rtol=tol):
                    log.warning("fused expert kernels disagree with the loop at %d tokens (max diff %.3g); not used",
                                n, (got - want).abs().max().item())
                    return None
            # align's kernel compiles once for each power of two of pairs:
            # all of them now, so that no step of a new size (decode graphs
            # capture the batch buckets only; mixed steps bring any) waits
            # for Triton's compiler; each against moe.align, as a wrong
            # count would write past its rows.
            P, BM = 16, DECODE_TILES[0]
            while P <= DECODE_PAIRS:
                for n in (P, P - 3 if P > 16 else P):  # a power of two and not
                    flat = torch.randint(0, self.E, (n,), generator=g).to(device)
                    got = moe_triton.align(flat, self.E, BM, max_blocks(n, self.E, BM))
                    want = align(flat, self.E, BM)
                    if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
                        log.warning("the fused experts' sort kernel disagrees with torch at %d pairs; not used", n)
                        return None
                P *= 2
            x = torch.randn(5, hidden, generator=g).to(device=device, dtype=dtype)
            want = self.forward(x, L, act_mul, fused=moe_triton)
            gr, out = graphs.record(lambda: self.forward(x, L, act_mul, fused=moe_triton), torch.cuda.graph_pool_handle(), warmup=1)
            gr.replay()
            torch.cuda.synchronize(device)
            if not torch.equal(out, want):
                log.warning("fused expert kernels replay differently from a CUDA graph; not used")
                return None
            log.info("fused expert kernels (moe_triton) check and capture")
            return moe_triton
        except Exception as e:  # no Triton, or it cannot compile for this device or shape
            log.warning("fused expert kernels unavailable (%s)", e)
            return None

    def _check(self, L, hidden, device, dtype, act_mul):
        """Whether the grouped GEMM runs here and agrees with the loop on
        random rows through a sparse layer's own weights."""
        try:
            g = torch.Generator(device="cpu").manual_seed(0)
            x = torch.randn(37, hidden, generator=g).to(device=device, dtype=dtype)
            got = self.forward(x, L, act_mul, grouped=True).float()
            want = self.forward(x, L, act_mul, grouped=False).float()
            tol = 2e-2 if dtype != torch.float32 else 1e-4
            if not torch.allclose(got, want, atol=tol, rtol=tol):
                log.warning("grouped expert GEMM disagrees with the loop (max diff %.3g); experts run one by one",
                            (got - want).abs().max().item())
                return False
            return True
        except (RuntimeError, TypeError, ValueError) as e:
            log.warning("grouped expert GEMM unavailable (%s); experts run one by one", e)
            return False

    def _capture_check(self, L, hidden, device, dtype, act_mul):
        """Whether a grouped forward through L captures in a CUDA graph
        (on a side stream, into a pool of its own, dropped after) and its
        replay gives what it gives eagerly."""
        try:
            x = torch.randn(5, hidden, generator=torch.Generator(device="cpu").manual_seed(1)).to(device=device, dtype=dtype)
            want = self.forward(x, L, act_mul, grouped=True)
            g, out = graphs.record(lambda: self.forward(x, L, act_mul, grouped=True), torch.cuda.graph_pool_handle(), warmup=1)
            g.replay()
            torch.cuda.synchronize(device)
            tol = 2e-2 if dtype != torch.float32 else 1e-4
            if not torch.allclose(out.float(), want.float(), atol=tol, rtol=tol):
                log.warning("grouped expert GEMM replays differently from a CUDA graph; CUDA graphs are off for this model")
                return False
            log.info("grouped expert GEMM captures in CUDA graphs")
            return True
        except (RuntimeError, TypeError, ValueError) as e:
            log.warning("grouped expert GEMM does not capture in a CUDA graph (%s); experts run grouped, "
                        "CUDA graphs are off for this model", e)
            return False
