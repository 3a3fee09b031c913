"""Where a serving worker's time goes between and inside its steps, logged
every EVERY seconds while it steps (INFO, in the server's log):

- in the worker: from reading a step's request line to sending its reply;
- of that, waiting for the device: a backend's blocking reads of results
  (device_wait, called by torchrt's HostCopy);
- between steps: from a step's reply to the next step's request line,
  the supervisor's part (the batcher's work, other requests such as opens,
  both pipes).

A device that idles under load idles in the gaps that work launched
ahead does not cover; these three say which part of the cycle to shorten.

A window also ends when the worker goes idle (no step request for IDLE
seconds after a reply; the heartbeat thread notices, idle()): its summary
is logged then, over the busy time alone, and the next window starts with
the next step. A load that ran between two idle spells so gets a summary
of its own, whatever its length, and an idle gap never counts as time
between steps.
"""
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
        return ("steps: %d in %.1f s; a step %.2f ms in the worker (%.2f ms of it waiting for the device), "
                "%.2f ms from its reply to the next step's request"
                % (self.steps, now - self.start, self.inside / n * 1e3, _waited[0] / n * 1e3, self.between / n * 1e3))
