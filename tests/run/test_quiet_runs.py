"""A run prints what matters and nothing of dask.distributed's, loaded or not: each failed
subject with its reason, a cluster that cannot start with distributed's reason, and
progress lines on a terminal that reports no size. distributed's own log goes to
CACHE/reports/distributed.log."""

from __future__ import annotations

import io
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from mriprep.run.progress import ProgressReporter
from mriprep.run.worker_setup import DistributedLogRoute
from tests.run.test_runner import (  # noqa: F401 - cohort is the runner tests' fixture
    CLI_BOOT,
    cohort,
    run,
    subprocess_env,
    write_pipeline,
)

# A line of distributed's logging format ("distributed.worker - ERROR - ...") or a
# traceback: what a user saw at the end of a loaded run.
NOISE = re.compile(r"Traceback|CommClosedError|distributed\.[\w.]+ - [A-Z]+ - ")


def _cli(cohort, cache, *extra, env=None, pipeline=None):
    return [sys.executable, "-c", CLI_BOOT, "run", str(cohort / "cohort.csv"), "-o",
            str(cache), "-p", str(pipeline or write_pipeline(cohort)), *extra]


@pytest.mark.calibration  # the late heartbeats slow the whole run down
def test_a_heartbeat_cut_by_the_close_is_not_shown_and_not_an_error(cohort, tmp_path):
    # The scheduler answers heartbeats late, as on a loaded machine: each worker closes
    # with one waiting, and before the fix both printed a 25-line ERROR traceback.
    env = subprocess_env() | {
        "DASK_DISTRIBUTED__SCHEDULER__PRELOAD": '["tests.run.slow_heartbeat"]'}
    cache = tmp_path / "cache"
    done = subprocess.run(_cli(cohort, cache, "--scheduler", "processes", "--workers", "2",
                               "--no-report"),
                          env=env, capture_output=True, text=True, timeout=180)
    said = done.stdout + done.stderr
    assert done.returncode == 1, said[-3000:]  # sub-04 and sub-08 are broken scans
    assert not NOISE.search(said), said[-3000:]
    # A failed subject still says why, as it happens and in the summary.
    assert "FAILED sub-04 at runner_test_zscore: constant image" in done.stderr
    assert "sub-08 at load:" in done.stdout
    log = (cache / "reports" / "distributed.log").read_text()
    assert re.search(r"distributed\.worker - INFO - Failed to communicate with scheduler "
                     r"during heartbeat: the worker was closing, which cut it "
                     r"\(CommClosedError", log), log[-3000:]
    assert " - ERROR - " not in log, log[-3000:]


@pytest.mark.calibration
def test_two_runs_at_once_on_busy_cores_print_nothing_of_distributed(cohort, tmp_path):
    # As users met it: two runs of local worker processes, with the QC report, on cores
    # that busy loops keep full. (On the 2-core test machine this alone did not make
    # the heartbeat traceback appear in 6 tries; the test above makes it certain.)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(min(cores, 8))]
    try:
        slow = write_pipeline(tmp_path, pause_s=0.2)
        procs = [subprocess.Popen(_cli(cohort, tmp_path / f"cache-{i}", "--scheduler",
                                       "processes", "--workers", "2", pipeline=slow),
                                  env=subprocess_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i in range(2)]
        outputs = [proc.communicate(timeout=600) for proc in procs]
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 1, err[-3000:]
        assert not NOISE.search(out + err), (out + err)[-3000:]
        assert "FAILED sub-04 at runner_test_zscore: constant image" in err
        assert "QC report:" in out


def test_a_cluster_whose_workers_cannot_start_says_why(cohort, tmp_path):
    env = subprocess_env() | {
        "DASK_DISTRIBUTED__WORKER__PRELOAD": '["tests.run.no_such_preload"]'}
    cache = tmp_path / "cache"
    done = subprocess.run(_cli(cohort, cache, "--scheduler", "processes", "--workers", "1",
                               "--no-report"),
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("mriprep run: error: the local dask cluster could not start its "
                           "1 worker process (RuntimeError: Nanny failed to start., because "
                           "of ModuleNotFoundError: No module named 'tests.run.no_such_"), last
    # The run failed before its cache folder was made, and leaves none behind (nor a
    # log in it to point at): the reason is in the message.
    assert not cache.exists() and "distributed's log" not in last


def test_the_route_keeps_distributed_off_the_terminal_and_in_the_file(tmp_path):
    stream = io.StringIO()
    terminal = logging.StreamHandler(stream)
    logger = logging.getLogger("distributed")
    logger.addHandler(terminal)
    try:
        route = DistributedLogRoute(tmp_path / "reports" / "distributed.log")
        logging.getLogger("distributed.worker").error("a worker's error")
        logging.getLogger("distributed.scheduler").info("a scheduler's news")
        route.close()
        logging.getLogger("distributed.worker").error("after the run")
    finally:
        logger.removeHandler(terminal)
    assert stream.getvalue() == "after the run\n"
    kept = (tmp_path / "reports" / "distributed.log").read_text().splitlines()
    assert [line.split(" - ", 2)[2] for line in kept] == [
        "distributed.worker - ERROR - a worker's error",
        "distributed.scheduler - INFO - a scheduler's news"]


def test_a_terminal_of_no_size_gets_the_runs_plain_lines(cohort, tmp_path, monkeypatch):
    import tqdm.std

    results = run(cohort, tmp_path / "cache").results
    monkeypatch.setattr(tqdm.std, "_screen_shape_wrapper", lambda: (lambda fp: (-1, -1)))
    stream = io.StringIO()
    progress = ProgressReporter(len(results), stream=stream, terminal=True)
    for result in results:
        progress(result)
    progress.close()
    text = stream.getvalue()
    assert "\r" not in text
    lines = [line for line in text.splitlines() if not line.startswith("FAILED")]
    # The first subject at once (rate and time left), then each 10 s, and the last.
    assert lines[0].startswith("mriprep run: 1/8 subjects done (")
    assert lines[-1].startswith("mriprep run: 8/8 subjects done (6 cached, 0 skipped, "
                                "2 failed)")


@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux `script`")
def test_mriprep_run_under_script_shows_progress_lines(cohort, tmp_path):
    # `script` gives the run a terminal of 0 x 0, which tqdm reads as -1 columns: before
    # the fix it drew an empty bar and printed no progress at all.
    command = shlex.join(_cli(cohort, tmp_path / "cache", "--scheduler", "threads",
                              "--workers", "2", "--no-report"))
    done = subprocess.run(["script", "-q", "-c", command, "/dev/null"],
                          stdin=subprocess.DEVNULL, env=subprocess_env(),
                          capture_output=True, text=True, timeout=180)
    said = done.stdout
    assert "mriprep run: 1/8 subjects done (" in said, said[-3000:]
    assert "mriprep run: 8/8 subjects done (6 cached, 0 skipped, 2 failed)" in said
    assert not re.search(r"\r(?!\n)", said), said[-3000:]  # the terminal's \r\n only
