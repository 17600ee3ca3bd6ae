"""Live progress of a run: a bar on a terminal, periodic lines in a log."""

from __future__ import annotations

import time

from mriprep.core.progress import ProgressBar
from mriprep.run.result import STATUSES, SubjectResult


class ProgressReporter:
    """Shows progress: a tqdm bar on a terminal, else a plain line now and then.

    Failures are printed as they happen in both modes; the bar shows done, failed,
    rate and time left.
    """

    def __init__(self, total: int, stream=None, terminal: bool | None = None,
                 log_every_s: float = 30.0):
        self.total = total
        self.log_every_s = log_every_s
        self.counts = {status: 0 for status in STATUSES}
        self.start = time.monotonic()
        self.last_log = self.start
        self.bar = ProgressBar("mriprep run", "subj", total=total, stream=stream,
                               terminal=terminal)

    def __call__(self, result: SubjectResult) -> None:
        self.counts[result.status] += 1
        if result.failed:
            self.bar.write(f"FAILED {result.name} at {result.stage}: {result.reason}")
        if self.bar.shown:
            self.bar.advance(postfix=self.counts)
            return
        now = time.monotonic()
        done = sum(self.counts.values())
        if now - self.last_log >= self.log_every_s or done == self.total:
            self.last_log = now
            self.bar.write(self._status_line(done, now - self.start))

    def _status_line(self, done: int, elapsed: float) -> str:
        rate = done / elapsed * 60 if elapsed > 0 else 0.0
        left = (self.total - done) / (done / elapsed) if done and elapsed > 0 else None
        eta = f", about {_duration(left)} left" if left is not None and done < self.total else ""
        parts = ", ".join(f"{n} {s}" for s, n in self.counts.items())
        return (f"mriprep run: {done}/{self.total} subjects done ({parts}), "
                f"{rate:.1f} subjects/min{eta}")

    def close(self) -> None:
        self.bar.close()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
