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
"""
import logging
import time

log = logging.getLogger("timing")

EVERY = 10.0  # seconds between summaries

_waited = [0.0]  # device waits since the last summary


def device_wait(seconds):
    """Adds seconds the host spent blocked on the device's results."""
    _waited[0] += seconds


class StepTiming:
    """The running sums of a worker's step cycle (see the module doc)."""

    def __init__(self, every=EVERY, clock=time.perf_counter):
        self.every, self.clock = every, clock
        self.last_reply = None  # when the last step's reply went out
        self._reset(clock())

    def _reset(self, now):
        self.start, self.steps, self.inside, self.between = now, 0, 0.0, 0.0
        _waited[0] = 0.0

    def step(self, read, replied):
        """Records a step whose request line was read at read and whose
        reply went out at replied; logs and restarts the sums when every
        seconds have passed."""
        if self.last_reply is not None and read >= self.last_reply:
            self.between += read - self.last_reply
        self.last_reply = replied
        self.steps += 1
        self.inside += replied - read
        if replied - self.start >= self.every:
            log.info("%s", self.summary(replied))
            self._reset(replied)

    def summary(self, now):
        n = max(self.steps, 1)
        return ("steps: %d in %.1f s; a step %.2f ms in the worker (%.2f ms of it waiting for the device), "
                "%.2f ms from its reply to the next step's request"
                % (self.steps, now - self.start, self.inside / n * 1e3, _waited[0] / n * 1e3, self.between / n * 1e3))
