"""The exceptions mriprep raises, in one small hierarchy.

Every message names the file (or subject), the offending value and what to do next, so
that a user reading one line of a cohort report can fix the input without a debugger.
Errors caused by the input subclass ``ValueError`` as well, like nibabel's.
"""

from __future__ import annotations

import re


class MriprepError(Exception):
    """Base of every error mriprep raises on purpose."""


class InputError(MriprepError, ValueError):
    """An input file or its header cannot be used as it is."""


class ImageReadError(InputError):
    """An image file is missing, empty, truncated, or not an image at all."""


class HeaderError(InputError):
    """An image header is inconsistent or describes an unusable volume."""


class ManifestError(InputError):
    """A cohort manifest has problems; ``problems`` lists every one with its row."""

    def __init__(self, path, problems: list[str]):
        self.path = str(path)
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(
            f"manifest {self.path} has {len(self.problems)} problem(s):\n{lines}"
        )


class PipelineConfigError(MriprepError, ValueError):
    """A pipeline definition is invalid (unknown key, wrong type, missing template)."""


class StageError(MriprepError, ValueError):
    """A subject cannot pass a stage: it is reported with this reason and never cached.

    ``metrics`` holds what the stage measured before it gave up, so that the report of a
    failed subject shows the values behind the reason.
    """

    def __init__(self, stage: str, reason: str, subject: str | None = None,
                 metrics: dict | None = None):
        self.stage = stage
        self.reason = reason
        self.subject = subject
        self.metrics = dict(metrics or {})
        where = f"subject {subject!r}, " if subject else ""
        super().__init__(f"{where}stage {stage!r}: {reason}")


class SchedulerError(MriprepError):
    """The requested dask scheduler cannot be used (bad name, unreachable address)."""


class CacheError(MriprepError):
    """The cache folder cannot be used (corrupt index, mixed pipelines, missing files)."""


# Messages name what to change in the words of the Python API (``session_id=``); the
# command line sets the same thing with a flag, and :func:`cli_words` rewrites one into
# the other when a command prints the message. A message never names both.
_PARAMETER_FLAGS = {
    "session_id=": "--session ",
    "native_path=": "--native ",
    "labels_desc=": "--labels-desc ",
    "labels=": "--labels ",
    "seg=": "--seg ",
    "absent_classes=": "--absent-classes ",
    "derived_dir=": "--derived-dir ",
    "folds=": "--folds ",
    "reassign=True": "--reassign",
    "exclude_flagged=": "--exclude-flagged ",
}
_PARAMETER = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, _PARAMETER_FLAGS)) + ")")


def cli_words(message: str) -> str:
    """``message`` with each Python parameter it names (``session_id=``) written as the
    command-line flag that sets it (``--session``)."""
    text = _PARAMETER.sub(lambda m: _PARAMETER_FLAGS[m.group(1)], str(message))
    return re.sub(r" +([),;])", r"\1", text)  # "--session )" -> "--session)"
