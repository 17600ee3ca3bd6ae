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
