"""The exit status of every ``mriprep`` command, defined once."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """0 success; 1 the work found problems (failed subjects, a failed check or split
    check, a manifest with problems); 2 a usage or configuration error; 130 interrupted
    (Ctrl-C), as shells report a SIGINT. 3 and 4 are left to the example training script
    (``examples/train_2p5d.py``: a value turned non-finite; no label maps to train on),
    so that a job script can tell them from these."""

    OK = 0
    PROBLEMS = 1
    USAGE = 2
    INTERRUPTED = 130
