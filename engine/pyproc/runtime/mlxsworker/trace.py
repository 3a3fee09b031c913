"""A device trace of a worker's steps under load: where the device idles
while the worker serves, and what the worker was doing then. Armed at
start-up (settings trace_dir, trace_skip, trace_steps) or by a trace
request (PROTOCOL.md), one at a time.

After skip step requests, torch's profiler records the next steps steps:
the device's kernels and copies (CUDA), the host's torch ops, and the
worker's own phases as annotations. It starts a step early (the step
before the first traced one, or the first step when skip is 0): the
profiler's start-up lands in that step, which the summary leaves out.
The annotations:

- worker.wait: reading the next request line, i.e. waiting for the
  supervisor (the batcher's work, the pipes);
- worker.<op>: handling a request of that op (worker.step, worker.open,
  worker.free, ...), its reply included;
- worker.device_wait: inside a step, the host blocked on the device's
  results (torchrt's HostCopy); the host's blocking CUDA calls (_SYNCS)
  count as such waits too.

It then writes trace-<pid>-<n>.json.gz (a Chrome trace: Perfetto and
chrome://tracing open it) and trace-<pid>-<n>.txt, a summary logged as well:
the device's busy share of the traced window (the union of its kernels, as
nvidia-smi's utilization counts them; copies are reported beside), its
idle gaps by length, which phase each idle microsecond fell in, and the
largest gaps with the kernels on either side; then answers the request
that armed it with the file and the summary. The CPU backend has no device events: its summary
gives the phases' shares alone.

Recording the host's ops costs host time (a few microseconds an op), so a
traced step's host work is slower than an untraced one and the busy share
is, if anything, low. The load also stalls as the trace ends, for as long
as the profiler takes to stop, which grows with the host ops recorded:
12.6 s for 300 eager steps of the tiny model on a 2-core CPU (531,000
events), far less for CUDA graphs' few launches; the log says how long
each part took. For diagnosis, not for serving.
"""
import bisect
import contextlib
import gzip
import json
import logging
import os
import time

from .errors import INTERNAL, INVALID, UNAVAILABLE

log = logging.getLogger("trace")

# Set while the profiler records; span() costs nothing otherwise.
_active = [False]

# The Chrome trace's categories of the device's own work: kernels, which
# nvidia-smi's utilization counts and the busy share is made of, and
# copies, run by the copy engines while the SMs may idle.
KERNEL_CATS = ("kernel",)
COPY_CATS = ("gpu_memcpy", "gpu_memset")

# Which phase an idle moment counts under when annotations nest or meet:
# a wait for the device inside a step is that wait, not the step.
_PRIORITY = {"worker.device_wait": 3, "worker.wait": 1}

# The steps a trace records when none are asked for.
DEFAULT_STEPS = 200

# The most steps one trace records: the profiler keeps every event until
# the trace ends, and stopping it, exporting and reading the trace back
# hold the interpreter for a time that grows with them, while the
# supervisor's watchdog waits for heartbeats.
MAX_STEPS = 2000

# The host's CUDA runtime calls that block until the device catches up: an
# idle moment under one is the host waiting for the device.
_SYNCS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaStreamWaitEvent")

LENGTHS = ((10.0, "under 10 us"), (100.0, "10-100 us"), (1000.0, "100 us-1 ms"), (float("inf"), "1 ms or more"))


class TraceError(Exception):
    """The trace cannot be taken: no torch profiler (code unavailable), a
    directory that cannot be written, a trace under way (invalid_value)."""

    def __init__(self, message, code=INVALID):
        super().__init__(message)
        self.code = code


def span(name):
    """A context that annotates the trace with name while it records."""
    if not _active[0]:
        return contextlib.nullcontext()
    from torch.profiler import record_function
    return record_function(name)


class StepTrace:
    """A worker's traces of its protocol loop's steps (see the module doc):
    one at a time, armed at start-up (settings trace_dir) or by a trace
    request, whose reply it sends when the trace is written. The loop
    calls waiting() around reading a request line and request(op) around
    handling one while armed is true."""

    def __init__(self, out=None):
        self.out = out  # where a trace request's reply goes
        self.armed = False  # a trace waits for its steps or records them
        self.taken = 0  # traces armed so far, numbering their files
        self.prof = None
        self.rid = None  # the trace request to answer, if any
        self.due = False  # the last traced step is done: the loop calls finish

    def arm(self, directory, skip, steps, rid=None):
        """Arms a trace into directory of the steps steps after the
        warm-up step, which is step max(skip, 1) from now (so skip 0 and 1
        both trace steps 2 to steps+1); returns the path its files start
        with. rid: the request to answer once written. Raises TraceError
        when a trace is armed already, the counts are out of range, torch's
        profiler is missing or the directory cannot be written."""
        if self.armed:
            raise TraceError("a trace is under way (%s)" % self.base)
        if not 1 <= steps <= MAX_STEPS or skip < 0:
            raise TraceError("trace: steps %d, skip %d: want 1 to %d steps, 0 skipped or more" % (steps, skip, MAX_STEPS))
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile
        except ImportError as e:
            raise TraceError("trace: the trace needs torch's profiler: %s" % e, UNAVAILABLE)
        try:
            os.makedirs(directory, exist_ok=True)
            probe = os.path.join(directory, ".trace-%d" % os.getpid())
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError as e:
            raise TraceError("trace: directory %r: %s" % (directory, e))
        activities = [ProfilerActivity.CPU]
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        self._profile = lambda: profile(activities=activities)
        self.taken += 1
        self.base = os.path.join(directory, "trace-%d-%d" % (os.getpid(), self.taken))
        self.skip, self.steps, self.seen, self.rid = skip, steps, 0, rid
        self.armed = True
        return self.base

    def waiting(self):
        return span("worker.wait")

    @contextlib.contextmanager
    def request(self, op):
        """Around handling a request of op while armed: starts the profiler
        before the warm-up step and annotates the request. After the last
        traced step, due is true: the loop then calls finish."""
        if op == "trace":  # it may end the trace: no annotation around it
            yield
            return
        step = op == "step"
        # Step max(skip, 1) is the warm-up step the summary leaves out.
        if step and self.prof is None and self.seen == max(self.skip - 1, 0):
            self._start()
            if not self.armed:  # the profiler would not start
                yield
                return
        if step:
            self.seen += 1
        with span("worker." + str(op)):
            yield
        if step and self.prof is not None and self.seen == max(self.skip, 1) + self.steps:
            self.due = True

    def _start(self):
        """Starts the profiler; one that will not start (another profiler
        holds CUPTI, say) disarms the trace and answers its request."""
        try:
            prof = self._profile()
            prof.__enter__()
        except Exception as e:
            log.error("trace: the profiler did not start: %s", e, exc_info=True)
            rid, self.rid, self.armed = self.rid, None, False
            self._answer(rid, {"ok": False, "error": {"code": UNAVAILABLE, "message": "trace: the profiler did not start: %s" % e}})
            return
        self.prof = prof
        _active[0] = True

    def finish(self):
        """Ends the armed trace now: writes what it recorded, or, armed but
        not yet recording, nothing; answers its request either way."""
        if not self.armed:
            return
        prof, self.prof, self.armed, self.due = self.prof, None, False, False
        _active[0] = False
        rid, self.rid = self.rid, None
        if prof is None:
            self._answer(rid, {"ok": True, "summary": "device trace %s: stopped before its first step" % os.path.basename(self.base)})
            return
        base = self.base
        try:
            t0 = time.perf_counter()
            prof.__exit__(None, None, None)
            t1 = time.perf_counter()
            prof.export_chrome_trace(base + ".json")
            t2 = time.perf_counter()
            with open(base + ".json", "rb") as f:
                raw = f.read()
            os.remove(base + ".json")
            with gzip.open(base + ".json.gz", "wb", compresslevel=3) as f:
                f.write(raw)
            events = json.loads(raw)
            text = summarize(events, os.path.basename(base) + ".json.gz", cuda=self.cuda)
            with open(base + ".txt", "w") as f:
                f.write(text + "\n")
            log.info("%s", text.replace("\n", " | "))
            log.info("trace: stopped in %.2f s, exported in %.2f s, written in %.2f s", t1 - t0, t2 - t1, time.perf_counter() - t2)
            self._answer(rid, {"ok": True, "file": base + ".json.gz", "summary": text})
        except Exception as e:  # a diagnosis: the worker serves on without it
            log.error("trace: not written: %s", e, exc_info=True)
            self._answer(rid, {"ok": False, "error": {"code": INTERNAL, "message": "trace not written: %s" % e}})

    def _answer(self, rid, reply):
        if rid is not None and self.out is not None:
            reply["id"] = rid
            self.out.send(reply)


def _events(trace):
    """The trace's complete events, from either of the profiler's export
    formats (a list, or an object with traceEvents)."""
    evs = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    return [e for e in evs if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]


def _merge(intervals):
    """The union of intervals (start, end) as sorted disjoint intervals."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def _overlaps(a, b):
    """Yields (k, t) for each interval b[k] that an interval of a shares
    time t > 0 with; a and b are sorted lists of disjoint intervals whose
    first two fields are start and end."""
    j = 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            t = min(e, b[k][1]) - max(s, b[k][0])
            if t > 0:
                yield k, t
            k += 1


def _span(e):
    """A trace event's (start, end), microseconds."""
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0))


def _phases(notes, lo, hi):
    """The worker's phase at each moment of [lo, hi]: disjoint segments
    (start, end, name) from its annotations, the highest priority where
    they overlap, "other" where none is open."""
    marks = []
    for s, e, name in notes:
        s, e = max(s, lo), min(e, hi)
        if s < e:
            marks.append((s, 1, name))
            marks.append((e, -1, name))
    marks.sort(key=lambda m: (m[0], m[1]))
    open_ = {}
    segs, at = [], lo
    for t, d, name in marks:
        if t > at:
            cur = max(open_, key=lambda n: (_PRIORITY.get(n, 2), n)) if open_ else "other"
            segs.append((at, t, cur))
            at = t
        open_[name] = open_.get(name, 0) + d
        if not open_[name]:
            del open_[name]
    if at < hi:
        segs.append((at, hi, "other"))
    return segs


def _label(name):
    return {"worker.wait": "waited for a request", "worker.step": "stepped (host work)",
            "worker.device_wait": "waited for the device", "other": "between phases"}.get(name, name)


def summarize(trace, name="the trace", cuda=False):
    """The summary of a worker's trace (the profiler's Chrome trace, as
    loaded from JSON): see the module doc. Its window runs from the end of
    the first step (the warm-up step, where the profiler started) to the
    end of the last. The host's blocking CUDA calls (_SYNCS) count as
    waits for the device beside the worker's own. cuda: the profiler
    was asked for the device's events. Times in the trace are
    microseconds."""
    evs = _events(trace)
    notes = [(*_span(e), e["name"]) for e in evs
             if str(e.get("name", "")).startswith("worker.") and e.get("cat") != "gpu_user_annotation"]
    notes += [(*_span(e), "worker.device_wait") for e in evs if e.get("cat") == "cuda_runtime" and e.get("name") in _SYNCS]
    steps = sorted((s, e) for s, e, n in notes if n == "worker.step")
    if len(steps) < 2:
        return "device trace %s: no step recorded past the warm-up step" % name
    lo, hi = steps[0][1], max(e for _, e in steps)
    steps = steps[1:]
    window = hi - lo
    lines = ["device trace %s: %d step%s over %.1f ms" % (name, len(steps), "" if len(steps) == 1 else "s", window / 1e3)]
    phases = _phases(notes, lo, hi)
    kernels = sorted((*_span(e), e.get("name", "?")) for e in evs if e.get("cat") in KERNEL_CATS)
    copies = _merge(_span(e) for e in evs if e.get("cat") in COPY_CATS)
    if not kernels:
        share = {}
        for s, e, p in phases:
            share[p] = share.get(p, 0.0) + e - s
        what = ("no kernel recorded, though the device's events were asked for (did CUPTI record nothing?)" if cuda
                else "no device events (a CPU worker)")
        lines.append(what + "; the window: " + ", ".join(
            "%s %.1f%%" % (_label(p), 100 * t / window) for p, t in sorted(share.items(), key=lambda x: -x[1])))
        return "\n".join(lines)
    # The host's launches: kernels the device recorded fewer of than were
    # launched (graph replays aside) would read as idle time.
    launches = {"kernel": 0, "graph": 0}
    for e in evs:
        if e.get("cat") == "cuda_runtime" and lo <= float(e["ts"]) < hi:
            n = e.get("name", "")
            if "LaunchKernel" in n:
                launches["kernel"] += 1
            elif "GraphLaunch" in n:
                launches["graph"] += 1
    busy = [(max(s, lo), min(e, hi)) for s, e in _merge((s, e) for s, e, _ in kernels) if e > lo and s < hi]
    busy_t = sum(e - s for s, e in busy)
    gaps, at = [], lo
    for s, e in busy:
        if s > at:
            gaps.append((at, s))
        at = max(at, e)
    if at < hi:
        gaps.append((at, hi))
    idle = window - busy_t
    copying = sum(t for _, t in _overlaps(gaps, copies))
    # Many short kernels idle the device between them even when launched
    # ahead (a graph's replay included): their count says how many gaps.
    n = sum(1 for s, e, _ in kernels if e > lo and s < hi)
    lines.append("the device busy %.1f ms, %.1f%% of the window (its %d kernels, %.1f a step); idle %.1f ms in %d gaps, %.2f ms of it copying"
                 % (busy_t / 1e3, 100 * busy_t / window, n, n / len(steps), idle / 1e3, len(gaps), copying / 1e3))
    lines.append("the host launched %d kernels and %d CUDA graphs in the window" % (launches["kernel"], launches["graph"]))
    by_len = [[0, 0.0] for _ in LENGTHS]
    for s, e in gaps:
        i = next(k for k, (top, _) in enumerate(LENGTHS) if e - s < top)
        by_len[i][0] += 1
        by_len[i][1] += e - s
    lines.append("idle by gap length: " + ", ".join("%s %.2f ms (%d)" % (lab, t / 1e3, n)
                                                    for (n, t), (_, lab) in zip(by_len, LENGTHS) if n))
    # Each idle moment under the phase open then.
    idle_in = {}
    for k, t in _overlaps(gaps, phases):
        idle_in[phases[k][2]] = idle_in.get(phases[k][2], 0.0) + t
    if idle > 0:
        lines.append("idle while the worker: " + ", ".join("%s %.2f ms (%.1f%% of the window)" % (_label(p), t / 1e3, 100 * t / window)
                                                           for p, t in sorted(idle_in.items(), key=lambda x: -x[1])))
    starts = [k[0] for k in kernels]
    for s, e in sorted(gaps, key=lambda g: g[0] - g[1])[:5]:
        mid = (s + e) / 2
        p = phases[bisect.bisect_right([q[0] for q in phases], mid) - 1][2] if phases else "other"
        i = bisect.bisect_left(starts, e)
        before = max((k for k in kernels[:i] if k[1] <= s + 1e-3), key=lambda k: k[1], default=None)
        after = kernels[i] if i < len(kernels) else None
        lines.append("a gap of %.3f ms at +%.1f ms, the worker %s; after %s, before %s"
                     % ((e - s) / 1e3, (s - lo) / 1e3, _label(p), _short(before), _short(after)))
    return "\n".join(lines)


def _short(k):
    if k is None:
        return "nothing"
    n = k[2]
    return repr(n if len(n) <= 60 else n[:57] + "...")
