"""The worker's start-up (PROTOCOL.md, "Start-up"): its command line, the
backend, the handshake, then the protocol loop until stdin closes."""
import argparse
import logging
import os
import sys

from . import settings as settings_mod
from .backend import TensorParallel
from .errors import INVALID, UNAVAILABLE
from .protocol import Heartbeat, Out, Worker, serve
from .timing import StepTiming
from .trace import StepTrace, TraceError

PROTOCOL = 1


class OneLine(logging.Formatter):
    """Keeps a record, traceback included, on one stderr line so the
    supervisor logs it as one event at the record's level."""

    def format(self, record):
        return super().format(record).replace("\n", " | ")


def make_backend(name, settings):
    """The Backend for --backend name ("auto": mlx where it imports, else
    torch). Raises ImportError saying what to install."""
    if name in ("mlx", "auto"):
        try:
            from .mlxlm.backend import MlxBackend
            return MlxBackend(settings)
        except ImportError as e:
            if name == "mlx":
                raise ImportError("the mlx backend needs the mlx and mlx-lm Python packages (pip install mlx-lm): %s" % e)
    try:
        from .torchrt.backend import TorchBackend
    except ImportError as e:
        raise ImportError("the torch backend needs PyTorch and NumPy (Debian: apt-get install python3-torch python3-numpy; "
                          "elsewhere: pip install torch numpy): %s" % e)
    return TorchBackend(settings)


def parse_args(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--max-line", type=int, default=64 << 20)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--faults", action="store_true")
    ap.add_argument("--settings", default="")  # a JSON object (settings.py)
    ap.add_argument("--tp", type=int, default=1)  # tensor parallel ranks (torchrt/tp.py)
    # A follower rank, started by rank 0 with the group's port and seed.
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--tp-port", type=int, default=0)
    ap.add_argument("--tp-seed", type=int, default=0)
    return ap.parse_args(argv)


def refuse(out, hello, code, message):
    """Sends the handshake with an error and exits (status 3)."""
    hello["error"] = {"code": code, "message": message}
    out.send(hello)
    sys.exit(3)


def main():
    args = parse_args(sys.argv[1:])
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLine("%(levelname)s " + ("rank%d." % args.rank if args.rank else "") + "%(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    out = Out()
    hello = {"type": "hello", "protocol": PROTOCOL, "pid": os.getpid(), "python": sys.version.split()[0]}
    try:
        settings = settings_mod.parse(args.settings)
    except settings_mod.SettingsError as e:
        refuse(out, hello, INVALID, str(e))
    try:
        backend = make_backend(args.backend, settings)
    except ImportError as e:
        refuse(out, hello, UNAVAILABLE, str(e))
    if args.threads:
        backend.set_threads(args.threads)
    guard = None
    if args.tp > 1:
        tp = TensorParallel(args.tp, args.rank, args.tp_port, args.tp_seed, sys.argv)
        try:
            guard = backend.join(tp, lambda out, hb: Worker(out, hb, backend, args.faults))
        except Exception as e:  # no group: the worker cannot serve
            refuse(out, hello, UNAVAILABLE, "tensor parallel %d: %s" % (args.tp, e))
    tracer = StepTrace(out)
    if settings.trace_dir:
        try:
            tracer.arm(settings.trace_dir, settings.trace_skip, settings.trace_length)
        except TraceError as e:
            refuse(out, hello, UNAVAILABLE, "trace_dir: %s" % e)
    hello.update({"backend": backend.name, "versions": backend.versions(), "capabilities": backend.capabilities(),
                  "max_line": args.max_line})
    out.send(hello)
    timing = StepTiming()
    hb = Heartbeat(out, args.heartbeat, timing)
    hb.start()
    worker = Worker(out, hb, backend, args.faults)
    worker.tracer = tracer
    if guard is not None:  # every request goes to the follower ranks first
        worker.handle = guard(worker.handle)
    if settings.profile:  # diagnosis: where the worker's time goes
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.runcall(serve, sys.stdin.buffer, out, worker, args.max_line, timing)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(35)
    else:
        serve(sys.stdin.buffer, out, worker, args.max_line, timing)
    # A trace still recording is lost: the supervisor kills a worker that
    # has not exited soon after its shutdown, sooner than a trace is written.
    # Every reply is flushed (Out.raw): exit now rather than wait for the
    # interpreter's finalisation, which takes over a second once torch is
    # imported and would keep the supervisor's shutdown waiting.
    sys.stderr.flush()
    os._exit(0)
