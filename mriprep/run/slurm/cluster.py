"""A dask-jobqueue ``SLURMCluster`` with the worker settings mriprep's results depend on.

Each job runs one dask worker process with one task thread, as a local worker does, and
starts with the same environment (:func:`mriprep.run.worker_setup.worker_env`: ITK, ANTs
and BLAS pinned to the run's thread count, the allocator settings, NumPy's huge pages
off) and the same slowed diagnostics (:data:`~mriprep.run.worker_setup.QUIET_DASK_CONFIG`,
as ``DASK_*`` variables). The job asks Slurm for as many CPUs as the worker has ITK
threads. So a subject's tensors do not depend on where it ran: the Slurm test checks
them byte for byte against a local run.

The scheduler runs in the ``mriprep run`` process (the driver), with the local
cluster's rules: a worker holds only the subject it runs (saturation 1.0), and a subject
whose workers die more than ``retries`` times fails (``allowed-failures``).

Workers leave :data:`~mriprep.run.slurm.profile.WALLTIME_MARGIN_S` before their job's
walltime (dask's ``--lifetime``, staggered), so that Slurm's kill never lands on a
subject that is writing; the subject they ran is handed on, and the job board
(:mod:`mriprep.run.slurm.jobs`) starts a fresh job.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import shlex
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from mriprep.core.errors import SchedulerError
from mriprep.run.worker_setup import QUIET_DASK_CONFIG, dask_env_vars, worker_env
from mriprep.run.slurm.profile import WALLTIME_MARGIN_S, SlurmProfile

# Every run names its jobs mriprep-<8 hex>: the sweep on leaving cancels exactly its own.
JOB_NAME_PREFIX = "mriprep-"
# sbatch's answer to --test-only can take a while on a busy controller.
PREFLIGHT_TIMEOUT_S = 60


def missing_slurm_commands() -> list[str]:
    import shutil

    return [name for name in ("sbatch", "squeue", "scancel") if shutil.which(name) is None]


def scheduler_config(profile: SlurmProfile) -> dict[str, object]:
    """The dask config of the scheduler in the driver: the local cluster's rules."""
    return QUIET_DASK_CONFIG | {
        "distributed.scheduler.allowed-failures": profile.retries,
        "distributed.scheduler.worker-saturation": 1.0,
    }


def job_prologue(profile: SlurmProfile, threads: int) -> list[str]:
    """The job script's lines before the worker starts: the user's set-up, then the
    worker environment."""
    env = worker_env(threads) | dask_env_vars(QUIET_DASK_CONFIG)
    exports = [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    return list(profile.setup) + exports


def cluster_options(profile: SlurmProfile, threads: int, log_directory: Path,
                    job_name: str) -> dict:
    """Keyword arguments of ``SLURMCluster`` for ``profile``."""
    lifetime = profile.walltime_seconds - WALLTIME_MARGIN_S
    stagger = min(120, WALLTIME_MARGIN_S // 3)
    # The log lines are written here rather than through dask-jobqueue's log_directory,
    # which makes the folder at once: a run refused before any work must leave no folder.
    directives = [f"-o {log_directory}/{job_name}-%j.out",
                  f"-e {log_directory}/{job_name}-%j.err", *profile.sbatch]
    if profile.qos:
        directives.append(f"--qos={profile.qos}")
    options = dict(
        cores=1,
        processes=1,
        job_cpu=int(threads),
        memory=profile.memory,
        walltime=profile.walltime,
        queue=profile.partition,
        account=profile.account,
        job_name=job_name,
        job_extra_directives=directives,
        job_script_prologue=job_prologue(profile, threads),
        worker_extra_args=["--lifetime", f"{lifetime}s", "--lifetime-stagger", f"{stagger}s"],
        python=profile.python or sys.executable,
        interface=profile.interface,
        # Port 0: never collide with another run's dashboard on a shared login node.
        scheduler_options={"dashboard_address": ":0"},
        silence_logs="error",
    )
    if profile.local_directory:
        options["local_directory"] = profile.local_directory
    return options


def preflight(job_script: str, profile: SlurmProfile) -> None:
    """Ask Slurm whether it would take this job (``sbatch --test-only``), so that a wrong
    partition, account or walltime fails now with sbatch's own words, not as jobs that
    never start."""
    try:
        answer = subprocess.run(["sbatch", "--test-only"], input=job_script, text=True,
                                capture_output=True, timeout=PREFLIGHT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        logging.getLogger(__name__).warning(
            "sbatch --test-only gave no answer in %d s; submitting anyway", PREFLIGHT_TIMEOUT_S)
        return
    if answer.returncode != 0:
        said = (answer.stderr or answer.stdout).strip().replace("\n", "; ")
        raise SchedulerError(
            f"Slurm refuses the worker job of this run ({profile.source}): {said}. "
            "Check --partition, --account, --walltime and --job-memory (`sinfo -s` lists "
            "the partitions and their limits)")


def _import_slurm_cluster():
    """dask_jobqueue's SLURMCluster, leaving Ctrl-C as it was.

    Importing dask_jobqueue (its ``runner`` module) sets a SIGINT handler that calls
    ``sys.exit()``: an interrupted run would then exit 0, as if it had succeeded, instead
    of reporting the interruption (exit 130).
    """
    on_interrupt = signal.getsignal(signal.SIGINT)
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise SchedulerError(
            "--scheduler slurm needs dask-jobqueue: pip install 'mriprep[slurm]' "
            "(or pip install dask-jobqueue)") from None
    finally:
        if threading.current_thread() is threading.main_thread() and on_interrupt is not None:
            signal.signal(signal.SIGINT, on_interrupt)
    return SLURMCluster


@contextlib.contextmanager
def slurm_cluster(profile: SlurmProfile, threads: int, log_directory: Path):
    """A started ``SLURMCluster`` with no jobs yet; every job is cancelled on leaving,
    whatever ends the run (its end, an error, Ctrl-C)."""
    import dask

    missing = missing_slurm_commands()
    if missing:
        raise SchedulerError(
            f"--scheduler slurm needs Slurm's commands on this machine ({', '.join(missing)} "
            "not found): run mriprep on the cluster's login node")
    SLURMCluster = _import_slurm_cluster()
    job_name = JOB_NAME_PREFIX + uuid.uuid4().hex[:8]
    with dask.config.set(scheduler_config(profile)):
        try:
            cluster = SLURMCluster(**cluster_options(profile, threads, log_directory,
                                                     job_name))
        except (OSError, ValueError) as exc:
            raise SchedulerError(f"cannot start the dask scheduler for the Slurm jobs: "
                                 f"{exc}; set --interface to the network the nodes reach "
                                 "this machine on (e.g. ib0)") from exc
    try:
        preflight(cluster.job_script(), profile)
        yield cluster
    finally:
        try:
            cluster.close()
        finally:
            # dask-jobqueue cancels the jobs it tracks; a job it lost track of (submitted
            # as the run was interrupted) is found by this run's own job name.
            subprocess.run(["scancel", f"--name={job_name}", f"--user={getpass.getuser()}"],
                           capture_output=True, check=False, timeout=PREFLIGHT_TIMEOUT_S)
