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
the family has them (gpt_oss). Tokens are sorted by expert; on CUDA one grouped
GEMM (torch._grouped_mm, where this torch has it and it agrees with the
loop below at load) runs every expert's rows at once, with no host sync.
Elsewhere, and as the fallback, a loop over the experts that received
tokens runs each one's rows as one matrix product.

A model's decode steps run on CUDA graphs (graphs.py) only where the
grouped GEMM also captures (Experts.capturable, tried at load): some
builds run it, for some dtypes (float32, fp8), through a fallback that
copies its offsets to the host, which capture refuses. The loop never
captures (its counts come to the host).
"""
import logging

import torch
import torch.nn.functional as F

from . import gptoss, graphs

log = logging.getLogger("moe")

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

    def __init__(self, cfg, device, dtype, layers, act_mul):
        self.k, self.E, self.renorm = cfg.top_k, cfg.experts, cfg.norm_topk
        self.grouped = False  # the grouped GEMM runs here and agrees with the loop
        self.capturable = False  # and it captures in a CUDA graph: the decode graphs may run
        sample = next((L for L in layers if "router" in L), None)
        if device.type == "cuda" and hasattr(torch, "_grouped_mm") and sample is not None:
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

    def forward(self, h, L, act_mul, grouped=None):
        w, idx = self.route(h, L)
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
