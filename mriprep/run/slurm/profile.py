"""What a run asks of Slurm: the jobs' resources, where they run and how they start.

A profile comes from ``mriprep run --scheduler slurm`` options, from a small YAML file
(``--slurm-profile FILE``), or both (the options win). Its keys are the field names below:

.. code-block:: yaml

    partition: cpubase_bycore_b1
    account: def-mylab
    walltime: "03:00:00"
    memory: 8GB              # per job: one subject at a time
    jobs: 64                 # at most this many jobs at once
    sbatch:                  # extra #SBATCH lines, as sbatch options
      - --constraint=cascade
    setup:                   # shell lines each job runs before its worker starts
      - module load StdEnv/2023 python/3.11
      - source ~/venvs/mriprep/bin/activate

Every value is checked here, before a job is submitted, with a message naming the key.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mriprep.core.errors import SchedulerError

# A worker running the default pipeline peaked at 0.59 GB on the demo people (`make
# bench`, runner); a 0.5 mm scan holds 8x the voxels before resampling, and Slurm kills a
# job above its memory at once, so the default leaves a wide margin.
DEFAULT_JOB_MEMORY = "4GB"
DEFAULT_WALLTIME = "02:00:00"
DEFAULT_MAX_JOBS = 16
# A subject whose job dies this many times more (walltime, preemption, scancel, node
# failure) is reported failed with its jobs' fates. Deaths by the subject's own fault
# (out of memory) repeat, so the limit stays small.
DEFAULT_RETRIES = 2
# Workers leave this long before their job's walltime, so that the subject they run is
# handed on by dask instead of being killed by Slurm mid-write.
WALLTIME_MARGIN_S = 300

_WALLTIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d\d))?(?::(\d\d))?$")


@dataclass(frozen=True)
class SlurmProfile:
    """The Slurm jobs of one run: each job runs one single-threaded dask worker."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    walltime: str = DEFAULT_WALLTIME
    memory: str = DEFAULT_JOB_MEMORY
    jobs: int = DEFAULT_MAX_JOBS
    sbatch: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    # The Python that starts the workers; by default the one running mriprep, which on a
    # cluster sits on the shared file system the nodes see.
    python: str | None = None
    # The network interface the workers reach the scheduler on (e.g. ib0).
    interface: str | None = None
    retries: int = DEFAULT_RETRIES
    # The jobs' stdout/stderr (default: CACHE/reports/slurm-jobs).
    log_directory: str | None = None
    # Each worker's scratch folder (default: dask's, in the job's working directory).
    local_directory: str | None = None
    # Where the profile was read from, for messages.
    source: str = field(default="command line", compare=False)

    @property
    def walltime_seconds(self) -> int:
        return walltime_seconds(self.walltime)

    def with_options(self, **options) -> "SlurmProfile":
        """This profile with every option that is not None replacing its value."""
        given = {k: v for k, v in options.items() if v is not None and v != ()}
        return validate_profile(dataclasses.replace(self, **given))


def walltime_seconds(text: str) -> int:
    """Slurm's walltime forms (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in seconds."""
    match = _WALLTIME.match(str(text).strip())
    if not match:
        raise SchedulerError(
            f"walltime {text!r} is not a Slurm time; write HH:MM:SS (e.g. 03:00:00) or "
            "D-HH:MM:SS (e.g. 1-12:00:00)")
    days, first, second, third = match.groups()
    if days is None:
        if second is None:
            return int(first) * 60                                   # MM
        if third is None:
            return int(first) * 60 + int(second)                     # MM:SS
        return int(first) * 3600 + int(second) * 60 + int(third)     # HH:MM:SS
    hours = int(first)
    return (int(days) * 86400 + hours * 3600 + int(second or 0) * 60 + int(third or 0))


def validate_profile(profile: SlurmProfile) -> SlurmProfile:
    """``profile`` with its values checked; a SchedulerError names the bad key."""
    from dask.utils import parse_bytes

    where = f"Slurm profile ({profile.source})"
    if profile.walltime_seconds <= WALLTIME_MARGIN_S:
        raise SchedulerError(
            f"{where}: walltime {profile.walltime} leaves no time to work: workers leave "
            f"{WALLTIME_MARGIN_S // 60} min before it; ask for at least 00:30:00")
    try:
        # A worker process alone (Python, dask, SimpleITK, ANTs) takes about 0.3 GB.
        if parse_bytes(profile.memory) < 500e6:
            raise ValueError("below 500 MB")
    except (ValueError, TypeError) as exc:
        raise SchedulerError(
            f"{where}: memory {profile.memory!r} per job is not usable ({exc}); write e.g. "
            f"4GB (a worker of the default pipeline peaks near 0.6 GB)") from None
    for name in ("jobs",):
        if not isinstance(getattr(profile, name), int) or getattr(profile, name) < 1:
            raise SchedulerError(f"{where}: {name} must be a whole number of 1 or more, "
                                 f"got {getattr(profile, name)!r}")
    if not isinstance(profile.retries, int) or profile.retries < 0:
        raise SchedulerError(f"{where}: retries must be a whole number of 0 or more, "
                             f"got {profile.retries!r}")
    for line in profile.sbatch:
        if not str(line).startswith("-"):
            raise SchedulerError(
                f"{where}: sbatch line {line!r} is not an sbatch option; write it as on "
                "the command line, e.g. --constraint=cascade or --gres=gpu:1")
    if profile.python and not Path(profile.python).is_absolute():
        raise SchedulerError(f"{where}: python {profile.python!r} must be an absolute path "
                             "that every node sees")
    return profile


def load_slurm_profile(path: str | os.PathLike) -> SlurmProfile:
    """A profile from a YAML file (keys: the :class:`SlurmProfile` fields)."""
    import yaml

    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise SchedulerError(f"cannot read the Slurm profile {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SchedulerError(f"Slurm profile {path} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise SchedulerError(f"Slurm profile {path} must be a mapping of keys such as "
                             f"partition: and walltime:, got {type(doc).__name__}")
    known = [f.name for f in dataclasses.fields(SlurmProfile) if f.name != "source"]
    unknown = sorted(set(doc) - set(known))
    if unknown:
        raise SchedulerError(f"Slurm profile {path}: unknown key(s) {', '.join(unknown)}; "
                             f"known keys: {', '.join(known)}")
    values = dict(doc)
    for key in ("sbatch", "setup"):
        if key in values:
            lines = values[key]
            if isinstance(lines, str):
                lines = [lines]
            if not isinstance(lines, list):
                raise SchedulerError(f"Slurm profile {path}: {key} must be a list of lines")
            values[key] = tuple(str(line) for line in lines)
    for key in ("walltime", "memory", "partition", "account", "qos", "python", "interface",
                "log_directory", "local_directory"):
        if values.get(key) is not None:
            values[key] = str(values[key])
    return validate_profile(SlurmProfile(**values, source=str(path)))
