"""Several decode steps per step request (PROTOCOL.md: "Lookahead").

A step input may ask for n > 1 tokens: after the step, the model keeps
decoding that sequence, feeding it the token it just sampled, until it has
n tokens. The supervisor hands them out one per Step and checks stop
conditions itself; tokens past a stop are wasted (at most n - 1), and a
sequence the caller feeds something else is rolled back ("back").

On CUDA with the Triton kernels the extra steps run from device tensors:
the sampled tokens feed the next step's graph without a host round trip,
and the host reads all the tokens once at the end.
"""
import torch

from sampling import _filter, _generator, sample_rows

MAX_AHEAD = 64
_PLAIN = {"t", "k", "p", "m", "s", "l"}


def allowed(params):
    """Whether a sequence with these sampling parameters may run ahead:
    only parameters that do not depend on what the caller does between
    tokens (not the repetition penalty, not anything newer)."""
    return all(k in _PLAIN for k in params)


def remember(items, device, rows=None):
    """Records each temperature-sampled sequence's generator state before
    its next draw, so that taking tokens back (rewind) also takes back
    their draws: a seeded sequence then samples as if they never happened."""
    for i in (range(len(items)) if rows is None else rows):
        params, s = items[i]
        if float(params.get("t") or 0) > 0:
            g = _generator(s, params, device)
            s.hist = (s.hist or [])[-2 * MAX_AHEAD:] + [g.get_state()]


def rewind(s, back):
    """Drops the last back tokens the sequence was fed and the draws that
    sampled them."""
    del s.tokens[len(s.tokens) - back:]
    if s.hist and s.gen is not None and len(s.hist) >= back:
        s.gen.set_state(s.hist[-back])
        del s.hist[-back:]


def plan(model, batch, seqs):
    """Returns, per sampling input in order, how many tokens it gets (1:
    just this step's), clipped to the context and to the KV capacity, and
    reserves the KV the extra tokens need. batch entries are
    [seq, tokens, sample, params, n?, back?]."""
    want = []
    for b, s in zip(batch, seqs):
        if not b[2]:
            continue
        n = int(b[4]) if len(b) > 4 and b[4] else 1
        if n > 1 and not allowed(b[3]):
            n = 1
        n = max(1, min(n, MAX_AHEAD))
        # This step feeds len(b[1]) tokens; each extra token feeds one more.
        fed = len(s.tokens) + len(b[1])
        n = min(n, model.cfg.context - fed + 1)
        grow = max(0, fed + n - 1 - s.held)
        if grow > model.capacity - model.used:
            n = max(1, n - (grow - (model.capacity - model.used)))
            grow = max(0, fed + n - 1 - s.held)
        model.used += grow
        s.held = max(s.held, fed + n - 1)
        want.append(n)
    return want


def run(model, items, first, want):
    """items: (params, seq) per sampling input; first: the tokens this
    step sampled for them (host ints); want: tokens per input, first
    included. Returns (more, more_logprobs): per input the want-1 tokens
    after first, and their logprobs (None when nobody asked)."""
    steps = max(want) - 1
    g = model.graphs
    if g is not None and g.fast and g.usable(len(items)):
        try:
            return _run_device(model, items, first, want, steps)
        except RuntimeError as e:
            raise RuntimeError("lookahead on the device failed: %s" % e) from e
    return _run_host(model, items, first, want, steps)


def _run_host(model, items, first, want, steps):
    """One ordinary decode step per extra token, through TorchModel's
    own forward and sampling: any device, any parameters allowed above."""
    more = [[] for _ in items]
    lps = [[] for _ in items]
    last = list(first)
    for j in range(1, steps + 1):
        act = [i for i in range(len(items)) if want[i] > j]
        sub = [[None, [last[i]], True, items[i][0]] for i in act]
        seqs = [items[i][1] for i in act]
        rows = model._forward(sub, seqs)
        remember(items, model.device, act)
        toks, lp = sample_rows(rows, [items[i] for i in act], model.device)
        for i, t, l in zip(act, toks, lp):
            more[i].append(t)
            lps[i].append(l)
            last[i] = t
    return more, (lps if any(p.get("l") for p, _ in items) else None)


def _run_device(model, items, first, want, steps):
    """The extra steps chained on the device: graph replays fed by the
    previous step's sampled tokens; one host read at the end. Inputs that
    need fewer tokens ride along on the scratch slot."""
    dev = model.device
    S = len(items)
    p0 = [len(s.tokens) for _, s in items]
    sl = [s.slot for _, s in items]
    host = [[[p0[i] + j if want[i] > j + 1 else 0 for i in range(S)],
             [sl[i] if want[i] > j + 1 else model.slots for i in range(S)]] for j in range(steps)]
    plan_dev = torch.tensor(host, dtype=torch.long).to(dev)
    tok = torch.tensor(first, device=dev, dtype=torch.long)
    logp = any(p.get("l") for p, _ in items)
    hot = [i for i, (p, _) in enumerate(items) if float(p.get("t") or 0) > 0]
    outs, outl = [], []
    for j in range(steps):
        logits = model.graphs.run_device(tok, plan_dev[j])
        nxt = torch.argmax(logits, dim=-1)
        for i in hot:
            if want[i] > j + 1:
                p, s = items[i]
                remember(items, dev, [i])
                probs = _filter(logits[i], p)
                nxt[i] = torch.multinomial(probs, 1, generator=_generator(s, p, dev))[0]
        if logp:
            outl.append(torch.log_softmax(logits, dim=-1).gather(1, nxt.unsqueeze(1)).squeeze(1))
        outs.append(nxt)
        tok = nxt
    toks = torch.stack(outs).tolist()
    lpv = torch.stack(outl).tolist() if logp else None
    more = [[toks[j][i] for j in range(want[i] - 1)] for i in range(S)]
    for i, (_, s) in enumerate(items):
        if want[i] > 1:
            s.tokens.append(first[i])
            s.tokens.extend(more[i][:-1])
    if not logp:
        return more, None
    return more, [[lpv[j][i] if items[i][0].get("l") else 0.0 for j in range(want[i] - 1)] for i in range(S)]
