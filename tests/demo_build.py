"""The demo cohort and its cache as the session fixtures share them, and their build in
the background while other tests run.

The demo cache is the costliest thing the suite builds (the cohort's synthetic people,
then the default pipeline over them: about a minute of both cores). Built on first use,
it held both xdist workers waiting; :func:`start_background_build` starts it in its own
process group as soon as a session knows it will need it, and the tests that need it run
last (``tests/conftest.py``), so the other tests keep the cores busy meanwhile. The
fixtures then only wait on :func:`tests.built_once.built_once_in`'s lock.

``python -m tests.demo_build FOLDER`` builds both into FOLDER, as the fixtures would;
``--cohort-only`` the cohort alone, for a session whose tests need no cache.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.built_once import built_once_in

if TYPE_CHECKING:
    from mriprep.demo import DemoCohort
    from mriprep.run.reports import RunResult

REPO_ROOT = Path(__file__).resolve().parents[1]
# Fixtures that need the demo build: a test that uses one is marked `demo`.
DEMO_FIXTURES = frozenset({"demo_cohort", "demo_cache", "conform_cache"})
STARTED = "demo_build.started"  # created by the one session that starts the build
LOG = "demo_build.log"


@dataclass(frozen=True)
class DemoCache:
    """The demo cohort preprocessed by the default pipeline: the cache folder, the run,
    and each of its files' checksum as the build left it (what every test that clones it
    must leave unchanged: ``tests/check/test_check.py``)."""

    path: Path
    run: "RunResult"
    checksums: dict[str, str]


def demo_cohort_in(base: Path) -> "DemoCohort":
    """The full demo cohort (seed 0), built once in ``base``."""
    from mriprep.demo import build_demo_cohort

    return built_once_in(base, "demo_cohort", lambda folder: build_demo_cohort(folder, seed=0))


def demo_cache_in(base: Path) -> DemoCache:
    """The demo cohort through ``t1w_mni_rigid`` with 2 worker processes, built once."""
    cohort = demo_cohort_in(base)

    def build(folder: Path) -> DemoCache:
        from mriprep.pipelines import load_pipeline
        from mriprep.run.cohort import cohort_rows, run_cohort
        from tests.cache_clone import file_checksums

        root = folder / "cache"
        run = run_cohort(refusals_first(cohort_rows(cohort.manifest), cohort.subjects), root,
                         load_pipeline("t1w_mni_rigid"), scheduler="processes", workers=2,
                         manifest=cohort.manifest)
        return DemoCache(path=root, run=run, checksums=file_checksums(root))

    return built_once_in(base, "demo_cache", build)


def refusals_first(rows: list, truth: dict) -> list:
    """``rows`` with the scans a check must refuse by a named cause first, the others in
    manifest order. Registration tries other starts before it refuses a scan, so those
    are the cohort's longest subjects: started last, one ran alone for a minute after
    the rest were done (docs/development.md, "Tests and limits")."""
    refused = {(s["subject_id"], s["session_id"] or "") for s in truth.values()
               if s["expected_causes"]}
    return sorted(rows, key=lambda row: (row.subject_id, row.session_id or "") not in refused)


def start_background_build(base: Path, cache: bool = True) -> subprocess.Popen | None:
    """Start ``python -m tests.demo_build base`` (the cohort alone unless ``cache``)
    unless a session of this run already did; returns the process this call started
    (None otherwise)."""
    try:
        os.close(os.open(base / STARTED, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return None
    env = dict(os.environ)
    env.pop("PYTEST_XDIST_WORKER", None)
    with open(base / LOG, "w") as log:
        command = [sys.executable, "-m", "tests.demo_build", str(base)]
        return subprocess.Popen(command + ([] if cache else ["--cohort-only"]),
                                cwd=REPO_ROOT, env=env, stdout=log, stderr=log,
                                start_new_session=True)


def stop_background_build(process: subprocess.Popen) -> None:
    """End the build and the processes it spawned if it is still running (a session
    that stopped early, ``-x``); its half-built folder is rebuilt by whoever asks next."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


if __name__ == "__main__":
    # Through the module's own name: the pickled DemoCache must be tests.demo_build's.
    from tests.demo_build import demo_cache_in as build_cache
    from tests.demo_build import demo_cohort_in as build_cohort

    (build_cohort if "--cohort-only" in sys.argv[2:] else build_cache)(Path(sys.argv[1]))
