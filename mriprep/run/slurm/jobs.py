"""The run's Slurm jobs while it runs: how many, which died, and what became of them.

A :class:`JobBoard` ticks in a thread of the driver every :data:`TICK_S` seconds:

Scaling
    One job holds one subject at a time, so the run wants ``min(jobs, unfinished
    subjects)`` jobs. It asks for them at the start; as the cohort drains it cancels the
    jobs still queued and retires idle workers, so that no allocation idles through the
    last wave. dask's ``Adaptive`` is not used: it guesses from task durations, and it
    never replaces a job that died (the dead job's name stays in its plan), which is the
    one thing a long run on a shared cluster needs most.
Deaths
    The scheduler's ``remove-worker`` events name the subjects a leaving worker was
    running. Each such departure counts against the subject, whether Slurm killed the job
    (scancel, preemption, node failure, its memory limit) or the worker left at its
    walltime; only the board's own retirements of idle workers do not count. A subject is
    handed to another job, up to ``retries`` times; after that its future is cancelled and
    the subject is reported failed with each job's fate, read from Slurm (``scontrol``,
    or ``sacct`` where the job has left the controller).
Jobs that never start a worker
    A job that ends before its worker connects (a wrong ``setup`` line, a Python the
    nodes cannot see) is reported with its log file; when every job ends that way, the
    run stops with that log's last lines instead of resubmitting forever.
"""

from __future__ import annotations

import collections
import logging
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

TICK_S = 2.0
# squeue is asked about jobs that have not connected at most this often: a controller
# serving thousands of users should not be polled every tick.
SQUEUE_EVERY_S = 10.0
# Jobs that end before their worker connects, with no worker ever connected, that stop
# the run (or every job submitted, when fewer).
EARLY_ENDS_TO_STOP = 3
SLURM_TIMEOUT_S = 30
EVENT_WAIT_S = 5.0
# How long a dead worker's job may take to show how it ended (see settled_state).
FATE_SETTLE_S = 5.0
# Slurm's states of a job that no longer runs.
ENDED_STATES = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT"}
FATES = {
    "CANCELLED": "cancelled (scancel or an administrator)",
    "TIMEOUT": "reached its walltime",
    "PREEMPTED": "preempted by a higher-priority job",
    "NODE_FAIL": "lost its node",
    "OUT_OF_MEMORY": "exceeded its memory (raise --job-memory)",
    "FAILED": "failed",
    "BOOT_FAIL": "its node failed to boot",
    "DEADLINE": "passed its deadline",
    "COMPLETED": "ended",
}


@dataclass(frozen=True)
class JobStatus:
    """What the progress display shows of the jobs."""

    running: int
    pending: int
    news: tuple[str, ...] = ()
    # Why Slurm holds the pending jobs, as squeue says it ("Priority", "Resources").
    pending_reason: str = ""


@dataclass(frozen=True)
class Death:
    """One departure of a worker that was running a subject, with its fate in words,
    read once when it is counted."""

    job_id: str | None
    fate: str


def fate_of_departure(job_id: str | None, expected: bool) -> str:
    """What ended a worker: its own leaving at the lifetime (``expected``: WALLTIME_MARGIN_S
    before the walltime), else its job's fate in Slurm."""
    if expected:
        job = f"job {job_id}" if job_id else "its job"
        return (f"the worker of {job} left at the end of its walltime (--walltime: a "
                "subject must finish within it)")
    return describe_fate(job_id)


def slurm_state(job_id: str) -> tuple[str, str]:
    """(state, reason) of a job from Slurm, e.g. ("CANCELLED", "None"); ("", why) when
    Slurm no longer knows it."""
    try:
        shown = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)],
                               capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
        if shown.returncode == 0 and "JobState=" in shown.stdout:
            fields = dict(part.split("=", 1) for part in shown.stdout.split() if "=" in part)
            return fields.get("JobState", ""), fields.get("Reason", "")
        # Gone from the controller (MinJobAge): accounting may still have it.
        acct = subprocess.run(["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o",
                               "State,Reason"], capture_output=True, text=True,
                              timeout=SLURM_TIMEOUT_S)
        if acct.returncode == 0 and acct.stdout.strip():
            state, _, reason = acct.stdout.strip().splitlines()[0].partition("|")
            return state.split()[0], reason
        return "", (acct.stderr or shown.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", str(exc)


def settled_state(job_id: str, settle_s: float = FATE_SETTLE_S) -> tuple[str, str]:
    """:func:`slurm_state` once it says how the job ended. A killed worker is often gone
    before its job is: a cancelled job is COMPLETING for a moment (its processes being
    signalled), and one at its walltime may still show RUNNING."""
    deadline = time.monotonic() + settle_s
    while True:
        state, reason = slurm_state(job_id)
        if state not in ("COMPLETING", "RUNNING") or time.monotonic() > deadline:
            return state, reason
        time.sleep(0.5)


def describe_fate(job_id: str | None) -> str:
    """One job's fate in words: "job 12 was cancelled (scancel or an administrator)"."""
    if job_id is None:
        return "a job mriprep could not identify"
    state, reason = settled_state(job_id)
    if not state:
        return f"job {job_id} (Slurm no longer knows it)"
    if state in ("RUNNING", "COMPLETING"):
        return (f"job {job_id}, whose worker process died while the job lived on (dask's "
                "memory limit or a crash in a native library)")
    words = FATES.get(state, state.lower())
    return f"job {job_id} {'was ' if state in ('CANCELLED', 'PREEMPTED') else ''}{words}"


@dataclass
class JobBoard:
    """Scales the run's jobs, counts deaths per subject, reports them (see module doc)."""

    cluster: object            # dask_jobqueue.SLURMCluster
    client: object             # dask.distributed.Client
    max_jobs: int
    retries: int
    log_directory: Path
    on_status: Callable[[JobStatus], None] | None = None
    unfinished: int = 0
    error: str = ""
    deaths: dict[str, list[Death]] = field(default_factory=dict)
    _futures: dict[str, object] = field(default_factory=dict)
    _names: dict[str, str] = field(default_factory=dict)     # task key -> subject name
    _job_of: dict[str, str] = field(default_factory=dict)    # worker address -> job id
    _connected_jobs: set[str] = field(default_factory=set)
    _early_ends: dict[str, str] = field(default_factory=dict)  # job id -> state
    _retired: set[str] = field(default_factory=set)
    _news: list[str] = field(default_factory=list)
    _events: list[tuple[float, dict]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _counting: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _last_squeue: float = 0.0
    _pending_reason: str = ""

    # -- the run loop's side ------------------------------------------------------------
    def watch(self, futures: dict[str, object], names: dict[str, str]) -> None:
        """Start ticking over ``futures`` (task key -> future; ``names`` for messages)."""
        self._futures = dict(futures)
        self._names = dict(names)
        self.unfinished = len(futures)
        # Slurm fails a job whose log folder is missing; made only now, so that a run
        # refused before any work leaves no folder behind.
        self.log_directory.mkdir(parents=True, exist_ok=True)
        scheduler = getattr(self.cluster, "scheduler", None)
        if hasattr(scheduler, "add_plugin"):  # the scheduler runs in this process
            scheduler.add_plugin(_joined_workers_plugin(self))
        self.client.subscribe_topic("all", self._on_event)
        self._thread = threading.Thread(target=self._run, name="mriprep-slurm-jobs",
                                        daemon=True)
        self._thread.start()

    def done(self, key: str) -> None:
        self._futures.pop(key, None)
        self.unfinished = len(self._futures)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            self.client.unsubscribe_topic("all")
        except Exception:  # noqa: BLE001 - the client may be closing already
            pass

    def failure_reason(self, key: str) -> str:
        """Why a subject whose workers kept dying failed: every job's fate."""
        # The scheduler reports the subject failed before the event of the last death
        # reaches this process: wait a moment for it.
        deadline = time.monotonic() + EVENT_WAIT_S
        while True:
            self._take_events()
            deaths = self.deaths.get(key, [])
            if len(deaths) > self.retries or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        fates = "; ".join(d.fate for d in deaths) or "no job fate recorded"
        logs = sorted({self._log_of(d.job_id) for d in deaths if d.job_id})
        where = f"; the jobs' logs: {', '.join(logs)}" if logs else ""
        return (f"the Slurm job running this subject died {len(deaths)} time(s), more than "
                f"the {self.retries} retries allowed (--retries): {fates}{where}")

    # -- the ticking thread ---------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 - a hiccup must not stop the run
                log.warning("Slurm job bookkeeping failed this tick: %s", exc)

    def _tick(self) -> None:
        live = self._live_workers()
        self._take_events()
        self._cancel_exhausted()
        self._scale(live)
        pending = self._pending_jobs(live)
        if pending and time.monotonic() - self._last_squeue > SQUEUE_EVERY_S:
            self._last_squeue = time.monotonic()
            self._find_early_ends(pending)
        if self.on_status is not None:
            with self._lock:
                news, self._news = tuple(self._news), []
            waiting = len(set(pending.values()) - set(self._early_ends))
            self.on_status(JobStatus(running=len(live), pending=waiting, news=news,
                                     pending_reason=self._pending_reason if waiting else ""))

    def joined(self, address: str, name: str) -> None:
        """Record the job of a worker that just connected (its Job holds the id sbatch
        gave it; a dead job's name, reopened, names a new Job)."""
        if address in self._job_of:
            return
        job_id = getattr(_snapshot(self.cluster.workers).get(name), "job_id", None)
        if job_id:
            self._job_of[address] = str(job_id)
            self._connected_jobs.add(str(job_id))

    def _live_workers(self) -> dict[str, str]:
        """Connected workers, address -> name (and their jobs, where the scheduler's
        plugin could not record them)."""
        workers = dict(self.cluster.scheduler_info.get("workers", {}))
        live = {address: str(info.get("name")) for address, info in workers.items()}
        for address, name in live.items():
            self.joined(address, name)
        return live

    def _pending_jobs(self, live: dict[str, str]) -> dict[str, str]:
        """Submitted jobs whose worker has not connected: name -> job id."""
        names = set(live.values())
        return {name: str(job.job_id) for name, job in _snapshot(self.cluster.workers).items()
                if getattr(job, "job_id", None) and name not in names
                and str(job.job_id) not in self._connected_jobs}

    def _scale(self, live: dict[str, str]) -> None:
        desired = min(self.max_jobs, self.unfinished)
        planned = len(self.cluster.worker_spec)
        if desired >= planned:
            # Also reopens every job whose worker left (its name is still planned).
            self.cluster.scale(desired)
            return
        # Shrinking: scale() drops jobs without a worker first (queued or dead), and
        # never below the live workers, so it cancels no running subject.
        self.cluster.scale(max(desired, len(live)))
        surplus = len(live) - desired
        if surplus > 0:
            idle = [address for address, keys in self.client.processing().items()
                    if not keys and address in live][:surplus]
            if idle:
                self._retired.update(idle)
                self.client.retire_workers(workers=idle, close_workers=True)

    def _on_event(self, event) -> None:
        # Runs in the client's event loop: record only.
        with self._lock:
            self._events.append(event)

    def _take_events(self) -> None:
        # Both the ticking thread and the run loop (failure_reason) count deaths; the
        # event loop only appends, and must never wait on a death's Slurm lookup.
        with self._counting:
            with self._lock:
                events, self._events = self._events, []
            for _, msg in events:
                if isinstance(msg, dict) and msg.get("action") == "remove-worker":
                    self._count_death(msg)

    def _count_death(self, msg: dict) -> None:
        address = msg.get("worker", "")
        keys = tuple(k for k in msg.get("processing-tasks", ()) if k in self._names)
        if not keys or address in self._retired:
            return
        job_id = self._job_of.get(address)
        death = Death(job_id=job_id,
                      fate=fate_of_departure(job_id, bool(msg.get("expected"))))
        for key in keys:
            self.deaths.setdefault(key, []).append(death)
            count = len(self.deaths[key])
            if count <= self.retries:
                self._say(f"{death.fate} while running {self._names[key]}; it goes to "
                          f"another job (attempt {count + 1} of {self.retries + 1})")

    def _cancel_exhausted(self) -> None:
        for key, deaths in list(self.deaths.items()):
            future = self._futures.get(key)
            # The scheduler fails a subject itself when its workers were killed; a worker
            # that left gracefully (at its walltime) is counted only here.
            if future is not None and len(deaths) > self.retries and not future.done():
                future.cancel()

    def _find_early_ends(self, pending: dict[str, str]) -> None:
        ids = sorted(set(pending.values()) - set(self._early_ends))
        if not ids:
            return
        try:
            out = subprocess.run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o",
                                  "%i|%T|%r"], capture_output=True, text=True,
                                 timeout=SLURM_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return
        listed = [line.split("|") for line in out.stdout.splitlines() if line.count("|") == 2]
        states = {job_id: state for job_id, state, _ in listed}
        reasons = collections.Counter(reason for _, state, reason in listed
                                      if state == "PENDING" and reason not in ("", "None"))
        self._pending_reason = ", ".join(reason for reason, _ in reasons.most_common(2))
        # squeue lists every job it still knows; one it no longer knows ended long ago
        # (it says "Invalid job id" when it knows none of them).
        answered = out.returncode == 0 or "Invalid job id" in out.stderr
        for job_id in ids:
            state = states.get(job_id) or ("ENDED" if answered else "")
            if state in ENDED_STATES or state == "ENDED":
                self._early_ends[job_id] = state
                self._say(f"job {job_id} ended ({state}) before its dask worker connected; "
                          f"its log: {self._log_of(job_id)}")
        if self._connected_jobs:
            return
        submitted = len(_snapshot(self.cluster.workers))
        if len(self._early_ends) >= min(EARLY_ENDS_TO_STOP, max(1, submitted)):
            first = sorted(self._early_ends)[0]
            self.error = (
                f"{len(self._early_ends)} Slurm jobs ended before their dask worker "
                f"connected, and none connected: the workers cannot start on the nodes. "
                f"Job {first}'s log ({self._log_of(first)}) ends with:\n"
                f"{_tail(self._log_of(first))}\nCheck the profile's setup lines and that "
                "the Python running mriprep is on a file system the nodes see (--python)")
            for future in list(self._futures.values()):
                future.cancel()

    def _log_of(self, job_id: str) -> str:
        matches = sorted(self.log_directory.glob(f"*-{job_id}.err"))
        return str(matches[0]) if matches else str(self.log_directory / f"*-{job_id}.err")

    def _say(self, line: str) -> None:
        with self._lock:
            self._news.append(line)


def _joined_workers_plugin(board: JobBoard):
    """A scheduler plugin that hands each joining worker to the board at once, so that a
    worker killed within a tick of starting is still known by its job. (Built here:
    importing distributed at module level would slow every mriprep command.)"""
    from distributed.diagnostics.plugin import SchedulerPlugin

    class JoinedWorkers(SchedulerPlugin):
        name = "mriprep-slurm-jobs"

        def add_worker(self, scheduler, worker: str) -> None:
            state = scheduler.workers.get(worker)
            if state is not None:
                board.joined(worker, str(state.name))

    return JoinedWorkers()


def _snapshot(mapping) -> dict:
    """A copy of a dict another thread may be changing."""
    for _ in range(5):
        try:
            return dict(mapping)
        except RuntimeError:
            continue
    return {}


def _tail(path: str, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(the log could not be read)"
    return "\n".join(text.strip().splitlines()[-lines:])
