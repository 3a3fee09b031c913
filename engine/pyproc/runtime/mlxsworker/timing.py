"""Where a serving worker's time goes between and inside its steps, logged
every EVERY seconds while it steps (INFO, in the server's log):

- in the worker: from reading a step's request line to sending its reply;
- of that, waiting for the device: a backend's blocking reads of results
  (device_wait, called by torchrt's HostCopy);
- between steps: from a step's reply to the next step's request line,
  the supervisor's part (the batcher's work, other requests such as opens,
  both pipes);
- where the backend times it (torchrt on CUDA, device_span), the device's
  busy time a step: CUDA events around the step, the first recorded as the
  step's host work begins and the last after its last launch, and its share
  of the window. A device still running the step before reaches the first
  event only when done with it, so the wait for a pipelined step's launch
  falls outside; but a device idle when the step begins reaches it at once,
  and the host's work up to the step's first kernel then counts as busy,
  as does a later launch of the step arriving late. The share is an upper
  bound, read beside nvidia-smi's (which counts kernels running).

A device that idles under load idles in the gaps that work launched
ahead does not cover; these three say which part of the cycle to shorten.

A window also ends when the worker goes idle (no step request for IDLE
seconds after a reply; the heartbeat thread notices, idle()): its summary
is logged then, over the busy time alone, and the next window starts with
the next step. A load that ran between two idle spells so gets a summary
of its own, whatever its length, and an idle gap never counts as time
between steps.
"""
import collections
import logging
import threading
import time

log = logging.getLogger("timing")

EVERY = 10.0  # seconds between summaries
IDLE = 1.0  # seconds without a step request that end a window

_waited = [0.0]  # device waits since the last summary


def device_wait(seconds):
    """Adds seconds the host spent blocked on the device's results."""
    _waited[0] += seconds


_spans = collections.deque()  # (start, end) events of steps whose times are not read yet
_busy = [0.0, 0]  # device seconds of the steps read since the last summary, and how many
_spans_lock = threading.Lock()  # steps add spans on the protocol loop; summaries read them on either thread


def device_span(start, end):
    """Adds a step's device span: start and end are events (CUDA events
    with timing) recorded as the step's host work begins and after its
    last launch; read once the device has passed end."""
    with _spans_lock:
        _spans.append((start, end))
        _read_spans()


def _read_spans():
    while _spans and _spans[0][1].query():
        start, end = _spans.popleft()
        _busy[0] += start.elapsed_time(end) / 1e3
        _busy[1] += 1


class StepTiming:
    """The running sums of a worker's step cycle (see the module doc).
    step runs on the protocol loop, idle on the heartbeat thread."""

    def __init__(self, every=EVERY, clock=time.perf_counter, idle_after=IDLE):
        self.every, self.clock, self.idle_after = every, clock, idle_after
        self.lock = threading.Lock()
        self.last_reply = None  # when the last step's reply went out
        self._reset(clock(), fresh=True)

    def _reset(self, now, fresh=False):
        """Restarts the sums at now; fresh (at start and after an idle
        spell): the window starts with the next step's request instead,
        and no gap before it counts."""
        self.start, self.steps, self.inside, self.between = now, 0, 0.0, 0.0
        self.fresh = fresh
        _waited[0] = 0.0
        with _spans_lock:
            _busy[0], _busy[1] = 0.0, 0

    def step(self, read, replied):
        """Records a step whose request line was read at read and whose
        reply went out at replied; logs and restarts the sums when every
        seconds have passed."""
        with self.lock:
            if self.fresh:
                self.start, self.fresh = read, False
            elif read >= self.last_reply:
                self.between += read - self.last_reply
            self.last_reply = replied
            self.steps += 1
            self.inside += replied - read
            if replied - self.start >= self.every:
                log.info("%s", self.summary(replied))
                self._reset(replied)

    def idle(self, now):
        """Ends the window when no step came for idle_after seconds after
        the last reply: logs its summary, over the time up to that reply
        (the heartbeat thread calls this every beat)."""
        with self.lock:
            if self.steps and now - self.last_reply >= self.idle_after:
                log.info("%s", self.summary(self.last_reply))
                self._reset(now, fresh=True)

    def summary(self, now):
        n = max(self.steps, 1)
        out = ("steps: %d in %.1f s; a step %.2f ms in the worker (%.2f ms of it waiting for the device), "
               "%.2f ms from its reply to the next step's request"
               % (self.steps, now - self.start, self.inside / n * 1e3, _waited[0] / n * 1e3, self.between / n * 1e3))
        with _spans_lock:
            _read_spans()
            busy, timed = _busy
        if timed:
            # Spans not read yet (their steps still on the device) count in
            # the next window; the share scales the read ones to every step.
            share = busy / timed * self.steps / max(now - self.start, 1e-9)
            out += "; the device busy %.2f ms a step (%d steps timed), %.0f%% of the window" % (busy / timed * 1e3, timed,
                                                                                               100 * min(share, 1.0))
        return out
