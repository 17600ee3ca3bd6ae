"""Where the subjects of a run execute: dask schedulers and native thread pools.

Schedulers
----------
``processes`` (default)
    A ``dask.distributed.LocalCluster`` of single-threaded worker processes, one per
    core. Chosen over dask's multiprocessing scheduler because a worker that dies (a
    segfault in a native library, the OOM killer) costs only the subject it was running,
    reported as a failure, where a broken multiprocessing pool aborts the whole run; and
    because it is the same code path as a remote cluster.
``threads`` / ``sync``
    dask's local threaded or single-threaded scheduler in this process (debugging, or
    machines where spawning processes is not allowed).
``slurm``
    Slurm jobs of one worker each, submitted, scaled and cancelled by the run itself
    (:mod:`mriprep.run.slurm`), with the same worker settings as the local cluster.
``tcp://HOST:PORT`` (any address with ``://``)
    A running ``dask.distributed`` scheduler (``dask scheduler`` + ``dask worker``). The
    workers need mriprep installed and the input files and cache folder at the same paths.

Every worker pins ITK, ANTs and BLAS to a fixed thread count (1 by default): parallelism
comes from subjects, and a fixed count keeps registration reproducible. Workers also keep
their freed memory for the next subject and stop NumPy from asking for transparent huge
pages: both cut page-fault stalls that cost as much as the stages (see
:func:`mriprep.run.worker_setup.configure_worker`). A local cluster runs dask's own
diagnostics at a slow pace (:data:`~mriprep.run.worker_setup.QUIET_DASK_CONFIG`), so that
they do not take the subjects' cores.
"""

from __future__ import annotations

import contextlib
import logging
import os

from mriprep.core.errors import SchedulerError
from mriprep.run.interrupt import WORKER_PRELOAD
from mriprep.run.worker_setup import (
    DISTRIBUTED_LOG_ENV,
    MALLOC_ENV,
    NUMPY_HUGEPAGE_ENV,
    QUIET_DASK_CONFIG,
    DistributedLogRoute,
    worker_env,
)

SCHEDULERS = ("processes", "threads", "sync", "slurm")
LOCAL_RETRIES = 1


@contextlib.contextmanager
def scheduler_client(scheduler: str, workers: int, threads: int = 1, needed: bool = True,
                     *, slurm=None, slurm_logs=None, on_jobs=None, log_path=None):
    """(client, board): a dask.distributed Client for ``scheduler`` (None for dask's
    local schedulers) and, on Slurm, the :class:`~mriprep.run.slurm.JobBoard` that runs
    its jobs (else None).

    ``processes`` starts a private LocalCluster (only when ``needed``), ``slurm`` a
    SLURMCluster for the profile ``slurm`` whose job logs go to ``slurm_logs``, an
    address connects to a running scheduler; ``threads`` and ``sync`` need no client.

    distributed's log, of this process and of a local cluster's workers, goes to
    ``log_path`` (made at its first line) and not to the terminal while the client
    lives (:class:`~mriprep.run.worker_setup.DistributedLogRoute`); without a
    ``log_path`` the terminal still shows its errors.

    Raises
    ------
    SchedulerError
        An unknown scheduler name, an unreachable address, a profile Slurm refuses, a
        local cluster whose workers cannot start.
    """
    _restore_distributed_logs()  # an interrupted run before this one quieted them
    if scheduler in ("threads", "sync") or (scheduler in ("processes", "slurm")
                                            and not needed):
        yield None, None
        return
    if scheduler not in ("processes", "slurm") and "://" not in scheduler:
        raise SchedulerError(
            f"unknown scheduler {scheduler!r}; use one of {', '.join(SCHEDULERS)} or the "
            "address of a running dask scheduler such as tcp://127.0.0.1:8786"
        )
    # Off the terminal for the whole life of the client, its close included: a worker
    # closing under load cuts its heartbeat (logged as an ERROR with a traceback), and
    # closing after Ctrl-C can cut a connection in the middle of a write (logged with
    # its traceback at INFO, under the run's one-line interruption message).
    # After Ctrl-C the terminal shows distributed's errors, and nothing else, until the
    # next run: the event loop's thread outlives the cluster, and a write that the
    # shutdown cut can fail, and be logged, after the close returned.
    route = DistributedLogRoute(log_path)
    interrupted = False
    try:
        with _client_for(scheduler, workers, threads, slurm, slurm_logs, on_jobs,
                         log_path) as pair:
            try:
                yield pair
            except KeyboardInterrupt:
                interrupted = True
                raise
    finally:
        if interrupted:
            route.errors_only()
            _QUIETED.append(route)
        else:
            route.close()


# The routes of interrupted runs, whose terminal filter stays until the next run.
_QUIETED: list[DistributedLogRoute] = []


def _restore_distributed_logs() -> None:
    while _QUIETED:
        _QUIETED.pop().close()


@contextlib.contextmanager
def _client_for(scheduler, workers, threads, slurm, slurm_logs, on_jobs, log_path):
    if scheduler == "processes":
        with local_client(workers, threads, log_path) as client:
            yield client, None
    elif scheduler == "slurm":
        from pathlib import Path

        from mriprep.run.slurm import SlurmProfile, slurm_client

        with slurm_client(slurm or SlurmProfile(), threads, Path(slurm_logs),
                          on_status=on_jobs) as (client, board):
            yield client, board
    else:
        client = connect(scheduler)
        try:
            yield client, None
        finally:
            client.close()


@contextlib.contextmanager
def local_client(workers: int, threads: int = 1, log_path=None):
    """A Client on a private LocalCluster: ``workers`` single-threaded processes, whose
    distributed log goes to ``log_path`` (see :func:`scheduler_client`).

    Raises
    ------
    SchedulerError
        The workers cannot start, with distributed's reason.
    """
    import dask
    from dask.distributed import Client, LocalCluster

    # A subject that kills its worker (OOM, segfault) is retried once, then reported:
    # such crashes are nearly always deterministic, and each retry restarts a worker.
    # A worker holds only the subject it is running (saturation 1.0, no queued task):
    # when one subject kills its worker, no innocent neighbour is blamed for the crash.
    # Allocator and NumPy variables only work when set before the worker process starts:
    # dask's pre-spawn environment, on top of the one dask sets itself.
    # dask's diagnostics are slowed down (QUIET_DASK_CONFIG); the nannies hand this
    # config on to their workers.
    # Each worker process ignores Ctrl-C (mriprep.run.interrupt): the run closes them.
    pre_spawn = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
    preload = list(dask.config.get("distributed.worker.preload", []) or [])
    config = QUIET_DASK_CONFIG | {
        "distributed.worker.preload": preload + [WORKER_PRELOAD],
        "distributed.scheduler.allowed-failures": LOCAL_RETRIES,
        "distributed.scheduler.worker-saturation": 1.0,
        "distributed.nanny.pre-spawn-environ": pre_spawn | MALLOC_ENV | NUMPY_HUGEPAGE_ENV,
    }
    env = worker_env(threads)
    if log_path is not None:
        env[DISTRIBUTED_LOG_ENV] = str(log_path)
    with contextlib.ExitStack() as stack:
        stack.enter_context(dask.config.set(config))
        try:
            cluster = stack.enter_context(LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                # Port 0: never collide with another cluster's dashboard on this machine.
                dashboard_address="127.0.0.1:0",
                silence_logs=logging.ERROR,
                env=env,
            ))
        except Exception as exc:  # noqa: BLE001 - distributed raises RuntimeError and more
            raise SchedulerError(_no_start(workers, exc, log_path)) from exc
        yield stack.enter_context(Client(cluster, set_as_default=False))


def _no_start(workers: int, exc: BaseException, log_path) -> str:
    """Why a local cluster did not start, from the first cause distributed chained."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    why = f"{type(exc).__name__}: {exc}"
    if root is not exc:
        why += f", because of {type(root).__name__}: {root}"
    log = (f"; distributed's log: {log_path}" if log_path is not None
           and os.path.exists(log_path) else "")
    return (f"the local dask cluster could not start its {workers} worker process"
            f"{'' if workers == 1 else 'es'} ({why}){log}; fix that, or run with "
            "--scheduler threads")


def connect(address: str, timeout_s: float = 20.0):
    """A dask.distributed Client for a running scheduler, or a clear SchedulerError."""
    from dask.distributed import Client

    try:
        return Client(address, timeout=timeout_s, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise SchedulerError(
            f"cannot reach the dask scheduler at {address} ({exc}); start one with "
            "`dask scheduler` and workers with `dask worker ADDRESS`, or check the address"
        ) from exc
