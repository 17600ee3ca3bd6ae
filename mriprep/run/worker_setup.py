"""How a process is set up to run subjects: native thread pools pinned, freed memory kept,
no huge-page requests, dask's diagnostics slowed, distributed's log kept off the terminal.

Local workers start with :func:`worker_env` and :data:`QUIET_DASK_CONFIG`
(:mod:`mriprep.run.scheduling`); Slurm jobs get the same through their job script
(:mod:`mriprep.run.slurm.cluster`, :func:`dask_env_vars`); every task calls
:func:`configure_worker`, because a worker of a remote cluster may have been started
without them.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import logging
import os
from pathlib import Path

# Environment variables read by the native libraries the stages use. Workers are started
# with them set, and each task sets them again because a remote worker may not be.
THREAD_ENV_VARS = (
    "ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)
# NumPy asks for transparent huge pages (madvise) on every array of 4 MiB or more. Where
# the kernel's THP defrag setting is "madvise" (the default of most distributions), each
# such allocation may stall in direct memory compaction once the page cache is full of
# written entries: a subject allocates and frees a dozen 256^3 arrays, and on the
# benchmark machine the resample stage then took 0.05-0.25 s instead of a steady 0.08 s.
# Ordinary pages cost a little more per pass (sanitize 0.09 -> 0.11 s) and never stall.
NUMPY_HUGEPAGE_ENV = {"NUMPY_MADVISE_HUGEPAGE": "0"}
# glibc serves every allocation above 32 MiB (a 256^3 float32 grid is 64 MiB) with its own
# mmap and returns it to the kernel on free, so each of the dozen big arrays a subject
# allocates is faulted in page by page again. On the benchmark VM that churn cost more
# than the work: a 256^3 entry's three np.save calls took 0.31 s after it and 0.085 s
# with the memory kept. Workers therefore take large arrays from the heap (no mmap) and
# keep up to this much freed memory for the next subject: RSS stays at the largest
# subject's peak instead of breathing, and the peak itself does not change.
MALLOC_KEEP_BYTES = 1 << 30
# The same, for a process's start: dask runs tasks in a pool thread, and a thread's own
# malloc arena maps every large array whatever mallopt says, so worker processes also
# get one arena (the main one, which follows the settings). Set in the environment,
# because a thread keeps the arena it first used.
MALLOC_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(MALLOC_KEEP_BYTES),
}
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8  # mallopt parameters (malloc.h)
# dask.distributed's diagnostics wake up often in every worker, every nanny and the
# scheduler: the statistical profiler walks every thread's stack each 10 ms, the
# event-loop watchdog ticks each 20 ms, the system monitor samples each 500 ms, and the
# memory monitor (a worker's spill and pause checks, its nanny's limit) runs each 100 ms.
# With one worker per core no core is left for them, so they took it from the subjects:
# in a 2-worker run of the demo cohort (17 s) the task threads waited 1.8-2.2 s in the
# run queue, and 0.4 s with these values. mriprep reads none of the diagnostics (the
# dashboard's profile and plots); memory is still checked twice a second, so a runaway
# worker is still paused or stopped.
QUIET_DASK_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.worker.memory.monitor-interval": "500ms",
}

def worker_env(threads: int = 1) -> dict[str, str]:
    """The environment a worker process starts with: every native thread pool pinned to
    ``threads``, freed memory kept for reuse by one malloc arena, NumPy's huge-page
    requests off."""
    pools = {name: str(int(threads)) for name in THREAD_ENV_VARS}
    return pools | MALLOC_ENV | NUMPY_HUGEPAGE_ENV


_configured_threads: int | None = None


def configure_worker(threads: int = 1) -> None:
    """Set up this process to run subjects: ITK (SimpleITK, ANTs) and BLAS thread pools
    pinned to ``threads``, freed memory kept for reuse (:data:`MALLOC_KEEP_BYTES`) and no
    huge-page requests from NumPy (:data:`NUMPY_HUGEPAGE_ENV`).

    Idempotent and cheap after the first call: every task calls it, because a worker of
    a remote cluster may have been started without the environment variables, and NumPy
    reads its variable only when it is imported.
    """
    global _configured_threads
    if _configured_threads == threads:
        return
    # Only the thread pools' variables: libraries loaded later still read them. The
    # allocator's and NumPy's are read at process start; they are set below by call.
    os.environ.update({name: str(int(threads)) for name in THREAD_ENV_VARS})
    import numpy as np
    import SimpleITK as sitk
    from threadpoolctl import threadpool_limits

    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(int(threads))
    # Libraries already loaded ignore the variables above; threadpoolctl reaches them.
    threadpool_limits(limits=int(threads))
    # The switch NumPy itself calls at import for NUMPY_MADVISE_HUGEPAGE (private, so
    # looked up: a NumPy without it just keeps its default).
    core = getattr(np, "_core", None) or np.core  # NumPy 2 renamed core to _core
    multiarray = getattr(core, "multiarray", None)
    set_madvise = getattr(multiarray, "_set_madvise_hugepage", None)
    if set_madvise is not None:
        set_madvise(False)
    keep_freed_memory()
    _configured_threads = threads


def keep_freed_memory(keep_bytes: int = MALLOC_KEEP_BYTES) -> bool:
    """Make glibc's malloc reuse freed memory for large arrays (see
    :data:`MALLOC_KEEP_BYTES`); True when it took the settings, False elsewhere (macOS,
    musl: their allocators keep their own policies).

    At run time this reaches the main arena and threads started afterwards; a thread
    that already has an arena of its own keeps mapping large arrays, which is why
    worker processes are started with :data:`MALLOC_ENV` as well.
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return all([mallopt(_M_MMAP_MAX, 0), mallopt(_M_TRIM_THRESHOLD, keep_bytes),
                mallopt(_M_ARENA_MAX, 1)])


def dask_env_vars(config: dict[str, object]) -> dict[str, str]:
    """``config`` as the ``DASK_...`` environment variables that set it in a process
    started elsewhere (a SLURM job's worker), e.g. ``DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL``."""
    return {
        "DASK_" + key.upper().replace(".", "__").replace("-", "_"): str(value)
        for key, value in config.items()
    }


# distributed's log of a run goes to this file of the cache's reports folder, from the run's
# process and from its local workers (which find the path in this environment variable),
# and not to the terminal: a run says what matters itself (each failed subject with its
# reason, a cluster that cannot start with distributed's reason), and distributed's own
# lines there were noise. The worst of it: a worker that closes at the end of a run while
# a heartbeat waits for a busy scheduler's answer cuts that heartbeat's connection, and
# distributed logs the CommClosedError, with its 25-line traceback, as an ERROR.
DISTRIBUTED_LOG_NAME = "distributed.log"
DISTRIBUTED_LOG_ENV = "MRIPREP_DISTRIBUTED_LOG"
PENDING_RECORDS = 1000
_HEARTBEAT_CUT = "Failed to communicate with scheduler during heartbeat"


class DistributedLogFile(logging.Handler):
    """distributed's records at INFO and above, appended to ``path``
    (``CACHE/reports/distributed.log``).

    The run's cache folder is made after its cluster starts, and a run that fails
    before (a Slurm partition that does not exist) must leave no folder behind: until
    the cache folder exists, records wait in memory (the last :data:`PENDING_RECORDS`),
    and are written with the first record after it appears; a run that never makes it
    writes none.

    Not a ``logging.StreamHandler``: distributed's ``silence_logs`` resets the level of
    every stream handler of its logger while a cluster runs, and this file keeps all.
    """

    def __init__(self, path: str | os.PathLike):
        super().__init__(logging.INFO)
        self.path = Path(path)
        self._file = None
        self._pending: collections.deque[str] = collections.deque(maxlen=PENDING_RECORDS)
        self._dropped = 0
        self.setFormatter(logging.Formatter(
            "%(asctime)s - pid %(process)d - %(name)s - %(levelname)s - %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            with self.lock:
                if self._file is None:
                    if not self.path.parent.parent.is_dir():  # no cache folder yet
                        self._dropped += len(self._pending) == self._pending.maxlen
                        self._pending.append(text)
                        return
                    self.path.parent.mkdir(exist_ok=True)
                    self._file = open(self.path, "a", encoding="utf-8")
                    if self._dropped:
                        self._file.write(f"({self._dropped} earlier records dropped: more "
                                         f"than {PENDING_RECORDS} came before the cache "
                                         "folder was made)\n")
                    while self._pending:
                        self._file.write(self._pending.popleft() + "\n")
                self._file.write(text + "\n")
                self._file.flush()
        except Exception:  # noqa: BLE001 - logging's own convention for a failed emit
            self.handleError(record)

    def close(self) -> None:
        with self.lock:
            if self._file is not None:
                self._file.close()
                self._file = None
        super().close()


class _Below(logging.Filter):
    """Passes the records at ``level`` or above: ``inf`` drops them all."""

    def __init__(self, level: float):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


class DistributedLogRoute:
    """distributed's records of this process kept off the terminal (its stream handlers
    drop them) and written to ``path`` (:class:`DistributedLogFile`) while open.

    :meth:`close` undoes both; :meth:`errors_only` lets the terminal show errors again
    and nothing else (after Ctrl-C, until the next run: see
    :func:`mriprep.run.scheduling.scheduler_client`).
    """

    def __init__(self, path: str | os.PathLike | None):
        # Importing distributed sets up its logger and stream handler, which would
        # replace or escape a route made before.
        import distributed  # noqa: F401

        self.logger = logging.getLogger("distributed")
        # Every record off the terminal; without a file to keep them, errors still show.
        self.gate = _Below(float("inf") if path is not None else logging.ERROR)
        self.terminals = [h for h in self.logger.handlers
                          if isinstance(h, logging.StreamHandler)
                          and not isinstance(h, logging.FileHandler)]
        for handler in self.terminals:
            handler.addFilter(self.gate)
        self.file = DistributedLogFile(path) if path is not None else None
        if self.file is not None:
            self.logger.addHandler(self.file)

    def errors_only(self) -> None:
        self.gate.level = logging.ERROR
        self._drop_file()

    def close(self) -> None:
        for handler in self.terminals:
            handler.removeFilter(self.gate)
        self._drop_file()

    def _drop_file(self) -> None:
        if self.file is not None:
            self.logger.removeHandler(self.file)
            self.file.close()
            self.file = None


class _ClosingHeartbeat(logging.Filter):
    """A heartbeat that the worker's own close cut (it closes its connections while one
    waits for the scheduler's answer) is logged as INFO, with its one-line reason: the
    worker's results are in, nothing failed."""

    def __init__(self, worker):
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        from distributed.core import Status

        closing = (Status.closing, Status.closing_gracefully, Status.closed)
        if (isinstance(record.msg, str) and record.msg.startswith(_HEARTBEAT_CUT)
                and getattr(self.worker, "status", None) in closing):
            reason = record.exc_info[1] if record.exc_info else None
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = (f"{_HEARTBEAT_CUT}: the worker was closing, which cut it "
                          f"({type(reason).__name__}: {reason}); not an error")
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


def route_worker_logs(worker) -> DistributedLogRoute | None:
    """In a local worker process (its preload, :func:`mriprep.run.interrupt.dask_setup`):
    distributed's records to the run's log file (:data:`DISTRIBUTED_LOG_ENV`), none to
    the terminal, a heartbeat cut by the worker's close as INFO. A worker started
    without the variable (not by ``mriprep run``) is left as it is."""
    path = os.environ.get(DISTRIBUTED_LOG_ENV)
    if not path:
        return None
    logging.getLogger("distributed.worker").addFilter(_ClosingHeartbeat(worker))
    return DistributedLogRoute(path)
