"""mlxserving worker: runs models for the Go supervisor over stdio.

One JSON object per line on stdin (requests) and stdout (replies,
heartbeats); logs go to stderr. See PROTOCOL.md beside the Go code.
"""
import argparse
import json
import logging
import os
import sys
import threading
import time
import traceback

from errors import CheckpointError, ProtocolError

PROTOCOL = 1
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
    parent goes away (the parent id changes)."""

    def __init__(self, out, interval):
        super().__init__(daemon=True)
        self.out, self.interval = out, interval
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


class OneLine(logging.Formatter):
    """Keeps a record, traceback included, on one stderr line so the
    supervisor logs it as one event at the record's level."""

    def format(self, record):
        return super().format(record).replace("\n", " | ")


def import_backend(name):
    """Returns (backend name, module, versions) or raises ImportError with
    what to install."""
    if name in ("mlx", "auto"):
        try:
            import mlx_backend
            return "mlx", mlx_backend, mlx_backend.versions()
        except ImportError as e:
            if name == "mlx":
                raise ImportError("the mlx backend needs the mlx and mlx-lm Python packages (pip install mlx-lm): %s" % e)
    try:
        import torch_backend
        import torch
    except ImportError as e:
        raise ImportError("the torch backend needs PyTorch and NumPy (Debian: apt-get install python3-torch python3-numpy; "
                          "elsewhere: pip install torch numpy): %s" % e)
    return "torch", torch_backend, {"torch": torch.__version__, "cuda": bool(torch.cuda.is_available())}


class Worker:
    def __init__(self, out, hb, backend, faults):
        self.out, self.hb, self.backend, self.faults = out, hb, backend, faults
        self.models = {}
        self.step_delay = 0.0

    def model(self, req):
        m = self.models.get(req.get("model"))
        if m is None:
            raise ProtocolError("unknown_model", "model %r is not loaded" % req.get("model"))
        return m

    def handle(self, req):
        op = req.get("op")
        if op == "step":
            if self.step_delay:
                time.sleep(self.step_delay)
            res = self.model(req).step(req["batch"])
            r = {"tokens": res[0]}
            if any(res[1]):
                r["logprobs"] = res[1]
            if len(res) > 2 and any(res[2]):
                r["top"] = res[2]
            if len(res) > 3:  # lookahead: the tokens decoded after these
                r["more"] = res[3]
                if res[4] is not None:
                    r["more_logprobs"] = res[4]
            m = self.model(req)
            emb = m.take_embeddings() if hasattr(m, "take_embeddings") else None
            if emb and any(e is not None for e in emb):
                from pooling import encode  # torch's: only a torch model pools
                r["embeddings"] = [None if e is None else encode(e) for e in emb]
            return self.pool(m, r)
        if op == "open":
            m = self.model(req)
            pool = req.get("pool")
            if req.get("adapter") is not None:  # a LoRA adapter's sequence (torch only: the supervisor checks)
                return self.pool(m, {"reused": m.open(req["seq"], req["prompt"], req.get("key", ""), adapter=req["adapter"])})
            if pool is None:
                return self.pool(m, {"reused": m.open(req["seq"], req["prompt"], req.get("key", ""))})
            if not hasattr(m, "take_embeddings"):
                raise ProtocolError("invalid", "this model does not embed (pooled sequences need the torch backend)")
            return self.pool(m, {"reused": m.open(req["seq"], req["prompt"], "", pool)})
        if op == "drop":
            m = self.models.get(req.get("model"))
            if m is not None and hasattr(m, "drop"):
                m.drop(req.get("key", ""))
            return {}
        if op == "free":
            m = self.models.get(req.get("model"))
            if m is None:
                return {}
            m.free(req["seq"], req.get("key", ""), *([int(req["back"])] if req.get("back") else []))
            return self.pool(m, {})
        if op == "load":
            name = req["model"]
            if name in self.models:
                self.models.pop(name).close()
            m = self.backend.load(req["path"], req.get("opts") or {})
            self.models[name] = m
            return {"info": m.info()}
        if op == "unload":
            m = self.models.pop(req.get("model"), None)
            if m is not None:
                m.close()
            return {}
        if op == "warm":
            warm = getattr(self.model(req), "warm", None)
            return {"batch_sizes": warm() if warm else []}
        if op == "stats":
            return {"models": {k: m.stats() for k, m in self.models.items()}}
        if op == "fault" and self.faults:
            return self.fault(req)
        raise ProtocolError("bad_request", "unknown op %r" % op)

    @staticmethod
    def pool(m, r):
        """Adds the model's free KV blocks and the saved keys it evicted
        since the last reply to r."""
        if hasattr(m, "free_blocks"):
            r["free_blocks"] = m.free_blocks()
        evicted = m.take_evicted() if hasattr(m, "take_evicted") else []
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
            r["id"] = rid
            r["ok"] = True
            self.out.send(r)
        except Exception as e:  # every failure becomes a coded reply
            self.out.send({"id": rid, "ok": False, "error": self.describe(e)})

    def describe(self, e):
        if isinstance(e, CheckpointError):
            return {"code": "bad_checkpoint", "message": str(e), "path": e.path, "tensor": e.tensor, "reason": e.reason}
        if isinstance(e, ProtocolError):
            d = {"code": e.code, "message": str(e)}
            d.update(e.extra)
            return d
        if isinstance(e, (KeyError, TypeError, ValueError)):
            return {"code": "bad_request", "message": "%s: %s" % (type(e).__name__, e)}
        msg = str(e)
        if isinstance(e, MemoryError) or "out of memory" in msg.lower():
            return {"code": "oom", "message": msg}
        log.error("internal error: %s", traceback.format_exc())
        return {"code": "internal", "message": "%s: %s" % (type(e).__name__, msg)}


def serve(inp, out, worker, max_line):
    while True:
        line = inp.readline(max_line + 1)
        if not line:
            log.info("stdin closed; exiting")
            return
        if len(line) > max_line:
            while line and not line.endswith(b"\n"):
                line = inp.readline(1 << 20)
            out.send({"id": 0, "ok": False, "error": {"code": "too_large", "message": "request line exceeds %d bytes" % max_line}})
            continue
        try:
            req = json.loads(line)
            rid = req["id"]
        except (ValueError, KeyError, TypeError) as e:
            out.send({"id": 0, "ok": False, "error": {"code": "bad_request", "message": "unreadable request: %s" % e}})
            continue
        if req.get("op") == "shutdown":
            out.send({"id": rid, "ok": True})
            return
        worker.reply(rid, worker.handle, req)


def start_tp(args, name, backend):
    """Joins the tensor-parallel group: a follower runs tp.follow and
    never returns; rank 0 starts the followers and returns its
    tp.Leader."""
    if name != "torch":
        raise ImportError("tensor parallel needs the torch backend, not %s" % name)
    import tp
    if args.rank:
        tp.follow(args.rank, args.tp, lambda out, hb: Worker(out, hb, backend, args.faults))
    return tp.Leader(sys.argv, args.tp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--max-line", type=int, default=64 << 20)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--faults", action="store_true")
    ap.add_argument("--tp", type=int, default=1)  # tensor parallel ranks (tp.py)
    ap.add_argument("--rank", type=int, default=0)  # a follower rank, started by rank 0
    args = ap.parse_args()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLine("%(levelname)s " + ("rank%d." % args.rank if args.rank else "") + "%(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    out = Out()
    hello = {"type": "hello", "protocol": PROTOCOL, "pid": os.getpid(), "python": sys.version.split()[0]}
    try:
        name, backend, versions = import_backend(args.backend)
    except ImportError as e:
        hello["error"] = {"code": "unavailable", "message": str(e)}
        out.send(hello)
        sys.exit(3)
    if args.threads and name == "torch":
        import torch
        torch.set_num_threads(args.threads)
    leader = None
    if args.tp > 1:
        try:
            leader = start_tp(args, name, backend)
        except Exception as e:  # no group: the worker cannot serve
            hello["error"] = {"code": "unavailable", "message": "tensor parallel %d: %s" % (args.tp, e)}
            out.send(hello)
            sys.exit(3)
    hello.update({"backend": name, "versions": versions, "capabilities": backend.CAPABILITIES, "max_line": args.max_line})
    out.send(hello)
    hb = Heartbeat(out, args.heartbeat)
    hb.start()
    worker = Worker(out, hb, backend, args.faults)
    if leader is not None:  # every request goes to the follower ranks first
        worker.handle = leader.guard(worker.handle)
    if os.environ.get("MLXSERVING_WORKER_PROFILE") == "1":  # diagnosis: where the worker's time goes
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.runcall(serve, sys.stdin.buffer, out, worker, args.max_line)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(35)
    else:
        serve(sys.stdin.buffer, out, worker, args.max_line)
    # Every reply is flushed (Out.raw): exit now rather than wait for the
    # interpreter's finalisation, which takes over a second once torch is
    # imported and would keep the supervisor's shutdown waiting.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
