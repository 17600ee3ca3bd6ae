"""Worker set-up (pinned thread pools, memory settings that keep stages steady) and
distributed's logging around a run's close."""

from __future__ import annotations

import platform
import resource
import subprocess
import sys
import textwrap

import pytest

from mriprep.run.scheduling import local_client
from mriprep.run.worker_setup import THREAD_ENV_VARS, worker_env

GLIBC = platform.libc_ver()[0] == "glibc"


def test_worker_env_pins_every_pool_and_sets_memory_behaviour():
    env = worker_env(3)
    assert {env[name] for name in THREAD_ENV_VARS} == {"3"}
    assert env["NUMPY_MADVISE_HUGEPAGE"] == "0"
    assert env["MALLOC_ARENA_MAX"] == "1" and env["MALLOC_MMAP_MAX_"] == "0"


def test_configure_worker_turns_off_huge_pages_in_a_running_process():
    # A fresh interpreter whose NumPy asks for huge pages, as one imported without
    # mriprep's environment does (a remote dask worker): configure_worker must turn that
    # off at run time.
    script = textwrap.dedent("""
        import os, numpy as np
        from mriprep.run.worker_setup import configure_worker
        core = getattr(np, "_core", None) or np.core
        set_madvise = core.multiarray._set_madvise_hugepage  # returns the old setting
        set_madvise(True)
        configure_worker(2)
        print(set_madvise(False), os.environ["OMP_NUM_THREADS"])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "2"]


def _page_faults_per_round() -> list[int]:
    """Minor page faults of this thread for each of four rounds that allocate, use and
    free two 256^3 float32 grids (a subject's worth of churn)."""
    import numpy as np

    from mriprep.run.worker_setup import configure_worker

    configure_worker(1)
    faults = []
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        grid = np.ones((256, 256, 256), np.float32)
        doubled = grid * 2
        del grid, doubled
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    return faults


@pytest.mark.skipif(not GLIBC, reason="the malloc settings are glibc's")
def test_a_local_worker_reuses_freed_grids_instead_of_faulting_them_in_again():
    # In the dask worker's task thread, where a thread arena would otherwise map and
    # unmap every grid: the first round faults the pages in, the next ones reuse them.
    with local_client(1) as client:
        faults = client.submit(_page_faults_per_round, pure=False).result()
    pages = 2 * 256**3 * 4 // resource.getpagesize()
    assert faults[0] > 0.5 * pages
    assert max(faults[1:]) < 0.02 * pages, faults


def _worker_diagnostics() -> dict:
    from distributed import get_worker

    worker = get_worker()
    return {"profiling": "profile" in worker.periodic_callbacks,
            **{name: worker.periodic_callbacks[name].callback_time
               for name in ("tick", "monitor", "memory_monitor")}}


def test_local_workers_run_dask_diagnostics_at_a_slow_pace():
    # The profiler and the 20 ms tick took the subjects' cores when every core runs a
    # worker; the nannies must hand the quiet config on to the worker processes.
    with local_client(1) as client:
        seen = client.submit(_worker_diagnostics, pure=False).result()
    assert seen == {"profiling": False, "tick": 1000, "monitor": 2000, "memory_monitor": 500}


def test_dask_env_vars_set_the_same_config_in_a_process_started_elsewhere():
    # The README's SLURM recipe exports these variables into each job.
    import json
    import os

    from mriprep.run.worker_setup import QUIET_DASK_CONFIG, dask_env_vars

    script = ("import dask, json, sys; "
              "print(json.dumps({k: dask.config.get(k) for k in json.loads(sys.argv[1])}))")
    env = dict(os.environ) | dask_env_vars(QUIET_DASK_CONFIG)
    out = subprocess.run([sys.executable, "-c", script, json.dumps(list(QUIET_DASK_CONFIG))],
                         capture_output=True, text=True, check=True, env=env).stdout
    assert json.loads(out) == QUIET_DASK_CONFIG



@pytest.fixture
def distributed_stream():
    """The stream handler distributed installs on its logger in a CLI process (not under
    pytest, whose root handler it defers to), writing into a buffer; removed after."""
    import io
    import logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("distributed")
    logger.addHandler(handler)
    yield handler, stream
    logger.removeHandler(handler)
    from mriprep.run.scheduling import _restore_distributed_logs

    _restore_distributed_logs()


def test_after_ctrl_c_distributed_logs_only_errors_until_the_next_run(
        distributed_stream, monkeypatch):
    # Ctrl-C: distributed's loop thread can log a cut connection after the cluster has
    # closed, under the run's one-line message; a run that ends normally changes nothing.
    import contextlib
    import logging

    import mriprep.run.scheduling as scheduling

    @contextlib.contextmanager
    def no_cluster(*args):
        yield None, None

    monkeypatch.setattr(scheduling, "_client_for", no_cluster)
    handler, stream = distributed_stream
    log = logging.getLogger("distributed.batched")
    with scheduling.scheduler_client("processes", 1, 1, True):
        pass
    assert handler.level == logging.NOTSET
    with pytest.raises(KeyboardInterrupt):
        with scheduling.scheduler_client("processes", 1, 1, True):
            raise KeyboardInterrupt
    log.info("Batched Comm Closed")
    log.error("a real error")
    assert "Batched Comm Closed" not in stream.getvalue()
    assert "a real error" in stream.getvalue()
    with scheduling.scheduler_client("sync", 1, 1, True):  # any next run, even local
        assert handler.level == logging.NOTSET
