"""Ctrl-C during `mriprep run`: one line saying how many subjects are cached and kept
and that the same command resumes, exit 130, and no traceback, from the run or (on the
local cluster, which a terminal signals as a whole foreground group) from its worker
processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from mriprep.cache import Cache
from mriprep.cli import main
from mriprep.run.interrupt import RunInterrupted
from mriprep.stages import StageOutput, stage
from tests.run.test_runner import CLI_BOOT, cohort, subprocess_env, write_pipeline  # noqa: F401


@dataclass(frozen=True)
class CtrlCParams:
    subject: str = ""


@stage("interrupt_test_ctrl_c", CtrlCParams)
def _ctrl_c(volume, params):
    if volume.subject_id == params.subject:
        raise KeyboardInterrupt  # what Ctrl-C raises in the process running the subject
    return StageOutput(volume)

INTERRUPTED = re.compile(r"mriprep run: interrupted: (\d+) of 8 subjects cached and kept "
                         r"\((\d+) by this run, 0 before it\); run the same command again to "
                         r"resume \(it skips them\)")


def test_ctrl_c_in_process_indexes_what_finished_and_says_one_line(cohort, tmp_path,  # noqa: F811
                                                                    capsys):
    cache_root = tmp_path / "cache"
    pipeline = write_pipeline(tmp_path, extra="  - interrupt_test_ctrl_c: {subject: sub-06}\n")
    code = main(["run", str(cohort / "cohort.csv"), "-o", str(cache_root), "-p",
                 str(pipeline), "--scheduler", "sync", "--no-report"])
    err = capsys.readouterr().err
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    [said] = [line for line in err.splitlines() if "interrupted" in line]
    kept = INTERRUPTED.fullmatch(said)
    assert kept and err.rstrip().endswith(said), err
    # sub-06 is reached after the others the sync scheduler ran: they are indexed.
    assert int(kept.group(1)) == len(Cache(cache_root).entries()) >= 1


@pytest.mark.slow  # a process cluster's start and stop: about 10 s on 2 cores
def test_ctrl_c_says_one_line_keeps_what_finished_and_exits_130(cohort, tmp_path):  # noqa: F811
    cache_root = tmp_path / "cache"
    # 2 s a subject: the run outlasts the poll below even on a loaded 2-core machine
    # (at 1 s, a full `make test` once saw all 8 subjects finish before the signal).
    slow = write_pipeline(tmp_path, pause_s=2.0)
    cmd = [sys.executable, "-c", CLI_BOOT, "run", str(cohort / "cohort.csv"), "-o",
           str(cache_root), "-p", str(slow), "--scheduler", "processes", "--workers", "2",
           "--no-report"]
    proc = subprocess.Popen(cmd, env=subprocess_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    entries = cache_root / "entries"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if entries.exists() and any(p.name != ".tmp" for p in entries.iterdir()):
            break
        time.sleep(0.05)
    time.sleep(0.3)  # let the driver collect it: one subject is kept at least
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the run and its workers
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    for noise in ("Traceback", "KeyboardInterrupt", "Nanny", "Error"):
        assert noise not in err, err[-3000:]
    said = [line for line in err.splitlines() if "interrupted" in line]
    assert len(said) == 1 and err.rstrip().endswith(said[0]), err[-3000:]
    kept = INTERRUPTED.fullmatch(said[0])
    assert kept, said[0]
    assert int(kept.group(1)) == len(Cache(cache_root).entries()) >= 1


def test_the_message_counts_what_is_kept():
    stop = RunInterrupted(cached=2, skipped=3, total=9)
    assert isinstance(stop, KeyboardInterrupt)  # a caller that knows nothing of it stops
    assert stop.message.startswith("interrupted: 5 of 9 subjects cached and kept "
                                   "(2 by this run, 3 before it)")
