"""What this process may use of the machine, for sizing worker pools."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity where the OS has one (a Slurm
    job's allocation, a container's cpuset), else every core."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def process_context():
    """The multiprocessing start method for a pool of worker processes: forked when this
    process runs no other thread (the command line), since a forked worker starts in
    milliseconds; spawned otherwise, since a fork copies other threads' locks in whatever
    state they are (a training process with dask or loader threads), and a spawned
    worker imports what it needs, torch included, in seconds."""
    import multiprocessing
    import threading

    method = "fork" if threading.active_count() == 1 and os.name == "posix" else "spawn"
    return multiprocessing.get_context(method)


def default_process_workers(limit: int = 4) -> int:
    """Worker processes for CPU-bound work beside the calling one: one core is left to
    it, at most ``limit`` (more only adds memory)."""
    return max(1, min(limit, usable_cores() - 1))
