"""Several decode steps per step request (PROTOCOL.md: "Lookahead").

A step input may ask for n > 1 tokens: after the step, the model keeps
decoding that sequence, feeding it the token it just sampled, until it has
n tokens. The supervisor hands them out one per Step and checks stop
conditions itself; tokens past a stop are wasted (at most n - 1), and a
sequence the caller feeds something else is rolled back ("back").

On CUDA with the Triton kernels the extra steps run from device tensors:
the sampled tokens feed the next step's graph without a host round trip,
and the host reads all the tokens once at the end.

A constrained input (mask "x") runs ahead only with a loop: "lp" the
tokens after which its mask stays the same and "ls" for how many steps.
Its extra tokens are sampled under the same mask, and it stops after the
first token outside the loop (on the device chain the later tokens are
decoded anyway and dropped, their draws taken back).
"""
from operator import itemgetter

import torch

from ..backend import StepResult
from ..params import AHEAD_KEYS, LOOP_KEYS
from .sampling import _generator, apply_masks, device_masks, draws, packed_set, sample_rows
from .upload import HostCopy, to_device


def allowed(params):
    """Whether a sequence with these sampling parameters may run ahead:
    only parameters that do not depend on what the caller does between
    tokens (not the repetition penalty, not anything newer), and a mask
    only with its loop."""
    if "x" in params:
        return "lp" in params and int(params.get("ls") or 0) > 0 and all(k in AHEAD_KEYS or k in LOOP_KEYS for k in params)
    return AHEAD_KEYS.issuperset(params)


_params, _seq = itemgetter(0), itemgetter(1)  # of an item (params, seq)
_tokens = itemgetter(1)  # of a batch row


def all_plain(items):
    """Whether every input of items may run ahead without a mask (allowed,
    no "x": AHEAD_KEYS holds all its keys). Looped in C: a decode step's
    220 rows come here."""
    return all(map(AHEAD_KEYS.issuperset, map(_params, items)))


def loops(items, width):
    """Per input, the host bitset of its loop's tokens, or None when it
    has no mask (nothing stops it early)."""
    return [packed_set(p["lp"], width) if "x" in p and "lp" in p else None for p, _ in items]


def in_loop(bits, tok):
    """Whether tok continues a loop (bits from loops)."""
    return bits is None or (int(bits[tok >> 3]) >> (tok & 7)) & 1 == 1


def exit_at(bits, first, toks):
    """How many of toks (sampled after first, when first is not None) an
    input keeps when it leaves its loop: up to and including the first
    token outside it; None when it stays in the loop."""
    if bits is None:
        return None
    if first is not None and not in_loop(bits, first):
        return 0
    for q, t in enumerate(toks):
        if not in_loop(bits, t):
            return q + 1
    return None


def remember(model, items, rows=None):
    """Records each temperature-sampled sequence's generator state before
    its next draw, so that taking tokens back (rewind) also takes back
    their draws: a seeded sequence then samples as if they never happened."""
    keep = 2 * max(model.max_ahead, 1) + 1  # states kept: the last 2 * max_ahead and this one
    for i in (range(len(items)) if rows is None else rows):
        params, s = items[i]
        t = params.get("t")
        if t and float(t) > 0:
            g = s.gen  # _generator(s, params).get_state(), inline: every temperature row of a step comes here
            state = (g if g is not None else _generator(s, params)).pos
            h = s.hist
            if h is None:
                s.hist = [state]
                continue
            h.append(state)
            if len(h) > keep:
                del h[:len(h) - keep]


def rewind(s, back):
    """Drops the last back tokens the sequence was fed and the draws that
    sampled them."""
    del s.tokens[len(s.tokens) - back:]
    if s.hist and s.gen is not None and len(s.hist) >= back:
        s.gen.set_state(s.hist[-back])
        del s.hist[-back:]


def overlaps(model):
    """Whether the model speculates the next decode step behind each step
    (Spec): the overlap setting, on CUDA with the Triton kernels and
    graphs."""
    g = model.graphs
    return model.overlap and g is not None and g.fast


def plan(model, batch, seqs, last=frozenset()):
    """Returns, per sampling input in order, how many tokens it gets (1:
    just this step's), clipped to the context and to the KV blocks free
    or idle in the prefix cache (no saved prefix given up: PagedKV.grow's
    ahead), and gives the sequences the blocks the extra tokens need
    (plus one more token's where there is one, for the next step and
    Spec; not for the sequences in last, which have no next step). batch
    entries are [seq, tokens, sample, params, n?, back?]. Also returns
    whether every sampling input not in last then has room for the
    speculated step after its tokens: the block of its next position,
    within the context (what Spec.launch and Spec.after need; the
    sequences' blocks do not shrink before then)."""
    ahead = overlaps(model)
    kv, context = model.kv, model.cfg.context
    dense, bs = not kv.layout.sliding_groups, kv.bs
    want, room = [], True
    for b, s in zip(batch, seqs):
        if not b[2]:
            continue
        if len(b) < 5 or not b[4]:  # one token, the common decode row
            fed = len(s.tokens) + len(b[1])
            # The block of the next step's token (Spec), unless held already
            # (PagedKV.grow's first test, made here without the call): the
            # common row's is, within the context.
            held = fed + 1 <= len(s.pages[0]) * bs
            if not (dense and held and fed < context) and b[0] not in last:
                if ahead and fed < context and not (dense and held):
                    kv.grow(s, fed + 1, ahead=True)
                    held = fed + 1 <= len(s.pages[0]) * bs
                room = room and fed < context and held
            want.append(1)
            continue
        n = int(b[4])
        if n > 1 and not allowed(b[3]):
            n = 1
        if n > 1 and "x" in b[3]:
            n = min(n, int(b[3]["ls"]) + 1)
        n = max(1, min(n, model.max_ahead))
        # This step feeds len(b[1]) tokens; each extra token feeds one more.
        fed = len(s.tokens) + len(b[1])
        n = min(n, model.cfg.context - fed + 1)
        if n > 1:
            n = model.kv.grow(s, fed + n - 1, ahead=True) - fed + 1
        if (n > 1 or ahead) and fed + n <= model.cfg.context and b[0] not in last:  # no next step for last
            model.kv.grow(s, fed + n, ahead=True)
        if b[0] not in last:
            room = room and fed + n <= context and fed + n <= len(s.pages[0]) * bs
        want.append(n)
    return want, room


def chainable(model, batch, items, want):
    """Whether the whole step, its first token included, can run as a
    device chain: every input decodes one token and samples, with
    parameters that run ahead, on a graph-captured batch size. A chain
    of one step is worth it for the Spec behind it (overlaps)."""
    g = model.graphs
    return ((max(want, default=1) > 1 or overlaps(model)) and g is not None and g.fast and g.usable(len(batch))
            and len(items) == len(batch) and max(map(len, map(_tokens, batch))) == 1
            and (all_plain(items) or all(allowed(p) for p, _ in items))
            and (not adapted(items) or g.lora_usable(len(batch))))


def adapted(items):
    """Whether a sequence of items runs a LoRA adapter: the chain then
    replays the graphs captured with the delta (graphs.py), or, where
    those do not run, the steps take the host path."""
    return any(s.lora for _, s in items)


def run_chain(model, items, tokens, want, ends=None, room=False):
    """The whole step on the device (see chainable): tokens are the ones
    the inputs feed. Returns the StepResult TorchModel.step does. When
    the next round looks like this one, its first step is launched before
    this round's tokens are read, without the inputs ends marks as their
    sequences' last (Spec.launch; room: plan's)."""
    spec, model.spec = model.spec, None
    pre = spec.take(map(_seq, items)) if spec is not None else None
    ch = _launch(model, items, tokens, want, 0, pre)
    if spec is not None:
        model.speculated["chained" if pre is not None else "discarded"] += 1
        model.spec_missed = pre is None
    if not model.spec_missed:
        model.spec = Spec.launch(model, items, ch, ends, room)
    model.spec_missed = False  # after a miss, one round without
    out, lps = _finish(ch)
    first = [o[0] for o in out]
    ahead = max(want, default=1) > 1  # else a chain of one step, for the Spec behind it: nothing more
    more = [o[1:] for o in out] if ahead else None
    none = [[] for _ in items]  # no top log-probabilities: allowed() refuses them
    if lps is None:
        return StepResult(first, [0.0] * len(items), none, more, None)
    return StepResult(first, [p[0] for p in lps], none, more, [p[1:] for p in lps] if ahead else None)


def run(model, items, first, want):
    """items: (params, seq) per sampling input; first: the tokens this
    step sampled for them (host ints); want: tokens per input, first
    included. Returns (more, more_logprobs): per input the want-1 tokens
    after first, and their logprobs (None when nobody asked)."""
    steps = max(want) - 1
    g = model.graphs
    if g is not None and g.fast and g.usable(len(items)) and (not adapted(items) or g.lora_usable(len(items))):
        return _finish(_launch(model, items, first, want, 1, None))
    return _run_host(model, items, first, want, steps)


def _run_host(model, items, first, want, steps):
    """One ordinary decode step per extra token, through TorchModel's
    own forward and sampling: any device, any parameters allowed above.
    A constrained input stops after the first token outside its loop, and
    the step's other inputs with it (lockstep: the supervisor answers a
    step from its buffers only when every input has a token there, so
    tokens past one input's exit would wait for round trips anyway and
    split the batch). Masks are decoded once for all the steps."""
    more = [[] for _ in items]
    lps = [[] for _ in items]
    last = list(first)
    width = model.cfg.vocab
    lb = loops(items, width)
    if not all(in_loop(b, t) for b, t in zip(lb, first)):
        return more, None
    masks = device_masks(items, width, model.device)
    for j in range(1, steps + 1):
        act = [i for i in range(len(items)) if want[i] > j]
        if not act:
            break
        sub = [[None, [last[i]], True, items[i][0]] for i in act]
        seqs = [items[i][1] for i in act]
        rows = model._forward(sub, seqs)
        remember(model, items, act)
        m = masks[to_device(act, masks.device)] if masks is not None else None
        toks, lp, _ = sample_rows(rows, [items[i] for i in act], model.device, masks=m)
        for i, t, l in zip(act, toks, lp):
            items[i][1].note_fed([last[i]])
            more[i].append(t)
            lps[i].append(l)
            last[i] = t
        if not all(in_loop(lb[i], t) for i, t in zip(act, toks)):
            want = [min(w, j + 1) for w in want]
    return more, (lps if any(p.get("l") for p, _ in items) else None)


def _upload(rows, dev):
    """Host ints to the device without waiting for queued GPU work."""
    return to_device(rows, dev)


def _drawn(items):
    """The indices of items' temperature-sampled inputs. A greedy row's
    params lack "t": tested before float(), the common case costs a
    lookup a row (a decode step's 220 rows come here)."""
    return [i for i, (p, _) in enumerate(items) if p.get("t") and float(p["t"]) > 0]


def _wants_logprobs(items):
    return any(p.get("l") for p, _ in items)


def _kinds(items):
    """items' _drawn and _wants_logprobs. Rows without params (greedy,
    nothing asked: a greedy decode step's every row) are told in one
    pass in C."""
    if not any(map(_params, items)):
        return [], False
    return _drawn(items), _wants_logprobs(items)


def _sample(model, items, logits, masks, temp, logprobs):
    """Greedy for every row (the Triton argmax), then the temperature rows
    temp (of _drawn(items), those active at this step) drawn, each at its
    own position (sampling.draws); their logprobs when logprobs (an input
    asked). masks: the rows' allowed masks (device_masks), applied first."""
    apply_masks(logits, masks)
    if not temp:
        nxt = model.model.kern.argmax(logits)
    elif len(temp) == len(items):  # every row draws: no argmax to overwrite, nor rows to upload (sample_rows' rule)
        remember(model, items, temp)
        nxt = draws(logits, temp, items)
    else:
        nxt = model.model.kern.argmax(logits)
        remember(model, items, temp)
        nxt[_upload(temp, model.device)] = draws(logits, temp, items)
    lp = None
    if logprobs:
        lp = torch.log_softmax(logits, dim=-1).gather(1, nxt.unsqueeze(1)).squeeze(1)
    return nxt, lp


class _Chain:
    __slots__ = ("items", "feed", "done", "run", "steps", "plan", "last", "copy", "host", "loops", "slots", "temp",
                 "logprobs")


def _launch(model, items, feed, want, done, pre):
    """Queues decode steps chained on the device: graph replays fed by the
    previous step's sampled tokens. feed: the tokens (host ints) the first
    step feeds; done: tokens per input already sampled (0 or 1), so input
    i runs want[i] - done steps; pre: the first step's (tokens, logprobs)
    when it already ran (Spec). Inputs with fewer steps ride along on the
    scratch table row. The sampled tokens are copied to pinned host memory
    behind the steps; _finish reads them."""
    dev = model.device
    S = len(items)
    ch = _Chain()
    ch.items, ch.feed, ch.done = items, feed, done
    ch.run = [w - done for w in want]
    ch.steps = max(ch.run)
    p0 = [len(s.tokens) for _, s in items]
    rows = [s.row for _, s in items]
    run = ch.run
    model.kv.flush()  # blocks the plan took
    ch.slots = _upload([s.lora for _, s in items], dev) if adapted(items) else None  # LoRA slots: graphs.run_device
    low = min(run)  # the steps every input runs: their rows need no test an input

    def step_rows(j):
        if j < low:
            return [p0 if j == 0 else [p + j for p in p0], rows]
        return [[p0[i] + j if run[i] > j else 0 for i in range(S)], [rows[i] if run[i] > j else 0 for i in range(S)]]
    ch.plan = _upload([step_rows(j) for j in range(ch.steps)], dev)
    plain = not any(map(_params, items))  # no input has params (_kinds): nothing to draw, mask or report
    # The same every step, and for Spec.launch.
    ch.temp, ch.logprobs = ([], False) if plain else (_drawn(items), _wants_logprobs(items))
    outs, outl = [], []
    tok = None
    masks = None if plain else device_masks(items, model.cfg.vocab, dev)
    ch.loops = loops(items, model.cfg.vocab) if masks is not None else None
    for j in range(ch.steps):
        if j == 0 and pre is not None:
            nxt, lp = pre
        else:
            if tok is None:
                tok = _upload(feed, dev)
            logits = model.graphs.run_device(tok, ch.plan[j], ch.slots)
            temp = ch.temp if j < low else [i for i in ch.temp if run[i] > j]
            nxt, lp = _sample(model, items, logits, masks, temp, ch.logprobs)
        outs.append(nxt)
        if lp is not None:
            outl.append(lp)
        tok = nxt
    ch.last = tok
    reads = [torch.stack(outs)]
    if ch.logprobs:
        reads.append(torch.stack(outl))
    ch.copy = HostCopy(reads)
    return ch


def _finish(ch):
    """Waits for a launched chain's tokens and records what each sequence
    was fed. Returns, per input, its sampled tokens and their logprobs
    (None when nobody asked)."""
    got = ch.copy.get()
    toks = got[0]
    ch.host = toks  # Spec.fed reads the last step's tokens
    items, run = ch.items, ch.run
    if ch.steps == 1 and ch.loops is None and not ch.done:
        # A chain of one step (the Spec behind it its reason): every input
        # (want 1 or more, none done) was fed its own token and sampled
        # one. Nothing to count for the penalties: the step's tokens were
        # counted when it arrived.
        res = [[t] for t in toks[0]]
        for (_, s), f in zip(items, ch.feed):
            s.tokens.append(f)
            s.sampled = True
    else:
        res = [[toks[j][i] for j in range(run[i])] for i in range(len(items))]
        if ch.loops is not None:
            _cut(ch, res)
        for i, (_, s) in enumerate(items):
            if res[i]:  # fed: feed[i], then every sampled token but the last
                s.tokens.append(ch.feed[i])
                s.tokens.extend(res[i][:-1])
                # The step's own tokens were counted when it arrived (done 0).
                s.note_fed(([ch.feed[i]] if ch.done else []) + res[i][:-1])
            s.sampled = True
    if len(got) < 2:
        return res, None
    lpv = got[1]
    if ch.steps == 1 and ch.loops is None and not ch.done:  # one token each, as above: one pass a row
        lp0 = lpv[0]
        return res, [[lp0[i]] if p.get("l") else [0.0] for i, (p, _) in enumerate(items)]
    return res, [[lpv[j][i] if items[i][0].get("l") else 0.0 for j in range(len(res[i]))] for i in range(len(items))]


def _cut(ch, res):
    """Drops the tokens the chain decoded after the first one outside a
    constrained input's loop: that input's (sampled under a mask that no
    longer held) and, in lockstep, every other input's (see _run_host),
    taking back their draws."""
    exits = [exit_at(b, f if ch.done else None, r) for b, f, r in zip(ch.loops, ch.feed, res)]
    cut = min((e for e in exits if e is not None), default=None)
    if cut is None:
        return
    for i, (p, s) in enumerate(ch.items):
        k = min(cut, len(res[i]))
        drop = len(res[i]) - k
        if drop == 0:
            continue
        del res[i][k:]
        if float(p.get("t") or 0) > 0 and s.hist and s.gen is not None and len(s.hist) >= drop:
            s.gen.set_state(s.hist[-drop])
            del s.hist[-drop:]


class Spec:
    """The next decode step, launched behind this step before the host
    reads its tokens: while the supervisor hands the tokens out and asks
    for more, the GPU already decodes. It assumes every sequence goes on,
    fed the token it just sampled, with the same parameters. A request
    may use it for some of its inputs (those of sequences it ran, each fed
    that token) and run the others beside it (prompt chunks, sequences
    that joined since: TorchModel._step_with_spec); one that feeds a
    sequence something else discards it (one step of GPU work lost;
    temperature draws are taken back, so seeded sequences do not notice)."""

    __slots__ = ("rows", "live", "chain", "feed", "tok", "lp", "pick")

    @staticmethod
    def launch(model, items, ch, ends=None, room=False):
        """Speculates the step after chain ch, or returns None when the
        next step cannot be such a step. ends (None: none), per input,
        whether its token is its sequence's last: those rows are left out
        (none left: nothing launched). room: whether the others have the
        block the step writes in (plan's)."""
        if ch.steps < 1 or min(ch.run) != ch.steps or ch.loops is not None:
            return None  # a constrained round's next mask is the caller's
        if not room:  # the block of the position the step writes in, for some input
            return None
        plan = ch.plan[ch.steps - 1].clone()
        plan[0] += 1  # the position after the round's last fed token
        tok, slots, pick = ch.last, ch.slots, _going_on(ends)
        if pick is not None:
            if not pick or not model.graphs.usable(len(pick)):
                return None
            ix = _upload(pick, tok.device)
            items = [items[i] for i in pick]
            plan, tok, slots = plan[:, ix], tok[ix], (slots[ix] if slots is not None else None)
        temp, logprobs = (ch.temp, ch.logprobs) if pick is None else _kinds(items)
        sp = Spec._start(model, items, tok, plan, slots, ch, None, temp, logprobs)
        sp.pick = pick
        return sp

    @staticmethod
    def after(model, items, toks, room):
        """Speculates the decode step after an ordinary step whose
        sampling inputs were items and which sampled toks (on the device,
        int64 [len(items)]; the host's copy goes in feed once read), or
        returns None where that step cannot run on the device chain: an
        input with parameters that do not run ahead or a mask, a batch
        size without a graph, a sequence at the end of its blocks (room
        false: plan's)."""
        g = model.graphs
        if not items or not g.usable(len(items)) or not all_plain(items):
            return None
        ad = adapted(items)
        if ad and not g.lora_usable(len(items)):
            return None
        if not room:
            return None
        dev = model.device
        model.kv.flush()  # the block plan() took ahead for this step
        plan = _upload([[len(s.tokens) for _, s in items], [s.row for _, s in items]], dev)
        slots = _upload([s.lora for _, s in items], dev) if ad else None
        return Spec._start(model, items, toks, plan, slots, None, None, *_kinds(items))

    @staticmethod
    def _start(model, items, tok, plan, slots, chain, feed, temp, logprobs):
        """temp, logprobs: items' _kinds."""
        sp = Spec()
        sp.rows = [(dict(p), s) for p, s in items]
        sp.live = {id(s): i for i, (_, s) in enumerate(items)}
        sp.chain, sp.feed = chain, feed  # what each row is fed: feed, or the chain's last tokens
        sp.pick = None  # Spec.after over some of a step's inputs: their indices (fed_after)
        logits = model.graphs.run_device(tok, plan, slots)
        sp.tok, sp.lp = _sample(model, items, logits, None, temp, logprobs)
        model.speculated["launched"] += 1
        return sp

    def fed(self):
        """The token each row was fed, host ints (after an ordinary step,
        set by fed_after once the step's tokens are read)."""
        if self.feed is None:
            last = self.chain.host[-1]  # read by _finish already
            self.feed = list(last) if self.pick is None else [last[i] for i in self.pick]
        return self.feed

    def matches(self, s, toks, params):
        """Whether the speculated row of sequence s is the step of an
        input feeding it toks with params."""
        i = self.live.get(id(s))
        return i is not None and len(toks) == 1 and toks[0] == self.fed()[i] and self.rows[i][0] == params

    def take(self, seqs):
        """The speculated (tokens, logprobs) of the inputs of seqs, in their
        order, on the device; the other rows are discarded. None after
        discarding the speculation when a sequence is not one it ran.
        settle() has matched every input of a sequence it ran to its step
        (else it discarded the speculation): what is left to test is that
        each sequence is one of those."""
        live = self.live
        idx = list(map(live.get, map(id, seqs)))
        if None in idx:
            self.discard()
            return None
        if len(idx) < len(live):  # else every live row is one of items' (distinct sequences)
            self.discard(keep=set(idx))
        if idx == list(range(len(self.rows))):
            return self.tok, self.lp
        ix = _upload(idx, self.tok.device)
        return self.tok[ix], (self.lp[ix] if self.lp is not None else None)

    def drop(self, s):
        """Forgets sequence s (freed): takes back its draw."""
        i = self.live.pop(id(s), None)
        if i is not None:
            _undraw(*self.rows[i])

    def discard(self, keep=()):
        """Takes back the draws of every live row not in keep."""
        for sid, i in list(self.live.items()):
            if i not in keep:
                del self.live[sid]
                _undraw(*self.rows[i])


def launcher(model, items, ends=None, room=False):
    """For sample_rows' launch after an ordinary step whose sampling
    inputs are items: launches the next decode step behind it (Spec.after)
    where the model overlaps, unless the last speculation missed (then one
    step goes without). ends (None: none), per input, whether its token
    is its sequence's last (the request's "last"): those are left out, and
    nothing is launched when every input ends (a request of one token: no
    decode step of it ever comes). None where there is nothing to launch.
    The caller gives the Spec its host tokens (fed_after) once read.
    room: plan's, for Spec.after."""
    if not overlaps(model):
        return None
    pick = _going_on(ends)
    if pick is not None:
        if not pick:  # a round without a speculation: as after a miss (run_chain's rule)
            model.spec_missed = False
            return None
        items = [items[i] for i in pick]
    if model.spec_missed:
        model.spec_missed = False
        return None

    def launch(toks):
        if pick is not None:
            toks = toks[_upload(pick, toks.device)]
        model.spec = sp = Spec.after(model, items, toks, room)
        if sp is not None:
            sp.pick = pick
    return launch


def _going_on(ends):
    """The indices of the inputs whose sequences go on (ends: per input,
    whether its token is its last), or None when every one does."""
    if ends is None or not any(ends):
        return None
    return [i for i, e in enumerate(ends) if not e]


def fed_after(model, toks):
    """The host tokens of the step a Spec.after speculation follows (of
    its inputs the speculation took, where it left some out)."""
    sp = model.spec
    if sp is not None and sp.feed is None and sp.chain is None:
        sp.feed = list(toks) if sp.pick is None else [toks[i] for i in sp.pick]


def _undraw(params, s):
    """Takes back a sequence's last temperature draw (remember's record)."""
    if float(params.get("t") or 0) > 0 and s.hist and s.gen is not None:
        s.gen.set_state(s.hist.pop())


def settle(model, batch):
    """Discards a speculation this request cannot use (an input of a
    sequence it ran that is not the decode step it assumed, or any
    take-back), so that rewinding and sampling see the draws as they are.
    TorchModel._check makes the same test in its pass over the rows;
    this is for a request that fails validation."""
    sp = model.spec
    if sp is None:
        return
    # Inputs of sequences it did not run (prompt chunks, sequences that
    # joined since) may go beside it; each of its own must be its step.
    ok = all(len(b) < 6 or not b[5] for b in batch)
    if ok:
        opened, live, feed, rows = model.seqs, sp.live, sp.fed(), sp.rows
        for b in batch:  # Spec.matches, inline: every row of a decode step comes here
            s = opened.get(b[0])
            i = live.get(id(s)) if s is not None else None
            if i is not None and not (b[2] and len(b[1]) == 1 and b[1][0] == feed[i] and rows[i][0] == b[3]):
                ok = False
                break
    if not ok:
        cancel(model)


def cancel(model):
    """Discards the speculation, if any; the next round runs without one."""
    if model.spec is not None:
        model.spec.discard()
        model.spec = None
        model.spec_missed = True
        model.speculated["discarded"] += 1
