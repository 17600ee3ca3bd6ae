"""Session fixtures built once per test run, however many xdist workers run the tests.

``make test`` runs the suite on every core with pytest-xdist, and each worker is a
process with its own session: without this, every worker would preprocess the demo
cohort again.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock


def shared_folder(tmp_path_factory) -> Path:
    """The run's temp folder that every xdist worker of this run sees."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the folder all workers of this run share
    return base


def built_once(tmp_path_factory, name: str, build: Callable[[Path], Any]) -> Any:
    """``build(folder)``, run once per test run whatever the number of xdist workers."""
    return built_once_in(shared_folder(tmp_path_factory), name, build)


def built_once_in(base: Path, name: str, build: Callable[[Path], Any]) -> Any:
    """``build(base / name)``, run once whoever asks first (a worker or the background
    build of :mod:`tests.demo_build`).

    The first to ask builds in ``<base>/<name>/`` and pickles the returned value beside
    it; the others wait on the lock and unpickle it. A build that raises leaves nothing,
    so each one that asks raises too (the same error, reported per test). Tests only
    read what a shared fixture built (a test that changes a cache changes a clone,
    ``tests/cache_clone.py``).
    """
    record = base / f"{name}.pickle"
    with FileLock(str(base / f"{name}.lock")):
        if record.exists():
            return pickle.loads(record.read_bytes())
        folder = base / name
        shutil.rmtree(folder, ignore_errors=True)  # what a build that raised left
        folder.mkdir()
        value = build(folder)
        record.write_bytes(pickle.dumps(value))
        return value
