"""``--scheduler slurm``: profiles and job scripts, then runs on a real single-node Slurm.

The Slurm tests start munged, slurmctld and slurmd on this machine (tests/slurm_cluster.py)
and skip, saying how to enable them, where Slurm is not installed or the tests do not run
as root; ``.ci/run`` installs Slurm, so in CI they run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mriprep.cache import Cache
from mriprep.cli import main
from mriprep.core.errors import SchedulerError
from mriprep.pipelines import load_pipeline
from mriprep.run.cohort import cohort_rows, run_cohort
from mriprep.run.progress import ProgressReporter
from mriprep.run.worker_setup import QUIET_DASK_CONFIG, dask_env_vars, worker_env
from mriprep.run.slurm import JobStatus, SlurmProfile, load_slurm_profile
from mriprep.run.slurm.cluster import _import_slurm_cluster, cluster_options
from mriprep.run.slurm.profile import walltime_seconds

from tests.run.test_runner import (  # noqa: F401 - cohort is a fixture
    CLI_BOOT, REPO_ROOT, cohort, statuses, subprocess_env, write_pipeline)
from tests.slurm_cluster import missing_slurm, start_slurm

# One xdist worker runs this module (make test's --dist loadgroup), so that the module's
# single-node Slurm starts once.
pytestmark = pytest.mark.xdist_group("slurm")

# Worker jobs import the test stages (tests.run.test_runner) from the checkout.
TEST_SETUP = (f"export PYTHONPATH={REPO_ROOT}",)
# Timing fields of an entry's sidecar: the only bytes two runs of one subject may differ in.
TIMING_KEYS = {"seconds", "level_seconds"}


# -- profiles and job scripts (no Slurm needed) ---------------------------------------------

@pytest.mark.parametrize("text, seconds", [
    ("45", 45 * 60), ("30:15", 30 * 60 + 15), ("03:00:00", 3 * 3600),
    ("1-12", 36 * 3600), ("1-12:30", 36 * 3600 + 1800), ("2-00:00:10", 2 * 86400 + 10),
])
def test_walltime_reads_every_slurm_form(text, seconds):
    assert walltime_seconds(text) == seconds


def test_profile_file_is_read_checked_and_overridden_by_options(tmp_path):
    path = tmp_path / "narval.yaml"
    path.write_text("partition: cpu\naccount: def-lab\nwalltime: '03:00:00'\nmemory: 8GB\n"
                    "jobs: 64\nsbatch: --constraint=cascade\nsetup:\n  - module load python\n")
    profile = load_slurm_profile(path)
    assert (profile.partition, profile.account, profile.jobs) == ("cpu", "def-lab", 64)
    assert profile.sbatch == ("--constraint=cascade",) and profile.setup == ("module load python",)
    assert profile.with_options(jobs=8, account=None).jobs == 8
    assert profile.with_options(jobs=8, account=None).account == "def-lab"

    path.write_text("partiton: cpu\n")
    with pytest.raises(SchedulerError, match="unknown key.*partiton.*known keys: partition"):
        load_slurm_profile(path)
    for bad, message in [("walltime: '3h'", "not a Slurm time"),
                         ("walltime: '00:04:00'", "leaves no time"),
                         ("memory: 100MB", "memory '100MB' per job"),
                         ("sbatch: [constraint=x]", "not an sbatch option"),
                         ("retries: -1", "retries must be")]:
        path.write_text(bad + "\n")
        with pytest.raises(SchedulerError, match=message):
            load_slurm_profile(path)


def test_slurm_options_with_another_scheduler_are_refused(cohort, tmp_path, capsys):
    code = main(["run", str(cohort / "cohort.csv"), "-o", str(tmp_path / "c"),
                 "--partition", "cpu", "--jobs", "4"])
    assert code == 2
    assert "--jobs, --partition only apply with --scheduler slurm" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_job_script_gives_each_job_the_workers_settings_of_a_local_run(tmp_path):
    import signal

    before = signal.getsignal(signal.SIGINT)
    SLURMCluster = _import_slurm_cluster()
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C still interrupts

    profile = SlurmProfile(partition="cpu", account="def-lab", walltime="01:00:00",
                           memory="8GB", sbatch=("--constraint=cascade",),
                           setup=("module load python/3.11",), qos="normal")
    options = cluster_options(profile, threads=2, log_directory=tmp_path,
                              job_name="mriprep-test")
    with SLURMCluster(**options) as cluster:
        script = cluster.job_script()
    lines = script.splitlines()
    for wanted in ("#SBATCH -p cpu", "#SBATCH -A def-lab", "#SBATCH --cpus-per-task=2",
                   "#SBATCH -t 01:00:00", "#SBATCH --constraint=cascade",
                   "#SBATCH --qos=normal", "#SBATCH -J mriprep-test",
                   "module load python/3.11"):
        assert wanted in lines, (wanted, script)
    # One worker process with one task thread; ITK/BLAS get the run's 2 threads.
    worker = next(line for line in lines if "distributed.cli.dask_worker" in line)
    assert "--nthreads 1" in worker and "--nworkers" not in worker  # one process
    assert "--lifetime 3300s" in worker  # 5 min before the walltime
    exported = dict(line[len("export "):].split("=", 1) for line in lines
                    if line.startswith("export "))
    assert exported == worker_env(2) | dask_env_vars(QUIET_DASK_CONFIG)
    # The user's set-up comes first: it may activate the environment the worker needs.
    assert lines.index("module load python/3.11") < min(
        i for i, line in enumerate(lines) if line.startswith("export "))


def test_progress_shows_the_jobs_and_their_news():
    import io

    stream = io.StringIO()
    progress = ProgressReporter(total=4, stream=stream, terminal=False, log_every_s=0.0)
    progress.jobs(JobStatus(running=3, pending=5, pending_reason="Priority",
                            news=("job 12 was cancelled while running sub-01",)))
    text = stream.getvalue()
    assert "mriprep run: job 12 was cancelled while running sub-01" in text
    assert "Slurm jobs: 3 running, 5 pending (Priority)" in text


def test_job_board_counts_each_departure_against_its_subject_and_cancels_past_the_limit(
        tmp_path):
    from mriprep.run.slurm.jobs import JobBoard

    class Future:
        cancelled = False

        def done(self):
            return self.cancelled

        def cancel(self):
            self.cancelled = True

    board = JobBoard(cluster=None, client=None, max_jobs=4, retries=1,
                     log_directory=tmp_path)
    future = Future()
    board._futures, board._names = {"k7": future}, {"k7": "sub-07", "k8": "sub-08"}
    board._retired.add("tcp://idle:1")
    # A worker the board retired itself (idle, at the tail) costs no subject anything.
    board._count_death({"action": "remove-worker", "worker": "tcp://idle:1",
                             "processing-tasks": {"k8"}, "expected": True})
    assert board.deaths == {}
    # A worker leaving at its walltime counts: a subject longer than the walltime would
    # otherwise be handed on forever.
    board._count_death({"action": "remove-worker", "worker": "tcp://a:1",
                             "processing-tasks": {"k7"}, "expected": True})
    assert board._news == ["the worker of its job left at the end of its walltime "
                           "(--walltime: a subject must finish within it) while running "
                           "sub-07; it goes to another job (attempt 2 of 2)"]
    board._cancel_exhausted()
    assert not future.cancelled
    board._count_death({"action": "remove-worker", "worker": "tcp://b:1",
                             "processing-tasks": {"k7", "unrelated"}, "expected": True})
    board._cancel_exhausted()
    assert future.cancelled and len(board._news) == 1  # no "attempt 3 of 2"
    reason = board.failure_reason("k7")
    assert reason.startswith("the Slurm job running this subject died 2 time(s), more than "
                             "the 1 retries allowed (--retries)")
    assert reason.count("left at the end of its walltime") == 2


# -- a real single-node Slurm ---------------------------------------------------------------

@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = missing_slurm()
    if why:
        pytest.skip(why)
    cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.stop()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


class Canceller:
    """Scancels one running job ``after_s`` seconds after every job's worker has
    connected (so that each holds a subject): pass :meth:`jobs` as the run's on_jobs."""

    def __init__(self, slurm, jobs: int, after_s: float):
        self.slurm, self.jobs_wanted, self.after_s = slurm, jobs, after_s
        self.connected = threading.Event()
        self.cancelled: list[str] = []
        self.news: list[str] = []
        self.thread = threading.Thread(target=self._cancel, daemon=True)
        self.thread.start()

    def jobs(self, status) -> None:
        self.news.extend(status.news)
        if status.running >= self.jobs_wanted:
            self.connected.set()

    def _cancel(self) -> None:
        if not self.connected.wait(300):
            return
        time.sleep(self.after_s)
        running = [job for job, state in self.slurm.jobs() if state == "RUNNING"]
        if running:
            subprocess.run(["scancel", running[0]], check=True)
            self.cancelled.append(running[0])


def _sidecar_without_timings(path: Path):
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMING_KEYS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(path.read_text()))


# Demo subjects of both outcomes: cached (1 mm, and thick slices with a NaN blob), one on
# each job, and failed (a dead volume, a truncated file). Every registration costs the
# jobs' cores (which are this machine's) several seconds: a refusal by registration is a
# failure like these to the scheduler, and a third cached subject adds nothing the two
# do not show.
SLURM_SUBJECTS = ("sub-01", "sub-02", "sub-09", "sub-10")


@pytest.mark.slow
def test_demo_cohort_on_slurm_equals_the_local_run_though_a_job_is_cancelled(
        demo_cohort, demo_cache, slurm, tmp_path):
    # Two jobs on this two-core node; one is cancelled while it registers a subject.
    rows = [r for r in cohort_rows(demo_cohort.manifest) if r.subject_id in SLURM_SUBJECTS
            and not r.session_id]
    assert {r.subject_id for r in rows} == set(SLURM_SUBJECTS)
    canceller = Canceller(slurm, jobs=slurm.cpus, after_s=3.0)
    run = run_cohort(
        rows, tmp_path / "cache",
        load_pipeline("t1w_mni_rigid"), scheduler="slurm",
        slurm=SlurmProfile(jobs=slurm.cpus, walltime="00:30:00", memory="2GB"),
        manifest=demo_cohort.manifest, report=False, on_jobs=canceller.jobs,
    )
    canceller.thread.join(5)
    assert canceller.cancelled, "the jobs' workers never all connected"
    job = canceller.cancelled[0]
    assert any(f"job {job} was cancelled" in line and "attempt 2 of 3" in line
               for line in canceller.news), canceller.news
    # Every subject cached or reported, exactly as locally: the cancelled one was redone.
    local_results = [r for r in demo_cache.run.results
                     if r.subject_id in SLURM_SUBJECTS and not r.session_id]
    assert statuses(run) == {r.subject_id: r.status for r in local_results}
    assert {r.reason for r in run.failed} == {r.reason for r in local_results if r.failed}
    assert {r.status for r in run.results} == {"cached", "failed"}
    local, remote = Cache(demo_cache.path), Cache(tmp_path / "cache")
    local_index = {key: record for key, record in local.read_index().items()
                   if (record["subject_id"], record.get("session_id") or "")
                   in {(s, "") for s in SLURM_SUBJECTS}}
    assert remote.read_index().keys() == local_index.keys()
    for key, record in local_index.items():
        assert remote.read_index()[key]["files"] == record["files"]
        for path in sorted((local.entries_dir / key).iterdir()):
            twin = remote.entries_dir / key / path.name
            if path.suffix == ".json":
                assert _sidecar_without_timings(twin) == _sidecar_without_timings(path)
            else:
                assert twin.read_bytes() == path.read_bytes(), path.name
    worker_hosts = {r.worker for r in run.results if r.worker}
    assert worker_hosts and str(os.getpid()) not in {w.rsplit(":", 1)[-1] for w in worker_hosts}
    assert slurm.jobs() == [] or all(state != "RUNNING" for _, state in slurm.jobs())


@pytest.mark.slow
def test_a_subject_whose_job_dies_past_the_retries_fails_with_the_jobs_fate(
        cohort, slurm, tmp_path):
    # Three good subjects of 3 s each on two jobs (one on a one-core node); one job is
    # cancelled mid-subject.
    lines = (cohort / "cohort.csv").read_text().splitlines()
    manifest = tmp_path / "three.csv"
    manifest.write_text("\n".join(lines[:4]) + "\n")
    rows = cohort_rows(manifest)
    rows = [dataclasses.replace(r, image=cohort / r.image.name,
                                label=cohort / r.label.name) for r in rows]
    jobs = min(2, slurm.cpus)
    canceller = Canceller(slurm, jobs=jobs, after_s=1.0)
    run = run_cohort(
        rows, tmp_path / "cache", load_pipeline(write_pipeline(tmp_path, pause_s=3.0)),
        scheduler="slurm",
        slurm=SlurmProfile(jobs=jobs, walltime="00:30:00", memory="1GB", retries=0,
                           setup=TEST_SETUP),
        report=False, on_jobs=canceller.jobs,
    )
    canceller.thread.join(5)
    cancelled = canceller.cancelled
    killed = [r for r in run.failed if r.stage == "worker"]
    assert len(killed) == 1, [(r.subject_id, r.stage, r.reason) for r in run.results]
    reason = killed[0].reason
    assert f"job {cancelled[0]} was cancelled" in reason and "0 retries allowed" in reason
    assert "slurm-jobs" in reason  # the job's log file is named
    # The other subjects are cached, and only they.
    others = {r.subject_id for r in run.results} - {killed[0].subject_id}
    assert all(r.status == "cached" for r in run.results if r.subject_id in others)
    assert sorted(r.subject_id for r in Cache(tmp_path / "cache").entries()) == sorted(others)


@pytest.mark.slow
def test_ctrl_c_cancels_every_job_and_keeps_what_finished(cohort, slurm, tmp_path):
    cache_root = tmp_path / "cache"
    cmd = [sys.executable, "-c", CLI_BOOT, "run", str(cohort / "cohort.csv"), "-o",
           str(cache_root), "-p", str(write_pipeline(tmp_path, pause_s=2.0)),
           "--scheduler", "slurm", "--jobs", "2", "--job-memory", "1GB", "--walltime",
           "00:30:00", "--setup", TEST_SETUP[0], "--no-report"]
    proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _entry_folders(cache_root):
        time.sleep(0.2)
    # A folder renamed into place is a result the run receives a moment later (longer on
    # a loaded machine); each subject then pauses 2 s, so the jobs still run.
    time.sleep(1.0)
    assert [state for _, state in slurm.jobs()].count("RUNNING") >= 1
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    [said] = [line for line in err.splitlines() if "interrupted" in line]
    assert "cached and kept" in said and "run the same command again" in said
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(
            state in ("RUNNING", "PENDING") for _, state in slurm.jobs()):
        time.sleep(0.5)
    assert not any(state in ("RUNNING", "PENDING") for _, state in slurm.jobs())
    # What finished before the interruption is indexed and verifies.
    cache = Cache(cache_root)
    refs = cache.entries()
    assert refs and all(cache.has_entry(r.key, verify=True) for r in refs)


def _entry_folders(cache_root: Path) -> list[Path]:
    entries = cache_root / "entries"
    return [p for p in entries.iterdir() if p.name != ".tmp"] if entries.exists() else []


@pytest.mark.slow
def test_a_partition_slurm_does_not_have_fails_before_any_job(cohort, slurm, tmp_path,
                                                              capsys):
    code = main(["run", str(cohort / "cohort.csv"), "-o", str(tmp_path / "cache"),
                 "--scheduler", "slurm", "--partition", "no-such-partition"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Slurm refuses the worker job" in err and "invalid partition" in err.lower()
    assert not (tmp_path / "cache").exists()
    assert slurm.jobs() == []


def _sbatch_and_wait(slurm, args: list[str], cwd: Path, env: dict) -> tuple[str, str]:
    """Submit a batch script, wait for its end; (job id, exit code as Slurm shows it)."""
    out = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, env=env,
                         capture_output=True, text=True, check=True)
    job = out.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], env=env,
                               capture_output=True, text=True).stdout
        fields = dict(p.split("=", 1) for p in shown.split() if "=" in p)
        if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return job, fields.get("ExitCode", "")
        time.sleep(1)
    raise AssertionError(f"batch job {job} did not end in 300 s:\n{slurm.logs()}")


@pytest.mark.slow
def test_training_script_checks_the_cache_first_then_trains_one_fold_per_task(
        demo_cohort, demo_cache, slurm, tmp_path):
    import csv

    from tests.cache_clone import clone_cache

    # The README's 4-GPU script on this node's CPUs: its GPU lines overridden.
    script = REPO_ROOT / "examples" / "train_4gpu.sbatch"
    folds = min(2, slurm.cpus)  # one task per fold, one core each
    cpu_node = [f"--ntasks={folds}", "--cpus-per-task=1", "--gpus-per-task=0"]
    short = ["--epochs", "1", "--steps-per-epoch", "2", "--val-slices", "4",
             "--batch-size", "2"]
    env = os.environ | {"MRIPREP_VENV": sys.prefix}

    # The demo cache holds its planted leak: the check stops the job before training.
    gate_log = tmp_path / "gate.out"
    _, code = _sbatch_and_wait(slurm, [*cpu_node, f"--output={gate_log}", str(script),
                                       str(demo_cache.path), str(demo_cohort.manifest),
                                       *short], cwd=REPO_ROOT, env=env)
    assert code == "1:0", gate_log.read_text()[-3000:]
    assert "duplicate-input" in gate_log.read_text()
    assert "train_2p5d:" not in gate_log.read_text()

    # Without the leaking copy, two folds train at once, one per task.
    cache = clone_cache(demo_cache.path, tmp_path / "cache", drop_subjects=["sub-11"])
    cached = {(e.subject_id, e.session_id) for e in cache.entries()}
    with open(demo_cohort.manifest, newline="") as fh:
        rows = [r for r in csv.DictReader(fh)
                if (r["subject_id"], r.get("session_id") or "") in cached]
    sound = tmp_path / "sound.csv"
    with open(sound, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        here = demo_cohort.manifest.parent
        writer.writerows(dict(r, image=str(here / r["image"]),
                              label=str(here / r["label"]) if r["label"] else "")
                         for r in rows)
    fold_manifest = tmp_path / "folds.csv"
    assert main(["splits", str(sound), "--folds", "2", "-o", str(fold_manifest),
                 "--no-hash"]) == 0
    log = tmp_path / "train.out"
    job, code = _sbatch_and_wait(slurm, [*cpu_node, f"--output={log}", f"--chdir={tmp_path}",
                                         str(script), str(cache.root), str(fold_manifest),
                                         *short],
                                 cwd=REPO_ROOT, env=env)
    text = log.read_text()
    assert code == "0:0", text[-3000:]
    assert "OK: 0 error(s)" in text
    assert text.count("train_2p5d: ") >= folds and "1 loader workers" in text
    for fold in range(1, folds + 1):
        history = json.loads((tmp_path / f"fold-{fold}-{job}.json").read_text())
        assert len(history["loss"]) == 2 and all(v == v for v in history["loss"])
