"""``mriprep run --scheduler slurm``: the cohort's subjects on Slurm jobs, one worker each.

- :mod:`~mriprep.run.slurm.profile`: what the run asks of Slurm (partition, account,
  walltime, memory, jobs, extra ``#SBATCH`` lines, set-up), from options or a YAML file;
- :mod:`~mriprep.run.slurm.cluster`: the dask-jobqueue ``SLURMCluster`` with the worker
  settings of a local run, checked with ``sbatch --test-only`` and cancelled on leaving;
- :mod:`~mriprep.run.slurm.jobs`: the jobs while the run lasts: scaled to the cohort,
  dead jobs replaced, their subjects resubmitted up to a limit, each death's fate read
  from Slurm.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from mriprep.run.slurm.jobs import JobBoard, JobStatus
from mriprep.run.slurm.profile import SlurmProfile, load_slurm_profile, validate_profile

__all__ = ["JobBoard", "JobStatus", "SlurmProfile", "load_slurm_profile", "slurm_client",
           "validate_profile"]


@contextlib.contextmanager
def slurm_client(profile: SlurmProfile, threads: int, log_directory: Path,
                 on_status=None):
    """(client, board) on a fresh ``SLURMCluster``; the board starts no job until the run
    hands it its futures (:meth:`JobBoard.watch`). Every job is gone on leaving."""
    from dask.distributed import Client

    from mriprep.run.slurm.cluster import slurm_cluster

    with slurm_cluster(profile, threads, log_directory) as cluster, \
            Client(cluster, set_as_default=False) as client:
        board = JobBoard(cluster=cluster, client=client, max_jobs=profile.jobs,
                         retries=profile.retries, log_directory=log_directory,
                         on_status=on_status)
        try:
            yield client, board
        finally:
            board.stop()
