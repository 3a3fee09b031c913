"""What both backends keep of an open sequence for sampling, and the
prefix comparison their prefix reuse runs on."""


class SeqState:
    """An open sequence: the tokens it was fed, whether it has sampled,
    and how often it was fed each token since (its generated tokens, for
    presence and frequency penalties). Each backend adds its own state."""

    __slots__ = ("tokens", "sampled", "counts")

    def __init__(self, tokens):
        self.tokens, self.sampled, self.counts = tokens, False, {}

    def note_fed(self, toks):
        """Counts the tokens fed after the sequence's first sample: the
        generated ones, for presence and frequency penalties."""
        if self.sampled:
            counts = self.counts
            for t in toks:
                counts[t] = counts.get(t, 0) + 1


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
