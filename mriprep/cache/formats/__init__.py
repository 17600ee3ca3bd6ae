"""How a tensor of an entry is stored: one module per storage format, and the registry
that the cache, the check, the maintenance commands and the Dataset go through.

The choice is a pipeline's ``compression`` (``none``, ``lz4``, ``zstd``, for every tensor
or per tensor); the file's suffix says which format it is in, so a reader needs nothing
else. Every format keeps what the entry's record promises: the dtype and shape, C order,
no pickle, and an XXH3-128 checksum of the file's bytes.

* :mod:`~mriprep.cache.formats.base`: what a format must do (:class:`TensorFormat`).
* :mod:`~mriprep.cache.formats.npy`: the plain ``.npy`` (``none``), memory-mapped.
* :mod:`~mriprep.cache.formats.blosc2`: blosc2 ``.b2nd`` (``lz4``, ``zstd``).

A new format is one module: a :class:`TensorFormat` subclass (``suffix``, ``choices``,
``write`` and ``open``), registered with :func:`register_format`; a pipeline can then
name its choice, the runner writes it, ``mriprep check`` verifies it and ``MRIDataset``
reads it, with no edit anywhere else (``tests/cache/test_format_plugin.py`` does just
that). Its choices enter the pipeline hash like the shipped ones. A registration lives
in the process that made it: worker processes (dask's, a DataLoader's) must import the
format's module too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from mriprep.cache.formats.base import FileScan, RowSink, StartScan, TensorFormat
from mriprep.cache.formats.blosc2 import Blosc2Format
from mriprep.cache.formats.npy import NpyFormat, npy_checksum, npy_header
from mriprep.core.errors import CacheError

# The choice of an entry that names none: the plain ``.npy``. It is left out of a
# tensor's record and of the pipeline hash, so that caches made before compression
# existed keep their records and keys.
DEFAULT_CHOICE = "none"

_FORMATS: list[TensorFormat] = []
_BY_CHOICE: dict[str, TensorFormat] = {}
# The formats longest suffix first, so that ``.nii.b2nd`` would win over ``.b2nd``: kept
# with the registry, since every tensor of every Dataset item asks for its format.
_BY_SUFFIX_LENGTH: list[TensorFormat] = []


def _sort_by_suffix() -> None:
    _BY_SUFFIX_LENGTH[:] = sorted(_FORMATS, key=lambda f: len(f.suffix), reverse=True)


def register_format(fmt: TensorFormat) -> TensorFormat:
    """Make ``fmt`` a storage format: its choices become values of a pipeline's
    ``compression``, its suffix a file that every reader opens with it. Returns ``fmt``.

    Raises ValueError for a suffix or a choice another format has already.
    """
    if not fmt.suffix.startswith(".") or not fmt.choices:
        raise ValueError(f"format {type(fmt).__name__} needs a suffix starting with '.' and "
                         f"at least one choice; it has {fmt.suffix!r} and {fmt.choices!r}")
    for other in _FORMATS:
        taken = set(fmt.choices) & set(other.choices)
        if other.suffix == fmt.suffix or taken:
            what = f"suffix {fmt.suffix}" if other.suffix == fmt.suffix else \
                f"choice {sorted(taken)[0]!r}"
            raise ValueError(f"format {type(fmt).__name__}: {what} is taken by "
                             f"{type(other).__name__}; give it another")
    _FORMATS.append(fmt)
    _BY_CHOICE.update(dict.fromkeys(fmt.choices, fmt))
    _sort_by_suffix()
    return fmt


def unregister_format(fmt: TensorFormat) -> None:
    """Forget a format :func:`register_format` added (a test's, once it is done)."""
    if fmt in _FORMATS:
        _FORMATS.remove(fmt)
        for choice in fmt.choices:
            _BY_CHOICE.pop(choice, None)
        _sort_by_suffix()


def choices() -> tuple[str, ...]:
    """Every value a pipeline's ``compression`` may take, in registration order."""
    return tuple(_BY_CHOICE)


def format_for(choice: str) -> TensorFormat:
    """The format a ``compression`` choice names; ValueError naming the choices."""
    try:
        return _BY_CHOICE[choice]
    except (KeyError, TypeError):
        raise ValueError(f"compression {choice!r} is not one of {', '.join(choices())}") \
            from None


def find_format(path: str | os.PathLike) -> TensorFormat | None:
    """The format of a tensor file by its suffix, None when no format has that suffix."""
    name = Path(path).name
    for fmt in _BY_SUFFIX_LENGTH:
        if name.endswith(fmt.suffix):
            return fmt
    return None


UNKNOWN_FORMAT = ("is in no storage format this mriprep knows (by its suffix: {suffixes}); "
                  "rebuild the entry with `mriprep run --force`, or register the format "
                  "that wrote it")


def unknown_format_problem() -> str:
    """What a file in no registered format is, and the fix (after the file's name)."""
    return UNKNOWN_FORMAT.format(suffixes=", ".join(f.suffix for f in _FORMATS))


def format_of(path: str | os.PathLike) -> TensorFormat:
    """The format of a tensor file by its suffix; CacheError naming the known suffixes."""
    fmt = find_format(path)
    if fmt is None:
        raise CacheError(f"{path} {unknown_format_problem()}")
    return fmt


def tensor_file_name(name: str, choice: str) -> str:
    """The file name of tensor ``name`` (``image``, ``valid``, ``label``) when stored
    with ``choice``."""
    return name + format_for(choice).suffix


def tensor_file_names(name: str) -> list[str]:
    """Every file name tensor ``name`` may have, one per format (the default's first)."""
    default = format_for(DEFAULT_CHOICE)
    return [name + f.suffix for f in [default] + [f for f in _FORMATS if f is not default]]


def open_tensor(path: str | os.PathLike) -> Any:
    """The tensor as an array-like that decodes only what is sliced from it
    (:meth:`TensorFormat.open` of its format)."""
    return format_of(path).open(path)


def read_tensor(path: str | os.PathLike, mmap: bool = True) -> np.ndarray:
    """The tensor as a NumPy array: memory-mapped where its format can be (``mmap``),
    else read and decoded whole."""
    return format_of(path).read(path, mmap=mmap)


register_format(NpyFormat())
register_format(Blosc2Format())

__all__ = [
    "DEFAULT_CHOICE", "Blosc2Format", "FileScan", "NpyFormat", "RowSink", "StartScan",
    "TensorFormat", "choices", "find_format", "format_for", "format_of", "npy_checksum",
    "npy_header", "open_tensor", "read_tensor", "register_format", "tensor_file_name",
    "tensor_file_names", "unknown_format_problem", "unregister_format",
]
