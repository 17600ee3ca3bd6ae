"""Live progress of a run: a bar on a terminal, periodic lines in a log."""

from __future__ import annotations

import sys
import time
from mriprep.run.result import STATUSES, SubjectResult


class ProgressReporter:
    """Shows progress: a tqdm bar on a terminal, else a plain line now and then.

    Failures are printed as they happen in both modes; the bar shows done, failed,
    rate and time left.
    """

    def __init__(self, total: int, stream=None, terminal: bool | None = None,
                 log_every_s: float = 30.0):
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.log_every_s = log_every_s
        self.counts = {status: 0 for status in STATUSES}
        self.start = time.monotonic()
        self.last_log = self.start
        self.bar = None
        if self.terminal:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="subj", file=self.stream, dynamic_ncols=True,
                            desc="mriprep run", smoothing=0.1)

    def __call__(self, result: SubjectResult) -> None:
        self.counts[result.status] += 1
        if result.failed:
            self._say(f"FAILED {result.name} at {result.stage}: {result.reason}")
        if self.bar is not None:
            self.bar.set_postfix(self.counts, refresh=False)
            self.bar.update(1)
            return
        now = time.monotonic()
        done = sum(self.counts.values())
        if now - self.last_log >= self.log_every_s or done == self.total:
            self.last_log = now
            self._say(self._status_line(done, now - self.start))

    def _status_line(self, done: int, elapsed: float) -> str:
        rate = done / elapsed * 60 if elapsed > 0 else 0.0
        left = (self.total - done) / (done / elapsed) if done and elapsed > 0 else None
        eta = f", about {_duration(left)} left" if left is not None and done < self.total else ""
        parts = ", ".join(f"{n} {s}" for s, n in self.counts.items())
        return (f"mriprep run: {done}/{self.total} subjects done ({parts}), "
                f"{rate:.1f} subjects/min{eta}")

    def _say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
