"""Tensor parallelism for the torch backend, in the Megatron layout.

One worker spans N ranks, one per device. The supervisor starts rank 0
(worker.py --tp N), which speaks the protocol; rank 0 starts ranks 1..N-1
as its own children (worker.py --tp N --rank i) and writes every request
line it reads to their stdin before it handles the request, so every rank
runs the same ops in the same order and their collectives line up. The
followers send nothing back: every rank ends a step with the whole logits
(gathered) and the same random state, so each samples what rank 0 samples.

A rank's share of a model: the attention heads and KV heads H/N and K/N
(the paged KV pool holds only its heads), q, k, v, gate and up split by
output rows (column-parallel), o and down by input columns (row-parallel,
one all-reduce after each), lm_head by vocabulary rows (padded to a whole
share; the shards are gathered before sampling). Embeddings and norms are
whole on every rank. Each rank reads only its slice of each split tensor
(st.Checkpoint.part). LoRA adapters split the same way (lora.py): an
open that loads one reaches every rank as any request does, and each
rank reads its share into its slots (A whole and B by output rows for
the column-parallel projections, A by input columns and B whole for o
and down, whose partial deltas the all-reduce sums).

A rank that dies takes the group down: rank 0 watches its children and
exits (status 1) when one exits, so the supervisor restarts the worker; a
follower exits when its stdin closes or its parent changes (rank 0 died).
Collectives time out after the settings' tp_timeout seconds (default 300),
and a failure inside a step (where the ranks may no longer be in step)
exits rank 0 rather than answering with an error.

All-reduces on CUDA: a decode step's are small (a row-parallel output is
[batch, hidden]: 8 KB a token for an 8B model) and there are two a layer,
so their latency, not bandwidth, bounds a TP decode at low batch. Those of
up to OneShot.LIMIT bytes run as torch's one-shot all-reduce over
symmetric memory: each rank copies its partial output into a buffer every
peer can read over NVLink and sums all of them, one kernel with its own
barriers (7.4 us against NCCL's 12.8 us for 8 KB on 2 H200s, inside a
CUDA graph; vLLM's custom all-reduce is the same idea). Larger ones
(prompt steps) stay on NCCL. It is set up, and checked against NCCL, at
the first CUDA load; if any rank cannot use it (no peer access, an old
torch), every rank keeps NCCL (settings' tp_oneshot false: always).
Multicast (NVLS) is not used. Unlike NCCL's, its barrier has no timeout:
ranks that fell out of step hang in it rather than time out (ranks only
leave step through a bug: every rank runs the same requests in order).
"""
import datetime
import json
import logging
import os
import random
import socket
import subprocess
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

from ..errors import INVALID, OUT_OF_MEMORY, UNAVAILABLE, CheckpointError, ProtocolError

log = logging.getLogger("tp")

# Projections split by output rows (column-parallel) and by input columns
# (row-parallel), by the last two parts of the tensor's name.
ROWS = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias", "k_proj.bias", "v_proj.bias",
        "gate_proj.weight", "up_proj.weight"}
COLS = {"o_proj.weight", "down_proj.weight"}
# Errors every rank raises alike (the request's shape, the model's files,
# the pool's accounting): the others may leave the group out of step.
ALIKE = (ProtocolError, CheckpointError, KeyError, TypeError, ValueError)


class Group:
    """This process's place in the worker's group: rank and size, the
    default (gloo) process group, and the NCCL one made at the first CUDA
    load; settings: the worker's (tp_timeout, tp_graphs)."""

    def __init__(self, rank, size, settings):
        self.rank, self.size, self.settings = rank, size, settings
        self.nccl = None
        self.oneshot = None  # OneShot, made with the NCCL group where it works

    def timeout(self):
        return datetime.timedelta(seconds=self.settings.tp_timeout)

    def device(self, device):
        """The rank's device: cuda:rank for CUDA (of those the worker sees:
        CUDA_VISIBLE_DEVICES picks a replica's), else device."""
        if device.type != "cuda":
            return device
        if torch.cuda.device_count() < self.size:
            raise ProtocolError(UNAVAILABLE, "tensor parallel %d needs %d CUDA devices; torch sees %d"
                                % (self.size, self.size, torch.cuda.device_count()))
        return torch.device("cuda", self.rank)

    def process_group(self, device):
        """The process group for tensors on device: NCCL for CUDA (made
        by every rank at its first CUDA load, in step), gloo otherwise."""
        if device.type != "cuda":
            return None
        if self.nccl is None:
            self.nccl = dist.new_group(backend="nccl", timeout=self.timeout())
            # NCCL sets a communicator up at its first collective, which a
            # CUDA graph capture cannot do: that first one runs here.
            dist.all_reduce(torch.ones(1, device=device), group=self.nccl)
            if self.settings.tp_oneshot:
                self.oneshot = OneShot.make(self.nccl, device)
        return self.nccl

    def shard(self, cfg, device, opts):
        """This rank's Shard of a model being loaded (cfg becomes the
        rank's: its heads, KV heads and intermediate size)."""
        return Shard(self, cfg, device, opts)


class Shard:
    """One model's split over the group: checks the model splits,
    localizes its config, reads the rank's slices, and runs the
    collectives the decoder calls (reduce, gather_logits)."""

    def __init__(self, group, cfg, device, opts):
        n = group.size
        self.rank, self.size, self.vocab = group.rank, n, cfg.vocab
        refuse(cfg, opts, n)
        if not group.settings.tp_graphs:  # CUDA graphs off under tensor parallel only
            opts["cuda_graphs"] = False
        self.pg = group.process_group(device)
        self.oneshot = group.oneshot
        self.gpu = device.type == "cuda"
        cfg.heads, cfg.kv_heads, cfg.intermediate = cfg.heads // n, cfg.kv_heads // n, cfg.intermediate // n
        self.rows = -(-cfg.vocab // n)  # lm_head rows per rank, the last share padded
        self.sharded = set()  # ids of tensors the loader already cut

    def loader(self, ck, device, dtype):
        """A get(name, shape) for the decoder's loading: shape is the
        rank's (the config is localized); split tensors come as the
        rank's slice, read alone from the file, the rest whole."""
        def get(name, shape):
            leaf = ".".join(name.split(".")[-2:])
            if leaf in ROWS or leaf in COLS:
                dim = 0 if leaf in ROWS else 1
                full = list(shape)
                full[dim] *= self.size
                return ck.part(name, full, dim, self.rank * shape[dim], shape[dim], device, dtype)
            if name.endswith("lm_head.weight"):
                t = self._vocab_part(lambda a, n: ck.part(name, shape, 0, a, n, device, dtype), shape, device, dtype)
                self.sharded.add(id(t))
                return t
            return ck.get(name, shape, device, dtype)
        return get

    def _vocab_part(self, read, shape, device, dtype):
        a = min(self.rank * self.rows, self.vocab)
        n = min(self.rows, self.vocab - a)
        t = read(a, n) if n else torch.empty(0, shape[1], device=device, dtype=dtype)
        if n < self.rows:
            t = torch.cat([t, torch.zeros(self.rows - n, shape[1], device=device, dtype=dtype)])
        return t

    def vocab_rows(self, w):
        """The rank's rows of the output projection w (the whole
        embedding when tied: a view, padded with zero rows where the
        vocabulary does not divide)."""
        if id(w) in self.sharded:
            return w
        return self._vocab_part(lambda a, n: w.narrow(0, a, n), w.shape, w.device, w.dtype)

    def reduce(self, x):
        """The sum over ranks of x (a row-parallel projection's partial
        output), in place: small ones one-shot (OneShot), the rest NCCL.
        Every rank takes the same path, as x's size, dtype and layout
        (hence its alignment) come from the same code on every rank."""
        if self.oneshot is not None and self.oneshot.fits(x):
            return self.oneshot.all_reduce(x)
        dist.all_reduce(x, group=self.pg)
        return x

    def gather_logits(self, x):
        """[N, vocab] from every rank's [N, rows] shard of the logits."""
        if x.shape[0] == 0:  # a step that samples nothing (gloo fails on empty tensors); every rank skips it alike
            return x.new_empty(0, self.vocab)
        x = x.contiguous()
        if self.gpu:
            out = torch.empty(self.size * x.shape[0], x.shape[1], device=x.device, dtype=x.dtype)
            dist.all_gather_into_tensor(out, x, group=self.pg)  # rank-major: [ranks * N, rows]
            return out.view(self.size, x.shape[0], -1).permute(1, 0, 2).reshape(x.shape[0], -1)[:, : self.vocab]
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.pg)
        return torch.cat(parts, 1)[:, : self.vocab]

    def agree(self, blocks):
        """The fewest KV blocks any rank can hold: every rank's pool the
        same size, so their block accounting stays identical."""
        t = torch.tensor([blocks], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def info(self, d, model):
        """Marks the load reply's byte counts as this rank's (per device)."""
        d["tp"] = self.size
        d["weight_bytes"] = weight_bytes(model)
        return d


class OneShot:
    """One-shot all-reduce over symmetric memory (see the module doc): a
    LIMIT-byte buffer every rank of the group maps, viewed as the
    reduced tensor's dtype."""

    LIMIT = 1 << 20
    DTYPES = (torch.bfloat16, torch.float16, torch.float32)

    def __init__(self, pg, buf):
        self.name, self.buf = pg.group_name, buf
        self.dtypes = self.DTYPES  # those make found to work

    @classmethod
    def make(cls, pg, device):
        """A OneShot for pg with the dtypes whose one-shot sums equal
        NCCL's on every rank (torch 2.11 has no float16 one), or None
        where a rank could not make one or no dtype passes; every rank
        returns alike."""
        # Every rank runs the same collectives whatever fails where: the
        # rendezvous and a one-shot call each wait for all the peers.
        def agree(done, step):
            t = torch.tensor([done], device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=pg)
            if not int(t.item()) and done:
                log.warning("one-shot all-reduce unavailable (another rank failed to %s); NCCL serves every all-reduce", step)
            return bool(t.item())

        buf = None
        try:
            import torch.distributed._symmetric_memory as symm
            buf = symm.empty(cls.LIMIT, dtype=torch.uint8, device=device)
        except Exception as e:  # noqa: BLE001 - any failure keeps NCCL
            log.warning("one-shot all-reduce unavailable, NCCL serves every all-reduce: %s", e)
        if not agree(buf is not None, "allocate symmetric memory"):
            return None
        try:
            symm.rendezvous(buf, pg.group_name)
            me = cls(pg, buf)
        except Exception as e:  # noqa: BLE001
            log.warning("one-shot all-reduce unavailable, NCCL serves every all-reduce: %s", e)
            me = None
        if not agree(me is not None, "map the peers' memory"):
            return None
        ok = [0] * len(cls.DTYPES)
        for i, dt in enumerate(cls.DTYPES):
            # small integers: exact in every dtype, whatever the order of the sum
            x = (torch.arange(1000, device=device) % 8).mul_(dist.get_rank(pg) + 1).to(dt)
            want = x.clone()
            dist.all_reduce(want, group=pg)
            try:  # a dtype torch has no kernel for raises alike on every rank, before any launch
                ok[i] = int(torch.equal(me.all_reduce(x), want))
            except Exception as e:  # noqa: BLE001 - that dtype stays on NCCL
                log.info("one-shot all-reduce of %s unavailable: %s", dt, e)
        agreed = torch.tensor(ok, device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=pg)
        dtypes = tuple(dt for dt, a in zip(cls.DTYPES, agreed.tolist()) if a)
        if not dtypes:
            return None
        me.dtypes = dtypes
        log.info("one-shot all-reduce over peer memory for up to %d bytes of %s", cls.LIMIT, ", ".join(map(str, dtypes)))
        return me

    def fits(self, x):
        return (x.dtype in self.dtypes and x.is_contiguous() and x.numel() * x.element_size() <= self.LIMIT
                and x.data_ptr() % 16 == 0)  # the kernel's vector stores into x

    def all_reduce(self, x):
        n = x.numel()
        b = self.buf.view(x.dtype)[:n]
        b.copy_(x.view(-1))
        torch.ops.symm_mem.one_shot_all_reduce_out(b, "sum", self.name, x.view(-1))
        return x


def refuse(cfg, opts, n):
    """Raises ProtocolError(INVALID) when the model cannot split n ways."""
    fam = cfg.family
    why = None
    if cfg.experts:
        why = "its mixture-of-experts layers do not split (%d experts)" % cfg.experts
    elif fam.attn == "fused" or fam.mlp == "fused":
        why = "its fused projections (qkv_proj, gate_up_proj) do not split"
    elif fam.qk_norm == "whole":
        why = "its QK norm over the whole projection spans every head"
    elif cfg.quant is not None or opts.get("quantize"):
        why = "quantized weights do not split"
    else:
        for name, v in (("number of attention heads", cfg.heads), ("number of KV heads", cfg.kv_heads),
                        ("intermediate size", cfg.intermediate)):
            if v % n:
                why = "the %s (%d) is not a multiple of %d" % (name, v, n)
                break
    if why:
        raise ProtocolError(INVALID, "tensor parallel %d: %s; serve this model with tensor parallel 1" % (n, why))


def weight_bytes(model):
    """Bytes of the model's weights on this rank, each storage once (a
    tied lm_head's rows are a view of the embedding)."""
    ts = [model.embed, model.norm, model.lm_head] + [t for layer in model.layers for t in layer.values()]
    seen = {}
    for t in ts:
        s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        seen[(t.device, s.data_ptr())] = s.nbytes()
    return sum(seen.values())


# -- the group's processes -----------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(rank, size, port, seed, settings):
    """Joins the group of size ranks as rank (its gloo process group at
    127.0.0.1:port); seeds Python's random number generator with seed, so
    unseeded draws come out alike on every rank."""
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=settings.tp_timeout))
    random.seed(seed)
    if torch.cuda.is_available() and torch.cuda.device_count() > rank:
        torch.cuda.set_device(rank)
    return Group(rank, size, settings)


def _copy(f):
    """Copies a follower's output lines to rank 0's stderr."""
    for line in f:
        sys.stderr.buffer.write(line)
        sys.stderr.flush()


class Leader:
    """Rank 0's side: starts the followers, joins the group, forwards each
    request to them and takes the group down when one dies. argv: the
    worker's command line, which the followers get with their rank, the
    group's port and its seed. NCCL's asynchronous error handling (a
    collective past the timeout aborts the process, so the group goes
    down rather than hangs) is the environment's
    (TORCH_NCCL_ASYNC_ERROR_HANDLING=1), which the supervisor sets for
    rank 0 and the followers inherit."""

    def __init__(self, argv, size, settings):
        port, seed = _free_port(), random.getrandbits(62)
        self.children = []
        for r in range(1, size):
            cmd = [sys.executable, "-u", "-B"] + argv + ["--rank", str(r), "--tp-port", str(port), "--tp-seed", str(seed)]
            # A follower's output comes through rank 0 (_copy): the
            # supervisor's pipes are held by rank 0 alone, so they close
            # when it exits, whatever state a follower is in.
            c = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            threading.Thread(target=_copy, args=(c.stdout,), daemon=True).start()
            self.children.append(c)
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()
        self.group = _join(0, size, port, seed, settings)

    def down(self, why, *args):
        """Takes the group down: logs why, kills the followers (one may be
        stuck) and exits with status 1."""
        log.error(why + "; the tensor-parallel group goes down", *args)
        for c in self.children:
            c.kill()
        os._exit(1)

    def _watch(self):
        while True:
            time.sleep(0.1)
            for r, c in enumerate(self.children, 1):
                if c.poll() is not None:
                    self.down("rank %d exited with status %s", r, c.returncode)

    def forward(self, req):
        """Writes req to every follower (before rank 0 runs it)."""
        line = json.dumps(req, separators=(",", ":")).encode() + b"\n"
        with self.lock:
            for c in self.children:
                try:
                    c.stdin.write(line)
                    c.stdin.flush()
                except (BrokenPipeError, OSError):
                    self.down("a follower rank is gone")

    def guard(self, handle):
        """handle, with the request forwarded first; a failure the other
        ranks need not share (not in ALIKE: an error inside a step's
        collectives, a device out of memory) takes the group down."""
        def run(req):
            self.forward(req)
            try:
                return handle(req)
            except ALIKE:
                if req.get("op") == "load":  # the followers may have loaded it: they drop it too
                    self.forward({"op": "unload", "model": req.get("model")})
                raise
            except Exception:
                self.down("rank 0 failed inside op %r: %s", req.get("op"), traceback.format_exc().replace("\n", " | "))
        return run


def follow(rank, size, port, seed, settings, make_worker):
    """A follower's life: join the group (port and seed as rank 0 handed
    them out), then run every request rank 0 forwards on stdin, replying
    to no one, until stdin closes or rank 0 goes away. make_worker(group)
    makes the protocol.Worker whose handle runs them. A failure rank 0 may
    not share exits (status 1)."""
    ppid = os.getppid()

    def orphaned():  # rank 0 died while this rank waits in a collective, not on stdin
        while True:
            time.sleep(0.2)
            if os.getppid() != ppid:
                os._exit(0)
    threading.Thread(target=orphaned, daemon=True).start()
    worker = make_worker(_join(rank, size, port, seed, settings))
    for line in sys.stdin.buffer:
        req = json.loads(line)
        op = req.get("op")
        if op == "shutdown":
            break
        if op in ("fault", "trace"):  # the test hook and the device trace act on rank 0 only
            continue
        try:
            worker.handle(req)
        except ALIKE as e:
            if op == "load" and getattr(e, "code", None) == OUT_OF_MEMORY:  # rank 0 may have loaded: not in step
                log.exception("rank %d failed to load", rank)
                os._exit(1)
        except Exception:
            log.exception("rank %d failed inside op %r; the tensor-parallel group goes down", rank, op)
            os._exit(1)
    os._exit(0)
