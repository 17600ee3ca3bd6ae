"""Ctrl-C during a run: one line, exit 130, and nothing lost that finished.

Three pieces:

* :class:`RunInterrupted`, what :func:`mriprep.run.cohort.run_cohort` raises once the
  subjects that finished are indexed and the scheduler is closed: how many subjects are
  kept, so that ``mriprep run`` can say so in one line and that rerunning resumes;
* :func:`interrupts_ignored`, which keeps a second Ctrl-C from breaking the clean-up
  (indexing, closing workers, cancelling Slurm jobs) into a traceback;
* :func:`dask_setup`, a dask worker preload (:data:`WORKER_PRELOAD`): a terminal sends
  Ctrl-C to every process of its foreground group, local worker processes included, and
  each would print its own ``KeyboardInterrupt`` traceback ("Process Dask Worker process
  (from Nanny)"). Workers ignore it instead; the run stops them when it closes its
  cluster. Slurm's workers run in jobs, outside the terminal's process group.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

WORKER_PRELOAD = "mriprep.run.interrupt"  # this module, as dask imports it in a worker


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C after indexing what finished: ``cached`` subjects written
    by this run and ``skipped`` ones already cached are kept, of ``total``."""

    def __init__(self, cached: int, skipped: int, total: int):
        self.cached, self.skipped, self.total = cached, skipped, total
        super().__init__(self.message)

    @property
    def message(self) -> str:
        kept = self.cached + self.skipped
        return (f"interrupted: {kept} of {self.total} subject{'' if self.total == 1 else 's'} "
                f"cached and kept ({self.cached} by this run, {self.skipped} before it); "
                "run the same command again to resume (it skips them)")


@contextlib.contextmanager
def interrupts_ignored() -> Iterator[None]:
    """Ignore Ctrl-C inside (in the main thread, the only one signals reach), and restore
    the handler after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def dask_setup(worker: Any = None) -> None:
    """dask's preload hook, run in each local worker process at its start: ignore
    Ctrl-C (see the module docstring), and send distributed's log to the run's log file
    rather than the terminal (:func:`mriprep.run.worker_setup.route_worker_logs`). The
    asyncio loop of a nanny's worker runs in the process's main thread, where a handler
    may be set; elsewhere nothing changes."""
    from mriprep.run.worker_setup import route_worker_logs

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    route_worker_logs(worker)
