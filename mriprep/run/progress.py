"""Live progress of a run: a bar on a terminal, periodic lines in a log or on a terminal
that reports no width."""

from __future__ import annotations

import time

from mriprep.core.progress import ProgressBar, duration
from mriprep.cache.run_report import STATUSES, SubjectResult


class ProgressReporter:
    """Shows progress: a tqdm bar on a terminal, else a plain line now and then: every
    ``log_every_s`` in a log, and on a terminal that reports no width (``docker exec
    -t``, ``script``) at the first subject, then every
    :data:`~mriprep.core.progress.LINE_EVERY_S`.

    Failures are printed as they happen in every mode; the bar shows done, failed,
    rate and time left, and on Slurm the jobs running and pending (:meth:`jobs`).
    """

    def __init__(self, total: int, stream=None, terminal: bool | None = None,
                 log_every_s: float = 30.0):
        self.total = total
        self.counts = {status: 0 for status in STATUSES}
        self.start = time.monotonic()
        self.last_log = self.start
        # Started here only as a bar: the plain lines are this reporter's own (counts by
        # status, Slurm jobs), on a terminal of no width as in a log.
        self.bar = ProgressBar("mriprep run", "subj", stream=stream, terminal=terminal)
        if self.bar.shown:
            self.bar.update_to(0, total)
        self.log_every_s = (min(log_every_s, self.bar.every_s) if self.bar.lines
                            else log_every_s)
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
        # A terminal shows the first subject's line at once: the rate and time left
        # appear without waiting a whole interval.
        first_on_terminal = self.bar.lines and done == 1
        if now - self.last_log >= self.log_every_s or done == self.total or first_on_terminal:
            self.last_log = now
            self.bar.write(self._status_line(done, now - self.start))

    def _status_line(self, done: int, elapsed: float) -> str:
        rate = done / elapsed * 60 if elapsed > 0 else 0.0
        left = (self.total - done) / (done / elapsed) if done and elapsed > 0 else None
        eta = f", about {duration(left)} left" if left is not None and done < self.total else ""
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

