"""Live progress of a run: a bar on a terminal, periodic lines in a log."""

from __future__ import annotations

import time

from mriprep.core.progress import ProgressBar
from mriprep.cache.run_report import STATUSES, SubjectResult


class ProgressReporter:
    """Shows progress: a tqdm bar on a terminal, else a plain line now and then.

    Failures are printed as they happen in both modes; the bar shows done, failed,
    rate and time left, and on Slurm the jobs running and pending (:meth:`jobs`).
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
        # The Slurm jobs' last counts (a JobStatus), shown once a job board reports them.
        self.job_status = None

    def jobs(self, status) -> None:
        """A Slurm job board's news and counts (:class:`mriprep.run.slurm.JobStatus`);
        called from the board's thread."""
        for line in status.news:
            self.bar.write(f"mriprep run: {line}")
        seen = self.job_status
        if seen is not None and (seen.running, seen.pending, seen.pending_reason) == (
                status.running, status.pending, status.pending_reason):
            return
        self.job_status = status
        if self.bar.shown:
            self.bar.set_postfix(self.counts | self._jobs_postfix())
            return
        # In a log, jobs that start or queue while no subject finishes still show.
        now = time.monotonic()
        if now - self.last_log >= self.log_every_s:
            self.last_log = now
            done = sum(self.counts.values())
            self.bar.write(self._status_line(done, now - self.start))

    def _jobs_postfix(self) -> dict[str, str]:
        status = self.job_status
        if status is None:
            return {}
        return {"jobs running": str(status.running),
                "pending": f"{status.pending}{_held_by(status)}"}

    def __call__(self, result: SubjectResult) -> None:
        self.counts[result.status] += 1
        if result.failed:
            self.bar.write(f"FAILED {result.name} at {result.stage}: {result.reason}")
        if self.bar.shown:
            self.bar.advance(postfix=self.counts | self._jobs_postfix())
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
        jobs = ""
        if self.job_status is not None:
            status = self.job_status
            jobs = (f"; Slurm jobs: {status.running} running, {status.pending} pending"
                    f"{_held_by(status)}")
        return (f"mriprep run: {done}/{self.total} subjects done ({parts}), "
                f"{rate:.1f} subjects/min{eta}{jobs}")

    def close(self) -> None:
        self.bar.close()


def _held_by(status) -> str:
    """Why Slurm holds the pending jobs, as " (Priority)", or ""."""
    return f" ({status.pending_reason})" if status.pending_reason else ""


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
