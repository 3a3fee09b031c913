"""The backend interface the protocol loop (protocol.py) runs: a Backend
loads Models, a Model runs sequences. The torch backend (torchrt) and
the mlx_lm backend (mlxlm) implement it; what only some models do has a
default here that says so."""
import abc
import dataclasses
import typing

from .errors import INVALID, UNAVAILABLE, ProtocolError


@dataclasses.dataclass
class StepResult:
    """A step's reply, per sampling input in input order: the sampled
    tokens, their log-probabilities (0.0 where not asked) and top
    log-probabilities ([] where not asked, else [[id, logprob], ...]);
    with lookahead (PROTOCOL.md) the tokens decoded after each and their
    log-probabilities (None when nobody asked); embeddings: a pooled
    input's vector, encoded for the protocol (None for a generating
    input; the list None when no pooled input ended)."""

    tokens: list
    logprobs: list
    top: list
    more: typing.Optional[list] = None
    more_logprobs: typing.Optional[list] = None
    embeddings: typing.Optional[list] = None


@dataclasses.dataclass
class TensorParallel:
    """The worker's place in a tensor-parallel group, from its command
    line: size ranks, this one rank (0: the leader, which speaks the
    protocol); port and seed as the leader handed them to its followers
    (0 on the leader: it picks them); argv: the worker's arguments."""

    size: int
    rank: int
    port: int
    seed: int
    argv: list


class Model(abc.ABC):
    """One loaded checkpoint. PROTOCOL.md's ops on a model map to the
    methods of the same names."""

    pooling = False  # opens pooled sequences (embeddings: open's pool)

    @abc.abstractmethod
    def info(self):
        """The load reply's info object."""

    @abc.abstractmethod
    def open(self, seq, prompt, key, pool=None, adapter=None):
        """Opens sequence seq for prompt, reusing what is saved under key;
        pool: open a pooled sequence (pooling models only); adapter: the
        open request's LoRA adapter. Returns the tokens reused."""

    def seq_len(self, seq):
        """The tokens sequence seq holds (after open: those it reused);
        None when it is not open."""
        raise ProtocolError(INVALID, "this model takes no opening rows")

    @abc.abstractmethod
    def step(self, batch, last=frozenset()):
        """Runs batch ([seq, tokens, sample, params, n?, back?] per input);
        returns a StepResult. last: the sequences whose token this step
        samples is their last (the request's "last"): a backend that
        computes a step ahead leaves them out of it."""

    @abc.abstractmethod
    def free(self, seq, key, back=0):
        """Frees sequence seq, saving its KV under key (unless empty),
        after taking back its last back tokens."""

    @abc.abstractmethod
    def close(self):
        """Releases the model's memory."""

    @abc.abstractmethod
    def stats(self):
        """The stats reply's object for this model."""

    def drop(self, key):
        """Discards what is saved under key; an unknown key is a no-op."""

    def warm(self):
        """Warms the model up; returns the batch sizes warmed (none here)."""
        return []

    def load_adapter(self, adapter):
        """Makes the LoRA adapter the request names resident in its slot
        (adapter: the open request's "adapter" object) without opening a
        sequence."""
        raise ProtocolError(INVALID, "this model serves no LoRA adapters")

    def free_blocks(self):
        """The free KV blocks of a paged model; None: the model does not page."""
        return None

    def take_evicted(self):
        """The saved keys evicted since the last call."""
        return []


class Backend(abc.ABC):
    """A way to run models: its name in the handshake, what it can do and
    the versions it runs on. Made by the worker after the import of its
    modules succeeded."""

    name = ""

    def __init__(self, settings):
        self.settings = settings

    @abc.abstractmethod
    def capabilities(self):
        """The handshake's capabilities object."""

    @abc.abstractmethod
    def versions(self):
        """The handshake's versions object."""

    @abc.abstractmethod
    def load(self, path, opts):
        """The Model of the checkpoint at path; opts as in the load op."""

    def set_threads(self, n):
        """Sets the CPU threads the backend computes with (no-op here)."""

    def join(self, tp, make_worker):
        """Joins the tensor-parallel group tp describes. A follower runs
        the requests the leader forwards on its stdin (make_worker(out,
        heartbeat) handles them) and never returns; the leader returns a
        function that wraps the protocol loop's request handler. Only a
        backend that splits models has groups: here it is refused."""
        raise ProtocolError(UNAVAILABLE, "tensor parallel needs the torch backend, not %s" % self.name)
