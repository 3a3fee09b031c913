"""mlxsworker.timing, the worker's step-cycle summary, on made-up times:
per step, the time in the worker, the part of it waiting for the device,
and the time from a step's reply to the next step's request; logged once
per interval, then restarted; and a window ended by an idle spell.

  python3 timing_test.py RUNTIME_DIR

Prints "N passed, 0 failed" or raises. Run by TestStepTiming.
"""
import logging
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])

from mlxsworker import timing  # noqa: E402

passed = 0
lines = []


class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())


timing.log.addHandler(Keep())
timing.log.setLevel(logging.INFO)
t = timing.StepTiming(every=1.0, clock=lambda: 0.0)
# Steps of 6 ms in the worker, 2 ms of it waiting for the device, 1.5 ms
# apart: 7.5 ms a cycle, so the summary comes with the 134th step (its
# reply past 1 s).
now, n = 0.0, 0
while not lines:
    read = now + (0.0015 if n else 0.0)
    timing.device_wait(0.002)
    t.step(read, read + 0.006)
    now, n = read + 0.006, n + 1
assert n == 134, n
assert lines[0] == ("steps: 134 in 1.0 s; a step 6.00 ms in the worker (2.00 ms of it waiting for the device), "
                    "1.49 ms from its reply to the next step's request"), lines[0]  # the first step has no gap before it
passed += 1
# Restarted: the next summary counts from the last one.
assert t.steps == 0 and t.inside == 0 and t.between == 0 and timing._waited[0] == 0
t.step(now + 0.001, now + 0.003)
assert t.steps == 1 and abs(t.between - 0.001) < 1e-12 and abs(t.inside - 0.002) < 1e-12
passed += 1
# An idle spell ends the window: nothing at 0.5 s after the last reply,
# the summary at 1 s, over the busy time up to that reply (10 steps of 2 ms
# in the worker, 1 ms apart: 29 ms, 0.9 ms a step between); the next step starts a window of its
# own, the idle gap not counted between steps; idle without steps logs
# nothing.
lines.clear()
t = timing.StepTiming(every=10.0, clock=lambda: 100.0, idle_after=1.0)
now = 100.0
for k in range(10):
    read = now + (0.001 if k else 0.0)
    t.step(read, read + 0.002)
    now = read + 0.002
t.idle(now + 0.5)
assert not lines, lines
t.idle(now + 1.0)
assert lines == ["steps: 10 in 0.0 s; a step 2.00 ms in the worker (0.00 ms of it waiting for the device), "
                 "0.90 ms from its reply to the next step's request"], lines  # nine gaps, ten steps
assert abs((now - 100.0) - 0.029) < 1e-9
passed += 1
t.step(now + 5.0, now + 5.004)
assert t.steps == 1 and t.between == 0 and t.start == now + 5.0, (t.steps, t.between, t.start)
t.idle(now + 7.0)
assert len(lines) == 2 and lines[1].startswith("steps: 1 in 0.0 s; a step 4.00 ms"), lines
t.idle(now + 9.0)
assert len(lines) == 2, lines
passed += 1
# Device spans (CUDA events on a GPU; stand-ins here): read once the
# device passed their end, averaged a step, their share of the window
# scaled to every step; one still running counts in a later window.


class Event:
    def __init__(self, at, done=True):
        self.at, self.done = at, done

    def query(self):
        return self.done

    def elapsed_time(self, end):  # milliseconds, as torch's
        return (end.at - self.at) * 1e3


lines.clear()
t = timing.StepTiming(every=10.0, clock=lambda: 0.0, idle_after=1.0)
late = Event(0.42, done=False)
for k, (a, b) in enumerate([(0.0, 0.003), (0.01, 0.012), (0.02, 0.024)]):
    t.step(0.01 * k, 0.01 * k + 0.005)
    timing.device_span(Event(a), late if k == 2 else Event(b))
assert len(timing._spans) == 1 and timing._busy == [0.005, 2], (timing._spans, timing._busy)
line = t.summary(0.1)
assert line.endswith("; the device busy 2.50 ms a step (2 steps timed), 8% of the window"), line
t.idle(1.5)  # ends the window; the running span stays for the next
late.done = True
t.step(2.0, 2.004)
t.idle(3.1)
assert lines[-1].startswith("steps: 1 in 0.0 s;") and "the device busy 400.00 ms a step (1 steps timed)" in lines[-1], lines
assert not timing._spans
passed += 1
print("%d passed, 0 failed" % passed)
