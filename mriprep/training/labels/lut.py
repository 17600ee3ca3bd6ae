"""Reading colour lookup tables: FreeSurfer's ``No Name R G B A`` text and FastSurfer's TSV.

A lookup table (LUT) lists label values with a name and a colour. Two spellings exist:

* FreeSurfer's ``FreeSurferColorLUT.txt``: whitespace-separated ``No. Label-Name R G B A``
  rows, ``#`` comments and blank lines anywhere;
* FastSurfer's ``FastSurfer_ColorLUT.tsv``: a tab-separated header ``ID LabelName R G B A``
  and one row per label.

Both are read by :func:`read_lut` into a :class:`Lut` (values in file order). Names may not
contain whitespace (FreeSurfer's never do); a row that does not parse is an error naming
the file, the line and the fix, never skipped, because a skipped row silently shifts every
class after it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mriprep.core.errors import InputError

_TSV_HEADER = ("ID", "LabelName")


@dataclass(frozen=True)
class Lut:
    """Label values, names and RGBA colours, in the order the file lists them."""

    ids: np.ndarray          # int64, unique
    names: tuple[str, ...]
    rgba: np.ndarray         # uint8 [n, 4]
    source: str = ""

    def __len__(self) -> int:
        return len(self.ids)

    def id_of(self, name: str) -> int:
        try:
            return int(self.ids[self.names.index(name)])
        except ValueError:
            raise InputError(f"label name {name!r} is not in the lookup table "
                             f"{self.source or '(in memory)'}; check its spelling against "
                             "the table's LabelName column") from None


def read_lut(path: str | os.PathLike) -> Lut:
    """Read a FreeSurfer ``.txt`` LUT or a FastSurfer ``.tsv`` LUT (the header decides).

    Raises
    ------
    InputError
        The file is missing, a row has fewer than six fields or non-integer values, or a
        label value is listed twice.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read lookup table {path}: {exc.strerror}; pass a "
                         "FreeSurfer LUT (.txt) or FastSurfer's ColorLUT (.tsv)") from None
    ids, names, rgba = [], [], []
    for number, line in enumerate(text.splitlines(), start=1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        fields = body.split("\t") if "\t" in body else body.split()
        fields = [f.strip() for f in fields if f.strip()]
        if tuple(fields[:2]) == _TSV_HEADER:
            continue  # FastSurfer's header row
        if len(fields) < 6:
            raise InputError(f"{path}:{number}: {line.strip()!r} has {len(fields)} fields, "
                             "a LUT row needs 6 (ID Name R G B A); fix or remove the row")
        try:
            values = [int(float(v)) for v in (fields[0], *fields[2:6])]
        except ValueError:
            raise InputError(f"{path}:{number}: {line.strip()!r} holds a non-number where "
                             "ID R G B A must be integers; fix the row") from None
        ids.append(values[0])
        names.append(fields[1])
        rgba.append(values[1:])
    if not ids:
        raise InputError(f"lookup table {path} lists no labels; pass a FreeSurfer or "
                         "FastSurfer ColorLUT")
    ids_arr = np.asarray(ids, dtype=np.int64)
    uniq, counts = np.unique(ids_arr, return_counts=True)
    if (counts > 1).any():
        raise InputError(f"lookup table {path} lists label value(s) "
                         f"{uniq[counts > 1].tolist()} more than once; keep one row each")
    if (ids_arr < 0).any():
        raise InputError(f"lookup table {path} has negative label values "
                         f"{ids_arr[ids_arr < 0].tolist()}; label values are >= 0")
    return Lut(ids_arr, tuple(names), np.clip(np.asarray(rgba), 0, 255).astype(np.uint8),
               str(path))
