"""Manifests for the split tests, over real NIfTI scans cut from the MNI152 template.

:func:`scan` makes a scan, :func:`manifest_csv` writes a manifest of ``HEADER`` and the
given lines, and ``CLEAN`` is a sound one: six rows, five subjects, one of them with two
sessions, in three splits. The fixtures writing the scans are in ``conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mriprep.core.volume import Volume
from mriprep.inputs.templates import load_template

HEADER = "subject_id,session_id,image,split,site\n"


def scan(offset: int) -> Volume:
    """A 20^3 block of MNI152 anatomy; each offset is a different 'subject'."""
    template = load_template("mni152")
    box = tuple(slice(70 + offset, 90 + offset) for _ in range(3))
    shift = np.eye(4)
    shift[:3, 3] = 70 + offset
    return Volume.from_array(np.ascontiguousarray(template.data[box]), template.affine @ shift)



def manifest_csv(folder: Path, lines: list[str], name: str = "cohort.csv") -> Path:
    path = folder / name
    path.write_text(HEADER + "".join(line + "\n" for line in lines))
    return path


CLEAN = [
    "sub-01,ses-1,images/sub-01.nii,train,A",
    "sub-01,ses-2,images/sub-02.nii,train,A",
    "sub-03,,images/sub-03.nii,train,B",
    "sub-04,,images/sub-04.nii,train,B",
    "sub-05,,images/sub-05.nii,val,A",
    "sub-06,,images/sub-06.nii,test,B",
]
