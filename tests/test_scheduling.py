"""Worker set-up: pinned thread pools and the memory settings that keep stages steady."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from mriprep.scheduling import THREAD_ENV_VARS, worker_env


def test_worker_env_pins_every_pool_and_turns_off_numpy_huge_pages():
    env = worker_env(3)
    assert {env[name] for name in THREAD_ENV_VARS} == {"3"}
    assert env["NUMPY_MADVISE_HUGEPAGE"] == "0"


def test_configure_worker_applies_the_settings_in_a_running_process():
    # A fresh interpreter whose NumPy asks for huge pages, as one imported without
    # mriprep's environment does (a remote dask worker): configure_worker must turn that
    # off at run time.
    script = textwrap.dedent("""
        import os, numpy as np
        from mriprep.scheduling import configure_worker, keep_freed_memory
        set_madvise = np._core.multiarray._set_madvise_hugepage  # returns the old setting
        set_madvise(True)
        configure_worker(2)
        print(set_madvise(False), os.environ["OMP_NUM_THREADS"], keep_freed_memory())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.split()
    # glibc (this Linux CI) takes the malloc settings; other C libraries say no.
    assert out == ["False", "2", "True"]
