"""The worker's device trace (mlxsworker/trace.py) on the CPU:

- summarize() over a made-up trace with kernels: the busy share is the
  union of the kernels (overlaps counted once, clipped to the steps'
  window), every idle gap falls under the phase open then (a wait for the
  device inside a step under that wait, not the step), the gaps by length
  add up, copies in the gaps are counted (not as busy), the warm-up step
  is left out, and the largest gap names the kernels on either side;
- StepTrace on the CPU profiler: armed, it records steps skip+1 to
  skip+steps of a loop and the warm-up step before them, annotated,
  writes trace-<pid>-<n>.json.gz and .txt, records nothing before or
  after, and answers the request that armed it; one trace at a time;
  ended early it writes what it has, and armed again it numbers on;
- a directory it cannot write, or no steps, is refused with TraceError;
- the trace op through the protocol's Worker: answered when written, a
  stop ends only the trace it names, bad fields are invalid_value.

  python3 trace_test.py RUNTIME_DIR

Prints "N passed, 0 failed" or raises. Run by TestTraceSummary.
"""
import gzip
import json
import os
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])

from mlxsworker import trace  # noqa: E402

passed = 0


def check(ok, what):
    global passed
    if not ok:
        raise AssertionError(what)
    passed += 1


def ev(name, ts, dur, cat):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat}


# The warm-up step (-300-0 us), left out; two steps (0-1000 and 1200-2000)
# with a wait for a request between them (1000-1200) and a wait for the
# device inside the second (1500-1800). Kernels: 0-300 and 200-600
# overlap (busy 0-600), 650-1100, 1150-1500, 1900-2100 (clipped at 2000),
# and one in the warm-up step, before the window (-100 to -50); a copy in
# an idle gap (1600-1650) and one beside a kernel (1400-1450).
# Idle: 600-650 (step, 50), 1100-1150 (wait, 50), 1500-1900 (device wait
# 300 + step 100) = 500 us; busy 1500 of 2000.
made = {"traceEvents": [
    ev("worker.step", -300, 300, "user_annotation"),
    ev("worker.step", 0, 1000, "user_annotation"),
    ev("worker.wait", 1000, 200, "user_annotation"),
    ev("worker.step", 1200, 800, "user_annotation"),
    ev("worker.device_wait", 1500, 300, "user_annotation"),
    ev("worker.step", 0, 900, "gpu_user_annotation"),  # the device's copy of an annotation: not a phase
    ev("early", -100, 50, "kernel"),
    ev("gemm_a", 0, 300, "kernel"),
    ev("gemm_b", 200, 400, "kernel"),
    ev("copy_rows", 650, 450, "kernel"),
    ev("Memcpy HtoD", 1600, 50, "gpu_memcpy"),  # the SMs idle meanwhile
    ev("Memset", 1400, 50, "gpu_memset"),  # beside a kernel
    ev("attention", 1150, 350, "kernel"),
    ev("sample", 1900, 200, "kernel"),
    ev("aten::mm", 10, 20, "cpu_op"),
    ev("cudaLaunchKernel", -200, 5, "cuda_runtime"),  # before the window
    ev("cudaLaunchKernel", 100, 5, "cuda_runtime"),
    ev("cudaGraphLaunch", 1210, 20, "cuda_runtime"),
    ev("cudaStreamSynchronize", 590, 70, "cuda_runtime"),  # the host waits for the device in the step's gap
    ev("cudaMemcpyAsync", 1100, 40, "cuda_runtime"),  # does not wait
    {"ph": "i", "name": "worker.step", "ts": 5},  # not a complete event
]}
text = trace.summarize(made, "made")
lines = text.split("\n")
check(lines[0] == "device trace made: 2 steps over 2.0 ms", lines[0])
check(lines[1] == "the device busy 1.5 ms, 75.0% of the window (its 5 kernels, 2.5 a step); idle 0.5 ms in 3 gaps, 0.05 ms of it copying",
      lines[1])
check(lines[2] == "the host launched 1 kernels and 1 CUDA graphs in the window", lines[2])
check(lines[3] == "idle by gap length: 10-100 us 0.10 ms (2), 100 us-1 ms 0.40 ms (1)", lines[3])
check(lines[4] == ("idle while the worker: waited for the device 0.35 ms (17.5% of the window), "
                   "stepped (host work) 0.10 ms (5.0% of the window), waited for a request 0.05 ms (2.5% of the window)"), lines[4])
check(lines[5].startswith("a gap of 0.400 ms at +1.5 ms, the worker waited for the device; after 'attention', before 'sample'"), lines[5])
check(len(lines) == 8, "three gaps listed: %r" % lines)
text = trace.summarize([e for e in made["traceEvents"] if e.get("cat") != "kernel"], "nokernels", cuda=True)
check("no kernel recorded, though the device's events were asked for" in text, text)

# Without device events, the phases' shares of the window.
cpu = [e for e in made["traceEvents"] if e.get("cat") in ("user_annotation", None)]
text = trace.summarize(cpu, "cpu")
check("no device events (a CPU worker)" in text and "stepped (host work) 75.0%" in text and "waited for the device 15.0%" in text
      and "waited for a request 10.0%" in text, text)
for few in ([], made["traceEvents"][:1]):
    check(trace.summarize(few, "few") == "device trace few: no step recorded past the warm-up step", "a trace of %d steps" % len(few))

# The recorder on the CPU profiler: steps 3 to 6 of ten, each a torch op,
# behind the warm-up step 2.
import torch  # noqa: E402

class Out:
    def __init__(self):
        self.sent = []

    def send(self, obj):
        self.sent.append(obj)


with tempfile.TemporaryDirectory() as d:
    out = Out()
    st = trace.StepTrace(out)
    base = st.arm(os.path.join(d, "sub"), 2, 4, rid=17)
    check(base == os.path.join(d, "sub", "trace-%d-1" % os.getpid()), base)
    try:
        st.arm(d, 0, 1)
        check(False, "a second trace armed beside the first")
    except trace.TraceError as e:
        check("under way" in str(e) and e.code == "invalid_value", str(e))
    ops = ["open"] + ["step"] * 10 + ["free"]
    for i, op in enumerate(ops):
        with st.waiting():
            time.sleep(0.001)
        with st.request(op):
            torch.ones(8).sum()
            if op == "step":
                with trace.span("worker.device_wait"):
                    time.sleep(0.0005)
        check(st.due == (i == 6), "due after request %d" % i)
        if st.due:  # as the protocol loop does, after the step's timing
            st.finish()
        check(trace._active[0] == (op == "step" and 2 <= i < 6), "recording at request %d (%s)" % (i, op))
        check(st.armed == (i < 6), "armed after request %d" % i)
    with gzip.open(base + ".json.gz") as f:
        got = trace._events(json.load(f))
    names = [e["name"] for e in got]
    check(names.count("worker.step") == 5 and names.count("worker.device_wait") == 5, "4 steps and the warm-up traced: %r"
          % sorted(set(names)))
    check("worker.open" not in names and "worker.free" not in names, "nothing before or after the steps")
    check(names.count("worker.wait") == 4, "the waits between the traced steps: %d" % names.count("worker.wait"))
    check(not os.path.exists(base + ".json"), "the plain JSON removed")
    with open(base + ".txt") as f:
        summary = f.read()
    check(summary.startswith("device trace trace-%d-1.json.gz: 4 steps" % os.getpid()) and "no device events" in summary, summary)
    check(len(out.sent) == 1 and out.sent[0] == {"id": 17, "ok": True, "file": base + ".json.gz", "summary": summary.rstrip("\n")},
          "the request answered once written: %r" % out.sent)

    # Armed again, ended after two steps (the warm-up and one): written,
    # numbered on; ended before its first step: answered, nothing written.
    base = st.arm(d, 0, 50, rid=18)
    check(base.endswith("trace-%d-2" % os.getpid()), base)
    for op in ("step", "step"):
        with st.request(op):
            torch.ones(8).sum()
    st.finish()
    check(not st.armed and not trace._active[0] and os.path.exists(base + ".json.gz"), "ended early")
    check(out.sent[-1]["id"] == 18 and out.sent[-1]["summary"].startswith("device trace trace-%d-2.json.gz: 1 step over" % os.getpid()),
          out.sent[-1])
    base = st.arm(d, 5, 10, rid=19)
    st.finish()
    check(out.sent[-1] == {"id": 19, "ok": True, "summary": "device trace trace-%d-3: stopped before its first step" % os.getpid()}
          and not os.path.exists(base + ".json.gz"), out.sent[-1])
    st.finish()  # nothing armed: nothing sent
    check(len(out.sent) == 3, "answers %d" % len(out.sent))

    # A path under a file cannot be a directory; nothing is armed.
    blocker = os.path.join(d, "file")
    open(blocker, "w").close()
    for args in ((os.path.join(blocker, "x"), 0, 1), (d, 0, 0), (d, -1, 5), (d, 0, 2001)):
        try:
            st.arm(*args)
            check(False, "armed with %r" % (args,))
        except trace.TraceError as e:
            check(("trace: directory" in str(e) or "want 1 to 2000 steps" in str(e)) and not st.armed, str(e))

# The trace op through the protocol's Worker: answered once written (here
# ended by a stop naming it), a stop naming another request ends nothing,
# bad fields are invalid_value.
from mlxsworker.protocol import Worker  # noqa: E402

with tempfile.TemporaryDirectory() as d:
    out = Out()
    w = Worker(out, None, None, False)
    w.reply(5, w.handle, {"id": 5, "op": "trace", "dir": d, "steps": 3})
    check(out.sent == [] and w.tracer.armed, "the trace request answered at once: %r" % out.sent)
    w.reply(6, w.handle, {"id": 6, "op": "trace", "stop": True, "trace": 4})
    check(out.sent == [{"id": 6, "ok": True}] and w.tracer.armed, "a stop naming another trace: %r" % out.sent)
    w.reply(7, w.handle, {"id": 7, "op": "trace", "dir": d, "steps": 3})
    check(out.sent[-1]["id"] == 7 and out.sent[-1]["error"]["code"] == "invalid_value" and "under way" in out.sent[-1]["error"]["message"],
          out.sent[-1])
    w.reply(8, w.handle, {"id": 8, "op": "trace", "stop": True, "trace": 5})
    check(out.sent[-2]["id"] == 5 and "stopped before its first step" in out.sent[-2]["summary"] and out.sent[-1] == {"id": 8, "ok": True}
          and not w.tracer.armed, out.sent[-2:])
    for i, bad in enumerate(({"dir": ""}, {"dir": 3}, {"dir": d, "steps": "x"}, {"dir": d, "steps": True}, {"dir": d, "steps": 0},
                             {"dir": d, "skip": -1})):
        w.reply(20 + i, w.handle, dict(bad, id=20 + i, op="trace"))
        check(out.sent[-1]["ok"] is False and out.sent[-1]["error"]["code"] == "invalid_value" and not w.tracer.armed,
              "trace %r: %r" % (bad, out.sent[-1]))

print("%d passed, 0 failed" % passed)
