"""The protocol loop (PROTOCOL.md): the worker's stdout, its heartbeat,
and the requests read from stdin, each run on the backend's models and
answered with one reply line.
"""
import gc
import json
import logging
import operator
import os
import sys
import threading
import time
import traceback

from .errors import (CHECKPOINT, INTERNAL, INVALID, MODEL_NOT_FOUND, NOT_RUN, OUT_OF_MEMORY, TOO_LARGE,
                     CheckpointError, ProtocolError)
from .timing import StepTiming
from .trace import DEFAULT_STEPS, StepTrace, TraceError

# What a handler returns for a request it answers later itself (trace).
DEFERRED = object()

log = logging.getLogger("worker")


class Out:
    """The protocol's stdout: whole lines under a lock, so heartbeats and
    replies never interleave. Python's own stdout is pointed at stderr so
    a stray print cannot corrupt the protocol."""

    def __init__(self):
        self.f = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self.lock = threading.Lock()

    def send(self, obj):
        self.raw(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def raw(self, data):
        with self.lock:
            self.f.write(data)  # a buffered writer writes it all, however long
            self.f.flush()


class Heartbeat(threading.Thread):
    """Sends a heartbeat every interval and exits the process when its
    parent goes away (the parent id changes); each beat also ends the
    step-cycle window of a worker gone idle (timing.StepTiming.idle)."""

    def __init__(self, out, interval, timing=None):
        super().__init__(daemon=True)
        self.out, self.interval, self.timing = out, interval, timing
        self.ppid = os.getppid()
        self.stopped = False

    def run(self):
        while True:
            time.sleep(self.interval)
            if os.getppid() != self.ppid:
                log.warning("parent %d is gone; exiting", self.ppid)
                os._exit(0)
            if not self.stopped:
                self.out.send({"type": "hb"})
            if self.timing is not None:
                self.timing.idle(time.perf_counter())


class Worker:
    """Runs requests on the backend's models (handle) and answers them
    (reply).

    Pipelined steps (PROTOCOL.md, "Pipelined steps"): per model, unfed
    maps each sequence to the last token the worker sampled for it and has
    not fed, which a step row with tokens null feeds; last_step is the id
    of the last step request handled and whether it succeeded, which a
    step's "after" must name. Both live here, not in the backend, so every
    backend pipelines, and under tensor parallel every rank (which runs
    handle, not reply) keeps the same. A step's "opening" rows are cut to
    the tokens past those their sequences hold here too (skip_reused)."""

    def __init__(self, out, hb, backend, faults):
        self.out, self.hb, self.backend, self.faults = out, hb, backend, faults
        self.models = {}
        self.unfed = {}
        self.last_step = {}
        self.step_delay = 0.0
        self.tracer = StepTrace(out)

    def model(self, req):
        m = self.models.get(req.get("model"))
        if m is None:
            raise ProtocolError(MODEL_NOT_FOUND, "model %r is not loaded" % req.get("model"))
        return m

    def handle(self, req):
        op = req.get("op")
        run = self.OPS.get(op)
        if run is None or (op == "fault" and not self.faults):
            raise ProtocolError(INVALID, "unknown op %r" % op)
        return run(self, req)

    def step(self, req):
        if self.step_delay:
            time.sleep(self.step_delay)
        m = self.model(req)
        name, ok = req["model"], False
        try:
            after = req.get("after")
            if after is not None and self.last_step.get(name) != (after, True):
                raise ProtocolError(NOT_RUN, "step not run: it was sent behind step %s, which failed or was not the last" % after)
            unfed = self.unfed.setdefault(name, {})
            batch = resolve(unfed, req["batch"])
            failed = ()
            if req.get("opening"):
                batch, failed = skip_reused(m, batch, req["opening"])
            res = m.step(batch, last=last_rows(req))
            note_sampled(unfed, batch, res)
            if failed:
                pad_failed_opens(res, failed)
            ok = True
        finally:
            self.last_step[name] = (req.get("id"), ok)
        r = {"tokens": res.tokens}
        if any(res.logprobs):
            r["logprobs"] = res.logprobs
        if any(res.top):
            r["top"] = res.top
        if res.more is not None:  # lookahead: the tokens decoded after these
            r["more"] = res.more
            if res.more_logprobs is not None:
                r["more_logprobs"] = res.more_logprobs
        if res.embeddings and any(e is not None for e in res.embeddings):
            r["embeddings"] = res.embeddings
        return self.pool(m, r)

    def open(self, req):
        m = self.model(req)
        pool, adapter = req.get("pool"), req.get("adapter")
        if adapter is not None:  # a LoRA adapter's sequence (the supervisor sends one only where "adapters" is listed)
            pool = None
        elif pool is not None and not m.pooling:
            raise ProtocolError(INVALID, "this model does not embed (pooled sequences need the torch backend)")
        self.unfed.get(req["model"], {}).pop(req["seq"], None)
        return self.pool(m, {"reused": m.open(req["seq"], req["prompt"], req.get("key", ""), pool=pool, adapter=adapter)})

    def adapter(self, req):
        self.model(req).load_adapter(req["adapter"])
        return {}

    def drop(self, req):
        m = self.models.get(req.get("model"))
        if m is not None:
            m.drop(req.get("key", ""))
        return {}

    def free(self, req):
        m = self.models.get(req.get("model"))
        if m is None:
            return {}
        m.free(req["seq"], req.get("key", ""), int(req.get("back") or 0))
        self.unfed.get(req["model"], {}).pop(req["seq"], None)
        return self.pool(m, {})

    def load(self, req):
        name = req["model"]
        if name in self.models:
            self.models.pop(name).close()
        self.unfed.pop(name, None)
        self.last_step.pop(name, None)
        m = self.backend.load(req["path"], req.get("opts") or {})
        self.models[name] = m
        quiet_gc()
        return {"info": m.info()}

    def unload(self, req):
        m = self.models.pop(req.get("model"), None)
        self.unfed.pop(req.get("model"), None)
        self.last_step.pop(req.get("model"), None)
        if m is not None:
            m.close()
            del m
            quiet_gc()  # the unloaded model's cycles were frozen: collected now, before another load wants the memory
        return {}

    def warm(self, req):
        return {"batch_sizes": self.model(req).warm()}

    def stats(self, req):
        return {"models": {k: m.stats() for k, m in self.models.items()}}

    def trace(self, req):
        """Arms a device trace of the next "steps" steps past "skip" into
        "dir" (trace.py), answered once it is written with its "file" and
        "summary"; "stop": true ends the armed trace now if it is the one
        the trace request of id "trace" armed (that request is answered
        with what it recorded), and is answered at once."""
        if req.get("stop"):
            if self.tracer.armed and self.tracer.rid is not None and self.tracer.rid == req.get("trace"):
                self.tracer.finish()
            return {}
        d, steps, skip = req.get("dir"), req.get("steps", DEFAULT_STEPS), req.get("skip", 0)
        if not isinstance(d, str) or not d:
            raise ProtocolError(INVALID, "trace: dir: want a directory, got %r" % (d,))
        for k, v in (("steps", steps), ("skip", skip)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise ProtocolError(INVALID, "trace: %s: want an integer, got %r" % (k, v))
        try:
            self.tracer.arm(d, skip, steps, rid=req["id"])
        except TraceError as e:
            raise ProtocolError(e.code, str(e))
        return DEFERRED

    @staticmethod
    def pool(m, r):
        """Adds the model's free KV blocks and the saved keys it evicted
        since the last reply to r."""
        free = m.free_blocks()
        if free is not None:
            r["free_blocks"] = free
        evicted = m.take_evicted()
        if evicted:
            r["evicted"] = evicted
        return r

    def fault(self, req):
        kind = req.get("kind")
        if kind == "exit":
            os._exit(7)
        if kind == "garbage":
            self.out.raw(b"this is not JSON\n")
        elif kind == "longline":
            self.out.raw(b"{" + b" " * int(req.get("bytes", 1 << 20)))
        elif kind == "stop_heartbeat":
            self.hb.stopped = True
        elif kind == "hang":
            self.hb.stopped = True
            time.sleep(3600)
        elif kind == "spin":  # busy and silent: the heartbeat starved, as by work holding the GIL
            self.hb.stopped = True
            end = time.time() + float(req.get("seconds", 1))
            while time.time() < end:
                pass
            self.hb.stopped = False
        elif kind == "step_delay":
            self.step_delay = float(req.get("seconds", 0))
        return {}

    def reply(self, rid, fn, req):
        try:
            r = fn(req)
            if r is DEFERRED:
                return
            r["id"] = rid
            r["ok"] = True
            self.out.send(r)
        except Exception as e:  # every failure becomes a coded reply
            self.out.send({"id": rid, "ok": False, "error": self.describe(e)})

    def describe(self, e):
        if isinstance(e, CheckpointError):
            return {"code": CHECKPOINT, "message": str(e), "path": e.path, "tensor": e.tensor, "reason": e.reason}
        if isinstance(e, ProtocolError):
            d = {"code": e.code, "message": str(e)}
            d.update(e.extra)
            return d
        if isinstance(e, (KeyError, TypeError, ValueError)):
            return {"code": INVALID, "message": "%s: %s" % (type(e).__name__, e)}
        msg = str(e)
        if isinstance(e, MemoryError) or "out of memory" in msg.lower():
            return {"code": OUT_OF_MEMORY, "message": msg}
        log.error("internal error: %s", traceback.format_exc())
        return {"code": INTERNAL, "message": "%s: %s" % (type(e).__name__, msg)}


def quiet_gc():
    """Keeps the cyclic garbage collector off the steps' path, called once
    a model is loaded: what is alive then (the models, torch's and the
    worker's own objects, which live until an unload) goes in the
    collector's permanent generation, which its passes do not walk, and
    the youngest generation is collected every 5,000 allocations rather
    than 700. A step of 220 rows allocates thousands of lists, tuples and
    dicts (the request's rows, their params, the speculation's records):
    at the default threshold that ran several collections a step and,
    every hundred or so, a full pass over the heap, which put 0.3 ms on a
    220-row decode step's mean host time in host_step_bench.py. An unload
    calls it too, so the unloaded model's frozen cycles are collected
    then (unfreeze first), not left holding memory until the next load."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    _, g1, g2 = gc.get_threshold()
    gc.set_threshold(5000, g1, g2)


def resolve(unfed, batch):
    """Gives each row of batch whose tokens are null the token unfed holds
    for its sequence, in place, so the backend sees exactly the row a step
    that fed it explicitly would have sent (its penalties, seeded draws
    and speculated step alike). A null row without a token to feed, or
    one that does not sample or takes tokens back, is invalid_value, and
    unfed is left as it was."""
    for row in batch:
        if row[1] is not None:
            continue
        tok = unfed.get(row[0])
        if tok is None:
            raise ProtocolError(INVALID, "sequence %s: tokens null, and it has no sampled token left to feed" % row[0])
        if not row[2] or (len(row) > 5 and row[5]):
            raise ProtocolError(INVALID, "sequence %s: a row with tokens null samples and takes nothing back" % row[0])
        row[1] = [tok]
    return batch


def last_rows(req):
    """The sequences a step request lists in "last" (those whose token in
    it is their last: none is stepped again), as a set; invalid_value
    for anything but a list of sequence ids."""
    last = req.get("last")
    if last is None:
        return frozenset()
    if not isinstance(last, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in last):
        raise ProtocolError(INVALID, "last: want a list of sequence ids, got %r" % (last,))
    return frozenset(last)


def skip_reused(m, batch, opening):
    """Returns batch with the rows of the sequences listed in opening (a
    sequence's first prompt chunk, from its first token, sent before its
    open was answered) cut to the tokens past those the sequence holds
    (what its open reused), and a row left empty dropped: it feeds
    nothing, and only a row that samples has an output. A row left empty
    that samples, and an opening row with tokens null, are invalid_value,
    and nothing is run. The backend then sees the rows a step that fed
    prompt[reused:] would have sent.

    A listed sequence that is not open had its open fail (the supervisor
    sent the row before it read that answer): its row is dropped and the
    rest of the step runs; the second value lists the output places of
    such rows that sample, which pad_failed_opens fills with -1."""
    opening = set(opening)
    out, failed, k = [], [], 0
    for row in batch:
        if row[2]:
            k += 1
        if row[0] not in opening:
            out.append(row)
            continue
        held = m.seq_len(row[0])
        if held is None:
            if row[2]:
                failed.append(k - 1)
            continue
        if row[1] is None:
            raise ProtocolError(INVALID, "sequence %s: an opening row carries its tokens" % row[0])
        row[1] = row[1][min(held, len(row[1])):]
        if row[1]:
            out.append(row)
        elif row[2]:
            raise ProtocolError(INVALID, "sequence %s: its opening row feeds nothing past the %d tokens its open reused, "
                                "and samples" % (row[0], held))
    return out, failed


def pad_failed_opens(res, failed):
    """Puts a token -1 output (no log-probabilities, nothing ahead) at each
    of the output places in failed, in increasing order: the rows of
    sequences whose open failed, which skip_reused dropped."""
    for k in failed:
        res.tokens.insert(k, -1)
        res.logprobs.insert(k, 0.0)
        res.top.insert(k, [])
        if res.more is not None:
            res.more.insert(k, [])
        if res.more_logprobs is not None:
            res.more_logprobs.insert(k, [])
        if res.embeddings is not None:
            res.embeddings.insert(k, None)


_seq = operator.itemgetter(0)  # of a batch row


def note_sampled(unfed, batch, res):
    """Records, after a step, the last token each sampling row sampled and
    did not feed: the step's token, or the last one a lookahead chain
    decoded after it (the chain feeds every token but the last). Rows that
    fed tokens without sampling, and pooled rows (token -1), leave none."""
    tokens, more, k = res.tokens, res.more, 0
    if more is None and len(tokens) == len(batch) and (not tokens or min(tokens) >= 0):
        # Every row sampled a token of its own (a decode step's 220): recorded in C.
        unfed.update(zip(map(_seq, batch), tokens))
        return
    drop = unfed.pop
    for row in batch:
        if not row[2]:
            drop(row[0], None)
            continue
        tok = tokens[k]
        if more is not None and more[k]:
            tok = more[k][-1]
        k += 1
        if tok < 0:
            drop(row[0], None)
        else:
            unfed[row[0]] = tok


Worker.OPS = {"step": Worker.step, "open": Worker.open, "drop": Worker.drop, "free": Worker.free, "load": Worker.load,
              "unload": Worker.unload, "warm": Worker.warm, "adapter": Worker.adapter, "stats": Worker.stats, "fault": Worker.fault,
              "trace": Worker.trace}


def serve(inp, out, worker, max_line, timing=None):
    """The protocol loop: reads requests from inp until it closes or a
    shutdown comes, each handled by worker. timing: the step cycle's
    sums (timing.StepTiming). While worker.tracer is armed, the loop's
    phases are annotated for it (trace.py)."""
    timing = timing or StepTiming()
    tracer = worker.tracer
    while True:
        if not tracer.armed:
            line = inp.readline(max_line + 1)
        else:
            with tracer.waiting():
                line = inp.readline(max_line + 1)
        read = time.perf_counter()
        if not line:
            log.info("stdin closed; exiting")
            return
        if len(line) > max_line:
            while line and not line.endswith(b"\n"):
                line = inp.readline(1 << 20)
            out.send({"id": 0, "ok": False, "error": {"code": TOO_LARGE, "message": "request line exceeds %d bytes" % max_line}})
            continue
        try:
            req = json.loads(line)
            rid = req["id"]
        except (ValueError, KeyError, TypeError) as e:
            out.send({"id": 0, "ok": False, "error": {"code": INVALID, "message": "unreadable request: %s" % e}})
            continue
        if req.get("op") == "shutdown":
            out.send({"id": rid, "ok": True})
            return
        if not tracer.armed:
            worker.reply(rid, worker.handle, req)
        else:
            with tracer.request(req.get("op")):
                worker.reply(rid, worker.handle, req)
        if req.get("op") == "step":
            timing.step(read, time.perf_counter())
            if tracer.due:  # written after the step's timing, which it is not part of
                tracer.finish()
