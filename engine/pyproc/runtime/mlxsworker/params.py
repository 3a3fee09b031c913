"""A step input's sampling parameters as the protocol carries them
(PROTOCOL.md, "Requests and replies"): the one table of their keys, and
what both backends read from them alike: token sets (the allowed mask "x"
and a loop's "lp") and the logit adjustments (repetition, presence and
frequency penalties, logit bias), over either backend's arrays.
"""
import base64
import collections

# How a key bears on lookahead (PROTOCOL.md, "Lookahead"): PLAIN keys
# do not depend on what the caller does between tokens, so a sequence may
# decode ahead with them; LOOP keys only together (a mask with its loop);
# NEVER keys keep a sequence to one token per step.
PLAIN, LOOP, NEVER = "plain", "loop", "never"

# key: its key in params; feature: its name in the handshake's
# capabilities "sampling" (None: not a sampling feature of its own);
# ahead: PLAIN, LOOP or NEVER.
Param = collections.namedtuple("Param", "key feature ahead")

PARAMS = (
    Param("t", "temperature", PLAIN),
    Param("k", "top_k", PLAIN),
    Param("p", "top_p", PLAIN),
    Param("m", "min_p", PLAIN),
    Param("r", "repetition_penalty", NEVER),
    Param("s", "seed", PLAIN),
    Param("pp", "presence_penalty", NEVER),
    Param("fp", "frequency_penalty", NEVER),
    Param("lb", "logit_bias", NEVER),
    Param("x", "allowed_mask", LOOP),
    Param("n", "top_logprobs", NEVER),
    Param("g", "generated", PLAIN),
    Param("l", None, PLAIN),  # the sampled token's log-probability (capabilities "logprobs")
    Param("lp", None, LOOP),  # a constrained input's loop (lookahead)
    Param("ls", None, LOOP),
)

KEYS = [p.key for p in PARAMS]
AHEAD_KEYS = frozenset(p.key for p in PARAMS if p.ahead == PLAIN)
LOOP_KEYS = frozenset(p.key for p in PARAMS if p.ahead == LOOP)


def features(without=()):
    """The handshake's capabilities "sampling": greedy and every feature
    of PARAMS but those in without."""
    return ["greedy"] + [p.feature for p in PARAMS if p.feature and p.feature not in without]


# -- token sets ----------------------------------------------------------------

TokenSet = collections.namedtuple("TokenSet", "ids allow limit bits")
TokenSet.__doc__ = """One of the protocol's token sets, read (token_set):
ids with allow true are the set ("a"); ids with allow false are left
out of every id below limit ("d"); bits is a bitset instead (bit id %
8 of byte id / 8, "b"), ids None. Ids are as sent: unsorted, repeated
or out of range ones are the reader's to drop."""


def token_set(x, width):
    """The token set x ({"a": ids}, {"d": ids, "v": vocab} or {"b":
    base64}) of a vocabulary of width ids."""
    if "a" in x:
        return TokenSet(x["a"], True, width, None)
    if "d" in x:
        return TokenSet(x["d"], False, min(int(x.get("v", width)), width), None)
    return TokenSet(None, True, width, base64.b64decode(x["b"])[: (width + 7) // 8])


# -- logit adjustments ---------------------------------------------------------

def adjusts(params):
    """Whether params change the logits before the mask (adjust)."""
    r = float(params.get("r") or 0)
    return (r > 0 and r != 1) or bool(params.get("lb") or params.get("pp") or params.get("fp"))


def adjust(row, seq, params, ops):
    """The repetition penalty, presence and frequency penalties and logit
    bias of params applied to row (a sequence's logits, float32), in the
    protocol's order; the mask follows. seq: its tokens and the counts of
    its generated tokens; ops: the backend's arrays (an object with
    ids(values, row) and floats(values, row), one-dimensional arrays of
    indices and of row's dtype on row's device, and where). Returns the
    row, changed in place where the arrays allow."""
    r = float(params.get("r") or 0)
    if r > 0 and r != 1 and seq.tokens:
        idx = ops.ids(sorted(set(seq.tokens)), row)
        v = row[idx]
        row[idx] = ops.where(v > 0, v / r, v * r)
    pp, fp = float(params.get("pp") or 0), float(params.get("fp") or 0)
    counts = seq.counts
    if (pp or fp) and counts:
        ids = list(counts)
        idx = ops.ids(ids, row)
        row[idx] = row[idx] - (pp + fp * ops.floats([counts[i] for i in ids], row))
    lb = params.get("lb")
    if lb:
        idx = ops.ids([int(i) for i, _ in lb], row)
        row[idx] = row[idx] + ops.floats([float(b) for _, b in lb], row)
    return row
