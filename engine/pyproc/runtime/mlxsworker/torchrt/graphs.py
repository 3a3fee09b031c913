"""CUDA graphs for decode steps.

A decode step (every input one token) replays a graph captured for its
batch-size bucket (and, on the plain torch path, its context-length
bucket); the Python and kernel-launch cost of the whole forward pass
becomes one launch. The graph's inputs are the tokens, positions and
block-table rows; the block table itself (paged.py: every block group's
table, side by side in one tensor) is read in place, so blocks a
sequence takes or gives back between steps need no new graph. Rows past the
real batch use the scratch table row, whose blocks are all the scratch
block, so padding never touches a sequence's cache.

With the Triton kernels (decoder.Decoder.kern) the attention reads each
sequence's own length from the device, so one graph per batch bucket
covers every length, and a step's inputs can come from device tensors:
run_device chains steps without the host waiting for the GPU.

LoRA adapters (lora.py): a step with adapter rows replays a graph of its
own, captured with the delta (lora.Slots.device_plan: SegmentPlan where
its kernels run, else DensePlan) and a fourth input row,
each row's adapter slot (0: the base; padding rows too). Base-only steps
keep the graphs without it. Steps of prompt chunks with adapter rows
replay the prompt-step graphs captured with the delta (prefill.py).

Memory pools: the base graphs share one pool, the graphs with the delta
another; when the KV table grows every graph is dropped with its pools,
and later captures take new ones (a pool whose graphs are gone is never
captured into again: its blocks may still back a returned output). A
capture that fails (RuntimeError) marks its kind broken, logged once:
steps of that kind run eagerly from then on, never a worker error.
"""
import logging

import torch

from .upload import to_device

log = logging.getLogger("graphs")

BATCH_BUCKETS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256]
LEN_STEP = 256


class DecodeGraphs:
    def __init__(self, model, kv, max_batch, context):
        self.model, self.kv, self.context = model, kv, context
        self.max_batch = min(max_batch, BATCH_BUCKETS[-1])
        self.fast = model.kern is not None
        self.graphs = {}
        self.pools = {}  # "base" / "lora": the memory pool of that kind's graphs (see the module comment)
        self.broken = False
        self.lora = None  # lora.Slots when the model serves adapters
        self.lora_broken = False  # capture with the delta failed: adapter steps run eagerly

    def bucket(self, b, maxlen):
        bb = next(x for x in BATCH_BUCKETS if x >= b)
        if self.fast:
            return bb, self.context
        lb = min(self.context, -(-maxlen // LEN_STEP) * LEN_STEP)
        return bb, lb

    def usable(self, b):
        """Whether a base step of b rows can replay a graph. With the
        Triton kernels (one graph per batch bucket) the bucket's graph is
        captured now if it was not, so a failed capture is known here
        (and the step runs eagerly) before any caller relies on it."""
        if self.broken or b > self.max_batch:
            return False
        if self.fast:
            try:
                self._graph(b, 1)
            except RuntimeError:  # logged and marked broken by _graph
                return False
        return True

    def _graph(self, b, maxlen, lora=False):
        if self.kv.table_grown:  # captured graphs read the old table
            self.graphs.clear()
            self.pools.clear()  # never capture again into a pool whose graphs were dropped
            self.kv.table_grown = False
        key = self.bucket(b, maxlen) + (("lora",) if lora else ())
        g = self.graphs.get(key)
        if g is None:
            if self.lora_broken if lora else self.broken:
                raise RuntimeError("CUDA graphs%s failed to capture here before" % (" with LoRA" if lora else ""))
            try:
                g = self.capture(*key)
            except RuntimeError as e:
                self.fail(lora, e)
                raise
        return g

    def fail(self, lora, e):
        """Marks graphs of a kind broken after a capture or replay failed:
        steps of that kind run eagerly from now on."""
        if lora:
            self.lora_broken = True
            log.warning("CUDA graph with LoRA failed; adapter steps run eagerly: %s", e, exc_info=True)
        else:
            self.broken = True
            log.warning("CUDA graph failed; steps run eagerly: %s", e, exc_info=True)

    def lora_usable(self, b, maxlen=1):
        """Whether a step of b rows with adapters can replay a graph: an
        adapter is loaded and the bucket's graph is captured (now, if it
        was not; a failed capture sends adapter steps to the eager path
        from then on)."""
        if self.lora is None or self.lora.A is None or self.lora_broken or not self.usable(b):
            return False
        try:
            self._graph(b, maxlen, lora=True)
            return True
        except RuntimeError:  # logged and marked broken by _graph
            return False

    def run(self, tokens, pos, rows, slots=None):
        """tokens, pos, rows (block-table rows): python lists of one entry
        per sequence; slots (lora.py: each row's device slot), None for a
        step without adapters. Returns logits [len(tokens), vocab]
        (float32)."""
        b = len(tokens)
        g = self._graph(b, max(pos) + 1, slots is not None)
        pad = g["io"].shape[1] - b
        ins = [tokens + [0] * pad, pos + [0] * pad, rows + [0] * pad] + ([slots + [0] * pad] if slots is not None else [])
        g["io"].copy_(to_device(ins, g["io"].device))
        g["live"] = b
        g["graph"].replay()
        return g["out"][:b]

    def run_device(self, tokens, pos_rows, slots=None):
        """Like run, with every input already on the device: tokens [b],
        pos_rows [2, b], slots [b] or None (int64). Nothing waits for the
        GPU. Needs the Triton path (self.fast). The returned logits live
        in the graph's buffer until its next replay. Where the graph does
        not capture (a chain's later step, after the table grew) the step
        runs eagerly on the same inputs."""
        b = tokens.shape[0]
        try:
            g = self._graph(b, 1, slots is not None)
        except RuntimeError:  # logged, and the kind marked broken, by _graph
            self.model.lora = self.lora.device_plan(slots) if slots is not None else None
            try:
                return self.model.forward_decode(tokens, pos_rows[0], pos_rows[1], self.kv)
            finally:
                self.model.lora = None
        io = g["io"]
        if g["live"] > b:
            # Rows a larger batch left: back to the scratch row, or the
            # replay writes KV into the blocks of sequences freed since.
            io[:, b : g["live"]].zero_()
        g["live"] = b
        io[0, :b].copy_(tokens)
        io[1:3, :b].copy_(pos_rows)
        if slots is not None:
            io[3, :b].copy_(slots)
        g["graph"].replay()
        return g["out"][:b]

    def capture(self, bb, lb, lora=None):
        dev = self.model.device
        # tokens, positions, table rows (0: scratch), and with lora each row's adapter slot (0: the base)
        io = torch.zeros(4 if lora else 3, bb, dtype=torch.long, device=dev)
        rows = torch.arange(bb, device=dev)
        kv = self.kv

        def step():
            if lora:
                self.model.lora = self.lora.device_plan(io[3])
            try:
                return forward()
            finally:
                self.model.lora = None

        def forward():
            tok, pos, trows = io[0], io[1], io[2]
            if self.fast:
                return self.model.forward_decode(tok, pos, trows, kv)
            bs = kv.bs
            kvrow = [t[trows, pos // bs].long() * bs + pos % bs for t in kv.tables]
            groups = [("decode", rows, trows, lb, pos + 1)]
            return self.model.forward(tok, pos, kvrow, groups, kv, rows)

        graph, out = self._record(step, "lora" if lora else "base")
        # Tensors the graph reads must outlive it: rows too, not just io.
        # live: the rows of io the last replay was given (those past it are zero).
        g = {"graph": graph, "io": io, "rows": rows, "out": out, "live": 0}
        self.graphs[(bb, lb) + (("lora",) if lora else ())] = g
        return g

    def _record(self, step, kind):
        """(graph, output) of step captured into the pool of kind (made
        now if it has none); step runs twice eagerly first. The seam the
        CPU tests replace (testdata/lora_graphs_test.py), as are
        new_pool and record."""
        pool = self.pools.get(kind)
        if pool is None:
            pool = self.pools[kind] = new_pool()
        return record(step, pool)


def new_pool():
    """A fresh CUDA graph memory pool handle (a seam the CPU tests replace)."""
    return torch.cuda.graph_pool_handle()


def record(step, pool, warmup=2):
    """(torch.cuda.CUDAGraph, output) of step captured into pool, after
    warmup eager runs on a side stream. A capture that fails raises its
    RuntimeError and leaves the caller's stream current (torch.cuda.graph
    leaves its capture stream current when ending the capture fails too),
    the graph dropped; each capture has a stream of its own, so a failed
    one's stream is never used again."""
    cur = torch.cuda.current_stream()
    try:
        s = torch.cuda.Stream()
        s.wait_stream(cur)
        with torch.cuda.stream(s):
            for _ in range(warmup):
                step()
        cur.wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=torch.cuda.Stream()):
            out = step()
        return graph, out
    except RuntimeError:
        torch.cuda.set_stream(cur)
        raise
